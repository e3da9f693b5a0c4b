"""``simulate --defrag-every K``: the defragmenter run inside a simulation, every K arrivals.

The planner (hami_py/defrag/planner.py) is handed the scenario's own books: the running
scheduler's usage cache and filter, and the pods as the embedded API server holds them. A plan's
moves are carried out as a controller and kube-scheduler would: each moved pod is deleted (the
simulation's eviction; the embedded cluster has no budgets), then the pods the room was made for
are sent through /filter and /bind, then the moved pods' replacements (same name, a new uid, for
what was left of its lifetime: the work a pod stands for does not grow because it moved). Every
workload pod counts as owned by a controller of its template, so any of them may move; the
planner's other rules (priority, opt-out) apply.

The same planner, asked without moves at the end of a run, also says which pending pods moves
could place (``pending_movable``): with --defrag-every that is the figure that must be zero.
"""
from __future__ import annotations

from hami_py.defrag.plan import Plan
from hami_py.defrag.planner import Planner
from hami_py.defrag.world import World
from hami_py.embedded import wait_for
from hami_py.simulate.scenario_run import EPOCH, WAIT_S, ScenarioRun


def _world(run: ScenarioRun) -> World:
    app = run.app
    running = {o.uid: run.api.get("pods", o.name, o.namespace) for o in run.outcomes if o.state == "running"}
    return World(cache=app.cache, filterer=app.service.filterer, vendors=app.vendors,
                 pods_by_uid={uid: pod for uid, pod in running.items() if pod is not None},
                 pending=[], budgets=[], node_names=list(run.nodes))


def _pending_pods(run: ScenarioRun) -> list[dict]:
    pods = []
    for outcome in run.pending:
        pod = run.api.get("pods", outcome.name, outcome.namespace)
        if pod is not None:
            pods.append(pod)
    return pods


def plan_for_pending(run: ScenarioRun) -> Plan | None:
    """What the planner would do for the pending pods now; None when none is pending."""
    pods = _pending_pods(run)
    if not pods:
        return None
    return Planner(_world(run), clock=lambda: float(EPOCH + run.step)).make_room(pods)


def pending_movable(run: ScenarioRun) -> int:
    """How many pending pods a plan of moves would place (the books are left as they are)."""
    plan = plan_for_pending(run)
    if plan is None:
        return 0
    return sum(1 for p in plan.placements if p.victims)


async def defragment(run: ScenarioRun, step: int) -> int:
    """Plan for the pending pods and carry the plan's moves out; the number of pods moved."""
    plan = plan_for_pending(run)
    if plan is None:
        return 0
    helped = [p for p in plan.placements if p.victims]
    if not helped:
        return 0
    moved_uids = {uid for p in helped for uid in p.victims}
    moves = [m for m in plan.moves if m.uid in moved_uids]
    by_uid = {o.uid: o for o in run.outcomes}
    await run.allocations_done()     # a pod mid-allocation still holds its node lock
    moved = []
    for move in moves:
        outcome = by_uid.get(move.uid)
        if outcome is None or outcome.state != "running":
            continue
        run.forget_expiry(outcome, step)
        run.api.delete("pods", outcome.name, outcome.namespace)
        moved.append(outcome)
    cache = run.app.cache
    await wait_for(lambda: not any(o.uid in cache.pods for o in moved), timeout=WAIT_S, interval=0.0005,
                   what="the scheduler to see moved pods deleted")
    for placement in helped:
        outcome = by_uid.get(placement.uid)
        if outcome is not None and outcome in run.pending:
            pod = run.api.get("pods", outcome.name, outcome.namespace)
            await run.attempt(outcome, pod, step)
    for outcome in moved:
        await run.replace(outcome, step)
    return len(moved)

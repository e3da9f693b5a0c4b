"""``simulate --defrag-every K``: the defragmenter run inside a simulation, every K arrivals.

The planner (hami_py/defrag/planner.py) is handed the scenario's own books: the running
scheduler's usage cache and filter, every running pod as the embedded API server holds it (the
workload's and the cluster dump's own), and the dump's PodDisruptionBudgets. What may move is the
defragmenter's one rule (hami_py/defrag/rules.py): a pod whose controller (not a DaemonSet) would
recreate it, of a priority not above the pod room is made for, not opted out, within its budgets.
So ``simulate --defrag-every 1`` and ``defrag`` give the same answer on the same dump.

A plan's moves are carried out as a controller and kube-scheduler would: each moved pod is deleted
(the simulation's eviction), then the pods the room was made for are sent through /filter and
/bind, then the moved pods' replacements (same name, a new uid): a workload pod for what was left
of its lifetime (the work a pod stands for does not grow because it moved), a dump's pod as its
owner recreates it, for good. Every workload pod counts as owned by a controller of its template.
A budget's disruptions count per plan: between two runs the moved pods' replacements are running
again, as they would be before the budget allowed another eviction.

The same planner, asked without moves at the end of a run, also says which pending pods moves
could place (``pending_movable``): with --defrag-every that is the figure that must be zero.
"""
from __future__ import annotations

from hami_py.defrag.plan import Plan
from hami_py.defrag.planner import Planner
from hami_py.defrag.rules import budget_from_object
from hami_py.defrag.world import World
from hami_py.embedded import wait_for
from hami_py.simulate.results import PodOutcome
from hami_py.simulate.scenario_run import EPOCH, WAIT_S, ScenarioRun
from hami_py.simulate.workload import recreated_by_owner


def _running_pods(run: ScenarioRun) -> dict[str, dict]:
    """Every bound pod the scheduler's books charge, by uid: the workload's and the dump's."""
    charged = run.app.cache.pods
    return {pod["metadata"]["uid"]: pod for pod in run.api.list("pods")
            if (pod.get("spec") or {}).get("nodeName") and pod["metadata"].get("uid") in charged}


def _world(run: ScenarioRun) -> World:
    app = run.app
    return World(cache=app.cache, filterer=app.service.filterer, vendors=app.vendors,
                 pods_by_uid=_running_pods(run), pending=[],
                 budgets=[budget_from_object(b) for b in run.budgets], node_names=list(run.nodes))


def _pending_pods(run: ScenarioRun) -> list[dict]:
    pods = []
    for outcome in run.pending:
        if outcome.gang:
            # Moves never make room for one member alone: the gang is placed whole or not at all.
            continue
        pod = run.api.get("pods", outcome.name, outcome.namespace)
        if pod is not None:
            pods.append(pod)
    return pods


def plan_for_pending(run: ScenarioRun) -> tuple[Plan | None, World | None]:
    """What the planner would do for the pending pods now, and the world it planned over;
    (None, None) when none is pending."""
    pods = _pending_pods(run)
    if not pods:
        return None, None
    world = _world(run)
    return Planner(world, clock=lambda: float(EPOCH + run.step)).make_room(pods), world


def pending_movable(run: ScenarioRun) -> int:
    """How many pending pods a plan of moves would place (the books are left as they are)."""
    plan, _ = plan_for_pending(run)
    if plan is None:
        return 0
    return sum(1 for p in plan.placements if p.victims)


async def defragment(run: ScenarioRun, step: int) -> int:
    """Plan for the pending pods and carry the plan's moves out; the number of pods moved."""
    plan, world = plan_for_pending(run)
    if plan is None:
        return 0
    helped = [p for p in plan.placements if p.victims]
    if not helped:
        return 0
    moved_uids = {uid for p in helped for uid in p.victims}
    moves = [m for m in plan.moves if m.uid in moved_uids]
    by_uid = {o.uid: o for o in [*run.outcomes, *run.moved_existing] if o.state == "running"}
    await run.allocations_done()     # a pod mid-allocation still holds its node lock
    moved: list[PodOutcome] = []
    for move in moves:
        outcome = by_uid.get(move.uid)
        if outcome is None:
            pod = world.pods_by_uid.get(move.uid)
            if pod is None:
                continue
            # One of the dump's own pods: its owner recreates it once it is gone.
            outcome = run.adopt_existing(pod, recreated_by_owner(pod, vendors=run.app.vendors))
        run.forget_expiry(outcome, step)
        run.api.delete("pods", outcome.name, outcome.namespace)
        moved.append(outcome)
    cache = run.app.cache
    await wait_for(lambda: not any(o.uid in cache.pods for o in moved), timeout=WAIT_S, interval=0.0005,
                   what="the scheduler to see moved pods deleted")
    by_pending_uid = {o.uid: o for o in run.pending}
    for placement in helped:
        outcome = by_pending_uid.get(placement.uid)
        if outcome is not None:
            pod = run.api.get("pods", outcome.name, outcome.namespace)
            await run.attempt(outcome, pod, step)
    for outcome in moved:
        await run.replace(outcome, step)
    return len(moved)

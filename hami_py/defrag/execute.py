"""``hami-scheduler defrag --execute``: carry a plan out against the live cluster.

The plan (plan.py) says which pods move and which pending pods the room is for. Carrying it out:

1. **Holds first.** On each pending pod the plan makes room for, the annotation
   ``hami.io/defrag-hold`` = ``{"node", "victims": [uids], "until": RFC3339 UTC}`` is written
   (merge patch with the pod's UID as precondition) before anything is evicted: a scheduler-owned
   annotation, which the guard lets only a user who may write Nodes set. The scheduler
   turns it into a hold in its books (hami_py/scheduling/eviction/defrag_holds.py): the freed devices are
   kept for that pod, as device preemption keeps them, and no other pod can take them.
2. **Evictions, one source node at a time**, through the Eviction API (policy/v1 ``Eviction`` with
   a UID precondition), so PodDisruptionBudgets are honoured, at most ``rate_per_s`` a second;
   then the node's evicted pods are waited for (polled, ``wait_s`` at most) before the next node.
   A 404 or 409 is a pod already gone (or replaced).
3. **A refusal** (429: a budget allows no disruption; any other error alike) stops the plan: the
   holds it invalidates are removed (the annotation patched to null), ``replan(refused_uids)``
   gives a plan that avoids the refused pods, and that plan is carried out in turn, up to
   ``MAX_PLANS`` plans. Holds of the old plan that the new one drops are removed unless their
   victims are already gone (their room is free and theirs).
4. A ``Defragmented`` Event (core/v1, Normal) goes on each moved pod, naming the pod it made room
   for and the node. Counted in a registry of its own (``DefragMetrics``): the CLI runs in a
   process of its own, where nobody scrapes the scheduler's.

Nothing waits on the wall clock in tests: the clock and the sleeper are injected.
"""
from __future__ import annotations

import asyncio
import inspect
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Awaitable, Callable

import structlog
from prometheus_client import CollectorRegistry, Counter

from hami_py.defrag.plan import Move, Placement, Plan
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.k8s.events import event_body, rfc3339
from hami_py.scheduling.eviction.defrag_holds import HOLD_ANNOTATION, hold_annotation

log = structlog.get_logger(__name__)

MAX_PLANS = 3            # the first plan and two replans
DEFRAGMENTED = "Defragmented"
COMPONENT = "hami-defrag"
POLL_S = 0.5             # how often a node's evicted pods are looked for while they leave

Replan = Callable[[set[str]], "Plan | None | Awaitable[Plan | None]"]


class DefragMetrics:
    """``hami_defrag_evictions_total{result}`` and ``hami_defrag_plans_total``, in a registry of
    their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.evictions = Counter("hami_defrag_evictions", "Evictions asked for by defrag --execute, by result: "
                                 "evicted, refused (a budget or another error), gone (already gone).",
                                 ["result"], registry=self.registry)
        self.plans = Counter("hami_defrag_plans", "Plans carried out by defrag --execute (replans included).",
                             registry=self.registry)


@dataclass
class Execution:
    """What ``--execute`` did; ``as_json`` is the CLI's output."""
    evicted: list[str] = field(default_factory=list)          # namespace/name
    gone: list[str] = field(default_factory=list)             # already gone when evicted
    refused: dict[str, str] = field(default_factory=dict)     # namespace/name -> why
    plans: int = 0
    holds: dict[str, dict] = field(default_factory=dict)      # namespace/name -> the hold in place
    holds_removed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)     # moves not made: namespace/name -> why
    events: int = 0
    complete: bool = False
    reason: str = ""
    metrics: DefragMetrics = field(default_factory=DefragMetrics, repr=False)

    def as_json(self) -> dict:
        return {"complete": self.complete, "plans": self.plans, "evicted": list(self.evicted),
                "gone": list(self.gone), "refused": [{"pod": p, "reason": r} for p, r in self.refused.items()],
                "holds": [{"pod": p, **h} for p, h in self.holds.items()], "holdsRemoved": list(self.holds_removed),
                "skipped": [{"pod": p, "reason": r} for p, r in self.skipped.items()],
                "events": self.events, "reason": self.reason, "metrics": self.counters()}

    def counters(self) -> dict[str, float]:
        """The execution's counters (DefragMetrics), ``name{label="value"}`` -> count."""
        out = {}
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                    out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
        return out


class RateLimit:
    """At most ``rate_per_s`` calls a second: each waits until 1/rate after the one before."""

    def __init__(self, rate_per_s: float, *, clock: Callable[[], float], sleep: Callable[[float], Awaitable]):
        if rate_per_s <= 0:
            raise ValueError(f"the eviction rate must be positive, not {rate_per_s}")
        self.spacing = 1.0 / rate_per_s
        self.clock = clock
        self.sleep = sleep
        self.next_at = float("-inf")

    async def wait(self) -> None:
        now = self.clock()
        if now < self.next_at:
            await self.sleep(self.next_at - now)
            now = self.next_at
        self.next_at = now + self.spacing


@dataclass(slots=True)
class _Refusal:
    move: Move
    why: str


class _Executor:
    def __init__(self, *, client: KubeClient, replan: Replan, events: bool, rate: RateLimit, hold_s: float,
                 wait_s: float, clock, sleep, wall, poll_s: float, execution: Execution):
        self.client = client
        self.replan = replan
        self.events = events
        self.rate = rate
        self.hold_s = hold_s
        self.wait_s = wait_s
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.poll_s = poll_s
        self.ex = execution
        self.written: dict[str, Placement] = {}   # pod uid -> the placement whose hold is on it
        self.gone: set[str] = set()               # uids evicted (or found gone)
        self.instance = socket.gethostname()

    # ------------------------------------------------------------------ the plans
    async def run(self, plan: Plan) -> Execution:
        ex, current, refused = self.ex, plan, set()
        for attempt in range(MAX_PLANS):
            ex.plans += 1
            ex.metrics.plans.inc()
            log.info("defrag plan", plan=ex.plans, goal=current.goal, moves=[m.pod for m in current.moves],
                     makes_room_for=current.makes_room_for)
            if not current.satisfied:
                ex.reason = f"plan {ex.plans} does not reach its goal: {current.reason}"
                break
            if not await self._write_holds(current):
                return ex
            refusal = await self._evict_plan(current)
            if refusal is None:
                ex.complete = not ex.reason
                return ex
            refused.add(refusal.move.uid)
            await self._remove_holds(lambda p: bool(refused & set(p.victims)), why="a victim's eviction was refused")
            if attempt + 1 == MAX_PLANS:
                ex.reason = f"gave up after {MAX_PLANS} plans: eviction of {refusal.move.pod} refused: {refusal.why}"
                break
            new = await self._replan(refused)
            if new is None:
                ex.reason = f"no other plan avoids the refused pods ({', '.join(sorted(ex.refused))})"
                break
            keep = {p.uid for p in new.placements if p.node}
            await self._remove_holds(lambda p: p.uid not in keep and not set(p.victims) <= self.gone,
                                     why="the new plan does not need it")
            current = new
        # Given up: holds whose victims will not all go now only block room; the others hold
        # freed room for their pods and end by themselves (the pod placed, or their until).
        await self._remove_holds(lambda p: not set(p.victims) <= self.gone, why="the plan was given up")
        log.warning("defrag given up", reason=ex.reason)
        return ex

    async def _replan(self, refused: set[str]) -> Plan | None:
        answer = self.replan(set(refused))
        if inspect.isawaitable(answer):
            answer = await answer
        return answer

    # ------------------------------------------------------------------ holds
    async def _write_holds(self, plan: Plan) -> bool:
        """The hold annotation on each pending pod the plan makes room for. False (and the holds
        written so far removed) when one cannot be written for another reason than the pod being
        gone: nothing is evicted then."""
        until = datetime.fromtimestamp(self.wall(), timezone.utc) + timedelta(seconds=self.hold_s)
        names = {m.uid: m.pod for m in plan.moves}
        for placement in plan.placements:
            if not placement.node:
                self.ex.skipped[placement.pod] = "the plan names no node for it"
                continue
            value = hold_annotation(node=placement.node, victims=placement.victims, until=until)
            try:
                await self._patch_hold(placement, value)
            except KubeApiError as exc:
                if exc.status in (404, 409):
                    log.info("defrag hold not written: the pod is gone", pod=placement.pod)
                    self.ex.skipped[placement.pod] = "the pod is gone (or was replaced)"
                    self.ex.holds.pop(placement.pod, None)
                    continue
                self.ex.reason = f"could not write the hold on {placement.pod}: {exc.status} {exc.message}"
                log.warning("defrag hold not written", pod=placement.pod, error=str(exc))
                await self._remove_holds(lambda p: True, why="the execution stopped")
                return False
            self.written[placement.uid] = placement
            victims = [names.get(v, v) for v in placement.victims]
            self.ex.holds[placement.pod] = {"node": placement.node, "until": rfc3339(until), "victims": victims}
            log.info("defrag hold written", pod=placement.pod, node=placement.node, victims=victims,
                     until=rfc3339(until))
        return True

    async def _remove_holds(self, which: Callable[[Placement], bool], *, why: str) -> None:
        for uid, placement in list(self.written.items()):
            if not which(placement):
                continue
            del self.written[uid]
            self.ex.holds.pop(placement.pod, None)
            try:
                await self._patch_hold(placement, None)
            except KubeApiError as exc:
                if exc.status not in (404, 409):   # gone: its hold went with it
                    log.warning("defrag hold not removed", pod=placement.pod, error=str(exc))
                    continue
            self.ex.holds_removed.append(placement.pod)
            log.info("defrag hold removed", pod=placement.pod, node=placement.node, reason=why)

    async def _patch_hold(self, placement: Placement, value: str | None) -> None:
        await self.client.patch(pod_path(placement.namespace, placement.name),
                                {"metadata": {"uid": placement.uid, "annotations": {HOLD_ANNOTATION: value}}})

    # ------------------------------------------------------------------ evictions
    async def _evict_plan(self, plan: Plan) -> _Refusal | None:
        """The plan's moves, one source node at a time; the first refusal, or None. Sets the
        execution's reason when a node's pods do not leave within ``wait_s``."""
        holdless = {v for p in plan.placements if p.uid not in self.written for v in p.victims}
        served = {v for p in plan.placements if p.uid in self.written for v in p.victims}
        by_node: dict[str, list[Move]] = {}
        for move in plan.moves:
            if move.uid in self.gone:
                continue                       # moved by an earlier plan
            if move.uid in holdless and move.uid not in served:
                self.ex.skipped[move.pod] = "the pod it made room for is gone"
                continue
            by_node.setdefault(move.node, []).append(move)
        for node, moves in by_node.items():
            log.info("defrag evicting", node=node, pods=[m.pod for m in moves])
            evicted = []
            for move in moves:
                refusal = await self._evict(move, plan)
                if refusal is not None:
                    return refusal
                evicted.append(move)
            left = await self._wait_gone(evicted)
            if left:
                self.ex.reason = (f"{', '.join(m.pod for m in left)} still on node {node} after "
                                  f"{self.wait_s:g}s; their holds stay until they expire")
                log.warning("defrag stopped: evicted pods did not leave", node=node, pods=[m.pod for m in left])
                return None
        return None

    async def _evict(self, move: Move, plan: Plan) -> _Refusal | None:
        await self.rate.wait()
        try:
            await self.client.evict(namespace=move.namespace, name=move.name, uid=move.uid)
        except KubeApiError as exc:
            if exc.status in (404, 409):
                self.gone.add(move.uid)
                self.ex.gone.append(move.pod)
                self.ex.metrics.evictions.labels("gone").inc()
                log.info("defrag eviction: already gone", pod=move.pod, node=move.node)
                return None
            why = f"{exc.status} {exc.message}" if exc.status else exc.message
            self.ex.refused[move.pod] = why
            self.ex.metrics.evictions.labels("refused").inc()
            log.warning("defrag eviction refused", pod=move.pod, node=move.node, error=why)
            return _Refusal(move, why)
        self.gone.add(move.uid)
        self.ex.evicted.append(move.pod)
        self.ex.metrics.evictions.labels("evicted").inc()
        log.info("defrag evicted", pod=move.pod, node=move.node, to=move.to)
        if self.events:
            await self._event(move, plan)
        return None

    async def _wait_gone(self, moves: list[Move]) -> list[Move]:
        """Poll until the pods are gone (not found, or a new pod of that name); those left at the
        deadline."""
        deadline = self.clock() + self.wait_s
        left = list(moves)
        while left:
            still = []
            for move in left:
                try:
                    pod = await self.client.get(pod_path(move.namespace, move.name))
                except KubeApiError as exc:
                    if exc.not_found:
                        continue
                    log.warning("defrag: could not look for an evicted pod", pod=move.pod, error=str(exc))
                    pod = {"metadata": {"uid": move.uid}}      # looked for again at the next poll
                if (pod.get("metadata") or {}).get("uid") == move.uid:
                    still.append(move)
            left = still
            if not left or self.clock() >= deadline:
                break
            await self.sleep(self.poll_s)
        return left

    # ------------------------------------------------------------------ events
    async def _event(self, move: Move, plan: Plan) -> None:
        """``Defragmented`` on the moved pod; a failure to write it is logged, not fatal."""
        now = datetime.fromtimestamp(self.wall(), timezone.utc)
        body = event_body(name=f"{move.name}.{time.time_ns():x}", namespace=move.namespace,
                          involved={"kind": "Pod", "apiVersion": "v1", "name": move.name,
                                    "namespace": move.namespace, "uid": move.uid},
                          reason=DEFRAGMENTED, message=defragmented_message(move, plan), type_="Normal",
                          component=COMPONENT, instance=self.instance, first=now, last=now)
        try:
            await self.client.post(f"/api/v1/namespaces/{move.namespace}/events", body)
        except KubeApiError as exc:
            log.warning("Defragmented event not written", pod=move.pod, error=str(exc))
            return
        self.ex.events += 1


def defragmented_message(move: Move, plan: Plan) -> str:
    """The Event's text: who the room was made for, on which node; where the replacement goes."""
    served = [p for p in plan.placements if move.uid in p.victims]
    if served:
        why = "to make room for " + ", ".join(f"pod {p.pod} on node {p.node}" for p in served)
    else:
        why = f"to free devices on node {move.node} ({plan.goal})"
    text = f"Evicted from node {move.node} by hami-scheduler defrag {why}"
    return text + (f"; its replacement is expected on node {move.to}" if move.to else "")


async def execute_plan(*, plan: Plan, client: KubeClient, replan: Replan, events: bool = True,
                       rate_per_s: float = 2.0, hold_s: float = 300.0, wait_s: float = 120.0,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], Awaitable] = asyncio.sleep,
                       wall: Callable[[], float] = time.time, poll_s: float = POLL_S,
                       metrics: DefragMetrics | None = None) -> Execution:
    """Carry ``plan`` out (module docstring). ``replan(refused_uids)`` (plain or async) gives a
    plan avoiding the pods whose eviction was refused, or None. ``clock``/``sleep`` pace the
    evictions and the waits, ``wall`` stamps the holds' ``until`` and the Events."""
    if hold_s <= 0 or wait_s < 0:
        raise ValueError(f"hold_s must be positive and wait_s not negative, not {hold_s} and {wait_s}")
    execution = Execution(metrics=metrics or DefragMetrics())
    executor = _Executor(client=client, replan=replan, events=events,
                         rate=RateLimit(rate_per_s, clock=clock, sleep=sleep), hold_s=hold_s, wait_s=wait_s,
                         clock=clock, sleep=sleep, wall=wall, poll_s=poll_s, execution=execution)
    return await executor.run(plan)

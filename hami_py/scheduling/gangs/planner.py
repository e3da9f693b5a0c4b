"""All or nothing: the first /filter of a gang that can be placed reserves every member at once.

kube-scheduler filters one pod at a time. So the gang's first member to reach /filter once
enough members exist plans them all, in one synchronous stretch with no await: this pod on the
nodes kube-scheduler offered, each other unbound device member on the nodes its nodeSelector
allows, each reserved in the books under its own UID as its own /filter would. If fewer than the
gang's minimum fit (bound members counted), every reservation just made is given back and the pod
is refused with a reason a user can act on. Otherwise the plan stands: each later member's
/filter answers its planned node, the decision already reserved. Because the books are one event
loop and a plan is made without yielding, two gangs never each hold a part of the room.

A plan lasts the gang's timeout: a planned member not bound by then gives the whole plan's unbound
reservations back. A member whose planned node kube-scheduler no longer offers (its own filters
refused it: taints, affinity, CPU), whose reservation was lost (a failed bind), or a gang that
lost a planned member, gives the plan back too, and the next /filter plans afresh. The members
bound so far stay bound and count toward the minimum, as after a restart.

When a plan is made, the members kube-scheduler parked after their refusals are woken at once
(``on_planned``: the app's requeue nudger), so no gang waits for kube-scheduler's five-minute
flush. ``on_waiting`` is told of each refusal, so that devices freed soon after wake them too.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import structlog

from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.pod_states import PodState
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.scheduling.decision.filter import FilterDecision, Filterer
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.decision.requests import PodRequest, parse_pod_requests
from hami_py.scheduling.gangs.book import GangBook, Member
from hami_py.scheduling.gangs.membership import GangKey, GangSpec, gang_of

log = structlog.get_logger(__name__)

NORMAL, WARNING = "Normal", "Warning"
GANG_PLANNED = "GangPlanned"
GANG_WAITING = "GangWaiting"
GANG_TIMED_OUT = "GangTimedOut"


def exist_reason(key: GangKey, exist: int, minimum: int) -> str:
    return f"{key.kind} {key.namespace}/{key.name}: {exist} of {minimum} members exist"


def fit_reason(key: GangKey, fit: int, minimum: int) -> str:
    return f"{key.kind} {key.namespace}/{key.name}: {fit} of {minimum} members fit"


class Plan:
    """A gang's members reserved together: their decisions by UID, and the timer of its deadline."""

    __slots__ = ("key", "spec", "decisions", "timer")

    def __init__(self, key: GangKey, spec: GangSpec, decisions: dict[str, FilterDecision]):
        self.key = key
        self.spec = spec
        self.decisions = decisions
        self.timer: asyncio.TimerHandle | None = None


class Gangs:
    """The gang hook of /filter (``resume``), fed by the pod watch (``observe``)."""

    def __init__(self, *, cache: UsageCache, filterer: Filterer, vendors: dict[str, DeviceVendor], metrics=None,
                 on_planned: Callable[[list[str]], None] | None = None,
                 on_waiting: Callable[[], None] | None = None,
                 on_event: Callable[[dict, str, str, str], None] | None = None,
                 call_later: Callable | None = None, busy: Callable[[str], bool] = lambda uid: False):
        self.cache = cache
        # Whether a pod's own request is in flight (its bind, under its pod lock): a plan never
        # releases nor decides again a member whose Binding may be landing.
        self.busy = busy
        self.filterer = filterer
        self.vendors = vendors
        self.metrics = metrics
        self.on_planned = on_planned      # the nodes of a plan just made: wake the parked members
        self.on_waiting = on_waiting      # a member was refused
        self.on_event = on_event          # (pod, type, reason, message): a Kubernetes Event
        self.call_later = call_later      # (delay, fn, *args) -> handle; the running loop's by default
        self.book = GangBook(vendors, cache.vendor_ids)
        self.plans: dict[GangKey, Plan] = {}
        self.waiting: set[GangKey] = set()

    # ------------------------------------------------------------------ the filter
    def resume(self, pod: dict, node_names: list[str], request: PodRequest) -> dict | FilterDecision | None:
        """None: not a gang's member, decide as usual. A dict: FailedNodes (the gang cannot be
        placed now, or this member fits nowhere in a plan made without it). A FilterDecision:
        the member's planned decision, reserved under its UID."""
        key = gang_of(pod)
        if key is None:
            return None
        spec = self.book.spec(key, pod)
        if spec is None:
            return None
        if isinstance(spec, str):
            return self._refuse(pod, key, node_names, f"{key}: {spec}")
        if spec.min_member <= 1:
            return None
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if self._held(uid):
            return None         # room held for it (preemption, the defragmenter): its hold decides
        plan = self.plans.get(key)
        if plan is not None:
            decision = plan.decisions.get(uid)
            if decision is None and self._whole(plan):
                return None                     # a member beyond the plan: on its own
            if decision is not None and decision.node in node_names and self._live(uid, decision):
                return decision
            why = ("a member outside the plan" if decision is None else
                   f"pod {pod_key(pod)} lost its reservation" if not self._live(uid, decision) else
                   f"node {decision.node} is no longer offered for pod {pod_key(pod)}")
            self._give_back(plan, why=why, outcome="given_back")
        return self._plan(pod, key, spec, node_names, request)

    def _plan(self, pod: dict, key: GangKey, spec: GangSpec, node_names: list[str],
              request: PodRequest) -> dict | FilterDecision:
        uid = pod["metadata"]["uid"]
        living = self.book.schedulable(key)     # a gated member exists for nobody yet
        exist = len(living) + (uid not in living)
        if exist < spec.min_member:
            return self._refuse(pod, key, node_names, exist_reason(key, exist, spec.min_member))
        others = [m for m in living.values() if m.uid != uid]
        # Bound as the watch shows it, or by our own Binding the watch has not shown yet (never
        # decided again: that would release a bound pod's charge).
        # A member whose Binding is in flight (its pod lock busy) keeps the reservation it binds:
        # counted when it has one, never decided again.
        bound = {m.uid for m in others if m.bound or ((r := self.cache.pods.get(m.uid)) is not None and (
            r.state.bound or (self.busy(m.uid) and r.state.bindable)))}
        busy = {m.uid for m in others if m.uid not in bound and self.busy(m.uid)}
        fit = sum(1 for m in others if m.uid in bound or not m.device)
        # This pod first, on the nodes kube-scheduler offered it (a PolicyError of its own goes
        # to the caller before anything is reserved), then the others by name. A member whose
        # room is held for it (preemption, the defragmenter) is left to its own /filter.
        mine = self.filterer.decide(pod, node_names, request, reserve=True)
        decisions = {uid: mine} if mine.node is not None else {}
        nodes = None
        for member in sorted((m for m in others if m.uid not in bound and m.uid not in busy and m.device
                              and m.pod is not None and not self._held(m.uid)), key=lambda m: pod_key(m.pod)):
            if nodes is None:
                nodes = list(self.cache.nodes)
            decision = self._decide_other(member, nodes)
            if decision is not None:
                decisions[member.uid] = decision
        fit += len(decisions)
        if fit < spec.min_member:
            for member_uid in decisions:
                self.cache.release_pod(member_uid)
            return self._refuse(pod, key, node_names, fit_reason(key, fit, spec.min_member))
        plan = self.plans[key] = Plan(key, spec, decisions)
        plan.timer = self._later(spec.timeout_s, self._expire, plan)
        self._set_waiting(key, False)
        self._count("planned")
        placed = {u: d.node for u, d in decisions.items()}
        log.info("gang planned", gang=str(key), members=len(decisions), bound=fit - len(decisions),
                 nodes=sorted(set(placed.values())), timeout_s=spec.timeout_s)
        for member_uid, decision in decisions.items():
            target = pod if member_uid == uid else living[member_uid].pod
            self._event(target, NORMAL, GANG_PLANNED,
                        f"{key}: placed with the gang on node {decision.node} ({fit} of {spec.min_member} "
                        f"members fit; bind within {spec.timeout_s:g}s)")
        if self.on_planned is not None:
            self.on_planned(sorted(set(placed.values())))
        return mine     # placed, or refused (the service's no-fit path: its Event, cleanup, requeue)

    def _decide_other(self, member: Member, nodes: list[str]) -> FilterDecision | None:
        pod = member.pod
        try:
            request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
            if request is None:
                return None
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            if selector:
                entries = self.cache.nodes
                candidates = [n for n in nodes if all(entries[n].labels.get(k) == v for k, v in selector.items())]
            else:
                candidates = nodes
            if not candidates:
                return None
            decision = self.filterer.decide(pod, candidates, request, reserve=True)
        except (RequestError, PolicyError) as exc:
            log.info("gang member cannot be planned", pod=pod_key(pod), error=str(exc))
            return None
        if decision.node is None:
            return None
        decision.keep_for_bind(pod)
        return decision

    def _refuse(self, pod: dict, key: GangKey, node_names: list[str], reason: str) -> dict:
        self._set_waiting(key, True)
        self._event(pod, WARNING, GANG_WAITING, reason)
        if self.on_waiting is not None:
            self.on_waiting()
        return dict.fromkeys(node_names, reason)

    # ------------------------------------------------------------------ the watch
    def observe(self, kind: str, pod: dict) -> None:
        """A pod event, after the books applied it: a plan whose members are all bound is done;
        one that lost a member it needs is given back."""
        key = self.book.observe_pod(kind, pod)
        if key is not None:
            self._review(key)

    def begin_relist(self) -> None:
        self.book.begin_relist()

    def finish_relist(self) -> None:
        for key in self.book.finish_relist():
            self._review(key)

    def _review(self, key: GangKey) -> None:
        if not self.book.living(key):
            self._set_waiting(key, False)
        plan = self.plans.get(key)
        if plan is None:
            return
        living = self.book.living(key)
        if all((m := living.get(uid)) is not None and m.bound for uid in plan.decisions):
            self._end(plan)
            self._count("placed")
            log.info("gang placed", gang=str(key), members=len(plan.decisions))
        elif not self._whole(plan):
            self._give_back(plan, why="a planned member is gone", outcome="given_back")

    # ------------------------------------------------------------------ plans
    def _held(self, uid: str) -> bool:
        record = self.cache.pods.get(uid)
        return record is not None and record.state is PodState.HELD

    def _live(self, uid: str, decision: FilterDecision) -> bool:
        reservation = self.cache.pods.get(uid)
        return reservation is not None and reservation is decision.reservation

    def _whole(self, plan: Plan) -> bool:
        """Whether the plan still places the gang's minimum: members bound or not asking for
        devices, and planned ones still holding their reservation."""
        living = self.book.schedulable(plan.key)
        count = sum(1 for uid, m in living.items() if (m.bound or not m.device) and uid not in plan.decisions)
        count += sum(1 for uid, d in plan.decisions.items()
                     if self._live(uid, d) or ((m := living.get(uid)) is not None and m.bound))
        return count >= plan.spec.min_member

    def _give_back(self, plan: Plan, *, why: str, outcome: str) -> int:
        """Release every planned reservation not bound yet; how many."""
        released = 0
        for uid, decision in plan.decisions.items():
            # A member binding right now keeps its reservation: its bind's outcome ends it.
            if self._live(uid, decision) and decision.reservation.state.bindable and not self.busy(uid):
                self.cache.release_pod(uid)
                released += 1
        self._end(plan)
        self._count(outcome)
        log.info("gang plan given back", gang=str(plan.key), reason=why, released=released)
        return released

    def _expire(self, plan: Plan) -> None:
        if self.plans.get(plan.key) is not plan:
            return
        living = self.book.living(plan.key)
        for uid, decision in plan.decisions.items():
            member = living.get(uid)
            if member is not None and member.pod is not None and self._live(uid, decision):
                self._event(member.pod, WARNING, GANG_TIMED_OUT,
                            f"{plan.key}: not every planned member was bound within {plan.spec.timeout_s:g}s; "
                            f"the gang's reservations are given back")
        self._give_back(plan, why=f"not bound within {plan.spec.timeout_s:g}s", outcome="timed_out")

    def _end(self, plan: Plan) -> None:
        if plan.timer is not None:
            plan.timer.cancel()
        if self.plans.get(plan.key) is plan:
            del self.plans[plan.key]

    def release_all(self, why: str = "leadership lost") -> int:
        """Give back every plan's unbound reservations (the end of leadership)."""
        return sum(self._give_back(plan, why=why, outcome="given_back") for plan in list(self.plans.values()))

    def close(self) -> None:
        """At shutdown: no deadline fires on books nobody serves any more."""
        for plan in self.plans.values():
            if plan.timer is not None:
                plan.timer.cancel()

    # ------------------------------------------------------------------ reporting
    def _later(self, delay: float, fn, *args):
        if self.call_later is not None:
            return self.call_later(delay, fn, *args)
        return asyncio.get_running_loop().call_later(delay, fn, *args)

    def _set_waiting(self, key: GangKey, waiting: bool) -> None:
        (self.waiting.add if waiting else self.waiting.discard)(key)
        if self.metrics is not None:
            self.metrics.gangs_waiting.set(len(self.waiting))

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.gangs.labels(outcome).inc()

    def _event(self, pod: dict | None, type_: str, reason: str, message: str) -> None:
        if self.on_event is not None and pod is not None:
            self.on_event(pod, type_, reason, message)

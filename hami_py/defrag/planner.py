"""The defragmenter's search: the fewest evictions that make room, planned with the scheduler's
own fit code.

Pure synchronous Python over a World's ``UsageCache`` and ``Filterer`` (defrag/world.py), in the
manner of device preemption's victim search (scheduling/preemption.py): a trial takes candidate
pods' charges out of the books (``cache.remove_pod``), asks ``Filterer.decide`` and puts them back
(``cache.add_pod_usage``). Nothing awaits, so no filter of a running scheduler sees a trial.

Goals
-----
``make_room(pending)``: pending pods in order (priority high first, then oldest, then name). A pod
that fits now is reserved where the scheduler would place it, with no move. For one that fits
nowhere, the smallest set of movable pods (on any nodes) is searched such that, with the set gone,

1. the pending pod fits (``decide`` over every node its nodeSelector allows) and is reserved, and
2. every moved pod's replacement fits again, as the scheduler would place it: a copy of the pod
   without its decision annotations, nodeName or uid, decided over all its nodes and reserved,
   in ``replacement_order`` (priority high first, then longest running, then name). The
   replacement may land on the node it left (onto another device).

Each pod's reservation and replacements stay charged, so later pods see them.
``free_devices(count)``: see defrag/freeing.py.

Order between sets of one size: least running time lost (the sum of now - started), then node
names, then pod names (never uids: a plan is reproducible). Sets are tried size by size; the first that works is the answer, so no smaller
set works and none of its size is preferred (the property test compares with brute force).

Bounds (parameters of ``Planner``): ``max_set_size`` pods per set searched exactly (4),
``max_candidates`` movable pods per goal (16, the lowest priority and shortest running first),
``max_trials`` fits per plan (4000), ``max_combinations`` sets of one size listed at once (20000).
When one is hit (or the movable pods are more than ``max_candidates``, and those first ones do
not make room), the reprieve pass answers instead, over every movable pod of the cluster: per
node (at most MAX_NODE_CANDIDATES of its pods; nodes in name order, until REPRIEVE_TRIALS x
``max_trials`` fits are spent), every candidate there is removed,
then the most valuable (highest priority, longest running) are given back while the pod still
fits; the cheapest node whose set also re-places its replacements wins. That set is minimal (no
pod of it can be spared for the pending pod) but not always the smallest, and ``Plan.exact`` is
False. ``max_moves`` caps the moves of the whole plan; ``exclude`` names pods never
to move (``--execute`` replans without the pods whose eviction was refused).

Movability is defrag/rules.py's: a controller (not a DaemonSet) recreates it, priority not above
the pod it makes room for, a PodDisruptionBudget with disruptions left (each planned eviction
consumes one), no ``hami.io/defrag: "false"``. Only bound pods seen from the API server and
charged by this scheduler are candidates (reservations, including the planner's own, are not).

The planner leaves the books as it found them: every charge it made is removed and every pod it
took out put back before a plan is returned (after capturing the "after" device usage).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations, islice

from hami_py.cache.pod_ledger import pod_key, pod_priority
from hami_py.cache.records import PodUsage
from hami_py.devices.base import RequestError
from hami_py.defrag.freeing import HOLD_NAMESPACE, HOLD_PREFIX, plan_free_devices
from hami_py.defrag.plan import Move, Placement, Plan
from hami_py.defrag.rules import BudgetBook, why_not_movable
from hami_py.defrag.world import World
from hami_py.scheduling.owned_annotations import scheduler_owned_annotations
from hami_py.scheduling.policies import PolicyError
from hami_py.scheduling.requests import PodRequest, parse_pod_requests

MAX_SET_SIZE = 4
MAX_CANDIDATES = 16
MAX_TRIALS = 4000
MAX_COMBINATIONS = 20000
MAX_NODE_CANDIDATES = 64   # movable pods of one node the greedy pass removes at once
REPRIEVE_TRIALS = 2        # the greedy pass stops at this many times max_trials fits
REPLACEMENT_SUFFIX = "-defrag-replacement"


def pending_order(pod: dict) -> tuple:
    meta = pod.get("metadata") or {}
    return (-pod_priority(pod), str(meta.get("creationTimestamp") or ""), pod_key(pod))


def replacement_order(victims: list[PodUsage]) -> list[PodUsage]:
    """The order replacements are placed in: as a scheduling queue takes them, priority first;
    then the longest running, then name."""
    return sorted(victims, key=lambda v: (-v.priority, v.started, v.namespace, v.name))


def replacement_of(pod: dict, *, owned: frozenset[str]) -> dict:
    """The pod its controller would create after an eviction, as the scheduler sees it: same
    spec and annotations, without the decision, the node and the uid."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace") or "default",
                         "uid": f"{meta.get('uid', '')}{REPLACEMENT_SUFFIX}",
                         "labels": dict(meta.get("labels") or {}),
                         "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k not in owned},
                         "ownerReferences": list(meta.get("ownerReferences") or [])},
            "spec": spec, "status": {"phase": "Pending"}}


@dataclass
class Found:
    """A set that works, as committed to the books: the pod's node and the moves."""
    node: str | None
    moves: list[Move]
    victims: list[PodUsage]
    removed: list[PodUsage] = field(default_factory=list)
    charged: list[str] = field(default_factory=list)


class Planner:
    def __init__(self, world: World, *, max_set_size: int = MAX_SET_SIZE, max_candidates: int = MAX_CANDIDATES,
                 max_trials: int = MAX_TRIALS, max_combinations: int = MAX_COMBINATIONS,
                 max_moves: int | None = None, exclude=frozenset(), clock=time.time):
        self.world = world
        self.cache = world.cache
        self.filterer = world.filterer
        self.vendors = world.vendors
        self.objects = world.pods_by_uid
        self.max_set_size = max_set_size
        self.max_candidates = max_candidates
        self.max_trials = max_trials
        self.max_combinations = max_combinations
        self.max_moves = max_moves
        self.exclude = frozenset(exclude)     # uids never to move (an eviction of theirs was refused)
        self.clock = clock
        self.owned = scheduler_owned_annotations(world.vendors)
        # uid -> its replacement and the replacement's request: built once, tried in many sets.
        self._replacements: dict[str, tuple[dict, PodRequest | None]] = {}
        self._reset()

    def _reset(self) -> None:
        self.trials = 0
        self.exact = True
        self.budgets = BudgetBook(self.world.budgets)
        self.removed: list[PodUsage] = []      # taken out of the books by committed moves
        self.charged: list[str] = []           # reservations the plan made (pods, replacements)
        self.moves: list[Move] = []

    # ------------------------------------------------------------------ books
    def usage(self) -> dict[str, list[dict]]:
        return {n: self.cache.device_usage(n) for n in self.world.node_names if n in self.cache.nodes}

    def _restore(self, removed: list[PodUsage], charged: list[str]) -> None:
        for uid in reversed(charged):
            self.cache.remove_pod(uid)
        for record in removed:
            self.cache.add_pod_usage(record)

    def _finish(self, plan: Plan, before: dict) -> Plan:
        """Capture the books with the plan applied, then put them back as they were."""
        plan.devices_before = before
        plan.devices_after = self.usage()
        self._restore(self.removed, self.charged)
        plan.moves = self.moves
        plan.trials = self.trials
        plan.exact = self.exact
        return plan

    def nodes_for(self, pod: dict) -> list[str]:
        """The nodes kube-scheduler would send for the pod: registered, matching its nodeSelector
        (affinity and taints are not modelled)."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        nodes = self.cache.nodes
        return [n for n in self.world.node_names if n in nodes
                and all(nodes[n].labels.get(k) == v for k, v in selector.items())]

    def decide(self, pod: dict, request: PodRequest, *, reserve: bool) -> str | None:
        """The scheduler's node for the pod (reserved with ``reserve``), or None."""
        self.trials += 1
        nodes = self.nodes_for(pod)
        if not nodes:
            return None
        try:
            return self.filterer.decide(pod, nodes, request, reserve=reserve).node
        except PolicyError:
            return None

    def request_of(self, pod: dict) -> PodRequest | None:
        try:
            return parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        except RequestError:
            return None

    def replacement(self, uid: str) -> tuple[dict, PodRequest | None]:
        """The moved pod's replacement (``replacement_of``) and its request, None when the
        scheduler rejects it."""
        made = self._replacements.get(uid)
        if made is None:
            pod = replacement_of(self.objects[uid], owned=self.owned)
            made = self._replacements[uid] = (pod, self.request_of(pod))
        return made

    # ------------------------------------------------------------------ candidates
    def candidates(self, *, priority_limit: int) -> tuple[list[PodUsage], dict[str, str]]:
        """Every movable pod (lowest priority, then shortest running first) and why the others
        charged in the books may not move (by uid)."""
        now = self.clock()
        pool, blocked = [], {}
        for uid, record in self.cache.pods.items():
            if not record.bound or record.resource_version is None or not record.entries:
                continue
            why = self._why_not_movable(record, priority_limit=priority_limit)
            if why:
                blocked[uid] = why
            else:
                pool.append(record)
        pool.sort(key=lambda p: (p.priority, now - p.started if p.started else 0.0, p.namespace, p.name))
        return pool, blocked

    def _why_not_movable(self, record: PodUsage, *, priority_limit: int) -> str | None:
        if record.uid in self.exclude:
            return "its eviction was refused"
        obj = self.objects.get(record.uid)
        if obj is None:
            return "it is not seen from the API server"
        return why_not_movable(obj, priority=record.priority, priority_limit=priority_limit, budgets=self.budgets)

    def budgets_allow(self, victims: Sequence[PodUsage]) -> bool:
        return self.budgets.allows([self.objects[v.uid] for v in victims])

    def set_key(self, victims, now: float) -> tuple:
        lost = sum(max(0.0, now - v.started) if v.started else 0.0 for v in victims)
        return (len(victims), round(lost, 6), tuple(sorted({v.node for v in victims})),
                tuple(sorted(f"{v.namespace}/{v.name}" for v in victims)))

    def moves_left(self) -> int:
        return 1 << 30 if self.max_moves is None else self.max_moves - len(self.moves)

    # ------------------------------------------------------------------ one trial
    def _take_out(self, victims: Sequence[PodUsage]) -> list[PodUsage]:
        """The victims' charges removed from the books: the records to put back."""
        return [r for r in (self.cache.remove_pod(v.uid) for v in victims) if r is not None]

    def trial(self, pod: dict | None, request: PodRequest | None, victims: list[PodUsage], *,
              commit: bool, holds: Sequence[PodUsage] = ()) -> Found | None:
        """With ``victims`` gone (and ``holds`` charged: devices being freed), does ``pod`` fit
        (None: no pod, --free) and then every victim's replacement? On success with ``commit``
        the charges stay (the plan's); otherwise the books are exactly as before."""
        removed = self._take_out(victims)
        charged: list[str] = []
        for hold in holds:
            self.cache.add_pod_usage(hold)
            charged.append(hold.uid)
        found = None
        try:
            node = None
            if pod is not None:
                node = self.decide(pod, request, reserve=True)
                if node is None:
                    return None
                charged.append(pod["metadata"]["uid"])
            now = self.clock()
            moves = []
            for victim in replacement_order(victims):
                replacement, replacement_request = self.replacement(victim.uid)
                if replacement_request is None:
                    return None        # its controller's pod would be rejected: placed nowhere
                to = self.decide(replacement, replacement_request, reserve=True)
                if to is None:
                    return None
                charged.append(replacement["metadata"]["uid"])
                moves.append(Move(namespace=victim.namespace, name=victim.name, uid=victim.uid, node=victim.node,
                                  to=to, priority=victim.priority,
                                  running_s=max(0.0, now - victim.started) if victim.started else 0.0))
            found = Found(node=node, moves=moves, victims=list(victims), removed=removed, charged=charged)
            return found
        finally:
            if found is None or not commit:
                self._restore(removed, charged)

    def commit(self, found: Found) -> None:
        self.removed.extend(found.removed)
        self.charged.extend(found.charged)
        self.moves.extend(found.moves)
        self.budgets.consume([self.objects[v.uid] for v in found.victims])

    def _placement(self, pod: dict, node: str | None, victims: Sequence[PodUsage] = ()) -> Placement:
        meta = pod["metadata"]
        return Placement(namespace=meta.get("namespace") or "default", name=meta["name"], uid=meta["uid"],
                         node=node, victims=[v.uid for v in victims])

    # ------------------------------------------------------------------ make room
    def make_room(self, pending: list[dict]) -> Plan:
        self._reset()
        pods = sorted(pending, key=pending_order)
        plan = Plan(goal=f"room for {len(pods)} pending pod{'s' if len(pods) != 1 else ''}", satisfied=True)
        before = self.usage()
        reasons = []
        for pod in pods:
            outcome = self._room_for(pod)
            if isinstance(outcome, str):
                reasons.append(outcome)
            else:
                plan.placements.append(outcome)
        plan.satisfied = not reasons
        plan.reason = "; ".join(reasons)
        return self._finish(plan, before)

    def _room_for(self, pod: dict) -> Placement | str:
        key = pod_key(pod)
        request = self.request_of(pod)
        if request is None:
            return f"{key}: the scheduler rejects its device request"
        node = self.decide(pod, request, reserve=True)
        if node is not None:
            self.charged.append(pod["metadata"]["uid"])
            return self._placement(pod, node)
        priority = pod_priority(pod)
        every, blocked = self.candidates(priority_limit=priority)
        if not every:
            return f"{key} fits on no node, and no pod may move for it{_blocked_hint(blocked)}"
        pool = every[:self.max_candidates]
        cut = len(pool) < len(every)
        found = None
        if self._fits_without(pod, request, pool):
            found = self._smallest(pod, request, pool)
            if isinstance(found, str) and cut:
                found = None          # exhaustive over the first max_candidates only
        elif not cut:
            return (f"{key} fits on no node even with all {len(pool)} movable pod(s) gone"
                    f"{_blocked_hint(blocked)}")
        if found is None:
            # A bound was hit: the greedy pass, over every movable pod of each node.
            self.exact = False
            found = self._reprieve(pod, request, every)
        if isinstance(found, str):
            return f"{found} for {key}{_blocked_hint(blocked)}"
        self.commit(found)
        return self._placement(pod, found.node, found.victims)

    def _fits_without(self, pod: dict, request: PodRequest, victims: list[PodUsage]) -> bool:
        removed = self._take_out(victims)
        try:
            return self.decide(pod, request, reserve=False) is not None
        finally:
            self._restore(removed, [])

    def _smallest(self, pod: dict, request: PodRequest, pool: list[PodUsage]) -> Found | str | None:
        """The first working set by size, then preference; a reason when none exists (the search
        was exhaustive); None when a bound was hit first."""
        now = self.clock()
        limit = min(self.max_set_size, len(pool), self.moves_left())
        for size in range(1, limit + 1):
            sets = list(islice(combinations(pool, size), self.max_combinations + 1))
            if len(sets) > self.max_combinations:
                return None
            sets.sort(key=lambda s: self.set_key(s, now))
            for victims in sets:
                if self.trials >= self.max_trials:
                    return None
                if not self.budgets_allow(victims):
                    continue
                found = self.trial(pod, request, list(victims), commit=True)
                if found is not None:
                    return found
        if limit < len(pool):
            if limit == self.moves_left():
                return f"no set of at most {limit} move(s) (--max-moves) frees room"
            return None
        return "no set of movable pods frees room with every replacement placed again"

    def _reprieve(self, pod: dict, request: PodRequest, pool: list[PodUsage]) -> Found | str:
        """Per node: remove its candidates, give back the most valuable while the pod still fits;
        the cheapest set whose replacements fit again is committed."""
        now = self.clock()
        best = None
        for node in sorted({p.node for p in pool}):
            if self.trials >= REPRIEVE_TRIALS * self.max_trials:
                break
            local = [p for p in pool if p.node == node][:MAX_NODE_CANDIDATES]
            if not self._fits_without(pod, request, local):
                continue
            victims = list(local)
            for p in sorted(local, key=lambda p: (-p.priority, p.started)):
                fewer = [v for v in victims if v is not p]
                if fewer and self._fits_without(pod, request, fewer):
                    victims = fewer
            if len(victims) > self.moves_left() or not self.budgets_allow(victims):
                continue
            if self.trial(pod, request, victims, commit=False) is not None:
                key = self.set_key(victims, now)
                if best is None or key < best[0]:
                    best = (key, victims)
        if best is None:
            return f"no set of at most {self.max_set_size} movable pods (nor a greedy one) frees room"
        found = self.trial(pod, request, best[1], commit=True)
        return found if found is not None else "the greedy set stopped working"

    # ------------------------------------------------------------------ free devices
    def free_devices(self, count: int, *, model: str | None = None, same_node: bool = True,
                     max_priority: int = 0) -> Plan:
        self._reset()
        before = self.usage()
        plan = plan_free_devices(self, count=count, model=model, same_node=same_node, max_priority=max_priority)
        for uid in [u for u in self.charged if u.startswith(HOLD_PREFIX)]:
            self.cache.remove_pod(uid)      # the freed devices show free in the "after" books
        self.charged = [u for u in self.charged if not u.startswith(HOLD_PREFIX)]
        self.cache.quota.used.pop(HOLD_NAMESPACE, None)   # the holds' (now empty) quota entry
        return self._finish(plan, before)


def _blocked_hint(blocked: dict[str, str]) -> str:
    """`` (N pod(s) may not move: ...)``: the three commonest reasons, most common first."""
    if not blocked:
        return ""
    shown = ", ".join(f"{n} because {why}" for why, n in Counter(blocked.values()).most_common(3))
    return f" ({len(blocked)} pod(s) may not move: {shown})"

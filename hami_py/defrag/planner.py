"""The defragmenter's search: the fewest evictions that make room, planned with the scheduler's
own fit code.

What a trial is (the scheduler's books with candidate pods taken out, ``Filterer.decide`` asked),
which pods may move and how the books are put back: defrag/search.py, which ``Planner`` extends.

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
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations, islice

from hami_py.cache.pod_ledger import pod_key, pod_priority
from hami_py.cache.records import PodUsage
from hami_py.defrag.freeing import HOLD_NAMESPACE, HOLD_PREFIX, plan_free_devices
from hami_py.defrag.plan import Placement, Plan
from hami_py.defrag.search import Found, Search
from hami_py.scheduling.decision.requests import PodRequest

MAX_NODE_CANDIDATES = 64   # movable pods of one node the greedy pass removes at once
REPRIEVE_TRIALS = 2        # the greedy pass stops at this many times max_trials fits


def pending_order(pod: dict) -> tuple:
    meta = pod.get("metadata") or {}
    return (-pod_priority(pod), str(meta.get("creationTimestamp") or ""), pod_key(pod))


class Planner(Search):
    """The defragmenter's two goals over a World: ``make_room`` and ``free_devices``."""

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

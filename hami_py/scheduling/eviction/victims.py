"""Victim choice for device preemption: which lower-priority pods of which node to remove so that a
pod that fits nowhere fits on one placement.

One job: ``VictimSearch.choose`` answers a node and the smallest set of that node's pods whose
removal lets the pod fit there, or None. It writes nothing that outlives the call. Each trial
takes the candidate victims' charges out of the books (``UsageCache.remove_pod``), runs the
ordinary decision on that one node (``Filterer.decide(reserve=False)``: the same kernel fit for
memory, cores, slots, exclusivity, MIG slices, gates, quota and the families' choosers and
chargers), and charges the same records back, all in one synchronous stretch: no other filter can
see the books in between (hami_py/cache/usage.py).

The order between sets that make the pod fit is kube-scheduler's, made exact: fewest victims
first, then the lowest highest priority among them, then the lowest sum of priorities, then the
least running time lost (the sum of how long each has run), then the node name. Sets are tried in
that order, size by size, over every node where removing all its candidates makes the pod fit at
all. The search is bounded (``max_trials`` fits per choice, half of them at most to find the
nodes; the first ``max_nodes`` nodes with candidates, in kube-scheduler's order; ``max_candidates``
pods per node; the ``max_combinations`` sets of one size ordered at once): when a bound is hit
while sets are tried, the cheapest node found keeps the set that the reprieve pass leaves (kube-scheduler's own way: remove all, then give
back the most valuable pods while the pod still fits), which is minimal (no pod of it can be
spared) but not always the smallest.

Only pods this scheduler charges (device pods), bound and seen from the API server, of a priority
strictly below the preemptor's, on the node in question, are ever candidates; a pod whose removal
does not help is never in a chosen set (no smaller set fits, and fitting only gets easier as pods
go: free capacity never hurts a fit).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import combinations, islice

from hami_py.cache.pod_ledger import pod_priority
from hami_py.cache.records import PodUsage
from hami_py.cache.usage import UsageCache
from hami_py.reasons import NODE_UNREGISTERED_TEXT
from hami_py.scheduling.decision.filter import FilterDecision, Filterer
from hami_py.scheduling.decision.requests import PodRequest

# The bounds keep a choice within tens of milliseconds on the event loop at thousands of full
# nodes (a trial costs ~0.2 ms: its candidates uncharged and charged back, one decision on one node).
MAX_TRIALS = 64           # kernel fits per choice
MAX_NODES = 32            # nodes (with candidates) tried, in kube-scheduler's order
MAX_CANDIDATES = 24       # lowest-priority pods of one node considered
MAX_COMBINATIONS = 4096   # sets of one size, over all nodes, ordered and tried at once


def may_preempt(pod: dict) -> bool:
    """kube-scheduler's eligibility, for our preemption: a positive priority and a policy that
    is not ``Never``."""
    return pod_priority(pod) > 0 and (pod.get("spec") or {}).get("preemptionPolicy") != "Never"


@dataclass(slots=True)
class Choice:
    node: str
    victims: list[PodUsage]
    key: tuple = ()
    decision: FilterDecision | None = field(default=None, repr=False)   # the fit with them gone

    @property
    def uids(self) -> list[str]:
        return [v.uid for v in self.victims]


def set_key(victims: list[PodUsage], now: float) -> tuple:
    """The preference between sets (smaller is better): size, highest priority, sum of
    priorities, running time lost."""
    if not victims:
        return (0, 0, 0, 0.0)
    priorities = [v.priority for v in victims]
    lost = sum(max(0.0, now - v.started) if v.started else 0.0 for v in victims)
    return (len(victims), max(priorities), sum(priorities), lost)


class VictimSearch:
    def __init__(self, cache: UsageCache, filterer: Filterer, *, max_trials: int = MAX_TRIALS,
                 max_nodes: int = MAX_NODES, max_candidates: int = MAX_CANDIDATES,
                 max_combinations: int = MAX_COMBINATIONS, clock=time.time, spared=None):
        self.cache = cache
        # Pods never chosen, by UID (a gang's members: moving one alone would break its gang).
        self.spared = spared or (lambda uid: False)
        self.filterer = filterer
        self.max_trials = max_trials
        self.max_nodes = max_nodes
        self.max_candidates = max_candidates
        self.max_combinations = max_combinations
        self.clock = clock
        self.trials = 0   # of the last choice (tests and logs)

    # ------------------------------------------------------------------ candidates
    def candidates(self, node: str, priority: int, *, preemptor_uid: str = "",
                   exclude=frozenset()) -> list[PodUsage]:
        """The node's pods that may be evicted for a pod of ``priority``: charged by us, bound,
        seen from the API server (not an in-flight reservation), strictly lower priority; the
        lowest priorities (then the most recently started) first, at most ``max_candidates``."""
        cache = self.cache
        found = [p for uid in cache.node_pods.get(node, ())
                 if uid != preemptor_uid and uid not in exclude
                 and (p := cache.pods[uid]).state.shown_bound
                 and p.priority < priority and p.entries and not self.spared(uid)]
        found.sort(key=lambda p: (p.priority, -p.started, p.namespace, p.name))
        return found[:self.max_candidates]

    # ------------------------------------------------------------------ one trial
    def fit_without(self, pod: dict, node: str, request: PodRequest, uids) -> FilterDecision | None:
        """The decision on ``node`` with the pods ``uids`` uncharged, or None when the pod does not
        fit even so. The books are exactly as before when it returns."""
        self.trials += 1
        cache = self.cache
        removed = []
        try:
            for uid in uids:
                record = cache.remove_pod(uid)
                if record is not None:
                    removed.append(record)
            decision = self.filterer.decide(pod, [node], request, reserve=False)
        finally:
            for record in removed:
                cache.add_pod_usage(record)
        return decision if decision.node is not None else None

    # ------------------------------------------------------------------ the choice
    def choose(self, pod: dict, request: PodRequest, node_names: list[str], *,
               failed: dict[str, str] | None = None, exclude=frozenset()) -> Choice | None:
        """The best node and victim set for ``pod`` among ``node_names``, or None when no set of
        candidates on any node makes it fit. ``failed``: the filter's reasons (unregistered nodes
        are skipped); ``exclude``: pods never to choose (an eviction of theirs was refused)."""
        self.trials = 0
        priority, uid = pod_priority(pod), (pod.get("metadata") or {}).get("uid") or ""
        pools: dict[str, list[PodUsage]] = {}
        tried = 0
        for node in node_names:
            if node not in self.cache.nodes or (failed and failed.get(node) == NODE_UNREGISTERED_TEXT):
                continue
            if tried >= self.max_nodes or self.trials >= self.max_trials // 2:
                break   # half the fits for finding nodes, half for the sets
            pool = self.candidates(node, priority, preemptor_uid=uid, exclude=exclude)
            if pool:
                tried += 1
                if self.fit_without(pod, node, request, [p.uid for p in pool]) is not None:
                    pools[node] = pool
        return self._smallest(pod, request, pools, {}) if pools else None

    def extend(self, pod: dict, request: PodRequest, node: str, going: list[str]) -> Choice | None:
        """For kube-scheduler's preemption on ``node``: with the pods ``going`` (its victims) gone,
        the fewest more of the node's candidates that make the pod fit (none when its victims are
        enough), or None when no set does."""
        self.trials = 0
        if node not in self.cache.nodes:
            return None
        decision = self.fit_without(pod, node, request, going)
        if decision is not None:
            return Choice(node, [], set_key([], self.clock()), decision)
        uid = (pod.get("metadata") or {}).get("uid") or ""
        pool = self.candidates(node, pod_priority(pod), preemptor_uid=uid, exclude=set(going))
        if not pool or self.fit_without(pod, node, request, going + [p.uid for p in pool]) is None:
            return None
        return self._smallest(pod, request, {node: pool}, {node: going})

    def _smallest(self, pod: dict, request: PodRequest, pools: dict[str, list[PodUsage]],
                  base: dict[str, list[str]]) -> Choice | None:
        """Sets of every size in preference order over ``pools`` (each of which fits with all of
        it gone), the first that fits; the reprieve pass when a bound is hit."""
        now = self.clock()
        for size in range(1, max(len(p) for p in pools.values()) + 1):
            sets = []
            for node, pool in pools.items():
                sets.extend((set_key(list(c), now), node, c)
                            for c in islice(combinations(pool, size), self.max_combinations + 1 - len(sets)))
                if len(sets) > self.max_combinations:
                    return self._reprieve(pod, request, pools, base, now)
            sets.sort(key=lambda s: (s[0], s[1]))
            for key, node, combo in sets:
                if self.trials >= self.max_trials:
                    return self._reprieve(pod, request, pools, base, now)
                decision = self.fit_without(pod, node, request, base.get(node, []) + [p.uid for p in combo])
                if decision is not None:
                    return Choice(node, list(combo), key, decision)
        return None   # not reached: each pool fits with all of it gone

    def _reprieve(self, pod: dict, request: PodRequest, pools: dict[str, list[PodUsage]],
                  base: dict[str, list[str]], now: float) -> Choice | None:
        """The bound was hit: on the node whose whole pool is the cheapest set, remove every
        candidate, then give back the most valuable ones (highest priority, longest running) while
        the pod still fits. One trial per candidate; the set left is minimal."""
        node = min(pools, key=lambda n: (set_key(pools[n], now), n))
        going = base.get(node, [])
        kept = sorted(pools[node], key=lambda p: (-p.priority, p.started or now))
        victims = list(kept)
        for p in kept:
            trial = [v for v in victims if v is not p]
            if self.fit_without(pod, node, request, going + [v.uid for v in trial]) is not None:
                victims = trial
        decision = self.fit_without(pod, node, request, going + [v.uid for v in victims])
        if decision is None:
            return None
        return Choice(node, victims, set_key(victims, now), decision)

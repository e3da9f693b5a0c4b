"""What the defragmenter's goals search with: the books, the movable pods and one trial.

Pure synchronous Python over a World's ``UsageCache`` and ``Filterer`` (defrag/world.py), in the
manner of device preemption's victim search (scheduling/eviction/victims.py): a trial takes candidate
pods' charges out of the books (``cache.remove_pod``), asks ``Filterer.decide`` and puts them back
(``cache.add_pod_usage``). Nothing awaits, so no filter of a running scheduler sees a trial.

``Search`` is what both goals use: making room for pending pods (planner.py's ``Planner``, the
entry point for both goals) and freeing whole devices (freeing.py). freeing.py needs only this
module, so the planner imports freeing.py and nothing imports the planner back.

A moved pod's replacement is the pod its controller would create (``replacement_of``), decided
over all its nodes and reserved in ``replacement_order``; it may land on the node it left.

Movability is defrag/rules.py's: a controller (not a DaemonSet) recreates it, priority not above
the pod it makes room for, a PodDisruptionBudget with disruptions left (each planned eviction
consumes one), no ``hami.io/defrag: "false"``. Only bound pods seen from the API server and
charged by this scheduler are candidates (reservations, including the planner's own, are not).

The search leaves the books as it found them: every charge it made is removed and every pod it
took out put back before a plan is returned (after capturing the "after" device usage).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami_py.cache.records import PodUsage
from hami_py.devices.base import RequestError
from hami_py.defrag.plan import Move, Plan
from hami_py.defrag.rules import BudgetBook, why_not_movable
from hami_py.defrag.world import World
from hami_py.scheduling.admission.owned_annotations import decision_annotations
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.decision.requests import PodRequest, parse_pod_requests

MAX_SET_SIZE = 4
MAX_CANDIDATES = 16
MAX_TRIALS = 4000
MAX_COMBINATIONS = 20000
REPLACEMENT_SUFFIX = "-defrag-replacement"


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


class Search:
    """A World's books, the bounds of one plan, and the moves committed so far."""

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
        self.owned = decision_annotations(world.vendors)
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
            if not record.state.shown_bound or not record.entries:
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

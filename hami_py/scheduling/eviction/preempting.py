"""Device preemption done by the extender (``--device-preemption``): evict, hold, place.

The device resources are ``ignoredByScheduler``, so kube-scheduler's own preemption dry-runs only
its plugins, finds that a pod blocked by GPU memory "fits" every node without victims, and never
preempts for it. Here, when a pod with a positive priority (and a ``preemptionPolicy`` other than
``Never``) fits nowhere, its /filter:

1. asks ``VictimSearch.choose`` (scheduling/eviction/victims.py) for a node and the smallest set of that
   node's lower-priority device pods whose removal lets the pod fit there;
2. **holds** the room at once, in the same synchronous stretch as the choice: the pod's placement
   with the victims gone is charged in the books under the pod's UID, next to the victims' own
   charges until they go (the node shows overcommitted for the victims' grace period). No other
   pod's filter can take the room meanwhile, neither before nor after the victims leave. The hold
   cannot be bound (it is not a ``decided`` reservation: a /bind is sent back to /filter) and
   expires after ``hold_s``;
3. answers this /filter at once with the node in FailedNodes (``preempting 2 pods on node X``):
   kube-scheduler's scheduling cycle waits for every /filter, so nothing below is awaited by it;
4. after the answer, still under the pod's lock (``PodLocks.follow_up``: the pod's next filter
   answers that its preemption runs), evicts the victims one by one through the Eviction API
   (``pods/eviction``), so that PodDisruptionBudgets are honoured. A refusal (429: a budget
   allows no disruption) releases the hold and chooses again without that pod; after
   ``MAX_ATTEMPTS`` choices, or when no other set exists, it gives up, records a
   ``PreemptionFailed`` warning on the pod and remembers the refusals for ``REFUSALS_KEPT_S``:
   the pod's next filters say why in the node's failure reason and evict nothing meanwhile;
5. once every eviction is accepted, marks the pod's ``status.nominatedNodeName`` (pods/status
   patch) and records a ``Preempted`` event on each victim and on the pod (the events queue's own
   budget).

kube-scheduler retries the pod on the victims' delete events. While any victim is still charged,
a /filter of the pod answers at once that it waits (no eviction, no new choice); once they are all
gone it is decided on its node alone, which its hold keeps free for it, and placed there.

A preemptor deleted while it holds gives the room back with its delete event (the hold is its
charge in the books); a hold whose pod never comes back goes at its expiry.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Coroutine

import structlog

from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.scheduling.decision.filter import FilterDecision, Filterer
from hami_py.scheduling.eviction.holds import Hold, Holds
from hami_py.scheduling.eviction.victims import Choice, VictimSearch, may_preempt
from hami_py.scheduling.decision.requests import PodRequest

log = structlog.get_logger(__name__)

DEFAULT_HOLD_S = 120.0     # how long freed room is kept for its preemptor
MAX_ATTEMPTS = 3           # choices per preemption when evictions are refused
REFUSALS_KEPT_S = 30.0     # how long refused evictions are not tried again for the same pod
PREEMPTED = "Preempted"
PREEMPTION_FAILED = "PreemptionFailed"


def preempting_reason(count: int, node: str) -> str:
    return f"preempting {count} pods on node {node}"


@dataclass(slots=True)
class Refusals:
    """The evictions refused to one preemptor: victim uid -> why, and the last (node, why)."""
    victims: dict[str, str] = field(default_factory=dict)
    last: tuple[str, str] = ("", "")
    expires: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.victims)


class Preemptor:
    def __init__(self, *, cache: UsageCache, filterer: Filterer, client: KubeClient, events=None,
                 hold_s: float = DEFAULT_HOLD_S, search: VictimSearch | None = None, clock=time.monotonic,
                 metrics=None):
        """``events(pod, reason, message)`` queues an event (EventRecorder.on_preempt); ``metrics``:
        hami_py.metrics.Metrics (its preemption counters), or None."""
        self.metrics = metrics
        self.cache = cache
        self.filterer = filterer
        self.client = client
        self.events = events
        self.hold_s = hold_s
        self.search = search or VictimSearch(cache, filterer)
        self.clock = clock
        self.book = Holds(cache=cache, filterer=filterer, clock=clock, what="preemption hold")
        self.holds: dict[str, Hold] = self.book.held
        self.refusals: dict[str, Refusals] = {}   # preemptor uid -> its refused evictions

    # ------------------------------------------------------------------ holds
    def resume(self, pod: dict, node_names: list[str], request: PodRequest) -> dict | FilterDecision | None:
        """Before a held pod's decision: the FailedNodes answer while its victims are still there;
        once they are gone, the decision on its node (which its hold kept free); None when the pod
        holds nothing (or its node is no longer offered): decide as usual."""
        hold = self.book.active((pod.get("metadata") or {}).get("uid") or "")
        if hold is None:
            return None
        outcome = self.book.resume(pod, hold, node_names, request)
        if not isinstance(outcome, int):
            return outcome
        failed = dict.fromkeys(node_names, f"waiting for the preemption on node {hold.node}")
        failed[hold.node] = f"{preempting_reason(len(hold.victims), hold.node)}: waiting for {outcome} to leave"
        return failed

    def _hold(self, pod: dict, choice: Choice, request: PodRequest) -> Hold | None:
        """Charge the pod's placement on the chosen node with the victims gone (holds.py)."""
        return self.book.charge(pod, node=choice.node, victims={v.uid: f"{v.namespace}/{v.name}" for v in choice.victims},
                                request=request, hold_s=self.hold_s)

    def release_all(self) -> int:
        """Give back every hold (at the end of leadership); how many there were."""
        return self.book.release_all()

    # ------------------------------------------------------------------ preemption
    def begin(self, pod: dict, node_names: list[str], request: PodRequest,
              failed: dict[str, str]) -> tuple[dict[str, str] | None, Coroutine | None]:
        """For a pod that fits nowhere, in the filter's synchronous stretch: choose and hold.
        Returns the FailedNodes to answer now (``failed`` with the chosen node's reason replaced;
        None when the pod may not preempt or no victims make room: answer ``failed`` as it is),
        and the evictions to run after the answer under the pod's lock (``carry_out``), or None."""
        if not may_preempt(pod):
            return None, None
        uid = (pod.get("metadata") or {}).get("uid") or ""
        refusals = self._fresh_refusals(uid)
        choice, hold = self._choose_and_hold(pod, node_names, request, failed, refusals)
        if hold is None:
            return (self._gave_up(failed, refusals) if refusals else None), None
        answer = dict(failed)
        answer[choice.node] = preempting_reason(len(choice.victims), choice.node)
        return answer, self.carry_out(pod, node_names, request, failed, choice, hold)

    async def carry_out(self, pod: dict, node_names: list[str], request: PodRequest, failed: dict[str, str],
                        choice: Choice, hold: Hold) -> None:
        """Evict the chosen victims, then nominate the node. A refused eviction (a budget allows no
        disruption) gives the hold back and chooses again without that pod, up to MAX_ATTEMPTS
        choices; the refusals are remembered for REFUSALS_KEPT_S, so the pod's next filters answer
        why (and try no pod that refused) instead of evicting again at once."""
        meta = pod.get("metadata") or {}
        key = pod_key(pod)
        uid = meta.get("uid") or ""
        refusals = self._fresh_refusals(uid)
        for attempt in range(MAX_ATTEMPTS):
            log.info("preempting", pod=key, node=choice.node, victims=list(hold.victims.values()),
                     trials=self.search.trials)
            error = await self._evict_all(pod, hold, choice)
            if error is None:
                self.refusals.pop(uid, None)
                await self._nominate(pod, choice.node)
                self._event(pod, f"preempting {len(choice.victims)} pods on node {choice.node}: "
                                 + ", ".join(hold.victims.values()))
                self._count("preempting")
                return
            victim_uid, message = error
            refusals.victims[victim_uid] = message
            refusals.last = (choice.node, f"eviction of {hold.victims[victim_uid]} refused: {message}")
            refusals.expires = self.clock() + REFUSALS_KEPT_S
            self._forget_old_refusals()
            self.refusals[uid] = refusals
            self.book.drop(hold, release=True)
            if attempt + 1 == MAX_ATTEMPTS:
                break
            choice, hold = self._choose_and_hold(pod, node_names, request, failed, refusals)
            if hold is None:
                break
        node, why = refusals.last
        log.info("preemption given up", pod=key, node=node, reason=why)
        self._count("gave_up")
        self._event(pod, f"preemption gave up on node {node}: {why}", reason=PREEMPTION_FAILED, warning=True)

    def _choose_and_hold(self, pod: dict, node_names: list[str], request: PodRequest, failed: dict[str, str],
                         refusals: Refusals | None) -> tuple[Choice | None, Hold | None]:
        exclude = refusals.victims if refusals else {}
        choice = self.search.choose(pod, request, node_names, failed=failed, exclude=exclude)
        if choice is None:
            return None, None
        return choice, self._hold(pod, choice, request)

    def _fresh_refusals(self, uid: str) -> Refusals:
        refusals = self.refusals.get(uid)
        if refusals is None or refusals.expires <= self.clock():
            self.refusals.pop(uid, None)
            return Refusals()
        return refusals

    def _forget_old_refusals(self) -> None:
        now = self.clock()
        for uid in [uid for uid, r in self.refusals.items() if r.expires <= now]:
            del self.refusals[uid]

    @staticmethod
    def _gave_up(failed: dict[str, str], refusals: Refusals) -> dict[str, str]:
        node, why = refusals.last
        answer = dict(failed)
        answer[node] = f"{answer.get(node, '')}; preemption gave up: {why}".lstrip("; ")
        return answer

    async def _evict_all(self, pod: dict, hold: Hold, choice: Choice) -> tuple[str, str] | None:
        """Evict the victims one at a time; the first refusal (uid, why), or None."""
        preemptor = pod.get("metadata") or {}
        for victim in choice.victims:
            try:
                await self.client.evict(namespace=victim.namespace, name=victim.name, uid=victim.uid)
            except KubeApiError as exc:
                if exc.status in (404, 409):
                    continue     # gone already (or replaced by another pod of that name)
                self._count_eviction("refused")
                return victim.uid, f"{exc.status} {exc.message}" if exc.status else exc.message
            self._count_eviction("evicted")
            self._event({"metadata": {"name": victim.name, "namespace": victim.namespace, "uid": victim.uid}},
                        f"Preempted by pod {preemptor.get('uid')} on node {choice.node}")
        return None

    async def _nominate(self, pod: dict, node: str) -> None:
        meta = pod.get("metadata") or {}
        try:
            await self.client.patch(pod_path(meta.get("namespace") or "default", meta["name"]) + "/status",
                                    {"metadata": {"uid": meta["uid"]}, "status": {"nominatedNodeName": node}})
        except KubeApiError as exc:
            log.warning("nominatedNodeName not written", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                        node=node, error=str(exc))

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.preemptions.labels(outcome).inc()

    def _count_eviction(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.preemption_evictions.labels(result).inc()

    def _event(self, pod: dict, message: str, *, reason: str = PREEMPTED, warning: bool = False) -> None:
        if self.events is not None:
            self.events(pod, reason, message, warning=warning)

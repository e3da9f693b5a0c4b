"""Room kept for one pod while the pods in its way leave: the books' side of a hold.

Device preemption (scheduling/eviction/preempting.py) and the defragmenter's holds
(scheduling/eviction/defrag_holds.py) both free devices for a pod by evicting others, and both must keep
that room for it until it is placed. A hold is the pod's placement on the node with the victims
gone, charged in the books under the pod's UID next to the victims' own charges until they go
(the node shows overcommitted meanwhile): no other pod's filter can take the room, neither before
nor after the victims leave. It is not a ``decided`` reservation, so no /bind can use it; the
pod's next /filter, once the victims are gone, decides on the held node alone (``place``), which
releases the hold into an ordinary reservation.

A hold ends when it is placed, expires, or its charge is no longer the one it made (the pod was
deleted, filtered anew or bound: the books changed it); ``active`` notices the last on use.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.records import PodUsage
from hami_py.cache.usage import UsageCache
from hami_py.scheduling.decision.filter import FilterDecision, Filterer, pod_rv
from hami_py.scheduling.decision.requests import PodRequest

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Hold:
    uid: str
    node: str
    victims: dict[str, str]          # uid -> namespace/name (or the uid, when the name is unknown)
    usage: PodUsage                  # the pod's charge on the node, made when the hold was taken
    expires: float                   # on the Holds' clock
    timer: asyncio.TimerHandle | None = None
    source: str = ""                 # what the hold was made from (the defragmenter's annotation)


class Holds:
    """The holds of one kind (preemption's, the defragmenter's), keyed by pod UID.

    ``on_expire(hold)`` is called when a hold's timer ends it (after its charge is released)."""

    def __init__(self, *, cache: UsageCache, filterer: Filterer, clock=time.monotonic, what: str = "hold",
                 on_expire=None):
        self.cache = cache
        self.filterer = filterer
        self.clock = clock
        self.what = what
        self.on_expire = on_expire
        self.held: dict[str, Hold] = {}

    def active(self, uid: str) -> Hold | None:
        """The pod's hold, if its charge is still the one the hold made and it has not expired."""
        hold = self.held.get(uid)
        if hold is None:
            return None
        if self.cache.pods.get(uid) is not hold.usage or hold.expires <= self.clock():
            self.drop(hold, release=True)   # releases only a charge that is still the hold's
            return None
        return hold

    def remaining(self, hold: Hold) -> list[str]:
        """The victims still charged in the books (not gone yet)."""
        return [uid for uid in hold.victims if uid in self.cache.pods]

    def charge(self, pod: dict, *, node: str, victims: dict[str, str], request: PodRequest, hold_s: float,
               source: str = "") -> Hold | None:
        """Charge the pod's placement on ``node`` with the ``victims`` gone, under its UID: the
        decision's own reservation, made with the victims uncharged and then charged back next to
        it; not ``decided``, so no /bind can use it. None when the pod does not fit there even so
        (the pod's earlier charge is released then, as any decision releases it)."""
        cache = self.cache
        old = self.held.get((pod.get("metadata") or {}).get("uid") or "")
        if old is not None:
            self.drop(old)                   # the decision below releases its charge
        removed = [r for uid in victims if (r := cache.remove_pod(uid)) is not None]
        try:
            decision = self.filterer.decide(pod, [node], request)
        finally:
            for record in removed:
                cache.add_pod_usage(record)
        usage = decision.reservation
        if decision.node is None or usage is None:
            return None
        cache.mark_held(usage)
        usage.filtered_rv = pod_rv(pod)
        hold = Hold(usage.uid, node, dict(victims), usage, self.clock() + hold_s, source=source)
        try:
            hold.timer = asyncio.get_running_loop().call_later(max(hold_s, 0.0), self._expire, hold)
        except RuntimeError:   # no running loop (a synchronous test): expiry is checked on use
            hold.timer = None
        self.held[usage.uid] = hold
        return hold

    def resume(self, pod: dict, hold: Hold, node_names: list[str], request: PodRequest) -> int | FilterDecision | None:
        """A held pod's /filter, before any other decision: how many victims are still charged
        (the pod waits; the caller words the answer); once none is, the pod's decision on its held
        node (the hold ends, and the decision, which releases the held charge first, reserves the
        room as usual). None when the hold ends without a decision: its node is not offered, or
        the pod no longer fits there; decide as usual."""
        if hold.node not in node_names:
            log.info(f"{self.what} dropped: its node is not offered", pod=pod_key(pod), node=hold.node)
            self.drop(hold, release=True)
            return None
        left = len(self.remaining(hold))
        if left:
            return left
        self.drop(hold)
        decision = self.filterer.decide(pod, [hold.node], request)
        if decision.node is None:
            log.info(f"{self.what} dropped: the pod no longer fits its node", pod=pod_key(pod), node=hold.node)
            return None
        return decision

    def release_all(self) -> int:
        """Give back every hold (at the end of leadership); how many there were."""
        holds = list(self.held.values())
        for hold in holds:
            self.drop(hold, release=True)
        return len(holds)

    def _expire(self, hold: Hold) -> None:
        if self.held.get(hold.uid) is hold:
            log.info(f"{self.what} expired", pod=f"{hold.usage.namespace}/{hold.usage.name}", node=hold.node)
            self.drop(hold, release=True)
            if self.on_expire is not None:
                self.on_expire(hold)

    def drop(self, hold: Hold, *, release: bool = False) -> None:
        """End the hold; with ``release``, give back its charge if the books still have it."""
        if self.held.get(hold.uid) is hold:
            del self.held[hold.uid]
        if hold.timer is not None:
            hold.timer.cancel()
        if release and self.cache.pods.get(hold.uid) is hold.usage:
            self.cache.release_pod(hold.uid)

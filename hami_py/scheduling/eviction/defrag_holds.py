"""Room the defragmenter frees is kept for the pod it was freed for.

``hami-scheduler defrag --execute`` (hami_py/defrag/execute.py) runs in a process of its own,
maybe on a laptop, and evicts pods so that a pending pod fits. Between an eviction and the pending
pod's next /filter, any other pod could take the freed devices. So before it evicts anything, the
executor writes on each pending pod it makes room for the annotation ``hami.io/defrag-hold``::

    {"node": "<node>", "victims": ["<uid>", ...], "until": "<RFC3339 UTC>"}

and this scheduler turns it into a hold exactly like device preemption's (scheduling/eviction/holds.py):
the pod's placement on that node with the victims uncharged is charged in the books under the
pod's UID, next to the victims' own charges until they go. Holds are always on (no flag): the
annotation is the executor's request, and it is scheduler-owned: the webhook and
manifests/admission-policy.yaml let only a user who may write Nodes set or change it (the
executor's operator), never a pod's author.

Two triggers, both synchronous with the books:

* ``observe``, from the pod watch (wired by the app): the event that shows the annotation on an
  unbound pod takes the hold; a changed value replaces it; a removed one drops it;
* ``resume``, from the pod's /filter, before any decision: it takes the hold if the watch has
  not (a restart, a new leader), then, while a victim is still charged, answers FailedNodes
  (``waiting for N pods moved by the defragmenter on node X`` for the held node, ``held for the
  defragmenter's plan on node X`` for the others); once they are all gone it decides on that node
  alone, which the hold kept free, and the hold becomes the ordinary reservation a /bind uses.

A value is acted on once per pod (``spent``): a hold placed, dropped or expired is not taken again
from the same annotation. An expired ``until``, a malformed value (one log line, never an error),
a node no longer offered or not known, a pod that does not fit there even with the victims gone,
a bound pod, or the pod's deletion drop the hold, and none lasts beyond MAX_HOLD_S; counted in
``hami_defrag_holds_total{outcome="held|placed|expired|dropped"}``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import orjson
import structlog

from hami_py.cache.pod_ledger import pod_key
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.scheduling.decision.filter import FilterDecision, Filterer
from hami_py.scheduling.eviction.holds import Hold, Holds
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.decision.requests import PodRequest, parse_pod_requests

log = structlog.get_logger(__name__)

HOLD_ANNOTATION = "hami.io/defrag-hold"
SPENT_KEPT = 4096       # pods whose annotation was acted on, remembered (oldest forgotten first)
# The longest a hold lasts, whatever its "until" says: a hold keeps room from every other pod
# until its victims leave (and the guard that keeps the annotation to node writers is the
# cluster's to deploy).
MAX_HOLD_S = 900.0


class HoldAnnotationError(ValueError):
    """The annotation's value is not a hold this scheduler can take."""


@dataclass(frozen=True, slots=True)
class HoldRequest:
    node: str
    victims: tuple[str, ...]     # pod UIDs
    until: datetime              # timezone-aware, UTC


def hold_annotation(*, node: str, victims: list[str], until: datetime) -> str:
    """The annotation's value, as the executor writes it."""
    stamp = until.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return orjson.dumps({"node": node, "victims": list(victims), "until": stamp}).decode()


def parse_hold(value: object) -> HoldRequest:
    """The annotation's value read; HoldAnnotationError saying what is wrong with it."""
    if not isinstance(value, str):
        raise HoldAnnotationError("the value is not a string")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise HoldAnnotationError("the value is not JSON") from None
    if not isinstance(doc, dict):
        raise HoldAnnotationError("the value is not a JSON object")
    node, victims, until = doc.get("node"), doc.get("victims"), doc.get("until")
    if not isinstance(node, str) or not node:
        raise HoldAnnotationError('"node" must be a non-empty string')
    if not isinstance(victims, list) or not all(isinstance(v, str) and v for v in victims):
        raise HoldAnnotationError('"victims" must be a list of pod UIDs')
    if not isinstance(until, str):
        raise HoldAnnotationError('"until" must be an RFC3339 time')
    try:
        at = datetime.fromisoformat(until.replace("Z", "+00:00"))
    except ValueError:
        raise HoldAnnotationError(f'"until" is not an RFC3339 time: {until!r}') from None
    if at.tzinfo is None:
        raise HoldAnnotationError(f'"until" has no time zone: {until!r}')
    return HoldRequest(node, tuple(dict.fromkeys(victims)), at.astimezone(timezone.utc))


def waiting_reason(count: int, node: str) -> str:
    return f"waiting for {count} pods moved by the defragmenter on node {node}"


def held_elsewhere_reason(node: str) -> str:
    return f"held for the defragmenter's plan on node {node}"


class DefragHolds:
    """The defragmenter's holds in this scheduler's books.

    ``enabled()``: whether the watch may take holds (the app passes "serving": a follower's books
    answer no filter); ``on_waiting()``: a /filter was answered that the pod waits (the app's
    requeue nudger, so that the pod is retried once the books free the victims' devices);
    ``metrics``: hami_py.metrics.Metrics, or None."""

    def __init__(self, *, cache: UsageCache, filterer: Filterer, vendors: dict[str, DeviceVendor], metrics=None,
                 enabled: Callable[[], bool] = lambda: True, on_waiting: Callable[[], None] | None = None,
                 clock=time.monotonic, wall=time.time):
        self.cache = cache
        self.vendors = vendors
        self.metrics = metrics
        self.enabled = enabled
        self.on_waiting = on_waiting
        self.wall = wall
        self.book = Holds(cache=cache, filterer=filterer, clock=clock, what="defragmenter hold",
                          on_expire=lambda hold: self._count("expired"))
        self.holds: dict[str, Hold] = self.book.held
        self.spent: dict[str, str] = {}     # pod uid -> the annotation value already acted on

    # ------------------------------------------------------------------ the watch
    def observe(self, kind: str, pod: dict) -> None:
        """A pod event, after the books applied it."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        raw = (meta.get("annotations") or {}).get(HOLD_ANNOTATION)
        if raw is None and uid not in self.spent and uid not in self.holds:
            return                                   # almost every pod event
        if kind == "DELETED" or (pod.get("spec") or {}).get("nodeName"):
            self._end(uid, why="the pod was deleted" if kind == "DELETED" else "the pod is bound")
            self.spent.pop(uid, None)
            return
        if raw is None:
            self._end(uid, why="the annotation was removed")
            self.spent.pop(uid, None)
            return
        if self.spent.get(uid) == raw or not self.enabled():
            return
        self._end(uid, why="the annotation changed")
        self._take(pod, raw)

    # ------------------------------------------------------------------ the filter
    def resume(self, pod: dict, node_names: list[str], request: PodRequest) -> dict | FilterDecision | None:
        """Before the pod's decision: the FailedNodes answer while its victims are still charged;
        once they are gone, the decision on its held node; None when it holds nothing: decide as
        usual. Takes the hold from the pod's annotation when the watch has not."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        hold = self.book.active(uid)
        if hold is None:
            raw = (meta.get("annotations") or {}).get(HOLD_ANNOTATION)
            if raw is None or self.spent.get(uid) == raw:
                return None
            hold = self._take(pod, raw, request=request)
            if hold is None:
                return None
        outcome = self.book.resume(pod, hold, node_names, request)
        if outcome is None:
            self._count("dropped")
            return None
        if isinstance(outcome, int):
            if self.on_waiting is not None:
                self.on_waiting()
            failed = dict.fromkeys(node_names, held_elsewhere_reason(hold.node))
            failed[hold.node] = waiting_reason(outcome, hold.node)
            return failed
        log.info("defragmenter hold placed", pod=pod_key(pod), node=hold.node)
        self._count("placed")
        return outcome

    def release_all(self) -> int:
        """Give back every hold (at the end of leadership); their annotations may be acted on
        again (by this replica, should it lead again)."""
        for uid in list(self.holds):
            self.spent.pop(uid, None)
        return self.book.release_all()

    # ------------------------------------------------------------------ taking and ending
    def _take(self, pod: dict, raw: str, *, request: PodRequest | None = None) -> Hold | None:
        meta = pod.get("metadata") or {}
        uid, key = meta.get("uid") or "", pod_key(pod)
        self._remember(uid, raw)
        try:
            wanted = parse_hold(raw)
            if request is None:
                request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        except (HoldAnnotationError, RequestError) as exc:
            log.warning("defragmenter hold annotation ignored", pod=key, annotation=HOLD_ANNOTATION, error=str(exc))
            self._count("dropped")
            return None
        hold_s = min(wanted.until.timestamp() - self.wall(), MAX_HOLD_S)
        if hold_s <= 0:
            log.info("defragmenter hold ignored: expired", pod=key, node=wanted.node,
                     until=wanted.until.isoformat())
            self._count("expired")
            return None
        why = self._why_not(request, wanted)
        hold = None
        if why is None:
            victims = {v: self._victim_name(v) for v in wanted.victims if v != uid}
            try:
                hold = self.book.charge(pod, node=wanted.node, victims=victims, request=request, hold_s=hold_s,
                                        source=raw)
            except PolicyError as exc:
                why = str(exc)
            else:
                why = None if hold is not None else "the pod does not fit there even with the victims gone"
        if hold is None:
            log.info("defragmenter hold not taken", pod=key, node=wanted.node, reason=why)
            self._count("dropped")
            return None
        log.info("defragmenter hold taken", pod=key, node=wanted.node, victims=list(hold.victims.values()),
                 waiting_for=len(self.book.remaining(hold)), seconds=round(hold_s, 1))
        self._count("held")
        return hold

    def _why_not(self, request: PodRequest | None, wanted: HoldRequest) -> str | None:
        if request is None:
            return "the pod asks for no device this scheduler manages"
        if wanted.node not in self.cache.nodes:
            return "the node has no devices registered with this scheduler"
        return None

    def _victim_name(self, uid: str) -> str:
        record = self.cache.pods.get(uid)
        return f"{record.namespace}/{record.name}" if record is not None else uid

    def _end(self, uid: str, *, why: str) -> None:
        hold = self.holds.get(uid)
        if hold is None:
            return
        log.info("defragmenter hold dropped", pod=f"{hold.usage.namespace}/{hold.usage.name}", node=hold.node,
                 reason=why)
        self.book.drop(hold, release=True)
        self._count("dropped")

    def _remember(self, uid: str, raw: str) -> None:
        self.spent.pop(uid, None)
        self.spent[uid] = raw
        if len(self.spent) > SPENT_KEPT:
            del self.spent[next(iter(self.spent))]

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.defrag_holds.labels(outcome).inc()

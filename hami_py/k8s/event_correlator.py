"""Which Event a new pod event becomes: client-go's EventCorrelator, on one event loop.

Events are API writes, and a pod that is refused every few seconds for hours would otherwise
write one each time. client-go merges them before they reach the API server, and kubectl users
know its results (``count: 37``, ``(combined from similar events): ...``), so this module keeps its
three rules and defaults (tools/record/events_cache.go):

* similar: more than ``AGGREGATE_MAX_EVENTS`` different messages of one reason on one pod within
  ``AGGREGATE_INTERVAL_S`` become one Event with the latest message behind ``AGGREGATE_PREFIX``;
* identical: a repeat is the same Event with its count grown (a PATCH, or nothing at all when the
  earlier write is still waiting for the budget);
* spam: each pod's writes draw on a bucket of ``SPAM_BURST``, refilled at ``SPAM_QPS``.

Everything it remembers sits in LRU maps of ``LRU_SIZE`` entries, so its memory is bounded
whatever the number of pods. The recorder (``events``) does the writing.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

# client-go's EventCorrelator defaults (tools/record/events_cache.go)
LRU_SIZE = 4096                 # remembered events, similar-event groups and per-pod spam buckets
AGGREGATE_MAX_EVENTS = 10       # different messages of one reason before they are combined
AGGREGATE_INTERVAL_S = 600.0
AGGREGATE_PREFIX = "(combined from similar events): "
SPAM_BURST = 25                 # writes per pod at once ...
SPAM_QPS = 1 / 300              # ... then one every five minutes


@dataclass(slots=True, frozen=True)
class PodRef:
    """The object an Event is about: a pod (the usual case) or, with ``kind`` "Node", a node (its
    Events go to the "default" namespace, as Kubernetes files a cluster-scoped object's)."""
    namespace: str
    name: str
    uid: str
    resource_version: str
    kind: str = "Pod"

    @classmethod
    def of(cls, pod: dict) -> PodRef:
        meta = pod.get("metadata") or {}
        return cls(namespace=meta.get("namespace") or "default", name=meta.get("name") or "",
                   uid=meta.get("uid") or "", resource_version=meta.get("resourceVersion") or "")


@dataclass(slots=True)
class SeenEvent:
    """One Event as the correlator remembers it: what was written, what is to be written."""
    pod: PodRef
    type: str
    reason: str
    message: str
    name: str
    first: datetime
    last: datetime
    count: int = 1
    written: int = 0         # the count the API server has
    created: bool = False    # a POST of it landed: further writes are PATCHes
    busy: bool = False       # a writer has it (waiting for the budget or writing): repeats fold into that


class _SpamBucket:
    """client-go's spam filter for one pod: SPAM_BURST writes, then SPAM_QPS a second."""
    __slots__ = ("tokens", "stamp")

    def __init__(self, now: float):
        self.tokens = float(SPAM_BURST)
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(SPAM_BURST, self.tokens + (now - self.stamp) * SPAM_QPS)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def _lru_get(cache: OrderedDict, key, size: int = LRU_SIZE, *, make=None):
    value = cache.get(key)
    if value is not None:
        cache.move_to_end(key)
    elif make is not None:
        value = cache[key] = make()
        if len(cache) > size:
            cache.popitem(last=False)
    return value


class EventCorrelator:
    """client-go's EventCorrelator, on one event loop: aggregate similar events, merge identical
    ones, filter spam. ``observe`` says which Event a new one should be written as, or None;
    ``merged(how)`` and ``dropped(cause)`` hear of each event it folds or drops (the metrics)."""

    def __init__(self, component: str, *, clock: Callable[[], float] = time.monotonic,
                 name: Callable[[str], str] | None = None,
                 merged: Callable[[str], None] = lambda how: None,
                 dropped: Callable[[str], None] = lambda cause: None):
        self.component = component
        self.clock = clock
        self._merged = merged
        self._dropped = dropped
        self._name = name or (lambda pod_name: f"{pod_name}.{time.time_ns():x}")
        self._similar: OrderedDict[tuple, tuple[float, set[str]]] = OrderedDict()
        self._seen: OrderedDict[tuple, SeenEvent] = OrderedDict()
        self._spam: OrderedDict[tuple, _SpamBucket] = OrderedDict()

    def observe(self, pod: PodRef, at: datetime, type_: str, reason: str, message: str) -> SeenEvent | None:
        now = self.clock()
        obj = (pod.kind, pod.namespace, pod.name, pod.uid)
        # 1. Similar events: the same reason with ever new messages becomes one combined Event.
        group = (*obj, type_, reason)
        stamp, messages = _lru_get(self._similar, group, make=lambda: (now, set()))
        if now - stamp > AGGREGATE_INTERVAL_S:
            messages = set()
        messages.add(message)
        self._similar[group] = (now, messages)
        key = (*obj, type_, reason, message)
        if len(messages) >= AGGREGATE_MAX_EVENTS:
            key = (*group, None)
            message = AGGREGATE_PREFIX + message
            self._merged("similar")
        # 2. Identical events: one Event whose count grows.
        seen = _lru_get(self._seen, key)
        if seen is None:
            seen = _lru_get(self._seen, key, make=lambda: SeenEvent(pod, type_, reason, message, self._name(pod.name),
                                                                at, at))
        else:
            seen.count += 1
            seen.last = max(seen.last, at)
            seen.message = message
            seen.pod = pod
            if seen.busy:                 # a writer has it: it writes this one too before it lets go
                self._merged("pending")
                return None
            self._merged("repeat")
        # 3. Spam: every write takes a token of the pod's bucket.
        if not _lru_get(self._spam, obj, make=lambda: _SpamBucket(now)).take(now):
            self._dropped("spam")
            return None
        seen.busy = True
        return seen

    def renamed(self, seen: SeenEvent) -> None:
        """The Event is gone from the API server (expired): the next write creates it anew."""
        seen.name = self._name(seen.pod.name)
        seen.created = False
        seen.written = 0

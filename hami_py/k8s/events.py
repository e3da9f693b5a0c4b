"""Kubernetes Events on the pod for every filter and bind outcome, written off the request path.

``kubectl describe pod`` is where users look first when a GPU pod stays Pending, and upstream
HAMi records ``FilteringSucceed`` / ``FilteringFailed`` / ``BindingSucceed`` / ``BindingFailed``
there with messages people and tools grep for, so reasons, types and message text are
upstream's, letter for letter (``hami-protocol.md`` §8).

An event is a write to the API server, and /filter must not wait for one. ``record`` only puts a
small job on a bounded queue (never awaiting; when the queue is full the job is dropped and
counted, as client-go's broadcaster drops when its channel is full). Even the message is built
later, by the background workers, because a failure message walks every candidate node's reason.
The workers draw on their own token bucket, so events never use up the ``--kube-qps`` budget
that pod patches, node locks and Bindings need (upstream HAMi's recorder writes through the
scheduler's own client, so a burst of FailedScheduling explanations waits in line with the
Bindings). Its rate is ``--kube-qps``/``--kube-burst`` again, in a bucket of its own, as
kube-scheduler gives its events a client of their own built from the same settings.

Repeats are merged as client-go's ``EventCorrelator`` merges them (``EventCorrelator`` here):

* an event identical to one already written (same pod, type, reason, message, source) becomes a
  PATCH of that Event's ``count`` and ``lastTimestamp``, not a new Event; one whose write is still
  waiting for the budget is folded into that write and costs no request at all;
* more than ``AGGREGATE_MAX_EVENTS`` different messages of one reason on one pod within
  ``AGGREGATE_INTERVAL_S`` become one Event, ``(combined from similar events): <latest>``;
* each pod's events go through a spam filter of ``SPAM_BURST`` writes, one more every
  ``1 / SPAM_QPS`` seconds; over it, the write is dropped (the count still grows, and the next
  write allowed carries it).

A scheduled pod gets one Event from us, not upstream's two: its ``FilteringSucceed`` is parked
(``event_parking``) until its bind, and a successful bind drops it and writes only
``BindingSucceed``, as kube-scheduler writes one ``Scheduled``. Every Event is an API request,
and issue 13 asks for at most four a scheduled pod in all (the node lock and the Binding are two).
A pod whose bind fails, that is filtered again, or that nobody binds within
``--filtering-succeed-window`` still gets its ``FilteringSucceed``, stamped with the filter's time
and written before whatever flushed it; ``--filtering-succeed-events=always`` writes every one at
once, as upstream.

Merged and dropped events are counted (``hami_events_merged_total{how}``, ``how="filter_into_bind"``
for a FilteringSucceed a bind made unnecessary; ``hami_events_dropped_total{cause}``).

Events stay current: one that waited in the queue longer than ``max_age_s`` (10 s) is not
written. When its pod has a later event queued it is merged into that one
(``how="superseded"``), else dropped (``cause="stale"``). Behind a backlog (a burst of
FilteringFailed on a slow budget) a fresh event is then written within seconds, not after the
backlog.

Deliberate difference from a literal reading of the core/v1 schema: ``eventTime`` is left unset,
as client-go's legacy recorder leaves it. A core/v1 Event *with* ``eventTime`` is validated as a
"new" event (``action`` and ``reportingInstance`` required, message capped at 1 KiB), and a
failure message that lists hundreds of nodes would be rejected.
"""
from __future__ import annotations

import asyncio
import re
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

import structlog

from hami_py.k8s.client import KubeApiError, KubeClient, TokenBucket
from hami_py.k8s.event_correlator import EventCorrelator, PodRef, SeenEvent
from hami_py.k8s.event_parking import DEFAULT_WINDOW_S, FILTERING_SUCCEED_MODES, UNBOUND, ParkingLot

log = structlog.get_logger(__name__)

FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
NODE_LOCK_STUCK = "NodeLockStuck"     # ours: a warning on a node whose lock holder makes no progress
# ours: a warning on a node whose device registration (of one family) the scheduler refuses
REGISTRATION_REFUSED = "RegistrationRefused"
# A bound pod whose device allocation annotations cannot be decoded (HAMi #2959 records one; its
# reason's name is not public: ours)
ALLOCATION_DECODE_FAILED = "AllocationDecodeFailed"
BINDING_SUCCEED = "BindingSucceed"
NORMAL = "Normal"
WARNING = "Warning"
DEFAULT_COMPONENT = "hami-scheduler"
DEFAULT_QUEUE_SIZE = 1000      # client-go's broadcaster queue length
DEFAULT_MAX_AGE_S = 10.0       # a queued event older than this is merged into a later one or dropped
RETRY_ATTEMPTS = 3

# Upstream re-parses each node's reason text with Sscanf("%d/%d %s"): only "<int>/<int> <Word>"
# tokens count, so fixed texts such as "node unregistered" produce no per-reason event.
_REASON_TOKEN = re.compile(r"\s*[+-]?\d+/[+-]?\d+\s*(\S+)")

EventSpec = tuple[str, str, str]          # (type, reason, message)


# ---------------------------------------------------------------------------------- messages
def reason_types(reason: str) -> set[str]:
    """The reason words in one node's failure text, e.g. ``1/4 CardInsufficientMemory``."""
    found = set()
    for token in reason.split(", "):
        match = _REASON_TOKEN.match(token)
        if match:
            found.add(match.group(1))
    return found


def filtering_failed_messages(*, failed: dict[str, str], total_nodes: int) -> list[str]:
    """One message per reason type (nodes sorted), then the summary, as upstream records them."""
    nodes_by_reason: dict[str, list[str]] = {}
    for node, reason in failed.items():
        for kind in reason_types(reason):
            nodes_by_reason.setdefault(kind, []).append(node)
    messages = [f"{len(nodes)} nodes {kind}({','.join(sorted(nodes))})"
                for kind, nodes in sorted(nodes_by_reason.items())]
    messages.append(f"no available node, {total_nodes} nodes do not meet")
    return messages


def filtering_succeeded_message(*, node: str, best: list[tuple[str, float]], fit: int, total_nodes: int) -> str:
    """``find fit node(n), <k> nodes not fit, <m> nodes fit(n1:s1,...)``, the listed nodes in
    reverse of ``best`` (which is best first), so the winner comes last: binpack ascending scores,
    spread descending, as upstream orders its list.

    Upstream lists every fitting node; at thousands of nodes that is a 100 KB message whose
    sorting and formatting cost more than the decision. The decision keeps only the best few
    (``hami_py.scheduling.decision.filter.LISTED_NODE_SCORES``); ``…<n> more,`` says how many are left out."""
    prefix = f"…{fit - len(best)} more," if fit > len(best) else ""
    listed = ",".join(f"{name}:{score:.2f}" for name, score in reversed(best))
    return f"find fit node({node}), {total_nodes - fit} nodes not fit, {fit} nodes fit({prefix}{listed})"


def binding_succeeded_message(*, node: str, namespace: str, name: str) -> str:
    return f"Successfully binding node [{node}] to {namespace}/{name}"


# ---------------------------------------------------------------------------------- recorder
@dataclass(slots=True)
class _Job:
    pod: PodRef
    at: datetime
    build: Callable[[], list[EventSpec]]
    # A parked FilteringSucceed this job flushed: written first, by the same writer, so that the
    # filter's Event lands before the bind's (two writers could otherwise reorder them).
    first: _Job | None = None

    # When it was queued (the loop's clock) and its place in line: a job that waited past
    # max_age_s is passed over (merged into the pod's later one, or dropped).
    queued: float = 0.0
    seq: int = 0

    def parts(self) -> list[_Job]:
        return [self] if self.first is None else [self.first, self]


def _key(job: _Job) -> tuple[str, str, str]:
    """Which object a job's events are about (a node's have no UID here)."""
    return job.pod.kind, job.pod.namespace, job.pod.uid or job.pod.name


def event_body(*, name: str, namespace: str, involved: dict, reason: str, message: str, type_: str,
               component: str, instance: str, first, last, count: int = 1) -> dict:
    """A core/v1 Event as this project writes every one (the recorder's, the defragmenter's)."""
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason, "message": message, "type": type_,
        "source": {"component": component},
        "firstTimestamp": rfc3339(first), "lastTimestamp": rfc3339(last), "count": count,
        "reportingComponent": component, "reportingInstance": instance,
    }


def rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Queue events now, write them in the background; never block, never raise to the caller.

    ``filtering_succeed``: ``unbound`` parks each FilteringSucceed until the pod's bind and drops
    it when the bind succeeds (module docstring); ``always`` writes it at once, as upstream.
    ``filtering_succeed_window_s``: how long a parked one waits for the bind (0: not at all)."""

    def __init__(self, client: KubeClient, *, component: str = "", metrics=None,
                 queue_size: int = DEFAULT_QUEUE_SIZE, workers: int = 2, qps: float = 5.0,
                 burst: int = 10, drain_timeout_s: float = 2.0, retry_backoff_s: float = 0.5,
                 filtering_succeed: str = UNBOUND, filtering_succeed_window_s: float = DEFAULT_WINDOW_S,
                 max_age_s: float = DEFAULT_MAX_AGE_S, clock: Callable[[], float] = time.monotonic):
        if queue_size < 1:
            raise ValueError(f"event queue size must be at least 1, got {queue_size}")
        if filtering_succeed not in FILTERING_SUCCEED_MODES:
            raise ValueError(f"filtering_succeed must be one of {FILTERING_SUCCEED_MODES}, got {filtering_succeed!r}")
        self.client = client
        self.component = component or DEFAULT_COMPONENT
        self.instance = socket.gethostname()
        self.metrics = metrics
        self.queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=queue_size)
        self.bucket = TokenBucket(qps, burst)
        self.drain_timeout_s = drain_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self._n_workers = max(1, workers)
        self._workers: list[asyncio.Task] = []
        self._sweeper: asyncio.Task | None = None
        self._closing = False
        self._last_stamp = 0
        # Events stay current: a job that waited in the queue longer than this is not written.
        # If its pod has a later job queued, that one says what the pod is doing now (merged,
        # how="superseded"); otherwise it is dropped (cause="stale"). A backlog behind a slow
        # budget then drains in seconds, and a fresh event is written within seconds of it.
        self.max_age_s = max_age_s
        self._clock = clock
        self._seq = 0
        self._latest: dict[tuple, int] = {}   # the object (_key) -> the seq of its latest queued job
        self.correlator = EventCorrelator(self.component, name=self._event_name,
                                          merged=self._count_merged, dropped=self._count_dropped)
        # Bounded as the queue is: the parked wait for a bind, the queued for the budget.
        parking = filtering_succeed == UNBOUND and filtering_succeed_window_s > 0
        self.parked: ParkingLot[_Job] | None = (
            ParkingLot(window_s=filtering_succeed_window_s, limit=queue_size) if parking else None)

    # -- producers (synchronous, called on the request path) -----------------------------------
    def record(self, pod: dict, build: Callable[[], list[EventSpec]]) -> bool:
        """Queue the events ``build()`` will describe; False (and counted) if the queue is full.
        A FilteringSucceed parked for the pod is written first: whatever happens to the pod
        after its filter (a failed bind, a preemption) reads after it."""
        if self._closing:
            return False
        job = _Job(PodRef.of(pod), datetime.now(timezone.utc), build)
        job.first = self._unpark(job.pod.uid)
        return self._enqueue(job)

    def on_filter(self, pod: dict, what: str, detail) -> None:
        """SchedulerService's hook: ``filter_succeeded`` / ``filter_failed`` with the
        FilterDecision, or ``filter_error`` with the error text."""
        # The messages are formatted by the writer, not here, off the request path.
        if what == "filter_succeeded":
            self._filter_succeeded(pod, detail)
        elif what == "filter_failed":
            self.record(pod, lambda: [(WARNING, FILTERING_FAILED, m) for m in filtering_failed_messages(
                failed=detail.failed, total_nodes=len(detail.failed) + detail.fit_count)])
        elif what == "filter_error":
            message = str(detail)
            self.record(pod, lambda: [(WARNING, FILTERING_FAILED, message)])
        else:
            log.warning("unknown filter event kind ignored", kind=what)

    def on_bind(self, pod: dict, node: str, error: str | None) -> None:
        """Binder's hook: ``error`` None for a bind that happened, else the event text."""
        if error is None:
            ref = PodRef.of(pod)
            if self._unpark(ref.uid) is not None:   # the bind says where the pod went: enough
                self._count_merged("filter_into_bind")
            message = binding_succeeded_message(node=node, namespace=ref.namespace, name=ref.name)
            self.record(pod, lambda: [(NORMAL, BINDING_SUCCEED, message)])
        else:
            self.record(pod, lambda: [(WARNING, BINDING_FAILED, error)])

    def on_preempt(self, pod: dict, reason: str, message: str, *, warning: bool = False) -> None:
        """Device preemption's hook (scheduling/eviction/preempting.py): ``Preempted`` on a victim and on
        its preemptor, as kube-scheduler records them (type Normal); ``PreemptionFailed`` on a
        preemptor whose evictions were refused (type Warning)."""
        type_ = WARNING if warning else NORMAL
        self.record(pod, lambda: [(type_, reason, message)])

    def on_pod(self, pod: dict, type_: str, reason: str, message: str) -> None:
        """Any other Event on a pod: an allocation its device plugin cannot read."""
        self.record(pod, lambda: [(type_, reason, message)])

    def on_node(self, node: str, type_: str, reason: str, message: str) -> None:
        """An Event on a node (``kubectl describe node``): a stuck node lock, a refused registration."""
        if self._closing:
            return
        self._enqueue(_Job(PodRef("default", node, "", "", kind="Node"), datetime.now(timezone.utc),
                           lambda: [(type_, reason, message)]))

    def forget(self, uid: str) -> None:
        """The pod is deleted: its parked FilteringSucceed tells nobody anything now (an Event
        about a deleted pod is garbage for the API server to expire), so it is dropped."""
        if self._unpark(uid) is not None:
            self._count_dropped("pod_deleted")

    def _filter_succeeded(self, pod: dict, decision) -> None:
        # Only the few values the message needs are kept, not the decision (whose failed-node map
        # can hold thousands of reasons), since a parked job may wait for the whole window.
        node, best, fit, total = decision.node, decision.best, decision.fit_count, decision.total

        def build() -> list[EventSpec]:
            return [(NORMAL, FILTERING_SUCCEED, filtering_succeeded_message(node=node, best=best, fit=fit,
                                                                            total_nodes=total))]
        ref = PodRef.of(pod)
        if self.parked is None or not ref.uid or self._closing:   # no UID: nothing a bind could match
            self.record(pod, build)
            return
        for flushed in self.parked.park(ref.uid, _Job(ref, datetime.now(timezone.utc), build)):
            self._enqueue(flushed)      # the pod's previous decision, or the oldest over the bound

    def _unpark(self, uid: str) -> _Job | None:
        return self.parked.take(uid) if uid and self.parked is not None else None

    def _enqueue(self, job: _Job) -> bool:
        self._seq += 1
        job.queued, job.seq = self._clock(), self._seq
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            self._count_dropped("queue_full")
            return False
        self._latest[_key(job)] = job.seq
        return True

    def _stale(self, job: _Job) -> bool:
        """Whether the job waited too long to be written; counted as merged or dropped then."""
        latest = self._latest.get(_key(job))
        if latest == job.seq:
            del self._latest[_key(job)]
        if self.max_age_s <= 0 or self._clock() - job.queued <= self.max_age_s:
            return False
        if latest is not None and latest > job.seq:
            self._count_merged("superseded")      # the pod's later event is still to be written
        else:
            self._count_dropped("stale")
        return True

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._closing = False
        self._workers = [asyncio.create_task(self._work(), name=f"event-writer-{i}")
                         for i in range(self._n_workers)]
        if self.parked is not None:
            self._sweeper = asyncio.create_task(self.parked.sweep(self._enqueue), name="event-sweeper")

    async def stop(self) -> None:
        """Stop taking events, queue every parked one, give the queue a short while to drain, then
        stop the writers."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        if self.parked is not None:
            for job in self.parked.drain():   # a pod still waiting for its bind: its filter is told
                self._enqueue(job)
        if self._workers:   # join() also waits for jobs a writer has taken but not finished
            try:
                await asyncio.wait_for(self.queue.join(), self.drain_timeout_s)
            except asyncio.TimeoutError:
                log.warning("events not written before shutdown", pending=self.queue.qsize())
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    # -- writers -------------------------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                if self._stale(job):
                    continue
                for part in job.parts():
                    for type_, reason, message in part.build():
                        seen = self.correlator.observe(part.pod, part.at, type_, reason, message)
                        if seen is not None:
                            await self._write(seen)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one event must not stop the writer
                log.exception("event writer failed", pod=f"{job.pod.namespace}/{job.pod.name}")
                self._count_dropped("internal_error")
            finally:
                self.queue.task_done()

    def _event_name(self, pod_name: str) -> str:
        # client-go names events "<object>.<hex nanoseconds>"; the counter keeps names unique
        # when two events of one pod fall in the same clock tick.
        stamp = max(time.time_ns(), self._last_stamp + 1)
        self._last_stamp = stamp
        return f"{pod_name}.{stamp:x}"

    def _event_body(self, seen: SeenEvent) -> dict:
        pod = seen.pod
        involved = {"kind": pod.kind, "name": pod.name, "apiVersion": "v1"}
        if pod.kind == "Pod":
            involved["namespace"] = pod.namespace
        if pod.uid:
            involved["uid"] = pod.uid
        if pod.resource_version:
            involved["resourceVersion"] = pod.resource_version
        return event_body(name=seen.name, namespace=pod.namespace, involved=involved, reason=seen.reason,
                          message=seen.message, type_=seen.type, component=self.component, instance=self.instance,
                          first=seen.first, last=seen.last, count=seen.count)

    async def _write(self, seen: SeenEvent) -> None:
        """Write ``seen`` once the budget allows: a POST of a new Event, or a PATCH of the existing
        one's count, lastTimestamp and message. One writer per Event at a time: repeats observed
        while it waits or writes are carried by it, with one more PATCH if they came too late."""
        namespace = seen.pod.namespace
        pod = f"{namespace}/{seen.pod.name}"
        failures = 0
        try:
            while seen.written < seen.count:
                await self.bucket.acquire()
                count = seen.count
                try:
                    # Not on the shared --kube-qps bucket: events have their own (self.bucket).
                    if seen.created:
                        await self.client.patch(f"/api/v1/namespaces/{namespace}/events/{seen.name}",
                                                {"count": count, "lastTimestamp": rfc3339(seen.last),
                                                 "message": seen.message}, limited=False)
                    else:
                        await self.client.post(f"/api/v1/namespaces/{namespace}/events", self._event_body(seen),
                                               limited=False)
                        seen.created = True
                    seen.written = count
                    self._count_written()
                except KubeApiError as exc:
                    if exc.conflict and not seen.created:   # an earlier attempt landed after all
                        seen.created = True
                        seen.written = count
                        self._count_written()
                        continue                            # and a PATCH if it carries more now
                    if exc.not_found and seen.created:      # expired from the API server: create anew
                        self.correlator.renamed(seen)
                        continue
                    failures += 1
                    if not (exc.uncertain or exc.status == 429) or failures >= RETRY_ATTEMPTS:
                        log.warning("event not written", reason=seen.reason, error=str(exc), pod=pod)
                        self._count_dropped("api_error")
                        seen.written = seen.count           # given up: the next repeat tries again
                        return
                    await asyncio.sleep(exc.retry_after or self.retry_backoff_s * (2 ** (failures - 1)))
        finally:
            seen.busy = False

    def _count_written(self) -> None:
        if self.metrics is not None:
            self.metrics.events_written.inc()

    def _count_dropped(self, cause: str) -> None:
        if self.metrics is not None:
            self.metrics.events_dropped.labels(cause).inc()

    def _count_merged(self, how: str) -> None:
        if self.metrics is not None:
            self.metrics.events_merged.labels(how).inc()

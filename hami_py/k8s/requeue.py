"""Wake kube-scheduler for pods this scheduler may have refused on books one event behind.

kube-scheduler and this scheduler watch the same pods, each on its own stream. When a GPU pod is
deleted, kube-scheduler moves the pods its extender refused back into its active queue at once
(for a pod no plugin of its own refused, any cluster event does), and calls /filter again. If
that call arrives before our own watch has delivered the delete, the books still charge the
deleted pod's devices and the pod is refused again, for the same reason as before. kube-scheduler
then parks it as unschedulable, and nothing brings it back until the next cluster event, which
in a quiet cluster can be minutes away (its flush of unschedulable pods runs after 5 minutes).
Upstream HAMi has the same race.

So when the books free devices on a node (a pod deleted or finished) shortly after a /filter
refused a pod, this module writes one node annotation, ``hami.io/requeue-time``. kube-scheduler
treats an annotation change on a node as a cluster event (``UpdateNodeAnnotation``) and retries
every pod its extender refused, now against books that include the release. One write wakes them
all, so the writes are few whatever the churn: one only for a refusal that came after the last
write, within ``window_s`` of it, and at most one every ``min_interval_s`` for the whole cluster
(a release sooner than that is written when the interval ends). A failed write is logged and
dropped: the next event, or kube-scheduler's own flush, still comes.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import structlog

from hami_py.k8s.client import KubeApiError, KubeClient, node_path

log = structlog.get_logger(__name__)

REQUEUE_ANNOTATION = "hami.io/requeue-time"
WINDOW_S = 5.0          # a release this soon after a refusal may have come too late for it
MIN_INTERVAL_S = 1.0    # one write wakes every refused pod; kube-scheduler backs them off a second anyway


class RequeueNudger:
    """``refused()`` from the filter path, ``freed(node)`` from the pod watch; never blocks."""

    def __init__(self, client: KubeClient, *, window_s: float = WINDOW_S,
                 min_interval_s: float = MIN_INTERVAL_S, enabled=lambda: True, metrics=None,
                 clock=time.monotonic):
        self.client = client
        self.window_s = window_s
        self.min_interval_s = min_interval_s
        self.enabled = enabled            # only the leader answers filters, so only it writes
        self.metrics = metrics
        self.clock = clock
        self._last_refusal = float("-inf")
        self._last_nudge = float("-inf")   # when the last write was started
        self._pending: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    def refused(self) -> None:
        """A /filter answered that no node fits."""
        self._last_refusal = self.clock()

    def freed(self, node: str) -> None:
        """The books released a pod's devices on ``node``."""
        now = self.clock()
        if not node or self._pending is not None or not self.enabled():
            return                          # a write already due wakes the same pods
        if self._last_refusal <= self._last_nudge or now - self._last_refusal > self.window_s:
            return                          # every refusal has been followed by a write already
        wait = self._last_nudge + self.min_interval_s - now
        if wait > 0:
            self._pending = asyncio.get_running_loop().call_later(wait, self._due, node)
        else:
            self._start(node)

    def wake(self, node: str) -> None:
        """Wake every pod kube-scheduler parked after a refusal, now (a gang just planned: its
        members wait for their retry). At most one write every ``min_interval_s``, as ``freed``."""
        if not node or self._pending is not None or not self.enabled():
            return
        wait = self._last_nudge + self.min_interval_s - self.clock()
        if wait > 0:
            self._pending = asyncio.get_running_loop().call_later(wait, self._due, node)
        else:
            self._start(node)

    def _due(self, node: str) -> None:
        self._pending = None
        if self.enabled():
            self._start(node)

    def _start(self, node: str) -> None:
        self._last_nudge = self.clock()
        task = asyncio.get_running_loop().create_task(self._write(node=node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, *, node: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            await self.client.patch(node_path(node), {"metadata": {"annotations": {REQUEUE_ANNOTATION: stamp}}})
            if self.metrics is not None:
                self.metrics.requeue_nudges.inc()
            log.debug("requeue nudge written", node=node)
        except KubeApiError as exc:
            if not exc.not_found:
                log.warning("requeue nudge not written", node=node, error=str(exc))

    async def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

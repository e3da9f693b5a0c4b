"""One running cluster and scheduler as a phase reaches them, and the sentinels it measures with.

Nothing here polls /metrics while measuring: at N = 5 000 one scrape is tens of MB of text the
scheduler renders on its own event loop, which would distort what is measured. Instead a
``Sentinel`` makes "the scheduler has applied every pod event committed so far" visible through
/filter on one probe node, because the pod watch delivers events in commit order. Pods created
for a measurement are deleted after it (``Context.cleanup``), so every measurement starts from
the seeded state.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.churn import PLUGIN_PERIOD_S
from bench.load import filter_body, filter_outcome, post
from bench.plans import ClusterPlan
from bench.procs import BenchError, ClusterProcess, SchedulerProcess, parse_prometheus, process_cpu_seconds
from bench.profiling import Profiler
from bench.seed import BENCH_NAMESPACE, blocker_name, node_name

# A filter of a pod whose earlier filter left work after its answer (a stale decision's cleanup)
# answers this at once; kube-scheduler retries the pod, and so does a sentinel.
BUSY_SUFFIX = "is still running (kube-scheduler retries the pod)"
SEEN_TIMEOUT_S = 60.0
POLL_S = 0.002           # between two sentinel probes: fine enough for a 50 ms target, light on the server
SETTLE_QUIET_S = 0.5


class Sentinel:
    """One probe node whose GPU 0 is filled by a blocker pod, and a probe pod for it.

    Delete the blocker, and the probe pod fits on the node exactly when the scheduler has applied
    that delete, and with it every pod event committed before it. Afterwards the blocker is
    re-created, so the sentinel can be used again (the probe pod's own earlier placement never
    counts against it: /filter drops a pod's previous reservation before deciding again)."""

    def __init__(self, ctx: "Context", *, node_index: int, probe_pod: dict):
        self.ctx = ctx
        self.node_index = node_index
        self.node = node_name(node_index)
        self.blocker = {"namespace": BENCH_NAMESPACE, "name": blocker_name(node_index, 0)}
        self.body = filter_body(orjson.dumps(probe_pod), orjson.dumps([self.node]))

    async def _poll_until(self, wanted: str, *, what: str, poll_s: float = POLL_S) -> float:
        deadline = time.monotonic() + SEEN_TIMEOUT_S
        url = f"{self.ctx.scheduler.url}/filter"
        while True:
            _, result = await post(self.ctx.session, url, self.body)
            outcome = filter_outcome(result)
            if outcome == wanted:
                return time.monotonic()
            if outcome == "error" and not str(result.get("Error")).endswith(BUSY_SUFFIX):
                raise BenchError(f"sentinel filter on {self.node} failed: {result.get('Error')}")
            if time.monotonic() > deadline:
                raise BenchError(f"sentinel {self.node}: {what} not seen within {SEEN_TIMEOUT_S}s")
            await asyncio.sleep(poll_s)

    async def armed(self) -> None:
        """Wait until the scheduler sees the blocker (after a re-create it may still be queued)."""
        await self._poll_until("unschedulable", what="the blocker")

    async def seen(self, *, poll_s: float = POLL_S) -> float:
        """Poll until the probe pod fits: the monotonic time the blocker's delete was visible."""
        return await self._poll_until("placed", what="the blocker's delete", poll_s=poll_s)

    async def rearm(self) -> None:
        await self.ctx.cluster.call("POST", "/blocker", {"node_index": self.node_index, "gpu": 0})

    async def lag(self) -> float:
        """Seconds from the blocker's delete (committed in the API server) to the cache freeing it."""
        await self.armed()
        deleted = await self.ctx.cluster.call("POST", "/delete", self.blocker)
        seen = await self.seen()
        await self.rearm()
        return seen - deleted["t"]


@dataclass
class Context:
    """One running cluster + scheduler, and what a phase needs to reach them."""
    plan: ClusterPlan
    session: aiohttp.ClientSession
    cluster: ClusterProcess
    scheduler: SchedulerProcess
    names_raw: bytes
    profiler: Profiler | None = None
    sentinels: list[Sentinel] = field(default_factory=list)
    serial: int = 0
    first_scrape_mb: float | None = None
    _next_sentinel: int = 0

    def prefix(self, what: str) -> str:
        self.serial += 1
        return f"{what}-{self.serial}"

    def sentinel(self) -> Sentinel:
        """Round robin, so a re-created blocker has time to arrive before its node is used again."""
        s = self.sentinels[self._next_sentinel % len(self.sentinels)]
        self._next_sentinel += 1
        return s

    async def make_sentinels(self) -> None:
        shape = self.plan.shape
        probes = await self.pending(shape.probe_nodes, what="sentinel")
        first = shape.nodes - shape.probe_nodes
        self.sentinels = [Sentinel(self, node_index=first + i, probe_pod=pod) for i, pod in enumerate(probes)]

    async def settle(self, *, timeout: float = 120.0, heartbeats: bool = True) -> None:
        """Wait until the scheduler has stopped writing to the API server in bulk (its handshake
        stamps after start-up, its Kubernetes Events after a phase). Answering the plugins'
        heartbeats it keeps re-stamping about N/30 nodes a second, for ever: that much (with
        slack) still counts as quiet; with the heartbeats paused (``heartbeats=False``) only
        silence does."""
        steady = self.plan.shape.nodes / PLUGIN_PERIOD_S if heartbeats else 0.0
        deadline = time.monotonic() + timeout
        since, base = time.monotonic(), await self._foreign_writes()
        while True:
            await asyncio.sleep(0.1)
            now, writes = time.monotonic(), await self._foreign_writes()
            if writes - base > 2 + 1.5 * steady * (now - since):
                since, base = now, writes          # still busy: start the quiet window again
            elif now - since >= SETTLE_QUIET_S:
                return
            if now > deadline:
                raise BenchError(f"the scheduler kept writing to the API server for {timeout}s; it never settled")

    async def _foreign_writes(self) -> int:
        return (await self.cluster.call("GET", "/stats"))["foreign_writes"]

    async def caught_up(self) -> None:
        """Every pod event committed so far has been applied by the scheduler."""
        await self.sentinel().lag()

    async def pending(self, count: int, *, what: str, annotations: dict | None = None,
                      families: tuple[str | None, ...] = (None,)) -> list[dict]:
        if count <= 0:
            return []
        return await self.cluster.call("POST", "/pending", {
            "prefix": self.prefix(what), "count": count, "gpus": 1, "gpumem": 4096, "gpucores": 10,
            "annotations": annotations or {}, "families": list(families)})

    async def cleanup(self, pods: list[dict]) -> None:
        """Delete the pods a measurement made; return once the scheduler has applied it."""
        await self.cluster.call("POST", "/cleanup", {"namespace": BENCH_NAMESPACE,
                                                     "names": [p["metadata"]["name"] for p in pods]})
        await self.caught_up()
        await self.settle()

    async def scrape(self) -> tuple[dict[str, float], float, int]:
        """One whole /metrics scrape: (samples, seconds, bytes). Only between measurements.

        The scheduler keeps the rendered lines between scrapes, so the first one also records
        the resident memory it added (``first_scrape_mb``)."""
        self.scheduler.check_alive()
        before = self.scheduler.memory().rss_mb if self.first_scrape_mb is None else None
        t0 = time.monotonic()
        async with self.session.get(self.scheduler.metrics_url, timeout=aiohttp.ClientTimeout(total=300)) as r:
            text = await r.text()
        seconds = time.monotonic() - t0
        if before is not None:
            self.first_scrape_mb = self.scheduler.memory().rss_mb - before
        return parse_prometheus(text), seconds, len(text)

    @asynccontextmanager
    async def window(self):
        """A measured stretch: the scheduler's CPU seconds over it, and the profiler on for it."""
        pid, api_pid = self.scheduler.pid, self.cluster.pid
        if self.profiler is not None:
            self.profiler.attach(pid)
            await asyncio.sleep(0.3)   # py-spy needs a moment to attach
        sample = {"cpu_s": process_cpu_seconds(pid), "api_cpu_s": process_cpu_seconds(api_pid)}
        try:
            yield sample
        finally:
            sample["cpu_s"] = process_cpu_seconds(pid) - sample["cpu_s"]
            sample["api_cpu_s"] = process_cpu_seconds(api_pid) - sample["api_cpu_s"]
            if self.profiler is not None:
                await self.profiler.detach()

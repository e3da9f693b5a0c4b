"""What a benchmark run does to one cluster, phase by phase, and the plans that list them.

A cluster scenario starts a fresh cluster process, seeds it, starts hami-scheduler against it
(timing start to ready), waits until the scheduler has stopped writing (its start-up handshake
stamps), then runs its phases:

* ``filter``:   /filter latency at each concurrency (pods ask 1 GPU, 4 GiB, 10 % cores; every
                request carries all N node names);
* ``schedule``: filter+bind throughput at each concurrency (see bench/load.py for the node locks);
* ``burst``:    pod add/update/delete events committed in one go; how fast the scheduler applies them;
* ``lag``:      delete a pod that fills a probe node's GPU, then poll /filter for a pod that fits
                only once the cache has freed it; first idle, then under a steady event stream;
* ``write-delay``: /filter latency, and filter+bind as kube-scheduler drives them, with every API
                write the scheduler makes delayed at the API server (issue 13: /filter writes
                nothing, so its latency must not follow the API server's);

and samples the scheduler's resident memory right after start-up, at the end, and after one
full /metrics scrape (whose per-device and per-pod lines the scheduler keeps cached).

Nothing here polls /metrics while measuring: at N = 5 000 one scrape is tens of MB of text the
scheduler renders on its own event loop, which would distort what is measured. Instead a
``Sentinel`` makes "the scheduler has applied every pod event committed so far" visible through
/filter on one probe node, because the pod watch delivers events in commit order. Pods created
for a measurement are deleted after it, so every measurement starts from the seeded state.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import orjson

from bench.all_mode import AllModePlan, phase_all_mode
from bench.backlog import BacklogPlan, phase_backlog
from bench.load import filter_body, filter_outcome, post, run_filters, run_schedule, run_until_bound, summarize_ms
from bench.cluster import PLUGIN_PERIOD_S
from bench.procs import BenchError, ClusterProcess, SchedulerProcess, parse_prometheus, process_cpu_seconds
from bench.profiling import Profiler

from bench.seed import (
    BENCH_NAMESPACE, FAMILY_VENDOR, MIXED_MODELS, ClusterShape, blocker_name, mixed_layout_text, mixed_unavailable,
    node_name, node_names,
)

PHASES = ("filter", "requests", "schedule", "burst", "lag", "contention", "write-delay", "all-mode", "backlog")
WRITES = ("POST", "PUT", "PATCH", "DELETE")
POD_EVENTS = 'hami_watch_events_total{resource="pods"}'
FILTER_SUM = 'hami_extender_request_duration_seconds_sum{verb="filter"}'
FILTER_COUNT = 'hami_extender_request_duration_seconds_count{verb="filter"}'
WARMUP_REQUESTS = 20
# A filter of a pod whose earlier filter left work after its answer (a stale decision's cleanup)
# answers this at once; kube-scheduler retries the pod, and so does a sentinel.
BUSY_SUFFIX = "is still running (kube-scheduler retries the pod)"
SEEN_TIMEOUT_S = 60.0
POLL_S = 0.002           # between two sentinel probes: fine enough for a 50 ms target, light on the server
# During the replay the scheduler is already near its limit (20 000 events/s is ~60 % of a core);
# a /filter probe (and the FilteringFailed Event it writes) every 2 ms would add ~25 % more load
# of the measurement's own. 5 ms still resolves a 50 ms target tenfold.
REPLAY_POLL_S = 0.005
SETTLE_QUIET_S = 0.5


@dataclass(frozen=True)
class EventsPlan:
    burst_pods: int          # the burst is 3 events a pod (add, update, delete)
    load_rate: float         # pod events a second in the steady stream
    load_seconds: float
    idle_probes: int         # lag samples before the stream starts; the rest run under it
    replay_seconds: float = 0.0   # then the same stream committed in advance and delivered at load_rate


@dataclass(frozen=True)
class ContentionPlan:
    pods: int                   # all onto the cluster's regular nodes (binpack: one node at a time)
    allocation_delay_s: float   # the simulated device plugin's time per allocation
    time_limit_s: float = 60.0


@dataclass(frozen=True)
class WriteDelayPlan:
    delay_s: float              # added to every write the scheduler sends the API server
    filter_samples: int         # /filter requests at concurrency 1 (after the warm-up)
    schedule_pods: int          # then filter+bind, one filter at a time, binds in the background
    filter_target_ms: float = 5.0   # issue 13: /filter p99 under this whatever the API server does
    rounds: int = 5             # each /filter measurement is the round with the median p99


@dataclass(frozen=True)
class ClusterPlan:
    name: str
    shape: ClusterShape
    filter_samples: int = 0            # per concurrency (and per round)
    schedule_pods: int = 0             # per concurrency
    events: EventsPlan | None = None
    concurrencies: tuple[int, ...] = (1, 8)
    phase_time_limit_s: float = 60.0
    filter_rounds: int = 1             # rounds at concurrency 1; the median-p99 round is reported
    request_count_pods: int = 0        # pods whose API requests are counted (kube-scheduler's pattern)
    manifest_budget: bool = False      # start the scheduler with manifests/deployment.yaml's --kube-qps/--kube-burst
    chart_budget: bool = False         # start it with neither flag, as HAMi's chart does (the defaults apply)
    # Then kube-scheduler's pattern again with pods arriving at this rate (issue 13 asks 100 pods/s
    # sustained with filter p99 <= 5 ms; 120 leaves a margin):
    # the filter's latency at a sustained rate, not while the loop is saturated by as many as it takes.
    schedule_rate: float | None = None
    schedule_rate_rounds: int = 3      # the paced row: the round with the median filter p99
    contention: ContentionPlan | None = None
    write_delay: WriteDelayPlan | None = None
    # The /filter stream's pods, round robin: None is NVIDIA's (1 GPU, 4 GiB, 10 %), else a
    # family key of bench.seed.FAMILY_LIMITS (one Ascend 910B3 share, one Kunlun XPU ...).
    filter_families: tuple[str | None, ...] = (None,)
    scheduler_args: tuple[str, ...] = ()
    # Run an all-NVIDIA cluster of the same size first and report this one's /filter beside it
    # (the mixed scenario: results["mixed"], not a row of the cluster tables).
    compare_with_nvidia: bool = False
    # The scheduler in --filter-mode=all: filter + prioritize + bind (bench/all_mode.py).
    all_mode: AllModePlan | None = None
    # /filter while binds wait on node locks that hung device plugins hold (bench/backlog.py).
    backlog: BacklogPlan | None = None


@dataclass(frozen=True)
class Plan:
    name: str
    kernel_shapes: tuple[ClusterShape, ...]
    kernel_seconds: float
    clusters: tuple[ClusterPlan, ...]


def _sweep(samples: int, pods: int, *, limit: float, rounds: int) -> tuple[ClusterPlan, ...]:
    return (
        ClusterPlan("n100", ClusterShape(100, 800, probe_nodes=2), samples, pods, phase_time_limit_s=limit,
                    filter_rounds=rounds),
        ClusterPlan("n1000", ClusterShape(1000, 8000, probe_nodes=2), samples, pods, phase_time_limit_s=limit,
                    filter_rounds=rounds),
        ClusterPlan("p0", ClusterShape(1000, 16, probe_nodes=2), samples, phase_time_limit_s=limit,
                    filter_rounds=rounds),
        ClusterPlan("p40000", ClusterShape(1000, 40000, probe_nodes=2), samples, phase_time_limit_s=limit,
                    filter_rounds=rounds),
    )


FULL = Plan(
    name="full",
    kernel_shapes=(ClusterShape(100, 800), ClusterShape(1000, 8000), ClusterShape(5000, 40000)),
    kernel_seconds=1.0,
    clusters=_sweep(1000, 500, limit=40.0, rounds=3) + (
        ClusterPlan("n5000", ClusterShape(5000, 40000, probe_nodes=16), 1000, 500,
                    EventsPlan(burst_pods=10_000, load_rate=20_000, load_seconds=10.0, idle_probes=20,
                               replay_seconds=5.0),
                    phase_time_limit_s=40.0, filter_rounds=3),
        # The API budget (issues 13, 24): requests per pod counted at the API server, and throughput
        # on the budget HAMi's chart leaves (no --kube-qps/--kube-burst: the defaults, which are
        # manifests/deployment.yaml's flags too), in kube-scheduler's pattern only.
        # And (write-delay) /filter at that size with every API write delayed by 50 ms.
        ClusterPlan("budget", ClusterShape(1000, 8000, probe_nodes=2), 0, 500, concurrencies=(),
                    phase_time_limit_s=40.0, request_count_pods=200, chart_budget=True, schedule_rate=120.0,
                    write_delay=WriteDelayPlan(delay_s=0.05, filter_samples=1000, schedule_pods=200),
                    backlog=BacklogPlan()),
        # 50 pods onto 2 nodes (binpack: all want the same node), a device plugin taking 100 ms
        # per allocation: time to all bound, and how many binds met a held node lock.
        ClusterPlan("contention", ClusterShape(3, 8, probe_nodes=1), concurrencies=(),
                    contention=ContentionPlan(pods=50, allocation_delay_s=0.1)),
        # 1 000 nodes: 40 % NVIDIA, the rest shared equally by one model of every other family
        # (bench.seed.MIXED_MODELS), 8 devices each, 8 000 pods; /filter for a stream of each
        # family's pods, beside an all-NVIDIA 1 000-node cluster measured in the same run
        # (MIXED_RATIO_TARGET).
        ClusterPlan("mixed", ClusterShape(1000, 8000, probe_nodes=2, layout="mixed"), 1000,
                    phase_time_limit_s=40.0, filter_rounds=3, filter_families=(None, *MIXED_MODELS),
                    scheduler_args=("--enable-ascend=true", "--enable-iluvatar=true"), compare_with_nvidia=True),
        # --filter-mode=all at the sizes of n1000 and n5000 (their filter and schedule rows are
        # the best-mode figures to compare with): every fitting node answered, /prioritize, and
        # the bind's second fit (bench/all_mode.py).
        ClusterPlan("all1000", ClusterShape(1000, 8000, probe_nodes=2), concurrencies=(),
                    phase_time_limit_s=40.0, scheduler_args=("--filter-mode=all",),
                    all_mode=AllModePlan(samples=500, schedule_pods=500)),
        ClusterPlan("all5000", ClusterShape(5000, 40000, probe_nodes=16), concurrencies=(),
                    phase_time_limit_s=40.0, scheduler_args=("--filter-mode=all",),
                    all_mode=AllModePlan(samples=300, schedule_pods=300)),
    ),
)

QUICK = Plan(
    name="quick",
    kernel_shapes=(ClusterShape(100, 800), ClusterShape(1000, 8000)),
    kernel_seconds=0.2,
    clusters=(
        ClusterPlan("n100", ClusterShape(100, 800, probe_nodes=4), 100, 50,
                    EventsPlan(burst_pods=1000, load_rate=20_000, load_seconds=1.5, idle_probes=5,
                               replay_seconds=0.5),
                    phase_time_limit_s=5.0),
        ClusterPlan("mixed", ClusterShape(100, 800, probe_nodes=2, layout="mixed"), 60, concurrencies=(1,),
                    phase_time_limit_s=5.0, filter_families=(None, *MIXED_MODELS),
                    scheduler_args=("--enable-ascend=true", "--enable-iluvatar=true"), compare_with_nvidia=True),
        ClusterPlan("all100", ClusterShape(100, 800, probe_nodes=2), concurrencies=(), phase_time_limit_s=5.0,
                    scheduler_args=("--filter-mode=all",), all_mode=AllModePlan(samples=50, schedule_pods=50)),
    ),
)

PLANS = {"full": FULL, "quick": QUICK}
MIXED_RATIO_TARGET = 1.3      # mixed-cluster /filter p50 and p99 over the all-NVIDIA cluster's


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


FILTER_UNDER_5MS = 'hami_extender_request_duration_seconds_bucket{le="0.005",verb="filter"}'


def _server_over_5ms(before: dict, after: dict) -> float:
    """Share of the filters the server itself took more than 5 ms over (from its histogram): a
    tail seen by the client but not here comes from outside the request handler (the other
    processes on the same cores, the loop busy with other work before the request is read)."""
    count = after.get(FILTER_COUNT, 0) - before.get(FILTER_COUNT, 0)
    under = after.get(FILTER_UNDER_5MS, 0) - before.get(FILTER_UNDER_5MS, 0)
    return 100 * (count - under) / count if count else float("nan")


def _server_mean_ms(before: dict, after: dict) -> float:
    count = after.get(FILTER_COUNT, 0) - before.get(FILTER_COUNT, 0)
    total = after.get(FILTER_SUM, 0) - before.get(FILTER_SUM, 0)
    return 1000 * total / count if count else float("nan")


async def phase_filter(ctx: Context) -> list[dict]:
    """Each concurrency measured ``filter_rounds`` times at concurrency 1 (once otherwise), and
    the round with the median p99 reported: on two shared cores another process's burst can
    spoil one round's tail, and one spoilt round should not decide a 1.2× flatness ratio.
    Every round's p99 is kept in ``p99_rounds``."""
    rows = []
    for concurrency in ctx.plan.concurrencies:
        rows.append(_median_round([await _filter_round(ctx, concurrency)
                                   for _ in range(ctx.plan.filter_rounds if concurrency == 1 else 1)]))
    return rows


async def _filter_round(ctx: Context, concurrency: int, samples: int | None = None) -> dict:
    samples = ctx.plan.filter_samples if samples is None else samples
    families = ctx.plan.filter_families
    pods = await ctx.pending(samples + WARMUP_REQUESTS, what=f"filter-c{concurrency}", families=families)
    bodies = [filter_body(orjson.dumps(p), ctx.names_raw) for p in pods]
    await run_filters(ctx.session, ctx.scheduler.url, bodies[:WARMUP_REQUESTS], concurrency=concurrency,
                      time_limit_s=ctx.plan.phase_time_limit_s)
    before, _, _ = await ctx.scrape()
    async with ctx.window() as used:
        run = await run_filters(ctx.session, ctx.scheduler.url, bodies[WARMUP_REQUESTS:],
                                concurrency=concurrency, time_limit_s=ctx.plan.phase_time_limit_s)
    after, _, _ = await ctx.scrape()
    n = len(run.latencies)
    row = {"concurrency": concurrency, **summarize_ms(run.latencies),
           "requests_per_s": n / run.wall_s if run.wall_s else 0.0,
           "server_mean_ms": _server_mean_ms(before, after),
           "server_over_5ms_pct": _server_over_5ms(before, after),
           "server_cpu_ms": 1000 * used["cpu_s"] / n if n else float("nan"),
           "outcomes": dict(run.outcomes), "errors": dict(run.errors)}
    if len(families) > 1 and concurrency == 1:   # one at a time: latency k is body k's
        by_family: dict[str, list[float]] = {}
        for k, latency in enumerate(run.latencies):
            family = families[(WARMUP_REQUESTS + k) % len(families)]
            by_family.setdefault(FAMILY_VENDOR.get(family, "NVIDIA"), []).append(latency)
        row["by_family"] = {name: summarize_ms(values) for name, values in by_family.items()}
    await ctx.cleanup(pods)
    return row


async def phase_schedule(ctx: Context) -> list[dict]:
    """Filter+bind at each concurrency (whole pods in flight), then as kube-scheduler drives an
    extender: one filter at a time, binds in the background (``mode`` "kube-scheduler")."""
    rows = []
    modes = [(c, False, None) for c in ctx.plan.concurrencies] + [(1, True, None)]
    if ctx.plan.schedule_rate:
        modes.append((1, True, ctx.plan.schedule_rate))
    for concurrency, async_binds, rate in modes:
        mode = ("kube-scheduler paced" if rate else "kube-scheduler") if async_binds else "whole pods"
        # The paced row's p99 is its 5th-worst filter: like /filter at concurrency 1, it is the
        # round with the median p99 of several, so that one spoilt round does not decide it.
        rounds = [await _schedule_round(ctx, concurrency=concurrency, async_binds=async_binds, rate=rate,
                                        mode=mode, round_=k)
                  for k in range(ctx.plan.schedule_rate_rounds if rate else 1)]
        ordered = sorted(rounds, key=lambda r: r["filter"]["p99"])
        rows.append({**ordered[len(ordered) // 2], "p99_rounds": [r["filter"]["p99"] for r in ordered]})
    return rows


async def _schedule_round(ctx: Context, *, concurrency: int, async_binds: bool, rate: float | None,
                          mode: str, round_: int) -> dict:
    pods = await ctx.pending(ctx.plan.schedule_pods, what=f"bind-c{concurrency}{'-ks' if async_binds else ''}"
                             f"{f'-r{rate:g}-{round_}' if rate else ''}",
                             annotations={"hami.io/node-scheduler-policy": "spread"})
    await ctx.settle()     # the last row's Events and deletes written: each row starts quiet
    async with ctx.window() as used:
        run = await run_schedule(ctx.session, ctx.scheduler.url, ctx.cluster, pods, ctx.names_raw,
                                 concurrency=concurrency, time_limit_s=ctx.plan.phase_time_limit_s,
                                 async_binds=async_binds, rate=rate)
    await ctx.cleanup(pods)
    return {"concurrency": concurrency, "mode": mode, "rate": rate,
            "pods_per_s": run.bound / run.wall_s if run.wall_s else 0.0,
            "bound": run.bound, "attempted": run.attempted,
            "filter": summarize_ms(run.filter_latencies), "bind": summarize_ms(run.bind_latencies),
            "server_cpu_ms_per_pod": 1000 * used["cpu_s"] / run.bound if run.bound else float("nan"),
            "outcomes": dict(run.outcomes), "errors": dict(run.errors)}


async def phase_requests(ctx: Context) -> dict:
    """The scheduler's API requests per pod bound, counted by the API server, by method and
    resource, in kube-scheduler's pattern. The plugin heartbeats are paused meanwhile, so that
    no handshake stamp (a node PATCH too) is counted as a lock; the Events are waited for."""
    pods = await ctx.pending(ctx.plan.request_count_pods, what="requests",
                             annotations={"hami.io/node-scheduler-policy": "spread"})
    await ctx.cluster.call("POST", "/heartbeats", {"paused": True})
    try:
        # Quiet when counting starts: the stamps answering heartbeats from before the pause are
        # written. What lands anyway (a requeue write the sentinels' probes caused) is told from
        # the commits and counted apart (bench/cluster.py).
        await ctx.settle(heartbeats=False)
        await ctx.cluster.call("POST", "/requests/reset")
        run = await run_schedule(ctx.session, ctx.scheduler.url, ctx.cluster, pods, ctx.names_raw,
                                 concurrency=1, time_limit_s=ctx.plan.phase_time_limit_s, async_binds=True)
        await ctx.settle()        # the Events written
        counts = await ctx.cluster.call("GET", "/requests")
    finally:
        await ctx.cluster.call("POST", "/heartbeats", {"paused": False})
    await ctx.cleanup(pods)
    bound = max(run.bound, 1)
    upkeep = {k: v for k, v in counts.items() if _upkeep(k)}
    per_pod = {k: v / bound for k, v in sorted(counts.items()) if not k.startswith("WATCH") and not _upkeep(k)}
    return {"pods": run.bound, "attempted": run.attempted, "counts": counts, "per_pod": per_pod,
            "critical_per_pod": sum(v for k, v in per_pod.items() if _critical(k)),
            "background_per_pod": sum(v for k, v in per_pod.items() if k in BACKGROUND_REQUESTS),
            "events_per_pod": sum(v for k, v in per_pod.items() if k.endswith(" events")),
            "upkeep": upkeep, "errors": dict(run.errors)}


# Requests a pod's bind causes after it has answered: the vgpu-node label, patched only where the
# API server drops a Binding's labels (before Kubernetes 1.35; Binder.observe_pod).
BACKGROUND_REQUESTS = ("PATCH pods",)


def _upkeep(key: str) -> bool:
    """Node upkeep in the window, not any pod's (bench/cluster.py tells it from the commits)."""
    return key.startswith("PATCH nodes (")


def _critical(key: str) -> bool:
    """On the pod's critical path: everything but the Events and the background label patch."""
    return not key.endswith(" events") and key not in BACKGROUND_REQUESTS


def _median_round(rounds: list[dict]) -> dict:
    """The round with the median p99, and every round's p99."""
    ordered = sorted(rounds, key=lambda r: r["p99"])
    return {**ordered[len(ordered) // 2], "p99_rounds": [r["p99"] for r in ordered]}


async def phase_write_delay(ctx: Context) -> dict:
    """/filter at concurrency 1, then filter+bind in kube-scheduler's pattern, with every write
    the scheduler sends delayed by ``delay_s`` at the API server (reads, watches and the
    cluster's own in-process writes are not). The filter writes nothing, so its latency should
    be the unhindered one; each bind waits for its node lock and its Binding. The same
    measurement without the delay is taken in the same run, its rounds alternating with the
    delayed ones (``baseline``): on shared cores the machine's own noise is then told apart from
    the API server's share."""
    plan = ctx.plan.write_delay
    delay = {"delay": plan.delay_s, "methods": list(WRITES)}
    # The rounds alternate (no delay, delay, no delay, ...), so that load other processes put on
    # the shared cores falls on both measurements alike; each is the round with the median p99.
    taken: dict[str, list[dict]] = {"baseline": [], "delayed": []}
    try:
        for _ in range(plan.rounds):
            for key in ("baseline", "delayed"):
                await ctx.cluster.call("POST", "/faults", delay if key == "delayed" else {"clear": True})
                taken[key].append(await _filter_round(ctx, 1, samples=plan.filter_samples))
    finally:
        await ctx.cluster.call("POST", "/faults", {"clear": True})
    baseline, filtered = _median_round(taken["baseline"]), _median_round(taken["delayed"])
    await ctx.cluster.call("POST", "/faults", delay)
    try:
        pods = await ctx.pending(plan.schedule_pods, what="write-delay-bind",
                                 annotations={"hami.io/node-scheduler-policy": "spread"})
        run = await run_schedule(ctx.session, ctx.scheduler.url, ctx.cluster, pods, ctx.names_raw,
                                 concurrency=1, time_limit_s=ctx.plan.phase_time_limit_s, async_binds=True)
    finally:
        await ctx.cluster.call("POST", "/faults", {"clear": True})
    await ctx.cleanup(pods)
    return {"delay_ms": 1000 * plan.delay_s, "filter_target_ms": plan.filter_target_ms, "filter": filtered,
            "baseline": baseline,
            "schedule": {"pods_per_s": run.bound / run.wall_s if run.wall_s else 0.0, "bound": run.bound,
                         "attempted": run.attempted, "filter": summarize_ms(run.filter_latencies),
                         "bind": summarize_ms(run.bind_latencies), "errors": dict(run.errors)}}


async def phase_contention(ctx: Context) -> dict:
    """50 pods (binpack) onto the regular nodes through kube-scheduler's pattern with its pod
    backoff; the simulated device plugin (over the API, as on a node) takes ``allocation_delay_s``
    per allocation before it frees the node lock."""
    from hami_py.fakeapi.deviceplugin import SimulatedDevicePlugin
    from hami_py.k8s.client import KubeClient, load_configuration, pod_path
    plan = ctx.plan.contention
    pods = await ctx.pending(plan.pods, what="contention")
    client = KubeClient(await load_configuration(str(ctx.cluster.kubeconfig)), qps=0, burst=1000)
    plugin = SimulatedDevicePlugin(client, allocation_delay_s=plan.allocation_delay_s)
    plugin.start()
    try:
        await asyncio.wait_for(plugin.informer.synced.wait(), 30)

        async def refresh(pod: dict) -> dict:
            meta = pod["metadata"]
            return await client.get(pod_path(meta["namespace"], meta["name"]))

        run = await run_until_bound(ctx.session, ctx.scheduler.url, pods, ctx.names_raw,
                                    time_limit_s=plan.time_limit_s, refresh=refresh)
        await wait_until_allocated(plugin, run.bound)
    finally:
        await plugin.stop()
        await client.close()
    return {"pods": plan.pods, "nodes": ctx.plan.shape.nodes - ctx.plan.shape.probe_nodes,
            "allocation_delay_s": plan.allocation_delay_s, "bound": run.bound, "seconds": run.seconds,
            "binds": run.binds, "lock_failures": run.lock_failures, "retries": run.retries,
            "errors": dict(run.errors), "allocated": plugin.allocated}


async def wait_until_allocated(plugin, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while plugin.allocated < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _regular_nodes(shape: ClusterShape) -> list[str]:
    return node_names(shape)[:shape.nodes - shape.probe_nodes]


async def phase_burst(ctx: Context) -> dict:
    """The burst, then a sentinel delete in the same synchronous stretch of the API server."""
    events = ctx.plan.events
    sentinel = ctx.sentinel()
    await sentinel.armed()
    await ctx.settle()
    async with ctx.window() as used:
        burst = await ctx.cluster.call("POST", "/burst", {"pods": events.burst_pods,
                                                          "nodes": _regular_nodes(ctx.plan.shape),
                                                          "then_delete": sentinel.blocker})
        t_applied = await sentinel.seen()
    await sentinel.rearm()
    n = burst["events"] + 1
    return {"events": n, "commit_s": burst["t_end"] - burst["t_start"],
            "apply_s": t_applied - burst["t_end"],
            "events_per_s": n / (t_applied - burst["t_end"]),
            "end_to_end_events_per_s": n / (t_applied - burst["t_start"]),
            "server_cpu_us_per_event": 1e6 * used["cpu_s"] / n,
            "api_cpu_us_per_event": 1e6 * used["api_cpu_s"] / n}


async def phase_lag(ctx: Context) -> dict:
    events = ctx.plan.events
    shape = ctx.plan.shape
    await ctx.settle()
    idle = []
    for _ in range(events.idle_probes):
        idle.append(await ctx.sentinel().lag())
        await asyncio.sleep(0.02)
    await ctx.settle()
    async with ctx.window() as used:
        await ctx.cluster.call("POST", "/load", {"rate": events.load_rate, "seconds": events.load_seconds,
                                                 "nodes": _regular_nodes(shape)})
        t_load = time.monotonic()
        await asyncio.sleep(min(0.5, events.load_seconds / 4))   # let the stream reach its rate first
        loaded = []
        while True:   # at least one probe, however slow the machine or short the load
            loaded.append(await ctx.sentinel().lag())
            if time.monotonic() - t_load >= events.load_seconds - 0.1:
                break
            await asyncio.sleep(0.02)
        while (status := await ctx.cluster.call("GET", "/load"))["running"]:
            await asyncio.sleep(0.05)
        # A delete committed after the stream's last event: seen, the whole stream was applied.
        catch_up = ctx.sentinel()
        await catch_up.armed()
        await ctx.cluster.call("POST", "/delete", catch_up.blocker)
        t_caught_up = await catch_up.seen()
    await catch_up.rearm()
    stream_s = status["t_end"] - status["t_start"]
    replay = await _replay(ctx) if events.replay_seconds else None
    return {"replay": replay, "idle_ms": summarize_ms(idle), "loaded_ms": summarize_ms(loaded),
            "stream_events": status["events"], "stream_target_rate": events.load_rate,
            "stream_rate": status["events"] / stream_s if stream_s else 0.0,
            "applied_rate": status["events"] / (t_caught_up - status["t_start"]),
            "behind_at_end_s": max(0.0, t_caught_up - status["t_end"]),
            "server_cpu_share": used["cpu_s"] / (t_caught_up - t_load),
            "api_cpu_share": used["api_cpu_s"] / (t_caught_up - t_load)}


async def _replay(ctx: Context) -> dict:
    """The delete-to-free lag with the stream delivered at the asked rate: the cluster commits
    ``load_rate × replay_seconds`` events (and one sentinel delete per probe node, spread among
    them) while the scheduler's pod watch is held, then releases them at ``load_rate`` lines a
    second and records when each sentinel's line was written. Each lag is from that write to the
    first /filter that finds the sentinel's GPU free (polled every REPLAY_POLL_S), so it is the
    scheduler's own delay at that event rate, without the stand-in's commit cost in it."""
    events = ctx.plan.events
    await ctx.settle()
    sentinels = ctx.sentinels
    for sentinel in sentinels:
        await sentinel.armed()
    async with ctx.window() as used:
        started = await ctx.cluster.call("POST", "/replay", {
            "rate": events.load_rate, "seconds": events.replay_seconds,
            "nodes": _regular_nodes(ctx.plan.shape), "sentinels": [s.blocker for s in sentinels]})
        seen = [await s.seen(poll_s=REPLAY_POLL_S) for s in sentinels[:started["sentinels"]]]
        while not (status := await ctx.cluster.call("GET", "/replay"))["done"]:
            await asyncio.sleep(0.05)
    for sentinel in sentinels:
        await sentinel.rearm()
    lags = [t_seen - t_written for t_seen, t_written in zip(seen, status["sentinel_written"])
            if t_written is not None]
    release_s = status["t_end"] - status["t0"]
    return {"events": status["queued"], "commit_s": status["commit_s"], "rate": status["rate"],
            "delivered_rate": status["queued"] / release_s if release_s > 0 else 0.0,
            "lag_ms": summarize_ms(lags), "cut": status["cut"],
            "server_cpu_share": used["cpu_s"] / max(release_s, 1e-9)}


async def run_cluster(plan: ClusterPlan, *, session: aiohttp.ClientSession, workdir: Path,
                      phases: tuple[str, ...] = PHASES, profiler: Profiler | None = None,
                      profile_startup: bool = False, scheduler_args: tuple[str, ...] = (),
                      scheduler_env: dict[str, str] | None = None, say=lambda text: None) -> dict:
    """Seed, start, measure; always stops both processes.

    With a profiler it samples the measured stretches, or with ``profile_startup`` the scheduler's
    whole life from its first instruction (start-up included). ``scheduler_args`` and ``scheduler_env`` are
    added to the scheduler's command line and environment (experiments: other flags, a
    sitecustomize on PYTHONPATH, PYTHONMALLOC…)."""
    async with started_cluster(plan, session=session, workdir=workdir, profiler=profiler,
                               profile_startup=profile_startup, scheduler_args=scheduler_args,
                               scheduler_env=scheduler_env, say=say) as (ctx, result):
        runs = (("filter", plan.filter_samples, "/filter latency", phase_filter),
                ("requests", plan.request_count_pods, "API requests per pod", phase_requests),
                ("schedule", plan.schedule_pods, "filter+bind throughput", phase_schedule),
                ("burst", plan.events, "watch event burst", phase_burst),
                ("lag", plan.events, "delete-to-free lag", phase_lag),
                ("contention", plan.contention, "node lock contention", phase_contention),
                ("write-delay", plan.write_delay, "/filter with every API write delayed", phase_write_delay),
                ("all-mode", plan.all_mode, "--filter-mode=all: filter, prioritize, bind", phase_all_mode),
                ("backlog", plan.backlog, "/filter while binds wait on held node locks", phase_backlog))
        for phase, planned, title, run in runs:
            if phase in phases and planned:
                say(f"[{plan.name}] {title}")
                result[phase] = await run(ctx)
                result["rss_after_mb"][phase] = ctx.scheduler.memory().rss_mb
    return result


@asynccontextmanager
async def started_cluster(plan: ClusterPlan, *, session: aiohttp.ClientSession, workdir: Path,
                          profiler: Profiler | None = None, profile_startup: bool = False,
                          scheduler_args: tuple[str, ...] = (), scheduler_env: dict[str, str] | None = None,
                          say=lambda text: None):
    """A seeded cluster and a ready, settled scheduler with its sentinels: ``(ctx, result)``;
    on exit the end-of-run memory and /metrics figures go into ``result``, and both processes
    are stopped (always)."""
    shape = plan.shape
    if shape.probe_nodes < 1:
        raise BenchError(f"cluster {plan.name} needs at least one probe node (its sentinels)")
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {"name": plan.name, "nodes": shape.nodes, "pods": shape.pods, "probe_nodes": shape.probe_nodes}
    cluster = ClusterProcess(workdir=workdir, session=session)
    wrap = profiler.wrap_startup() if profiler is not None and profile_startup else []
    budget = manifest_budget_args() if plan.manifest_budget else []
    if budget:   # as the scheduler got them: a later --scheduler-arg overrides the manifest's
        result["scheduler_args"] = [*budget, *scheduler_args]
    if plan.chart_budget:   # as HAMi's chart starts it: no budget flags, the defaults in force
        result["scheduler_args"] = [*plan.scheduler_args, *scheduler_args]
        result["budget"] = "chart (no --kube-qps, --kube-burst)"
    scheduler = SchedulerProcess(kubeconfig=cluster.kubeconfig, log_path=workdir / "scheduler.log", wrap=wrap,
                                 extra_args=[*budget, *plan.scheduler_args, *scheduler_args],
                                 extra_env=dict(scheduler_env or {}), budget_flags=not plan.chart_budget)
    try:
        await cluster.start()
        say(f"[{plan.name}] seeding {shape.nodes} nodes, {shape.pods} pods")
        seeded = await cluster.call("POST", "/seed", {"nodes": shape.nodes, "pods": shape.pods,
                                                      "probe_nodes": shape.probe_nodes, "seed": shape.seed,
                                                      "layout": shape.layout})
        result["seed_s"] = seeded["seconds"]
        scheduler.start()
        result["ready_s"] = await scheduler.wait_ready(session)
        result["memory_ready"] = vars(scheduler.memory())
        result["pid"] = scheduler.pid
        say(f"[{plan.name}] hami-scheduler pid {scheduler.pid} ready in {result['ready_s']:.2f}s")
        ctx = Context(plan, session, cluster, scheduler, orjson.dumps(node_names(shape)),
                      profiler=None if profile_startup else profiler)
        await ctx.settle()
        result["settled_s"] = time.monotonic() - scheduler.t_spawn
        await ctx.make_sentinels()
        result["rss_after_mb"] = {}    # where the memory grows, phase by phase
        yield ctx, result
        result["memory_end"] = vars(scheduler.memory())
        samples, seconds, size = await ctx.scrape()
        result["metrics_scrape"] = {"seconds": seconds, "mb": size / 1e6, "pod_events": samples.get(POD_EVENTS),
                                    "first_scrape_rss_mb": ctx.first_scrape_mb}
        result["memory_after_scrape"] = vars(scheduler.memory())
    finally:
        await scheduler.stop()
        await cluster.stop()


def manifest_budget_args() -> list[str]:
    """``--kube-qps``/``--kube-burst`` exactly as manifests/deployment.yaml gives them to hami-py."""
    import yaml
    from bench.procs import REPO_ROOT
    docs = yaml.safe_load_all((REPO_ROOT / "manifests" / "deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "hami-py")
    wanted = [a for a in container["args"] if a.split("=", 1)[0] in ("--kube-qps", "--kube-burst")]
    if len(wanted) != 2:
        raise BenchError(f"manifests/deployment.yaml gives hami-py {wanted}, not --kube-qps and --kube-burst")
    return wanted


async def run_mixed(plan: ClusterPlan, *, session: aiohttp.ClientSession, workdir: Path,
                    say=lambda text: None, **kwargs) -> dict:
    """The mixed-cluster /filter figure beside the all-NVIDIA one, from the same run: both
    clusters (the same N and P, one all NVIDIA) run side by side, and their /filter rounds
    alternate (NVIDIA, mixed, NVIDIA, ...), so that the load other processes put on the shared
    cores falls on both alike. Each cluster's round with the median p99 is reported, as in the
    filter phase. Skipped (with the reason) while a family it needs has no vendor yet."""
    reason = mixed_unavailable()
    if reason:
        say(f"[{plan.name}] skipped: {reason}")
        return {"name": plan.name, "skipped": reason}
    baseline_plan = replace(plan, name=f"{plan.name}-nvidia", shape=replace(plan.shape, layout="nvidia"),
                            filter_families=(None,), scheduler_args=(), compare_with_nvidia=False)
    mixed_plan = replace(plan, compare_with_nvidia=False)
    out: dict = {"name": plan.name, "nodes": plan.shape.nodes, "pods": plan.shape.pods,
                 "families": [FAMILY_VENDOR.get(f, "NVIDIA") for f in plan.filter_families],
                 "layout": mixed_layout_text(plan.shape), "target_ratio": MIXED_RATIO_TARGET, "interleaved": True}
    async with started_cluster(baseline_plan, session=session, workdir=workdir / baseline_plan.name, say=say,
                               **kwargs) as (base_ctx, base_result), \
            started_cluster(mixed_plan, session=session, workdir=workdir / mixed_plan.name, say=say,
                            **kwargs) as (mixed_ctx, mixed_result):
        await base_ctx.settle()      # quiet again while the second one started
        say(f"[{plan.name}] /filter latency, rounds alternating between the two clusters")
        rows: dict[str, list[dict]] = {"nvidia": [], "mixed": []}
        for concurrency in plan.concurrencies:
            rounds: dict[str, list[dict]] = {"nvidia": [], "mixed": []}
            for _ in range(plan.filter_rounds if concurrency == 1 else 1):
                for key, ctx in (("nvidia", base_ctx), ("mixed", mixed_ctx)):
                    rounds[key].append(await _filter_round(ctx, concurrency))
            for key, taken in rounds.items():
                rows[key].append(_median_round(taken))
        base_result["filter"], mixed_result["filter"] = rows["nvidia"], rows["mixed"]
    out["nvidia"], out["mixed"] = base_result, mixed_result
    out["ratios"] = mixed_ratios(out)
    from bench.kernel import decide_by_family    # in this process: the caches are built here
    say(f"[{plan.name}] in-process decide() per family")
    out["decide_us"] = {"nvidia": decide_by_family(baseline_plan.shape, (None,)),
                        "mixed": decide_by_family(mixed_plan.shape, plan.filter_families)}
    return out


def mixed_ratios(result: dict) -> list[dict]:
    """Per concurrency: mixed p50 and p99 over the all-NVIDIA cluster's."""
    rows = []
    base = {r["concurrency"]: r for r in result["nvidia"].get("filter", [])}
    for r in result["mixed"].get("filter", []):
        b = base.get(r["concurrency"])
        if b is None:
            continue
        def ratio(key: str) -> float:
            return r[key] / b[key] if b.get(key) else float("nan")
        rows.append({"concurrency": r["concurrency"], "p50": ratio("p50"), "p99": ratio("p99"),
                     "server_cpu_ms": ratio("server_cpu_ms")})
    return rows

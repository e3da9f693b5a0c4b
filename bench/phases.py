"""The phases that send the scheduler pods to decide: filter, requests, schedule, write-delay and
contention (bench/scenarios.py says what each measures).

Each takes a ``Context`` (bench/context.py), creates the pods it measures with and deletes them
afterwards, so every phase starts from the seeded cluster.
"""
from __future__ import annotations

import asyncio
import time

import orjson

from bench.context import Context
from bench.floor import FloorProcess
from bench.kernel import decide_alone
from bench.load import filter_body, run_filters, run_schedule, run_until_bound, summarize_ms
from bench.rounds import median_round, server_mean_ms, server_over_5ms
from bench.seed import FAMILY_VENDOR

WRITES = ("POST", "PUT", "PATCH", "DELETE")
WARMUP_REQUESTS = 20


async def phase_filter(ctx: Context) -> list[dict]:
    """Each concurrency measured ``filter_rounds`` times at concurrency 1 (once otherwise), and
    the round with the median p99 reported: on two shared cores another process's burst can
    spoil one round's tail, and one spoilt round should not decide a 1.2× flatness ratio.
    Every round's p99 is kept in ``p99_rounds``.

    At concurrency 1 each round also sends its bodies to the floor server (bench/floor.py), right
    after the scheduler, and the row keeps that (``floor``) and ``decide()`` alone in process
    (``decide_alone_us``): the floor the /filter figures are set against."""
    rows = []
    floor = None
    if 1 in ctx.plan.concurrencies and len(ctx.plan.filter_families) == 1:
        floor = FloorProcess(log_path=ctx.scheduler.log_path.with_name("floor.log"))
        await floor.start(ctx.session)
    try:
        for concurrency in ctx.plan.concurrencies:
            rows.append(median_round([await filter_round(ctx, concurrency, floor=floor if concurrency == 1 else None)
                                      for _ in range(ctx.plan.filter_rounds if concurrency == 1 else 1)]))
    finally:
        if floor is not None:
            floor.stop()
    if floor is not None:
        decide_us = decide_alone(ctx.plan.shape)
        for row in rows:
            if "floor" in row:
                row["decide_alone_us"] = decide_us
    return rows


async def filter_round(ctx: Context, concurrency: int, samples: int | None = None, *,
                       floor: FloorProcess | None = None) -> dict:
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
           "server_mean_ms": server_mean_ms(before, after),
           "server_over_5ms_pct": server_over_5ms(before, after),
           "server_cpu_ms": 1000 * used["cpu_s"] / n if n else float("nan"),
           "outcomes": dict(run.outcomes), "errors": dict(run.errors)}
    if len(families) > 1 and concurrency == 1:   # one at a time: latency k is body k's
        by_family: dict[str, list[float]] = {}
        for k, latency in enumerate(run.latencies):
            family = families[(WARMUP_REQUESTS + k) % len(families)]
            by_family.setdefault(FAMILY_VENDOR.get(family, "NVIDIA"), []).append(latency)
        row["by_family"] = {name: summarize_ms(values) for name, values in by_family.items()}
    if floor is not None:
        await run_filters(ctx.session, floor.url, bodies[:WARMUP_REQUESTS], concurrency=1,
                          time_limit_s=ctx.plan.phase_time_limit_s)
        floor_run = await run_filters(ctx.session, floor.url, bodies[WARMUP_REQUESTS:], concurrency=1,
                                      time_limit_s=ctx.plan.phase_time_limit_s)
        row["floor"] = summarize_ms(floor_run.latencies)
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
                taken[key].append(await filter_round(ctx, 1, samples=plan.filter_samples))
    finally:
        await ctx.cluster.call("POST", "/faults", {"clear": True})
    baseline, filtered = median_round(taken["baseline"]), median_round(taken["delayed"])
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

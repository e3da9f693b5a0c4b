"""What a benchmark run does to one cluster, phase by phase.

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

The plans are bench/plans.py; the phases bench/phases.py, bench/event_phases.py,
bench/all_mode.py and bench/backlog.py; what they measure with (the running processes, and the
sentinels that tell when the scheduler has caught up) bench/context.py.
"""
from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson

from bench.all_mode import phase_all_mode
from bench.backlog import phase_backlog
from bench.context import Context
from bench.event_phases import phase_burst, phase_lag
from bench.phases import (
    filter_round, phase_contention, phase_filter, phase_requests, phase_schedule, phase_write_delay,
)
from bench.plans import ClusterPlan
from bench.procs import BenchError, ClusterProcess, SchedulerProcess
from bench.profiling import Profiler
from bench.rounds import median_round
from bench.seed import FAMILY_VENDOR, mixed_layout_text, mixed_unavailable, node_names

PHASES = ("filter", "requests", "schedule", "burst", "lag", "contention", "write-delay", "all-mode", "backlog")
POD_EVENTS = 'hami_watch_events_total{resource="pods"}'
MIXED_RATIO_TARGET = 1.3      # mixed-cluster /filter p50 and p99 over the all-NVIDIA cluster's


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
                    rounds[key].append(await filter_round(ctx, concurrency))
            for key, taken in rounds.items():
                rows[key].append(median_round(taken))
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

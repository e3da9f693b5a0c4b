"""The phases that send the scheduler pod events: burst, and lag (idle, under a steady stream,
and replayed at the stream's rate).

The cluster process commits the events (bench/churn.py); a sentinel (bench/context.py) tells
when the scheduler has applied them.
"""
from __future__ import annotations

import asyncio
import time

from bench.context import Context
from bench.load import summarize_ms
from bench.seed import ClusterShape, node_names

# During the replay the scheduler is already near its limit (20 000 events/s is ~60 % of a core);
# a /filter probe (and the FilteringFailed Event it writes) every 2 ms would add ~25 % more load
# of the measurement's own. 5 ms still resolves a 50 ms target tenfold.
REPLAY_POLL_S = 0.005


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

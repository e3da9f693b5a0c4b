"""The ``backlog`` phase: /filter while binds wait on held node locks (issue 24).

kube-scheduler runs one scheduling cycle at a time, and each waits for /filter; binding cycles run
beside it. So binds that wait (here on node locks held by device plugins that hang) must not slow
any /filter, or every pod of the cluster waits with them. Set up as in issue 24:

* ``stuck_nodes`` nodes whose device plugin hangs: a pod bound there with bind-phase
  ``allocating`` holds the node's ``hami.io/mutex.lock``, taken just now (so it is a lock in
  progress, which a bind waits for up to ``--node-lock-wait``, not yet a stuck one);
* ``backlog_pods`` pods filtered onto those nodes, and their binds sent at once: they all wait;
* meanwhile kube-scheduler's scheduling cycle goes on: one /filter at a time over all N nodes for
  new pods, measured as the ``filter`` phase measures it (client latency, and the share the server
  itself took over 5 ms from its histogram).

The row says how many of the binds were still waiting when the measured stretch ended (all of
them, or the figure measures less than it claims). Then the plugins recover (locks released, the
holders gone) and the binds finish.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson

from bench.load import bind_body, filter_body, post, run_filters, summarize_ms
from bench.procs import BenchError
from bench.rounds import median_round, server_mean_ms, server_over_5ms
from bench.seed import node_name

WARMUP = 20


@dataclass(frozen=True)
class BacklogPlan:
    stuck_nodes: int = 3        # nodes whose lock a hung device plugin holds
    backlog_pods: int = 30      # binds waiting on those locks
    filter_samples: int = 300   # new pods' /filter per round, one at a time, while they wait
    rounds: int = 3             # the round with the median p99 is reported, as in the filter phase
    time_limit_s: float = 8.0   # inside --node-lock-wait (10 s), so the binds are still waiting


async def phase_backlog(ctx) -> dict:
    plan: BacklogPlan = ctx.plan.backlog
    url = ctx.scheduler.url
    stuck = list(range(plan.stuck_nodes))
    backlog = await ctx.pending(plan.backlog_pods, what="backlog")
    new = await ctx.pending(plan.rounds * plan.filter_samples + WARMUP, what="beside-backlog")
    for index in stuck:
        await ctx.cluster.call("POST", "/hang-lock", {"node_index": index})
    binds: list[asyncio.Task] = []
    try:
        stuck_names = orjson.dumps([node_name(i) for i in stuck])
        sent = time.monotonic()
        for pod in backlog:
            _, answer = await post(ctx.session, f"{url}/filter", filter_body(orjson.dumps(pod), stuck_names))
            if not answer.get("NodeNames"):
                raise BenchError(f"backlog pod {pod['metadata']['name']} did not fit on the locked nodes: {answer}")
            binds.append(asyncio.create_task(post(ctx.session, f"{url}/bind", bind_body(pod, answer["NodeNames"][0]))))
        bodies = [filter_body(orjson.dumps(p), ctx.names_raw) for p in new]
        await run_filters(ctx.session, url, bodies[:WARMUP], concurrency=1, time_limit_s=plan.time_limit_s)
        rounds = []
        for k in range(plan.rounds):
            batch = bodies[WARMUP + k * plan.filter_samples:WARMUP + (k + 1) * plan.filter_samples]
            before, _, _ = await ctx.scrape()
            run = await run_filters(ctx.session, url, batch, concurrency=1,
                                    time_limit_s=plan.time_limit_s - (time.monotonic() - sent))
            after, _, _ = await ctx.scrape()
            rounds.append({**summarize_ms(run.latencies), "server_mean_ms": server_mean_ms(before, after),
                           "server_over_5ms_pct": server_over_5ms(before, after),
                           "outcomes": dict(run.outcomes), "errors": dict(run.errors)})
        waiting = sum(not b.done() for b in binds)
    finally:
        await _recover(ctx, stuck)
        # No device plugin allocates here: the first bind onto each node takes its lock and keeps
        # it, and the others end at --node-lock-wait. Their outcome is not what this phase measures.
        await asyncio.gather(*binds)
        await _recover(ctx, stuck)
    await ctx.cleanup(backlog + new)
    median = median_round(rounds)
    return {"stuck_nodes": plan.stuck_nodes, "backlog_pods": plan.backlog_pods, "binds_waiting_at_end": waiting,
            "filter": {k: median[k] for k in ("n", "p50", "p90", "p99", "max", "mean", "p99_rounds")},
            "server_mean_ms": median["server_mean_ms"], "server_over_5ms_pct": median["server_over_5ms_pct"],
            "outcomes": median["outcomes"], "errors": median["errors"]}


async def _recover(ctx, nodes: list[int]) -> None:
    for index in nodes:
        await ctx.cluster.call("POST", "/hang-lock", {"node_index": index, "release": True})

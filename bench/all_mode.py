"""The ``all-mode`` phase: what --filter-mode=all costs (README, "Keeping kube-scheduler in the loop").

The scheduler of such a plan runs with ``--filter-mode=all``. kube-scheduler then makes, per pod,
one /filter (all N node names in, every fitting node's name out, nothing reserved), one
/prioritize (the fitting names in, a 0..10 score each out) and, once it has chosen, one /bind
(the pod fitted again on that node and reserved, then bound as in ``best`` mode). Measured here:

* per pod, one at a time: /filter latency and the size of its answer, /prioritize latency with
  the nodes the filter let through, and the two together (the extender's share of kube-scheduler's
  scheduling cycle);
* filter + prioritize + bind throughput as kube-scheduler drives an extender: one scheduling cycle
  at a time (filter, prioritize, the highest score chosen, ties at random as kube-scheduler's
  selectHost does), each /bind in the background (at most ``BINDS_IN_FLIGHT``), the cluster
  freeing each node lock as the device plugin would. Pods ask for spread, as the ``schedule``
  phase's do, so that the two compare.

The ``best``-mode figures to compare with are the same run's ``filter`` and ``schedule`` rows of
the cluster of the same size (n1000, n5000).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass

import orjson

from bench.load import BINDS_IN_FLIGHT, bind_body, filter_body, post, summarize_ms

WARMUP = 10


@dataclass(frozen=True)
class AllModePlan:
    samples: int            # pods filtered and prioritized one at a time (after the warm-up)
    schedule_pods: int      # then filter + prioritize + bind in kube-scheduler's pattern


def prioritize_body(pod_raw: bytes, names: list[str]) -> bytes:
    return b'{"Pod":' + pod_raw + b',"Nodes":null,"NodeNames":' + orjson.dumps(names) + b"}"


def choose(scores: list[dict], rng: random.Random) -> str | None:
    """kube-scheduler's selectHost over our scores alone: the highest, ties at random."""
    if not scores:
        return None
    top = max(h["Score"] for h in scores)
    return rng.choice([h["Host"] for h in scores if h["Score"] == top])


async def _cycle(session, url: str, pod: dict, names_raw: bytes, out: dict) -> tuple[list[str], list[dict]] | None:
    raw = orjson.dumps(pod)
    t0 = time.perf_counter()
    async with session.post(f"{url}/filter", data=filter_body(raw, names_raw),
                            headers={"Content-Type": "application/json"}) as r:
        answer = await r.read()
    t_filter = time.perf_counter() - t0
    result = orjson.loads(answer)
    out["filter"].append(t_filter)
    out["answer_bytes"].append(len(answer))
    names = result.get("NodeNames") or []
    if result.get("Error") or not names:
        out["errors"][str(result.get("Error") or "fits nowhere")[:120]] += 1
        return None
    out["fit"].append(len(names))
    t_prio, scores = await post(session, f"{url}/prioritize", prioritize_body(raw, names))
    out["prioritize"].append(t_prio)
    out["cycle"].append(t_filter + t_prio)
    if not isinstance(scores, list) or len(scores) != len(names):
        out["errors"]["prioritize gave no scores"] += 1
        return None
    return names, scores


async def phase_all_mode(ctx) -> dict:
    plan: AllModePlan = ctx.plan.all_mode
    url = ctx.scheduler.url
    rng = random.Random(7)

    # One at a time: the latencies.
    pods = await ctx.pending(plan.samples + WARMUP, what="all-filter")
    warm = {"filter": [], "answer_bytes": [], "fit": [], "prioritize": [], "cycle": [], "errors": Counter()}
    for pod in pods[:WARMUP]:
        await _cycle(ctx.session, url, pod, ctx.names_raw, warm)
    measured = {"filter": [], "answer_bytes": [], "fit": [], "prioritize": [], "cycle": [], "errors": Counter()}
    async with ctx.window() as used:
        for pod in pods[WARMUP:]:
            await _cycle(ctx.session, url, pod, ctx.names_raw, measured)
    n = len(measured["filter"])
    latencies = {
        "filter": summarize_ms(measured["filter"]), "prioritize": summarize_ms(measured["prioritize"]),
        "cycle": summarize_ms(measured["cycle"]),
        "answer_kb": sum(measured["answer_bytes"]) / n / 1000 if n else float("nan"),
        "fit_nodes": sum(measured["fit"]) / len(measured["fit"]) if measured["fit"] else 0,
        "server_cpu_ms_per_cycle": 1000 * used["cpu_s"] / n if n else float("nan"),
        "errors": dict(measured["errors"])}
    await ctx.cleanup(pods)

    # kube-scheduler's pattern: filter, prioritize, choose, bind in the background.
    pods = await ctx.pending(plan.schedule_pods, what="all-bind",
                             annotations={"hami.io/node-scheduler-policy": "spread"})
    run = {"filter": [], "answer_bytes": [], "fit": [], "prioritize": [], "cycle": [], "errors": Counter()}
    binds: list[float] = []
    bound = attempted = 0
    allocations: set[asyncio.Task] = set()
    slots = asyncio.Semaphore(BINDS_IN_FLIGHT)
    in_flight: set[asyncio.Task] = set()

    async def bind_one(pod: dict, node: str) -> None:
        nonlocal bound
        elapsed, answer = await post(ctx.session, f"{url}/bind", bind_body(pod, node))
        binds.append(elapsed)
        if answer.get("Error"):
            run["errors"][str(answer["Error"])[:120]] += 1
            return
        bound += 1
        meta = pod["metadata"]
        task = asyncio.create_task(ctx.cluster.call("POST", "/allocate", {
            "namespace": meta["namespace"], "name": meta["name"], "node": node}))
        allocations.add(task)
        task.add_done_callback(allocations.discard)

    deadline = time.perf_counter() + ctx.plan.phase_time_limit_s
    async with ctx.window() as used_schedule:
        t0 = time.perf_counter()
        for pod in pods:
            if time.perf_counter() > deadline:
                break
            attempted += 1
            cycle = await _cycle(ctx.session, url, pod, ctx.names_raw, run)
            if cycle is None:
                continue
            node = choose(cycle[1], rng)
            await slots.acquire()
            task = asyncio.create_task(bind_one(pod, node))
            in_flight.add(task)
            task.add_done_callback(lambda t: (in_flight.discard(t), slots.release()))
        if in_flight:
            await asyncio.gather(*in_flight)
        wall = time.perf_counter() - t0
    if allocations:
        await asyncio.gather(*allocations)
    schedule = {"pods_per_s": bound / wall if wall else 0.0, "bound": bound, "attempted": attempted,
                "filter": summarize_ms(run["filter"]), "prioritize": summarize_ms(run["prioritize"]),
                "bind": summarize_ms(binds),
                "server_cpu_ms_per_pod": 1000 * used_schedule["cpu_s"] / bound if bound else float("nan"),
                "errors": dict(run["errors"])}
    await ctx.cleanup(pods)
    return {**latencies, "schedule": schedule}


def inprocess_costs(shape, *, calls: int = 50) -> dict:
    """µs per call in this process (median), on the cluster ``shape`` seeds: ``best`` mode's
    decision (``Filterer.decide``, nothing reserved) against ``all`` mode's /filter (every
    fitting node) and /prioritize (the scores of those nodes: fitted again, and right after the
    pod's filter, which it then reuses), each with its answer serialised as the server does. No HTTP and no other process: the scheduler's own share."""
    import statistics

    from bench.kernel import _time_calls, build_cache
    from bench.seed import node_names, pending_pod
    from hami_py.scheduling.decision.filter import Filterer
    from hami_py.scheduling.verbs.prioritize import AllNodes
    from hami_py.scheduling.decision.requests import parse_pod_requests
    from hami_py.scheduling.verbs.service import filter_result

    import gc
    cache, vendors = build_cache(shape)
    gc.collect()
    gc.freeze()     # as the scheduler does once its cache is synced (hami_py/app.py)
    names = node_names(shape)
    pod = pending_pod("all-probe")
    pod["metadata"]["uid"] = "all-probe"
    request = parse_pod_requests(pod, vendors, cache.vendor_ids)
    filterer = Filterer(cache, vendors)
    all_nodes = AllNodes(cache=cache, vendors=vendors, filterer=filterer, binder=None, client=None)

    def best() -> bytes:
        decision = filterer.decide(pod, names, request, reserve=False)
        return orjson.dumps(filter_result(node_names=[decision.node]))

    def filter_all() -> bytes:
        fitting, _ = all_nodes.filter(pod, names, request)
        return orjson.dumps(filter_result(node_names=fitting))

    fitting, _ = all_nodes.filter(pod, names, request)
    args = {"Pod": pod, "NodeNames": fitting, "Nodes": None}

    def prioritize() -> bytes:
        all_nodes._last = None          # a fit of its own, as for nodes its filter did not answer
        scores, error = all_nodes.prioritize(args, synced=True)
        assert error is None, error
        return scores.to_json()

    def prioritize_after_filter() -> bytes:
        scores, error = all_nodes.prioritize(args, synced=True)    # reuses the filter's fit
        assert error is None, error
        return scores.to_json()

    out = {"nodes": shape.nodes, "pods": shape.pods, "fit_nodes": len(fitting)}
    for key, fn in (("best_filter_us", best), ("all_filter_us", filter_all), ("prioritize_us", prioritize)):
        out[key] = statistics.median(_time_calls(fn, min_calls=calls, min_seconds=0)) * 1e6
    reused = []
    for _ in range(calls):
        all_nodes.filter(pod, names, request)
        reused += _time_calls(prioritize_after_filter, min_calls=1, min_seconds=0)
    out["prioritize_after_filter_us"] = statistics.median(reused) * 1e6
    out["all_filter_kb"] = len(filter_all()) / 1000
    out["prioritize_kb"] = len(prioritize()) / 1000
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.all_mode [N ...]``: the in-process costs at each N (8 pods a node)."""
    import sys

    from bench.seed import ClusterShape
    sizes = [int(a) for a in (sys.argv[1:] if argv is None else argv)] or [1000, 5000]
    for n in sizes:
        row = inprocess_costs(ClusterShape(n, 8 * n, probe_nodes=2))
        sys.stdout.write(
            f"N={row['nodes']:>5} P={row['pods']:>6} fit={row['fit_nodes']:>5}: best /filter {row['best_filter_us']:8.0f} µs"
            f" | all /filter {row['all_filter_us']:8.0f} µs ({row['all_filter_kb']:.0f} KB)"
            f" | /prioritize {row['prioritize_us']:8.0f} µs ({row['prioritize_kb']:.0f} KB),"
            f" right after its filter {row['prioritize_after_filter_us']:8.0f} µs\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

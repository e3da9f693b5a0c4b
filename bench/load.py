"""The load generator: kube-scheduler's side of the extender protocol, timed.

kube-scheduler (with ``nodeCacheCapable: true``) sends every pod's full object and the names of
all N nodes to /filter, then /bind for the node it picks. We do the same over loopback HTTP with
keep-alive connections. Request bodies are encoded before the clock starts, so a latency is the
server's work plus the loopback round trip, not our JSON encoding.

Filter+bind throughput needs the node locks released: on a real node HAMi's device plugin does
that once it has allocated the pod. Here the cluster process does it in-process (POST /allocate)
as soon as a bind returns, without the benchmark waiting for it, as a plugin would; and the
throughput pods ask for ``spread`` so that back-to-back pods go to different nodes rather than
queue on one node's lock (with binpack, every pod would want the node the previous one is still
locking, and the figure would measure the plugin, not the scheduler). A bind that still meets a
held lock counts as a failure, not a retry.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.procs import ClusterProcess

_JSON_HEADERS = {"Content-Type": "application/json"}


def filter_body(pod_raw: bytes, node_names_raw: bytes) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with ``nodeCacheCapable: true``."""
    return b'{"Pod":' + pod_raw + b',"Nodes":null,"NodeNames":' + node_names_raw + b"}"


def bind_body(pod: dict, node: str) -> bytes:
    meta = pod["metadata"]
    return orjson.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                         "Node": node})


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize_ms(values_s: list[float]) -> dict:
    ms = [v * 1000 for v in values_s]
    return {"n": len(ms), "p50": percentile(ms, 50), "p90": percentile(ms, 90), "p99": percentile(ms, 99),
            "max": max(ms) if ms else math.nan, "mean": sum(ms) / len(ms) if ms else math.nan}


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, dict]:
    """(seconds from send to the whole answer read, decoded answer)."""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=_JSON_HEADERS) as r:
        data = await r.read()
    elapsed = time.perf_counter() - t0
    if r.status != 200:
        return elapsed, {"Error": f"HTTP {r.status}: {data[:200]!r}"}
    return elapsed, orjson.loads(data)


def filter_outcome(result: dict) -> str:
    if result.get("Error"):
        return "error"
    return "placed" if result.get("NodeNames") else "unschedulable"


@dataclass
class FilterRun:
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    wall_s: float = 0.0


async def run_filters(session: aiohttp.ClientSession, url: str, bodies: list[bytes], *, concurrency: int,
                      time_limit_s: float) -> FilterRun:
    """POST every body to /filter with ``concurrency`` requests in flight (or until the time limit)."""
    run = FilterRun()
    pending = iter(bodies)
    deadline = time.perf_counter() + time_limit_s

    async def worker() -> None:
        for body in pending:
            if time.perf_counter() > deadline:
                return
            elapsed, result = await post(session, f"{url}/filter", body)
            run.latencies.append(elapsed)
            outcome = filter_outcome(result)
            run.outcomes[outcome] += 1
            if outcome == "error":
                run.errors[str(result.get("Error"))[:120]] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - t0
    return run


@dataclass
class ScheduleRun:
    bound: int = 0
    attempted: int = 0
    outcomes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    filter_latencies: list[float] = field(default_factory=list)
    bind_latencies: list[float] = field(default_factory=list)


BINDS_IN_FLIGHT = 16    # kube-scheduler starts a binding goroutine per pod; bounded here


async def run_schedule(session: aiohttp.ClientSession, url: str, cluster: ClusterProcess, pods: list[dict],
                       node_names_raw: bytes, *, concurrency: int, time_limit_s: float,
                       async_binds: bool = False, rate: float | None = None) -> ScheduleRun:
    """Filter then bind each pod, ``concurrency`` pods in flight; the cluster frees each node lock.

    ``async_binds`` drives the extender the way kube-scheduler does: one scheduling cycle (the
    /filter) at a time, each pod's binding cycle (the /bind) started in the background while the
    next pod is filtered, up to BINDS_IN_FLIGHT at once. ``rate`` (with ``async_binds``): pods
    arrive at that many a second, the i-th filter starting no earlier than i / rate s in (a
    cluster creating pods at that rate), instead of each filter right after the last."""
    run = ScheduleRun()
    bodies = [(pod, filter_body(orjson.dumps(pod), node_names_raw)) for pod in pods]
    pending = iter(bodies)
    allocations: set[asyncio.Task] = set()
    deadline = time.perf_counter() + time_limit_s

    async def filter_one(body: bytes) -> str | None:
        run.attempted += 1
        elapsed, result = await post(session, f"{url}/filter", body)
        run.filter_latencies.append(elapsed)
        outcome = filter_outcome(result)
        if outcome != "placed":
            run.outcomes[f"filter {outcome}"] += 1
            if outcome == "error":
                run.errors[str(result.get("Error"))[:120]] += 1
            return None
        return result["NodeNames"][0]

    async def bind_one(pod: dict, node: str) -> None:
        elapsed, bound = await post(session, f"{url}/bind", bind_body(pod, node))
        run.bind_latencies.append(elapsed)
        if bound.get("Error"):
            run.outcomes["bind error"] += 1
            run.errors[str(bound["Error"])[:120]] += 1
            return
        run.bound += 1
        meta = pod["metadata"]
        task = asyncio.create_task(cluster.call("POST", "/allocate", {
            "namespace": meta["namespace"], "name": meta["name"], "node": node}))
        allocations.add(task)
        task.add_done_callback(allocations.discard)

    async def worker() -> None:
        for pod, body in pending:
            if time.perf_counter() > deadline:
                return
            if (node := await filter_one(body)) is not None:
                await bind_one(pod, node)

    async def scheduling_loop() -> None:
        slots = asyncio.Semaphore(BINDS_IN_FLIGHT)
        binds: set[asyncio.Task] = set()
        for i, (pod, body) in enumerate(pending):
            if time.perf_counter() > deadline:
                break
            if rate and (wait := t0 + i / rate - time.perf_counter()) > 0:
                await asyncio.sleep(wait)       # pacing the load, not synchronising anything
            if (node := await filter_one(body)) is None:
                continue
            await slots.acquire()
            task = asyncio.create_task(bind_one(pod, node))
            binds.add(task)
            task.add_done_callback(lambda t: (binds.discard(t), slots.release()))
        if binds:
            await asyncio.gather(*binds)

    t0 = time.perf_counter()
    if async_binds:
        await scheduling_loop()
    else:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    run.wall_s = time.perf_counter() - t0
    run.outcomes["bound"] = run.bound
    if allocations:
        await asyncio.gather(*allocations)
    return run


@dataclass
class ContentionRun:
    bound: int = 0
    binds: int = 0
    lock_failures: int = 0
    errors: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    retries: int = 0


async def run_until_bound(session: aiohttp.ClientSession, url: str, pods: list[dict], node_names_raw: bytes, *,
                          time_limit_s: float, initial_backoff_s: float = 1.0,
                          max_backoff_s: float = 10.0, refresh=None) -> ContentionRun:
    """kube-scheduler's pattern until every pod is bound: one /filter at a time, each /bind in the
    background, and a pod whose filter or bind failed back in the queue after kube-scheduler's
    pod backoff (1 s, doubling, at most 10 s: podInitialBackoffSeconds, podMaxBackoffSeconds).
    ``refresh(pod)`` gives the pod as it is now, for a retry."""
    import heapq
    run = ContentionRun()
    queue = [(0.0, i, pod, 0) for i, pod in enumerate(pods)]
    heapq.heapify(queue)
    binds: set[asyncio.Task] = set()
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s

    def retry(seq: int, pod: dict, tries: int) -> None:
        run.retries += 1
        backoff = min(max_backoff_s, initial_backoff_s * 2 ** tries)
        heapq.heappush(queue, (time.perf_counter() + backoff, seq, pod, tries + 1))

    async def bind(seq: int, pod: dict, node: str, tries: int) -> None:
        _, result = await post(session, f"{url}/bind", bind_body(pod, node))
        run.binds += 1
        if error := result.get("Error"):
            run.errors[str(error)[:120]] += 1
            run.lock_failures += "lock" in error
            retry(seq, pod, tries)
        else:
            run.bound += 1

    while run.bound < len(pods) and time.perf_counter() < deadline:
        if not queue or queue[0][0] > time.perf_counter():
            await asyncio.sleep(0.005)
            continue
        _, seq, pod, tries = heapq.heappop(queue)
        if tries and refresh is not None:   # kube-scheduler filters the pod as its informer has it now
            pod = await refresh(pod)
        _, result = await post(session, f"{url}/filter", filter_body(orjson.dumps(pod), node_names_raw))
        if filter_outcome(result) != "placed":
            run.errors[f"filter: {str(result.get('Error') or result.get('FailedNodes'))[:100]}"] += 1
            retry(seq, pod, tries)
            continue
        task = asyncio.create_task(bind(seq, pod, result["NodeNames"][0], tries))
        binds.add(task)
        task.add_done_callback(binds.discard)
    run.seconds = time.perf_counter() - t0
    if binds:
        await asyncio.gather(*binds)
    return run

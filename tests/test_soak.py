"""A bounded soak: filter and bind at a steady rate while pods come and go, then check that the
books balance and that nothing the scheduler keeps per pod outlives the pods.

Everything is on loopback and the run stops by itself. The normal suite runs it for about ten
seconds; ``HAMI_SOAK_SECONDS`` lengthens it, ``HAMI_SOAK_RATE`` sets the pods started per second
and ``HAMI_SOAK_REPORT`` names a file for the JSON summary (docs/RELIABILITY.md records a long
run's).

"Memory has not grown" is checked two ways. Exactly: once every pod is gone, the scheduler's
per-pod state (usage records, rolled-back decisions, per-pod filter locks, the device arrays) is
back to what it was before the traffic, and the number of live objects of the scheduler's own
classes is too. Roughly: the process's resident size after the run is compared with the size
after a warm-up, with a generous margin (the fake API server and the test share the process).
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import resource
import time
from collections import Counter

from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.event_correlator import LRU_SIZE
from tests.reliability_helpers import wait_books_balance

SECONDS = float(os.environ.get("HAMI_SOAK_SECONDS", "10"))
RATE = float(os.environ.get("HAMI_SOAK_RATE", "25"))
REPORT = os.environ.get("HAMI_SOAK_REPORT")
NODES = [f"soak{i}" for i in range(8)]
MAX_ATTEMPTS = 20              # a pod still refused after this many filters/binds is given up
DRAIN_TIMEOUT = max(60.0, SECONDS)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / (1 << 20)


def own_objects() -> Counter:
    """Live objects of the scheduler's own classes (the fake cluster's left out)."""
    gc.collect()
    counts: Counter = Counter()
    for obj in gc.get_objects():
        module = getattr(type(obj), "__module__", None)
        if isinstance(module, str) and module.startswith("hami_py.") and not module.startswith("hami_py.fakeapi"):
            counts[type(obj).__qualname__] += 1
    return counts


def per_pod_state(app) -> dict:
    cache, service = app.cache, app.service
    return {"pods": len(cache.pods), "node_pods": len(cache.node_pods), "released": len(cache.released),
            "live_pods": len(cache.live_pods),
            "filter_locks": len(service.pod_locks),
            "device_slots": len(cache.total_mem)}


class Stats:
    def __init__(self):
        self.counts: Counter = Counter()
        self.filter_s: list[float] = []
        self.bind_s: list[float] = []

    def summary(self) -> dict:
        def pct(values, q):
            values = sorted(values)
            return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2) if values else None
        return {**self.counts, "filter_ms_p50": pct(self.filter_s, 0.5), "filter_ms_p99": pct(self.filter_s, 0.99),
                "bind_ms_p50": pct(self.bind_s, 0.5), "bind_ms_p99": pct(self.bind_s, 0.99)}


class KubeScheduler:
    """kube-scheduler's shape, in small: one scheduling loop that filters one pod at a time,
    binds asynchronously, and puts a pod whose bind failed back in its queue after a backoff
    (kube-scheduler's starts at 1 s; shortened here). A pod that fits nowhere, or is still refused
    after MAX_ATTEMPTS tries, is given up (the soak's workload deletes it)."""

    def __init__(self, api, url: str, stats: Stats, *, lifetime: tuple[float, float] = (0.2, 1.5)):
        self.api = api
        self.client = ExtenderClient(url)
        self.stats = stats
        self.lifetime = lifetime
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks: set[asyncio.Task] = set()
        self.filtering = False
        self.loop_task = asyncio.create_task(self._loop())

    def submit(self, pod: dict, rng: random.Random) -> None:
        self.queue.put_nowait((pod, rng, 0))

    async def _loop(self) -> None:
        while True:
            pod, rng, attempt = await self.queue.get()
            self.filtering = True
            started = time.perf_counter()
            try:
                result = await self.client.filter(pod, rng.sample(NODES, k=4))
            finally:
                self.filtering = False
            self.stats.filter_s.append(time.perf_counter() - started)
            self.stats.counts["filters"] += 1
            if result["Error"]:
                self.stats.counts["filter_errors"] += 1
                self._spawn(self._retry(pod, rng, attempt))
            elif not result["NodeNames"]:
                self.stats.counts["unschedulable"] += 1
                self._spawn(self._end(pod, rng, ran=False))
            else:
                self._spawn(self._bind(pod, rng, attempt, result["NodeNames"][0]))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _bind(self, pod: dict, rng: random.Random, attempt: int, node: str) -> None:
        started = time.perf_counter()
        bound = await self.client.bind(pod, node)
        self.stats.bind_s.append(time.perf_counter() - started)
        self.stats.counts["binds"] += 1
        if bound["Error"]:
            self.stats.counts["bind_errors"] += 1       # node lock contention, mostly
            await self._retry(pod, rng, attempt)
        else:
            self.stats.counts["placed"] += 1
            await self._end(pod, rng, ran=True)

    async def _retry(self, pod: dict, rng: random.Random, attempt: int) -> None:
        if attempt + 1 >= MAX_ATTEMPTS:
            self.stats.counts["given_up"] += 1
            await self._end(pod, rng, ran=False)
            return
        await asyncio.sleep(min(1.0, 0.02 * 2 ** attempt) * rng.uniform(0.5, 1.0))   # backoff
        self.queue.put_nowait((pod, rng, attempt + 1))

    async def _end(self, pod: dict, rng: random.Random, *, ran: bool) -> None:
        """The pod runs for a while, then is deleted (sometimes after finishing)."""
        name = pod["metadata"]["name"]
        if ran:
            await asyncio.sleep(rng.uniform(*self.lifetime))
            if rng.random() < 0.3:
                self.api.patch("pods", name, {"status": {"phase": rng.choice(("Succeeded", "Failed"))}},
                               namespace="default")
                # Workload shape, not synchronisation: a finished pod lingers a moment before
                # its deletion, as it does in a cluster (the two events usually arrive apart).
                await asyncio.sleep(0.05)
        self.api.delete("pods", name, namespace="default")

    async def drain(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """Wait until every submitted pod has ended (placed and deleted, or given up); pods still
        in play after ``timeout`` seconds fail the run."""
        try:
            async with asyncio.timeout(timeout):
                while self.tasks or self.filtering or not self.queue.empty():
                    await asyncio.gather(*list(self.tasks))    # and raise what a task raised
                    await asyncio.sleep(0.01)                  # the loop takes the next queued pod
        except TimeoutError:
            raise TimeoutError(f"pods still in play after {timeout}s: {len(self.tasks)} running, "
                               f"{self.queue.qsize()} queued, filtering={self.filtering}") from None

    async def close(self) -> None:
        self.loop_task.cancel()
        await asyncio.gather(self.loop_task, return_exceptions=True)
        await self.client.close()


def expire_events(api) -> None:
    """What the API server's event TTL does (an hour there): the Events the scheduler writes
    for every filter and bind would otherwise pile up in the fake API server, in this process,
    and so would the fake's log of the requests it served."""
    for event in api.list("events"):
        api.delete("events", event["metadata"]["name"], namespace=event["metadata"]["namespace"])
    api.requests.clear()


async def traffic(api, app, stats: Stats, *, seconds: float, rate: float, first: int) -> int:
    """Create ``rate`` pods a second for ``seconds``, alternately for two kube-schedulers
    (profiles); wait for them all to end. Returns the next pod number."""
    schedulers = [KubeScheduler(api, app.url, stats), KubeScheduler(api, app.url, stats)]
    loop = asyncio.get_running_loop()
    number = first
    try:
        deadline = loop.time() + seconds
        next_start = loop.time()
        while loop.time() < deadline:
            rng = random.Random(number)
            pod = api.create("pods", gpu_pod(f"soak-{number}", gpus=rng.choice((1, 1, 2)),
                                             gpumem=rng.choice((4000, 10000, 30000)),
                                             gpucores=rng.choice((5, 10, 30))))
            stats.counts["pods"] += 1
            schedulers[number % 2].submit(pod, rng)
            number += 1
            if number % 500 == 0:
                expire_events(api)
            next_start += 1 / rate
            await asyncio.sleep(max(0.0, next_start - loop.time()))     # pacing, not synchronisation
        for scheduler in schedulers:
            await scheduler.drain()
    finally:
        for scheduler in schedulers:
            await scheduler.close()
    return number


async def quiesce(api, app, baseline_state: dict) -> None:
    """Every pod gone: the books balance (all zero), per-pod state is back to the baseline and
    the queued Events are written."""
    await wait_books_balance(api, app, timeout=30)
    await wait_for(lambda: per_pod_state(app) == baseline_state, timeout=30,
                   what=f"per-pod state back to {baseline_state}")
    await asyncio.wait_for(app.events.queue.join(), 30)
    expire_events(api)


async def test_soak_filter_and_bind_with_pods_coming_and_going():
    api = FakeApiServer(history_limit=300)    # bounded and full after the warm-up: the fake stops growing
    await api.start()
    try:
        async with running_scheduler(api, options=embedded_options()) as app:
            for name in NODES:
                api.create("nodes", gpu_node(name, gpus=4))
            await wait_for(lambda: all(n in app.cache.nodes for n in NODES), what="nodes")
            baseline_state = per_pod_state(app)
            stats = Stats()
            warmup = max(1.0, SECONDS * 0.2)
            number = await traffic(api, app, stats, seconds=warmup, rate=RATE, first=0)
            await quiesce(api, app, baseline_state)
            # Measured after a warm-up that ended in the same quiet state: caches, pools and the
            # event writers' last jobs exist in both snapshots; what grows with pods does not.
            baseline_objects = own_objects()
            rss_after_warmup = rss_mib()
            started = time.monotonic()
            await traffic(api, app, stats, seconds=SECONDS - warmup, rate=RATE, first=number)
            elapsed = time.monotonic() - started
            await quiesce(api, app, baseline_state)
            objects = own_objects()
            rss_end = rss_mib()
    finally:
        await api.stop()

    # The event correlator remembers recent events per pod in LRU caches of LRU_SIZE entries each
    # (as client-go's correlator does): they grow with pods up to that bound, checked below.
    bounded = {"SeenEvent", "_SpamBucket", "PodRef"}
    grown = {k: objects[k] - baseline_objects[k] for k in objects
             if objects[k] > baseline_objects[k] and k not in bounded}
    summary = {"seconds": SECONDS, "rate_per_s": RATE, **stats.summary(),
               "measured_s": round(elapsed, 1), "rss_mib_after_warmup": round(rss_after_warmup, 1),
               "rss_mib_end": round(rss_end, 1), "own_objects_grown": grown}
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(summary, f, indent=2)
    # Every pod ended exactly once, and most were placed (the cluster has room for the load;
    # refusals come from bind races and brief crowding). Proportions, not rates: a slow machine
    # creates fewer pods, but places as large a share of them.
    counts = stats.counts
    assert counts["placed"] + counts["unschedulable"] + counts["given_up"] == counts["pods"], summary
    assert counts["placed"] >= 0.5 * counts["pods"] > 0, summary
    assert not grown, summary
    correlator = app.events.correlator
    assert all(len(cache) <= LRU_SIZE for cache in (correlator._seen, correlator._similar, correlator._spam)), summary
    assert rss_end - rss_after_warmup < 64, summary

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
from tests.reliability_helpers import wait_books_balance

SECONDS = float(os.environ.get("HAMI_SOAK_SECONDS", "10"))
RATE = float(os.environ.get("HAMI_SOAK_RATE", "25"))
REPORT = os.environ.get("HAMI_SOAK_REPORT")
NODES = [f"soak{i}" for i in range(8)]


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
            "filter_locks": len(service._pod_locks), "device_slots": len(cache.total_mem)}


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


async def pod_life(api, profile: ExtenderClient, stats: Stats, rng: random.Random, name: str) -> None:
    """One pod: created, scheduled as kube-scheduler would (retrying errors), run for a while,
    then deleted, or finished and then deleted."""
    pod = api.create("pods", gpu_pod(name, gpus=rng.choice((1, 1, 2)), gpumem=rng.choice((4000, 10000, 30000)),
                                     gpucores=rng.choice((5, 10, 30))))
    stats.counts["pods"] += 1
    for attempt in range(30):
        started = time.perf_counter()
        result = await profile.filter(pod, rng.sample(NODES, k=4))
        stats.filter_s.append(time.perf_counter() - started)
        stats.counts["filters"] += 1
        if result["Error"]:
            stats.counts["filter_errors"] += 1
        elif not result["NodeNames"]:
            stats.counts["unschedulable"] += 1
            break
        else:
            started = time.perf_counter()
            bound = await profile.bind(pod, result["NodeNames"][0])
            stats.bind_s.append(time.perf_counter() - started)
            stats.counts["binds"] += 1
            if not bound["Error"]:
                stats.counts["placed"] += 1
                break
            stats.counts["bind_errors"] += 1     # node lock contention, mostly: retry
        await asyncio.sleep(rng.uniform(0.01, 0.02) * (attempt + 1))   # kube-scheduler's backoff, shortened
    await asyncio.sleep(rng.uniform(0.2, 1.5))
    if rng.random() < 0.3:
        api.patch("pods", name, {"status": {"phase": rng.choice(("Succeeded", "Failed"))}}, namespace="default")
        await asyncio.sleep(0.05)
    api.delete("pods", name, namespace="default")


async def traffic(api, app, stats: Stats, *, seconds: float, rate: float, first: int) -> int:
    """Start ``rate`` pod lives a second for ``seconds``, from two kube-scheduler profiles;
    wait for them all to end. Returns the next pod number."""
    profiles = [ExtenderClient(app.url), ExtenderClient(app.url)]
    loop = asyncio.get_running_loop()
    lives = set()
    number = first
    try:
        deadline = loop.time() + seconds
        next_start = loop.time()
        while loop.time() < deadline:
            rng = random.Random(number)
            task = asyncio.create_task(pod_life(api, profiles[number % 2], stats, rng, f"soak-{number}"))
            lives.add(task)
            task.add_done_callback(lives.discard)
            number += 1
            next_start += 1 / rate
            await asyncio.sleep(max(0.0, next_start - loop.time()))     # pacing, not synchronisation
        if lives:
            await asyncio.gather(*lives)
    finally:
        for profile in profiles:
            await profile.close()
    return number


async def quiesce(api, app, baseline_state: dict) -> None:
    """Every pod gone: the books balance (all zero), per-pod state is back to the baseline and
    the queued Events are written."""
    await wait_books_balance(api, app, timeout=30)
    await wait_for(lambda: per_pod_state(app) == baseline_state, timeout=30,
                   what=f"per-pod state back to {baseline_state}")
    await asyncio.wait_for(app.events.queue.join(), 30)


async def test_soak_filter_and_bind_with_pods_coming_and_going():
    api = FakeApiServer(history_limit=2000)     # bounded, so the fake's own history stops growing
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

    grown = {k: objects[k] - baseline_objects[k] for k in objects if objects[k] > baseline_objects[k]}
    summary = {"seconds": SECONDS, "rate_per_s": RATE, **stats.summary(),
               "measured_s": round(elapsed, 1), "rss_mib_after_warmup": round(rss_after_warmup, 1),
               "rss_mib_end": round(rss_end, 1), "own_objects_grown": grown}
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(summary, f, indent=2)
    assert stats.counts["placed"] >= SECONDS * RATE * 0.5, summary
    assert not grown, summary
    assert rss_end - rss_after_warmup < 64, summary

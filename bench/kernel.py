"""The fit kernel alone: the Cython build against the plain-Python reference, same inputs.

The inputs are not synthetic arrays: a real UsageCache is filled with the benchmark cluster's
nodes and placed pods, and ``Filterer.decide`` is run once with a recording kernel, so both
implementations are then timed on exactly the arrays a /filter for that cluster hands the kernel.
Their outputs are compared too: a fast kernel that decides differently is not a result.

``decide()`` (the whole in-process decision around the kernel: candidate lookup, device mask,
output decoding, failure reasons) is timed with the Cython kernel as well, so the table shows
how much of a filter the kernel itself is.
"""
from __future__ import annotations

import statistics
import time

import orjson

from bench.seed import FAMILY_VENDOR, ClusterShape, build_nodes, build_placed_pods, family_vendors, node_names, pending_pod
from hami_py import _kernel
from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.scheduling.kernel import reference as kernel_ref
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.kernel.fit_query import FitQuery
from hami_py.scheduling.decision.requests import parse_pod_requests


def build_cache(shape: ClusterShape) -> tuple[UsageCache, dict]:
    vendors = family_vendors() if shape.layout != "nvidia" else build_vendors(DeviceConfig.default())
    cache = UsageCache(vendors)
    cache.replace_nodes(build_nodes(shape))
    pods = []
    for i, pod in enumerate(build_placed_pods(shape)):
        pod["metadata"]["uid"] = f"seeded-{i}"
        pod["metadata"]["resourceVersion"] = str(i + 1)
        pods.append(pod)
    cache.replace_pods(pods, None)
    return cache, vendors


def _time_calls(fn, *, min_calls: int, min_seconds: float) -> list[float]:
    """Seconds per call, one sample per call, at least ``min_calls`` and ``min_seconds``."""
    times = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _run_fresh(impl, table, query: FitQuery) -> tuple[int, dict[str, list]]:
    """``impl`` on the captured inputs with zeroed outputs of its own: (winner, every output)."""
    fresh = query.clone()
    best = impl(table, fresh)
    return best, fresh.outputs()


def kernel_bench(shape: ClusterShape, *, min_seconds: float = 1.0, python_calls: int = 3) -> dict:
    cache, vendors = build_cache(shape)
    pod = pending_pod("kernel-probe")
    pod["metadata"]["uid"] = "kernel-probe"
    request = parse_pod_requests(pod, vendors, cache.vendor_ids)
    names = node_names(shape)
    captured: dict = {}

    def recording_kernel(table, query):
        captured["query"] = query
        return _kernel.filter_nodes(table, query)

    Filterer(cache, vendors, kernel=recording_kernel).decide(pod, names, request, reserve=False)
    query = captured["query"]

    # Each implementation writes into buffers of its own, and all of them are compared.
    agree = _run_fresh(_kernel.filter_nodes, cache, query) == _run_fresh(kernel_ref.filter_nodes, cache, query)

    cython_s = _time_calls(lambda: _kernel.filter_nodes(cache, query), min_calls=20, min_seconds=min_seconds)
    python_s = _time_calls(lambda: kernel_ref.filter_nodes(cache, query), min_calls=python_calls, min_seconds=0)
    decider = Filterer(cache, vendors)
    decide_s = _time_calls(lambda: decider.decide(pod, names, request, reserve=False), min_calls=20,
                           min_seconds=min_seconds)
    cython_us = statistics.median(cython_s) * 1e6
    python_us = statistics.median(python_s) * 1e6
    return {"nodes": shape.nodes, "pods": shape.pods, "devices": len(cache.device_ids),
            "cython_us": cython_us, "python_us": python_us, "speedup": python_us / cython_us,
            "decide_us": statistics.median(decide_s) * 1e6, "agree": agree,
            "calls": {"cython": len(cython_s), "python": len(python_s), "decide": len(decide_s)}}


def decide_by_family(shape: ClusterShape, families: tuple[str | None, ...], *, calls: int = 200) -> dict[str, float]:
    """µs per in-process ``Filterer.decide`` (median of ``calls``, nothing reserved) on the
    cluster ``shape`` seeds, for a pending pod of each family: the scheduler's own share of a
    /filter, without HTTP, the pod patch or the other processes on the cores."""
    cache, vendors = build_cache(shape)
    names = node_names(shape)
    decider = Filterer(cache, vendors)
    out = {}
    for family in families:
        pod = pending_pod("decide-probe", family=family)
        pod["metadata"]["uid"] = "decide-probe"
        request = parse_pod_requests(pod, vendors, cache.vendor_ids)
        times = _time_calls(lambda: decider.decide(pod, names, request, reserve=False), min_calls=calls, min_seconds=0)
        out[FAMILY_VENDOR.get(family, "NVIDIA")] = statistics.median(times) * 1e6
    return out


def decide_alone(shape: ClusterShape, *, calls: int = 200) -> float:
    """µs per in-process ``Filterer.decide`` (median of ``calls``, nothing reserved) for the
    /filter phase's pod on the cluster ``shape`` seeds, each call given a freshly decoded name list
    as a request brings one (the decode itself is the HTTP floor's, bench/floor.py)."""
    cache, vendors = build_cache(shape)
    names_raw = orjson.dumps(node_names(shape))
    decider = Filterer(cache, vendors)
    pod = pending_pod("decide-probe")
    pod["metadata"]["uid"] = "decide-probe"
    request = parse_pod_requests(pod, vendors, cache.vendor_ids)
    times = []
    for _ in range(calls):
        names = orjson.loads(names_raw)
        t0 = time.perf_counter()
        decider.decide(pod, names, request, reserve=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6

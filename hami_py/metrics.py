"""Prometheus metrics of the scheduler itself: request latency, errors, watch and event counts.

The per-device and per-pod allocation gauges are rendered from the usage cache at scrape time by
``hami_py.allocation_metrics`` and appended to this registry's output on /metrics.
"""
from __future__ import annotations

import platform
import sys

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from hami_py import __version__

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# upstream's label names (dashboards select on them); go_version carries the Python runtime here
BUILD_INFO = {
    "version": __version__, "revision": "unknown", "build_date": "unknown",
    "go_version": f"python{platform.python_version()}",
    "compiler": platform.python_implementation().lower(),
    "platform": f"{sys.platform}/{_ARCH.get(platform.machine(), platform.machine())}",
}


class Metrics:
    """One registry per server, so tests and embedded instances never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "hami_extender_request_duration_seconds", "Time to answer an extender request, by verb.",
            ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.api_request_seconds = Histogram(
            "hami_kube_api_request_duration_seconds",
            "Time of the scheduler's calls to the Kubernetes API server (watches excluded), by method "
            "and resource, failed calls included: how much of /filter and /bind is waiting on it.",
            ["method", "resource"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.request_errors = Counter(
            "hami_extender_request_errors_total", "Extender answers that carried an Error, by verb.",
            ["verb"], registry=self.registry)
        self.watch_events = Counter(
            "hami_watch_events_total", "Watch events applied to the usage cache, by resource.",
            ["resource"], registry=self.registry)
        self.events_written = Counter(
            "hami_events_written_total", "Kubernetes Events written to the API server.",
            registry=self.registry)
        self.events_dropped = Counter(
            "hami_events_dropped_total",
            "Kubernetes Events not written, by cause (queue_full, spam: over the pod's spam filter, api_error, "
            "internal_error, pod_deleted: a parked FilteringSucceed of a pod deleted before its bind).",
            ["cause"], registry=self.registry)
        self.events_merged = Counter(
            "hami_events_merged_total",
            "Kubernetes Events merged into another, by how: repeat (the count of an Event already written "
            "raised by a PATCH), pending (folded into a write still waiting for the events' budget: no "
            "request), similar (message combined with the pod's other messages of that reason), filter_into_bind "
            "(a FilteringSucceed not written because the pod's bind succeeded: its BindingSucceed says it).",
            ["how"], registry=self.registry)
        self.requeue_nudges = Counter(
            "hami_requeue_nudges_total",
            "Node annotations (hami.io/requeue-time) written so that kube-scheduler retries pods refused "
            "just before the books freed devices on that node (hami_py/k8s/requeue.py).",
            registry=self.registry)
        self.preemptions = Counter(
            "hami_device_preemptions_total",
            "Device preemptions (--device-preemption), by outcome: preempting (victims evicted, room held), "
            "gave_up (every eviction tried was refused).",
            ["outcome"], registry=self.registry)
        self.preemption_evictions = Counter(
            "hami_device_preemption_evictions_total",
            "Evictions asked for by device preemption, by result: evicted, refused.",
            ["result"], registry=self.registry)
        self.defrag_holds = Counter(
            "hami_defrag_holds",
            "Holds of freed devices for the pods the defragmenter made room for (the hami.io/defrag-hold "
            "annotation), by outcome: held (taken), placed (the pod decided on its held node), expired, "
            "dropped (malformed, not fitting, node not offered, pod bound or deleted, annotation removed).",
            ["outcome"], registry=self.registry)
        self.gangs = Counter(
            "hami_gangs",
            "Gang plans (hami_py/scheduling/gangs/), by outcome: planned (every member reserved at once), "
            "placed (every planned member bound), timed_out (a planned member not bound within the gang's "
            "timeout: the plan given back), given_back (a planned member gone, refused its node or lost its "
            "reservation; leadership lost).",
            ["outcome"], registry=self.registry)
        self.gangs_waiting = Gauge(
            "hami_gangs_waiting", "Gangs whose members were last refused because too few members exist or fit.",
            registry=self.registry)
        # HAMi's allocation outcomes (its #3088), with its names and labels: phase (filter, bind),
        # device_type (the family's vendor key), failure_reason (one of OUTCOME_REASONS).
        outcome_labels = ["phase", "device_type", "failure_reason"]
        self.allocations = Counter(
            "hami_scheduler_allocations_total",
            "Device reservations made by /filter, by family (failure_reason is always none).",
            outcome_labels, registry=self.registry)
        self.allocation_failures = Counter(
            "hami_scheduler_allocation_failures_total",
            "Allocations that failed, by phase (filter: no node fits, or the request could not be judged; "
            "bind: the pod, the node lock or the Binding), family and reason.",
            outcome_labels, registry=self.registry)
        self.bind_rollbacks = Counter(
            "hami_scheduler_bind_rollbacks_total",
            "Failed binds that released the pod's reservation (the devices are free again), by family and reason.",
            outcome_labels, registry=self.registry)
        # HAMi's #2758: whether this replica leads (and so serves /filter), whether its caches are
        # in. Read at scrape time from the functions the app gives (0 until it does).
        self.is_leader = Gauge(
            "hami_scheduler_is_leader", "1 while this scheduler replica is the leader (serves /filter and "
            "/bind; always 1 without --leader-elect), else 0.", registry=self.registry)
        self.cache_synced = Gauge(
            "hami_scheduler_cache_synced", "1 once the first lists of nodes, pods and resource quotas (and "
            "PodGroups, when watched) are in the scheduler's books (watched since), else 0.", registry=self.registry)
        self.build_info = Gauge(
            "hami_build_info", "Build of this scheduler, as labels; the value is always 1.",
            list(BUILD_INFO), registry=self.registry)
        self.build_info.labels(**BUILD_INFO).set(1)


# HAMi's fixed set of failure reasons (#3088); "none" labels the successes.
OUTCOME_REASONS = ("none", "no_fit", "lookup", "identity", "lock", "annotation_patch", "bind", "internal")


def count_outcome(metrics: "Metrics | None", phase: str, device_types, reason: str, *, rolled_back: bool = False) -> None:
    """One allocation outcome for each family it concerned."""
    if metrics is None:
        return
    counter = metrics.allocations if reason == "none" else metrics.allocation_failures
    for device_type in device_types or ("unknown",):
        counter.labels(phase, device_type, reason).inc()
        if rolled_back:
            metrics.bind_rollbacks.labels(phase, device_type, reason).inc()


class StuckLockCollector:
    """``hami_node_lock_stuck{node,holder}``: how long each stuck node lock has been held
    (hami_py/cache/stuck_locks.py), read from the books at scrape time; absent when none is."""

    def __init__(self, stuck: Callable[[], Iterable]):
        self.stuck = stuck

    def collect(self):
        family = GaugeMetricFamily(
            "hami_node_lock_stuck", "Seconds a node lock has been held by a pod whose allocation makes no "
            "progress (bind-phase still allocating): binds onto the node fail at once, filters pass it over.",
            labels=["node", "holder"])
        for lock in self.stuck():
            family.add_metric([lock.node, lock.holder], lock.held_s)
        yield family

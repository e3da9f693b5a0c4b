"""Prometheus metrics of the scheduler itself (device allocation metrics join them later)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """One registry per server, so tests and embedded instances never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "hami_extender_request_duration_seconds", "Time to answer an extender request, by verb.",
            ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.request_errors = Counter(
            "hami_extender_request_errors_total", "Extender answers that carried an Error, by verb.",
            ["verb"], registry=self.registry)
        self.watch_events = Counter(
            "hami_watch_events_total", "Watch events applied to the usage cache, by resource.",
            ["resource"], registry=self.registry)

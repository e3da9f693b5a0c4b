"""The API request budget: how many pods a second ``--kube-qps`` lets the scheduler place.

Every pod the scheduler places costs requests on the shared ``--kube-qps``/``--kube-burst``
token bucket (``hami_py.k8s.client.TokenBucket``), all on the critical path, one after the other:

* /filter: the pod patch carrying the decision;
* /bind:   the GET of the pod, the node lock's compare-and-set (plus a node GET when the watched
           resourceVersion is stale or the node is locked), and the Binding.

``make bench`` counts them at the in-repo API server (docs/BENCHMARKS.md, "API requests per
scheduled pod"): 4.0 at 1 000 nodes, a few hundredths more when a lock meets a stale node.
Events are not in this figure: they have a budget of their own (``hami_py.k8s.events``).
The registration upkeep (one node patch per device plugin heartbeat, nodes / 30 a second) shares
the bucket, which is why the shipped settings leave room above pods/s × 4.

So the scheduler can place at most ``qps / CRITICAL_REQUESTS_PER_POD`` pods a second, however fast
it decides. Upstream's client defaults (``--kube-qps 5 --kube-burst 10``) stay the flags'
defaults, for compatibility, and cap it at 1.25 pods/s: the scheduler says so when it starts.
"""
from __future__ import annotations

import structlog

log = structlog.get_logger(__name__)

CRITICAL_REQUESTS_PER_POD = 4        # pod patch, pod GET, lock CAS, Binding (measured by make bench)
WARN_BELOW_PODS_PER_S = 10.0


def pods_per_second_cap(qps: float) -> float | None:
    """Pods a second the budget allows in the long run; None when unlimited (``--kube-qps 0``)."""
    if qps <= 0:
        return None
    return qps / CRITICAL_REQUESTS_PER_POD


def warn_if_capped(qps: float, burst: int) -> float | None:
    """Log a warning when ``--kube-qps`` caps scheduling below WARN_BELOW_PODS_PER_S; the cap."""
    cap = pods_per_second_cap(qps)
    if cap is not None and cap < WARN_BELOW_PODS_PER_S:
        log.warning("the API budget caps scheduling", pods_per_s=round(cap, 2), kube_qps=qps, kube_burst=burst,
                    requests_per_pod=CRITICAL_REQUESTS_PER_POD,
                    hint=f"--kube-qps {WARN_BELOW_PODS_PER_S * CRITICAL_REQUESTS_PER_POD:g} or more "
                         f"for {WARN_BELOW_PODS_PER_S:g} pods/s (pods/s x {CRITICAL_REQUESTS_PER_POD} requests per pod)")
    return cap

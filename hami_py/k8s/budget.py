"""The API request budget: how many pods a second ``--kube-qps`` lets the scheduler place.

Every pod the scheduler places costs requests on the shared ``--kube-qps``/``--kube-burst``
token bucket (``hami_py.k8s.client.TokenBucket``):

* /filter: none (the decision is kept with the reservation);
* /bind:   on the critical path, one after the other, the node lock's compare-and-set (plus a
           node GET when the watched resourceVersion is stale or the node is locked) and the
           Binding, which carries the decision and the ``hami.io/vgpu-node`` label; an API server
           older than Kubernetes 1.35 drops a Binding's labels, and the label is then patched
           after the bind's answer.

``make bench`` counts them at the in-repo API server (docs/BENCHMARKS.md, "API requests per
scheduled pod"): 2.0 on the critical path at 1 000 nodes (a few hundredths more when a lock meets
a stale node or a held lock), and nothing after it (1.0 more where the label is patched). Events are not in this figure: they have
a budget of their own (``hami_py.k8s.events``), and so does the work off the critical path
(``KubeClient.with_budget``: the registration upkeep's node patch per device plugin heartbeat,
nodes / 30 a second, the label follow-up and requeue nudges), at the same rate: the shipped
settings leave room above pods/s × 3 for the API server's sake, not the bucket's.

So the scheduler can place at most ``qps / REQUESTS_PER_POD`` pods a second in the long run,
however fast it decides. Upstream's client defaults (``--kube-qps 5 --kube-burst 10``) cap it at
1.67 pods/s, and HAMi's chart passes neither flag: a user who swaps the image would get that. So
when neither flag is given the budget is DEFAULT_QPS/DEFAULT_BURST (the manifests' values: 100
pods/s with room for 6 000 nodes' handshake stamps); flags given explicitly always win (one given
alone takes the other from them: the burst twice the rate, the rate the default). The API server
stays protected by API Priority and Fairness, which bounds every client's share whatever its own
limit (kube-scheduler itself defaults to 50/100 and is the only other writer of bindings). The
start-up log names the budget in force and where it came from; a budget capping scheduling below
WARN_BELOW_PODS_PER_S is a warning.
"""
from __future__ import annotations

import structlog

log = structlog.get_logger(__name__)

CRITICAL_REQUESTS_PER_POD = 2        # lock CAS, Binding (measured by make bench)
# And the vgpu-node label after the bind's answer, where the API server drops a Binding's labels:
# the start-up warning assumes that worst case (it cannot know the servers behind a load balancer).
REQUESTS_PER_POD = CRITICAL_REQUESTS_PER_POD + 1
WARN_BELOW_PODS_PER_S = 10.0
DEFAULT_QPS = 600.0      # neither --kube-qps nor --kube-burst given (HAMi's chart): 100 pods/s and the
DEFAULT_BURST = 1200     # handshake stamps of 6 000 nodes; the burst covers two seconds of it


def resolve_budget(qps: float | None, burst: int | None) -> tuple[float, int, str]:
    """(qps, burst, where they came from): "default" when neither flag was given, else "flags"
    (a flag given alone takes the other from it: the burst twice the rate, at least 1; the rate
    the default)."""
    if qps is None and burst is None:
        return DEFAULT_QPS, DEFAULT_BURST, "default"
    if qps is None:
        qps = DEFAULT_QPS
    if burst is None:
        burst = max(int(2 * qps), 1) if qps > 0 else DEFAULT_BURST
    return float(qps), int(burst), "flags"


def log_budget(qps: float, burst: int, source: str) -> None:
    """The start-up line naming the API budget in force (and the warning when it caps)."""
    cap = pods_per_second_cap(qps)
    log.info("API budget", kube_qps=qps, kube_burst=burst, source=source,
             pods_per_s=None if cap is None else round(cap, 2), requests_per_pod=REQUESTS_PER_POD)
    warn_if_capped(qps, burst)


def pods_per_second_cap(qps: float) -> float | None:
    """Pods a second the budget allows in the long run; None when unlimited (``--kube-qps 0``)."""
    if qps <= 0:
        return None
    return qps / REQUESTS_PER_POD


def warn_if_capped(qps: float, burst: int) -> float | None:
    """Log a warning when ``--kube-qps`` caps scheduling below WARN_BELOW_PODS_PER_S; the cap."""
    cap = pods_per_second_cap(qps)
    if cap is not None and cap < WARN_BELOW_PODS_PER_S:
        log.warning("the API budget caps scheduling", pods_per_s=round(cap, 2), kube_qps=qps, kube_burst=burst,
                    requests_per_pod=REQUESTS_PER_POD,
                    hint=f"--kube-qps {WARN_BELOW_PODS_PER_S * REQUESTS_PER_POD:g} or more "
                         f"for {WARN_BELOW_PODS_PER_S:g} pods/s (pods/s x {REQUESTS_PER_POD} requests per pod)")
    return cap

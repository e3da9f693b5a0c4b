"""The cost of planning a gang: one /filter that reserves every member at once (issue 34).

In process, like the kernel scenario: a real UsageCache filled with the benchmark cluster's nodes
and placed pods, a gang's members fed to the planner's book as the pod watch would, and
``Gangs.resume`` for the first member timed: it decides and reserves every member (one
``Filterer.decide`` over all nodes each) in one synchronous stretch, which holds every other
/filter back meanwhile. After each round the plan is given back, so each round plans on the same
books.
"""
from __future__ import annotations

import statistics
import time

from bench.kernel import build_cache
from bench.seed import ClusterShape, node_names, pending_pod
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.decision.requests import parse_pod_requests
from hami_py.scheduling.gangs.membership import PODGROUP, PODGROUP_LABEL, GangKey, GangSpec
from hami_py.scheduling.gangs.planner import Gangs


class _NoTimer:
    def cancel(self) -> None:
        pass


def gang_bench(shape: ClusterShape, *, members: int, rounds: int) -> dict:
    cache, vendors = build_cache(shape)
    gangs = Gangs(cache=cache, filterer=Filterer(cache, vendors), vendors=vendors,
                  call_later=lambda *_: _NoTimer())
    gangs.book.podgroups_on = True
    pods = []
    for i in range(members):
        pod = pending_pod(f"gang-{i}", gpus=1, gpumem=16384, gpucores=25)
        pod["metadata"].update(uid=f"gang-{i}", resourceVersion=str(i + 1), labels={PODGROUP_LABEL: "bench"})
        gangs.observe("ADDED", pod)
        pods.append(pod)
    namespace = pods[0]["metadata"]["namespace"]
    gangs.book.specs[GangKey(PODGROUP, namespace, "bench")] = GangSpec(members, 60.0)
    first, names = pods[0], node_names(shape)
    request = parse_pod_requests(first, vendors, cache.vendor_ids)
    times, placed = [], 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        answer = gangs.resume(first, names, request)
        times.append(time.perf_counter() - t0)
        placed = sum(1 for p in pods if p["metadata"]["uid"] in cache.pods)
        if answer is None or isinstance(answer, dict) or placed != members:
            raise RuntimeError(f"the gang of {members} was not planned whole ({placed} reserved): {answer!r}"[:300])
        gangs.release_all(why="the next round")
    plan_ms = statistics.median(times) * 1e3
    return {"nodes": shape.nodes, "pods": shape.pods, "members": members, "rounds": rounds,
            "plan_ms": plan_ms, "per_member_us": plan_ms * 1e3 / members, "max_ms": max(times) * 1e3}

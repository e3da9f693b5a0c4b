"""The victim search (scheduling/eviction/victims.py) against a plain-Python reference, by hypothesis.

Random nodes (GPUs of one size, split counts), random running pods (GPU memory shares, priorities)
and a random preemptor that fits nowhere as things are. The reference fit is the rule in its
simplest words: a pod asking for ``nums`` GPUs of ``m`` MiB fits a node when at least ``nums`` of its
GPUs each have ``m`` MiB free and a free slot. Then:

* the chosen victims, once gone, let the pod fit (reference), all are on the chosen node, and
  none has a priority at or above the preemptor's;
* no smaller set does, on any node (so no victim could be spared), and no set of the same size
  is preferred (lower highest priority, then sum, then running time lost);
* no choice means no set of lower-priority pods on any node makes room;
* the books are exactly as before the search.
"""
from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

from hami_py.cache.pod_states import PodState
from hami_py.cache.records import PodUsage, UsageEntry
from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.eviction.victims import VictimSearch, set_key
from hami_py.scheduling.decision.requests import parse_pod_requests

VENDORS = build_vendors(DeviceConfig.default())
MODEL = {"type": "NVIDIA T4", "devmem": 10000, "devcore": 100}
NOW = 1_000_000.0

nodes_st = st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3)), min_size=1, max_size=3)  # (gpus, split)
pods_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(1, 7), st.integers(0, 5),
                             st.integers(0, 1000)), min_size=2, max_size=12)   # node, gpu, mem (thousands), priority, age
preemptor_st = st.tuples(st.integers(1, 2), st.integers(3, 10), st.integers(1, 6))    # nums, mem (thousands), priority


def books(cache: UsageCache) -> tuple:
    return (list(cache.used), list(cache.used_mem), list(cache.used_cores), list(cache.mig_used),
            {ns: dict(v) for ns, v in cache.quota.used.items()}, {u: (p.node, p.entries) for u, p in cache.pods.items()},
            {n: set(m) for n, m in cache.node_pods.items()})


def ref_fits(gpus: list[list[int]], nums: int, mem: int) -> bool:
    """``gpus``: per GPU [free memory, free slots]."""
    return sum(1 for free_mem, free_slots in gpus if free_mem >= mem and free_slots >= 1) >= nums


def ref_node(node: dict, running: list[dict], gone: set[str]) -> list[list[int]]:
    gpus = [[MODEL["devmem"], node["split"]] for _ in range(node["gpus"])]
    for p in running:
        if p["node"] == node["name"] and p["uid"] not in gone:
            gpus[p["gpu"]][0] -= p["mem"]
            gpus[p["gpu"]][1] -= 1
    return gpus


SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(nodes_spec=nodes_st, pods_spec=pods_st, preemptor=preemptor_st)
def test_chosen_victims_are_enough_minimal_lower_and_preferred(nodes_spec, pods_spec, preemptor):
    check(nodes_spec, pods_spec, preemptor, bounded=False)


@SETTINGS
@given(nodes_spec=nodes_st, pods_spec=pods_st, preemptor=preemptor_st)
def test_a_bounded_search_still_chooses_enough_lower_and_minimal_victims(nodes_spec, pods_spec, preemptor):
    """Three fits per choice: the bound is hit and the reprieve pass answers. Its set is not
    always the smallest, but it is enough, lower, on one node, and no victim of it can be spared."""
    check(nodes_spec, pods_spec, preemptor, bounded=True)


def check(nodes_spec, pods_spec, preemptor, *, bounded: bool) -> None:
    cache = UsageCache(VENDORS)
    nodes = []
    for i, (gpus, split) in enumerate(nodes_spec):
        name = f"n{i}"
        cache.upsert_node(gpu_node(name, devices=registration(name, gpus=gpus, model=MODEL, split=split)))
        nodes.append({"name": name, "gpus": gpus, "split": split,
                      "uuids": [d["id"] for d in registration(name, gpus=gpus, model=MODEL, split=split)]})
    running: list[dict] = []
    for k, (ni, gi, mem_k, priority, age) in enumerate(pods_spec):
        if ni >= len(nodes) or gi >= nodes[ni]["gpus"]:
            continue
        node = nodes[ni]
        free = ref_node(node, running, set())[gi]
        if free[0] < mem_k * 1000 or free[1] < 1:
            continue
        p = {"uid": f"u{k}", "node": node["name"], "gpu": gi, "mem": mem_k * 1000, "priority": priority,
             "started": NOW - age}
        running.append(p)
        cache.add_pod_usage(PodUsage(uid=p["uid"], namespace="default", name=f"p{k}", node=node["name"],
                                     entries=[UsageEntry("NVIDIA", node["uuids"][gi], p["mem"], 0, 1)],
                                     resource_version=k + 1, state=PodState.BOUND, priority=priority, started=p["started"]))
    nums, mem_k, prio = preemptor
    mem = mem_k * 1000
    assume(not any(ref_fits(ref_node(n, running, set()), nums, mem) for n in nodes))
    pod = gpu_pod("preemptor", gpus=nums, gpumem=mem)
    pod["metadata"]["uid"] = "preemptor-uid"
    pod["spec"]["priority"] = prio
    request = parse_pod_requests(pod, VENDORS, cache.vendor_ids)
    before = books(cache)

    search = VictimSearch(cache, Filterer(cache, VENDORS), clock=lambda: NOW, max_trials=3 if bounded else 256)
    choice = search.choose(pod, request, [n["name"] for n in nodes])

    assert books(cache) == before, "the search left the books changed"

    by_uid = {p["uid"]: p for p in running}

    def works(node: dict, uids) -> bool:
        return ref_fits(ref_node(node, running, set(uids)), nums, mem)

    lower = {n["name"]: [p for p in running if p["node"] == n["name"] and p["priority"] < prio] for n in nodes}
    event("no choice" if choice is None else f"{len(choice.uids)} victims")
    if choice is None:
        assert bounded or not any(works(n, [p["uid"] for p in lower[n["name"]]]) for n in nodes), \
            "a set of lower-priority pods makes room, and none was chosen"
        return
    node = next(n for n in nodes if n["name"] == choice.node)
    victims = [by_uid[u] for u in choice.uids]
    assert victims, "a preemptor that fits nowhere needs victims"
    assert all(v["node"] == choice.node for v in victims)
    assert all(v["priority"] < prio for v in victims), "a victim of equal or higher priority"
    assert works(node, choice.uids), "the victims do not free enough"
    for smaller in combinations(choice.uids, len(victims) - 1):
        assert not works(node, smaller), f"{set(choice.uids) - set(smaller)} could be spared"
    if bounded:
        return
    chosen_key = set_key([cache.pods[u] for u in choice.uids], NOW)
    for n in nodes:
        pool = lower[n["name"]]
        for size in range(1, len(victims) + 1):
            for combo in combinations(pool, size):
                if works(n, [p["uid"] for p in combo]):
                    key = set_key([cache.pods[p["uid"]] for p in combo], NOW)
                    assert (key, n["name"]) >= (chosen_key, choice.node), \
                        f"{[p['uid'] for p in combo]} on {n['name']} is preferable to {choice.uids} on {choice.node}"


def test_the_search_is_bounded_on_a_large_full_cluster():
    """300 nodes × 8 GPUs, each GPU full with a lower-priority pod: the choice takes at most its
    fits (plus one reprieve pass) and still finds the one victim that makes room."""
    from hami_py.scheduling.eviction.victims import MAX_CANDIDATES, MAX_TRIALS
    cache = UsageCache(VENDORS)
    names, k = [], 0
    for i in range(300):
        name = f"n{i}"
        names.append(name)
        devices = registration(name, gpus=8, model=MODEL)
        cache.upsert_node(gpu_node(name, devices=devices))
        for device in devices:
            k += 1
            cache.add_pod_usage(PodUsage(uid=f"u{k}", namespace="default", name=f"p{k}", node=name,
                                         entries=[UsageEntry("NVIDIA", device["id"], 9000, 0, 1)],
                                         resource_version=k, state=PodState.BOUND, priority=1, started=NOW - k))
    pod = gpu_pod("preemptor", gpumem=5000)
    pod["metadata"]["uid"] = "preemptor-uid"
    pod["spec"]["priority"] = 10
    request = parse_pod_requests(pod, VENDORS, cache.vendor_ids)
    search = VictimSearch(cache, Filterer(cache, VENDORS), clock=lambda: NOW)
    before = books(cache)
    choice = search.choose(pod, request, names)
    assert books(cache) == before
    assert choice is not None and len(choice.victims) == 1
    assert search.trials <= MAX_TRIALS + MAX_CANDIDATES + 1

"""The defragmenter's search (hami_py/defrag/search.py and planner.py) on small random clusters, by hypothesis.

Random nodes (1-3 GPUs of 10000 MiB, split 2-3), random running shares (a ReplicaSet's, a
DaemonSet's or a bare pod; some opting out, some under a PodDisruptionBudget) and one pending pod
asking for one or two GPUs. The books are the scheduler's own (``books_world``: the usage cache fed
the pod objects through its event handler, and the real Filterer). Then:

* every satisfied plan, applied (victims gone, the pending pod decided, the replacements decided
  in order), lets the pending pod fit and every replacement fit again, where the plan says;
* no smaller plan exists: brute force over every subset of the movable pods (computed here from
  the rules, not by the planner) smaller than the plan, each checked for the pending pod's fit and
  the replacements' re-fit with the scheduler's own decide; when the planner finds no plan, no
  subset up to its exact bound works either;
* no pod above the pending pod's priority, of a DaemonSet, without a controller, opting out, or
  beyond its PodDisruptionBudget is ever moved;
* the books after planning equal the books before.
"""
from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

from hami_py.config import DeviceConfig
from hami_py.defrag.planner import Planner
from hami_py.defrag.rules import OPT_OUT_ANNOTATION, Budget
from hami_py.defrag.search import MAX_SET_SIZE, replacement_of, replacement_order
from hami_py.defrag.world import books_world
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.scheduling.admission.owned_annotations import decision_annotations
from hami_py.scheduling.decision.requests import parse_pod_requests

VENDORS = build_vendors(DeviceConfig.default())
OWNED = decision_annotations(VENDORS)
MODEL = {"type": "NVIDIA A100-SXM4-40GB", "devmem": 10000, "devcore": 100}
NOW = 1_800_000_000.0
KINDS = ("ReplicaSet", "ReplicaSet", "ReplicaSet", "StatefulSet", "Job", "DaemonSet", None)
RARELY = st.sampled_from((False, False, False, True))

nodes_st = st.lists(st.tuples(st.integers(1, 3), st.integers(2, 3)), min_size=2, max_size=3)   # (gpus, split)
pods_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(1, 5), st.sampled_from((0, 0, 0, 1, 2)),
                             st.sampled_from(KINDS), RARELY, RARELY, st.integers(0, 1000)),
                   min_size=4, max_size=12)   # node, gpu, mem (thousands), priority, kind, opt out, under PDB, age
pending_st = st.tuples(st.integers(1, 2), st.integers(5, 10), st.sampled_from((1, 1, 2, 0)))           # gpus, mem (thousands), priority


def bound_pod(name: str, *, node: str, uuid: str, mem: int, priority: int, kind: str | None, opt_out: bool,
              pdb: bool, started: float) -> dict:
    alloc = f"{uuid},NVIDIA,{mem},0:;"
    pod = gpu_pod(name, gpumem=mem, annotations={
        "hami.io/vgpu-node": node, "hami.io/vgpu-devices-allocated": alloc,
        "hami.io/vgpu-devices-to-allocate": alloc, "hami.io/bind-phase": "success",
        **({OPT_OUT_ANNOTATION: "false"} if opt_out else {})})
    meta = pod["metadata"]
    meta["uid"] = f"uid-{name}"
    meta["labels"] = {"pdb": "yes"} if pdb else {}
    if kind is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": f"{name}-owner", "uid": "o",
                                    "controller": True}]
    pod["spec"].update(nodeName=node, priority=priority)
    from datetime import datetime, timezone
    pod["status"] = {"phase": "Running",
                     "startTime": datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return pod


def build(nodes_spec, pods_spec, pending_spec, allowed: int):
    nodes, free = [], {}
    for i, (gpus, split) in enumerate(nodes_spec):
        name = f"n{i}"
        devices = registration(name, gpus=gpus, model=MODEL, split=split)
        nodes.append(gpu_node(name, devices=devices))
        for d in devices:
            free[(name, d["index"])] = [d["devmem"], split, d["id"]]
    running, facts = [], {}
    for k, (ni, gi, mem_k, priority, kind, opt_out, pdb, age) in enumerate(pods_spec):
        ni = ni % len(nodes_spec)
        gi = gi % nodes_spec[ni][0]
        slot = free.get((f"n{ni}", gi))
        if slot is None or slot[0] < mem_k * 1000 or slot[1] < 1:
            continue
        slot[0] -= mem_k * 1000
        slot[1] -= 1
        pod = bound_pod(f"p{k}", node=f"n{ni}", uuid=slot[2], mem=mem_k * 1000, priority=priority, kind=kind,
                        opt_out=opt_out, pdb=pdb, started=NOW - 60 * age)
        running.append(pod)
        facts[pod["metadata"]["uid"]] = {"priority": priority, "kind": kind, "opt_out": opt_out, "pdb": pdb}
    gpus, mem_k, priority = pending_spec
    pending = gpu_pod("pending", gpus=gpus, gpumem=mem_k * 1000)
    pending["metadata"]["uid"] = "uid-pending"
    pending["spec"]["priority"] = priority
    budget = Budget(namespace="default", name="pdb", allowed=allowed, match_labels={"pdb": "yes"})
    world = books_world(nodes=nodes, running=running, vendors=VENDORS, pending=[pending], budgets=[budget])
    return world, pending, facts


def books(world) -> tuple:
    cache = world.cache
    return ({n: cache.device_usage(n) for n in world.node_names},
            {u: (p.node, p.entries, p.state, p.resource_version) for u, p in cache.pods.items()},
            {n: set(m) for n, m in cache.node_pods.items()})


def movable(facts: dict, uid: str, priority: int) -> bool:
    f = facts[uid]
    return f["kind"] not in (None, "DaemonSet") and not f["opt_out"] and f["priority"] <= priority


def works(world, pending: dict, victims: list) -> tuple[str | None, list[str | None]] | None:
    """With the victims gone: the pending pod's node and each replacement's node (in the
    replacement order), or None when one of them fits nowhere. The books are put back."""
    cache, filterer = world.cache, world.filterer
    removed = [cache.remove_pod(v.uid) for v in victims]
    charged = []
    try:
        request = parse_pod_requests(pending, VENDORS, cache.vendor_ids)
        node = filterer.decide(pending, world.node_names, request, reserve=True).node
        if node is None:
            return None
        charged.append(pending["metadata"]["uid"])
        placed = []
        for v in replacement_order(victims):
            replacement = replacement_of(world.pods_by_uid[v.uid], owned=OWNED)
            to = filterer.decide(replacement, world.node_names,
                                 parse_pod_requests(replacement, VENDORS, cache.vendor_ids), reserve=True).node
            if to is None:
                return None
            charged.append(replacement["metadata"]["uid"])
            placed.append(to)
        return node, placed
    finally:
        for uid in reversed(charged):
            cache.remove_pod(uid)
        for r in removed:
            cache.add_pod_usage(r)


SETTINGS = settings(max_examples=250, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(nodes_spec=nodes_st, pods_spec=pods_st, pending_spec=pending_st, allowed=st.integers(0, 1))
def test_plans_work_are_smallest_move_only_movable_pods_and_leave_the_books(nodes_spec, pods_spec, pending_spec,
                                                                           allowed):
    world, pending, facts = build(nodes_spec, pods_spec, pending_spec, allowed)
    priority = pending_spec[2]
    assume(works(world, pending, []) is None)    # a pod that fits now needs no search (tested below)
    before = books(world)
    plan = Planner(world, clock=lambda: NOW).make_room([pending])
    assert books(world) == before, "the planner left the books changed"
    event("satisfied" if plan.satisfied else "not satisfied")
    event(f"{len(plan.moves)} moves")

    moved = [m.uid for m in plan.moves]
    for uid in moved:
        assert movable(facts, uid, priority), f"{uid} ({facts[uid]}) may not move for priority {priority}"
    assert sum(facts[u]["pdb"] for u in moved) <= allowed, "more evictions than the PodDisruptionBudget allows"

    victims = [world.cache.pods[u] for u in moved]
    if plan.satisfied:
        assert plan.makes_room_for == ["default/pending"] and plan.reason == ""
        outcome = works(world, pending, victims)
        assert outcome is not None, "the plan, applied, does not let the pod and its replacements fit"
        assert outcome[0] == plan.placements[0].node
        by_uid = {m.uid: m.to for m in plan.moves}
        assert outcome[1] == [by_uid[v.uid] for v in replacement_order(victims)]
    else:
        assert "default/pending" in plan.reason
    if not plan.exact:
        return
    pool = [p for u, p in world.cache.pods.items() if movable(facts, u, priority)]
    largest = len(moved) - 1 if plan.satisfied else min(MAX_SET_SIZE, len(pool))
    for size in range(0, largest + 1):
        for combo in combinations(pool, size):
            if sum(facts[p.uid]["pdb"] for p in combo) > allowed:
                continue
            assert works(world, pending, list(combo)) is None, \
                f"{[p.uid for p in combo]} would do, smaller than the plan's {moved}"


def test_a_pod_that_fits_now_is_placed_without_moves_and_charged_for_the_next():
    """Two pending pods each wanting a whole GPU of a one-GPU-free cluster: the first (higher
    priority) fits as things are; the second sees it charged, and moving p0 would not help (its
    replacement would need the GPU the second takes), so it is not placed."""
    world, _, _ = build([(2, 2)], [(0, 0, 5, 0, "ReplicaSet", False, False, 10)], (1, 10, 0), 0)
    first = gpu_pod("first", gpus=1, gpumem=10000)
    first["metadata"]["uid"] = "uid-first"
    first["spec"]["priority"] = 5
    second = gpu_pod("second", gpus=1, gpumem=10000)
    second["metadata"]["uid"] = "uid-second"
    plan = Planner(world, clock=lambda: NOW).make_room([second, first])
    assert [p.pod for p in plan.placements] == ["default/first"]
    assert plan.placements[0].victims == []
    assert not plan.satisfied and "default/second" in plan.reason


def test_free_devices_moves_the_fewest_pods_and_replacements_avoid_the_freed_devices():
    """n0: one share on each of its two GPUs; n1: two GPUs, one with a small share. Freeing two
    whole GPUs on one node: n1 needs one move, but its pod may only go to n0's GPUs... which fit."""
    world, _, _ = build([(2, 3), (2, 3)], [(0, 0, 3, 0, "ReplicaSet", False, False, 1),
                                           (0, 1, 3, 0, "ReplicaSet", False, False, 1),
                                           (1, 0, 2, 0, "ReplicaSet", False, False, 5)], (1, 4, 0), 0)
    before = books(world)
    plan = Planner(world, clock=lambda: NOW).free_devices(2, model="A100", same_node=True)
    assert books(world) == before
    assert plan.satisfied and [m.pod for m in plan.moves] == ["default/p2"]
    assert plan.moves[0].to == "n0"
    assert {f["node"] for f in plan.freed} == {"n1"} and len(plan.freed) == 2
    after = plan.devices_after["n1"]
    assert all(d["used"] == 0 and d["usedmem"] == 0 for d in after)
    blocked = Planner(world, clock=lambda: NOW).free_devices(2, model="H100")
    assert not blocked.satisfied and "H100" in blocked.reason


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(nodes_spec=nodes_st, pods_spec=pods_st, pending_spec=pending_st, allowed=st.integers(0, 1))
def test_a_bounded_search_still_plans_sets_that_work_and_says_it_is_not_exact(nodes_spec, pods_spec, pending_spec,
                                                                              allowed):
    """Two fits per plan: the pod's own fit and the fit with every candidate gone spend them, so
    the bound is hit before any set is tried and the reprieve pass answers. Its set is not always
    the smallest, but it works, moves only movable pods, the plan says it is not exact, and the
    books are left as they were."""
    world, pending, facts = build(nodes_spec, pods_spec, pending_spec, allowed)
    assume(works(world, pending, []) is None)
    before = books(world)
    plan = Planner(world, clock=lambda: NOW, max_trials=2).make_room([pending])
    assert books(world) == before
    assert all(movable(facts, m.uid, pending_spec[2]) for m in plan.moves)
    event(f"satisfied {plan.satisfied}, exact {plan.exact}")
    if plan.satisfied and plan.moves:
        assert works(world, pending, [world.cache.pods[m.uid] for m in plan.moves]) is not None
        assert not plan.exact

"""Ascend's choice among the NPUs that fit: 910C module pairs, NetworkID groups, the node score.

The choice is a pure function (hami_py.devices.ascend.topology) checked directly, against a
brute-force reference with hypothesis, and through the chooser the vendor builds over a real usage
cache. The end-to-end tests at the bottom need the kernel's FLAG_CHOOSE support (the kernel
branch): until it is merged the kernel does a plain first-fit and ignores the score.
"""
from __future__ import annotations

from itertools import combinations

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.ascend import topology
from hami_py.devices.base import FLAG_CHOOSE, ChoiceAsk
from hami_py.devices.registry import build_vendors
from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node
from hami_py.reasons import ALLOCATED_CARDS_INSUFFICIENT_REQUEST
from tests.conftest import assert_books_balance, place, register_nodes
from tests.test_family_ascend import ON, npu_node, npu_pod, npu_registration, npu_uuid, _allocated


# ---------------------------------------------------------------------------------------------
# pure functions: upstream's cases
# ---------------------------------------------------------------------------------------------

def test_910c_takes_only_whole_modules():
    """Upstream's device_910c_pairing_test cases (NPU index → module index // 2)."""
    def pick(indices, nums):
        return topology.module_pairs(list(enumerate(indices)), nums)

    assert pick([0, 1, 2, 4, 6], 4) is None              # only module 0 is whole: 2 of 4
    assert pick([0, 2], 2) is None                       # two half modules are not one module
    assert pick([0, 1], 2) == [0, 1]
    assert pick([0, 1, 2, 3], 4) == [0, 1, 2, 3]         # hami-features v-ascend: NPUs 0-3 free
    assert pick([0, 1, 2, 3], 3) is None                 # an odd count is never a whole number of modules
    # Modules in the order their first NPU is preferred; each module's NPUs by index.
    assert pick([7, 2, 6, 0, 3, 1], 4) == [2, 0, 1, 4]   # module 3 (NPU 7 is preferred), then module 1
    assert pick([5, 4, 4, 1], 2) == [1, 0]               # a duplicated index counts once


def test_network_groups_take_the_largest_network_first():
    """Upstream's "schedule by NetworkID" case: dev-0 on network 0, dev-1 and dev-2 on network 1,
    walked last to first."""
    assert topology.network_groups([(2, 1), (1, 1), (0, 0)], 2) == [2, 1]
    assert topology.network_groups([(0, 0), (1, 1), (2, 0), (3, 1), (4, 1)], 3) == [1, 3, 4]
    # Equal networks: the one holding the most preferred NPU first.
    assert topology.network_groups([(5, 1), (0, 0), (6, 1), (1, 0)], 3) == [5, 6, 0]


def test_choose_follows_upstreams_branches():
    index_of = list(range(8))
    networks = [0, 0, 0, 0, 1, 1, 1, 1]
    # Not topology mode: upstream's first-fit walk, the first nums.
    assert topology.choose("Ascend910B3", [3, 4, 5, 0], 2, index_of=index_of, network_of=networks,
                           topology=False) == [3, 4]
    # Topology mode: exact count → all of them; one NPU → the first; else by network.
    assert topology.choose("Ascend910B3", [3, 4], 2, index_of=index_of, network_of=networks, topology=True) == [3, 4]
    assert topology.choose("Ascend910B3", [3, 4, 5], 1, index_of=index_of, network_of=networks,
                           topology=True) == [3]
    assert topology.choose("Ascend910B3", [3, 4, 5], 2, index_of=index_of, network_of=networks,
                           topology=True) == [4, 5]
    # 910C: modules whatever the mode; a single NPU is first-fit.
    assert topology.choose("Ascend910C", [3, 4, 5, 0], 2, index_of=index_of, network_of=networks,
                           topology=True) == [4, 5]
    assert topology.choose("Ascend910C", [3, 0], 2, index_of=index_of, network_of=networks, topology=True) is None
    assert topology.choose("Ascend910C", [3, 0], 1, index_of=index_of, network_of=networks, topology=True) == [3]
    # Fewer candidates than asked.
    assert topology.choose("Ascend910B3", [1], 2, index_of=index_of, network_of=networks, topology=True) is None


def test_910c_pairs_only_behind_the_super_pod_gate():
    """HAMi #2853: without superPod a 910C request is counted NPU by NPU (an odd one fits)."""
    index_of = list(range(8))
    networks = [0] * 8
    assert topology.choose("Ascend910C", [7, 5, 4, 3], 3, index_of=index_of, network_of=networks,
                           topology=False, pairs=False) == [7, 5, 4]
    assert topology.choose("Ascend910C", [7, 5, 4, 3], 3, index_of=index_of, network_of=networks,
                           topology=False, pairs=True) is None
    assert topology.choose("Ascend910C", [7, 5, 4, 3], 2, index_of=index_of, network_of=networks,
                           topology=False, pairs=True) == [4, 5]      # module 2 (NPUs 4, 5)
    assert topology.choose("Ascend910C", [7, 5, 4, 3], 2, index_of=index_of, network_of=networks,
                           topology=True, pairs=False) == [7, 5]


def test_score_is_upstreams_network_concentration_for_910_kinds_only():
    networks = [0, 0, 0, 0, 1, 1, 1, 1, None]
    assert topology.score("Ascend910B3", [0, 1, 2, 3], networks) == 10.0
    assert topology.score("Ascend910B3", [2, 3, 4, 5], networks) == 5.0
    assert topology.score("Ascend910B3", [0, 1, 4], networks) == pytest.approx(20 / 3)
    assert topology.score("Ascend910B3", [0, 8], networks) == 0.0        # one NPU without NetworkID
    assert topology.score("Ascend310P", [0, 1], networks) == 0.0
    assert topology.network_id_of({"NetworkID": 1.9}) == 1               # Go's int(float64) truncates
    assert topology.network_id_of({"NetworkID": True}) is None


# ---------------------------------------------------------------------------------------------
# pure functions against brute force
# ---------------------------------------------------------------------------------------------

def _brute_pairs_possible(candidates, nums) -> bool:
    """Is there a set of nums candidates that is exactly a union of whole modules?"""
    for subset in combinations(candidates, nums):
        indices = [i for _, i in subset]
        if len(set(indices)) != nums:
            continue
        chosen = set(indices)
        if all((i ^ 1) in chosen for i in chosen):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(indices=st.lists(st.integers(0, 11), max_size=10), nums=st.integers(1, 8))
def test_module_pairs_matches_brute_force(indices, nums):
    candidates = list(enumerate(indices))
    chosen = topology.module_pairs(candidates, nums)
    assert (chosen is not None) == _brute_pairs_possible(candidates, nums)
    if chosen is not None:
        assert len(chosen) == nums == len(set(chosen))
        picked = [indices[k] for k in chosen]
        assert len(set(picked)) == nums and all((i ^ 1) in picked for i in picked)


@settings(max_examples=300, deadline=None)
@given(networks=st.lists(st.integers(0, 3), min_size=1, max_size=10), data=st.data())
def test_network_groups_reach_the_best_concentration(networks, data):
    nums = data.draw(st.integers(1, len(networks)))
    candidates = list(enumerate(networks))
    chosen = topology.network_groups(candidates, nums)
    assert len(chosen) == nums == len(set(chosen))
    best = max(topology.concentration_score([networks[k] for k in subset])
               for subset in combinations(range(len(networks)), nums))
    assert topology.concentration_score([networks[k] for k in chosen]) == best


# ---------------------------------------------------------------------------------------------
# the vendor's chooser over a real usage cache
# ---------------------------------------------------------------------------------------------

def _cache_with(*nodes: dict) -> tuple[UsageCache, dict]:
    vendors = build_vendors(DeviceConfig.default(), ON)
    cache = UsageCache(vendors)
    for node in nodes:
        cache.upsert_node(node)
    return cache, vendors


def test_chooser_groups_by_network_and_scores_the_node():
    cache, vendors = _cache_with(npu_node("ascend-1", {"Ascend910B3": 8}))
    v = vendors["Ascend910B3"]
    assert v.kernel_flags & FLAG_CHOOSE and vendors["Ascend310P"].kernel_flags & FLAG_CHOOSE
    choose = v.chooser(cache, ChoiceAsk({}))
    node = cache.node_index_of["ascend-1"]
    assert choose(node, [1, 2, 3, 4, 5, 6, 7], 4) == ([4, 5, 6, 7], 10.0)
    assert choose(node, [2, 3, 4, 5, 6], 4) == ([4, 5, 6, 2], 7.5)
    assert choose(node, [6, 1], 1) == ([6], 10.0)
    assert choose(node, [6, 1], 3) == ALLOCATED_CARDS_INSUFFICIENT_REQUEST


def test_310p_chooser_is_first_fit_and_scores_nothing():
    """Every kind chooses (the mode rules are per NPU); a 310P has no NetworkID term, as upstream."""
    cache, vendors = _cache_with(npu_node("edge-1", {"Ascend310P": 4}))
    choose = vendors["Ascend310P"].chooser(cache, ChoiceAsk({}))
    node = cache.node_index_of["edge-1"]
    assert choose(node, [3, 0, 1], 2) == ([3, 0], 0.0)
    assert choose(node, [2], 1) == ([2], 0.0)


def test_chooser_without_network_ids_is_first_fit_and_scores_nothing():
    node = npu_node("old-plugin", registrations={"Ascend910B3": npu_registration("old-plugin", "Ascend910B3", 4,
                                                                                 network=False)})
    cache, vendors = _cache_with(node)
    choose = vendors["Ascend910B3"].chooser(cache, ChoiceAsk({}))
    assert choose(cache.node_index_of["old-plugin"], [3, 0, 1], 2) == ([3, 0], 0.0)


def test_topology_mode_needs_every_npu_of_the_kind_on_the_node():
    """One NPU of the kind without a NetworkID turns topology mode off (upstream's hasNetworkID),
    while another family's devices on the same node do not count."""
    devices = npu_registration("n", "Ascend910B3", 4)
    devices[3].pop("custominfo")
    gpus = gpu_node("n", gpus=2)
    node = npu_node("n", registrations={"Ascend910B3": devices},
                    annotations={k: v for k, v in gpus["metadata"]["annotations"].items()})
    cache, vendors = _cache_with(node)
    choose = vendors["Ascend910B3"].chooser(cache, ChoiceAsk({}))
    index = cache.node_index_of["n"]
    kinds = [d.type for d in cache.devices_at(index)]
    first = kinds.index("Ascend910B3")
    p = list(range(first, first + 4))
    # First-fit: the first two even though a network choice would differ.
    assert choose(index, [p[0], p[3], p[1]], 2)[0] == [p[0], p[3]]

    full = npu_node("m", {"Ascend910B3": 8}, annotations={k: v for k, v in gpus["metadata"]["annotations"].items()})
    cache, vendors = _cache_with(full)
    index = cache.node_index_of["m"]
    kinds = [d.type for d in cache.devices_at(index)]
    first = kinds.index("Ascend910B3")
    choose = vendors["Ascend910B3"].chooser(cache, ChoiceAsk({}))
    p = list(range(first, first + 8))
    assert choose(index, [p[0], p[4], p[5]], 2) == ([p[4], p[5]], 10.0)


def test_chooser_pairs_910c_modules_by_registered_index():
    cache, vendors = _cache_with(npu_node("super-1", {"Ascend910C": 8}))
    choose = vendors["Ascend910C"].chooser(cache, ChoiceAsk({}))
    node = cache.node_index_of["super-1"]
    assert choose(node, [0, 2, 3, 4, 5, 6, 7], 4) == ([2, 3, 4, 5], 10.0)
    assert choose(node, [0, 1, 2, 4, 6], 4) == ALLOCATED_CARDS_INSUFFICIENT_REQUEST
    assert choose(node, [0, 2], 2) == ALLOCATED_CARDS_INSUFFICIENT_REQUEST
    assert choose(node, [0, 1, 2, 3], 3) == ALLOCATED_CARDS_INSUFFICIENT_REQUEST


# ---------------------------------------------------------------------------------------------
# end to end (needs the kernel's FLAG_CHOOSE)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scheduler_options():
    return embedded_options(enable_ascend=True)


async def test_several_910b3_npus_come_from_one_network(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1", {"Ascend910B3": 8}))
    seed = npu_uuid("ascend-1", "Ascend910B3", 7)
    _, result = await place(api, extender, npu_pod("seed", memory=16384,
                                                   annotations={"hami.io/use-Ascend910B3-uuid": seed}), names)
    assert result["NodeNames"] == ["ascend-1"]
    # NPU 7 cannot give a whole NPU any more: network 1 has 3 left, network 0 has 4. (First-fit
    # would walk 6, 5, 4, 3 across both networks.)
    _, result = await place(api, extender, npu_pod("train", count=4, memory=65536), names)
    assert result["NodeNames"] == ["ascend-1"], result
    ann, devices = _allocated(api, app, "train", "Ascend910B3")
    assert {d.uuid for d in devices[0]} == {npu_uuid("ascend-1", "Ascend910B3", i) for i in (0, 1, 2, 3)}
    runtime = orjson.loads(ann["huawei.com/Ascend910B3"])
    assert [r["memory"] for r in runtime] == [65536] * 4 and all("temp" not in r for r in runtime)
    assert_books_balance(app)


async def test_910c_pods_get_whole_modules(api, app, extender):
    names = await register_nodes(api, app, npu_node("super-1", {"Ascend910C": 8}))
    for i in (1, 6):     # modules 0 and 3 half taken (single NPUs are first-fit)
        _, result = await place(api, extender, npu_pod(f"busy-{i}", "Ascend910C", annotations={
            "hami.io/use-Ascend910C-uuid": npu_uuid("super-1", "Ascend910C", i)}), names)
        assert result["NodeNames"] == ["super-1"], result
    # Free: 0, 2, 3, 4, 5, 7. First-fit would walk 7, 5, 4, 3; whole modules are 1 and 2.
    _, result = await place(api, extender, npu_pod("job", "Ascend910C", count=4), names)
    assert result["NodeNames"] == ["super-1"], result
    ann, devices = _allocated(api, app, "job", "Ascend910C")
    assert sorted(d.uuid for d in devices[0]) == sorted(npu_uuid("super-1", "Ascend910C", i) for i in (2, 3, 4, 5))
    assert len(orjson.loads(ann["huawei.com/Ascend910C"])) == 4
    assert_books_balance(app)


async def test_910c_half_free_modules_do_not_make_a_pair(api, app, extender):
    names = await register_nodes(api, app, npu_node("super-1", {"Ascend910C": 4}))
    for i in (1, 2):     # one NPU of each module taken (single NPUs are first-fit)
        _, result = await place(api, extender, npu_pod(f"busy-{i}", "Ascend910C", annotations={
            "hami.io/use-Ascend910C-uuid": npu_uuid("super-1", "Ascend910C", i)}), names)
        assert result["NodeNames"] == ["super-1"], result
    _, result = await place(api, extender, npu_pod("job", "Ascend910C", count=2), names)
    assert result["NodeNames"] is None
    assert "AllocatedCardsInsufficientRequest" in result["FailedNodes"]["super-1"]
    assert_books_balance(app)


async def test_node_score_prefers_the_node_whose_npus_share_a_network(api, app, extender):
    spread_out = npu_registration("scattered", "Ascend910B3", 8)
    for i, dev in enumerate(spread_out):
        dev["custominfo"] = {"NetworkID": i}
    # Listed first, so a tie (no NetworkID term) would give it the pod.
    names = await register_nodes(api, app, npu_node("scattered", registrations={"Ascend910B3": spread_out},
                                                    allocatable={"huawei.com/Ascend910B3": "32"}),
                                 npu_node("grouped", {"Ascend910B3": 8}))
    _, result = await place(api, extender, npu_pod("train", count=4, memory=65536), names)
    assert result["NodeNames"] == ["grouped"], result

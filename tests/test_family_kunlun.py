"""Kunlun whole XPUs and vXPUs: inventory, requests, webhook, annotations, the 8-card topology.

Placement that depends on the kernel's FLAG_* rules is in test_family_kunlun_rules.py.
"""
from __future__ import annotations

import itertools
from array import array

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import kunlun
from hami_py.devices.base import (
    FLAG_CHOOSE, FLAG_EQUAL_SHARE, FLAG_EXCLUSIVE, ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo,
    NodeView, RequestError,
)
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.kunlun import (
    INTER_PAIRS, INTRA_PAIRS, QUADS, KunlunConfig, bubble_score, bubbles, choose_topology, round_vxpu_memory,
    topology_chooser,
)
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.reasons import CARD_UUID_MISMATCH, NUMA_NOT_FIT, OK
from tests.conftest import container as ctr, device_pod, decision_annotations, assert_books_balance, place, register_nodes, wait_until
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
WHOLE = VENDORS["kunlun"]
VXPU = VENDORS["XPU"]

# The registration of upstream's vdevice_test.go, with the plugin's four shares per card.
XPU_CARDS = [{"id": f"xpu-{i}", "index": i, "count": 4, "devmem": 98304, "devcore": 100,
              "type": "XPU", "numa": 0 if i < 4 else 1, "health": True} for i in range(8)]


def xpu_view(cards=XPU_CARDS, name="k1") -> NodeView:
    return NodeView.of({"hami.io/node-register-xpu": orjson.dumps(cards).decode()}, name=name)


def whole_view(cards="8", name="k1") -> NodeView:
    return NodeView.of({}, name=name, capacity={"kunlunxin.com/xpu": cards, "cpu": "96"})


# -- the topology: upstream's documented cases (topo_test.go) -----------------------------------

def free_except(*used):
    return [i for i in range(8) if i not in used]


@pytest.mark.parametrize("free, nums, want", [
    (free_except(), 8, (0, 1, 2, 3, 4, 5, 6, 7)),           # all eight free
    (free_except(0), 8, None),                               # seven free: no 8-card set
    (free_except(), 1, (0,)),                                # both groups full: left first, lowest
    (free_except(4, 5, 6, 7), 4, (0, 1, 2, 3)),              # the left group whole
    ([0, 4], 2, (0, 4)),                                     # only a linked pair is free
    (list(QUADS[0]), 4, QUADS[0]),                           # only the first quad is free
    (free_except(), 3, None),                                # 3 is no supported count
    # one card prefers a group with exactly 1 free, then 3, then 2, then 4
    ([0, 1, 2, 3, 5], 1, (5,)),
    ([0, 1, 4, 5, 6], 1, (4,)),
    ([0, 1, 2, 3, 4, 5], 1, (4,)),
    # two cards: a group with exactly 2, then 3, then 4; else a linked pair
    ([0, 1, 2, 4, 5], 2, (4, 5)),
    ([0, 1, 2, 4, 5, 6, 7], 2, (0, 1)),
    ([0, 5, 6, 7], 2, (5, 6)),
    ([1, 5], 2, (1, 5)),
    ([1, 6], 2, None),
    # four cards across the groups: the quads; with six free the leftover must be linked
    ([0, 1, 4, 5, 6], 4, (0, 1, 4, 5)),
    ([0, 1, 2, 4, 5, 6], 4, (0, 1, 4, 5)),
    ([0, 2, 3, 4, 6, 7], 4, (2, 3, 6, 7)),
    ([0, 1, 2, 5, 6, 7], 4, (1, 2, 5, 6)),
    ([0, 3, 5, 6], 4, None),
])
def test_topology_choice_matches_upstream_cases(free, nums, want):
    assert choose_topology(free, nums) == want


def test_topology_ignores_indexes_outside_the_eight_card_board_and_duplicates():
    assert choose_topology([9, 10, 11, 12, 8], 1) is None
    assert choose_topology([4, 4, 8, 12], 1) == (4,)
    assert choose_topology(list(range(16)), 8) == tuple(range(8))


@pytest.mark.parametrize("cards, want", [([], 1), ([0, 1, 2, 3], 1), ([0], 3), ([4], 3), ([0, 1], 2),
                                         ([0, 1, 2, 3, 4, 5, 6, 7], 0), ([0, 4], 4)])
def test_bubbles_as_upstream_counts_them(cards, want):
    assert bubbles(cards) == want


@pytest.mark.parametrize("prev, cur, want", [([0], [0, 1], 3000), ([0], [4], 2000), ([0, 1], [0], 1000),
                                             ([0, 1, 2, 3], [0], 0), ([], list(range(8)), 3000),
                                             (list(range(8)), [0], 1000)])
def test_bubble_score_as_upstream(prev, cur, want):
    assert bubble_score(prev, cur) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=8, unique=True), st.lists(st.integers(0, 7), max_size=8, unique=True),
       st.randoms(use_true_random=False))
def test_bubble_score_reads_the_cards_in_any_order(prev, cur, rnd):
    """HAMi after v2.10 (#2924) made ``calcscore`` really sort its card lists (v2.10's sort
    compared positions, not cards); the count is by group, so the order never mattered: the
    score of shuffled lists is the score of sorted ones."""
    shuffled_prev, shuffled_cur = list(prev), list(cur)
    rnd.shuffle(shuffled_prev)
    rnd.shuffle(shuffled_cur)
    assert bubble_score(shuffled_prev, shuffled_cur) == bubble_score(sorted(prev), sorted(cur))


# -- the topology against a brute-force statement of the same rule --------------------------------

def reference(free: set[int], nums: int):
    """Every subset of the free cards, filtered by the rule as the vendors doc states it."""
    board = {i for i in free if 0 <= i < 8}
    subsets = [tuple(sorted(c)) for c in itertools.combinations(sorted(board), nums)] if 0 < nums <= 8 else []
    if nums == 8:
        return tuple(range(8)) if len(board) == 8 else None
    if nums not in (1, 2, 4):
        return None
    groups = ({i for i in board if i < 4}, {i for i in board if i >= 4})
    if max(map(len, groups)) >= nums:
        order = [1, 3, 2, 4][nums - 1:] if nums == 1 else list(range(nums, 5))
        for num in order:
            for g in groups:
                if len(g) == num:
                    return min(s for s in subsets if set(s) <= g)
    if nums == 2:
        linked = [s for s in subsets if s in INTER_PAIRS]
        return min(linked) if linked else None
    quads = [q for q in QUADS if tuple(sorted(q)) in subsets]
    if len(board) in (4, 5):
        return quads[0] if quads else None
    if len(board) == 6:
        for q in quads:
            if tuple(sorted(board - set(q))) in INTER_PAIRS + INTRA_PAIRS:
                return q
        return quads[-1] if quads else None
    return None


@settings(max_examples=400, deadline=None)
@given(st.sets(st.integers(0, 11)), st.integers(0, 9), st.randoms())
def test_topology_choice_equals_the_brute_force_reference(free, nums, rnd):
    listed = list(free)
    rnd.shuffle(listed)              # the order the devices arrive in does not matter
    assert choose_topology(listed, nums) == reference(free, nums)


# -- the chooser the kernel calls ------------------------------------------------------------------

class FakeCache:
    """What a chooser reads of the cache: devices per node, their slice offset, usage."""

    def __init__(self, nodes: list[list[DeviceInfo]], used: list[list[int]]):
        self.nodes = nodes
        self.node_offset = array("i", itertools.accumulate([0] + [len(n) for n in nodes[:-1]]))
        self.used = array("i", [u for row in used for u in row])

    def devices_at(self, node_index):
        return self.nodes[node_index]


def cards(n=8, type_="kunlun", order=None):
    devs = [DeviceInfo(id=f"k1-kunlun-{i}", index=i, count=100, devmem=98304, devcore=100, type=type_, health=True)
            for i in range(n)]
    return [devs[i] for i in order] if order else devs


def test_chooser_picks_by_physical_index_not_by_list_position():
    # The policy's sort put the right group first: positions 0-3 hold cards 4-7. Upstream's
    # position rule would take position 0 (card 4) for one card; with cards 1-3 busy the left
    # group has exactly one free card (0), which the index rule prefers.
    order = [4, 5, 6, 7, 0, 1, 2, 3]
    devs = cards(order=order)
    used = [0, 0, 0, 0, 0, 1, 1, 1]
    choose = topology_chooser(FakeCache([devs], [used]), score=False)
    free_positions = [p for p in range(8) if not used[p]]
    chosen, delta = choose(0, free_positions, 1)
    assert [devs[p].index for p in chosen] == [0] and delta == 0.0


def test_chooser_refuses_with_numa_not_fit_and_scores_the_bubbles():
    devs = cards()
    used = [1, 0, 0, 0, 0, 0, 0, 0]
    choose = topology_chooser(FakeCache([devs], [used]), score=True)
    assert choose(0, [1, 2, 3, 4, 5, 6, 7], 8) == NUMA_NOT_FIT
    # Card 0 busy: the left group has 3 free, the right 4; for two cards a group of exactly 3
    # is tried before one of 4, so the pair comes from the left.
    chosen, delta = choose(0, [1, 2, 3, 4, 5, 6, 7], 2)
    assert chosen == [1, 2]
    assert delta == bubble_score([0], [1, 2]) == 3000
    # A second container on the same node: the deltas add up to the score of all its cards.
    chosen2, delta2 = choose(0, [3, 4, 5, 6, 7], 2)
    assert chosen2 == [4, 5]
    assert delta + delta2 == bubble_score([0], [devs[p].index for p in chosen + chosen2])


def test_chooser_scores_zero_on_a_node_with_other_devices():
    devs = cards(4) + [DeviceInfo(id="g", index=0, count=1, devmem=1, devcore=100, type="NVIDIA-H200", health=True)]
    choose = topology_chooser(FakeCache([devs], [[0] * 5]), score=True)
    assert choose(0, [0, 1, 2, 3], 1) == ([0], 0.0)


# -- inventory ---------------------------------------------------------------------------------------

def test_whole_xpus_come_from_the_node_capacity():
    devices = WHOLE.parse_node_devices(whole_view("8"))
    assert [d.id for d in devices] == [f"k1-kunlun-{i}" for i in range(8)]
    assert {(d.count, d.devmem, d.devcore, d.type, d.health) for d in devices} == {(100, 98304, 100, "kunlun", True)}
    assert [d.numa for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.numa for d in WHOLE.parse_node_devices(whole_view("3"))] == [0, 1, 1]
    assert WHOLE.parse_node_devices(whole_view("0")) == []
    assert WHOLE.parse_node_devices(NodeView.of({}, name="k1", capacity={"cpu": "8"})) == []
    assert WHOLE.registration_inputs(whole_view("8")) != WHOLE.registration_inputs(whole_view("4"))
    assert WHOLE.kernel_flags == FLAG_EXCLUSIVE | FLAG_CHOOSE and not WHOLE.uses_node_lock


@pytest.mark.parametrize("raw, message", [
    ("1.5", "kunlunxin.com/xpu '1.5' is not a whole number of cards"),
    ("-2", "kunlunxin.com/xpu '-2' is out of range: must be between 0 and 1024"),
    ("99999", "kunlunxin.com/xpu '99999' is out of range: must be between 0 and 1024"),
])
def test_a_garbled_capacity_is_refused_precisely(raw, message):
    with pytest.raises(DeviceDecodeError) as err:
        WHOLE.parse_node_devices(whole_view(raw))
    assert str(err.value) == message
    assert WHOLE.registration_source() == "kunlunxin.com/xpu capacity"


def test_vxpu_inventory_is_the_json_registration():
    devices = VXPU.parse_node_devices(xpu_view())
    assert [(d.id, d.index, d.count, d.devmem, d.type) for d in devices][:2] == [
        ("xpu-0", 0, 4, 98304, "XPU"), ("xpu-1", 1, 4, 98304, "XPU")]
    assert VXPU.handshake_annotation == "hami.io/node-handshake-xpu"
    assert VXPU.count_resource_name == "kunlunxin.com/vxpu"
    assert VXPU.kernel_flags == FLAG_EQUAL_SHARE | FLAG_CHOOSE and VXPU.uses_node_lock
    with pytest.raises(DeviceDecodeError, match='device 0: field "devmem"'):
        VXPU.parse_node_devices(NodeView.of({"hami.io/node-register-xpu": '[{"id":"x","devmem":"lots"}]'}))
    with pytest.raises(DeviceDecodeError, match="lists no device"):
        VXPU.parse_node_devices(NodeView.of({"hami.io/node-register-xpu": "[]"}))


# -- requests ------------------------------------------------------------------------------------------

def test_whole_xpu_request_takes_each_card_whole():
    req = WHOLE.container_request(ctr({"kunlunxin.com/xpu": "2"}), pod_annotations={})
    assert req == ContainerRequest("kunlun", 2, 0, 100, 100)
    assert WHOLE.container_request(ctr(requests={"kunlunxin.com/xpu": 1}), pod_annotations={}).nums == 1
    assert WHOLE.container_request(ctr({"kunlunxin.com/xpu": "0"}), pod_annotations={}) is None
    assert WHOLE.container_request(ctr({"cpu": "1"}), pod_annotations={}) is None
    with pytest.raises(RequestError) as err:
        WHOLE.container_request(ctr({"kunlunxin.com/xpu": "1.5"}), pod_annotations={})
    assert str(err.value) == "invalid kunlunxin.com/xpu request in container main: device count 1.5 is not a plain integer"


@pytest.mark.parametrize("memory, memreq, cores", [
    ("1000", 24576, 25), ("24576", 24576, 25), ("24577", 49152, 50), ("49152", 49152, 50),
    ("49153", 98304, 100), ("500000", 98304, 100), ("0", 24576, 25)])
def test_vxpu_memory_is_rounded_to_a_share_and_cores_follow(memory, memreq, cores):
    req = VXPU.container_request(ctr({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": memory}),
                                 pod_annotations={})
    assert req == ContainerRequest("XPU", 1, memreq, 0, cores)


def test_vxpu_without_memory_is_a_whole_card_and_memory_is_read_from_requests_too():
    assert VXPU.container_request(ctr({"kunlunxin.com/vxpu": "2"}), pod_annotations={}) == \
        ContainerRequest("XPU", 2, 98304, 100, 100)
    req = VXPU.container_request(ctr({"kunlunxin.com/vxpu": "1"}, {"kunlunxin.com/vxpu-memory": "30000"}),
                                 pod_annotations={})
    assert (req.memreq, req.coresreq) == (49152, 50)
    req = VXPU.container_request(ctr({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24Gi"}),
                                 pod_annotations={})
    assert (req.memreq, req.coresreq) == (98304, 100)     # a huge number of MiB: the whole card
    with pytest.raises(RequestError) as err:
        VXPU.container_request(ctr({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "-1"}),
                               pod_annotations={})
    assert str(err.value) == ('container "main": kunlunxin.com/vxpu-memory "-1" is out of range: '
                              'must be between 0 and 9223372036854775807 MiB')
    assert round_vxpu_memory(1) == 24576


# -- selectors --------------------------------------------------------------------------------------

def test_both_uuid_annotation_families_select_cards():
    def dev(i):
        return DeviceInfo(id=f"k1-kunlun-{i}", index=i, count=100, devmem=1, devcore=100, type="kunlun")
    assert WHOLE.device_selector({}, {}) is None
    select = WHOLE.device_selector({"hami.io/use-xpu-uuid": "k1-kunlun-0,k1-kunlun-1",
                                    "baidu.com/use-gpuuuid": "k1-kunlun-1"}, {})
    assert [select(dev(i)) for i in range(3)] == [CARD_UUID_MISMATCH, OK, CARD_UUID_MISMATCH]
    select = VXPU.device_selector({"baidu.com/nouse-gpuuuid": "k1-kunlun-2"}, {})
    assert [select(dev(i)) for i in range(3)] == [OK, OK, CARD_UUID_MISMATCH]
    select = WHOLE.device_selector({"hami.io/no-use-xpu-uuid": " k1-kunlun-0 "}, {})
    assert select(dev(0)) == CARD_UUID_MISMATCH


# -- webhook ----------------------------------------------------------------------------------------

def test_webhook_rounds_vxpu_memory_in_limits_and_requests():
    c = ctr({"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "30000"})
    assert VXPU.mutate_admission(c, {}) is True
    assert c["resources"]["limits"]["kunlunxin.com/vxpu-memory"] == "49152"
    assert c["resources"]["requests"]["kunlunxin.com/vxpu-memory"] == "49152"
    only_requests = ctr({"cpu": "1"}, {"kunlunxin.com/vxpu": "1"})
    assert VXPU.mutate_admission(only_requests, {}) is False      # upstream reads limits only
    no_memory = ctr({"kunlunxin.com/vxpu": "1"})
    assert VXPU.mutate_admission(no_memory, {}) is True and "requests" not in no_memory["resources"]
    assert WHOLE.mutate_admission(ctr({"kunlunxin.com/xpu": "1"}), {}) is True
    assert WHOLE.mutate_admission(ctr(requests={"kunlunxin.com/xpu": "1"}), {}) is False


def test_webhook_review_patches_the_vxpu_memory_and_sends_the_pod_to_us():
    pod = make_pod(container(limits={"kunlunxin.com/vxpu": "2", "kunlunxin.com/vxpu-memory": "20000"}))
    response, patched = admit(pod)
    assert response["allowed"]
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["limits"]["kunlunxin.com/vxpu-memory"] == "24576"
    assert resources["requests"] == {"kunlunxin.com/vxpu-memory": "24576"}
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    pod = make_pod(container(limits={"kunlunxin.com/xpu": "8"}))
    response, patched = admit(pod)
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


# -- annotations ------------------------------------------------------------------------------------

def whole(i, node="k1"):
    return ContainerDevice(f"{node}-kunlun-{i}", "kunlun", 98304, 100)


def test_whole_xpu_annotations_are_upstreams():
    out = WHOLE.encode_allocation([[whole(0), whole(4)]], node="k1")
    assert out == {"hami.io/kunlun-allocated": "k1-kunlun-0,kunlun,98304,100:k1-kunlun-4,kunlun,98304,100:;",
                   "BAIDU_COM_DEVICE_IDX": "0,4"}
    # Several containers: upstream's loop leaves the last container with cards.
    out = WHOLE.encode_allocation([[whole(1)], [], [whole(2), whole(3)], []], node="k1")
    assert out["BAIDU_COM_DEVICE_IDX"] == "2,3"
    assert decode_pod_devices(out["hami.io/kunlun-allocated"]) == [[whole(1)], [], [whole(2), whole(3)], []]
    assert WHOLE.encode_allocation([[], []]) == {}
    assert set(WHOLE.decision_annotations()) == {"hami.io/kunlun-allocated", "BAIDU_COM_DEVICE_IDX"}
    assert WHOLE.decode_allocation({"hami.io/kunlun-allocated": out["hami.io/kunlun-allocated"]})[2][1] == whole(3)


def test_vxpu_annotations_are_upstreams():
    dev = ContainerDevice("xpu-0", "XPU", 24576, 25)
    out = VXPU.encode_allocation([[dev]])
    assert out == {"hami.io/xpu-devices-to-allocate": "xpu-0,XPU,24576,25:;",
                   "hami.io/xpu-devices-allocated": "xpu-0,XPU,24576,25:;"}


# -- config ------------------------------------------------------------------------------------------

def test_config_section_keys_and_errors():
    assert KunlunConfig.from_section(Section.of("kunlun", None)) == KunlunConfig()
    assert KunlunConfig.from_section(Section.of("kunlun", {"resourceCountName": "x/xpu"})) == \
        KunlunConfig("x/xpu", "", "")
    with pytest.raises(ConfigError) as err:
        KunlunConfig.from_section(Section.of("kunlun", {"resourceVMemoryName": 5}))
    assert str(err.value) == 'device config: kunlun.resourceVMemoryName: expected a string, got integer "5"'
    with pytest.raises(ConfigError, match="^device config: kunlun: expected a mapping, got list$"):
        KunlunConfig.from_section(Section.of("kunlun", []))
    vendors = kunlun.build_family(DeviceConfig(sections={}), None)
    assert [v.resource_names() for v in vendors] == [[], []]     # no section: nothing matches
    renamed = kunlun.build_family(DeviceConfig(sections={"kunlun": {
        "resourceCountName": "a/xpu", "resourceVCountName": "a/vxpu", "resourceVMemoryName": "a/mem"}}), None)
    assert [v.resource_names() for v in renamed] == [["a/xpu"], ["a/vxpu", "a/mem"]]


# -- end to end (no FLAG_* rule involved) ------------------------------------------------------------

def kunlun_node(name, *, xpu_register=None, cards=None, gpus=0):
    node = gpu_node(name, gpus=max(gpus, 1))
    if not gpus:
        del node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    if xpu_register is not None:
        node["metadata"]["annotations"]["hami.io/node-register-xpu"] = xpu_register
        node["metadata"]["annotations"]["hami.io/node-handshake-xpu"] = "Reported 2026-01-01 00:00:00"
        node["status"]["allocatable"]["kunlunxin.com/vxpu"] = "32"
    if cards is not None:
        node["status"]["capacity"]["kunlunxin.com/xpu"] = cards
        node["status"]["allocatable"]["kunlunxin.com/xpu"] = cards
    return node


xpu_pod = device_pod     # the family's pods in these tests


async def test_a_garbled_xpu_registration_is_refused_while_the_nodes_gpus_work(api, app, extender):
    node = kunlun_node("mixed", xpu_register='[{"id":"x","index":"zero"}]', gpus=2)
    names = await register_nodes(api, app, node)
    error = app.cache.nodes["mixed"].decode_error
    assert error == 'hami.io/node-register-xpu: device 0: field "index": expected an integer (uint), got string "zero"'
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result
    assert_books_balance(app)


async def test_a_garbled_capacity_is_refused_precisely_end_to_end(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("bad", cards="2.5", gpus=1))
    assert app.cache.nodes["bad"].decode_error == \
        "kunlunxin.com/xpu capacity: kunlunxin.com/xpu '2.5' is not a whole number of cards"
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["bad"], result


async def test_a_malformed_request_is_refused_with_its_value(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"))
    _, result = await place(api, extender, xpu_pod("half", {"kunlunxin.com/xpu": "0.5"}), names)
    assert result["NodeNames"] is None
    assert result["Error"] == ("pod default/half: invalid kunlunxin.com/xpu request in container main: "
                               "device count 0.5 is not a plain integer")
    _, result = await place(api, extender, xpu_pod("mem", {"kunlunxin.com/vxpu": "1",
                                                           "kunlunxin.com/vxpu-memory": "lots"}), names)
    assert 'kunlunxin.com/vxpu-memory "lots" is not a whole number of MiB' in result["Error"]


async def test_an_upstream_placed_pod_is_charged_from_its_annotation(api, app, extender):
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"))
    pod = xpu_pod("legacy", {"kunlunxin.com/xpu": "2"}, annotations={
        "hami.io/vgpu-node": "k1",
        "hami.io/kunlun-allocated": "k1-kunlun-0,kunlun,98304,100:k1-kunlun-4,kunlun,98304,100:;",
        "BAIDU_COM_DEVICE_IDX": "0,4"})
    pod["spec"]["nodeName"] = "k1"
    pod["status"]["phase"] = "Running"
    api.create("pods", pod)
    await wait_until(lambda: {d["id"]: d["used"] for d in app.cache.device_usage("k1")}.get("k1-kunlun-4") == 1,
                     "the upstream allocation charged")
    usage = {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage("k1")}
    assert usage["k1-kunlun-0"] == (1, 98304, 100) and usage["k1-kunlun-1"] == (0, 0, 0)
    assert_books_balance(app)
    assert names == ["k1"]


async def test_whole_xpu_and_vxpu_pods_are_filtered_and_bound(api, app, extender):
    registration = orjson.dumps(XPU_CARDS).decode()
    names = await register_nodes(api, app, kunlun_node("k1", cards="8"), kunlun_node("v1", xpu_register=registration))
    pod, result = await place(api, extender, xpu_pod("all", {"kunlunxin.com/xpu": "8"}), names)
    assert result["NodeNames"] == ["k1"], result
    ann = decision_annotations(api, app, "all")
    [given] = decode_pod_devices(ann["hami.io/kunlun-allocated"])
    assert sorted(d.uuid for d in given) == [f"k1-kunlun-{i}" for i in range(8)]
    assert {(d.type, d.usedmem, d.usedcores) for d in given} == {("kunlun", 98304, 100)}
    assert sorted(map(int, ann["BAIDU_COM_DEVICE_IDX"].split(","))) == list(range(8))
    assert (await extender.bind(pod, "k1"))["Error"] == ""
    await wait_until(lambda: api.get("pods", "all", namespace="default")["spec"].get("nodeName") == "k1", "bound")
    pod, result = await place(api, extender, xpu_pod("share", {"kunlunxin.com/vxpu": "1",
                                                               "kunlunxin.com/vxpu-memory": "24576"}), names)
    assert result["NodeNames"] == ["v1"], result
    ann = decision_annotations(api, app, "share")
    [[dev]] = decode_pod_devices(ann["hami.io/xpu-devices-allocated"])
    assert ann["hami.io/xpu-devices-to-allocate"] == f"{dev.uuid},XPU,24576,25:;"
    assert (await extender.bind(pod, "v1"))["Error"] == ""
    await wait_until(lambda: api.get("pods", "share", namespace="default")["spec"].get("nodeName") == "v1", "bound")
    assert_books_balance(app)

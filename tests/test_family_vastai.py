"""Vastai: JSON registration and handshake, slots only, die mode with AIC grouping, the mutex
rule on cards, the AIC concentration node score, annotations."""
from __future__ import annotations

import dataclasses
from array import array

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import vastai
from hami_py.devices.base import (
    FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError,
)
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.registry import build_vendors, managed_resource_names
from hami_py.devices.vastai import VastaiConfig, choose_dies, container_score, vastai_chooser
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.families import find_device_model
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.reasons import ALLOCATED_CARDS_INSUFFICIENT_REQUEST, CARD_UUID_MISMATCH, EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, OK
from tests.conftest import (
    assert_books_balance, bind_placed, decision_annotations, device_pod, place, register_nodes, wait_until,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
VA = VENDORS["Vastai"]
VA1 = find_device_model("VA1")
VA1_DIE = find_device_model("VA1-die")
COUNT = "vastaitech.com/va"
REGISTER = "hami.io/node-va-register"
ALLOCATED = "hami.io/Vastai-devices-allocated"
TO_ALLOCATE = "hami.io/Vastai-devices-to-allocate"

UPSTREAM = '[{"id":"7-0","count":1,"devmem":32768,"type":"Vastai","health":true,"devicepairscore":{}}]'


def ctr(limits=None, requests=None, name="main") -> dict:
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "resources": resources}


def die(i, aic, *, strategy="die", count=1):
    custom = {"AIC": aic} if aic is not None else {}
    if strategy is not None:
        custom["DeviceStrategy"] = strategy
    return DeviceInfo(id=f"dev-{i}", index=i, count=count, devmem=0, devcore=100, type="Vastai", health=True,
                      custom=custom)


# -- inventory, requests, webhook, annotations ------------------------------------------------------

def test_inventory_is_the_json_registration_with_custom_info_and_devcore_100():
    [dev] = VA.parse_node_devices(NodeView.of({REGISTER: UPSTREAM}))
    assert (dev.id, dev.count, dev.devmem, dev.devcore, dev.type, dev.custom) == ("7-0", 1, 32768, 100, "Vastai", {})
    dies = VA.parse_node_devices(NodeView.from_node(VA1_DIE.node("v1", devices=4)))
    assert [d.custom for d in dies] == [{"DeviceStrategy": "die", "AIC": str(i // 2)} for i in range(4)]
    assert VA.parse_node_devices(NodeView.of({})) == []
    assert VA.handshake_annotation == "hami.io/node-handshake-va" and VA.count_resource_name == COUNT
    assert VA.kernel_flags == FLAG_CHOOSE and VA.uses_node_lock
    with pytest.raises(DeviceDecodeError, match='^device 0: field "custominfo": expected an object, got string "die"$'):
        VA.parse_node_devices(NodeView.of({REGISTER: '[{"id":"a","custominfo":"die"}]'}))
    with pytest.raises(DeviceDecodeError, match="^the registration lists no device$"):
        VA.parse_node_devices(NodeView.of({REGISTER: "[]"}))


def test_a_request_is_slots_only_and_malformed_counts_are_refused():
    assert VA.container_request(ctr({COUNT: "2"}), pod_annotations={}) == ContainerRequest("Vastai", 2, 0, 0, 0)
    assert VA.container_request(ctr(requests={COUNT: "1"}), pod_annotations={}).nums == 1
    with pytest.raises(RequestError) as err:
        VA.container_request(ctr({COUNT: "two"}), pod_annotations={})
    assert str(err.value) == "invalid vastaitech.com/va request in container main: device count two is not a plain integer"
    assert COUNT in managed_resource_names(VENDORS)


def test_uuid_selection_and_webhook():
    devs = [die(i, "0") for i in range(2)]
    select = VA.device_selector({"vastaitech.com/use-gpuuuid": "dev-1"}, {})
    assert [select(d) for d in devs] == [CARD_UUID_MISMATCH, OK]
    assert VA.device_selector({"vastaitech.com/use-va": "x"}, {}) is None     # defined upstream, never read
    assert VA.mutate_admission(ctr({COUNT: "1"}), {}) is True
    assert VA.mutate_admission(ctr(requests={COUNT: "1"}), {}) is False
    response, patched = admit(make_pod(container(limits={COUNT: "1"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


def test_annotations_are_upstreams():
    out = VA.encode_allocation([[ContainerDevice("d0", "Vastai", 0, 0), ContainerDevice("d1", "Vastai", 0, 0)]])
    assert out == {TO_ALLOCATE: "d0,Vastai,0,0:d1,Vastai,0,0:;", ALLOCATED: "d0,Vastai,0,0:d1,Vastai,0,0:;"}
    assert set(VA.decision_annotations()) == {TO_ALLOCATE, ALLOCATED}


def test_config_section():
    assert VastaiConfig.from_section(Section.of("vastai", {"resourceCountName": "x/va"})) == VastaiConfig("x/va")
    with pytest.raises(ConfigError, match="vastai.resourceCountName: expected a string"):
        VastaiConfig.from_section(Section.of("vastai", {"resourceCountName": 1}))
    [vendor] = vastai.build_family(DeviceConfig(sections={}), None)
    assert vendor.resource_names() == []


# -- die choice: upstream's computeBestCombination cases ------------------------------------------

@pytest.mark.parametrize("aics, nums, want", [
    (["1", "1", "1"], 2, [0, 1]),                              # one card, enough dies
    (["1", "1", "1", "2", "2", "3"], 3, [0, 1, 2]),           # the fullest card
    (["1", "1", "1", "2", "2", "3"], 4, [0, 1, 2, 3]),        # then the next fullest
    (["3", "2", "2", "1", "1", "1"], 4, [3, 4, 5, 1]),        # by size, not by first appearance
    (["a", "b", "a", "b"], 3, [0, 2, 1]),                     # equal cards: in the policy's order
    (["1", "2"], 2, [0, 1]),                                  # exactly nums fit: all of them
    (["2", "1", "1"], 1, [0]),                                # one die: the first fitting
    (["1", None, None], 2, None),                             # dies without a card cannot be grouped
    (["1"], 2, None),
])
def test_choose_dies(aics, nums, want):
    assert choose_dies(aics, nums) == want


@pytest.mark.parametrize("devices, want", [
    ([die(0, "1"), die(1, "1"), die(2, "2")], 2 / 3),
    ([die(0, "1")], 1.0),
    ([die(0, "1", strategy=None)], 1.0),                     # no strategy key: still scored
    ([die(0, "1"), die(1, "1", strategy="card")], None),     # another strategy: the node scores 0
    ([die(0, None)], None),                                  # no AIC: the node scores 0
    ([DeviceInfo(id="x", index=0, count=1, devmem=0, devcore=100, type="Vastai")], None),   # no custom info
    ([die(0, "1"), DeviceInfo(id="y", index=1, count=1, devmem=0, devcore=100, type="Vastai",
                              custom={"AIC": 7, "DeviceStrategy": "die"})], 1.0),   # a non-string AIC is not counted
])
def test_container_score(devices, want):
    assert container_score(devices) == want


class FakeCache:
    """What the chooser reads: one node's devices, their usage, their vendor ids."""

    def __init__(self, devices, used, vendor_id=9):
        self.devices = devices
        self.node_offset = array("i", [0])
        self.used = array("i", used)
        self.vendor = array("i", [vendor_id] * len(devices))
        self.vendor_ids = {"Vastai": vendor_id}

    def devices_at(self, node_index):
        return self.devices


def test_chooser_under_mutex_refuses_idle_dies_of_an_occupied_card():
    # upstream's "mutex die mode rejects idle die on occupied card, picks die on free card":
    # dev-0 (card 1) is in use, so the kernel offers dev-1 (card 1) and dev-2 (card 2).
    devices = [die(0, "1", count=2), die(1, "1"), die(2, "2")]
    choose = vastai_chooser(FakeCache(devices, [1, 0, 0]), 9, mutex=True)
    assert choose(0, [1, 2], 1) == ([2], 1.0)
    # "rejects all idle dies on an occupied card"
    choose = vastai_chooser(FakeCache(devices[:2], [1, 0]), 9, mutex=True)
    assert choose(0, [1], 1) == EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    # Without mutex the idle die of the busy card is as good as any.
    choose = vastai_chooser(FakeCache(devices, [1, 0, 0]), 9, mutex=False)
    assert choose(0, [1, 2], 1) == ([1], 1.0)


def test_chooser_counts_the_pods_earlier_dies_as_occupying_their_card_under_mutex():
    devices = [die(0, "1"), die(1, "1"), die(2, "2"), die(3, "2")]
    choose = vastai_chooser(FakeCache(devices, [0, 0, 0, 0]), 9, mutex=True)
    assert choose(0, [0, 1, 2, 3], 1) == ([0], 1.0)
    # The kernel no longer offers die 0 (used by the first container); die 1 shares its card.
    assert choose(0, [1, 2, 3], 1) == ([2], 1.0)


def test_chooser_starts_each_init_container_from_the_node_as_it_was():
    devices = [die(0, "1"), die(1, "1"), die(2, "2"), die(3, "2")]
    choose = vastai_chooser(FakeCache(devices, [0, 0, 0, 0]), 9, mutex=True, init_rows=[True, True, False, False])
    assert choose(0, [0, 1, 2, 3], 1) == ([0], 1.0)         # init 1
    assert choose(0, [0, 1, 2, 3], 1) == ([0], 1.0)         # init 2: init 1's die occupies nothing
    assert choose(0, [0, 1, 2, 3], 1) == ([0], 1.0)         # app 1: nor for the app containers
    assert choose(0, [1, 2, 3], 1) == ([2], 1.0)            # app 2: app 1's card is occupied


def test_chooser_groups_dies_by_card_and_the_scores_of_a_pods_rows_add_up():
    devices = [die(0, "1"), die(1, "2"), die(2, "1"), die(3, "2"), die(4, "2")]
    choose = vastai_chooser(FakeCache(devices, [0] * 5), 9, mutex=False)
    assert choose(0, [0, 1, 2, 3, 4], 2) == ([1, 3], 1.0)           # card 2 has three of the five
    chosen, delta = choose(0, [0, 2, 4], 3)                           # mixed: 2 of 3 on card 1
    assert chosen == [0, 2, 4] and delta == pytest.approx(2 / 3)
    # A device without an AIC zeroes the node's whole score: the delta takes back what was given.
    devices = [die(0, "1"), die(1, None)]
    choose = vastai_chooser(FakeCache(devices, [0, 0]), 9, mutex=False)
    assert choose(0, [0], 1) == ([0], 1.0)
    assert choose(0, [1], 1) == ([1], -1.0)
    assert choose(0, [0], 1) == ([0], 0.0)
    # Dies that cannot be grouped to the count refuse the node (upstream would give fewer).
    choose = vastai_chooser(FakeCache([die(0, "1"), die(1, None), die(2, None)], [0] * 3), 9, mutex=False)
    assert choose(0, [0, 1, 2], 2) == ALLOCATED_CARDS_INSUFFICIENT_REQUEST


def test_chooser_outside_die_mode_takes_the_first_fitting_devices():
    devices = [die(0, "1", strategy="card"), die(1, "1", strategy="card"), die(2, "2", strategy="card")]
    choose = vastai_chooser(FakeCache(devices, [0, 1, 0]), 9, mutex=True)
    assert choose(0, [2, 0], 2) == ([2, 0], 0.0)                      # no card rule, no score


# -- end to end --------------------------------------------------------------------------------------

def with_nvidia(node, gpus=1):
    nv = gpu_node(node["metadata"]["name"], gpus=gpus)
    node["metadata"]["annotations"].update(nv["metadata"]["annotations"])
    for part in ("capacity", "allocatable"):
        node["status"][part].update(nv["status"][part])
    return node


def scattered_die_node(name, dies=4):
    """A die-mode node whose dies each sit on a card of their own."""
    node = VA1_DIE.node(name, devices=dies)
    entries = orjson.loads(node["metadata"]["annotations"][REGISTER])
    for i, entry in enumerate(entries):
        entry["custominfo"]["AIC"] = f"solo-{i}"
    node["metadata"]["annotations"][REGISTER] = orjson.dumps(entries).decode()
    return node


def aic_by_id(app, node):
    return {d.id: d.custom["AIC"] for d in app.cache.devices_at(app.cache.node_index_of[node])}


async def test_a_card_pod_and_a_die_pod_are_filtered_bound_and_annotated(api, app, extender):
    names = await register_nodes(api, app, VA1.node("card", devices=2), VA1_DIE.node("dies", devices=4))
    pod, result = await place(api, extender, device_pod("one", {COUNT: "1"},
                                                        annotations={"vastaitech.com/use-gpuuuid": ""}), names)
    assert result["Error"] == "" and len(result["NodeNames"]) == 1, result
    ann = decision_annotations(api, app, "one")
    [[dev]] = decode_pod_devices(ann[ALLOCATED])
    assert ann[TO_ALLOCATE] == ann[ALLOCATED] == f"{dev.uuid},Vastai,0,0:;"
    await bind_placed(api, app, extender, pod, result)
    pod, result = await place(api, extender, device_pod("two", {COUNT: "2"}), ["dies"])
    assert result["NodeNames"] == ["dies"], result
    [given] = decode_pod_devices(decision_annotations(api, app, "two")[ALLOCATED])
    cards = aic_by_id(app, "dies")
    assert len(given) == 2 and len({cards[d.uuid] for d in given}) == 1      # both dies on one card
    await bind_placed(api, app, extender, pod, result)
    assert_books_balance(app)


async def test_binpack_prefers_the_node_where_a_pods_dies_share_a_card(api, app, extender):
    names = await register_nodes(api, app, scattered_die_node("scattered"), VA1_DIE.node("paired", devices=4))
    _, result = await place(api, extender, device_pod("two", {COUNT: "2"}), names)
    assert result["NodeNames"] == ["paired"], result          # +1.0 against +0.5
    _, result = await place(api, extender, device_pod("spread", {COUNT: "2"},
                                                      annotations={"hami.io/node-scheduler-policy": "spread"}), names)
    assert result["NodeNames"] == ["scattered"], result       # spread takes the lowest score, as upstream


async def test_mutex_keeps_a_busy_cards_idle_die_free(api, app, extender):
    names = await register_nodes(api, app, VA1_DIE.node("dies", devices=4))
    pod, result = await place(api, extender, device_pod("first", {COUNT: "1"}), names)
    await bind_placed(api, app, extender, pod, result)
    [[first]] = decode_pod_devices(decision_annotations(api, app, "first")[ALLOCATED])
    cards = aic_by_id(app, "dies")
    mutex = {"hami.io/gpu-scheduler-policy": "mutex"}
    pod, result = await place(api, extender, device_pod("second", {COUNT: "1"}, annotations=mutex), names)
    assert result["NodeNames"] == ["dies"], result
    [[second]] = decode_pod_devices(decision_annotations(api, app, "second")[ALLOCATED])
    assert cards[second.uuid] != cards[first.uuid]
    await bind_placed(api, app, extender, pod, result)
    # Both cards now have a die in use: under mutex no die is left, though two are idle.
    _, result = await place(api, extender, device_pod("third", {COUNT: "1"}, annotations=mutex), names)
    assert result["NodeNames"] is None
    # The busy dies have no slot left; the card rule refuses the node once (upstream counts each
    # idle die it refuses: "2/4 ExclusiveDeviceAllocateConflict"; docs/devices/vastai.md).
    assert result["FailedNodes"]["dies"] == "1/4 ExclusiveDeviceAllocateConflict, 2/4 CardTimeSlicingExhausted"
    _, result = await place(api, extender, device_pod("plain", {COUNT: "1"}), names)
    assert result["NodeNames"] == ["dies"]                    # without mutex the idle dies serve
    assert_books_balance(app)


async def test_the_schedulers_default_mutex_policy_applies_to_the_card_rule(api):
    options = dataclasses.replace(embedded_options(), gpu_scheduler_policy="mutex")
    async with running_scheduler(api, options=options) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, VA1_DIE.node("dies", devices=2))
            pod, result = await place(api, extender, device_pod("first", {COUNT: "1"}), names)
            await bind_placed(api, app, extender, pod, result)
            _, result = await place(api, extender, device_pod("second", {COUNT: "1"}), names)
            assert result["NodeNames"] is None
            assert result["FailedNodes"]["dies"] == \
                "1/2 CardTimeSlicingExhausted, 1/2 ExclusiveDeviceAllocateConflict", result
        finally:
            await extender.close()


async def test_a_garbled_registration_is_refused_while_the_nodes_gpus_work(api, app, extender):
    node = with_nvidia(VA1_DIE.node("mixed", devices=2))
    node["metadata"]["annotations"][REGISTER] = '[{"id":"x","count":1.5}]'
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["mixed"].decode_error == \
        'hami.io/node-va-register: device 0: field "count": expected an integer (int32), got number 1.5'
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result


async def test_a_malformed_request_is_refused_with_its_value(api, app, extender):
    names = await register_nodes(api, app, VA1.node("card", devices=2))
    _, result = await place(api, extender, device_pod("bad", {COUNT: "0.5"}), names)
    assert result["NodeNames"] is None
    assert result["Error"] == ("pod default/bad: invalid vastaitech.com/va request in container main: "
                               "device count 0.5 is not a plain integer")


async def test_the_registration_keeper_requests_the_va_handshake(api, app, extender):
    await register_nodes(api, app, VA1.node("card", devices=1))
    await wait_until(lambda: (api.get("nodes", "card")["metadata"]["annotations"]
                              .get("hami.io/node-handshake-va", "")).startswith("Requesting_"),
                     "the va handshake requested")

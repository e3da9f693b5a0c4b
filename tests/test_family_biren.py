"""Biren GPUs: JSON registration and handshake, slots as the only shared quantity, annotations."""
from __future__ import annotations

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import biren
from hami_py.devices.base import ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError
from hami_py.devices.biren import BirenConfig
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.registry import build_vendors, managed_resource_names
from hami_py.fakeapi.families import find_device_model
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.reasons import CARD_UUID_MISMATCH, OK
from tests.conftest import (
    container as ctr,
    assert_books_balance, bind_placed, decision_annotations, device_pod, place, register_nodes, wait_until,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
BR = VENDORS["Biren"]
BR104 = find_device_model("BR104")
COUNT = "birentech.com/gpu"
REGISTER = "hami.io/node-biren-register"

# upstream's device_test.go registration (devcore absent: forced to 100).
UPSTREAM = '[{"id":"7-0","count":1,"devmem":32768,"type":"Biren","health":true,"devicepairscore":{}}]'


def test_inventory_is_the_json_registration_with_devcore_forced_to_100():
    [dev] = BR.parse_node_devices(NodeView.of({REGISTER: UPSTREAM}))
    assert (dev.id, dev.count, dev.devmem, dev.devcore, dev.type, dev.health) == ("7-0", 1, 32768, 100, "Biren", True)
    assert BR.parse_node_devices(NodeView.of({})) == []
    assert BR.handshake_annotation == "hami.io/node-handshake-biren"
    assert BR.count_resource_name == COUNT and BR.uses_node_lock and BR.kernel_flags == 0


@pytest.mark.parametrize("text, message", [
    (":", "invalid JSON: unexpected character, expected a JSON value: line 1 column 1 (char 0)"),
    ("[]", "the registration lists no device"),
    ("null", "the registration lists no device"),
    ('[{"id":"a","count":"two"}]', 'device 0: field "count": expected an integer (int32), got string "two"'),
])
def test_a_garbled_registration_is_refused_precisely(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        BR.parse_node_devices(NodeView.of({REGISTER: text}))
    assert str(err.value) == message


def test_a_request_is_slots_only():
    assert BR.container_request(ctr({COUNT: "2"}), pod_annotations={}) == ContainerRequest("Biren", 2, 0, 0, 0)
    assert BR.container_request(ctr(requests={COUNT: "1"}), pod_annotations={}).nums == 1
    assert BR.container_request(ctr({COUNT: "0"}), pod_annotations={}) is None
    with pytest.raises(RequestError) as err:
        BR.container_request(ctr({COUNT: "1.5"}), pod_annotations={})
    assert str(err.value) == "invalid birentech.com/gpu request in container main: device count 1.5 is not a plain integer"
    assert BR.resource_names() == [COUNT] and COUNT in managed_resource_names(VENDORS)


def test_uuid_selection():
    devs = [DeviceInfo(id=f"br-{i}", index=i, count=4, devmem=1, devcore=100, type="Biren") for i in range(3)]
    select = BR.device_selector({"birentech.com/use-gpuuuid": "br-0,br-2"}, {})
    assert [select(d) for d in devs] == [OK, CARD_UUID_MISMATCH, OK]
    select = BR.device_selector({"birentech.com/nouse-gpuuuid": "br-1"}, {})
    assert [select(d) for d in devs] == [OK, CARD_UUID_MISMATCH, OK]
    assert BR.device_selector({"birentech.com/use-biren": "x"}, {}) is None     # defined upstream, never read


def test_webhook_recognises_the_count_in_limits_only():
    assert BR.mutate_admission(ctr({COUNT: "1"}), {}) is True
    assert BR.mutate_admission(ctr(requests={COUNT: "1"}), {}) is False
    response, patched = admit(make_pod(container(limits={COUNT: "1"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


def test_annotations_are_upstreams():
    dev = ContainerDevice("br-1", "Biren", 0, 0)
    out = BR.encode_allocation([[dev], []])
    assert out == {"hami.io/Biren-devices-to-allocate": "br-1,Biren,0,0:;;",
                   "hami.io/Biren-devices-allocated": "br-1,Biren,0,0:;;"}
    assert set(BR.decision_annotations()) == set(out)
    assert BR.decode_allocation(out) == [[dev], []]


def test_config_section():
    assert BirenConfig.from_section(Section.of("biren", None)) == BirenConfig()
    with pytest.raises(ConfigError, match="biren.resourceCountName: expected a string"):
        BirenConfig.from_section(Section.of("biren", {"resourceCountName": True}))
    [vendor] = biren.build_family(DeviceConfig(sections={}), None)
    assert vendor.resource_names() == []


# -- end to end --------------------------------------------------------------------------------------

def biren_node(name, *, gpus=2, split=2, register=None, with_nvidia=0):
    node = BR104.node(name, devices=gpus, split=split)
    if register is not None:
        node["metadata"]["annotations"][REGISTER] = register
    if with_nvidia:
        nv = gpu_node(name, gpus=with_nvidia)
        node["metadata"]["annotations"].update(nv["metadata"]["annotations"])
        for part in ("capacity", "allocatable"):
            node["status"][part].update(nv["status"][part])
    return node


async def test_pods_are_filtered_bound_and_take_slots_but_no_memory(api, app, extender):
    names = await register_nodes(api, app, biren_node("b1", gpus=2, split=2), gpu_node("g1", gpus=1))
    ids = [d["id"] for d in app.cache.device_usage("b1")]
    placed = []
    for i in range(4):      # 2 GPUs x 2 slots
        pod, result = await place(api, extender, device_pod(f"p{i}", {COUNT: "1"}), names)
        assert result["NodeNames"] == ["b1"], result
        ann = decision_annotations(api, app, f"p{i}")
        [[dev]] = decode_pod_devices(ann["hami.io/Biren-devices-allocated"])
        assert ann["hami.io/Biren-devices-to-allocate"] == f"{dev.uuid},Biren,0,0:;"
        placed.append(await bind_placed(api, app, extender, pod, result))
    usage = {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage("b1")}
    assert usage == {i: (2, 0, 0) for i in ids}
    _, result = await place(api, extender, device_pod("full", {COUNT: "1"}), names)
    assert result["NodeNames"] is None and result["FailedNodes"]["b1"] == "2/2 CardTimeSlicingExhausted"
    assert_books_balance(app)


async def test_a_two_gpu_pod_and_uuid_selection(api, app, extender):
    names = await register_nodes(api, app, biren_node("b1", gpus=3, split=1))
    ids = [d["id"] for d in app.cache.device_usage("b1")]
    pod, result = await place(api, extender, device_pod("two", {COUNT: "2"},
                                                        annotations={"birentech.com/nouse-gpuuuid": ids[1]}), names)
    assert result["NodeNames"] == ["b1"], result
    [given] = decode_pod_devices(decision_annotations(api, app, "two")["hami.io/Biren-devices-allocated"])
    assert sorted(d.uuid for d in given) == sorted([ids[0], ids[2]])
    await bind_placed(api, app, extender, pod, result)
    assert_books_balance(app)


async def test_a_garbled_registration_is_refused_while_the_nodes_gpus_work(api, app, extender):
    names = await register_nodes(api, app, biren_node("mixed", register='[{"id":"x","health":"yes"}]', with_nvidia=1))
    assert app.cache.nodes["mixed"].decode_error == \
        'hami.io/node-biren-register: device 0: field "health": expected true or false, got string "yes"'
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result


async def test_a_malformed_request_is_refused_with_its_value(api, app, extender):
    names = await register_nodes(api, app, biren_node("b1"))
    _, result = await place(api, extender, device_pod("bad", {COUNT: "-1"}), names)
    assert result["NodeNames"] is None
    assert result["Error"] == ("pod default/bad: invalid birentech.com/gpu request in container main: "
                               "device count -1 is out of range")


async def test_an_upstream_placed_pod_is_charged_its_slot(api, app, extender):
    names = await register_nodes(api, app, biren_node("b1", gpus=1, split=1))
    [dev_id] = [d["id"] for d in app.cache.device_usage("b1")]
    pod = device_pod("legacy", {COUNT: "1"}, annotations={
        "hami.io/vgpu-node": "b1", "hami.io/Biren-devices-allocated": f"{dev_id},Biren,0,0:;"})
    pod["spec"]["nodeName"] = "b1"
    pod["status"]["phase"] = "Running"
    api.create("pods", pod)
    await wait_until(lambda: app.cache.device_usage("b1")[0]["used"] == 1, "the upstream allocation charged")
    _, result = await place(api, extender, device_pod("next", {COUNT: "1"}), names)
    assert result["NodeNames"] is None
    assert_books_balance(app)
    assert orjson.loads(api.get("nodes", "b1")["metadata"]["annotations"][REGISTER])[0]["type"] == "Biren"

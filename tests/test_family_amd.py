"""AMD GPUs: the JSON registration, health from capacity, compute-unit shares, type and UUID gates,
upstream's annotations, the webhook, metrics in percent."""
from __future__ import annotations

import orjson
import pytest

from hami_py.config import DeviceConfig, Section
from hami_py.devices import amd
from hami_py.devices.amd import AMDConfig, compute_units
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, NodeView, RequestError,
)
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.families import BY_KEY
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import (
    container as ctr,
    assert_books_balance, bind_placed, create_quota, decision_annotations, device_pod, place, register_nodes,
    wait_until,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
AMD = VENDORS["AMD"]
COUNT, MEM, CORES = "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"
REGISTER = "hami.io/node-amd-register"
# upstream's device_test.go registration
UPSTREAM_JSON = '[{"id":"GPU-0","index":0,"count":1,"devmem":8192,"devcore":100,"type":"amd","numa":0,"health":true}]'


def view(text=UPSTREAM_JSON, gpus="1"):
    capacity = {COUNT: gpus} if gpus is not None else {}
    return NodeView.of({REGISTER: text} if text is not None else {}, name="a1", capacity=capacity)


# -- inventory ----------------------------------------------------------------------------------------

def test_inventory_is_the_json_registration_while_capacity_advertises_gpus():
    [dev] = AMD.parse_node_devices(view())
    assert (dev.id, dev.index, dev.count, dev.devmem, dev.devcore, dev.type, dev.health) == \
        ("GPU-0", 0, 1, 8192, 100, "amd", True)
    # upstream's CheckHealth: amd.com/gpu must be a whole number above 0, else the devices go.
    assert AMD.parse_node_devices(view(gpus="0")) == []
    assert AMD.parse_node_devices(view(gpus=None)) == []
    assert AMD.parse_node_devices(view(gpus="x")) == []
    assert AMD.parse_node_devices(view(text=None)) == []
    # The count resource is part of the inputs: the inventory is decoded again when it changes.
    assert AMD.registration_inputs(view()) != AMD.registration_inputs(view(gpus="0"))
    no_count = amd.AMDVendor(AMDConfig("", MEM, CORES))
    assert len(no_count.parse_node_devices(view(gpus=None))) == 1      # no count name: always healthy
    assert AMD.kernel_flags == FLAG_CHARGE | FLAG_CHOOSE and AMD.uses_node_lock
    assert (AMD.to_allocate_annotation, AMD.allocated_annotation) == (
        "hami.io/amd-devices-to-allocate", "hami.io/amd-devices-allocated")


@pytest.mark.parametrize("text, message", [
    ("[", "invalid JSON"),
    ("[]", "the registration lists no device"),
    ('[{"id":"GPU-0","devcore":"lots"}]', 'device 0: field "devcore"'),
])
def test_a_garbled_registration_is_refused_precisely(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        AMD.parse_node_devices(view(text))
    assert message in str(err.value)


# -- requests and webhook ------------------------------------------------------------------------------

def test_requests_are_read_from_limits_only():
    assert AMD.container_request(ctr({COUNT: "1"}), pod_annotations={}) == ContainerRequest("AMD", 1, 0, 100, 100)
    assert AMD.container_request(ctr({COUNT: "2", MEM: "4096", CORES: "25"}), pod_annotations={}) == \
        ContainerRequest("AMD", 2, 4096, 0, 25)
    assert AMD.container_request(ctr(requests={COUNT: "1"}), pod_annotations={}) is None
    assert AMD.container_request(ctr({COUNT: "1"}, {CORES: "5"}), pod_annotations={}).coresreq == 100
    assert AMD.container_request(ctr({COUNT: "0"}), pod_annotations={}) is None
    assert AMD.container_request(ctr({MEM: "1024"}), pod_annotations={}) is None      # the count is needed


def _core_refused(value: str) -> tuple[dict, str]:
    return ({COUNT: "1", CORES: value}, f"invalid {CORES} request in container main: core percentage request "
                                        f"{value} is out of range (must be an integer between 1 and 100)")


@pytest.mark.parametrize("limits, message", [
    ({COUNT: "1.5"}, f"invalid {COUNT} request in container main: device count 1.5 is not a plain integer"),
    ({COUNT: "1e19"}, f"invalid {COUNT} request in container main: device count 1e19 is not a plain integer"),
    ({COUNT: "-1"}, f"invalid {COUNT} request in container main: device count -1 is out of range"),
    ({COUNT: "2147483648"}, f"invalid {COUNT} request in container main: device count 2147483648 is out of range"),
    ({COUNT: "1", MEM: "4Gi"},
     'container "main": amd.com/gpumem "4Gi" is out of range: must be between 0 and 2147483647 MiB'),
    _core_refused("0"), _core_refused("150"), _core_refused("12.5"),
])
def test_a_malformed_request_is_refused_naming_container_and_value(limits, message):
    """HAMi after v2.10 (#2994) refuses these with the reasons quoted here, as we do."""
    with pytest.raises(RequestError) as err:
        AMD.container_request(ctr(limits), pod_annotations={})
    assert str(err.value) == message


def test_the_webhook_checks_the_percentage_as_upstream():
    assert AMD.mutate_admission(ctr({COUNT: "1", CORES: "50"}), {}) is True
    assert AMD.mutate_admission(ctr({MEM: "1024"}), {}) is True      # memory alone counts, as upstream
    assert AMD.mutate_admission(ctr({CORES: "500"}), {}) is True     # not checked without the count
    assert AMD.mutate_admission(ctr(requests={COUNT: "1"}), {}) is False
    for bad in ("0", "101", "1.5"):
        with pytest.raises(RequestError) as err:
            AMD.mutate_admission(ctr({COUNT: "1", CORES: bad}), {})
        assert str(err.value) == "amd.com/gpucores must be an integer percentage between 1 and 100"
    response, patched = admit(make_pod(container(limits={COUNT: "1", CORES: "30"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    response, _ = admit(make_pod(container(limits={COUNT: "1", CORES: "130"})))
    assert not response["allowed"]
    assert response["status"]["message"] == "amd.com/gpucores must be an integer percentage between 1 and 100"


def test_config_and_resource_names():
    assert AMDConfig.from_section(Section.of("amd", {"resourceCountName": "amd.com/gpu"})) == \
        AMDConfig("amd.com/gpu", "", "")
    assert AMD.resource_names() == [COUNT, MEM, CORES]
    # HAMi after v2.10 (#3180): a namespace quota on the memory holds; cores are CUs, not checked.
    assert AMD.quota_resources() == (MEM, "", 1)
    assert amd.build_family(DeviceConfig(sections={}), None)[0].resource_names() == []


def test_a_percentage_is_a_share_of_each_devices_compute_units():
    assert compute_units(304, 50) == 152 and compute_units(304, 100) == 304
    assert compute_units(304, 1) == 3 and compute_units(50, 1) == 1      # at least one CU
    assert compute_units(0, 50) == 0


@pytest.mark.parametrize("custom, wgp", [
    ({"cuPerWGP": 2}, 2), ({"cuPerWGP": 2.0}, 2), ({}, 1), ({"cuPerWGP": 1}, 1),
    ({"cuPerWGP": 2147483647}, 2147483647),
    # upstream ignores what is not a whole JSON number above 1 (up to MaxInt32): CU by CU, as before
    ({"cuPerWGP": 2.5}, 1), ({"cuPerWGP": "2"}, 1), ({"cuPerWGP": True}, 1), ({"cuPerWGP": 0}, 1),
    ({"cuPerWGP": -2}, 1), ({"cuPerWGP": 2147483648}, 1), ({"cuperwgp": 2}, 1),
])
def test_the_wgp_size_is_the_registrations_cu_per_wgp(custom, wgp):
    assert amd.cus_per_wgp(custom) == wgp


def test_on_rdna_a_percentage_is_rounded_up_to_whole_wgps():
    """HAMi after v2.10 (#3174): the plugin masks whole WGPs, so 5 % of 64 CUs (3) is 4 CUs."""
    assert compute_units(64, 5, 2) == 4 and compute_units(64, 5) == 3
    assert compute_units(64, 50, 2) == 32                     # already whole WGPs
    assert compute_units(2, 50, 2) == 2 and compute_units(64, 1, 2) == 2      # one WGP at least
    assert compute_units(4, 75, 2147483647) == 4              # never beyond the device
    assert compute_units(0, 50, 2) == 0
    [dev] = AMD.parse_node_devices(view(
        '[{"id":"GPU-0","count":2,"devmem":16304,"devcore":32,"type":"AMDGPU","health":true,'
        '"custominfo":{"cuPerWGP":2,"pciBDF":"0000:03:00.0"}}]'))
    assert amd.cus_per_wgp(dev.custom) == 2 and amd.device_compute_units(dev, 5) == 2


def test_core_metrics_are_percent_of_the_compute_units():
    assert AMD.core_metrics(304, 100) == (100, 33)      # ceil(100 / 304 * 100)
    assert AMD.core_metrics(304, 0) == (100, 0)
    assert AMD.core_metrics(0, 0) == (0, 0)


def test_annotations_are_upstreams():
    devices = [[ContainerDevice("test1", "AMD-MI300X", 100, 3), ContainerDevice("test2", "AMD-MI300X", 200, 4)]]
    out = AMD.encode_allocation(devices)
    text = "test1,AMD-MI300X,100,3:test2,AMD-MI300X,200,4:;"
    assert out == {"hami.io/amd-devices-to-allocate": text, "hami.io/amd-devices-allocated": text}
    assert AMD.decode_allocation(out) == devices
    assert AMD.encode_allocation([[]]) == {}


# -- end to end ---------------------------------------------------------------------------------------

def amd_node(name, *, devices=1, gpus=0, split=None, register=None, **build):
    node = BY_KEY["mi300x"].node(name, devices=devices, split=split, **build)
    if register is not None:
        node["metadata"]["annotations"][REGISTER] = register
    if gpus:
        gpu = gpu_node(name, gpus=gpus)
        node["metadata"]["annotations"].update(gpu["metadata"]["annotations"])
        for part in ("capacity", "allocatable"):
            node["status"][part]["nvidia.com/gpu"] = gpu["status"]["capacity"]["nvidia.com/gpu"]
    return node


def registered(node):
    return orjson.loads(node["metadata"]["annotations"][REGISTER])


def usage(app, node):
    return [(d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage(node)]


async def test_a_share_of_memory_and_compute_units_is_filtered_bound_and_annotated(api, app, extender):
    node = amd_node("a1")
    [dev] = registered(node)
    names = await register_nodes(api, app, node)
    pod, result = await place(api, extender, device_pod("half", {COUNT: "1", MEM: "65536", CORES: "50"}), names)
    assert result["NodeNames"] == ["a1"], result
    ann = decision_annotations(api, app, "half")
    text = f"{dev['id']},AMD-MI300X,65536,152:;"
    assert ann["hami.io/amd-devices-allocated"] == ann["hami.io/amd-devices-to-allocate"] == text
    bound = await bind_placed(api, app, extender, pod, result)
    assert bound["metadata"]["annotations"]["hami.io/amd-devices-allocated"] == text
    assert usage(app, "a1") == [(1, 65536, 152)]
    # Another half fits; a third share finds no compute units left (upstream's CardInsufficientCore).
    _, result = await place(api, extender, device_pod("half2", {COUNT: "1", MEM: "65536", CORES: "50"}), names)
    assert result["NodeNames"] == ["a1"], result
    _, result = await place(api, extender, device_pod("one", {COUNT: "1", MEM: "1024", CORES: "1"}), names)
    assert result["FailedNodes"] == {"a1": "1/1 CardInsufficientCore"}
    assert_books_balance(app)
    api.delete("pods", "half", namespace="default")
    await wait_until(lambda: usage(app, "a1") == [(1, 65536, 152)], "half released")
    assert_books_balance(app)


async def test_no_memory_limit_takes_the_whole_devices_memory(api, app, extender):
    names = await register_nodes(api, app, amd_node("a1"))
    _, result = await place(api, extender, device_pod("whole", {COUNT: "1", CORES: "10"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert usage(app, "a1") == [(1, 196608, 30)]
    _, result = await place(api, extender, device_pod("small", {COUNT: "1", MEM: "1", CORES: "1"}), names)
    assert result["FailedNodes"] == {"a1": "1/1 CardInsufficientMemory"}
    assert_books_balance(app)


async def test_each_device_is_charged_its_own_compute_units(api, app, extender):
    """A node with two models: the percentage is of each device's CUs (304 and 104 here), and a
    device whose free CUs are short of its own need is passed over."""
    entries = [{"id": "GPU-big", "index": 0, "count": 4, "devmem": 196608, "devcore": 304, "type": "AMD-MI300X",
                "health": True},
               {"id": "GPU-small", "index": 1, "count": 4, "devmem": 65536, "devcore": 104, "type": "AMD-MI210",
                "health": True}]
    names = await register_nodes(api, app, amd_node("a1", register=orjson.dumps(entries).decode()))
    _, result = await place(api, extender, device_pod("both", {COUNT: "2", MEM: "1024", CORES: "60"}), names)
    assert result["NodeNames"] == ["a1"], result
    text = decision_annotations(api, app, "both")["hami.io/amd-devices-allocated"]
    assert sorted(text.rstrip(";").split(":")[:2]) == ["GPU-big,AMD-MI300X,1024,182", "GPU-small,AMD-MI210,1024,62"]
    # 50 % more: the MI300X has 122 CUs free of the 152 needed, the MI210 42 of 52.
    _, result = await place(api, extender, device_pod("more", {COUNT: "1", MEM: "1024", CORES: "50"}), names)
    assert result["NodeNames"] is None and "CardInsufficientCore" in result["FailedNodes"]["a1"], result
    # 40 %: 121 of the MI300X's 122 free CUs; the MI210's 41 of 42.
    _, result = await place(api, extender, device_pod("fits", {COUNT: "2", MEM: "1024", CORES: "40"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert sorted(u[2] for u in usage(app, "a1")) == [62 + 41, 182 + 121]
    assert_books_balance(app)


async def test_pods_pick_devices_by_type_and_uuid(api, app, extender):
    node = amd_node("a1", devices=2)
    ids = [d["id"] for d in registered(node)]
    names = await register_nodes(api, app, node)
    _, result = await place(api, extender, device_pod("mi250", {COUNT: "1"},
                                                      annotations={"amd.com/use-gputype": "MI250"}), names)
    assert result["FailedNodes"] == {"a1": "2/2 CardTypeMismatch"}
    _, result = await place(api, extender, device_pod("not300", {COUNT: "1"},
                                                      annotations={"amd.com/nouse-gputype": "mi300x"}), names)
    assert result["FailedNodes"] == {"a1": "2/2 CardTypeMismatch"}
    _, result = await place(api, extender, device_pod("pick", {COUNT: "1", CORES: "10", MEM: "10"},
                                                      annotations={"amd.com/use-gputype": "MI300",
                                                                   "amd.com/use-gpu-uuid": ids[1]}), names)
    assert result["NodeNames"] == ["a1"], result
    assert decision_annotations(api, app, "pick")["hami.io/amd-devices-allocated"].startswith(f"{ids[1]},")
    _, result = await place(api, extender, device_pod("avoid", {COUNT: "1"},
                                                      annotations={"amd.com/nouse-gpu-uuid": ",".join(ids)}), names)
    assert result["FailedNodes"] == {"a1": "2/2 CardUuidMismatch"}
    assert_books_balance(app)


async def test_two_containers_share_a_device_by_compute_units(api, app, extender):
    names = await register_nodes(api, app, amd_node("a1"))
    pod = device_pod("pair", {COUNT: "1", MEM: "1024", CORES: "60"})
    pod["spec"]["containers"].append({"name": "b", "image": "x",
                                      "resources": {"limits": {COUNT: "1", MEM: "1024", CORES: "40"}}})
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["a1"], result
    assert usage(app, "a1") == [(2, 2048, 182 + 121)]
    pod = device_pod("over", {COUNT: "1", MEM: "1024", CORES: "60"})
    pod["spec"]["containers"].append({"name": "b", "image": "x",
                                      "resources": {"limits": {COUNT: "1", MEM: "1024", CORES: "41"}}})
    api.delete("pods", "pair", namespace="default")
    await wait_until(lambda: usage(app, "a1") == [(0, 0, 0)], "pair released")
    _, result = await place(api, extender, pod, names)     # 182 + 124 CUs > 304
    assert result["NodeNames"] is None, result
    assert_books_balance(app)


async def test_a_node_without_gpu_capacity_has_no_amd_devices(api, app, extender):
    node = amd_node("a1", gpus=1)
    for part in ("capacity", "allocatable"):
        node["status"][part][COUNT] = "0"
    names = await register_nodes(api, app, node)
    assert [d["id"] for d in app.cache.device_usage("a1")] == [d["id"] for d in orjson.loads(
        node["metadata"]["annotations"]["hami.io/node-nvidia-register"])]      # the GPU only
    _, result = await place(api, extender, device_pod("amd", {COUNT: "1"}), names)
    assert result["NodeNames"] is None
    # The plugin advertises its GPUs again: the registration counts.
    node = api.get("nodes", "a1")
    node["status"]["capacity"][COUNT] = node["status"]["allocatable"][COUNT] = "1"
    api.update("nodes", node)
    await wait_until(lambda: any(d["type"] == "AMD-MI300X" for d in app.cache.device_usage("a1")), "AMD back")
    _, result = await place(api, extender, device_pod("amd2", {COUNT: "1"}), names)
    assert result["NodeNames"] == ["a1"], result


async def test_a_garbled_registration_is_refused_while_the_nodes_gpus_work(api, app, extender):
    names = await register_nodes(api, app, amd_node("mixed", gpus=2, register='[{"id":"x","count":"one"}]'))
    assert app.cache.nodes["mixed"].decode_error.startswith('hami.io/node-amd-register: device 0: field "count"')
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result
    _, result = await place(api, extender, device_pod("amd", {COUNT: "1"}), names)
    assert result["NodeNames"] is None
    assert_books_balance(app)


async def test_a_malformed_request_is_refused_at_filter(api, app, extender):
    names = await register_nodes(api, app, amd_node("a1"))
    _, result = await place(api, extender, device_pod("bad", {COUNT: "1", CORES: "250"}), names)
    assert result["Error"] == f"pod default/bad: {_core_refused('250')[1]}"


async def test_an_upstream_placed_pod_is_charged_from_its_annotation(api, app, extender):
    node = amd_node("a1")
    [dev] = registered(node)
    names = await register_nodes(api, app, node)
    pod = device_pod("legacy", {COUNT: "1", MEM: "1024", CORES: "90"}, annotations={
        "hami.io/vgpu-node": "a1", "hami.io/amd-devices-allocated": f"{dev['id']},AMD-MI300X,1024,273:;"})
    pod["spec"]["nodeName"] = "a1"
    api.create("pods", pod)
    await wait_until(lambda: usage(app, "a1") == [(1, 1024, 273)], "charged from the annotation")
    # 31 CUs left: 10 % (30 CUs) fits, 20 % (60) does not.
    _, result = await place(api, extender, device_pod("big", {COUNT: "1", MEM: "1024", CORES: "20"}), names)
    assert result["FailedNodes"] == {"a1": "1/1 CardInsufficientCore"}
    _, result = await place(api, extender, device_pod("small", {COUNT: "1", MEM: "1024", CORES: "10"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert_books_balance(app)


# -- HAMi after v2.10: memory percentage, NUMA binding, quota, runtime class, priority, allocatable ---

PCT = "amd.com/gpumem-percentage"


def configured(**extra):
    section = {"resourceCountName": COUNT, "resourceMemoryName": MEM, "resourceCoreName": CORES,
               "resourceMemoryPercentageName": PCT, **extra}
    return build_vendors(DeviceConfig(sections={"amd": section}))["AMD"]


def test_config_reads_the_new_keys_and_the_chart_names_the_percentage():
    config = AMDConfig.from_section(Section.of("amd", {
        "resourceCountName": COUNT, "resourceMemoryPercentageName": PCT, "runtimeClassName": "amd",
        "resourcePriorityName": "amd.com/priority"}))
    assert (config.resource_memory_percentage_name, config.runtime_class_name, config.resource_priority_name) == (
        PCT, "amd", "amd.com/priority")
    assert AMD.config.resource_memory_percentage_name == PCT
    assert (AMD.config.runtime_class_name, AMD.config.resource_priority_name) == ("", "")


def test_the_memory_percentage_is_read_from_limits_else_requests():
    assert AMD.container_request(ctr({COUNT: "1", PCT: "25"}), pod_annotations={}) == \
        ContainerRequest("AMD", 1, 0, 25, 100)
    assert AMD.container_request(ctr({COUNT: "2"}, {PCT: "40"}), pod_annotations={}) == \
        ContainerRequest("AMD", 2, 0, 40, 100)
    # gpumem wins; 0 is no share: the whole device.
    assert AMD.container_request(ctr({COUNT: "1", MEM: "1024", PCT: "25"}), pod_annotations={}) == \
        ContainerRequest("AMD", 1, 1024, 0, 100)
    assert AMD.container_request(ctr({COUNT: "1", PCT: "0"}), pod_annotations={}) == \
        ContainerRequest("AMD", 1, 0, 100, 100)
    assert amd.AMDAsk(1, 0, 100, 25).device_memory(16384) == 4096
    assert amd.AMDAsk(1, 0, 100, 1).device_memory(50) == 1          # at least 1 MiB
    assert amd.AMDAsk(1, 0, 100, 100).device_memory(16384) == 16384
    assert amd.AMDAsk(1, 2048, 100, 0).device_memory(16384) == 2048


@pytest.mark.parametrize("bad", ["101", "-1", "1500m", "half"])
def test_a_bad_memory_percentage_is_refused_at_the_webhook_and_the_filter(bad):
    message = f"invalid {PCT} value {bad} in container main: must be an integer between 0 and 100"
    with pytest.raises(RequestError) as err:
        AMD.container_request(ctr({COUNT: "1", PCT: bad}), pod_annotations={})
    assert str(err.value) == message
    for limits in ({COUNT: "1", PCT: bad}, {PCT: bad}):
        with pytest.raises(RequestError) as err:
            AMD.mutate_admission(ctr(limits), {})
        assert str(err.value) == message
    response, _ = admit(make_pod(container(limits={PCT: bad})))
    assert not response["allowed"] and response["status"]["message"] == message


def test_a_percentage_alone_is_given_one_device_at_the_webhook():
    c = ctr({PCT: "50"})
    assert AMD.mutate_admission(c, {}) is True and c["resources"]["limits"] == {PCT: "50", COUNT: "1"}
    c = ctr(requests={PCT: "50"})
    assert AMD.mutate_admission(c, {}) is True and c["resources"]["limits"] == {COUNT: "1"}
    assert AMD.container_request(c, pod_annotations={}) == ContainerRequest("AMD", 1, 0, 50, 100)
    c = ctr({COUNT: "2", PCT: "50"})
    assert AMD.mutate_admission(c, {}) is True and c["resources"]["limits"][COUNT] == "2"     # kept
    response, patched = admit(make_pod(container(limits={PCT: "30"})))
    assert response["allowed"] and patched["spec"]["containers"][0]["resources"]["limits"] == {PCT: "30", COUNT: "1"}


def test_the_runtime_class_is_set_on_a_pod_asking_amd_that_names_none():
    vendor = configured(runtimeClassName="amd-hami")
    response, patched = admit(make_pod(container(limits={COUNT: "1"})), vendors={"AMD": vendor})
    assert response["allowed"] and patched["spec"]["runtimeClassName"] == "amd-hami"
    response, patched = admit(make_pod(container(limits={PCT: "10"})), vendors={"AMD": vendor})
    assert patched["spec"]["runtimeClassName"] == "amd-hami"
    response, patched = admit(make_pod(container(limits={COUNT: "1"}), runtimeClassName="kata"),
                              vendors={"AMD": vendor})
    assert patched["spec"]["runtimeClassName"] == "kata"      # the pod's own wins
    pod = {"spec": {}}
    assert vendor.mutate_admission(ctr({"cpu": "1"}), pod) is False and pod == {"spec": {}}
    response, patched = admit(make_pod(container(limits={COUNT: "1"})))      # the chart sets none
    assert "runtimeClassName" not in patched["spec"]


def test_the_priority_resource_becomes_amd_task_priority():
    vendor = configured(resourcePriorityName="amd.com/priority")
    c = ctr({COUNT: "1", "amd.com/priority": "1"})
    c["env"] = [{"name": "KEEP", "value": "x"},
                {"name": "AMD_TASK_PRIORITY", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert vendor.mutate_admission(c, {}) is True
    assert c["env"] == [{"name": "KEEP", "value": "x"}, {"name": "AMD_TASK_PRIORITY", "value": "1"}]
    c = ctr({"amd.com/priority": "0"})
    assert vendor.mutate_admission(c, {}) is False                 # a priority alone asks no device
    assert c["env"] == [{"name": "AMD_TASK_PRIORITY", "value": "0"}]
    for bad in ("-1", "1500m", "3000000000"):
        c = ctr({COUNT: "1", "amd.com/priority": bad})
        with pytest.raises(RequestError) as err:
            vendor.mutate_admission(c, {})
        assert str(err.value) == (f"invalid amd.com/priority value {bad} in container main: must be an integer "
                                  "between 0 and 2147483647")
        assert "env" not in c
    c = ctr({COUNT: "1", "amd.com/priority": "1"})
    assert AMD.mutate_admission(c, {}) is True and "env" not in c  # not configured: ignored


def test_health_follows_the_allocatable_count():
    text = UPSTREAM_JSON
    healthy = NodeView.of({REGISTER: text}, name="a1", capacity={COUNT: "1"}, allocatable={COUNT: "1"})
    assert len(AMD.parse_node_devices(healthy)) == 1
    # kubelet keeps a failed GPU in capacity and drops it from allocatable (#3194).
    for allocatable in ({COUNT: "0"}, {"cpu": "8"}):
        node = NodeView.of({REGISTER: text}, name="a1", capacity={COUNT: "1"}, allocatable=allocatable)
        assert AMD.parse_node_devices(node) == []
        assert AMD.registration_inputs(node) != AMD.registration_inputs(healthy)
    assert AMD.numa_bind({"amd.com/numa-bind": "true"}) is False      # applied by AMD's chooser instead
    assert amd.numa_bound({"amd.com/numa-bind": "true"}) and amd.numa_bound({"amd.com/numa-bind": "1"})
    assert not amd.numa_bound({"amd.com/numa-bind": "yes"}) and not amd.numa_bound({})


async def test_a_memory_percentage_books_that_share_of_each_device(api, app, extender):
    names = await register_nodes(api, app, amd_node("a1"))
    pod, result = await place(api, extender, device_pod("quarter", {COUNT: "1", PCT: "25", CORES: "10"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert decision_annotations(api, app, "quarter")["hami.io/amd-devices-allocated"].split(",")[2] == "49152"
    await bind_placed(api, app, extender, pod, result)
    assert usage(app, "a1") == [(1, 49152, 30)]
    _, result = await place(api, extender, device_pod("most", {COUNT: "1", PCT: "80", CORES: "10"}), names)
    assert result["FailedNodes"] == {"a1": "1/1 CardInsufficientMemory"}       # 75 % left
    assert_books_balance(app)


def occupy(api, node: str, device_id: str, name: str):
    """An upstream-placed pod holding all of a device's memory."""
    pod = device_pod(name, {COUNT: "1"}, annotations={
        "hami.io/vgpu-node": node, "hami.io/amd-devices-allocated": f"{device_id},AMD-MI300X,196608,10:;"})
    pod["spec"]["nodeName"] = node
    api.create("pods", pod)


def numa_of(api, app, name, node):
    by_id = {d["id"]: d.get("numa", 0) for d in registered(node)}     # omitted when 0, as Go writes it
    text = decision_annotations(api, app, name)["hami.io/amd-devices-allocated"]
    return [by_id[entry.split(",")[0]] for entry in text.rstrip(";").split(":") if entry]


@pytest.mark.parametrize("policy", ["spread", "binpack"])
async def test_numa_bind_keeps_a_containers_gpus_on_one_numa_node(api, app, extender, policy):
    """Four GPUs, two a NUMA node; GPU 2 (NUMA 1) is full. A two-GPU pod asking numa-bind gets GPUs
    0 and 1 under either policy, whichever NUMA node is walked first; without it, spread takes GPU 3
    and one of NUMA 0."""
    node = amd_node("a1", devices=4)
    ids = [d["id"] for d in registered(node)]
    assert [d.get("numa", 0) for d in registered(node)] == [0, 0, 1, 1]
    names = await register_nodes(api, app, node)
    occupy(api, "a1", ids[2], "full")
    await wait_until(lambda: usage(app, "a1")[2][1] == 196608, "GPU 2 charged")
    asked = {COUNT: "2", MEM: "1024", CORES: "10"}
    bind = {"amd.com/numa-bind": "true", "hami.io/gpu-scheduler-policy": policy}
    _, result = await place(api, extender, device_pod("bound", asked, annotations=bind), names)
    assert result["NodeNames"] == ["a1"], result
    assert numa_of(api, app, "bound", node) == [0, 0]
    if policy == "spread":
        _, result = await place(api, extender, device_pod("loose", asked), names)
        assert result["NodeNames"] == ["a1"], result
        assert sorted(numa_of(api, app, "loose", node)) == [0, 1]
    assert_books_balance(app)


async def test_numa_bind_refuses_a_node_with_no_numa_node_holding_all_the_gpus(api, app, extender):
    node = amd_node("a1", devices=4)
    ids = [d["id"] for d in registered(node)]
    names = await register_nodes(api, app, node)
    occupy(api, "a1", ids[0], "full0")
    occupy(api, "a1", ids[2], "full2")
    await wait_until(lambda: [u[1] for u in usage(app, "a1")] == [196608, 0, 196608, 0], "GPUs 0 and 2 charged")
    asked = {COUNT: "2", MEM: "1024", CORES: "10"}
    _, result = await place(api, extender, device_pod("bound", asked, annotations={"amd.com/numa-bind": "t"}), names)
    assert result["NodeNames"] is None and "NumaNotFit" in result["FailedNodes"]["a1"], result
    _, result = await place(api, extender, device_pod("loose", asked, annotations={"amd.com/numa-bind": "no"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert_books_balance(app)


async def test_namespace_quota_on_amd_memory_holds_device_by_device(api, app, extender):
    """Two models on one node; the quota (70000 MiB) holds half of the MI210 (32768) but not half
    of the MI300X (98304): the MI300X, which spread would try first, is passed over."""
    entries = [{"id": "GPU-big", "index": 0, "count": 4, "devmem": 196608, "devcore": 304, "type": "AMD-MI300X",
                "health": True},
               {"id": "GPU-small", "index": 1, "count": 4, "devmem": 65536, "devcore": 104, "type": "AMD-MI210",
                "health": True}]
    names = await register_nodes(api, app, amd_node("a1", register=orjson.dumps(entries).decode()))
    await create_quota(api, app, {f"limits.{MEM}": "70000"}, namespace="default")
    _, result = await place(api, extender, device_pod("half", {COUNT: "1", PCT: "50", CORES: "10"}), names)
    assert result["NodeNames"] == ["a1"], result
    assert decision_annotations(api, app, "half")["hami.io/amd-devices-allocated"].startswith("GPU-small,")
    # 32768 used: another half of the MI210 is 65536 > 70000 in all; a fixed 30000 MiB still fits.
    _, result = await place(api, extender, device_pod("again", {COUNT: "1", PCT: "50", CORES: "10"}), names)
    assert result["NodeNames"] is None and "ResourceQuotaNotFit" in result["FailedNodes"]["a1"], result
    _, result = await place(api, extender, device_pod("fixed", {COUNT: "1", MEM: "30000", CORES: "10"}), names)
    assert result["NodeNames"] == ["a1"], result
    _, result = await place(api, extender, device_pod("more", {COUNT: "1", MEM: "8000", CORES: "10"}), names)
    assert result["FailedNodes"] == {"a1": "2/2 ResourceQuotaNotFit"}, result
    assert_books_balance(app)


def rdna_node(name, *, cu_per_wgp=2):
    """A node with one RDNA GPU of 32 CUs as HAMi's AMD device plugin registers it: the WGP size in
    ``custominfo`` (``cu_per_wgp=None``: a registration without it, as from an older plugin)."""
    entry = {"id": f"GPU-{name}", "index": 0, "count": 4, "devmem": 16304, "devcore": 32, "type": "AMDGPU",
             "health": True, "custominfo": {"pciBDF": "0000:03:00.0"}}
    if cu_per_wgp is not None:
        entry["custominfo"]["cuPerWGP"] = cu_per_wgp
    return amd_node(name, register=orjson.dumps([entry]).decode())


@pytest.mark.parametrize("cu_per_wgp, charged", [(2, [16, 16]), (None, [16, 15])])
async def test_on_rdna_the_books_charge_whole_wgps(api, app, extender, cu_per_wgp, charged):
    """HAMi after v2.10 (#3174): on a GPU publishing ``cuPerWGP`` a share that is not whole WGPs is
    charged, annotated and fitted rounded up (47 % of 32 CUs: 15, so 16), as the plugin masks it;
    a node without the WGP size keeps the unrounded count, where 1 % more still fits."""
    names = await register_nodes(api, app, rdna_node("r1", cu_per_wgp=cu_per_wgp))
    for name, percent in (("half", "50"), ("most", "47")):
        pod, result = await place(api, extender, device_pod(name, {COUNT: "1", MEM: "1024", CORES: percent}), names)
        assert result["NodeNames"] == ["r1"], result
        await bind_placed(api, app, extender, pod, result)
    assert [decision_annotations(api, app, n)["hami.io/amd-devices-allocated"] for n in ("half", "most")] == \
        [f"GPU-r1,AMDGPU,1024,{cores}:;" for cores in charged]
    assert usage(app, "r1") == [(2, 2048, sum(charged))]
    _, result = await place(api, extender, device_pod("one", {COUNT: "1", MEM: "1024", CORES: "1"}), names)
    if cu_per_wgp:
        assert result["FailedNodes"] == {"r1": "1/1 CardInsufficientCore"}, result       # a WGP is 2 CUs
    else:
        assert result["NodeNames"] == ["r1"], result
    assert_books_balance(app)
    # The charge is the annotation's: a pod placed elsewhere is charged what it says, unrounded.
    api.delete("pods", "most", namespace="default")
    await wait_until(lambda: usage(app, "r1")[0][2] == 16 + (0 if cu_per_wgp else 1), "most released")
    pod = device_pod("legacy", {COUNT: "1", MEM: "1024", CORES: "47"}, annotations={
        "hami.io/vgpu-node": "r1", "hami.io/amd-devices-allocated": "GPU-r1,AMDGPU,1024,15:;"})
    pod["spec"]["nodeName"] = "r1"
    api.create("pods", pod)
    await wait_until(lambda: usage(app, "r1")[0][2] == 31 + (0 if cu_per_wgp else 1), "charged from the annotation")
    assert_books_balance(app)

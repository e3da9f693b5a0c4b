"""Mthreads sGPUs: capacity inventory, per-device division of a request, the webhook's legal
sizes, the same-device rule, the annotations Mthreads' device plugin reads, placement."""
from __future__ import annotations

import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import mthreads
from hami_py.devices.base import FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, NodeView, RequestError
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.mthreads import MthreadsConfig, same_device_chooser
from hami_py.devices.registry import build_vendors, managed_resource_names
from hami_py.embedded import running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.families import find_device_model
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.reasons import CARD_NOT_FOUND_CUSTOM_FILTER_RULE, CARD_UUID_MISMATCH, OK
from tests.conftest import (
    container as ctr,
    assert_books_balance, bind_placed, create_quota, decision_annotations, device_pod, place, register_nodes,
    wait_until,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
MT = VENDORS["Mthreads"]
S4000 = find_device_model("S4000")

COUNT, MEMORY, CORES = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"


def view(cores="64", memory="384", name="m1") -> NodeView:
    capacity = {"cpu": "64"}
    if cores is not None:
        capacity[CORES] = cores
    if memory is not None:
        capacity[MEMORY] = memory
    return NodeView.of({}, name=name, capacity=capacity)


def request(limits=None, requests=None):
    return MT.container_request(ctr(limits, requests), pod_annotations={})


# -- inventory ---------------------------------------------------------------------------------------

def test_devices_come_from_the_core_and_memory_capacity():
    devices = MT.parse_node_devices(view("64", "384"))      # 4 GPUs, 96 units (48 GiB) each
    assert [d.id for d in devices] == [f"m1-mthreads-{i}" for i in range(4)]
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert {(d.count, d.devmem, d.devcore, d.type, d.health) for d in devices} == {(100, 49152, 16, "Mthreads", True)}
    # A remainder of cores is one more device; memory is split over the cores, floored.
    odd = MT.parse_node_devices(view("20", "10"))
    assert len(odd) == 2 and {d.devmem for d in odd} == {10 * 512 * 16 // 20}
    assert MT.parse_node_devices(view("32", None))[0].devmem == 0     # no memory capacity: 0 MiB
    assert MT.parse_node_devices(view(None, "384")) == []
    assert MT.parse_node_devices(view("0", "384")) == []
    assert MT.registration_inputs(view("64")) != MT.registration_inputs(view("64", "192"))
    assert MT.kernel_flags == FLAG_CHOOSE and not MT.uses_node_lock and MT.handshake_annotation is None


@pytest.mark.parametrize("cores, memory, message", [
    ("1.5", "10", "mthreads.com/sgpu-core '1.5' is not a whole number"),
    ("-16", "10", "mthreads.com/sgpu-core '-16' is out of range: must be between 0 and 16384"),
    ("99999", "10", "mthreads.com/sgpu-core '99999' is out of range: must be between 0 and 16384"),
    ("16", "lots", "mthreads.com/sgpu-memory 'lots' is not a whole number"),
    ("16", "-1", "mthreads.com/sgpu-memory '-1' is out of range: must be between 0 and 2147483647"),
    ("16", "2147483647", "mthreads.com/sgpu-memory '2147483647' gives 1099511627264 MiB a device over 16 cores, "
                         "beyond int32"),
])
def test_a_garbled_capacity_is_refused_precisely(cores, memory, message):
    with pytest.raises(DeviceDecodeError) as err:
        MT.parse_node_devices(view(cores, memory))
    assert str(err.value) == message
    assert MT.registration_source() == "mthreads.com/sgpu-core capacity"


# -- requests ----------------------------------------------------------------------------------------

def test_memory_is_in_units_of_512_mib_and_memory_and_cores_are_divided_by_the_count():
    assert request({COUNT: "1", MEMORY: "8", CORES: "4"}) == ContainerRequest("Mthreads", 1, 4096, 0, 4)
    assert request({COUNT: "2", MEMORY: "192", CORES: "32"}) == ContainerRequest("Mthreads", 2, 49152, 0, 16)
    assert request({COUNT: "3", MEMORY: "8", CORES: "6"}) == ContainerRequest("Mthreads", 3, 4096 // 3, 0, 2)
    # No memory: the whole device (mempct 100); cores default to 0 (the webhook sets them).
    assert request({COUNT: "1"}) == ContainerRequest("Mthreads", 1, 0, 100, 0)
    # Limits first, then requests, for each resource.
    assert request({COUNT: "1"}, {MEMORY: "4", CORES: "2"}) == ContainerRequest("Mthreads", 1, 2048, 0, 2)
    assert request(requests={COUNT: "1", MEMORY: "2"}).memreq == 1024
    assert request({COUNT: "0"}) is None and request({"cpu": "1"}) is None


@pytest.mark.parametrize("limits, message", [
    ({COUNT: "1.5"}, "invalid mthreads.com/vgpu request in container main: device count 1.5 is not a plain integer"),
    ({COUNT: "-1"}, "invalid mthreads.com/vgpu request in container main: device count -1 is out of range"),
    ({COUNT: "1", MEMORY: "4194304"}, 'container "main": mthreads.com/sgpu-memory "4194304" is out of range: '
                                      'must be between 0 and 4194303 units of 512 MiB'),
    ({COUNT: "1", MEMORY: "0.5"}, 'container "main": mthreads.com/sgpu-memory "0.5" is not a whole number of '
                                  'units of 512 MiB'),
    ({COUNT: "1", CORES: "x"},
     "invalid mthreads.com/sgpu-core value x in container main: must be an integer between 0 and 2147483647"),
    # HAMi after v2.10 (#2994): the total must divide evenly by the count, and a GPU's part is <= 100
    ({COUNT: "3", CORES: "5"},
     "invalid mthreads.com/sgpu-core value 5 in container main: 5 does not divide evenly across 3 devices"),
    ({COUNT: "2", CORES: "202"},
     "invalid mthreads.com/sgpu-core value 202 in container main: 101 a device, must be an integer between 0 and 100"),
    ({COUNT: "1", CORES: "150"},
     "invalid mthreads.com/sgpu-core value 150 in container main: 150 a device, must be an integer between 0 and 100"),
])
def test_a_malformed_request_is_refused_naming_container_resource_and_value(limits, message):
    with pytest.raises(RequestError) as err:
        request(limits)
    assert str(err.value) == message


def test_uuid_selection_uses_mthreads_ai_annotations():
    from hami_py.devices.base import DeviceInfo
    dev = [DeviceInfo(id=f"m1-mthreads-{i}", index=i, count=100, devmem=1, devcore=16, type="Mthreads")
           for i in range(3)]
    assert MT.device_selector({}, {}) is None
    select = MT.device_selector({"mthreads.ai/use-gpuuuid": "m1-mthreads-1"}, {})
    assert [select(d) for d in dev] == [CARD_UUID_MISMATCH, OK, CARD_UUID_MISMATCH]
    select = MT.device_selector({"mthreads.ai/nouse-gpuuuid": "m1-mthreads-0, m1-mthreads-2"}, {})
    assert [select(d) for d in dev] == [CARD_UUID_MISMATCH, OK, CARD_UUID_MISMATCH]


# -- webhook -----------------------------------------------------------------------------------------

def test_webhook_defaults_a_one_gpu_container_without_memory():
    c = ctr({COUNT: "1", CORES: "8"})
    assert MT.mutate_admission(c, {}) is True
    assert c["resources"]["limits"] == {COUNT: "1", CORES: "16", MEMORY: "96"}   # cores overwritten too
    c = ctr(requests={COUNT: "1"})                                             # the count from requests
    assert MT.mutate_admission(c, {}) is True and c["resources"]["limits"] == {CORES: "16", MEMORY: "96"}
    assert MT.mutate_admission(ctr({"cpu": "1"}), {}) is False


@pytest.mark.parametrize("memory", ["2", "4", "8", "16", "32", "64", "96"])
def test_webhook_accepts_each_legal_memory_size(memory):
    c = ctr({COUNT: "1", MEMORY: memory, CORES: "4"})
    assert MT.mutate_admission(c, {}) is True
    assert c["resources"]["limits"] == {COUNT: "1", MEMORY: memory, CORES: "4"}     # left as asked


@pytest.mark.parametrize("memory", ["3", "1", "128", "2Gi", "0.5"])
def test_webhook_refuses_other_memory_sizes_with_the_legal_ones(memory):
    with pytest.raises(RequestError) as err:
        MT.mutate_admission(ctr({COUNT: "1", MEMORY: memory}), {})
    assert str(err.value) == (f'container "main": mthreads.com/sgpu-memory "{memory}" is invalid: sGPU memory request '
                              'value is invalid, valid values are [2, 4, 8, 16, 32, 64, 96]')


def test_webhook_sizes_a_multi_gpu_container_and_annotates_the_pod():
    """HAMi after v2.10 (#2988): 16 cores a GPU, and no fixed memory any more (each GPU is charged
    the whole card of the node chosen, whatever its size); memory written by the user stays."""
    pod = {"metadata": {"name": "p"}}
    c = ctr({COUNT: "3", CORES: "1"})
    assert MT.mutate_admission(c, pod) is True
    assert c["resources"]["limits"] == {COUNT: "3", CORES: "48"}
    assert pod["metadata"]["annotations"] == {"mthreads.com/request-gpu-num": "3"}
    c = ctr({COUNT: "2", MEMORY: "192"})
    assert MT.mutate_admission(c, pod) is True and c["resources"]["limits"] == {COUNT: "2", MEMORY: "192", CORES: "32"}


@pytest.mark.parametrize("count", ["0", "-1"])
def test_webhook_refuses_a_count_below_one(count):
    with pytest.raises(RequestError) as err:
        MT.mutate_admission(ctr({COUNT: count}), {})
    assert str(err.value) == f'container "main": mthreads.com/vgpu "{count}" must be greater than 0'


def test_webhook_review_patches_defaults_and_the_annotation_and_refuses_illegal_sizes():
    response, patched = admit(make_pod(container(limits={COUNT: "2"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["spec"]["containers"][0]["resources"]["limits"] == {COUNT: "2", CORES: "32"}
    assert patched["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    response, _ = admit(make_pod(container(limits={COUNT: "1", MEMORY: "7"})))
    assert not response["allowed"] and response["status"]["code"] == 403     # denied, never a 500
    assert "valid values are [2, 4, 8, 16, 32, 64, 96]" in response["status"]["message"]
    assert COUNT in managed_resource_names(VENDORS)


# -- the same-device rule ---------------------------------------------------------------------------

class FakeCache:
    def __init__(self, devices):
        self.devices = devices

    def devices_at(self, node_index):
        return self.devices


def test_chooser_keeps_a_pods_later_containers_on_the_device_its_first_got():
    devices = MT.parse_node_devices(view("64"))
    choose = same_device_chooser(FakeCache(devices))
    assert choose(0, [2, 0, 1], 1) == ([2], 0.0)           # the first container: the first fitting
    assert choose(0, [0, 1, 2], 1) == ([2], 0.0)           # the next: the same device, not position 0
    assert choose(0, [0, 1], 1) == CARD_NOT_FOUND_CUSTOM_FILTER_RULE    # that device no longer fits
    assert choose(0, [0, 1, 2], 2) == CARD_NOT_FOUND_CUSTOM_FILTER_RULE  # two devices cannot both be it
    # Per node: another node starts afresh.
    assert choose(1, [1, 3], 1) == ([1], 0.0)
    # A first container given two devices: no later container can be on "the" same device.
    choose = same_device_chooser(FakeCache(devices))
    assert choose(0, [0, 1, 2], 2) == ([0, 1], 0.0)
    assert choose(0, [0, 1, 2], 1) == CARD_NOT_FOUND_CUSTOM_FILTER_RULE


def test_chooser_holds_init_and_app_containers_to_their_own_earlier_devices():
    devices = MT.parse_node_devices(view("64"))
    choose = same_device_chooser(FakeCache(devices), [True, True, False, False])
    assert choose(0, [3, 1], 1) == ([3], 0.0)              # init container 1
    assert choose(0, [1, 3], 1) == ([3], 0.0)              # init container 2: init 1's device
    assert choose(0, [1, 2], 1) == ([1], 0.0)              # app container 1: free of the init ones
    assert choose(0, [2, 1, 3], 1) == ([1], 0.0)           # app container 2: app 1's device


# -- annotations -------------------------------------------------------------------------------------

def test_annotations_are_upstreams_and_what_the_plugin_reads():
    dev = ContainerDevice("m1-mthreads-2", "Mthreads", 4096, 4)
    out = MT.encode_allocation([[], [dev]], node="m1", now=1767225600.25)
    assert out == {"hami.io/mthreads-vgpu-devices-allocated": ";m1-mthreads-2,Mthreads,4096,4:;",
                   "mthreads.com/gpu-index": "2",
                   "mthreads.com/predicate-time": "1767225600250000000",
                   "mthreads.com/predicate-node": "m1"}
    two = MT.encode_allocation([[ContainerDevice("m1-mthreads-0", "Mthreads", 1, 1),
                                 ContainerDevice("m1-mthreads-3", "Mthreads", 1, 1)]], node="m1", now=1.0)
    assert two["mthreads.com/gpu-index"] == "0,3"
    assert "hami.io/mthreads-vgpu-devices-to-allocate" not in out        # upstream never writes it
    assert MT.encode_allocation([[], []]) == {}
    assert set(MT.decision_annotations()) == set(out)
    assert MT.decode_allocation(out) == [[], [dev]]


def test_config_section_keys_and_errors():
    assert MthreadsConfig.from_section(Section.of("mthreads", None)) == MthreadsConfig()
    with pytest.raises(ConfigError) as err:
        MthreadsConfig.from_section(Section.of("mthreads", {"resourceCoreName": 16}))
    assert str(err.value) == 'device config: mthreads.resourceCoreName: expected a string, got integer "16"'
    [vendor] = mthreads.build_family(DeviceConfig(sections={}), None)
    assert vendor.resource_names() == []
    [renamed] = mthreads.build_family(DeviceConfig(sections={"mthreads": {
        "resourceCountName": "a/n", "resourceMemoryName": "a/m", "resourceCoreName": "a/c"}}), None)
    assert renamed.resource_names() == ["a/n", "a/m", "a/c"]


# -- end to end --------------------------------------------------------------------------------------

def mt_node(name, *, gpus=4, with_nvidia=0, cores=None):
    node = S4000.node(name, devices=gpus)
    if cores is not None:
        node["status"]["capacity"][CORES] = node["status"]["allocatable"][CORES] = cores
    if with_nvidia:
        nv = gpu_node(name, gpus=with_nvidia)
        node["metadata"]["annotations"].update(nv["metadata"]["annotations"])
        for part in ("capacity", "allocatable"):
            node["status"][part].update(nv["status"][part])
    return node


async def test_an_sgpu_pod_is_filtered_bound_and_annotated(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1", gpus=2), gpu_node("g1", gpus=1))
    pod, result = await place(api, extender, device_pod("s", {COUNT: "1", MEMORY: "32", CORES: "4"}), names)
    assert result["NodeNames"] == ["m1"], result
    ann = decision_annotations(api, app, "s")
    [[dev]] = decode_pod_devices(ann["hami.io/mthreads-vgpu-devices-allocated"])
    assert (dev.type, dev.usedmem, dev.usedcores) == ("Mthreads", 32 * 512, 4)
    assert ann["mthreads.com/gpu-index"] == dev.uuid.rsplit("-", 1)[1]
    assert ann["mthreads.com/predicate-node"] == "m1" and int(ann["mthreads.com/predicate-time"]) > 10**18
    stored = await bind_placed(api, app, extender, pod, result)
    assert stored["metadata"]["annotations"]["mthreads.com/gpu-index"] == ann["mthreads.com/gpu-index"]
    usage = {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage("m1")}
    assert usage[dev.uuid] == (1, 16384, 4)
    assert_books_balance(app)


async def test_a_two_gpu_container_gets_each_gpu_half_of_its_request(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1", gpus=4))
    pod, result = await place(api, extender, device_pod("pair", {COUNT: "2", MEMORY: "192", CORES: "32"}), names)
    assert result["NodeNames"] == ["m1"], result
    ann = decision_annotations(api, app, "pair")
    [given] = decode_pod_devices(ann["hami.io/mthreads-vgpu-devices-allocated"])
    assert len({d.uuid for d in given}) == 2 and {(d.usedmem, d.usedcores) for d in given} == {(49152, 16)}
    assert ann["mthreads.com/gpu-index"] == ",".join(d.uuid.rsplit("-", 1)[1] for d in given)
    assert "hami.io/mthreads-vgpu-devices-to-allocate" not in ann
    await bind_placed(api, app, extender, pod, result)
    assert_books_balance(app)


async def test_all_of_a_pods_containers_share_one_gpu(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1", gpus=4))
    pod = device_pod("team", {COUNT: "1", MEMORY: "8", CORES: "4"})
    pod["spec"]["containers"] += [{"name": f"c{i}", "image": "x", "resources": {"limits": {
        COUNT: "1", MEMORY: "8", CORES: "4"}}} for i in range(2)]
    pod, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["m1"], result
    slots = decode_pod_devices(decision_annotations(api, app, "team")["hami.io/mthreads-vgpu-devices-allocated"])
    assert [len(s) for s in slots] == [1, 1, 1] and len({s[0].uuid for s in slots}) == 1
    await bind_placed(api, app, extender, pod, result)
    [shared] = [d for d in app.cache.device_usage("m1") if d["used"]]
    assert (shared["used"], shared["usedmem"], shared["usedcores"]) == (3, 3 * 4096, 12)
    assert_books_balance(app)


async def test_a_later_container_that_does_not_fit_the_first_ones_gpu_fails_the_node(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1", gpus=2))
    pod = device_pod("split", {COUNT: "1", MEMORY: "64", CORES: "4"})
    pod["spec"]["containers"].append({"name": "second", "image": "x", "resources": {"limits": {
        COUNT: "1", MEMORY: "64", CORES: "4"}}})     # 64 + 64 units > one GPU's 96: needs another GPU
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] is None
    assert "CardNotFoundCustomFilterRule" in result["FailedNodes"]["m1"], result


async def test_a_garbled_capacity_is_refused_while_the_nodes_gpus_work(api, app, extender):
    names = await register_nodes(api, app, mt_node("mixed", cores="sixteen", with_nvidia=1))
    assert app.cache.nodes["mixed"].decode_error == \
        "mthreads.com/sgpu-core capacity: mthreads.com/sgpu-core 'sixteen' is not a whole number"
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result
    _, result = await place(api, extender, device_pod("s", {COUNT: "1", MEMORY: "2"}), names)
    assert result["NodeNames"] is None


async def test_a_malformed_request_is_refused_with_its_value(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1"))
    _, result = await place(api, extender, device_pod("bad", {COUNT: "1", MEMORY: "2.5"}), names)
    assert result["NodeNames"] is None
    assert result["Error"] == ('pod default/bad: container "main": mthreads.com/sgpu-memory "2.5" is not a whole '
                               'number of units of 512 MiB')


async def test_an_upstream_placed_pod_is_charged_from_its_annotation(api, app, extender):
    names = await register_nodes(api, app, mt_node("m1"))
    pod = device_pod("legacy", {COUNT: "1", MEMORY: "16"}, annotations={
        "hami.io/vgpu-node": "m1", "hami.io/mthreads-vgpu-devices-allocated": "m1-mthreads-1,Mthreads,8192,16:;",
        "mthreads.com/gpu-index": "1"})
    pod["spec"]["nodeName"] = "m1"
    pod["status"]["phase"] = "Running"
    api.create("pods", pod)
    await wait_until(lambda: {d["id"]: d["used"] for d in app.cache.device_usage("m1")}.get("m1-mthreads-1") == 1,
                     "the upstream allocation charged")
    usage = {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage("m1")}
    assert usage["m1-mthreads-1"] == (1, 8192, 16)
    # Its 16 cores are all of that GPU's: a pod asking 0 cores cannot join it (CardComputeUnitsExhausted).
    _, result = await place(api, extender, device_pod("more", {COUNT: "1", MEMORY: "2"},
                                                      annotations={"mthreads.ai/use-gpuuuid": "m1-mthreads-1"}), names)
    assert result["NodeNames"] is None and "CardComputeUnitsExhausted" in result["FailedNodes"]["m1"]
    assert_books_balance(app)


async def test_namespace_quota_on_sgpu_memory_and_cores_is_enforced(api, app, extender):
    assert MT.quota_resources() == (MEMORY, CORES, 512)
    names = await register_nodes(api, app, mt_node("m1", gpus=4))
    await create_quota(api, app, {f"limits.{MEMORY}": "64", f"limits.{CORES}": "20"}, namespace="default")
    _, result = await place(api, extender, device_pod("first", {COUNT: "1", MEMORY: "32", CORES: "4"}), names)
    assert result["NodeNames"] == ["m1"], result
    _, result = await place(api, extender, device_pod("cores", {COUNT: "1", MEMORY: "2", CORES: "17"}), names)
    assert result["NodeNames"] is None and result["FailedNodes"] == {"m1": "4/4 ResourceQuotaNotFit"}   # 4 + 17 > 20
    _, result = await place(api, extender, device_pod("second", {COUNT: "1", MEMORY: "32", CORES: "4"}), names)
    assert result["NodeNames"] == ["m1"], result      # 2 x 32 units = the 64 units (32768 MiB) allowed
    _, result = await place(api, extender, device_pod("third", {COUNT: "1", MEMORY: "2", CORES: "1"}), names)
    assert result["NodeNames"] is None and result["FailedNodes"] == {"m1": "4/4 ResourceQuotaNotFit"}
    assert_books_balance(app)


def test_the_webhook_denies_a_pod_over_its_namespace_quota():
    asked = []

    def fit_quota(namespace, vendor, memory, cores):
        asked.append((namespace, vendor, memory, cores))
        return memory <= 16384 and cores <= 16

    # Two whole GPUs: their memory is the chosen node's (the filter checks it), their cores 2 x 16.
    response, _ = admit(make_pod(container(limits={COUNT: "2"})), fit_quota=fit_quota)
    assert not response["allowed"] and asked == [("team-a", "Mthreads", 0, 32)]
    response, _ = admit(make_pod(container(limits={COUNT: "1", MEMORY: "32", CORES: "4"})), fit_quota=fit_quota)
    assert response["allowed"] and asked[-1] == ("team-a", "Mthreads", 32 * 512, 4)


async def test_app_containers_need_not_share_the_init_containers_gpu(api, app, extender):
    """Upstream fits init containers and app containers in separate passes: the same-device rule
    holds within each. Here the init container fits only GPU 0 (memory) and the app container
    only GPU 1 (cores)."""
    names = await register_nodes(api, app, mt_node("m1", gpus=2))
    for i, (mem, cores) in enumerate(((1024, 12), (40960, 0))):
        pod = device_pod(f"busy{i}", {COUNT: "1"}, annotations={
            "hami.io/vgpu-node": "m1", "hami.io/mthreads-vgpu-devices-allocated": f"m1-mthreads-{i},Mthreads,{mem},{cores}:;"})
        pod["spec"]["nodeName"] = "m1"
        pod["status"]["phase"] = "Running"
        api.create("pods", pod)
    await wait_until(lambda: all(d["used"] == 1 for d in app.cache.device_usage("m1")), "the running pods charged")
    pod = device_pod("staged", {COUNT: "1", MEMORY: "2", CORES: "8"})
    pod["spec"]["initContainers"] = [{"name": "prep", "image": "x", "resources": {"limits": {
        COUNT: "1", MEMORY: "64", CORES: "2"}}}]
    pod, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["m1"], result
    slots = decode_pod_devices(decision_annotations(api, app, "staged")["hami.io/mthreads-vgpu-devices-allocated"])
    assert [[d.uuid for d in s] for s in slots] == [["m1-mthreads-0"], ["m1-mthreads-1"]]
    await bind_placed(api, app, extender, pod, result)
    assert_books_balance(app)


# -- HAMi after v2.10 (#2988): card sizes, whole cards beside slices, physical card ids ---------------

def mt_vendor(memory_per_card):
    return build_vendors(DeviceConfig(sections={"mthreads": {
        "resourceCountName": COUNT, "resourceMemoryName": MEMORY, "resourceCoreName": CORES,
        "memoryPerCard": memory_per_card}}))["Mthreads"]


def test_memory_per_card_is_a_list_a_scalar_is_wrapped_and_bad_sizes_stop_the_scheduler():
    read = lambda value: MthreadsConfig.from_section(Section.of("mthreads", {"memoryPerCard": value}))  # noqa: E731
    assert MthreadsConfig().memory_per_card == read(None).memory_per_card == read([]).memory_per_card == (96,)
    assert read(160).memory_per_card == (160,) and read([96, 160]).memory_per_card == (96, 160)
    assert MT.config.memory_per_card == (96,)       # the chart's default
    with pytest.raises(ConfigError) as err:
        read(["lots"])
    assert str(err.value) == 'device config: mthreads.memoryPerCard[0]: expected an integer, got string "lots"'
    with pytest.raises(ConfigError) as err:
        mt_vendor([96, 0])
    assert "mthreads: memoryPerCard 0 is out of range: a card's memory in 512 MiB units must be between 1 and " \
        "4194303" in str(err.value)


def test_the_legal_memory_sizes_are_the_union_over_the_card_sizes():
    assert mthreads.legal_memory([96]) == (2, 4, 8, 16, 32, 64, 96)
    assert mthreads.legal_memory([96, 160]) == (2, 4, 8, 16, 32, 64, 96, 128, 160)
    mixed = mt_vendor([96, 160])
    for memory in ("96", "128", "160"):
        assert mixed.mutate_admission(ctr({COUNT: "1", MEMORY: memory}), {}) is True
    with pytest.raises(RequestError) as err:
        mixed.mutate_admission(ctr({COUNT: "1", MEMORY: "100"}), {})
    assert str(err.value).endswith("valid values are [2, 4, 8, 16, 32, 64, 96, 128, 160]")
    with pytest.raises(RequestError):
        MT.mutate_admission(ctr({COUNT: "1", MEMORY: "128"}), {})      # no S5000 configured


def test_one_gpu_without_memory_gets_the_card_size_only_when_one_is_configured():
    c = ctr({COUNT: "1"})
    assert mt_vendor(160).mutate_admission(c, {})
    assert c["resources"]["limits"] == {COUNT: "1", CORES: "16", MEMORY: "160"}
    c = ctr({COUNT: "1"})
    assert mt_vendor([96, 160]).mutate_admission(c, {}) and c["resources"]["limits"] == {COUNT: "1", CORES: "16"}
    request = mt_vendor([96, 160]).container_request(c, pod_annotations={})
    assert (request.memreq, request.mempct) == (0, 100)     # the whole card of the node chosen


@pytest.mark.parametrize("limits, requests", [
    ({"mthreads.com/gpu": "1", COUNT: "1"}, None),
    ({"mthreads.com/gpu": "1"}, {MEMORY: "8"}),            # split over limits and requests
    ({CORES: "4"}, {"mthreads.com/gpu": "1"}),
])
def test_the_webhook_refuses_a_whole_card_beside_sgpu_slices(limits, requests):
    with pytest.raises(RequestError) as err:
        MT.mutate_admission(ctr(limits, requests), {})
    assert str(err.value) == ('container "main": cannot mix mthreads.com/gpu (whole card, delivered outside HAMi) '
                              'with mthreads.com/vgpu/mthreads.com/sgpu-memory/mthreads.com/sgpu-core (sGPU slices) '
                              'in the same container')
    response, _ = admit(make_pod(container(limits=limits, requests=requests)))
    assert not response["allowed"] and response["status"]["code"] == 403
    assert response["status"]["message"] == str(err.value)


def test_a_whole_card_alone_or_in_another_container_is_not_refused():
    assert MT.mutate_admission(ctr({"mthreads.com/gpu": "2"}), {}) is False
    response, patched = admit(make_pod(container("whole", limits={"mthreads.com/gpu": "1"}),
                                       container("sliced", limits={COUNT: "1", MEMORY: "8"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


def labelled(label, cores="48", memory="288"):
    node = view(cores=cores, memory=memory)
    return NodeView.of({}, name="m1", capacity=node.capacity, labels={"mthreads.com/sgpu.cores": label})


def test_card_ids_come_from_the_sgpu_cores_label():
    devices = MT.parse_node_devices(labelled("0-2-3"))
    assert [(d.id, d.index, d.devmem) for d in devices] == [
        ("m1-mthreads-0", 0, 49152), ("m1-mthreads-2", 2, 49152), ("m1-mthreads-3", 3, 49152)]
    assert [d.index for d in MT.parse_node_devices(labelled("1,3", cores="32"))] == [1, 3]
    assert [d.index for d in MT.parse_node_devices(labelled("", cores="32"))] == [0, 1]     # no label: 0..N-1
    # The label is part of the inputs: a rebinding is decoded again.
    assert MT.registration_inputs(labelled("0-1", cores="32")) != MT.registration_inputs(labelled("2-3", cores="32"))


@pytest.mark.parametrize("label, cores, message", [
    ("0-2", "48", 'sgpu capacity mismatch on m1: label mthreads.com/sgpu.cores "0-2" lists 2 cards (32 cores) but '
                  'mthreads.com/sgpu-core capacity is 48'),
    ("0-1-2", "0", 'sgpu capacity mismatch on m1: label mthreads.com/sgpu.cores "0-1-2" lists 3 cards (48 cores) but '
                   'mthreads.com/sgpu-core capacity is 0'),
    ("0-x-3", "48", 'label mthreads.com/sgpu.cores "0-x-3": card id "x" is not a whole number between 0 and '
                    '2147483647'),
    ("1-1-3", "48", 'label mthreads.com/sgpu.cores "1-1-3": card 1 is listed twice'),
])
def test_a_label_that_does_not_match_the_capacity_is_refused_precisely(label, cores, message):
    with pytest.raises(DeviceDecodeError) as err:
        MT.parse_node_devices(labelled(label, cores=cores))
    assert str(err.value) == message


async def test_the_plugin_is_told_the_physical_card_ids_of_the_label(api, app, extender):
    node = mt_node("m1", gpus=2)
    node["metadata"]["labels"]["mthreads.com/sgpu.cores"] = "1-3"
    names = await register_nodes(api, app, node)
    assert [d["id"] for d in app.cache.device_usage("m1")] == ["m1-mthreads-1", "m1-mthreads-3"]
    pod, result = await place(api, extender, device_pod("both", {COUNT: "2", CORES: "32"}), names)
    assert result["NodeNames"] == ["m1"], result
    ann = decision_annotations(api, app, "both")
    assert sorted(ann["mthreads.com/gpu-index"].split(",")) == ["1", "3"]
    [given] = decode_pod_devices(ann["hami.io/mthreads-vgpu-devices-allocated"])
    assert {(d.usedmem, d.usedcores) for d in given} == {(49152, 16)}    # whole cards: no memory was asked
    await bind_placed(api, app, extender, pod, result)
    assert_books_balance(app)


async def test_a_node_whose_label_disagrees_with_its_capacity_serves_no_sgpu(api, app, extender):
    node = mt_node("m1", gpus=2, with_nvidia=1)
    node["metadata"]["labels"]["mthreads.com/sgpu.cores"] = "0-1-2"
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["m1"].decode_error == (
        'mthreads.com/sgpu-core capacity: sgpu capacity mismatch on m1: label mthreads.com/sgpu.cores "0-1-2" lists '
        '3 cards (48 cores) but mthreads.com/sgpu-core capacity is 32')
    _, result = await place(api, extender, device_pod("s", {COUNT: "1", MEMORY: "8", CORES: "4"}), names)
    assert result["NodeNames"] is None
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["m1"], result
    assert_books_balance(app)


async def test_a_mixed_s4000_and_s5000_cluster_admits_either_size_and_places_it_on_a_card_that_holds_it(api):
    """``memoryPerCard: [96, 160]``: the webhook admits 128 units (legal on an S5000 only) and the
    filter finds the card that holds it; a one-GPU pod without memory gets the whole card of the
    node it lands on."""
    config = DeviceConfig.default()
    config.sections["mthreads"]["memoryPerCard"] = [96, 160]
    s5000 = find_device_model("S5000")
    async with running_scheduler(api, device_config=config) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, S4000.node("s4", devices=1), s5000.node("s5", devices=1))
            assert [d["totalmem"] for n in names for d in app.cache.device_usage(n)] == [49152, 81920]
            response, patched = admit(make_pod(container(limits={COUNT: "1", MEMORY: "128", CORES: "8"}),
                                               namespace="default"), vendors=app.vendors)
            assert response["allowed"], response
            for name, nodes in (("big", names), ("big-on-s4", ["s4"])):
                patched["metadata"]["name"] = name
                _, result = await place(api, extender, patched, nodes)
            assert result["FailedNodes"] == {"s4": "1/1 CardInsufficientMemory"}, result
            assert decision_annotations(api, app, "big")["mthreads.com/predicate-node"] == "s5"
            response, patched = admit(make_pod(container(limits={COUNT: "1"}), namespace="default"),
                                      vendors=app.vendors)
            assert patched["spec"]["containers"][0]["resources"]["limits"] == {COUNT: "1", CORES: "16"}
            patched["metadata"]["name"] = "whole"
            _, result = await place(api, extender, patched, ["s4"])
            assert result["NodeNames"] == ["s4"], result
            allocated = decision_annotations(api, app, "whole")["hami.io/mthreads-vgpu-devices-allocated"]
            [[dev]] = decode_pod_devices(allocated)
            assert (dev.usedmem, dev.usedcores) == (49152, 16)
            assert_books_balance(app)
        finally:
            await extender.close()

"""Hygon HCU and DCU: legacy colon registration, requests (memoryFactor), type and UUID gates,
handshake, webhook, and end to end against the in-repo API server, for both plugin generations
(HAMi after v2.10's HCU names and v2.10's DCU names, served side by side: hami_py/devices/hygon.py).

Fixtures are upstream's (pkg/device/hygon/device_test.go, the feature inventory's reg-legacy,
v-hygon and handshake rows).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import pytest

from hami_py.config import ConfigError, DeviceConfig, Section, parse_device_config
from hami_py.devices.base import ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.hygon import HygonConfig, HygonVendor, build_family
from hami_py.devices.registry import FamilySwitches, build_vendors, managed_resource_names
from hami_py.embedded import embedded_options
from hami_py.k8s.registration import STAMP_FORMAT, is_requesting
from hami_py.reasons import CARD_TYPE_MISMATCH, CARD_UUID_MISMATCH, OK
from tests.conftest import container as any_container, decision_annotations, assert_books_balance, place, register_nodes, wait_until
from tests.test_webhook import admit, container, make_pod


@dataclass(frozen=True)
class Names:
    """Everything one plugin generation reads and writes, spelled out (not taken from the code)."""
    key: str
    count: str
    memory: str
    cores: str
    register: str
    handshake: str
    to_allocate: str
    allocated: str
    use_type: str
    nouse_type: str


HCU = Names("HCU", "hygon.com/hcunum", "hygon.com/hcumem", "hygon.com/hcucores", "hami.io/node-hcu-register",
            "hami.io/node-handshake-hcu", "hami.io/hcu-devices-to-allocate", "hami.io/hcu-devices-allocated",
            "hygon.com/use-hcutype", "hygon.com/nouse-hcutype")
DCU = Names("DCU", "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores", "hami.io/node-dcu-register",
            "hami.io/node-handshake-dcu", "hami.io/dcu-devices-to-allocate", "hami.io/dcu-devices-allocated",
            "hygon.com/use-dcutype", "hygon.com/nouse-dcutype")
BOTH = pytest.mark.parametrize("g", [HCU, DCU], ids=["hcu", "dcu"])

# The DCU generation's names, which the older tests below use throughout.
COUNT, MEMORY, CORES = DCU.count, DCU.memory, DCU.cores
REGISTER, HANDSHAKE, TO_ALLOCATE, ALLOCATED = DCU.register, DCU.handshake, DCU.to_allocate, DCU.allocated


def registration(g: Names = DCU, node: str = "") -> str:
    """Two 64 GiB K100 cards, 4 tasks each, the 9-field form (index and mode), one per NUMA node;
    ids ``<type>-[<node>-]<index>`` (card ids are unique across a cluster)."""
    prefix = f"{g.key}-{node}-" if node else f"{g.key}-"
    return (f"{prefix}0,4,65520,100,{g.key}-K100_AI,0,true,0,hami-core:"
            f"{prefix}1,4,65520,100,{g.key}-K100_AI,1,true,1,hami-core:")


REGISTRATION = registration(DCU)


def vendor(factor: int = 1, g: Names = DCU) -> HygonVendor:
    config = DeviceConfig.default()
    config.sections["hygon"] = {**config.sections["hygon"], "memoryFactor": factor}
    [found] = [v for v in build_family(config, FamilySwitches()) if v.vendor_key == g.key]
    return found


def ctr(limits=None, requests=None, name="main", env=None) -> dict:
    return any_container(limits, requests, name, image="dtk:latest", env=env)


def hygon_node(name: str, g: Names = DCU, *, registration_text: str | None = None,
               handshake: str | None = "Reported 2026-01-01 00:00:00", allocatable: str = "8",
               annotations: dict | None = None) -> dict:
    """A node whose Hygon plugin is of generation ``g`` (its registration, handshake and count)."""
    ann = {g.register: registration_text if registration_text is not None else registration(g, name),
           **(annotations or {})}
    if handshake is not None:
        ann[g.handshake] = handshake
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": ann},
            "status": {"capacity": {g.count: "8", "cpu": "64"}, "allocatable": {g.count: allocatable, "cpu": "64"}}}


def dcu_node(name: str, *, registration: str = REGISTRATION, **kwargs) -> dict:
    return hygon_node(name, DCU, registration_text=registration, **kwargs)


def pod(name: str, *containers: dict, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)}}


# ---------------------------------------------------------------------------------------------
# Inventory (upstream's Test_GetNodeDevices)
# ---------------------------------------------------------------------------------------------

def test_legacy_registration_is_decoded():
    devices = vendor().parse_node_devices(NodeView.of({REGISTER: "test-0,1,1024,100,DCU,0,true,0,test:"}))
    assert devices == [DeviceInfo(id="test-0", index=0, count=1, devmem=1024, devcore=100, type="DCU",
                                  numa=0, mode="test", health=True)]
    # the inventory row's 7-field form: index 0, mode hami-core
    [device] = vendor().parse_node_devices(NodeView.of({REGISTER: "D0,10,8192,100,DCU,0,true:"}))
    assert (device.id, device.count, device.devmem, device.mode) == ("D0", 10, 8192, "hami-core")
    assert vendor().parse_node_devices(NodeView.of({"hami.io/node-nvidia-register": "[]"})) == []


@pytest.mark.parametrize("text,message", [
    (":", "the registration lists no device"),
    ("", "node annotation missing device separator"),
    ("test-0,1,1024,100,DCU:", "unexpected field count 5 in node annotation"),
    ("D0,10,8192,100,DCU,0,true,0:", "unexpected field count 8 in node annotation"),
    ("D0,ten,8192,100,DCU,0,true:", 'invalid count field: strconv.ParseInt: parsing "ten": invalid syntax'),
    ("D0,10,8192,100,DCU,0,yes:", 'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax'),
])
def test_garbled_registration_is_refused_precisely(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        vendor().parse_node_devices(NodeView.of({REGISTER: text}))
    assert str(err.value) == message


def test_handshake_and_liveness_names():
    v = vendor()
    assert (v.register_annotation, v.handshake_annotation, v.count_resource_name) == (REGISTER, HANDSHAKE, COUNT)
    assert v.health_follows_allocatable is False
    assert v.quota_resources() == ("", "", 1)          # upstream's DCU fit checks no quota
    assert v.uses_node_lock is True and v.extra_lock_annotation is None
    assert v.resource_names() == [COUNT, MEMORY, CORES]


# ---------------------------------------------------------------------------------------------
# Requests (upstream's Test_GenerateResourceRequests and the out-of-range tests)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("container,expected", [
    (ctr(limits={COUNT: "1", CORES: "1", MEMORY: "1024"}, requests={COUNT: "1", CORES: "1", MEMORY: "1024"}),
     ContainerRequest("DCU", 1, 1024, 0, 1)),
    (ctr(limits={COUNT: "1"}, requests={COUNT: "1", CORES: "1", MEMORY: "1024"}),
     ContainerRequest("DCU", 1, 1024, 0, 1)),          # limits first, then requests, per resource
    (ctr(limits={COUNT: "1"}, requests={COUNT: "1", CORES: "1"}), ContainerRequest("DCU", 1, 0, 100, 1)),
    (ctr(limits={COUNT: "2"}), ContainerRequest("DCU", 2, 0, 100, 100)),   # cores default 100
])
def test_request_follows_upstreams_rules(container, expected):
    assert vendor().container_request(container, pod_annotations={}) == expected


def test_memory_is_multiplied_by_the_memory_factor():
    v = vendor(factor=1024)
    assert v.container_request(ctr(limits={COUNT: "1", MEMORY: "8"}), pod_annotations={}) == \
        ContainerRequest("DCU", 1, 8192, 0, 100)
    assert v.container_request(ctr(limits={COUNT: "1", MEMORY: "2097151"}), pod_annotations={}).memreq == 2097151 * 1024
    # any spelling of a whole number is one ("1.5Ki" is 1536)
    assert vendor().container_request(ctr(limits={COUNT: "1", MEMORY: "1.5Ki"}), pod_annotations={}).memreq == 1536


@pytest.mark.parametrize("factor,limits,message", [
    (1, {COUNT: "1", MEMORY: "16Gi"},
     f'container "main": {MEMORY} "16Gi" is out of range: must be between 0 and 2147483647 MiB'),
    # upstream: 3000000 fits int32, 3000000 x 1024 does not -> dropped; refused here
    (1024, {COUNT: "1", MEMORY: "3000000"}, f'container "main": {MEMORY} "3000000" is out of range: '
                                            'must be between 0 and 2097151 units of 1024 MiB (memoryFactor)'),
    (1, {COUNT: "2200000000"}, f"invalid {COUNT} request in container main: device count 2200000000 is out of range"),
    (1, {COUNT: "1", CORES: "-1"}, f"invalid {CORES} value -1 in container main: must be an integer between 0 and 100"),
    # upstream v2.10 kept cores up to MaxInt32 (the fit clamped them); after v2.10 they are 0..100
    (1, {COUNT: "1", CORES: "101"}, f"invalid {CORES} value 101 in container main: must be an integer between 0 and 100"),
    # upstream silently treats a fractional memory value as 0 (the whole card)
    (1, {COUNT: "1", MEMORY: "0.5"}, f'container "main": {MEMORY} "0.5" is not a whole number of MiB'),
    (1, {COUNT: "one"}, f"invalid {COUNT} request in container main: device count one is not a plain integer"),
])
def test_malformed_request_is_refused_precisely(factor, limits, message):
    v = vendor(factor=factor)
    with pytest.raises(RequestError) as err:
        v.container_request(ctr(limits=limits), pod_annotations={})
    assert str(err.value) == message


# ---------------------------------------------------------------------------------------------
# Gates (upstream's Test_checkDCUtype table, through the vendor's selector)
# ---------------------------------------------------------------------------------------------

def _device(type_: str, id_: str = "DCU-0") -> DeviceInfo:
    return DeviceInfo(id=id_, index=0, count=4, devmem=65520, devcore=100, type=type_, health=True)


@pytest.mark.parametrize("annotations,card,allowed", [
    ({"hygon.com/use-dcutype": "dcu"}, "dcu", True),
    ({"hygon.com/use-dcutype": "dcu"}, "test", False),
    ({}, "dcu", True),
    ({"hygon.com/use-dcutype": "dcu,test"}, "dcu", True),
    ({"hygon.com/nouse-dcutype": "dcu"}, "dcu", False),
    ({"hygon.com/nouse-dcutype": "test,dcu"}, "test", False),
    ({"hygon.com/nouse-dcutype": "dcu"}, "test", True),
    ({"hygon.com/use-dcutype": ""}, "dcu", True),
    ({"hygon.com/nouse-dcutype": ""}, "dcu", True),
    ({"hygon.com/nouse-dcutype": "   "}, "dcu", True),
    ({"hygon.com/use-dcutype": "k100"}, "DCU-K100_AI", True),     # case-insensitive substring
])
def test_type_gate_is_upstreams(annotations, card, allowed):
    select = vendor().device_selector(annotations, {})
    verdict = OK if select is None else select(_device(card))
    assert verdict == (OK if allowed else CARD_TYPE_MISMATCH)


def test_uuid_gate():
    select = vendor().device_selector({"hygon.com/use-gpuuuid": "DCU-1"}, {})
    assert (select(_device("DCU", "DCU-0")), select(_device("DCU", "DCU-1"))) == (CARD_UUID_MISMATCH, OK)
    select = vendor().device_selector({"hygon.com/nouse-gpuuuid": "DCU-1"}, {})
    assert (select(_device("DCU", "DCU-0")), select(_device("DCU", "DCU-1"))) == (OK, CARD_UUID_MISMATCH)


def test_allocation_annotations_are_the_generic_pair():
    v = vendor()
    out = v.encode_allocation([[ContainerDevice("DCU-0", "DCU", 1024, 30)], []])
    assert out == {TO_ALLOCATE: "DCU-0,DCU,1024,30:;;", ALLOCATED: "DCU-0,DCU,1024,30:;;"}
    assert v.decision_annotations() == (TO_ALLOCATE, ALLOCATED)
    assert v.decode_allocation(out) == [[ContainerDevice("DCU-0", "DCU", 1024, 30)], []]


# ---------------------------------------------------------------------------------------------
# Config and webhook
# ---------------------------------------------------------------------------------------------

def test_config_section():
    assert HygonConfig.from_section(Section.of("hygon", None)) == HygonConfig()
    assert HygonConfig.from_section(Section.of("hygon", {"memoryFactor": 2.0})).memory_factor == 2
    for section, message in [
        ({"memoryFactor": "1024"}, 'device config: hygon.memoryFactor: expected an integer, got string "1024"'),
        ({"memoryFactor": True}, 'device config: hygon.memoryFactor: expected an integer, got boolean "true"'),
        ({"memoryFactor": 1 << 31}, "device config: hygon.memoryFactor: 2147483648 is out of range for int32 (-2147483648..2147483647)"),
        ({"resourceCountName": 7}, 'device config: hygon.resourceCountName: expected a string, got integer "7"'),
        (["hygon.com/dcunum"], "device config: hygon: expected a mapping, got list"),
    ]:
        with pytest.raises(ConfigError) as err:
            HygonConfig.from_section(Section.of("hygon", section))
        assert str(err.value) == message
    # a factor of 0 or below means 1, as upstream multiplies only above 1
    assert vendor(factor=0).container_request(ctr(limits={COUNT: "1", MEMORY: "5"}), pod_annotations={}).memreq == 5


def test_webhook_recognises_a_limited_count_and_refuses_a_malformed_value():
    response, patched = admit(make_pod(container(limits={COUNT: "1", MEMORY: "2048"})))
    assert response["allowed"] is True and patched["spec"]["schedulerName"] == "hami-scheduler"
    response, _ = admit(make_pod(container(limits={COUNT: "1", MEMORY: "1.5"})))
    assert response["allowed"] is False
    assert response["status"]["message"] == \
        f"invalid {MEMORY} value 1.5 in container main: must be an integer between 0 and 2147483647"


@pytest.mark.parametrize("part", ["limits", "requests"])
@pytest.mark.parametrize("resource, value, high", [
    (COUNT, "2147483648", 2147483647), (COUNT, "-1", 2147483647), (MEMORY, "2147483648", 2147483647),
    (CORES, "101", 100), (CORES, "50.5", 100),
])
def test_webhook_checks_count_memory_and_cores_in_limits_and_requests(part, resource, value, high):
    """HAMi after v2.10 (#3012): the count and memory are integers up to MaxInt32, the cores up to
    100, wherever the container writes them; refused (403) in upstream's words."""
    resources = {"limits": {COUNT: "1"}, "requests": {}}
    resources[part][resource] = value
    response, _ = admit(make_pod(container(**resources)))
    assert response["status"] == {"code": 403, "reason": "Forbidden",
                                  "message": f"invalid {resource} value {value} in container main: "
                                             f"must be an integer between 0 and {high}"}


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------

async def test_dcu_pod_is_filtered_and_bound_with_upstreams_annotations(api, app, extender):
    names = await register_nodes(api, app, dcu_node("dcu-1"))
    stored, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "16384", CORES: "25"})), names)
    assert result["NodeNames"] == ["dcu-1"] and result["Error"] == "", result
    ann = decision_annotations(api, app, "p")
    [[device]] = decode_pod_devices(ann[ALLOCATED])
    assert ann[ALLOCATED] == ann[TO_ALLOCATE] == f"{device.uuid},DCU,16384,25:;"
    before = app.device_plugin.allocated
    assert (await extender.bind(stored, "dcu-1"))["Error"] == ""
    await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "dcu-1"
    usage = {d["id"]: d for d in app.cache.device_usage("dcu-1")}
    assert (usage[device.uuid]["used"], usage[device.uuid]["usedmem"], usage[device.uuid]["usedcores"]) == (1, 16384, 25)
    assert_books_balance(app)


async def test_type_gate_end_to_end(api, app, extender):
    """Inventory row v-hygon: ``hygon.com/nouse-dcutype: DCU`` -> CardTypeMismatch."""
    names = await register_nodes(api, app, dcu_node("t"))
    _, result = await place(api, extender, pod("no", ctr(limits={COUNT: "1"}),
                                               annotations={"hygon.com/nouse-dcutype": "DCU"}), names)
    assert result["FailedNodes"] == {"t": "2/2 CardTypeMismatch"}
    _, result = await place(api, extender, pod("k100", ctr(limits={COUNT: "1", MEMORY: "1024", CORES: "10"}),
                                               annotations={"hygon.com/use-dcutype": "k100"}), names)
    assert result["NodeNames"] == ["t"]
    _, result = await place(api, extender, pod("uuid", ctr(limits={COUNT: "1", MEMORY: "1024", CORES: "10"}),
                                               annotations={"hygon.com/use-gpuuuid": "DCU-1"}), names)
    assert result["NodeNames"] == ["t"]
    ann = decision_annotations(api, app, "uuid")
    assert ann[ALLOCATED] == "DCU-1,DCU,1024,10:;"


async def test_default_cores_make_a_card_exclusive_and_memory_factor_applies(api):
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    config = DeviceConfig.default()
    config.sections["hygon"] = {**config.sections["hygon"], "memoryFactor": 1024}
    async with running_scheduler(api, device_config=config) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, dcu_node("f", registration="DCU-0,4,65520,100,DCU,0,true:"))
            _, result = await place(api, extender, pod("a", ctr(limits={COUNT: "1", MEMORY: "8"})), names)
            assert result["NodeNames"] == ["f"]
            assert decision_annotations(api, app, "a")[ALLOCATED] == \
                "DCU-0,DCU,8192,100:;"
            _, result = await place(api, extender, pod("b", ctr(limits={COUNT: "1", MEMORY: "8"})), names)
            assert result["FailedNodes"] == {"f": "1/1 CardInsufficientCore"}
            assert_books_balance(app)
        finally:
            await extender.close()


async def test_malformed_request_is_refused_by_the_filter(api, app, extender):
    names = await register_nodes(api, app, dcu_node("m"))
    _, result = await place(api, extender, pod("bad", ctr(limits={COUNT: "1", CORES: "12.5"})), names)
    assert result["Error"] == \
        f"pod default/bad: invalid {CORES} value 12.5 in container main: must be an integer between 0 and 100"


async def test_garbled_registration_is_refused_while_the_nodes_gpus_still_work(api, app, extender):
    from hami_py.fakeapi.objects import gpu_node, gpu_pod
    node = gpu_node("mixed", gpus=1, annotations={REGISTER: "D0,10,8192,100,DCU,0,true,0:",
                                                  HANDSHAKE: "Reported 2026-01-01 00:00:00"})
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["mixed"].decode_error == f"{REGISTER}: unexpected field count 8 in node annotation"
    _, result = await place(api, extender, pod("dcu", ctr(limits={COUNT: "1"})), names)
    # The refusal, not its symptom (no DCU left on the node), is the node's reason.
    assert result["FailedNodes"] == {"mixed": f"registration refused: {REGISTER}: unexpected field count 8 in node "
                                              "annotation"}, result
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000), names)
    assert result["NodeNames"] == ["mixed"], result
    # the plugin fixes its registration: the DCUs join
    api.patch("nodes", "mixed", {"metadata": {"annotations": {REGISTER: "D0,10,8192,100,DCU,0,true:"}}})
    await wait_until(lambda: app.cache.nodes["mixed"].decode_error is None, "registration accepted")
    _, result = await place(api, extender, pod("dcu2", ctr(limits={COUNT: "1"})), names)
    assert result["NodeNames"] == ["mixed"], result
    assert_books_balance(app)


async def test_scheduler_stamps_the_dcu_handshake(api, app, extender):
    """Inventory row handshake-requesting, with the DCU handshake key."""
    await register_nodes(api, app, dcu_node("hs"))
    await wait_until(lambda: is_requesting(api.get("nodes", "hs")["metadata"]["annotations"].get(HANDSHAKE)),
                     "the DCU handshake stamped Requesting_")
    prefix, _, stamp = api.get("nodes", "hs")["metadata"]["annotations"][HANDSHAKE].partition("_")
    time.strptime(stamp, STAMP_FORMAT)


def _stale_request() -> str:
    return "Requesting_" + time.strftime(STAMP_FORMAT, time.localtime(time.time() - 120))


@pytest.mark.parametrize("scheduler_options", [embedded_options(handshake_timeout_s=60, registration_interval_s=0.05)])
async def test_stale_handshake_without_allocatable_drops_the_dcus(api, app, extender):
    """Inventory rows handshake-expiry and handshake-allocatable, with ``hygon.com/dcunum``."""
    api.create("nodes", dcu_node("gone", handshake=_stale_request(), allocatable="0"))
    api.create("nodes", dcu_node("alive", handshake=_stale_request(), allocatable="4"))
    await wait_until(lambda: HANDSHAKE not in api.get("nodes", "gone")["metadata"]["annotations"],
                     "the gone plugin's DCU handshake removed")
    _, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "1024"})), ["gone", "alive"])
    assert result["NodeNames"] == ["alive"], result
    _, result = await place(api, extender, pod("q", ctr(limits={COUNT: "1", MEMORY: "1024"})), ["gone"])
    assert result["FailedNodes"] == {"gone": "node unregistered"}


async def test_admission_over_http(api, app, extender):
    from tests.test_webhook import envelope
    status, answer = await extender.post("webhook", envelope(
        make_pod(container(limits={COUNT: "1", MEMORY: "99999999999"}), namespace="default"), uid="h1"))
    assert status == 200 and answer["response"]["allowed"] is False
    assert answer["response"]["status"] == {
        "code": 403, "reason": "Forbidden",
        "message": f"invalid {MEMORY} value 99999999999 in container main: must be an integer between 0 and 2147483647"}


async def test_pod_asking_for_gpu_and_dcu_binds_under_one_node_lock(api, app, extender):
    """Inventory row lock-reentrant: NVIDIA and Hygon both lock ``hami.io/mutex.lock``; one lock
    annotation serves both families and the bind succeeds."""
    from hami_py.fakeapi.objects import gpu_node
    node = gpu_node("nv-dcu", gpus=1, annotations={REGISTER: REGISTRATION, HANDSHAKE: "Reported 2026-01-01 00:00:00"})
    node["status"]["allocatable"][COUNT] = "8"
    names = await register_nodes(api, app, node)
    both = pod("both", {"name": "cuda", "image": "cuda:12", "resources": {"limits": {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}},
        ctr(limits={COUNT: "1", MEMORY: "1024", CORES: "10"}, name="dtk"))
    stored, result = await place(api, extender, both, names)
    assert result["NodeNames"] == ["nv-dcu"], result
    ann = decision_annotations(api, app, "both")
    assert [len(c) for c in decode_pod_devices(ann["hami.io/vgpu-devices-allocated"])] == [1, 0]
    assert [len(c) for c in decode_pod_devices(ann[ALLOCATED])] == [0, 1]
    before = app.device_plugin.allocated
    assert (await extender.bind(stored, "nv-dcu"))["Error"] == ""
    await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    assert api.get("pods", "both", namespace="default")["spec"]["nodeName"] == "nv-dcu"
    assert "hami.io/mutex.lock" not in api.get("nodes", "nv-dcu")["metadata"]["annotations"]
    assert_books_balance(app)


@pytest.mark.parametrize("scheduler_options", [embedded_options(registration_interval_s=0.05)])
async def test_a_gone_dcu_plugin_drops_only_the_dcus_of_the_node(api, app, extender):
    """Upstream's health is per vendor: the node's GPUs stay schedulable."""
    from hami_py.fakeapi.objects import gpu_node, gpu_pod
    node = gpu_node("nd", gpus=1, annotations={REGISTER: REGISTRATION, HANDSHAKE: _stale_request()})
    node["status"]["allocatable"][COUNT] = "0"
    api.create("nodes", node)
    await wait_until(lambda: HANDSHAKE not in api.get("nodes", "nd")["metadata"]["annotations"],
                     "the gone DCU plugin's handshake removed")
    await wait_until(lambda: "nd" in app.cache.node_index_of, "node usable")
    _, result = await place(api, extender, pod("dcu", ctr(limits={COUNT: "1", MEMORY: "1024"})), ["nd"])
    assert result["FailedNodes"] == {"nd": "NodeInsufficientDevice"}, result
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000), ["nd"])
    assert result["NodeNames"] == ["nd"], result


# ---------------------------------------------------------------------------------------------
# Two plugin generations: HCU (HAMi after v2.10) and DCU (v2.10), side by side
# ---------------------------------------------------------------------------------------------

@BOTH
def test_each_generation_reads_and_writes_its_own_annotations(g):
    v = vendor(g=g)
    assert (v.vendor_key, v.register_annotation, v.handshake_annotation, v.count_resource_name) == (
        g.key, g.register, g.handshake, g.count)
    assert v.resource_names() == [g.count, g.memory, g.cores]
    assert v.decision_annotations() == (g.to_allocate, g.allocated)
    [first, _] = v.parse_node_devices(NodeView.of({g.register: registration(g)}))
    assert (first.id, first.type, first.count, first.devmem) == (f"{g.key}-0", f"{g.key}-K100_AI", 4, 65520)
    other = DCU if g is HCU else HCU
    assert v.parse_node_devices(NodeView.of({other.register: registration(other)})) == []
    written = v.encode_allocation([[ContainerDevice(f"{g.key}-0", g.key, 1024, 30)]])
    assert written == {g.to_allocate: f"{g.key}-0,{g.key},1024,30:;", g.allocated: f"{g.key}-0,{g.key},1024,30:;"}
    assert v.decode_allocation(written) == [[ContainerDevice(f"{g.key}-0", g.key, 1024, 30)]]


@BOTH
def test_a_container_is_the_generation_its_resources_name(g):
    other = DCU if g is HCU else HCU
    limits = {g.count: "2", g.memory: "8", g.cores: "30"}
    assert vendor(factor=1024, g=g).container_request(ctr(limits=limits), pod_annotations={}) == \
        ContainerRequest(g.key, 2, 8192, 0, 30)           # memoryFactor applies to both generations
    assert vendor(g=other).container_request(ctr(limits=limits), pod_annotations={}) is None
    with pytest.raises(RequestError) as err:
        vendor(g=g).container_request(ctr(limits={g.count: "1", g.cores: "101"}), pod_annotations={})
    assert str(err.value) == f"invalid {g.cores} value 101 in container main: must be an integer between 0 and 100"


@BOTH
def test_each_generation_is_gated_by_its_own_type_annotations(g):
    other = DCU if g is HCU else HCU
    card = _device(f"{g.key}-K100_AI")
    select = vendor(g=g).device_selector({g.use_type: "z100"}, {})
    assert select(card) == CARD_TYPE_MISMATCH
    select = vendor(g=g).device_selector({g.nouse_type: "k100"}, {})
    assert select(card) == CARD_TYPE_MISMATCH
    assert vendor(g=g).device_selector({g.use_type: "k100"}, {})(card) == OK
    # the other generation's type annotation is not this one's (upstream reads only its own)
    assert vendor(g=g).device_selector({other.nouse_type: "k100"}, {}) is None


def test_a_node_registered_under_both_names_is_read_as_hcu():
    """The HCU plugin replaced the DCU one, which left its registration behind: the same cards
    must not be offered twice, so the DCU vendor sees none while the HCU registration is there."""
    both = NodeView.of({HCU.register: registration(HCU), DCU.register: registration(DCU)})
    assert [d.id for d in vendor(g=HCU).parse_node_devices(both)] == ["HCU-0", "HCU-1"]
    assert vendor(g=DCU).parse_node_devices(both) == []
    dcu_only = NodeView.of({DCU.register: registration(DCU)})
    assert [d.id for d in vendor(g=DCU).parse_node_devices(dcu_only)] == ["DCU-0", "DCU-1"]
    # the cache decodes again when the HCU registration comes or goes
    assert vendor(g=DCU).registration_inputs(both) != vendor(g=DCU).registration_inputs(dcu_only)


def _generations(section: dict | None) -> dict[str, list[str]]:
    config = DeviceConfig.default()
    if section is None:
        config.sections.pop("hygon")
    else:
        config.sections["hygon"] = section
    return {v.vendor_key: v.resource_names() for v in build_family(config, FamilySwitches())}


HCU_NAMES, DCU_NAMES = [HCU.count, HCU.memory, HCU.cores], [DCU.count, DCU.memory, DCU.cores]


@pytest.mark.parametrize("section,expected", [
    # the chart after v2.10: the section names HCU, and v2.10's DCU names are served beside
    ({"resourceCountName": HCU.count, "resourceMemoryName": HCU.memory, "resourceCoreName": HCU.cores},
     {"HCU": HCU_NAMES, "DCU": DCU_NAMES}),
    # a v2.10 file: its names are the DCU generation's, as v2.10 read them; HCU keeps its defaults
    ({"resourceCountName": DCU.count, "resourceMemoryName": DCU.memory, "resourceCoreName": DCU.cores},
     {"HCU": HCU_NAMES, "DCU": DCU_NAMES}),
    # ours: a dcu mapping renames the DCU generation, or (empty) serves none of it
    ({"resourceCountName": HCU.count, "dcu": {"resourceCountName": "example.com/dcu"}},
     {"HCU": [HCU.count], "DCU": ["example.com/dcu"]}),
    ({"resourceCountName": HCU.count, "resourceMemoryName": HCU.memory, "dcu": {}},
     {"HCU": [HCU.count, HCU.memory], "DCU": []}),
    # no section (upstream: not configured): neither generation matches a container
    (None, {"HCU": [], "DCU": []}),
])
def test_the_hygon_section_names_both_generations(section, expected):
    assert _generations(section) == expected


def test_the_shipped_config_manages_both_spellings_hcu_first():
    names = managed_resource_names(build_vendors(DeviceConfig.default()))
    hygon = [n for n in names if n.startswith("hygon.com/")]
    assert hygon == HCU_NAMES + DCU_NAMES
    assert DeviceConfig.default().sections["hygon"]["resourceCountName"] == HCU.count


def test_a_dcu_mapping_claiming_the_hcu_resource_stops_the_start_naming_both():
    text = ("hygon:\n  resourceCountName: hygon.com/hcunum\n  dcu:\n    resourceCountName: hygon.com/hcunum\n")
    with pytest.raises(ConfigError) as err:
        build_vendors(parse_device_config(text, "dc.yaml"))
    assert str(err.value) == ('dc.yaml: invalid device configuration: HCU and DCU both claim resource '
                              '"hygon.com/hcunum"; a container requesting it would be allocated devices by both')


@pytest.mark.parametrize("text,message", [
    ("hygon:\n  resourceCountName: hygon.com/hcunum\n  dcu: [hygon.com/dcunum]\n",
     "dc.yaml: line 3: hygon.dcu: expected a mapping, got list"),
    ("hygon:\n  resourceCountName: hygon.com/hcunum\n  dcu:\n    resourceCountName: 7\n",
     'dc.yaml: line 4: hygon.dcu.resourceCountName: expected a string, got integer "7"'),
])
def test_a_malformed_dcu_mapping_is_refused_with_its_line(text, message):
    with pytest.raises(ConfigError) as err:
        build_vendors(parse_device_config(text, "dc.yaml"))
    assert str(err.value) == message


@BOTH
def test_webhook_recognises_either_spelling(g):
    response, patched = admit(make_pod(container(limits={g.count: "1", g.memory: "2048"})))
    assert response["allowed"] is True and patched["spec"]["schedulerName"] == "hami-scheduler"
    response, _ = admit(make_pod(container(limits={g.count: "1"}, requests={g.cores: "150"})))
    assert response["status"]["message"] == \
        f"invalid {g.cores} value 150 in container main: must be an integer between 0 and 100"


@pytest.mark.parametrize("node_g", [HCU, DCU], ids=["hcu-node", "dcu-node"])
@pytest.mark.parametrize("pod_g", [HCU, DCU], ids=["hcu-pod", "dcu-pod"])
async def test_a_pod_goes_to_the_nodes_whose_plugin_serves_its_spelling(api, app, extender, node_g, pod_g):
    """Node generation x pod spelling. The kubelet calls a plugin's Allocate only for the resource
    that plugin advertises: a pod is placed on the cards of its own generation, and its decision
    is written under the annotations that generation's plugin reads."""
    names = await register_nodes(api, app, hygon_node("h", node_g))
    stored, result = await place(api, extender, pod("p", ctr(limits={pod_g.count: "1", pod_g.memory: "16384",
                                                                      pod_g.cores: "25"})), names)
    if node_g is not pod_g:
        assert result["NodeNames"] in (None, []) and result["FailedNodes"] == {"h": "NodeInsufficientDevice"}, result
        return
    assert result["NodeNames"] == ["h"] and result["Error"] == "", result
    ann = decision_annotations(api, app, "p")
    [[device]] = decode_pod_devices(ann[pod_g.allocated])
    assert ann[pod_g.allocated] == ann[pod_g.to_allocate] == f"{device.uuid},{pod_g.key},16384,25:;"
    assert device.uuid.startswith(f"{pod_g.key}-")
    other = DCU if pod_g is HCU else HCU
    assert other.allocated not in ann and other.to_allocate not in ann
    before = app.device_plugin.allocated
    assert (await extender.bind(stored, "h"))["Error"] == ""
    await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    usage = {d["id"]: d for d in app.cache.device_usage("h")}
    assert (usage[device.uuid]["used"], usage[device.uuid]["usedmem"]) == (1, 16384)
    assert_books_balance(app)


async def test_a_cluster_mid_upgrade_schedules_both_spellings(api, app, extender):
    """One node upgraded to the HCU plugin, one still on the DCU plugin, and one upgraded whose old
    registration was left behind: each spelling lands where its plugin runs."""
    leftover = hygon_node("both", HCU, annotations={DCU.register: registration(DCU, "both")})
    names = await register_nodes(api, app, hygon_node("new", HCU), hygon_node("old", DCU), leftover)
    _, result = await place(api, extender, pod("h", ctr(limits={HCU.count: "1", HCU.memory: "1024"})), ["new", "old"])
    assert result["NodeNames"] == ["new"], result
    _, result = await place(api, extender, pod("d", ctr(limits={DCU.count: "1", DCU.memory: "1024"})), ["new", "old"])
    assert result["NodeNames"] == ["old"], result
    assert decision_annotations(api, app, "h")[HCU.allocated].startswith("HCU-")
    assert decision_annotations(api, app, "d")[DCU.allocated].startswith("DCU-")
    # the node carrying both registrations has its HCU cards only, each once
    _, result = await place(api, extender, pod("d2", ctr(limits={DCU.count: "1"})), ["both"])
    assert result["FailedNodes"] == {"both": "NodeInsufficientDevice"}, result
    assert sorted(d["id"] for d in app.cache.device_usage("both")) == ["HCU-both-0", "HCU-both-1"]
    _, result = await place(api, extender, pod("h2", ctr(limits={HCU.count: "1", HCU.memory: "1024"})), ["both"])
    assert result["NodeNames"] == ["both"], result
    assert decision_annotations(api, app, "h2")[HCU.allocated].split(",")[1] == "HCU"
    assert names == ["new", "old", "both"]
    assert_books_balance(app)


async def test_a_restarted_scheduler_recounts_pods_of_both_annotation_pairs(api):
    """Pods bound under either generation's annotations are charged again after a restart."""
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient

    def usage(app, node):
        return {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage(node)}

    api.create("nodes", hygon_node("new", HCU))
    api.create("nodes", hygon_node("old", DCU))
    async with running_scheduler(api) as first:
        await wait_until(lambda: {"new", "old"} <= set(first.cache.node_index_of), "both nodes registered")
        client = ExtenderClient(first.url)
        try:
            for name, g, node in (("h", HCU, "new"), ("d", DCU, "old")):
                stored, result = await place(api, client, pod(name, ctr(limits={g.count: "1", g.memory: "2048",
                                                                                  g.cores: "40"})), [node])
                assert result["NodeNames"] == [node], result
                assert (await client.bind(stored, node))["Error"] == ""
        finally:
            await client.close()
        before = {node: usage(first, node) for node in ("new", "old")}
    assert sorted(v for v in before["new"].values() if v[0]) == [(1, 2048, 40)]
    assert sorted(v for v in before["old"].values() if v[0]) == [(1, 2048, 40)]
    bound = {name: api.get("pods", name, namespace="default")["metadata"]["annotations"] for name in ("h", "d")}
    assert HCU.allocated in bound["h"] and DCU.allocated in bound["d"]
    async with running_scheduler(api) as second:
        await wait_until(lambda: all(usage(second, n) == before[n] for n in ("new", "old")),
                         "both generations' pods charged again")
        assert_books_balance(second)


async def test_the_scheduler_stamps_the_hcu_handshake(api, app, extender):
    await register_nodes(api, app, hygon_node("hs", HCU))
    await wait_until(lambda: is_requesting(api.get("nodes", "hs")["metadata"]["annotations"].get(HCU.handshake)),
                     "the HCU handshake stamped Requesting_")
    assert DCU.handshake not in api.get("nodes", "hs")["metadata"]["annotations"]


HYGON_FLAGS = ["--hcu-name=hygon.com/hcunum", "--hcu-memory=hygon.com/hcumem", "--hcu-cores=hygon.com/hcucores",
               "--dcu-name=hygon.com/dcunum", "--dcu-memory=hygon.com/dcumem", "--dcu-cores=hygon.com/dcucores"]


async def test_the_scheduler_starts_with_upstreams_hygon_flags(api):
    """Upstream's --hcu-* (and v2.10's --dcu-*) are accepted; as upstream, the device config's
    hygon section names the resources, so both generations are served under the config's names."""
    from hami_py.cli import build_parser, options_from_args
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    argv = [*HYGON_FLAGS, "--hcu-name=example.com/ignored"]
    options = options_from_args(build_parser().parse_args(argv))
    local = embedded_options()
    options = dataclasses.replace(options, http_bind=local.http_bind, metrics_bind_address=local.metrics_bind_address,
                                  kube_qps=local.kube_qps, kube_burst=local.kube_burst)
    api.create("nodes", hygon_node("new", HCU))
    async with running_scheduler(api, options=options) as app:
        assert managed_resource_names({k: app.vendors[k] for k in ("HCU", "DCU")}) == HCU_NAMES + DCU_NAMES
        await wait_until(lambda: "new" in app.cache.node_index_of, "node registered")
        client = ExtenderClient(app.url)
        try:
            _, result = await place(api, client, pod("h", ctr(limits={HCU.count: "1"})), ["new"])
        finally:
            await client.close()
        assert result["NodeNames"] == ["new"], result

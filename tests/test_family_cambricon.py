"""Cambricon MLU: inventory from node capacity, requests, DSMLU annotations, quota, webhook, and
end to end against the in-repo API server (including a pod asking for MLU and DCU at once).

Fixtures are upstream's (pkg/device/cambricon/device_test.go and the feature inventory's
v-cambricon row): capacity ``vcore 200 / vmemory 100`` is two cards of 12800 MiB.
"""
from __future__ import annotations

from datetime import datetime

import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices.base import DeviceDecodeError, DeviceInfo, NodeView, RequestError
from hami_py.devices.base import ContainerDevice, ContainerRequest
from hami_py.devices.cambricon import CambriconConfig, CambriconVendor, build_family, device_index
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.reasons import CARD_TYPE_MISMATCH, CARD_UUID_MISMATCH, OK
from tests.conftest import container as any_container, decision_annotations, assert_books_balance, create_quota, place, register_nodes, wait_until
from tests.test_webhook import admit, container, make_pod

COUNT = "cambricon.com/vmlu"
MEMORY = "cambricon.com/mlu.smlu.vmemory"
CORES = "cambricon.com/mlu.smlu.vcore"
TO_ALLOCATE = "hami.io/cambricon-mlu-devices-to-allocate"
ALLOCATED = "hami.io/cambricon-mlu-devices-allocated"
PROFILE = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
DCU_REGISTER = "hami.io/node-dcu-register"
DSMLU_LOCK = "cambricon.com/dsmlu.lock"


def vendor() -> CambriconVendor:
    return build_family(DeviceConfig.default(), FamilySwitches())[0]


def view(capacity: dict, name: str = "n1", labels: dict | None = None) -> NodeView:
    return NodeView.of(name=name, capacity=capacity, labels=labels)


def ctr(limits=None, requests=None, name="main", env=None) -> dict:
    return any_container(limits, requests, name, image="mlu:latest", env=env)

def mlu_node(name: str, *, cores: str = "200", memory: str = "100", annotations: dict | None = None,
             extra_capacity: dict | None = None, model: str | None = None) -> dict:
    capacity = {COUNT: "20", CORES: cores, MEMORY: memory, "cpu": "64", **(extra_capacity or {})}
    labels = {"kubernetes.io/hostname": name, **({"Model": model} if model is not None else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
            "status": {"capacity": capacity, "allocatable": dict(capacity)}}


def pod(name: str, *containers: dict, namespace: str = "default", annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)}}


# ---------------------------------------------------------------------------------------------
# Inventory
# ---------------------------------------------------------------------------------------------

def test_inventory_is_synthesised_from_capacity_as_upstream():
    # upstream's Test_GetNodeDevices: vcore 1, vmemory 1 -> one device of 25600 MiB
    assert vendor().parse_node_devices(view({CORES: 1, MEMORY: 1}, name="test")) == [
        DeviceInfo(id="test-cambricon-mlu-0", index=0, count=100, devmem=25600, devcore=100, type="MLU",
                   numa=0, mode="", health=True)]
    # the inventory row: vcore 200 / vmemory 100 -> two devices of 12800 MiB
    devices = vendor().parse_node_devices(view({CORES: "200", MEMORY: "100"}))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in devices] == [
        ("n1-cambricon-mlu-0", 0, 100, 12800, 100, "MLU", True),
        ("n1-cambricon-mlu-1", 1, 100, 12800, 100, "MLU", True)]


def test_partial_card_rounds_the_device_count_up_and_memory_down():
    devices = vendor().parse_node_devices(view({CORES: "150", MEMORY: "7"}))
    # ceil(150/100) = 2 devices, floor(7 * 256 * 100 / 150) = 1194 MiB each
    assert [(d.id, d.devmem) for d in devices] == [("n1-cambricon-mlu-0", 1194), ("n1-cambricon-mlu-1", 1194)]


def test_no_core_capacity_or_zero_means_no_mlu_and_missing_memory_means_zero():
    v = vendor()
    assert v.parse_node_devices(view({"nvidia.com/gpu": "8"})) == []
    # what the kubelet leaves once the plugin is gone
    assert v.parse_node_devices(view({CORES: "0", MEMORY: "0"})) == []
    assert [d.devmem for d in v.parse_node_devices(view({CORES: "100"}))] == [0]


@pytest.mark.parametrize("capacity,message", [
    ({CORES: "2500m", MEMORY: "100"}, f'{CORES} "2500m" is not a whole number'),
    ({CORES: "-100", MEMORY: "100"}, f'{CORES} "-100" must not be negative'),
    ({CORES: "200", MEMORY: "lots"}, f'{MEMORY} "lots" is not a whole number'),
    ({CORES: "200", MEMORY: "-1"}, f'{MEMORY} "-1" must not be negative'),
    ({CORES: "100", MEMORY: "8388608"},
     f'{MEMORY} "8388608" over {CORES} "100" gives 2147483648 MiB per device, more than 2147483647'),
    ({CORES: "1e9", MEMORY: "1"}, f'{CORES} "1e9" implies 10000000 devices, more than 1024'),
])
def test_garbled_capacity_is_refused_with_the_resource_and_value(capacity, message):
    with pytest.raises(DeviceDecodeError) as err:
        vendor().parse_node_devices(view(capacity))
    assert str(err.value) == message


def test_inventory_is_decoded_again_only_when_the_two_capacities_change():
    v = vendor()
    base = {CORES: "200", MEMORY: "100", COUNT: "20", "cpu": "64"}
    inputs = v.registration_inputs(view(base))
    assert v.registration_inputs(view({**base, "cpu": "32", COUNT: "10", "nvidia.com/gpu": "8"})) == inputs
    assert v.registration_inputs(view({**base, CORES: "300"})) != inputs
    assert v.registration_inputs(view({**base, MEMORY: "96"})) != inputs
    assert v.registration_inputs(view(base, labels={"Model": "MLU370-X4"})) != inputs
    assert v.registration_inputs(view(base, labels={"mlu": "on"})) == inputs
    assert v.registration_source() == f"node capacity {CORES}/{MEMORY}"


@pytest.mark.parametrize("label, model", [
    ("MLU370-X4", "MLU370-X4"), ("  MLU590 ", "MLU590"), ("mlu370-s4", "mlu370-s4"),
    (None, "MLU"), ("", "MLU"), ("   ", "MLU"), ("A100", "MLU"),
])
def test_the_cards_type_is_the_nodes_mlu_model_label(label, model):
    """HAMi after v2.10 (#2780): the ``Model`` label Cambricon's plugin publishes names the cards'
    model when it names an MLU; otherwise they stay ``MLU``."""
    labels = {} if label is None else {"Model": label}
    devices = vendor().parse_node_devices(view({CORES: "200", MEMORY: "100"}, labels=labels))
    assert [d.type for d in devices] == [model, model]


# ---------------------------------------------------------------------------------------------
# Requests (upstream's Test_GenerateResourceRequests, with "cambricon.com/vmlu" as the count)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("container,expected", [
    (ctr(limits={COUNT: "1", MEMORY: "1000", CORES: "2"}, requests={COUNT: "1", MEMORY: "1000", CORES: "2"}),
     ContainerRequest("MLU", 1, 256000, 0, 2)),
    (ctr(limits={COUNT: "1", MEMORY: "1000"}, requests={COUNT: "1", MEMORY: "1000"}),
     ContainerRequest("MLU", 1, 256000, 0, 100)),          # cores default 100: exclusive
    (ctr(limits={COUNT: "1", CORES: "2"}, requests={COUNT: "1", CORES: "2"}),
     ContainerRequest("MLU", 1, 0, 100, 2)),               # no memory: the whole card
    (ctr(requests={COUNT: "2", MEMORY: "4"}), ContainerRequest("MLU", 2, 1024, 0, 100)),
    (ctr(limits={COUNT: "1", MEMORY: "8388607"}), ContainerRequest("MLU", 1, 8388607 * 256, 0, 100)),
])
def test_request_follows_upstreams_rules(container, expected):
    assert vendor().container_request(container, pod_annotations={}) == expected


def test_no_count_or_count_zero_is_no_request():
    v = vendor()
    assert v.container_request(ctr(limits={MEMORY: "4", CORES: "10"}), pod_annotations={}) is None
    assert v.container_request(ctr(limits={COUNT: "0"}), pod_annotations={}) is None


@pytest.mark.parametrize("limits,message", [
    # upstream drops these requests (the pod then runs without an MLU); we refuse them
    ({COUNT: "1", MEMORY: "16Gi"},
     f'container "main": {MEMORY} "16Gi" is out of range: must be between 0 and 8388607 units of 256 MiB'),
    ({COUNT: "1", MEMORY: "1.5"}, f'container "main": {MEMORY} "1.5" is not a whole number of units of 256 MiB'),
    ({COUNT: "1.5"}, f"invalid {COUNT} request in container main: device count 1.5 is not a plain integer"),
    ({COUNT: "-1"}, f"invalid {COUNT} request in container main: device count -1 is out of range"),
    ({COUNT: "1e19"}, f"invalid {COUNT} request in container main: device count 1e19 is not a plain integer"),
    # upstream v2.10 silently gives 100 cores for a non-integer value and clamps above 100; we
    # refuse both, as HAMi after v2.10 does
    ({COUNT: "1", CORES: "500m"}, f"invalid {CORES} value 500m in container main: must be an integer between 0 and 100"),
    ({COUNT: "1", CORES: "-1"}, f"invalid {CORES} value -1 in container main: must be an integer between 0 and 100"),
    ({COUNT: "1", CORES: "150"}, f"invalid {CORES} value 150 in container main: must be an integer between 0 and 100"),
])
def test_malformed_request_is_refused_precisely(limits, message):
    with pytest.raises(RequestError) as err:
        vendor().container_request(ctr(limits=limits), pod_annotations={})
    assert str(err.value) == message


def test_uuid_annotations_pick_and_avoid_cards():
    v = vendor()
    d0, d1 = vendor().parse_node_devices(view({CORES: "200", MEMORY: "100"}))
    assert v.device_selector({}, {}) is None
    use = v.device_selector({"cambricon.com/use-gpuuuid": "n1-cambricon-mlu-1"}, {})
    assert (use(d0), use(d1)) == (CARD_UUID_MISMATCH, OK)
    avoid = v.device_selector({"cambricon.com/nouse-gpuuuid": " n1-cambricon-mlu-1 , x"}, {})
    assert (avoid(d0), avoid(d1)) == (OK, CARD_UUID_MISMATCH)
    assert v.device_selector({"cambricon.com/use-mlutype": " "}, {}) is None     # blank: no constraint


def test_model_annotations_pick_and_avoid_models_by_substring():
    """#2780: ``cambricon.com/use-mlutype`` admits only the listed models, ``nouse-mlutype`` refuses
    them, matched upper-cased by substring; a node without a model label (type ``MLU``) passes a
    constraint only when ``MLU`` itself contains an entry."""
    v = vendor()
    mlu370 = v.parse_node_devices(view({CORES: "100", MEMORY: "100"}, labels={"Model": "MLU370-X4"}))[0]
    mlu590 = v.parse_node_devices(view({CORES: "100", MEMORY: "100"}, labels={"Model": "MLU590"}))[0]
    unknown = v.parse_node_devices(view({CORES: "100", MEMORY: "100"}))[0]
    use = v.device_selector({"cambricon.com/use-mlutype": "mlu370, MLU580"}, {})
    assert (use(mlu370), use(mlu590), use(unknown)) == (OK, CARD_TYPE_MISMATCH, CARD_TYPE_MISMATCH)
    avoid = v.device_selector({"cambricon.com/nouse-mlutype": "MLU370"}, {})
    assert (avoid(mlu370), avoid(mlu590), avoid(unknown)) == (CARD_TYPE_MISMATCH, OK, OK)
    generic = v.device_selector({"cambricon.com/use-mlutype": "MLU"}, {})
    assert (generic(mlu370), generic(mlu590), generic(unknown)) == (OK, OK, OK)
    both = v.device_selector({"cambricon.com/use-mlutype": "MLU590",
                              "cambricon.com/use-gpuuuid": "n1-cambricon-mlu-0"}, {})
    assert (both(mlu370), both(mlu590)) == (CARD_TYPE_MISMATCH, OK)


def test_quota_is_checked_with_factor_256_and_the_dsmlu_lock_is_the_familys_own():
    v = vendor()
    assert v.quota_resources() == (MEMORY, CORES, 256)
    assert (v.extra_lock_annotation, v.extra_lock_expiry_s) == ("cambricon.com/dsmlu.lock", 120.0)
    assert v.uses_node_lock is False            # upstream never takes hami.io/mutex.lock for MLU pods
    assert v.handshake_annotation is None and v.count_resource_name == ""   # always healthy, no handshake
    assert v.resource_names() == [COUNT, MEMORY, CORES]


# ---------------------------------------------------------------------------------------------
# Annotations (upstream's Test_PatchAnnotations)
# ---------------------------------------------------------------------------------------------

def test_allocation_annotations_carry_the_dsmlu_profile_of_the_first_device():
    v = vendor()
    device = ContainerDevice("n1-cambricon-mlu-0", "MLU", 256000, 1)
    assert v.encode_allocation([[device]], node="n1") == {
        ASSIGNED: "false", PROFILE: "0_1_1000",
        TO_ALLOCATE: "n1-cambricon-mlu-0,MLU,256000,1:;", ALLOCATED: "n1-cambricon-mlu-0,MLU,256000,1:;"}
    # a leading container without an MLU: the profile comes from the first one that has one
    later = [[], [ContainerDevice("n1-cambricon-mlu-3", "MLU", 2560, 100), device]]
    out = v.encode_allocation(later, node="n1")
    assert out[PROFILE] == "3_100_10"
    assert out[ALLOCATED] == out[TO_ALLOCATE] == ";n1-cambricon-mlu-3,MLU,2560,100:n1-cambricon-mlu-0,MLU,256000,1:;"
    assert v.encode_allocation([[], []], node="n1") == {}
    assert set(v.decision_annotations()) == {TO_ALLOCATE, ALLOCATED, ASSIGNED, PROFILE}
    assert v.decode_allocation({ALLOCATED: out[ALLOCATED]}) == later


def test_device_index_is_read_from_the_synthesised_id():
    assert device_index("node-cambricon-mlu-a-cambricon-mlu-12") == 12
    with pytest.raises(ValueError):
        device_index("GPU-0")


# ---------------------------------------------------------------------------------------------
# Config and webhook
# ---------------------------------------------------------------------------------------------

def test_config_section_missing_keys_are_empty_and_wrong_types_are_refused():
    assert CambriconConfig.from_section(Section.of("cambricon", None)) == CambriconConfig()
    assert CambriconConfig.from_section(Section.of("cambricon", {"resourceCountName": "cambricon.com/mlu"})) == \
        CambriconConfig(resource_count_name="cambricon.com/mlu")
    with pytest.raises(ConfigError) as err:
        CambriconConfig.from_section(Section.of("cambricon", {"resourceCoreName": ["a"]}))
    assert str(err.value) == "device config: cambricon.resourceCoreName: expected a string, got list"
    with pytest.raises(ConfigError) as err:
        CambriconConfig.from_section(Section.of("cambricon", "cambricon.com/vmlu"))
    assert str(err.value) == "device config: cambricon: expected a mapping, got string"
    # without a section the family is still built, and matches nothing
    empty = build_family(DeviceConfig(), FamilySwitches())[0]
    assert empty.container_request(ctr(limits={COUNT: "1"}), pod_annotations={}) is None
    assert empty.parse_node_devices(view({CORES: "200", MEMORY: "100"})) == []


def test_webhook_counts_only_a_limited_count_and_mutates_nothing():
    response, patched = admit(make_pod(container(limits={COUNT: "1", MEMORY: "10"})))
    assert response["allowed"] is True
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    mutated = patched["spec"]["containers"][0]
    assert mutated["resources"]["limits"] == {COUNT: "1", MEMORY: "10"} and "env" not in mutated
    # count in requests only: not recognised by upstream's webhook
    _, patched = admit(make_pod(container(requests={COUNT: "1"})))
    assert patched["spec"]["schedulerName"] == "default-scheduler"


def test_webhook_denies_a_malformed_memory_value():
    response, _ = admit(make_pod(container(limits={COUNT: "1", MEMORY: "0.5"})))
    assert response["allowed"] is False
    assert response["status"]["message"] == \
        f'container "main": {MEMORY} "0.5" is not a whole number of units of 256 MiB'


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------

async def _bind(app, extender, stored: dict, node: str) -> dict:
    before = app.device_plugin.allocated
    result = await extender.bind(stored, node)
    if not result["Error"]:
        await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    return result


async def test_mlu_pod_is_filtered_and_bound_with_upstreams_annotations(api, app, extender):
    names = await register_nodes(api, app, mlu_node("mlu-1"))
    assert [(d["id"], d["totalmem"]) for d in app.cache.device_usage("mlu-1")] == [
        ("mlu-1-cambricon-mlu-0", 12800), ("mlu-1-cambricon-mlu-1", 12800)]
    stored, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "10"})), names)
    assert result["NodeNames"] == ["mlu-1"] and result["Error"] == "", result
    ann = decision_annotations(api, app, "p")
    [[device]] = decode_pod_devices(ann[ALLOCATED])
    index = device_index(device.uuid)
    assert ann[ALLOCATED] == ann[TO_ALLOCATE] == f"mlu-1-cambricon-mlu-{index},MLU,2560,100:;"
    assert ann[ASSIGNED] == "false"
    assert ann[PROFILE] == f"{index}_100_10"
    assert (await _bind(app, extender, stored, "mlu-1"))["Error"] == ""
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "mlu-1"
    # HAMi's shared lock is never taken for an MLU pod; the family's own was released by the
    # (simulated) Cambricon plugin once it allocated
    node_ann = api.get("nodes", "mlu-1")["metadata"]["annotations"]
    assert DSMLU_LOCK not in node_ann and "hami.io/mutex.lock" not in node_ann
    usage = {d["id"]: d for d in app.cache.device_usage("mlu-1")}
    assert (usage[device.uuid]["used"], usage[device.uuid]["usedmem"], usage[device.uuid]["usedcores"]) == (1, 2560, 100)
    assert_books_balance(app)


async def test_a_fresh_dsmlu_lock_refuses_the_next_bind_on_the_node(api):
    """Inventory row cambricon-lock: the bind sets ``cambricon.com/dsmlu.lock`` (an RFC3339 time);
    while no plugin releases it, a second MLU bind within 2 minutes of the first fails."""
    async with running_scheduler(api, options=embedded_options(node_lock_wait_s=0), device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, mlu_node("locked"))
            first, _ = await place(api, extender, pod("first", ctr(limits={COUNT: "1", MEMORY: "10"})), names)
            assert (await extender.bind(first, "locked"))["Error"] == ""
            node_ann = api.get("nodes", "locked")["metadata"]["annotations"]
            datetime.strptime(node_ann[DSMLU_LOCK], "%Y-%m-%dT%H:%M:%SZ")
            assert "hami.io/mutex.lock" not in node_ann
            second, result = await place(api, extender, pod("second", ctr(limits={COUNT: "1", MEMORY: "10"})), names)
            assert result["NodeNames"] == ["locked"]
            bound = await extender.bind(second, "locked")
            assert "node locked has been locked within" in bound["Error"] and DSMLU_LOCK in bound["Error"], bound
            assert api.get("pods", "second", namespace="default")["spec"].get("nodeName") is None
            assert_books_balance(app)
        finally:
            await extender.close()


async def test_default_cores_make_a_card_exclusive(api, app, extender):
    names = await register_nodes(api, app, mlu_node("one", cores="100", memory="50"))
    _, result = await place(api, extender, pod("a", ctr(limits={COUNT: "1", MEMORY: "10"})), names)
    assert result["NodeNames"] == ["one"]
    _, result = await place(api, extender, pod("b", ctr(limits={COUNT: "1", MEMORY: "10"})), names)
    assert result["FailedNodes"] == {"one": "1/1 CardInsufficientCore"}
    _, result = await place(api, extender, pod("c", ctr(limits={COUNT: "1", MEMORY: "10", CORES: "0"})), names)
    assert result["FailedNodes"] == {"one": "1/1 CardComputeUnitsExhausted"}
    assert_books_balance(app)


async def test_capacity_change_rebuilds_the_inventory(api, app, extender):
    await register_nodes(api, app, mlu_node("grow"))
    api.patch("nodes", "grow", {"status": {"capacity": {CORES: "400", MEMORY: "200"}}})
    await wait_until(lambda: len(app.cache.device_usage("grow")) == 4, "four cards after the capacity grew")
    assert {d["totalmem"] for d in app.cache.device_usage("grow")} == {12800}


async def test_memory_quota_is_checked_at_fit_in_units_of_256_mib(api, app, extender):
    """Inventory row quota-factor: ``limits.cambricon.com/mlu.smlu.vmemory: 4`` allows 1024 MiB."""
    names = await register_nodes(api, app, mlu_node("q"))
    await create_quota(api, app, {f"limits.{MEMORY}": "4"}, namespace="team")
    _, result = await place(api, extender, pod("four", ctr(limits={COUNT: "1", MEMORY: "4"}), namespace="team"), names)
    assert result["NodeNames"] == ["q"], result
    _, result = await place(api, extender, pod("more", ctr(limits={COUNT: "1", MEMORY: "1"}), namespace="team"), names)
    assert result["FailedNodes"] == {"q": "2/2 ResourceQuotaNotFit"}
    # a whole-card request (no memory) resolves to 12800 MiB at fit, and the quota sees it
    _, result = await place(api, extender, pod("whole", ctr(limits={COUNT: "1"}), namespace="team"), names)
    assert result["FailedNodes"] == {"q": "2/2 ResourceQuotaNotFit"}
    assert_books_balance(app)


async def test_uuid_selection_end_to_end(api, app, extender):
    names = await register_nodes(api, app, mlu_node("sel"))
    _, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "1"}),
                                               annotations={"cambricon.com/use-gpuuuid": "sel-cambricon-mlu-1"}), names)
    assert result["NodeNames"] == ["sel"]
    ann = decision_annotations(api, app, "p")
    assert ann[ALLOCATED] == "sel-cambricon-mlu-1,MLU,256,100:;" and ann[PROFILE] == "1_100_1"
    _, result = await place(api, extender, pod("q", ctr(limits={COUNT: "1", MEMORY: "1"}),
                                               annotations={"cambricon.com/use-gpuuuid": "other"}), names)
    assert result["FailedNodes"] == {"sel": "2/2 CardUuidMismatch"}


async def test_malformed_request_is_refused_by_the_filter(api, app, extender):
    names = await register_nodes(api, app, mlu_node("m"))
    _, result = await place(api, extender, pod("bad", ctr(limits={COUNT: "1", MEMORY: "2.5"})), names)
    assert result["Error"] == \
        f'pod default/bad: container "main": {MEMORY} "2.5" is not a whole number of units of 256 MiB'
    assert ALLOCATED not in (api.get("pods", "bad", namespace="default")["metadata"].get("annotations") or {})


DCU_REGISTRATION = ("DCU-0,4,65520,100,DCU-K100_AI,0,true,0,hami-core:"
                    "DCU-1,4,65520,100,DCU-K100_AI,1,true,1,hami-core:")


async def test_garbled_capacity_is_refused_while_the_nodes_dcus_still_work(api, app, extender):
    node = mlu_node("mixed", cores="2500m", annotations={DCU_REGISTER: DCU_REGISTRATION,
                                                        "hami.io/node-handshake-dcu": "Reported 2026-01-01 00:00:00"},
                    extra_capacity={"hygon.com/dcunum": "8"})
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["mixed"].decode_error == \
        f'node capacity {CORES}/{MEMORY}: {CORES} "2500m" is not a whole number'
    assert [d["id"] for d in app.cache.device_usage("mixed")] == ["DCU-0", "DCU-1"]
    _, result = await place(api, extender, pod("mlu", ctr(limits={COUNT: "1"})), names)
    assert result["FailedNodes"] == {"mixed": f"registration refused: {app.cache.nodes['mixed'].decode_error}"}, result
    _, result = await place(api, extender, pod("dcu", ctr(limits={"hygon.com/dcunum": "1", "hygon.com/dcumem": "1024"})),
                            names)
    assert result["NodeNames"] == ["mixed"], result
    assert_books_balance(app)


async def test_pod_asking_for_mlu_and_dcu_gets_one_allocation_per_family(api, app, extender):
    node = mlu_node("both", annotations={DCU_REGISTER: DCU_REGISTRATION,
                                         "hami.io/node-handshake-dcu": "Reported 2026-01-01 00:00:00"},
                    extra_capacity={"hygon.com/dcunum": "8"})
    names = await register_nodes(api, app, node)
    two = pod("two", ctr(limits={COUNT: "1", MEMORY: "8"}, name="mlu-user"),
              ctr(limits={"hygon.com/dcunum": "1", "hygon.com/dcumem": "2048", "hygon.com/dcucores": "30"},
                  name="dcu-user"))
    stored, result = await place(api, extender, two, names)
    assert result["NodeNames"] == ["both"], result
    ann = decision_annotations(api, app, "two")
    mlu = decode_pod_devices(ann[ALLOCATED])
    dcu = decode_pod_devices(ann["hami.io/dcu-devices-allocated"])
    # one slot per container in each family's annotation, the other family's container empty
    assert [[(d.type, d.usedmem, d.usedcores) for d in c] for c in mlu] == [[("MLU", 2048, 100)], []]
    assert [[(d.type, d.usedmem, d.usedcores) for d in c] for c in dcu] == [[], [("DCU", 2048, 30)]]
    assert ann["hami.io/dcu-devices-to-allocate"] == ann["hami.io/dcu-devices-allocated"]
    assert ann[PROFILE] == f"{device_index(mlu[0][0].uuid)}_100_8"
    assert (await _bind(app, extender, stored, "both"))["Error"] == ""
    assert_books_balance(app)


async def test_admission_over_http_then_schedule(api, app, extender):
    from tests.test_webhook import envelope
    names = await register_nodes(api, app, mlu_node("w"))
    candidate = make_pod(container(limits={COUNT: "1", MEMORY: "4"}), namespace="default")
    status, answer = await extender.post("webhook", envelope(candidate, uid="u1"))
    assert status == 200 and answer["response"]["allowed"] is True
    status, answer = await extender.post("webhook", envelope(
        make_pod(container(limits={COUNT: "1", CORES: "abc"}), namespace="default"), uid="u2"))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"] == \
        f"invalid {CORES} value abc in container main: must be an integer between 0 and 100"
    candidate["spec"]["schedulerName"] = "hami-scheduler"
    _, result = await place(api, extender, candidate, names)
    assert result["NodeNames"] == ["w"]


def test_registry_builds_mlu_from_the_chart_defaults():
    vendors = build_vendors(DeviceConfig.default())
    assert isinstance(vendors["MLU"], CambriconVendor)


async def test_pods_pick_and_avoid_mlu_models_end_to_end(api, app, extender):
    """#2780 end to end: two nodes of different models; the type annotations choose the node, the
    allocation still names the family (``MLU``), and relabelling a node changes its cards' type."""
    names = await register_nodes(api, app, mlu_node("m370", model="MLU370-X4"), mlu_node("m590", model="MLU590"))
    _, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "1"}),
                                               annotations={"cambricon.com/use-mlutype": "MLU590"}), names)
    assert result["NodeNames"] == ["m590"], result
    assert ",MLU,256,100:;" in decision_annotations(api, app, "p")[ALLOCATED]
    _, result = await place(api, extender, pod("q", ctr(limits={COUNT: "1", MEMORY: "1"}),
                                               annotations={"cambricon.com/nouse-mlutype": "mlu590"}), names)
    assert result["NodeNames"] == ["m370"], result
    _, result = await place(api, extender, pod("none", ctr(limits={COUNT: "1"}),
                                               annotations={"cambricon.com/use-mlutype": "MLU580"}), names)
    assert result["FailedNodes"] == {"m370": "2/2 CardTypeMismatch", "m590": "2/2 CardTypeMismatch"}
    # The plugin relabels the node: its cards take the new model at once.
    node = api.get("nodes", "m370")
    node["metadata"]["labels"]["Model"] = "MLU590-M9"
    api.update("nodes", node)
    await wait_until(lambda: {d.type for d in app.cache.nodes["m370"].devices} == {"MLU590-M9"}, "relabelled")
    _, result = await place(api, extender, pod("r", ctr(limits={COUNT: "1", MEMORY: "1"}),
                                               annotations={"cambricon.com/use-mlutype": "MLU590-M9"}), names)
    assert result["NodeNames"] == ["m370"], result
    assert_books_balance(app)

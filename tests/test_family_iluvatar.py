"""Iluvatar: one vendor per ``iluvatars`` entry behind ``--enable-iluvatar``, legacy registration
per common word, requests (256 MiB units, cores default 0), UUID gates, the webhook's core
default and ``SOL_CONTINER_NAME``, and end to end against the in-repo API server.

Fixtures are upstream's (pkg/device/iluvatar/device_test.go, the feature inventory's
webhook-iluvatar and v-iluvatar rows).
"""
from __future__ import annotations

import base64

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices.base import ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.iluvatar import IluvatarConfig, IluvatarVendor, build_family, parse_iluvatar_configs
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.embedded import embedded_options
from hami_py.reasons import CARD_UUID_MISMATCH, OK
from tests.conftest import container as any_container, decision_annotations, assert_books_balance, place, register_nodes, wait_until
from tests.test_webhook import admit, apply_json_patch, container, envelope, make_pod

ON = FamilySwitches(enable_iluvatar=True)
COUNT = "iluvatar.ai/MR-V100-vgpu"
MEMORY = "iluvatar.ai/MR-V100.vMem"
CORES = "iluvatar.ai/MR-V100.vCore"
REGISTER = "hami.io/node-MR-V100-register"
HANDSHAKE = "hami.io/node-handshake-MR-V100"
TO_ALLOCATE = "hami.io/MR-V100-devices-to-allocate"
ALLOCATED = "hami.io/MR-V100-devices-allocated"
UPSTREAM_REGISTRATION = "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,10,8192,100,MR-V100,0,true:"
# Two 32 GiB BI-V150 cards (9-field form) for the second kind.
BI_V150_REGISTRATION = ("GPU-5b4c1a52-0e8d-4b7f-9f44-1c0b6f0b0001,4,32768,100,BI-V150,0,true,0,hami-core:"
                        "GPU-5b4c1a52-0e8d-4b7f-9f44-1c0b6f0b0002,4,32768,100,BI-V150,0,true,1,hami-core:")
CHART_VENDORS_ON = build_vendors(DeviceConfig.default(), ON)


def mr_v100() -> IluvatarVendor:
    return build_family(DeviceConfig.default(), ON)[0]


def ctr(limits=None, requests=None, name="main", env=None) -> dict:
    return any_container(limits, requests, name, image="corex:latest", env=env)

def iluvatar_node(name: str, annotations: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
            "status": {"capacity": {COUNT: "10", "cpu": "32"}, "allocatable": {COUNT: "10", "cpu": "32"}}}


def standard_node(name: str = "ix-1") -> dict:
    return iluvatar_node(name, {REGISTER: UPSTREAM_REGISTRATION, HANDSHAKE: "Reported 2026-01-01 00:00:00",
                                "hami.io/node-BI-V150-register": BI_V150_REGISTRATION,
                                "hami.io/node-handshake-BI-V150": "Reported 2026-01-01 00:00:00"})


def pod(name: str, *containers: dict, annotations: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)}}


# ---------------------------------------------------------------------------------------------
# Families, names, inventory
# ---------------------------------------------------------------------------------------------

def test_kinds_are_built_only_with_the_switch_one_per_entry():
    assert build_family(DeviceConfig.default(), FamilySwitches()) == []
    assert "MR-V100" not in build_vendors(DeviceConfig.default())
    kinds = build_family(DeviceConfig.default(), ON)
    assert [k.vendor_key for k in kinds] == ["MR-V100", "MR-V50", "BI-V150", "BI-V100"]
    v = kinds[0]
    assert (v.register_annotation, v.handshake_annotation, v.to_allocate_annotation, v.allocated_annotation,
            v.count_resource_name) == (REGISTER, HANDSHAKE, TO_ALLOCATE, ALLOCATED, COUNT)
    assert v.resource_names() == [COUNT, MEMORY, CORES]
    assert v.quota_resources() == ("", "", 1) and v.uses_node_lock is True


def test_registration_of_the_kind_is_decoded():
    # upstream's Test_GetNodeDevices fixture
    assert mr_v100().parse_node_devices(NodeView.of({REGISTER: UPSTREAM_REGISTRATION})) == [
        DeviceInfo(id="GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae", index=0, count=10, devmem=8192, devcore=100,
                   type="MR-V100", numa=0, mode="hami-core", health=True)]
    # another kind's registration is not this kind's
    assert mr_v100().parse_node_devices(NodeView.of({"hami.io/node-BI-V150-register": BI_V150_REGISTRATION})) == []
    with pytest.raises(DeviceDecodeError) as err:
        mr_v100().parse_node_devices(NodeView.of({REGISTER: "GPU-x,10,8192,100,MR-V100,0:"}))
    assert str(err.value) == "unexpected field count 6 in node annotation"


# ---------------------------------------------------------------------------------------------
# Requests (upstream's Test_GenerateResourceRequests)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("container,expected", [
    (ctr(limits={COUNT: "1", MEMORY: "1000", CORES: "100"}, requests={COUNT: "1", MEMORY: "1000", CORES: "100"}),
     ContainerRequest("MR-V100", 1, 256000, 0, 100)),
    (ctr(limits={COUNT: "1"}, requests={COUNT: "1"}), ContainerRequest("MR-V100", 1, 0, 100, 0)),   # cores default 0
    (ctr(requests={COUNT: "2", MEMORY: "8"}), ContainerRequest("MR-V100", 2, 2048, 0, 0)),
])
def test_request_follows_upstreams_rules(container, expected):
    assert mr_v100().container_request(container, pod_annotations={}) == expected


@pytest.mark.parametrize("limits,message", [
    ({COUNT: "1", MEMORY: "16Gi"},
     f'container "main": {MEMORY} "16Gi" is out of range: must be between 0 and 8388607 units of 256 MiB'),
    ({COUNT: "1", MEMORY: "16.5"}, f'container "main": {MEMORY} "16.5" is not a whole number of units of 256 MiB'),
    # upstream silently uses 0 cores for a non-integer value
    ({COUNT: "1", CORES: "50m"},
     f"invalid {CORES} value 50m in container main: must be an integer between 0 and 2147483647"),
    ({COUNT: "0.5"}, f"invalid {COUNT} request in container main: device count 0.5 is not a plain integer"),
    # HAMi after v2.10: above 100 on several cards is their total, evenly divided, each card <= 100
    ({COUNT: "3", CORES: "250"}, f"invalid {CORES} value 250 in container main: 250 does not divide evenly "
                                 "across 3 devices"),
    ({COUNT: "2", CORES: "300"}, f"invalid {CORES} value 300 in container main: 150 a device, "
                                 "must be an integer between 0 and 100"),
    ({COUNT: "1", CORES: "150"}, f"invalid {CORES} value 150 in container main: 150 a device, "
                                 "must be an integer between 0 and 100"),
])
def test_malformed_request_is_refused_precisely(limits, message):
    with pytest.raises(RequestError) as err:
        mr_v100().container_request(ctr(limits=limits), pod_annotations={})
    assert str(err.value) == message


@pytest.mark.parametrize("count, cores, each", [("2", "200", 100), ("4", "400", 100), ("3", "150", 50),
                                                 ("2", "50", 50), ("1", "100", 100), ("2", "100", 100)])
def test_cores_above_100_on_several_cards_are_their_total(count, cores, each):
    """The webhook writes ``count x 100`` for several whole cards; a total above 100 is divided
    among the cards (HAMi after v2.10), one of 100 or less is each card's, as upstream."""
    request = mr_v100().container_request(ctr(limits={COUNT: count, CORES: cores}), pod_annotations={})
    assert (request.nums, request.coresreq) == (int(count), each)


def test_uuid_annotations_are_per_common_word():
    v = mr_v100()
    a = DeviceInfo(id="GPU-a", index=0, count=10, devmem=8192, devcore=100, type="MR-V100", health=True)
    b = DeviceInfo(id="GPU-b", index=1, count=10, devmem=8192, devcore=100, type="MR-V100", health=True)
    avoid = v.device_selector({"hami.io/no-use-MR-V100-uuid": "GPU-a"}, {})
    assert (avoid(a), avoid(b)) == (CARD_UUID_MISMATCH, OK)
    use = v.device_selector({"hami.io/use-MR-V100-uuid": "GPU-a"}, {})
    assert (use(a), use(b)) == (OK, CARD_UUID_MISMATCH)
    assert v.device_selector({"hami.io/use-BI-V150-uuid": "GPU-a"}, {}) is None


def test_allocation_annotations_use_the_common_word():
    v = mr_v100()
    out = v.encode_allocation([[ContainerDevice("GPU-a", "MR-V100", 1024, 0)]])
    assert out == {TO_ALLOCATE: "GPU-a,MR-V100,1024,0:;", ALLOCATED: "GPU-a,MR-V100,1024,0:;"}
    assert v.decision_annotations() == (TO_ALLOCATE, ALLOCATED)


# ---------------------------------------------------------------------------------------------
# Webhook (upstream's Test_MutateAdmission and the webhook-iluvatar row)
# ---------------------------------------------------------------------------------------------

def test_webhook_gives_several_cards_all_their_cores_and_names_the_container():
    v = mr_v100()
    c = ctr(limits={COUNT: 2, CORES: 1})
    assert v.mutate_admission(c, {}) is True
    assert c["resources"]["limits"] == {COUNT: 2, CORES: "200"}       # written over, as upstream
    assert c["env"] == [{"name": "SOL_CONTINER_NAME", "value": "main"}]
    one = ctr(limits={COUNT: "1", MEMORY: "4"}, env=[{"name": "A", "value": "b"}])
    assert v.mutate_admission(one, {}) is True
    assert one["resources"]["limits"] == {COUNT: "1", MEMORY: "4"}
    assert one["env"] == [{"name": "A", "value": "b"}, {"name": "SOL_CONTINER_NAME", "value": "main"}]


def test_webhook_keeps_an_existing_variable_and_skips_a_nameless_container():
    v = mr_v100()
    named = ctr(limits={COUNT: "1"}, env=[{"name": "SOL_CONTINER_NAME", "value": "mine"}])
    assert v.mutate_admission(named, {}) is True
    assert named["env"] == [{"name": "SOL_CONTINER_NAME", "value": "mine"}]
    nameless = ctr(limits={COUNT: "3"}, name="")
    assert v.mutate_admission(nameless, {}) is True
    assert "env" not in nameless and nameless["resources"]["limits"][CORES] == "300"
    # a count in requests only is not recognised (upstream reads limits), and nothing changes
    untouched = ctr(requests={COUNT: "2"})
    assert v.mutate_admission(untouched, {}) is False
    assert untouched == ctr(requests={COUNT: "2"})


def test_webhook_refuses_a_fractional_count():
    with pytest.raises(RequestError) as err:
        mr_v100().mutate_admission(ctr(limits={COUNT: "1.5"}), {})
    message = f"invalid {COUNT} request in container main: device count 1.5 is not a plain integer"
    assert str(err.value) == message
    response, _ = admit(make_pod(container(limits={COUNT: "1.5"})), vendors=CHART_VENDORS_ON)
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": message}


def test_webhook_patch_through_the_review():
    response, patched = admit(make_pod(container("infer", limits={COUNT: "2"})), vendors=CHART_VENDORS_ON)
    assert response["allowed"] is True
    mutated = patched["spec"]["containers"][0]
    assert mutated["resources"]["limits"][CORES] == "200"
    assert {"name": "SOL_CONTINER_NAME", "value": "infer"} in mutated["env"]
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    # without the switch the webhook leaves the pod alone (config-gated-vendors)
    _, patched = admit(make_pod(container("infer", limits={COUNT: "2"})))
    assert patched["spec"]["schedulerName"] == "default-scheduler"
    assert "env" not in patched["spec"]["containers"][0]


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------

def test_config_entries():
    assert parse_iluvatar_configs(Section.of("iluvatars", None)) == []
    assert parse_iluvatar_configs(Section.of("iluvatars", [{"commonWord": "MR-V100"}])) == \
        [IluvatarConfig(common_word="MR-V100")]
    for section, message in [
        ({"commonWord": "x"}, "device config: iluvatars: expected a list, got mapping"),
        (["MR-V100"], "device config: iluvatars[0]: expected a mapping, got string"),
        ([{"commonWord": "a"}, {"commonWord": "b", "resourceCoreName": 5}],
         'device config: iluvatars[1].resourceCoreName: expected a string, got integer "5"'),
        ([{"commonWord": "a"}, None], "device config: iluvatars[1]: expected a mapping, got null"),
        ([{"chipName": "MR-V100"}],
         "device config: iluvatars[0].commonWord: must not be empty (it names the kind's annotations)"),
        ([{"commonWord": "MR-V100"}, {"commonWord": "MR-V100"}],
         "device config: iluvatars[1].commonWord: 'MR-V100' is already used by an earlier entry"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_iluvatar_configs(Section.of("iluvatars", section))
        assert str(err.value) == message
    # switched off: types are still checked (upstream decodes the whole file), the rest is not used
    assert parse_iluvatar_configs(Section.of("iluvatars", [{"chipName": "MR-V100"}]), enabled=False) == \
        [IluvatarConfig(chip_name="MR-V100")]
    with pytest.raises(ConfigError):
        parse_iluvatar_configs(Section.of("iluvatars", [{"commonWord": 1}]), enabled=False)


# ---------------------------------------------------------------------------------------------
# End to end (the scheduler runs with --enable-iluvatar)
# ---------------------------------------------------------------------------------------------

ENABLED = [embedded_options(enable_iluvatar=True)]


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_iluvatar_pod_is_filtered_and_bound_with_upstreams_annotations(api, app, extender):
    names = await register_nodes(api, app, standard_node())
    stored, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1", MEMORY: "4"})), names)
    assert result["NodeNames"] == ["ix-1"] and result["Error"] == "", result
    ann = decision_annotations(api, app, "p")
    assert ann[ALLOCATED] == ann[TO_ALLOCATE] == "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,MR-V100,1024,0:;"
    before = app.device_plugin.allocated
    assert (await extender.bind(stored, "ix-1"))["Error"] == ""
    await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "ix-1"
    assert_books_balance(app)


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_each_kind_gets_its_own_cards_and_annotations(api, app, extender):
    names = await register_nodes(api, app, standard_node())
    two = pod("two", ctr(limits={"iluvatar.ai/BI-V150-vgpu": "2", "iluvatar.ai/BI-V150.vMem": "16",
                                 "iluvatar.ai/BI-V150.vCore": "200"}, name="train"))
    _, result = await place(api, extender, two, names)
    assert result["NodeNames"] == ["ix-1"], result
    ann = decision_annotations(api, app, "two")
    assert ALLOCATED not in ann
    devices = decode_pod_devices(ann["hami.io/BI-V150-devices-allocated"])
    # 200 cores over two cards: clamped to 100 per card by the fit, as upstream
    assert sorted((d.uuid[-4:], d.type, d.usedmem, d.usedcores) for d in devices[0]) == [
        ("0001", "BI-V150", 4096, 100), ("0002", "BI-V150", 4096, 100)]
    assert ann["hami.io/BI-V150-devices-to-allocate"] == ann["hami.io/BI-V150-devices-allocated"]
    assert_books_balance(app)


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_no_use_uuid_is_card_uuid_mismatch(api, app, extender):
    """Inventory row v-iluvatar."""
    names = await register_nodes(api, app, standard_node())
    _, result = await place(api, extender, pod("p", ctr(limits={COUNT: "1"}), annotations={
        "hami.io/no-use-MR-V100-uuid": "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae"}), names)
    assert result["FailedNodes"] == {"ix-1": "1/1 CardUuidMismatch"}


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_garbled_registration_of_one_kind_leaves_the_other_working(api, app, extender):
    node = iluvatar_node("ix-2", {REGISTER: "GPU-x,ten,8192,100,MR-V100,0,true:",
                                  "hami.io/node-BI-V150-register": BI_V150_REGISTRATION})
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["ix-2"].decode_error == \
        f'{REGISTER}: invalid count field: strconv.ParseInt: parsing "ten": invalid syntax'
    _, result = await place(api, extender, pod("mr", ctr(limits={COUNT: "1"})), names)
    assert result["FailedNodes"] == {"ix-2": f"registration refused: {app.cache.nodes['ix-2'].decode_error}"}
    _, result = await place(api, extender, pod("bi", ctr(limits={"iluvatar.ai/BI-V150-vgpu": "1"})), names)
    assert result["NodeNames"] == ["ix-2"], result


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_malformed_request_is_refused_by_the_filter(api, app, extender):
    names = await register_nodes(api, app, standard_node())
    _, result = await place(api, extender, pod("bad", ctr(limits={COUNT: "1", MEMORY: "-4"})), names)
    assert result["Error"] == (f'pod default/bad: container "main": {MEMORY} "-4" is out of range: '
                               'must be between 0 and 8388607 units of 256 MiB')


@pytest.mark.parametrize("scheduler_options", ENABLED)
async def test_admission_over_http_then_schedule(api, app, extender):
    names = await register_nodes(api, app, standard_node())
    candidate = make_pod(container("infer", limits={COUNT: "1", MEMORY: "2"}), namespace="default")
    status, answer = await extender.post("webhook", envelope(candidate, uid="i1"))
    assert status == 200 and answer["response"]["allowed"] is True
    admitted = apply_json_patch(candidate, orjson.loads(base64.b64decode(answer["response"]["patch"])))
    assert admitted["spec"]["containers"][0]["env"] == [{"name": "SOL_CONTINER_NAME", "value": "infer"}]
    admitted["metadata"]["name"] = "infer-pod"
    _, result = await place(api, extender, admitted, names)
    assert result["NodeNames"] == ["ix-1"], result
    ann = decision_annotations(api, app, "infer-pod")
    assert ann[ALLOCATED] == "GPU-bad51c5a-ed4c-591d-91bf-c04a12e19eae,MR-V100,512,0:;"


async def test_without_the_switch_iluvatar_pods_are_not_ours(api, app, extender):
    """Inventory row config-gated-vendors, with Iluvatar."""
    api.create("nodes", standard_node("ix-3"))
    await wait_until(lambda: "ix-3" in app.cache.nodes, "node seen")
    assert app.cache.device_usage("ix-3") == []
    created = api.create("pods", pod("p", ctr(limits={COUNT: "1"})))
    result = await extender.filter(created, ["ix-3", "other"])
    assert result["NodeNames"] == ["ix-3", "other"] and result["Error"] == ""
    assert ALLOCATED not in (api.get("pods", "p", namespace="default")["metadata"].get("annotations") or {})

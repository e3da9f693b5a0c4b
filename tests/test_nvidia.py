"""The NVIDIA vendor: inventory decoding, request parsing (upstream's rules plus the loud refusal
of malformed values), device selection annotations, allocation annotations, and the registry."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.base import ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError
from hami_py.devices.nvidia import (
    ALLOCATED_ANNOTATION, CORDON_ANNOTATION, NOUSE_TYPE_ANNOTATION, NOUSE_UUID_ANNOTATION,
    PAIR_SCORE_ANNOTATION, PAIR_SCORES_KEY, REGISTER_ANNOTATION, TO_ALLOCATE_ANNOTATION,
    USE_TYPE_ANNOTATION, USE_UUID_ANNOTATION, VGPU_MODE_ANNOTATION, NvidiaConfig, NvidiaVendor, nvidia_config,
    parse_numa_bind,
)
from hami_py.devices.registry import build_vendors, managed_resource_names
from hami_py import reasons

FIXTURES = Path(__file__).parent / "fixtures"
H200_UUID = "GPU-1ca6d50e-73bd-0dc1-9ce8-0be2a804bec6"
# An eight-GPU H200 node; only the first UUID is from real hardware, the rest are made up.
H200_UUIDS = [H200_UUID] + [f"GPU-1ca6d50e-73bd-0dc1-9ce8-0be2a804bec{i}" for i in range(7)]


@pytest.fixture
def vendor() -> NvidiaVendor:
    return NvidiaVendor(nvidia_config(DeviceConfig.default()))


def h200(index=0, uuid=H200_UUID, mode="hami-core", type_="NVIDIA H200", numa=0) -> DeviceInfo:
    return DeviceInfo(id=uuid, index=index, count=10, devmem=143771, devcore=100, type=type_,
                      numa=numa, mode=mode, health=True)


def h200_register(count=8) -> str:
    return orjson.dumps([
        {"id": uuid, "index": i, "count": 10, "devmem": 143771, "devcore": 100, "type": "NVIDIA H200",
         "numa": 0 if i < 4 else 1, "mode": "hami-core", "health": True}
        for i, uuid in enumerate(H200_UUIDS[:count])]).decode()


# ---------------------------------------------------------------------------------------------
# vendor identity and registry
# ---------------------------------------------------------------------------------------------

def test_vendor_keys_and_annotations(vendor):
    assert vendor.vendor_key == "NVIDIA"
    assert vendor.register_annotation == "hami.io/node-nvidia-register"
    assert vendor.handshake_annotation == "hami.io/node-handshake"
    assert vendor.to_allocate_annotation == "hami.io/vgpu-devices-to-allocate"
    assert vendor.allocated_annotation == "hami.io/vgpu-devices-allocated"


def test_resource_names_from_config(vendor):
    assert vendor.resource_names() == ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage",
                                       "nvidia.com/gpucores", "nvidia.com/priority"]
    renamed = NvidiaVendor(NvidiaConfig(resource_count_name="example.com/vgpu", resource_memory_name="example.com/vmem"))
    assert renamed.resource_names() == ["example.com/vgpu", "example.com/vmem"]


def test_registry_builds_nvidia_first_and_lists_managed_resources():
    vendors = build_vendors(DeviceConfig.default())
    assert list(vendors)[0] == "NVIDIA"
    assert isinstance(vendors["NVIDIA"], NvidiaVendor)
    assert managed_resource_names(vendors)[:5] == ["nvidia.com/gpu", "nvidia.com/gpumem",
                                                   "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
                                                   "nvidia.com/priority"]


def test_registry_builds_nvidia_even_without_its_section():
    config = DeviceConfig(sections={"hygon": {"resourceCountName": "hygon.com/dcunum"}})
    vendors = build_vendors(config)
    assert "NVIDIA" in vendors
    assert vendors["NVIDIA"].resource_names() == []
    assert "nvidia.com/gpu" not in managed_resource_names(vendors)


# ---------------------------------------------------------------------------------------------
# inventory
# ---------------------------------------------------------------------------------------------

def test_parse_real_h200_node_fixture(vendor):
    node = orjson.loads((FIXTURES / "node-nvidia-h200.json").read_bytes())
    assert vendor.parse_node_devices(NodeView.from_node(node)) == [h200()]


def test_parse_eight_gpu_node(vendor):
    devices = vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: h200_register()}))
    assert [d.id for d in devices] == H200_UUIDS
    assert [d.numa for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.health and d.devmem == 143771 and d.count == 10 for d in devices)


def test_no_register_annotation_means_no_devices(vendor):
    assert vendor.parse_node_devices(NodeView.of({})) == []
    assert vendor.parse_node_devices(NodeView.of({"hami.io/node-dcu-register": "x"})) == []


@pytest.mark.parametrize("text", ["[]", "null", ":", " [ ] "])
def test_empty_inventory_is_an_error(vendor, text):
    with pytest.raises(DeviceDecodeError) as err:
        vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: text}))
    assert str(err.value) == "no gpu found on node"


def test_legacy_register_format_is_accepted(vendor):
    legacy = f"{H200_UUID},10,143771,100,NVIDIA H200,0,true:"
    assert vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: legacy})) == [h200()]


def test_register_errors_name_the_annotation(vendor):
    with pytest.raises(DeviceDecodeError) as err:
        vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: '[{"id":"GPU-a","count":"10"}]'}))
    assert str(err.value) == ('hami.io/node-nvidia-register: device 0: field "count": '
                              'expected an integer (int32), got string "10"')
    with pytest.raises(DeviceDecodeError) as err:
        vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: "GPU-a,10,1024,100,NVIDIA,0,maybe:"}))
    assert str(err.value) == ('hami.io/node-nvidia-register: invalid health field: '
                              'strconv.ParseBool: parsing "maybe": invalid syntax')
    with pytest.raises(DeviceDecodeError, match="^hami.io/node-nvidia-register: invalid JSON"):
        vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: "[{"}))


def test_pair_scores_are_attached(vendor):
    a, b, c = H200_UUIDS[:3]
    scores = orjson.dumps([
        {"uuid": a, "score": {b: 1800, c: 1800}},
        {"UUID": b, "Score": {a: 1800, c: 1800}},
        {"uuid": "GPU-not-on-this-node", "score": {a: 5}},
        {"uuid": a, "score": {b: 1}},  # a later duplicate: the first entry wins, as upstream
    ]).decode()
    devices = vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: h200_register(3), PAIR_SCORE_ANNOTATION: scores}))
    assert devices[0].custom[PAIR_SCORES_KEY] == {b: 1800, c: 1800}
    assert devices[1].custom[PAIR_SCORES_KEY] == {a: 1800, c: 1800}
    assert PAIR_SCORES_KEY not in devices[2].custom


def test_pair_scores_null_means_none(vendor):
    devices = vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: h200_register(1), PAIR_SCORE_ANNOTATION: "null"}))
    assert devices[0].custom == {}


@pytest.mark.parametrize("scores, message", [
    ("not json", "hami.io/node-nvidia-score: invalid JSON: "),
    ('{"uuid":"a"}', "hami.io/node-nvidia-score: expected a JSON array"),
    ('[5]', "hami.io/node-nvidia-score: entry 0: expected an object"),
    ('[{"uuid":5}]', 'hami.io/node-nvidia-score: entry 0: field "uuid": expected a string'),
    ('[{"uuid":"a","score":[1]}]', 'hami.io/node-nvidia-score: entry 0: field "score": expected an object of integers'),
    ('[{"uuid":"a","score":{"b":1.5}}]',
     'hami.io/node-nvidia-score: entry 0: field "score": "b": expected an integer, got 1.5'),
])
def test_invalid_pair_scores_reject_the_whole_node(vendor, scores, message):
    with pytest.raises(DeviceDecodeError) as err:
        vendor.parse_node_devices(NodeView.of({REGISTER_ANNOTATION: h200_register(1), PAIR_SCORE_ANNOTATION: scores}))
    assert str(err.value).startswith(message)


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------

def container(limits=None, requests=None, name="train") -> dict:
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "cuda:12", "resources": resources}


def request(vendor, limits=None, requests=None):
    return vendor.container_request(container(limits, requests), pod_annotations={})


def nv(nums=1, memreq=0, mempct=101, coresreq=0) -> ContainerRequest:
    return ContainerRequest(vendor="NVIDIA", nums=nums, memreq=memreq, mempct=mempct, coresreq=coresreq)


def test_no_count_means_no_request(vendor):
    assert request(vendor) is None
    assert request(vendor, {"cpu": "1", "memory": "1Gi"}) is None
    assert request(vendor, {"nvidia.com/gpumem": "1000"}) is None  # the webhook adds the count
    assert vendor.container_request({"name": "bare"}, pod_annotations={}) is None
    assert vendor.container_request({"name": "null", "resources": None}, pod_annotations={}) is None


def test_count_zero_means_no_request(vendor):
    assert request(vendor, {"nvidia.com/gpu": "0"}) is None
    assert request(vendor, {"nvidia.com/gpu": "0", "nvidia.com/gpumem": "junk"}) is None


def test_count_only_takes_the_whole_card(vendor):
    assert request(vendor, {"nvidia.com/gpu": "1"}) == nv(mempct=100)
    assert request(vendor, {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}) == nv(2, mempct=100, coresreq=100)


def test_limits_win_over_requests(vendor):
    assert request(vendor, {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}).nums == 2
    assert request(vendor, None, {"nvidia.com/gpu": "3"}).nums == 3
    got = request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"},
                  {"nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"})
    assert got == nv(memreq=20000, coresreq=30)


def test_memory_in_mib(vendor):
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "71885", "nvidia.com/gpucores": "50"}) == \
        nv(memreq=71885, coresreq=50)
    # explicit memory keeps the percentage sentinel even when a percentage is given too
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpumem-percentage": "50"}) == \
        nv(memreq=8000, mempct=50)


def test_quantity_forms_are_read_by_value(vendor):
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1k"}).memreq == 1000
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1Ki"}).memreq == 1024
    assert request(vendor, {"nvidia.com/gpu": "1e0", "nvidia.com/gpumem": "8e3"}) == nv(memreq=8000)
    assert request(vendor, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}) == nv(memreq=4096)


def test_memory_zero_falls_back_to_default(vendor):
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}) == nv(mempct=100)


def test_memory_factor_multiplies_and_bounds(vendor):
    scaled = NvidiaVendor(replace(nvidia_config(DeviceConfig.default()), memory_factor=1024))
    assert request(scaled, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "16"}) == nv(memreq=16384)
    assert request(scaled, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2097151"}).memreq == 2097151 * 1024
    with pytest.raises(RequestError) as err:
        request(scaled, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2097152"})
    assert str(err.value) == ('container "train": nvidia.com/gpumem "2097152" is out of range: must be '
                              'between 0 and 2097151 units of 1024 MiB (memoryFactor)')
    # factor 0 (missing key) behaves as 1
    unscaled = NvidiaVendor(replace(nvidia_config(DeviceConfig.default()), memory_factor=0))
    assert request(unscaled, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2147483647"}).memreq == 2147483647


def test_percentage_rules(vendor):
    def pct(value):
        return request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": value}).mempct
    assert pct("50") == 50
    assert pct("100") == 100
    assert pct("0") == 100     # ignored, then the whole-card default applies
    assert pct("1") == 1
    # HAMi after v2.10 (#2789): anything but an integer in 0..100 is refused, never clamped or ignored.
    for value in ("150", "-5", "50.5", "1e3"):
        with pytest.raises(RequestError) as err:
            pct(value)
        assert str(err.value) == (f"invalid nvidia.com/gpumem-percentage value {value} in container train: "
                                  "must be an integer between 0 and 100")


def test_default_memory_and_cores_from_config():
    config = replace(nvidia_config(DeviceConfig.default()), default_memory=4096, default_cores=25, memory_factor=4)
    tuned = NvidiaVendor(config)
    # default memory is MiB already: not multiplied by the factor
    assert request(tuned, {"nvidia.com/gpu": "1"}) == nv(memreq=4096, coresreq=25)
    assert request(tuned, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "30"}) == nv(mempct=30, coresreq=25)
    assert request(tuned, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"}) == nv(memreq=4096, coresreq=0)


def test_cores_above_100_are_refused_not_clamped(vendor):
    """HAMi after v2.10 (#2740, #2784): cores outside 0..100 are refused, no longer clamped to 100."""
    assert request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "100"}).coresreq == 100
    with pytest.raises(RequestError) as err:
        request(vendor, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})
    assert str(err.value) == ("invalid nvidia.com/gpucores value 150 in container train: "
                              "must be an integer between 0 and 100")


def test_renamed_resources_follow_config():
    renamed = NvidiaVendor(replace(nvidia_config(DeviceConfig.default()), resource_count_name="example.com/vgpu",
                                   resource_memory_name="example.com/vgpu-memory"))
    assert request(renamed, {"nvidia.com/gpu": "1"}) is None
    assert request(renamed, {"example.com/vgpu": "1", "example.com/vgpu-memory": "1000"}) == nv(memreq=1000)


def _refused(resource: str, value: object, problem: str, *, shown: str | None = None) -> tuple[dict, str]:
    """A table row: limits with ``resource: value`` (beside one GPU, unless it is the count) and
    the refusal naming the container, the resource and the value as written."""
    limits: dict = {} if resource == "nvidia.com/gpu" else {"nvidia.com/gpu": "1"}
    limits[resource] = value
    return limits, f'container "train": {resource} "{value if shown is None else shown}" {problem}'


def _bad_count(value: object, reason: str) -> tuple[dict, str]:
    return {"nvidia.com/gpu": value}, f"invalid nvidia.com/gpu request in container train: device count {reason}"


def _bad_cores(value: str) -> tuple[dict, str]:
    return ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": value},
            f"invalid nvidia.com/gpucores value {value} in container train: must be an integer between 0 and 100")


@pytest.mark.parametrize("limits, message", [
    _bad_count("1.5", "1.5 is not a plain integer"),
    _bad_count("500m", "500m is not a plain integer"),
    _bad_count("two", "two is not a plain integer"),
    _bad_count("1e19", "1e19 is not a plain integer"),     # beyond int64
    _bad_count("-1", "-1 is out of range"),
    _bad_count("3e9", "3e9 is out of range"),
    _bad_count("2147483648", "2147483648 is out of range"),  # MaxInt32 + 1
    _bad_count("1Ei", "1Ei is out of range"),     # judged by value: 2^60 (upstream: not a plain integer)
    _bad_count(None, '"null" is not a plain integer'),
    _bad_count(1.5, "1.5 is not a plain integer"),
    _refused("nvidia.com/gpumem", "1.5", "is not a whole number of MiB"),
    _refused("nvidia.com/gpumem", "0.3Ki", "is not a whole number of MiB"),
    _refused("nvidia.com/gpumem", "1500m", "is not a whole number of MiB"),
    _refused("nvidia.com/gpumem", "-1", "is out of range: must be between 0 and 2147483647 MiB"),
    _refused("nvidia.com/gpumem", "2Gi", "is out of range: must be between 0 and 2147483647 MiB"),
    _bad_cores("12.5"),
    _bad_cores("-10"),
    _bad_cores("101"),
    _bad_cores("1e10"),
])
def test_malformed_values_are_refused_loudly(vendor, limits, message):
    # upstream silently drops the whole request (defect 17.5); we name the container and value
    with pytest.raises(RequestError) as err:
        request(vendor, limits)
    assert str(err.value) == message


def test_malformed_value_in_requests_is_refused_too(vendor):
    with pytest.raises(RequestError, match=r'^container "train": nvidia.com/gpumem "lots" is not a whole number of MiB$'):
        request(vendor, {"nvidia.com/gpu": "1"}, {"nvidia.com/gpumem": "lots"})


# ---------------------------------------------------------------------------------------------
# device selection
# ---------------------------------------------------------------------------------------------

def test_no_selector_without_constraints(vendor):
    assert vendor.device_selector({}, {}) is None
    assert vendor.device_selector({USE_TYPE_ANNOTATION: "  ", USE_UUID_ANNOTATION: "", VGPU_MODE_ANNOTATION: ""},
                                  {CORDON_ANNOTATION: " "}) is None
    assert vendor.device_selector({"hami.io/gpu-scheduler-policy": "binpack"}, {"other": "x"}) is None


def test_cordoned_devices(vendor):
    select = vendor.device_selector({}, {CORDON_ANNOTATION: f" {H200_UUIDS[1]} ,,{H200_UUIDS[2]}"})
    assert select(h200(0, H200_UUIDS[0])) == reasons.OK
    assert select(h200(1, H200_UUIDS[1])) == reasons.CARD_CORDONED
    assert select(h200(2, H200_UUIDS[2])) == reasons.CARD_CORDONED


def test_use_and_nouse_gputype(vendor):
    a100 = h200(type_="NVIDIA A100-SXM4-80GB")
    select = vendor.device_selector({USE_TYPE_ANNOTATION: "h200, A100"}, {})
    assert select(h200()) == reasons.OK and select(a100) == reasons.OK
    assert select(h200(type_="NVIDIA-Tesla V100-PCIE-32GB")) == reasons.CARD_TYPE_MISMATCH
    select = vendor.device_selector({NOUSE_TYPE_ANNOTATION: "a100"}, {})
    assert select(h200()) == reasons.OK and select(a100) == reasons.CARD_TYPE_MISMATCH
    select = vendor.device_selector({USE_TYPE_ANNOTATION: "NVIDIA", NOUSE_TYPE_ANNOTATION: "A100"}, {})
    assert select(h200()) == reasons.OK and select(a100) == reasons.CARD_TYPE_MISMATCH


def test_use_gputype_of_only_blank_entries_matches_nothing(vendor):
    # upstream: the value is not blank, so the constraint applies, but no entry can match
    select = vendor.device_selector({USE_TYPE_ANNOTATION: " , "}, {})
    assert select(h200()) == reasons.CARD_TYPE_MISMATCH


def test_vgpu_mode_is_a_substring_rule(vendor):
    select = vendor.device_selector({VGPU_MODE_ANNOTATION: "mig"}, {})
    assert select(h200(mode="mig")) == reasons.OK
    assert select(h200(mode="hami-core")) == reasons.CARD_TYPE_MISMATCH
    assert select(h200(mode="")) == reasons.OK  # an unset device mode always matches
    select = vendor.device_selector({VGPU_MODE_ANNOTATION: "hami-core,mps"}, {})
    assert select(h200(mode="hami-core")) == reasons.OK and select(h200(mode="mps")) == reasons.OK
    assert select(h200(mode="mig")) == reasons.CARD_TYPE_MISMATCH


def test_use_and_nouse_gpuuuid(vendor):
    select = vendor.device_selector({USE_UUID_ANNOTATION: f"{H200_UUIDS[0]}, {H200_UUIDS[3]}"}, {})
    assert [select(h200(i, u)) for i, u in enumerate(H200_UUIDS[:4])] == [
        reasons.OK, reasons.CARD_UUID_MISMATCH, reasons.CARD_UUID_MISMATCH, reasons.OK]
    select = vendor.device_selector({NOUSE_UUID_ANNOTATION: H200_UUIDS[0]}, {})
    assert select(h200(0, H200_UUIDS[0])) == reasons.CARD_UUID_MISMATCH
    assert select(h200(1, H200_UUIDS[1])) == reasons.OK
    # UUIDs match exactly, not as substrings
    select = vendor.device_selector({USE_UUID_ANNOTATION: H200_UUID[:-4]}, {})
    assert select(h200()) == reasons.CARD_UUID_MISMATCH


def test_gates_apply_in_upstream_order(vendor):
    select = vendor.device_selector(
        {USE_TYPE_ANNOTATION: "A100", NOUSE_UUID_ANNOTATION: H200_UUID}, {CORDON_ANNOTATION: H200_UUID})
    assert select(h200()) == reasons.CARD_CORDONED
    select = vendor.device_selector({USE_TYPE_ANNOTATION: "A100", NOUSE_UUID_ANNOTATION: H200_UUID}, {})
    assert select(h200()) == reasons.CARD_TYPE_MISMATCH
    select = vendor.device_selector({USE_TYPE_ANNOTATION: "H200", NOUSE_UUID_ANNOTATION: H200_UUID}, {})
    assert select(h200()) == reasons.CARD_UUID_MISMATCH


def test_selector_ignores_health_and_capacity(vendor):
    select = vendor.device_selector({USE_TYPE_ANNOTATION: "H200"}, {})
    sick = replace(h200(), health=False, count=0)
    assert select(sick) == reasons.OK


@pytest.mark.parametrize("value, bind", [
    ("true", True), ("1", True), ("t", True), ("T", True), ("TRUE", True), ("True", True),
    ("false", False), ("0", False), ("yes", False), ("", False), (" true", False), ("tRuE", False),
])
def test_parse_numa_bind(value, bind):
    assert parse_numa_bind({"nvidia.com/numa-bind": value}) is bind


def test_parse_numa_bind_absent():
    assert parse_numa_bind({}) is False


# ---------------------------------------------------------------------------------------------
# allocation annotations
# ---------------------------------------------------------------------------------------------

def test_encode_allocation_writes_both_keys(vendor):
    pod = [[], [ContainerDevice(H200_UUID, "NVIDIA", 71885, 50)]]
    expected = f";{H200_UUID},NVIDIA,71885,50:;"
    assert vendor.encode_allocation(pod) == {TO_ALLOCATE_ANNOTATION: expected, ALLOCATED_ANNOTATION: expected}


def test_encode_allocation_without_devices_writes_nothing(vendor):
    assert vendor.encode_allocation([]) == {}
    assert vendor.encode_allocation([[], []]) == {}


def test_decode_allocation(vendor):
    text = f"{H200_UUIDS[0]},NVIDIA,500,3:;{H200_UUIDS[1]},NVIDIA,500,3:;"
    assert vendor.decode_allocation({ALLOCATED_ANNOTATION: text, TO_ALLOCATE_ANNOTATION: "ignored"}) == [
        [ContainerDevice(H200_UUIDS[0], "NVIDIA", 500, 3)], [ContainerDevice(H200_UUIDS[1], "NVIDIA", 500, 3)]]
    assert vendor.decode_allocation({TO_ALLOCATE_ANNOTATION: text}) is None
    assert vendor.decode_allocation({}) is None


def test_allocation_round_trip(vendor):
    pod = [[ContainerDevice(H200_UUIDS[0], "NVIDIA", 143771, 100)], [],
           [ContainerDevice(H200_UUIDS[1], "NVIDIA", 0, 0), ContainerDevice(H200_UUIDS[2], "NVIDIA", 1024, 10)]]
    assert vendor.decode_allocation(vendor.encode_allocation(pod)) == pod

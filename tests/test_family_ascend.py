"""Huawei Ascend NPUs: config, inventory, requests, webhook, gates, annotations, and pods placed
end to end through the generic fit (single-NPU pods) against the in-repo API server.

Registrations are what HAMi's Ascend device plugin writes (its registerHAMi): type = commonWord,
count = memoryAllocatable / smallest template, devmem = the chip's memory, devcore = its AI cores
(100 in hami-core mode), ``customInfo.NetworkID`` on 910 kinds (index > 3 → 1, always 0 on 910C),
and the node annotation ``hami-vnpu-core``. Tests that need the chooser (several NPUs, NetworkID
groups, 910C pairs, the node score) are in ``tests/test_family_ascend_rules.py``.
"""
from __future__ import annotations

import uuid as uuidlib

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, parse_device_config
from hami_py.devices.ascend import AscendVendor, build_family, parse_vnpus
from hami_py.devices.base import ContainerDevice, DeviceDecodeError, NodeView, RequestError
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.registry import FamilySwitches, build_vendors, managed_resource_names
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.registration import is_requesting
from hami_py.reasons import CARD_UUID_MISMATCH, MODE_NOT_FIT, OK
from tests.conftest import decision_annotations, assert_books_balance, create_quota, keeper_passes, place, register_nodes, wait_until
from tests.test_webhook import admit, container, make_pod

ON = FamilySwitches(enable_ascend=True)

# The chip kinds as the plugin registers them with the chart's config (memory MiB, AI cores,
# vNPUs per chip = memoryAllocatable / smallest template memory).
MODELS = {
    "Ascend910A": {"devmem": 32768, "devcore": 30, "count": 15},
    "Ascend910B3": {"devmem": 65536, "devcore": 20, "count": 4},
    "Ascend910B4": {"devmem": 32768, "devcore": 20, "count": 4},
    "Ascend910B4-1": {"devmem": 65536, "devcore": 20, "count": 4},
    "Ascend310P": {"devmem": 21527, "devcore": 8, "count": 7},
    "Ascend910C": {"devmem": 65536, "devcore": 20, "count": 4},
}


def chart_vendors() -> dict:
    return build_vendors(DeviceConfig.default(), ON)


def vendor(cw: str = "Ascend910B3", **changes) -> AscendVendor:
    """The chart's vendor for ``cw``, with config fields changed (snake_case names)."""
    config = parse_vnpus(DeviceConfig.default().section("vnpus"))
    chip = next(c for c in config.configs if c.common_word == cw)
    for key, value in changes.items():
        setattr(chip, key, value)
    return AscendVendor(chip, mode=config.mode, enpu_policy=config.enpu_policy)


def npu_uuid(node: str, cw: str, index: int) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{cw}/{index}"))


def npu_registration(node: str, cw: str, npus: int = 8, *, hami_core: bool = False, network: bool | None = None,
                     health: bool = True, count: int | None = None) -> list[dict]:
    """The plugin's JSON (Go field tags, ``omitempty``: index 0 and numa 0 are left out)."""
    model = MODELS[cw]
    network = cw.startswith("Ascend910") if network is None else network
    devices = []
    for i in range(npus):
        dev = {"id": npu_uuid(node, cw, i), "count": model["count"] if count is None else count,
               "devmem": model["devmem"], "devcore": 100 if hami_core else model["devcore"], "type": cw}
        if i:
            dev["index"] = i
        if health:
            dev["health"] = True
        if network:
            dev["custominfo"] = {"NetworkID": 0 if cw == "Ascend910C" or i <= 3 else 1}
        devices.append(dev)
    return devices


def npu_node(name: str, kinds: dict[str, int] | None = None, *, hami_core: bool = False,
             registrations: dict[str, object] | None = None, annotations: dict | None = None,
             allocatable: dict | None = None) -> dict:
    """A node with one registration per chip kind (``{cw: npus}``), as the plugins leave it."""
    kinds = {"Ascend910B3": 8} if kinds is None and registrations is None else (kinds or {})
    ann: dict[str, str] = {"hami-vnpu-core": "true" if hami_core else "false"}
    resources: dict[str, str] = {"cpu": "192", "memory": "1536Gi"}
    for cw, npus in kinds.items():
        ann[f"hami.io/node-register-{cw}"] = orjson.dumps(
            npu_registration(name, cw, npus, hami_core=hami_core)).decode()
        ann[f"hami.io/node-handshake-{cw}"] = "Reported_2026.01.01 00:00:00"
        resources[f"huawei.com/{cw}"] = str(npus * MODELS[cw]["count"])
    for cw, text in (registrations or {}).items():
        ann[f"hami.io/node-register-{cw}"] = text if isinstance(text, str) else orjson.dumps(text).decode()
    ann.update(annotations or {})
    resources.update(allocatable or {})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": ann},
            "status": {"capacity": dict(resources), "allocatable": dict(resources)}}


def npu_pod(name: str, cw: str = "Ascend910B3", *, count: int | str = 1, memory: int | str | None = None,
            cores: int | str | None = None, annotations: dict | None = None, soft: bool = False) -> dict:
    limits = {f"huawei.com/{cw}": str(count)}
    if memory is not None:
        limits[f"huawei.com/{cw}-memory"] = str(memory)
    if cores is not None:
        limits[f"huawei.com/{cw}-core"] = str(cores)
    ann = dict(annotations or {})
    if soft:
        ann["huawei.com/vnpu-mode"] = "hami-core"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": ann},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "ascend-pytorch:24.0",
                                     "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


def view(node: dict) -> NodeView:
    return NodeView.from_node(node)


def request_of(v: AscendVendor, limits: dict, requests: dict | None = None, annotations: dict | None = None):
    resources = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return v.container_request({"name": "main", "resources": resources}, pod_annotations=annotations or {})


# ---------------------------------------------------------------------------------------------
# config and family
# ---------------------------------------------------------------------------------------------

def test_family_is_built_only_with_enable_ascend():
    config = DeviceConfig.default()
    assert build_family(config, FamilySwitches()) == []
    assert not any(k.startswith("Ascend") for k in build_vendors(config))
    vendors = [v.vendor_key for v in build_family(config, ON)]
    assert vendors == ["Ascend910A", "Ascend910B2", "Ascend910B3", "Ascend910B4-1", "Ascend910B4",
                       "Ascend310P", "Ascend910C"]


def test_vendor_names_and_annotation_keys_follow_the_common_word():
    v = chart_vendors()["Ascend910B3"]
    assert v.resource_names() == ["huawei.com/Ascend910B3", "huawei.com/Ascend910B3-memory",
                                  "huawei.com/Ascend910B3-core"]
    assert v.count_resource_name == "huawei.com/Ascend910B3"
    assert v.register_annotation == "hami.io/node-register-Ascend910B3"
    assert v.handshake_annotation == "hami.io/node-handshake-Ascend910B3"
    assert v.to_allocate_annotation == "hami.io/Ascend910B3-devices-to-allocate"
    assert v.allocated_annotation == "hami.io/Ascend910B3-devices-allocated"
    assert v.uses_node_lock and v.extra_lock_annotation is None
    assert v.gate_annotations == ("hami-vnpu-core", "hami.io/enpu")
    assert v.pod_marks == ("huawei.com/vnpu-mode", "huawei.com/enpu-policy")
    assert v.decision_annotations() == ("hami.io/Ascend910B3-devices-to-allocate",
                                        "hami.io/Ascend910B3-devices-allocated",
                                        "huawei.com/Ascend910B3", "predicate-time", "hami.io/effective-vnpu-mode")
    assert v.quota_resources() == ("huawei.com/Ascend910B3-memory", "huawei.com/Ascend910B3-core", 1)
    managed = managed_resource_names(chart_vendors())
    assert "huawei.com/Ascend910C" in managed and "huawei.com/Ascend310P-memory" in managed


def test_chart_config_is_read_with_templates_sorted_by_memory():
    text = """
vnpus:
  hamiVnpuCore: true
  configs:
    - chipName: 910B3
      commonWord: Ascend910B3
      resourceName: huawei.com/Ascend910B3
      resourceMemoryName: huawei.com/Ascend910B3-memory
      memoryAllocatable: 65536
      memoryCapacity: 65536
      memoryFactor: 2
      aiCore: 20
      aiCPU: 7
      topologyPairs: ["1,2,3", "0,2,3"]
      templates:
        - {name: vir10_3c_32g, memory: 32768, aiCore: 10, aiCPU: 3}
        - {name: vir05_1c_16g, memory: 16384, aiCore: 5, aiCPU: 1}
"""
    config = parse_device_config(text, "cfg.yaml")
    vnpus = parse_vnpus(config.section("vnpus"))
    assert vnpus.hami_vnpu_core is True
    chip = vnpus.configs[0]
    assert [t.name for t in chip.templates] == ["vir05_1c_16g", "vir10_3c_32g"]
    assert (chip.memory_factor, chip.ai_core, chip.ai_cpu, chip.resource_core_name, chip.super_pod) == (2, 20, 7, "", False)
    v = build_family(config, ON)[0]
    assert v.resource_names() == ["huawei.com/Ascend910B3", "huawei.com/Ascend910B3-memory"]
    assert v.quota_resources() == ("huawei.com/Ascend910B3-memory", "", 2)
    # The chart's 910C entry has no memoryFactor: the Go zero value, i.e. MiB as asked.
    c = chart_vendors()["Ascend910C"]
    assert c.config.memory_factor == 0 and c.config.super_pod is True
    assert request_of(c, {"huawei.com/Ascend910C": "2", "huawei.com/Ascend910C-memory": "65536"}).memreq == 65536


@pytest.mark.parametrize("section, message", [
    ({"configs": {"commonWord": "x"}}, "device config: vnpus.configs: expected a list, got mapping"),
    ({"hamiVnpuCore": "yes"}, 'device config: vnpus.hamiVnpuCore: expected true or false, got string "yes"'),
    ({"configs": [{"commonWord": "Ascend910B3", "memoryAllocatable": "64Gi"}]},
     'device config: vnpus.configs[0].memoryAllocatable: expected an integer, got string "64Gi"'),
    ({"configs": [{"commonWord": "Ascend910B3", "memoryFactor": 1 << 31}]},
     "device config: vnpus.configs[0].memoryFactor: 2147483648 is out of range for int32 (-2147483648..2147483647)"),
    ({"configs": [{"commonWord": "Ascend910B3", "templates": [{"name": "vir05", "memory": 1.5}]}]},
     'device config: vnpus.configs[0].templates[0].memory: expected an integer, got number "1.5"'),
    ({"configs": [{"commonWord": "Ascend910B3", "superPod": 1}]},
     'device config: vnpus.configs[0].superPod: expected true or false, got integer "1"'),
    ({"configs": [{"commonWord": ["a"]}]}, "device config: vnpus.configs[0].commonWord: expected a string, got list"),
    ({"configs": [{"chipName": "910B3"}]},
     "device config: vnpus.configs[0].commonWord: must not be empty (it names the device kind in every Ascend annotation)"),
    ({"configs": [{"commonWord": "Ascend 910"}]},
     "device config: vnpus.configs[0].commonWord: \"Ascend 910\" cannot be part of an annotation key "
     "(hami.io/node-handshake-Ascend 910): use letters, digits, '-', '_' and '.', at most 48 characters"),
    ({"configs": [{"commonWord": "Ascend910B3"}, {"commonWord": "Ascend910B3"}]},
     'device config: vnpus.configs[1].commonWord: "Ascend910B3" is already the commonWord of vnpus.configs[0]'),
])
def test_malformed_vnpus_section_is_refused_naming_the_key(section, message):
    config = DeviceConfig(sections={"vnpus": section})
    with pytest.raises(ConfigError) as err:
        build_family(config, ON)
    assert str(err.value) == message
    with pytest.raises(ConfigError):     # upstream decodes the whole file, enabled or not
        build_family(config, FamilySwitches())


# ---------------------------------------------------------------------------------------------
# inventory
# ---------------------------------------------------------------------------------------------

def test_910b3_registration_is_decoded_as_the_plugin_wrote_it():
    node = npu_node("ascend-1", {"Ascend910B3": 8})
    devices = chart_vendors()["Ascend910B3"].parse_node_devices(view(node))
    assert [d.index for d in devices] == list(range(8))
    assert {(d.type, d.devmem, d.devcore, d.count, d.health) for d in devices} == {("Ascend910B3", 65536, 20, 4, True)}
    assert [d.custom["NetworkID"] for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert devices[3].id == npu_uuid("ascend-1", "Ascend910B3", 3)


def test_upstream_fixture_registration_and_an_absent_one():
    v = chart_vendors()["Ascend910A"]
    text = ('[{"ID":"GPU-0","Count":4,"Devmem":8738,"Devcore":8,"Type":"huawei.com/Ascend910","Numa":0,'
            '"Health":true}]')
    (dev,) = v.parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910A": text}))
    assert (dev.id, dev.count, dev.devmem, dev.devcore, dev.type, dev.health) == (
        "GPU-0", 4, 8738, 8, "huawei.com/Ascend910", True)
    assert v.parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910B3": text})) == []


@pytest.mark.parametrize("text, message", [
    ("[]", "no device found on node"),
    ("", "invalid JSON"),
    ('[{"id":"npu-0","count":"4"}]', 'device 0: field "count"'),
    ('[{"id":"npu-0","count":4,"custominfo":{"NetworkID":"spine-1"}}]',
     'device 0: field "customInfo.NetworkID": expected a number, got "spine-1"'),
    ('[{"id":"a","custominfo":{"NetworkID":0}},{"id":"b","custominfo":{"NetworkID":null}}]',
     'device 1: field "customInfo.NetworkID": expected a number, got null'),
])
def test_garbled_registration_is_refused_precisely(text, message):
    v = chart_vendors()["Ascend910B3"]
    with pytest.raises(DeviceDecodeError) as err:
        v.parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910B3": text}))
    assert message in str(err.value)


def test_a_registered_mode_is_dropped_so_no_npu_looks_like_mig():
    text = orjson.dumps([{"id": "npu-0", "count": 4, "devmem": 65536, "devcore": 20, "type": "Ascend910B3",
                          "mode": "mig", "health": True}]).decode()
    (dev,) = chart_vendors()["Ascend910B3"].parse_node_devices(NodeView.of({"hami.io/node-register-Ascend910B3": text}))
    assert dev.mode == "" and dev.type == "Ascend910B3"


def test_each_registration_yields_devices_of_exactly_its_kind():
    """910B4 and 910B4-1 on one node: each vendor reads its own annotation only, and never
    relabels what it reads (the kernel matches candidates by vendor, not by a name substring)."""
    node = view(npu_node("mixed", {"Ascend910B4": 4, "Ascend910B4-1": 4}))
    vendors = chart_vendors()
    b4 = vendors["Ascend910B4"].parse_node_devices(node)
    b41 = vendors["Ascend910B4-1"].parse_node_devices(node)
    assert {d.id for d in b4} == {npu_uuid("mixed", "Ascend910B4", i) for i in range(4)}
    assert {d.id for d in b41} == {npu_uuid("mixed", "Ascend910B4-1", i) for i in range(4)}
    assert {d.type for d in b4} == {"Ascend910B4"} and {d.type for d in b41} == {"Ascend910B4-1"}


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------

def test_request_reads_count_memory_and_cores_limits_first():
    v = vendor()
    r = request_of(v, {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "16384"},
                   {"huawei.com/Ascend910B3-memory": "999"})
    assert (r.vendor, r.nums, r.memreq, r.mempct, r.coresreq) == ("Ascend910B3", 2, 16384, 0, 0)
    r = request_of(v, {}, {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-core": "30"})
    assert (r.nums, r.memreq, r.mempct, r.coresreq) == (1, 0, 100, 30)     # no memory: the whole NPU
    assert request_of(v, {"huawei.com/Ascend910B3": "0"}) is None
    assert request_of(v, {"nvidia.com/gpu": "1"}) is None


def test_memory_factor_multiplies_the_request():
    v = vendor(memory_factor=1024)
    r = request_of(v, {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16"})
    assert r.memreq == 16384
    with pytest.raises(RequestError) as err:
        request_of(v, {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "2097152"})
    assert str(err.value) == ('container "main": huawei.com/Ascend910B3-memory "2097152" is out of range: '
                              "× memoryFactor 1024 exceeds 2147483647 MiB")


def _core_refused(value: str) -> tuple[dict, str]:
    return ({"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-core": value},
            f"invalid huawei.com/Ascend910B3-core value {value} in container main: "
            "must be an integer between 0 and 100")


@pytest.mark.parametrize("limits, message", [
    ({"huawei.com/Ascend910B3": "1.5"},
     "invalid huawei.com/Ascend910B3 request in container main: device count 1.5 is not a plain integer"),
    ({"huawei.com/Ascend910B3": "-1"},
     "invalid huawei.com/Ascend910B3 request in container main: device count -1 is out of range"),
    ({"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "1.5"},
     'container "main": huawei.com/Ascend910B3-memory "1.5" is not a whole number of MiB'),
    ({"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "-1"},
     'container "main": huawei.com/Ascend910B3-memory "-1" must not be negative'),
    ({"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16Gi"},
     'container "main": huawei.com/Ascend910B3-memory "16Gi" is out of range: Ascend memory is in MiB, at most '
     "2147483647 (ask for 16384, not 16Gi, for 16 GiB)"),
    _core_refused("-5"), _core_refused("lots"), _core_refused("150"), _core_refused("50.5"),
])
def test_malformed_requests_are_refused_naming_container_resource_and_value(limits, message):
    """Cores (percent of an NPU, hami-core) are an integer in 0..100 as every family's (HAMi after
    v2.10 refuses instead of clamping)."""
    with pytest.raises(RequestError) as err:
        request_of(vendor(), limits)
    assert str(err.value) == message


# ---------------------------------------------------------------------------------------------
# webhook
# ---------------------------------------------------------------------------------------------

def mutate(v: AscendVendor, limits: dict, requests: dict | None = None, *, soft: bool = False,
           runtime_class: str | None = None, mode: str | None = None) -> tuple[bool, dict, dict]:
    """(asks for NPUs, container, pod) after the vendor's webhook; ``soft`` is ``mode="hami-core"``."""
    resources: dict = {"limits": dict(limits)}
    if requests is not None:
        resources["requests"] = dict(requests)
    ctr = {"name": "main", "resources": resources}
    mode = "hami-core" if soft else mode
    pod = {"metadata": {"annotations": {"huawei.com/vnpu-mode": mode} if mode else {}},
           "spec": {"containers": [ctr]}}
    if runtime_class is not None:
        pod["spec"]["runtimeClassName"] = runtime_class
    return v.mutate_admission(ctr, pod), ctr, pod


@pytest.mark.parametrize("cw, asked, written", [
    ("Ascend910B3", 10000, "16384"),          # hami-features webhook-ascend example
    ("Ascend910B3", 16384, "16384"),
    ("Ascend910B3", 16385, "32768"),
    ("Ascend910B3", 40000, "65536"),          # no template holds it, the NPU does
    ("Ascend910A", 1, "2184"),
    ("Ascend910A", 8000, "8738"),
    ("Ascend310P", 6144, "6144"),
    ("Ascend310P", 20000, "21527"),           # memoryAllocatable, below the 24576 capacity
    ("Ascend310P", 24576, "21527"),
])
def test_hard_split_memory_is_rounded_up_to_the_smallest_template(cw, asked, written):
    """A template pod's memory is rounded by the webhook; a pod naming no mode keeps its memory as
    asked (HAMi #3107: its node rounds it at fit time, or not on a hami-core node)."""
    limits = {f"huawei.com/{cw}": "1", f"huawei.com/{cw}-memory": str(asked)}
    asks, ctr, _ = mutate(vendor(cw), limits, mode="template")
    assert asks
    assert ctr["resources"]["limits"][f"huawei.com/{cw}-memory"] == written
    assert ctr["resources"]["requests"][f"huawei.com/{cw}-memory"] == written
    asks, ctr, pod = mutate(vendor(cw), limits)
    assert asks and pod["metadata"]["annotations"] == {}
    assert ctr["resources"]["limits"][f"huawei.com/{cw}-memory"] == str(asked)
    assert ctr["resources"]["requests"][f"huawei.com/{cw}-memory"] == str(asked)
    # Reviewed again (reinvocationPolicy: IfNeeded): the same answer.
    again = {"limits": dict(ctr["resources"]["limits"]), "requests": dict(ctr["resources"]["requests"])}
    assert mutate(vendor(cw), again["limits"], again["requests"])[1]["resources"] == again


@pytest.mark.parametrize("mode", ["template", None])
def test_memory_no_template_nor_device_holds_is_refused_with_upstreams_message(mode):
    """Refused in template mode and for a pod naming no mode alike: no node's vNPU holds it."""
    with pytest.raises(RequestError) as err:
        mutate(vendor("Ascend310P"), {"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "24577"}, mode=mode)
    assert str(err.value) == "huawei.com/Ascend310P-memory 24577 is invalid"
    with pytest.raises(RequestError) as err:
        mutate(vendor(), {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16Gi"}, mode=mode)
    assert str(err.value) == "huawei.com/Ascend910B3-memory 17179869184 is invalid"


def test_without_a_memory_limit_the_whole_npu_memory_is_written():
    _, ctr, _ = mutate(vendor(), {"huawei.com/Ascend910B3": "2"}, {"huawei.com/Ascend910B3-memory": "8192"})
    assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "65536"
    assert ctr["resources"]["requests"]["huawei.com/Ascend910B3-memory"] == "65536"


def test_soft_mode_keeps_memory_and_allows_cores():
    asks, ctr, _ = mutate(vendor(), {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "10000",
                                     "huawei.com/Ascend910B3-core": "30"}, soft=True)
    assert asks
    assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "10000"
    assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-core"] == "30"
    # Several NPUs with part of each is fine in hami-core mode.
    assert mutate(vendor(), {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "10000"}, soft=True)[0]


def test_cores_in_template_mode_are_refused_and_make_a_mode_less_pod_hami_core():
    """HAMi #2975: a core request is refused only in template mode; a pod naming no mode becomes a
    hami-core one (the webhook writes the mode) and keeps its memory as asked."""
    def with_mode(mode: str | None, limits: dict, requests: dict | None = None):
        resources = {"limits": dict(limits), **({"requests": dict(requests)} if requests else {})}
        ctr = {"name": "main", "resources": resources}
        pod = {"metadata": {"name": "p", "annotations": {} if mode is None else {"huawei.com/vnpu-mode": mode}},
               "spec": {"containers": [ctr]}}
        return vendor().mutate_admission(ctr, pod), ctr, pod

    with pytest.raises(RequestError) as err:
        with_mode("template", {"huawei.com/Ascend910B3": "1"}, {"huawei.com/Ascend910B3-core": "20"})
    assert str(err.value) == "huawei.com/Ascend910B3-core is only supported in hami-core (soft split) mode"
    asks, ctr, pod = with_mode(None, {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "10000"},
                               {"huawei.com/Ascend910B3-core": "20"})
    assert asks and pod["metadata"]["annotations"] == {"huawei.com/vnpu-mode": "hami-core"}
    assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "10000"     # not rounded: soft
    # A mode no rule knows is not overwritten: refused, naming it, and nothing changed.
    limits = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-core": "20"}
    with pytest.raises(RequestError) as err:
        with_mode("hami_core", limits)
    assert str(err.value) == ('huawei.com/vnpu-mode "hami_core" takes no huawei.com/Ascend910B3-core: cores are only '
                              "supported in hami-core (soft split) or enpu mode")
    # Zero cores ask for nothing: the pod names no mode still, its memory as asked (its node rounds it).
    asks, ctr, pod = with_mode(None, {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-core": "0",
                                      "huawei.com/Ascend910B3-memory": "10000"})
    assert asks and pod["metadata"]["annotations"] == {}
    assert ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "10000"


def test_several_npus_with_a_template_each_are_refused():
    with pytest.raises(RequestError) as err:
        mutate(vendor(), {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "16384"})
    assert str(err.value) == "vNPU not supported for multiple devices"
    asks, ctr, _ = mutate(vendor(), {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "65536"})
    assert asks and ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "65536"
    # A pod naming no mode is judged by what a template node would give it: 40000 MiB rounds up to
    # the whole NPU there, so it is admitted (memory kept as asked) ...
    asks, ctr, _ = mutate(vendor(), {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "40000"})
    assert asks and ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "40000"
    # ... and so is a template pod, rounded.
    asks, ctr, _ = mutate(vendor(), {"huawei.com/Ascend910B3": "2", "huawei.com/Ascend910B3-memory": "40000"},
                          mode="template")
    assert asks and ctr["resources"]["limits"]["huawei.com/Ascend910B3-memory"] == "65536"


def test_910c_super_pod_count_one_becomes_one_module_and_odd_counts_are_refused():
    c = vendor("Ascend910C")
    _, ctr, _ = mutate(c, {"huawei.com/Ascend910C": "1"}, {"huawei.com/Ascend910C": "1"})
    assert ctr["resources"]["limits"]["huawei.com/Ascend910C"] == "2"
    assert ctr["resources"]["requests"]["huawei.com/Ascend910C"] == "2"
    _, ctr, _ = mutate(c, {"huawei.com/Ascend910C": "1"})
    assert ctr["resources"]["limits"]["huawei.com/Ascend910C"] == "2"
    assert "huawei.com/Ascend910C" not in ctr["resources"]["requests"]
    # The count was 1 when asked: one module of template-sized vNPUs is allowed.
    _, ctr, _ = mutate(c, {"huawei.com/Ascend910C": "1", "huawei.com/Ascend910C-memory": "16384"})
    assert ctr["resources"]["limits"]["huawei.com/Ascend910C"] == "2"
    assert mutate(c, {"huawei.com/Ascend910C": "4"})[1]["resources"]["limits"]["huawei.com/Ascend910C"] == "4"
    for odd in (3, 5):
        with pytest.raises(RequestError) as err:
            mutate(c, {"huawei.com/Ascend910C": str(odd)})
        assert str(err.value) == f"Ascend910C device request must be 1 or 2*n, got {odd}"
    # Without superPod a 910C is counted NPU by NPU.
    _, ctr, _ = mutate(vendor("Ascend910C", super_pod=False), {"huawei.com/Ascend910C": "1"})
    assert ctr["resources"]["limits"]["huawei.com/Ascend910C"] == "1"


def test_runtime_class_and_overwrite_env():
    v = vendor(runtime_class_name="ascend", overwrite_env=True)
    _, _, pod = mutate(v, {"huawei.com/Ascend910B3": "1"})
    assert pod["spec"]["runtimeClassName"] == "ascend"
    _, _, pod = mutate(v, {"huawei.com/Ascend910B3": "1"}, runtime_class="kata")
    assert pod["spec"]["runtimeClassName"] == "kata"
    asks, ctr, pod = mutate(v, {"nvidia.com/gpu": "1"})
    assert not asks and ctr["env"] == [{"name": "ASCEND_VISIBLE_DEVICES", "value": ""}]
    assert "runtimeClassName" not in pod["spec"]
    # A count in requests only is not recognised by the webhook (upstream reads limits).
    asks, ctr, _ = mutate(vendor(), {}, {"huawei.com/Ascend910B3": "1"})
    assert not asks and "env" not in ctr


def test_webhook_review_patches_ascend_pods_and_denies_with_upstreams_message():
    vendors = chart_vendors()
    pod = make_pod(container(limits={"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "10000"}))
    response, patched = admit(pod, vendors=vendors)
    assert response["allowed"]
    assert patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["spec"]["containers"][0]["resources"] == {
        "limits": {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "10000"},
        "requests": {"huawei.com/Ascend910B3-memory": "10000"}}
    pod = make_pod(container(limits={"huawei.com/Ascend910C": "3"}))
    response, _ = admit(pod, vendors=vendors)
    assert not response["allowed"]
    assert response["status"]["message"] == "Ascend910C device request must be 1 or 2*n, got 3"
    # Without --enable-ascend the pod is none of ours.
    response, patched = admit(make_pod(container(limits={"huawei.com/Ascend910C": "3"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "default-scheduler"


# ---------------------------------------------------------------------------------------------
# device gates: UUIDs and hami-core support
# ---------------------------------------------------------------------------------------------

def test_uuid_gates_use_the_common_word_keys():
    v = vendor()
    devices = v.parse_node_devices(view(npu_node("n1", {"Ascend910B3": 2})))
    assert v.device_selector({}, {}) is None
    use = v.device_selector({"hami.io/use-Ascend910B3-uuid": f" {devices[1].id} "}, {})
    assert [use(d) for d in devices] == [CARD_UUID_MISMATCH, OK]
    nouse = v.device_selector({"hami.io/no-use-Ascend910B3-uuid": devices[1].id}, {})
    assert [nouse(d) for d in devices] == [OK, CARD_UUID_MISMATCH]
    assert v.device_selector({"hami.io/use-Ascend910B4-uuid": devices[1].id}, {}) is None


@pytest.mark.parametrize("global_flag, node_value, fits", [
    (False, None, False),
    (False, "false", False),
    (False, "true", True),
    (True, None, True),
    (True, "false", False),
    (True, "TRUE", False),      # upstream compares with "true" exactly
])
def test_hami_core_pods_need_a_node_that_supports_it(global_flag, node_value, fits):
    v = vendor()
    v.mode = "hami-core" if global_flag else "template"
    (dev,) = v.parse_node_devices(view(npu_node("n1", {"Ascend910B3": 1})))
    node_annotations = {} if node_value is None else {"hami-vnpu-core": node_value}
    soft = {"huawei.com/vnpu-mode": "hami-core"}
    gate = v.device_selector(soft, node_annotations)
    assert gate is not None and gate.per_kind
    assert gate(dev) == (OK if fits else MODE_NOT_FIT)
    # A pod in hard mode is never gated by the node's mode.
    assert v.device_selector({}, node_annotations) is None
    # The mode gate comes before the UUID gate.
    both = v.device_selector({**soft, "hami.io/use-Ascend910B3-uuid": "other"}, node_annotations)
    assert both(dev) == (CARD_UUID_MISMATCH if fits else MODE_NOT_FIT)


# ---------------------------------------------------------------------------------------------
# allocation annotations
# ---------------------------------------------------------------------------------------------

def test_allocation_annotations_are_upstreams_text():
    """Upstream's Test_PatchAnnotations fixture: 910A, 8738 MiB → template vir08."""
    v = vendor("Ascend910A")
    out = v.encode_allocation([[ContainerDevice("device-0", "Ascend910A", 8738, 1)]], node="n1", now=1767225600.7)
    assert out == {
        "hami.io/Ascend910A-devices-to-allocate": "device-0,Ascend910A,8738,1:;",
        "hami.io/Ascend910A-devices-allocated": "device-0,Ascend910A,8738,1:;",
        "predicate-time": "1767225600",
        "huawei.com/Ascend910A": '[{"UUID":"device-0","temp":"vir08","memory":8738,"core":1}]',
    }
    # Encoded without a filter's decision (no settled mode): everything but the effective mode.
    assert set(out) == set(v.decision_annotations()) - {"hami.io/effective-vnpu-mode"}
    assert v.decode_allocation(out) == [[ContainerDevice("device-0", "Ascend910A", 8738, 1)]]
    assert v.encode_allocation([[], []]) == {}


def test_runtime_json_omits_empty_fields_and_the_template_in_hami_core_mode():
    v = vendor("Ascend910A")
    pod = [[], [ContainerDevice("device-zero-core", "Ascend910A", 8738, 0),
                ContainerDevice("whole", "Ascend910A", 32768, 0)]]
    assert v.encode_allocation(pod)["huawei.com/Ascend910A"] == (
        '[{"UUID":"device-zero-core","temp":"vir08","memory":8738},{"UUID":"whole","memory":32768}]')
    soft = v.encode_allocation([[ContainerDevice("ascend-uuid-1", "Ascend910A", 8192, 5)]],
                               pod_annotations={"huawei.com/vnpu-mode": "hami-core"})
    assert soft["huawei.com/Ascend910A"] == '[{"UUID":"ascend-uuid-1","memory":8192,"core":5}]'
    # Go's encoder escapes HTML characters inside strings.
    odd = v.encode_allocation([[ContainerDevice("a<b>&c", "Ascend910A", 2184, 0)]])
    assert odd["huawei.com/Ascend910A"] == '[{"UUID":"a\\u003cb\\u003e\\u0026c","temp":"vir02","memory":2184}]'


def test_310p_runtime_template():
    v = vendor("Ascend310P")
    names = {m: v.trim_memory(m)[1] for m in (1, 3072, 3073, 6144, 12288, 12289, 24576, 24577)}
    assert names == {1: "vir01", 3072: "vir01", 3073: "vir02", 6144: "vir02", 12288: "vir04",
                     12289: "", 24576: "", 24577: ""}
    assert v.trim_memory(12289) == (21527, "") and v.trim_memory(24577) == (0, "")
    out = v.encode_allocation([[ContainerDevice("npu-1", "Ascend310P", 6144, 0)]])
    assert out["huawei.com/Ascend310P"] == '[{"UUID":"npu-1","temp":"vir02","memory":6144}]'


# ---------------------------------------------------------------------------------------------
# end to end (generic fit)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scheduler_options():
    return embedded_options(enable_ascend=True)


async def _bind(app, extender, pod: dict, node: str) -> dict:
    before = app.device_plugin.allocated
    result = await extender.bind(pod, node)
    if not result["Error"]:
        await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    return result


def _allocated(api, app, pod: str, cw: str):
    ann = decision_annotations(api, app, pod)
    return ann, decode_pod_devices(ann[f"hami.io/{cw}-devices-allocated"])


async def test_a_910b3_vnpu_pod_is_filtered_annotated_and_bound(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1", {"Ascend910B3": 8}))
    pod, result = await place(api, extender, npu_pod("train", memory=16384), names)
    assert result["NodeNames"] == ["ascend-1"], result
    ann, devices = _allocated(api, app, "train", "Ascend910B3")
    (dev,) = devices[0]
    assert dev.uuid in {npu_uuid("ascend-1", "Ascend910B3", i) for i in range(8)}
    text = f"{dev.uuid},Ascend910B3,16384,0:;"
    assert ann["hami.io/Ascend910B3-devices-to-allocate"] == text
    assert ann["hami.io/Ascend910B3-devices-allocated"] == text
    assert ann["huawei.com/Ascend910B3"] == f'[{{"UUID":"{dev.uuid}","temp":"vir05_1c_16g","memory":16384}}]'
    assert ann["predicate-time"].isdigit()
    assert ann["hami.io/vgpu-node"] == "ascend-1"
    assert (await _bind(app, extender, pod, "ascend-1"))["Error"] == ""
    usage = {d["id"]: d for d in app.cache.device_usage("ascend-1")}
    assert (usage[dev.uuid]["used"], usage[dev.uuid]["usedmem"]) == (1, 16384)
    assert_books_balance(app)


async def test_310p_pods_share_an_npu_until_its_vnpus_run_out(api, app, extender):
    names = await register_nodes(api, app, npu_node("edge-1", {"Ascend310P": 1}))
    for i in range(3):
        _, result = await place(api, extender, npu_pod(f"infer-{i}", "Ascend310P", memory=6144), names)
        assert result["NodeNames"] == ["edge-1"], result
    ann, devices = _allocated(api, app, "infer-0", "Ascend310P")
    assert ann["huawei.com/Ascend310P"] == f'[{{"UUID":"{devices[0][0].uuid}","temp":"vir02","memory":6144}}]'
    _, result = await place(api, extender, npu_pod("infer-3", "Ascend310P", memory=6144), names)
    assert result["FailedNodes"] == {"edge-1": "1/1 CardInsufficientMemory"}
    _, result = await place(api, extender, npu_pod("whole", "Ascend310P"), names)
    assert result["FailedNodes"] == {"edge-1": "1/1 CardInsufficientMemory"}
    assert_books_balance(app)


async def test_910b4_pods_never_get_910b4_1_npus(api, app, extender):
    names = await register_nodes(api, app, npu_node("mixed", {"Ascend910B4": 2, "Ascend910B4-1": 2}))
    b4 = {npu_uuid("mixed", "Ascend910B4", i) for i in range(2)}
    for i in range(2):
        _, result = await place(api, extender, npu_pod(f"b4-{i}", "Ascend910B4"), names)
        assert result["NodeNames"] == ["mixed"], result
        _, devices = _allocated(api, app, f"b4-{i}", "Ascend910B4")
        assert devices[0][0].uuid in b4 and devices[0][0].type == "Ascend910B4"
    # Both 910B4 are whole-taken; the free 910B4-1 NPUs are no candidates (counted nowhere).
    _, result = await place(api, extender, npu_pod("b4-2", "Ascend910B4"), names)
    assert result["FailedNodes"] == {"mixed": "2/2 CardInsufficientMemory"}
    _, result = await place(api, extender, npu_pod("b41", "Ascend910B4-1"), names)
    assert result["NodeNames"] == ["mixed"]
    _, devices = _allocated(api, app, "b41", "Ascend910B4-1")
    assert devices[0][0].uuid in {npu_uuid("mixed", "Ascend910B4-1", i) for i in range(2)}
    assert_books_balance(app)


async def test_uuid_annotation_picks_the_npu(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1", {"Ascend910B3": 8}))
    wanted = npu_uuid("ascend-1", "Ascend910B3", 6)
    await place(api, extender, npu_pod("pinned", memory=16384,
                                       annotations={"hami.io/use-Ascend910B3-uuid": wanted}), names)
    assert _allocated(api, app, "pinned", "Ascend910B3")[1][0][0].uuid == wanted
    _, result = await place(api, extender, npu_pod("nowhere", annotations={"hami.io/use-Ascend910B3-uuid": "x"}),
                            names)
    assert result["FailedNodes"] == {"ascend-1": "8/8 CardUuidMismatch"}


async def test_hami_core_pod_goes_only_to_nodes_running_the_soft_split(api, app, extender):
    names = await register_nodes(api, app, npu_node("hard", {"Ascend910B3": 2}),
                                 npu_node("soft", {"Ascend910B3": 2}, hami_core=True))
    pod, result = await place(api, extender, npu_pod("soft-1", memory=10000, cores=30, soft=True), names)
    assert result["NodeNames"] == ["soft"]
    _, result = await place(api, extender, npu_pod("soft-0", memory=10000, soft=True), ["hard"])
    assert result["FailedNodes"] == {"hard": "2/2 ModeNotFit"}
    ann, devices = _allocated(api, app, "soft-1", "Ascend910B3")
    assert devices[0][0].usedcores == 30 and devices[0][0].usedmem == 10000
    assert (await _bind(app, extender, pod, "soft"))["Error"] == ""
    # The node's annotation changes: the next pod follows it.
    written = api.patch("nodes", "soft", {"metadata": {"annotations": {"hami-vnpu-core": "false"}}})
    await wait_until(lambda: app.cache.nodes["soft"].resource_version == written["metadata"]["resourceVersion"],
                     "node update seen")
    _, result = await place(api, extender, npu_pod("soft-2", memory=10000, soft=True), names)
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"hard": "2/2 ModeNotFit", "soft": "2/2 ModeNotFit"}
    # A hard-split pod is welcome on either.
    _, result = await place(api, extender, npu_pod("hard-1", memory=16384), ["hard"])
    assert result["NodeNames"] == ["hard"]
    # A node whose plugin writes no hami-vnpu-core follows vnpus.hamiVnpuCore (false in the chart).
    legacy = npu_node("legacy", {"Ascend910B3": 2})
    del legacy["metadata"]["annotations"]["hami-vnpu-core"]
    await register_nodes(api, app, legacy)
    _, result = await place(api, extender, npu_pod("soft-3", memory=10000, soft=True), ["legacy"])
    assert result["FailedNodes"] == {"legacy": "2/2 ModeNotFit"}
    assert_books_balance(app)


async def test_global_hami_vnpu_core_applies_where_the_node_says_nothing(api):
    config = DeviceConfig.default()
    # The deprecated switch, which counts only while hamiVnpuMode is empty (the chart writes template).
    config.sections["vnpus"]["hamiVnpuMode"] = ""
    config.sections["vnpus"]["hamiVnpuCore"] = True
    legacy = npu_node("legacy", {"Ascend910B3": 2})
    del legacy["metadata"]["annotations"]["hami-vnpu-core"]
    async with running_scheduler(api, options=embedded_options(enable_ascend=True), device_config=config) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, legacy, npu_node("hard", {"Ascend910B3": 2}))
            _, result = await place(api, extender, npu_pod("soft-1", memory=10000, cores=20, soft=True), names)
            assert result["NodeNames"] == ["legacy"], result
            _, result = await place(api, extender, npu_pod("soft-2", memory=10000, soft=True), ["hard"])
            assert result["FailedNodes"] == {"hard": "2/2 ModeNotFit"}
        finally:
            await extender.close()


async def test_garbled_registration_is_refused_and_the_nodes_other_families_still_work(api, app, extender):
    node = gpu_node("combo", gpus=2)
    node["metadata"]["annotations"].update({
        "hami.io/node-register-Ascend910B3": '[{"id":"npu-0","count":4,"devmem":"lots"}]',
        "hami.io/node-handshake-Ascend910B3": "Reported_2026.01.01 00:00:00",
        "hami-vnpu-core": "false"})
    names = await register_nodes(api, app, node)
    error = app.cache.nodes["combo"].decode_error
    assert error.startswith("hami.io/node-register-Ascend910B3: device 0: field \"devmem\"")
    _, result = await place(api, extender, npu_pod("npu"), names)
    assert result["NodeNames"] is None
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000), names)
    assert result["NodeNames"] == ["combo"]
    assert_books_balance(app)


async def test_malformed_ascend_request_is_refused_precisely(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1"))
    _, result = await place(api, extender, npu_pod("bad", memory="16Gi"), names)
    assert 'huawei.com/Ascend910B3-memory "16Gi" is out of range: Ascend memory is in MiB' in result["Error"]
    assert "default/bad" in result["Error"]
    assert all(d["usedmem"] == 0 for d in app.cache.device_usage("ascend-1"))


async def test_namespace_quota_on_npu_memory_is_enforced(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1", {"Ascend910B3": 8}))
    await create_quota(api, app, {"limits.huawei.com/Ascend910B3-memory": "40000"}, namespace="default")
    _, result = await place(api, extender, npu_pod("first", memory=32768), names)
    assert result["NodeNames"] == ["ascend-1"]
    _, result = await place(api, extender, npu_pod("second", memory=16384), names)
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"ascend-1": "8/8 ResourceQuotaNotFit"}
    assert_books_balance(app)


async def test_allocation_is_read_back_after_a_restart(api, app, extender):
    names = await register_nodes(api, app, npu_node("ascend-1", {"Ascend910B3": 8}))
    pod, result = await place(api, extender, npu_pod("keep", memory=32768), names)
    assert (await _bind(app, extender, pod, "ascend-1"))["Error"] == ""
    before = app.cache.device_usage("ascend-1")
    async with running_scheduler(api, options=embedded_options(enable_ascend=True), device_plugin=False) as second:
        await wait_until(lambda: second.cache.device_usage("ascend-1") == before, "usage rebuilt from annotations")
        assert_books_balance(second)
    api.delete("pods", "keep", namespace="default")
    await wait_until(lambda: all(d["used"] == 0 for d in app.cache.device_usage("ascend-1")), "freed")
    assert_books_balance(app)


async def test_ascend_handshake_is_requested_and_a_silent_plugin_dropped(api):
    api.create("nodes", npu_node("alive"))
    api.create("nodes", npu_node("silent", allocatable={"huawei.com/Ascend910B3": "0"}))
    handshake = "hami.io/node-handshake-Ascend910B3"

    def handshake_on(node: str) -> str | None:
        return (api.get("nodes", node)["metadata"].get("annotations") or {}).get(handshake)

    options = embedded_options(enable_ascend=True, handshake_timeout_s=2, registration_interval_s=0.1)
    async with running_scheduler(api, options=options) as app:
        await wait_for(lambda: is_requesting(handshake_on("alive")) and is_requesting(handshake_on("silent")),
                       what="both Ascend nodes stamped Requesting_")
        await wait_for(lambda: handshake_on("silent") is None, timeout=20, what="the silent plugin cleaned up")
        await keeper_passes(app, 2)
        assert is_requesting(handshake_on("alive"))     # its kubelet still advertises NPUs
        extender = ExtenderClient(app.url)
        try:
            result = await extender.filter(api.create("pods", npu_pod("p")), ["alive", "silent"])
            assert result["NodeNames"] == ["alive"]
            result = await extender.filter(api.create("pods", npu_pod("q")), ["silent"])
            assert result["FailedNodes"] == {"silent": "node unregistered"}
        finally:
            await extender.close()

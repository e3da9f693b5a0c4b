"""Metax whole GPUs and sGPUs: inventory, requests, webhook, annotations, placement.

The sGPU chooser's rules (app class, QoS, preferences, node score) end to end are in
test_family_metax_rules.py.
"""
from __future__ import annotations

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices.base import (
    FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, NodeView, RequestError,
)
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.metax import MetaxConfig
from hami_py.devices.metax.gpu import parse_topology_map, topology_score
from hami_py.devices.metax.sgpu import (
    app_class_fits, decode_sgpu_devices, link_score, prefer_link_zones, prefer_online, qos_fits, task_qos,
)
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.families import find_device_model
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.reasons import CARD_UUID_MISMATCH, OK
from tests.conftest import (
    container as ctr,
    assert_books_balance, bind_placed, decision_annotations, device_pod, place, register_nodes,
)
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
GPU = VENDORS["Metax-GPU"]
SGPU = VENDORS["Metax-SGPU"]
GPU_MODEL = find_device_model("metax-gpu")
SGPU_MODEL = find_device_model("metax-sgpu")

# The registration of upstream's sdevice_test.go (one card of 16 shares, 32 GiB).
UPSTREAM_CARD = ('[{"uuid": "GPU-123", "model": "sgpu", "totalDevCount": 16, "totalCompute": 100, '
                 '"bdf": "0000:44:00.0", "totalVRam" : 32768, "numa": 1, "healthy": true, "qosPolicy": "fixed-share"}]')


def cards(n=2, **extra) -> str:
    return orjson.dumps([{"uuid": f"GPU-{i}", "totalDevCount": 16, "totalCompute": 100, "totalVRam": 65536,
                          "healthy": True, "qosPolicy": "", "linkZone": 1, **extra} for i in range(n)]).decode()


def sgpu_node(name: str, text: str, **extra_annotations) -> dict:
    node = SGPU_MODEL.node(name, devices=1)
    node["metadata"]["annotations"] = {"metax-tech.com/node-gpu-devices": text, **extra_annotations}
    return node


# -- config -----------------------------------------------------------------------------------------

def test_the_chart_config_names_upstreams_resources():
    assert GPU.resource_names() == ["metax-tech.com/gpu"]
    assert SGPU.resource_names() == ["metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"]
    assert GPU.kernel_flags == FLAG_CHOOSE and SGPU.kernel_flags == FLAG_CHOOSE   # cards of count 1: the slot check
    assert not GPU.uses_node_lock and SGPU.uses_node_lock
    assert GPU.quota_resources()[0] == "" and SGPU.quota_resources()[0] == ""     # upstream checks no quota


def test_config_section_keys_defaults_and_errors():
    config = MetaxConfig.from_section(Section.of("metax", {"resourceCountName": "a", "sgpuTopologyAware": True}))
    assert config == MetaxConfig("a", "", "", "", True)
    assert MetaxConfig.from_section(Section.of("metax", None)) == MetaxConfig()
    with pytest.raises(ConfigError, match="resourceVCountName"):
        MetaxConfig.from_section(Section.of("metax", {"resourceVCountName": 5}))
    with pytest.raises(ConfigError, match="sgpuTopologyAware"):
        MetaxConfig.from_section(Section.of("metax", {"sgpuTopologyAware": "maybe"}))


# -- whole GPU: inventory, requests, score ------------------------------------------------------

def test_gpus_come_from_the_node_capacity():
    devices = GPU.parse_node_devices(NodeView.of({}, name="m1", capacity={"metax-tech.com/gpu": "2"}))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in devices] == [
        ("m1-metax-0", 0, 1, 65536, 100, "Metax-GPU", True), ("m1-metax-1", 1, 1, 65536, 100, "Metax-GPU", True)]
    assert GPU.parse_node_devices(NodeView.of({}, name="m1", capacity={"metax-tech.com/gpu": "0"})) == []
    assert GPU.parse_node_devices(NodeView.of({}, name="m1", capacity={"cpu": "8"})) == []
    with pytest.raises(DeviceDecodeError, match=r"metax-tech.com/gpu '1.5' is not a whole number of cards"):
        GPU.parse_node_devices(NodeView.of({}, name="m1", capacity={"metax-tech.com/gpu": "1.5"}))


def test_the_topology_annotations_are_decoded_with_the_inventory():
    view = NodeView.of({"metax-tech.com/gpu.topology.losses": '{"1":100,"2":200}'}, name="m1",
                       capacity={"metax-tech.com/gpu": "2"})
    [first, _] = GPU.parse_node_devices(view)
    assert first.custom == {"losses": {1: 100, 2: 200}, "scores": None}
    # A change of the annotations alone decodes the inventory again.
    other = NodeView.of({"metax-tech.com/gpu.topology.losses": '{"1":0}'}, name="m1",
                        capacity={"metax-tech.com/gpu": "2"})
    assert GPU.registration_inputs(view) != GPU.registration_inputs(other)


@pytest.mark.parametrize("text, want", [
    (None, None), ('{"1":100,"2":200}', {1: 100, 2: 200}), ('{"+3":-5}', {3: -5}),
    ("not json", {}), ('{"1":1.5}', {}), ('{"one":1}', {}), ("[1,2]", {}), ("null", {}), ('{"1":true}', {}),
])
def test_topology_maps_read_as_upstreams_map_of_ints(text, want):
    assert parse_topology_map(text) == want


def test_the_topology_score_is_upstreams():
    custom = {"losses": {1: 100, 2: 200}, "scores": {1: 300}}
    assert topology_score(custom, "binpack", 2) == 1800        # 2000 - loss of a 2-card pod
    assert topology_score(custom, "spread", 1) == 1700         # 2000 - score
    assert topology_score(custom, "binpack", 3) == 2000        # no entry: reads 0
    assert topology_score(custom, "other", 1) == 0             # any other policy: nothing
    assert topology_score({"losses": None, "scores": None}, "binpack", 1) == 0   # no annotation


def test_gpu_request_is_whole_cards_from_limits_or_requests():
    assert GPU.container_request(ctr({"metax-tech.com/gpu": "2"}), pod_annotations={}) == \
        ContainerRequest("Metax-GPU", 2, 0, 100, 100)
    assert GPU.container_request(ctr(requests={"metax-tech.com/gpu": "1"}), pod_annotations={}).nums == 1
    assert GPU.container_request(ctr({"metax-tech.com/gpu": "0"}), pod_annotations={}) is None
    assert GPU.container_request(ctr({"cpu": "1"}), pod_annotations={}) is None
    with pytest.raises(RequestError, match=r"^invalid metax-tech.com/gpu request in container main: "
                                           r"device count 1.5 is not a plain integer$"):
        GPU.container_request(ctr({"metax-tech.com/gpu": "1.5"}), pod_annotations={})
    assert GPU.device_selector({"metax-tech.com/use-gpuuuid": "x"}, {}) is None     # no card selection


def test_gpu_annotations_are_upstreams():
    devices = [[ContainerDevice("m1-metax-0", "Metax-GPU", 65536, 100)], [], [ContainerDevice("m1-metax-1", "Metax-GPU", 65536, 100)]]
    out = GPU.encode_allocation(devices)
    text = "m1-metax-0,Metax-GPU,65536,100:;;m1-metax-1,Metax-GPU,65536,100:;"
    assert out == {"hami.io/metax-gpu-devices-to-allocate": text, "hami.io/metax-gpu-devices-allocated": text}
    assert GPU.decode_allocation(out) == devices
    assert GPU.encode_allocation([[], []]) == {}


# -- sGPU: inventory ----------------------------------------------------------------------------

def test_sgpu_inventory_is_the_vendor_json():
    [card] = decode_sgpu_devices(UPSTREAM_CARD)
    assert (card.id, card.index, card.count, card.devmem, card.devcore, card.type, card.numa, card.health) == \
        ("GPU-123", 0, 16, 32768, 100, "Metax-SGPU", 1, True)
    assert card.custom == {"QosPolicy": "fixed-share", "Model": "sgpu", "LinkZone": 0}
    realistic = SGPU_MODEL.parts("s1", devices=4).annotations["metax-tech.com/node-gpu-devices"]
    devices = decode_sgpu_devices(realistic)
    assert [d.custom["LinkZone"] for d in devices] == [1, 1, 2, 2] and all(d.health for d in devices)
    # Keys match case-insensitively and unknown keys are ignored, as Go's decoder does.
    [card] = decode_sgpu_devices('[{"UUID":"g","TotalDevCount":2,"extra":[1],"healthy":null}]')
    assert (card.id, card.count, card.health) == ("g", 2, False)


@pytest.mark.parametrize("text, message", [
    ("[]", "no sdevice found on node"),
    ("null", "no sdevice found on node"),
    ("{", "invalid JSON"),
    ('{"uuid":"g"}', "expected a JSON array of devices, got object"),
    ('[{"uuid":"g","totalVRam":"lots"}]', 'device 0: field "totalVRam": expected an integer (int32), got string "lots"'),
    ('[{"uuid":"g"},{"uuid":"h","totalDevCount":4294967296}]', 'device 1: field "totalDevCount"'),
    ('[{"uuid":"g","healthy":"yes"}]', 'device 0: field "healthy"'),
    ('[null]', "device 0: null is not a device"),
    ('[{"uuid":1}]', 'device 0: field "uuid"'),
])
def test_a_garbled_sgpu_registration_is_refused_precisely(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        decode_sgpu_devices(text)
    assert message in str(err.value)


# -- sGPU: requests -----------------------------------------------------------------------------

@pytest.mark.parametrize("memory, mib", [
    ("4", 4096),                  # a plain number is GiB
    ("4Gi", 4096),                # with a unit: bytes
    ("1536Mi", 1536),
    ("2G", 1907),                 # 2e9 bytes
    ("1e9", 953),                 # the exponent is a letter too (as the canonical spelling upstream reads)
    ("0", 0),
])
def test_sgpu_memory_is_gib_when_plain_and_bytes_with_a_unit(memory, mib):
    req = SGPU.container_request(ctr({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": memory}), pod_annotations={})
    assert (req.memreq, req.mempct) == (mib, 100 if mib == 0 else 0)


def test_sgpu_requests_read_limits_only_with_upstreams_defaults():
    assert SGPU.container_request(ctr({"metax-tech.com/sgpu": "2"}), pod_annotations={}) == \
        ContainerRequest("Metax-SGPU", 2, 0, 100, 100)            # whole cards by default
    assert SGPU.container_request(ctr({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "30"}),
                                  pod_annotations={}).coresreq == 30
    assert SGPU.container_request(ctr(requests={"metax-tech.com/sgpu": "1"}), pod_annotations={}) is None
    req = SGPU.container_request(ctr({"metax-tech.com/sgpu": "1"}, {"metax-tech.com/vmemory": "8"}), pod_annotations={})
    assert req.memreq == 0                                         # memory in requests is not read
    online = SGPU.container_request(ctr({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50"}),
                                    pod_annotations={"metax-tech.com/sgpu-app-class": "online"})
    assert online.coresreq == -1          # the kernel's "takes no cores": none charged, no core check
    assert SGPU.container_request(ctr({"metax-tech.com/sgpu": "0"}), pod_annotations={}) is None


def _sgpu_cores_refused(value: str) -> tuple[dict, str]:
    return ({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": value},
            f"invalid metax-tech.com/vcore value {value} in container main: must be an integer between 0 and 100")


@pytest.mark.parametrize("limits, message", [
    ({"metax-tech.com/sgpu": "1.5"}, "invalid metax-tech.com/sgpu request in container main: "
                                     "device count 1.5 is not a plain integer"),
    ({"metax-tech.com/sgpu": "-1"}, "invalid metax-tech.com/sgpu request in container main: device count -1 is out of range"),
    _sgpu_cores_refused("half"), _sgpu_cores_refused("150"),      # HAMi after v2.10: refused, not clamped
    ({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "1.5"},
     'container "main": metax-tech.com/vmemory "1.5" is not a whole number'),
    ({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "2097152"},
     'container "main": metax-tech.com/vmemory "2097152" is out of range: must be between 0 and 2097151 GiB'),
    ({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4Pi"},
     'container "main": metax-tech.com/vmemory "4Pi" is out of range'),
])
def test_a_malformed_sgpu_request_is_refused_precisely(limits, message):
    with pytest.raises(RequestError) as err:
        SGPU.container_request(ctr(limits), pod_annotations={})
    assert str(err.value).startswith(message)


def test_sgpu_uuid_selection_is_upstreams():
    sel = SGPU.device_selector({"metax-tech.com/use-gpuuuid": "GPU-1, GPU-2"}, {})
    [a, b, c] = decode_sgpu_devices(cards(3))
    assert [sel(d) for d in (a, b, c)] == [CARD_UUID_MISMATCH, OK, OK]
    sel = SGPU.device_selector({"metax-tech.com/nouse-gpuuuid": "GPU-0"}, {})
    assert [sel(d) for d in (a, b)] == [CARD_UUID_MISMATCH, OK]
    assert SGPU.device_selector({}, {}) is None


# -- sGPU: webhook --------------------------------------------------------------------------------

def mutate(limits, annotations=None):
    pod = {"metadata": {"annotations": dict(annotations or {})}}
    answer = SGPU.mutate_admission(ctr(limits), pod)
    return answer, pod["metadata"]["annotations"]


def test_the_webhook_sets_best_effort_and_checks_the_class_and_qos():
    assert mutate({"metax-tech.com/sgpu": "1"}) == (True, {"metax-tech.com/sgpu-qos-policy": "best-effort"})
    assert mutate({"metax-tech.com/sgpu": "2"}, {"metax-tech.com/sgpu-qos-policy": "fixed-share"}) == \
        (True, {"metax-tech.com/sgpu-qos-policy": "fixed-share"})
    # An online pod gets no QoS; an offline one does.
    assert mutate({"metax-tech.com/sgpu": "1"}, {"metax-tech.com/sgpu-app-class": "online"})[1] == \
        {"metax-tech.com/sgpu-app-class": "online"}
    assert mutate({"metax-tech.com/sgpu": "1"}, {"metax-tech.com/sgpu-app-class": "offline"})[1] == \
        {"metax-tech.com/sgpu-app-class": "offline", "metax-tech.com/sgpu-qos-policy": "best-effort"}
    assert mutate({"cpu": "1"}) == (False, {})
    assert mutate({}, None)[0] is False
    for annotations, limits, message in (
            ({"metax-tech.com/sgpu-app-class": "batch"}, {"metax-tech.com/sgpu": "1"},
             "metax-tech.com/sgpu-app-class must be set one of [online, offline]"),
            ({"metax-tech.com/sgpu-app-class": "online"}, {"metax-tech.com/sgpu": "2"},
             "app-class pod must request single device"),
            ({"metax-tech.com/sgpu-qos-policy": "gold"}, {"metax-tech.com/sgpu": "1"},
             "metax-tech.com/sgpu-qos-policy must be set one of [best-effort, fixed-share, burst-share]"),
            ({"metax-tech.com/sgpu-qos-policy": ""}, {"metax-tech.com/sgpu": "1"},      # present but empty
             "metax-tech.com/sgpu-qos-policy must be set one of [best-effort, fixed-share, burst-share]")):
        with pytest.raises(RequestError) as err:
            mutate(limits, annotations)
        assert str(err.value) == message


def test_the_webhook_admits_metax_pods_and_refuses_a_bad_class():
    response, patched = admit(make_pod(container(limits={"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["metadata"]["annotations"]["metax-tech.com/sgpu-qos-policy"] == "best-effort"
    response, patched = admit(make_pod(container(limits={"metax-tech.com/gpu": "1"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    pod = make_pod(container(limits={"metax-tech.com/sgpu": "1"}))
    pod["metadata"]["annotations"] = {"metax-tech.com/sgpu-app-class": "realtime"}
    response, _ = admit(pod)
    assert not response["allowed"]
    assert "metax-tech.com/sgpu-app-class must be set one of [online, offline]" in response["status"]["message"]


# -- sGPU: the rules as pure functions -------------------------------------------------------------

@pytest.mark.parametrize("request_class, online, offline, fits", [
    (None, 0, 0, True), ("online", 0, 0, False), ("offline", 0, 0, False),     # a card of unclassed tasks
    (None, 1, 0, False), (None, 0, 1, False),                                  # unclassed never on classed
    ("online", 1, 0, True), ("online", 0, 2, True), ("offline", 0, 1, True),
    ("offline", 1, 1, False),                                                  # offline never beside online
    ("weird", 0, 0, True),                                                     # an unknown class is none
])
def test_app_class_compatibility_is_upstreams(request_class, online, offline, fits):
    assert app_class_fits(request_class, online, offline) is fits


def test_qos_compatibility_follows_the_cards_tasks_then_its_report():
    assert task_qos({"metax-tech.com/sgpu-qos-policy": "fixed-share"}, 30) == "fixed-share"
    assert task_qos({"metax-tech.com/sgpu-qos-policy": "fixed-share"}, 100) == ""    # a whole card has none
    assert qos_fits("fixed-share", ["fixed-share", ""], "best-effort")     # the tasks decide, not the report
    assert not qos_fits("best-effort", ["fixed-share"], "best-effort")
    assert qos_fits("burst-share", [], "")                                 # no tasks of a QoS: the report
    assert not qos_fits("burst-share", [], "fixed-share")


def test_online_pods_prefer_cards_with_fewer_online_tasks_and_only_offline_ones_last():
    counts = {0: (0, 3), 1: (2, 0), 2: (0, 0), 3: (1, 5), 4: (0, 1)}
    assert prefer_online([0, 1, 2, 3, 4], counts) == [2, 3, 1, 4, 0]


def test_whole_card_pods_are_packed_into_the_smallest_link_zone():
    zones = {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 0}
    assert prefer_link_zones([0, 1, 2, 3, 4, 5], zones, 2) == [3, 4]        # zone 2 holds both
    assert prefer_link_zones([0, 1, 2, 3, 4, 5], zones, 3) == [0, 1, 2]
    assert prefer_link_zones([0, 3, 5], zones, 3) == [0, 3, 5]              # across zones, then zone-less
    assert link_score([("a", 1), ("b", 1), ("c", 2), ("d", 0), ("e", 0)]) == 10


# -- sGPU: annotations ---------------------------------------------------------------------------

def test_sgpu_annotations_are_upstreams():
    devices = [[], [ContainerDevice("GPU-1", "Metax-SGPU", 4096, 30), ContainerDevice("GPU-2", "Metax-SGPU", 4096, 0)]]
    out = SGPU.encode_allocation(devices, now=1767225600.5)
    text = ";GPU-1,Metax-SGPU,4096,30:GPU-2,Metax-SGPU,4096,0:;"
    assert out == {"hami.io/metax-sgpu-devices-to-allocate": text, "hami.io/metax-sgpu-devices-allocated": text,
                   "metax-tech.com/gpu-devices-allocated":
                       '[[],[{"uuid":"GPU-1","compute":30,"vRam":4096},{"uuid":"GPU-2","vRam":4096}]]',
                   "metax-tech.com/predicate-time": "1767225600500000000"}
    assert set(out) == set(SGPU.decision_annotations())
    assert SGPU.decode_allocation(out) == devices


# -- end to end ---------------------------------------------------------------------------------

async def test_a_gpu_pod_is_filtered_bound_and_annotated(api, app, extender):
    names = await register_nodes(api, app, GPU_MODEL.node("m1", devices=2))
    pod, result = await place(api, extender, device_pod("g", {"metax-tech.com/gpu": "1"}), names)
    assert result["NodeNames"] == ["m1"], result
    stored = await bind_placed(api, app, extender, pod, result)
    ann = stored["metadata"]["annotations"]
    assert ann["hami.io/metax-gpu-devices-allocated"] == ann["hami.io/metax-gpu-devices-to-allocate"]
    assert ann["hami.io/metax-gpu-devices-allocated"] in (
        "m1-metax-0,Metax-GPU,65536,100:;", "m1-metax-1,Metax-GPU,65536,100:;")
    _, result = await place(api, extender, device_pod("g2", {"metax-tech.com/gpu": "1"}), names)
    assert result["NodeNames"] == ["m1"]
    _, result = await place(api, extender, device_pod("g3", {"metax-tech.com/gpu": "1"}), names)
    # Upstream's words for a node whose every card is taken (its Fit checks Count <= Used first).
    assert result["NodeNames"] is None and result["FailedNodes"]["m1"] == "2/2 CardTimeSlicingExhausted"
    assert_books_balance(app)


async def test_a_pod_of_several_metax_gpu_containers_fits_each_on_its_own_cards(api, app, extender):
    """Each container gets cards of its own, and the books charge each: HAMi after v2.10 (#2837
    removed customFilterRule; v2.10's rule made such a pod unschedulable)."""
    names = await register_nodes(api, app, GPU_MODEL.node("m1", devices=4))
    pod = device_pod("multi", {"metax-tech.com/gpu": "1"})
    pod["spec"]["containers"].append({"name": "side", "image": "x", "resources": {"limits": {"metax-tech.com/gpu": "2"}}})
    pod, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["m1"], result
    stored = await bind_placed(api, app, extender, pod, result)
    devices = decode_pod_devices(stored["metadata"]["annotations"]["hami.io/metax-gpu-devices-allocated"])
    assert [len(c) for c in devices] == [1, 2]
    assert len({d.uuid for c in devices for d in c}) == 3
    assert sum(d["used"] for d in app.cache.device_usage("m1")) == 3
    assert_books_balance(app)


async def test_binpack_prefers_the_node_whose_topology_loses_least(api, app, extender):
    lossy = GPU_MODEL.node("lossy", devices=4)
    lossy["metadata"]["annotations"]["metax-tech.com/gpu.topology.losses"] = '{"2":500}'
    tight = GPU_MODEL.node("tight", devices=4)
    tight["metadata"]["annotations"]["metax-tech.com/gpu.topology.losses"] = '{"2":0}'
    names = await register_nodes(api, app, lossy, tight)
    _, result = await place(api, extender, device_pod("two", {"metax-tech.com/gpu": "2"}), names)
    assert result["NodeNames"] == ["tight"], result
    # The pod's cards are counted over its containers: 1 + 1 reads the loss of 2 as well.
    pod = device_pod("split", {"metax-tech.com/gpu": "1"})
    pod["spec"]["containers"].append({"name": "b", "image": "x", "resources": {"limits": {"metax-tech.com/gpu": "1"}}})
    lossy2 = GPU_MODEL.node("lossy2", devices=4)
    lossy2["metadata"]["annotations"]["metax-tech.com/gpu.topology.losses"] = '{"1":0,"2":900}'
    await register_nodes(api, app, lossy2)
    _, result = await place(api, extender, pod, ["lossy", "lossy2"])
    assert result["NodeNames"] == ["lossy"], result


async def test_spread_prefers_the_node_whose_topology_scores_best(api, app, extender):
    low = GPU_MODEL.node("low", devices=2)
    low["metadata"]["annotations"]["metax-tech.com/gpu.topology.scores"] = '{"1":100}'
    high = GPU_MODEL.node("high", devices=2)
    high["metadata"]["annotations"]["metax-tech.com/gpu.topology.scores"] = '{"1":900}'
    names = await register_nodes(api, app, low, high)
    pod = device_pod("s", {"metax-tech.com/gpu": "1"}, annotations={"hami.io/node-scheduler-policy": "spread"})
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["high"], result


async def test_an_sgpu_pod_is_filtered_bound_and_annotated_as_upstream(api, app, extender):
    names = await register_nodes(api, app, SGPU_MODEL.node("s1", devices=2))
    pod = device_pod("v", {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8", "metax-tech.com/vcore": "30"},
                     annotations={"metax-tech.com/sgpu-qos-policy": "fixed-share"})
    pod, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["s1"], result
    stored = await bind_placed(api, app, extender, pod, result)
    ann = stored["metadata"]["annotations"]
    [[dev]] = decode_pod_devices(ann["hami.io/metax-sgpu-devices-allocated"])
    assert (dev.type, dev.usedmem, dev.usedcores) == ("Metax-SGPU", 8192, 30)
    assert ann["hami.io/metax-sgpu-devices-to-allocate"] == ann["hami.io/metax-sgpu-devices-allocated"]
    assert orjson.loads(ann["metax-tech.com/gpu-devices-allocated"]) == [[{"uuid": dev.uuid, "compute": 30, "vRam": 8192}]]
    assert int(ann["metax-tech.com/predicate-time"]) > 10**18
    record = app.cache.pods[stored["metadata"]["uid"]]
    assert record.marks == {"metax-tech.com/sgpu-qos-policy": "fixed-share"}      # kept for the chooser
    assert_books_balance(app)


async def test_a_malformed_sgpu_request_is_refused_at_filter(api, app, extender):
    names = await register_nodes(api, app, SGPU_MODEL.node("s1", devices=1))
    _, result = await place(api, extender, device_pod("bad", {"metax-tech.com/sgpu": "1",
                                                             "metax-tech.com/vmemory": "lots"}), names)
    assert result["Error"] == 'pod default/bad: container "main": metax-tech.com/vmemory "lots" is not a whole number'


async def test_a_garbled_sgpu_registration_is_refused_while_the_nodes_gpus_work(api, app, extender):
    node = gpu_node("mixed", gpus=1)
    node["metadata"]["annotations"]["metax-tech.com/node-gpu-devices"] = '[{"uuid":"g","totalVRam":"lots"}]'
    names = await register_nodes(api, app, node)
    assert app.cache.nodes["mixed"].decode_error == \
        'metax-tech.com/node-gpu-devices: device 0: field "totalVRam": expected an integer (int32), got string "lots"'
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result
    _, result = await place(api, extender, device_pod("v", {"metax-tech.com/sgpu": "1"}), names)
    assert result["NodeNames"] is None


async def test_an_sgpu_pod_picks_or_avoids_cards_by_uuid(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("s1", cards(3)))
    pod = device_pod("pick", {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "10"},
                     annotations={"metax-tech.com/use-gpuuuid": "GPU-1"})
    await place(api, extender, pod, names)
    [[dev]] = decode_pod_devices(decision_annotations(api, app, "pick")["hami.io/metax-sgpu-devices-allocated"])
    assert dev.uuid == "GPU-1"
    pod = device_pod("avoid", {"metax-tech.com/sgpu": "3", "metax-tech.com/vcore": "10"},
                     annotations={"metax-tech.com/nouse-gpuuuid": "GPU-0"})
    _, result = await place(api, extender, pod, names)
    assert result["NodeNames"] is None and "CardUuidMismatch" in result["FailedNodes"]["s1"]


# -- the cache's pod marks (the generic hook the sGPU chooser reads) ------------------------------

def _charged_pod(uid: str, node: str, uuid: str, annotations: dict, rv: int = 1) -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": str(rv),
                         "annotations": {"hami.io/vgpu-node": node,
                                         "hami.io/metax-sgpu-devices-allocated": f"{uuid},Metax-SGPU,4096,30:;",
                                         **annotations}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}


def test_the_cache_keeps_each_pods_marks_with_its_charge_per_device():
    from hami_py.cache.usage import UsageCache
    cache = UsageCache(VENDORS)
    cache.upsert_node(sgpu_node("s1", cards(2)))
    index = cache.node_index_of["s1"]
    cache.on_pod_event("ADDED", _charged_pod("a", "s1", "GPU-1", {"metax-tech.com/sgpu-qos-policy": "fixed-share",
                                                                 "unrelated": "x"}))
    cache.on_pod_event("ADDED", _charged_pod("b", "s1", "GPU-1", {}))
    per_device = cache.device_marks(index)
    assert per_device[0] == []
    assert sorted((tuple(m.items()), e.cores) for m, e in per_device[1]) == [
        ((), 30), ((("metax-tech.com/sgpu-qos-policy", "fixed-share"),), 30)]
    # A change of a marked annotation alone is seen (it is part of the pod's fingerprint) ...
    cache.on_pod_event("MODIFIED", _charged_pod("b", "s1", "GPU-1", {"metax-tech.com/sgpu-app-class": "offline"}, rv=2))
    assert {tuple(m.items()) for m, _ in cache.device_marks(index)[1]} == {
        (("metax-tech.com/sgpu-qos-policy", "fixed-share"),), (("metax-tech.com/sgpu-app-class", "offline"),)}
    # ... and a pod's marks leave with it.
    cache.on_pod_event("DELETED", _charged_pod("a", "s1", "GPU-1", {}))
    assert [m for m, _ in cache.device_marks(index)[1]] == [{"metax-tech.com/sgpu-app-class": "offline"}]
    assert cache.device_marks(12345) == []
    assert cache.marks_of({"metax-tech.com/sgpu-qos-policy": "burst-share", "x": "y"}) == {
        "metax-tech.com/sgpu-qos-policy": "burst-share"}


# -- the simulator's fake nodes -------------------------------------------------------------------

@pytest.mark.parametrize("family, vendor, request_lines, placed", [
    ("metax", "Metax-GPU", "device: Metax-GPU\n    gpus: 2", 4),              # 2 nodes x 4 cards, 2 a pod
    ("metax-sgpu", "Metax-SGPU", "device: Metax-SGPU\n    gpumem: 8Gi\n    gpucores: 25", 4),
])
def test_each_metax_family_simulates(tmp_path, capsys, family, vendor, request_lines, placed):
    from tests.test_families_sim import simulate_json, write
    cluster = write(tmp_path, "cluster.yaml", "nodes:\n  - name: box\n    count: 2\n    gpus: 4\n"
                    f"    model: C500\n    family: {family}\n")
    workload = write(tmp_path, "workload.yaml", f"pods:\n  - name: job\n    replicas: {placed}\n    {request_lines}\n")
    report = simulate_json(capsys, "--cluster", cluster, "--workload", workload)
    assert report["summary"]["placed"] == placed, report["pods"]
    assert {d["vendor"] for p in report["pods"] for d in p["devices"]} == {vendor}


def test_the_fake_nodes_register_as_the_plugins_do():
    gpu = GPU_MODEL.node("m1", devices=8)
    assert gpu["status"]["capacity"]["metax-tech.com/gpu"] == "8"
    devices = GPU.parse_node_devices(NodeView.from_node(gpu))
    assert len(devices) == 8 and devices[0].custom["losses"][8] == 0 and devices[0].custom["scores"][1] == 100
    sgpu = SGPU_MODEL.node("s1", devices=4, unhealthy={1})
    cards_ = SGPU.parse_node_devices(NodeView.from_node(sgpu))
    assert [d.health for d in cards_] == [True, False, True, True]
    assert {(d.count, d.devmem, d.devcore) for d in cards_} == {(16, 65536, 100)}
    assert [d.numa for d in cards_] == [0, 0, 1, 1]
    assert SGPU.parse_node_devices(NodeView.from_node(gpu)) == [] and GPU.parse_node_devices(NodeView.from_node(sgpu)) == []

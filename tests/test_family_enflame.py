"""Enflame whole GCUs and DRS partitions: inventory, requests, webhook, annotations, placement."""
from __future__ import annotations

import orjson
import pytest

from hami_py.config import ConfigError, DeviceConfig, Section
from hami_py.devices import enflame
from hami_py.devices.base import (
    ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, NodeView, RequestError,
)
from hami_py.devices.enflame import (
    DrsAssignment, DrsProfile, DrsRequest, EnflameConfig, collect_profiles, drs_annotations, parse_profile,
    select_profile,
)
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.embedded import running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from tests.conftest import container as ctr, device_pod, assert_books_balance, decision_annotations, place, register_nodes, wait_until
from tests.test_webhook import admit, container, make_pod

VENDORS = build_vendors(DeviceConfig.default())
GCU = VENDORS["GCU"]
DRS = VENDORS["Enflame"]

# The capacity annotation as upstream's docs and device_test.go show it.
DRS_TEXT = ('{"devices":[{"index":"0","minor":"0","capacity":6},{"index":"1","minor":"1","capacity":"6"}],'
            '"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}')


# -- whole GCU ---------------------------------------------------------------------------------------

def test_gcus_come_from_the_node_capacity():
    devices = GCU.parse_node_devices(NodeView.of({}, name="e1", capacity={"enflame.com/gcu": "4"}))
    assert [d.id for d in devices] == ["e1-GCU-0", "e1-GCU-1", "e1-GCU-2", "e1-GCU-3"]
    assert {(d.count, d.devmem, d.devcore, d.type, d.health) for d in devices} == {(1, 100, 100, "GCU", True)}
    assert GCU.parse_node_devices(NodeView.of({}, name="e1", capacity={"enflame.com/gcu": "0"})) == []
    with pytest.raises(DeviceDecodeError) as err:
        GCU.parse_node_devices(NodeView.of({}, name="e1", capacity={"enflame.com/gcu": "two"}))
    assert str(err.value) == "enflame.com/gcu 'two' is not a whole number of cards"
    assert GCU.registration_source() == "enflame.com/gcu capacity"


def test_gcu_request_is_a_whole_card_and_has_no_uuid_selection():
    assert GCU.container_request(ctr({"enflame.com/gcu": "2"}), pod_annotations={}) == \
        ContainerRequest("GCU", 2, 100, 100, 100)
    assert GCU.container_request(ctr(requests={"enflame.com/gcu": "1"}), pod_annotations={}).nums == 1
    with pytest.raises(RequestError, match="^invalid enflame.com/gcu request in container main: "
                                           "device count 1.5 is not a plain integer$"):
        GCU.container_request(ctr({"enflame.com/gcu": "1.5"}), pod_annotations={})
    assert GCU.device_selector({"enflame.com/use-gpuuuid": "e1-GCU-0"}, {}) is None
    assert GCU.mutate_admission(ctr({"enflame.com/gcu": "1"}), {}) is True
    assert GCU.mutate_admission(ctr(requests={"enflame.com/gcu": "1"}), {}) is False


def test_gcu_annotations_are_upstreams():
    out = GCU.encode_allocation([[ContainerDevice("e1-GCU-1", "GCU", 100, 100)]])
    assert out == {"hami.io/enflame-gcu-devices-to-allocate": "e1-GCU-1,GCU,100,100:;",
                   "hami.io/enflame-gcu-devices-allocated": "e1-GCU-1,GCU,100,100:;"}


# -- DRS inventory -------------------------------------------------------------------------------------

def test_drs_inventory_from_the_capacity_annotation():
    devices = DRS.parse_node_devices(NodeView.of({"enflame.com/gcu-drs-capacity": DRS_TEXT}, name="e1"))
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type) for d in devices] == [
        ("e1-enflame-drs-0", 0, 6, 40960, 100, "Enflame"), ("e1-enflame-drs-1", 1, 6, 40960, 100, "Enflame")]
    assert devices[0].custom == {"minor": "0", "index": "0", "maxSlice": 6,
                                 "profiles": {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}}
    # An index that does not parse is the position; a missing minor is the index.
    odd = DRS.parse_node_devices(NodeView.of({"enflame.com/gcu-drs-capacity": orjson.dumps(
        {"devices": [{"index": "x", "capacity": 3}], "profiles": {"3g.24gb": "7"}}).decode()}, name="e1"))
    assert (odd[0].index, odd[0].custom["minor"], odd[0].devmem) == (0, "0", 24576)


@pytest.mark.parametrize("text, message", [
    ("{", "invalid JSON"),
    ('{"devices":[{"index":"0","capacity":0}],"profiles":{"1g.6gb":"0"}}',
     'device 0: field "capacity": 0 is not a positive slice count'),
    ('{"devices":[{"index":0,"capacity":1}],"profiles":{"1g.6gb":"0"}}', 'device 0: field "index": expected a string'),
    ('{"devices":[{"index":"0","capacity":1}],"profiles":{"big":"0"}}', "no valid DRS profile in ['big']"),
    ('{"devices":[],"profiles":{"1g.6gb":"0"}}', "the DRS capacity lists no device"),
])
def test_a_garbled_drs_capacity_is_refused_precisely(text, message):
    with pytest.raises(DeviceDecodeError) as err:
        DRS.parse_node_devices(NodeView.of({"enflame.com/gcu-drs-capacity": text}, name="e1"))
    assert message in str(err.value)


# -- DRS profiles and requests ------------------------------------------------------------------------

def test_profile_names_and_the_profile_choice():
    assert parse_profile("3G.20GB") == (3, 20) and parse_profile("x") == (0, 0) and parse_profile("2g.x") == (2, 0)
    devices = DRS.parse_node_devices(NodeView.of({"enflame.com/gcu-drs-capacity": DRS_TEXT}, name="e1"))
    profiles = collect_profiles(devices)
    assert profiles == [DrsProfile("1g.6gb", "0", 1, 6, 17), DrsProfile("3g.20gb", "1", 3, 20, 50),
                        DrsProfile("6g.40gb", "2", 6, 40, 100)]
    assert select_profile(profiles, DrsRequest(direct=True, slices=3)).name == "3g.20gb"
    assert select_profile(profiles, DrsRequest(direct=True, slices=2)) is None
    assert select_profile(profiles, DrsRequest(direct=False, memory=8)).name == "3g.20gb"        # GB
    assert select_profile(profiles, DrsRequest(direct=False, memory=16384)).name == "3g.20gb"    # MiB
    assert select_profile(profiles, DrsRequest(direct=False, cores=60)).name == "6g.40gb"
    assert select_profile(profiles, DrsRequest(direct=False, memory=41)) is None
    # upstream's TestFit_SelectProfileByMemoryCoreRequest: 20480 MiB and 40 % on a card whose custom
    # info has no maxSlice (it is then read from the profile names) -> 3g.20gb, charged 20480 / 50.
    bare = [DeviceInfo(id="node-a-enflame-drs-0", index=0, count=6, devmem=40960, devcore=0, type="Enflame",
                       health=True, custom={"minor": "0", "index": "0", "profiles": devices[0].custom["profiles"]})]
    chosen = select_profile(collect_profiles(bare), DrsRequest(direct=False, memory=20480, cores=40))
    assert (chosen.name, chosen.id, chosen.memory_gb * 1024, chosen.core_percent) == ("3g.20gb", "1", 20480, 50)


def test_drs_requests_are_parsed_into_one_partition_row():
    assert DRS.parse_request(ctr({"enflame.com/drs-gcu": "3"})) == DrsRequest(direct=True, slices=3)
    assert DRS.parse_request(ctr({"enflame.com/gcu-memory": "20"}, {"enflame.com/gcu-core": "50"})) == \
        DrsRequest(direct=False, memory=20, cores=50)
    assert DRS.parse_request(ctr({"cpu": "1"})) is None
    with pytest.raises(RequestError, match='enflame.com/drs-gcu "1.5" is not a whole number of slices'):
        DRS.parse_request(ctr({"enflame.com/drs-gcu": "1.5"}))
    # Upstream's row: slices direct (mempct 0) or memory/cores by spec (mempct -1); the kernel
    # charges the profile the charger picks on each node, not these numbers.
    assert DRS.container_request(ctr({"enflame.com/drs-gcu": "3"}), pod_annotations={}) == \
        ContainerRequest("Enflame", 1, 3, 0, 0)
    assert DRS.container_request(ctr({"enflame.com/gcu-memory": "20", "enflame.com/gcu-core": "50"}),
                                 pod_annotations={}) == ContainerRequest("Enflame", 1, 20, -1, 50)
    assert DRS.container_request(ctr({"cpu": "1"}), pod_annotations={}) is None
    # A core percentage above 100 is refused (HAMi after v2.10), no longer clamped to 100.
    with pytest.raises(RequestError) as err:
        DRS.container_request(ctr({"enflame.com/gcu-memory": "20", "enflame.com/gcu-core": "150"}), pod_annotations={})
    assert str(err.value) == 'container "main": enflame.com/gcu-core "150" is out of range: must be between 0 and 100'


def test_drs_webhook_validates_and_mirrors_as_upstream():
    c = ctr(requests={"enflame.com/drs-gcu": "2"})
    assert DRS.admission(c) is True
    assert c["resources"]["limits"] == {"enflame.com/drs-gcu": "2"}
    c = ctr({"enflame.com/gcu-memory": "20"}, {"enflame.com/gcu-core": "30"})
    assert DRS.admission(c) is True
    assert c["resources"]["limits"] == {"enflame.com/gcu-memory": "20", "enflame.com/gcu-core": "30"}
    assert c["resources"]["requests"] == {"enflame.com/gcu-memory": "20", "enflame.com/gcu-core": "30"}
    for bad, message in (({"enflame.com/drs-gcu": "0"}, 'enflame.com/drs-gcu "0" must be greater than 0'),
                         ({"enflame.com/gcu-memory": "0"}, 'enflame.com/gcu-memory "0" must be greater than 0'),
                         ({"enflame.com/gcu-core": "101"}, 'enflame.com/gcu-core "101" must be in range (0,100]')):
        with pytest.raises(RequestError) as err:
            DRS.admission(ctr(bad))
        assert str(err.value) == f'container "main": {message}'
    assert DRS.admission(ctr({"cpu": "1"})) is False


def test_the_webhook_leaves_other_containers_exactly_as_they_came():
    """A container without DRS resources gains no empty ``requests`` (one JSON-patch operation
    more on every admitted pod, and a spec the user never wrote)."""
    plain = {"name": "main", "resources": {"limits": {"cpu": "1"}}}
    assert DRS.admission(plain) is False
    assert plain == {"name": "main", "resources": {"limits": {"cpu": "1"}}}
    bare = {"name": "side"}
    assert DRS.admission(bare) is False and bare == {"name": "side"}


def test_the_webhook_admits_a_drs_pod_and_refuses_a_bad_value():
    response, patched = admit(make_pod(container(limits={"enflame.com/drs-gcu": "3"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"
    assert patched["spec"]["containers"][0]["resources"]["requests"]["enflame.com/drs-gcu"] == "3"
    response, _ = admit(make_pod(container(limits={"enflame.com/gcu-core": "150"})))
    assert not response["allowed"] and "must be in range (0,100]" in response["status"]["message"]
    response, patched = admit(make_pod(container(limits={"enflame.com/gcu": "1"})))
    assert response["allowed"] and patched["spec"]["schedulerName"] == "hami-scheduler"


def test_drs_annotations_are_upstreams():
    profile = DrsProfile("3g.20gb", "1", 3, 20, 50)
    devices = [[ContainerDevice("e1-enflame-drs-1", "Enflame", 20480, 50)], []]
    out = drs_annotations(devices, [DrsAssignment("main", "1", "1", profile), None], now_ns=1700000000123456789)
    assert out == {
        "hami.io/enflame-vgpu-devices-allocated": "e1-enflame-drs-1,Enflame,20480,50:;;",
        "enflame.com/gcu-assigned": "false", "enflame.com/gcu-assigned-time": "1700000000123456789",
        "enflame.com/gcu-assigned-index": "1", "enflame.com/gcu-assigned-id": "1",
        "enflame.com/gcu-assigned-minor": "1", "enflame.com/gcu-request-size": "3",
        "assigned-containers": '{"main":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"}}'}
    assert set(out) <= set(DRS.decision_annotations())
    assert drs_annotations([[]], [None], now_ns=1) == {}


def test_a_pods_slices_are_read_back_from_upstreams_annotations():
    """The device list does not carry slices: ``assigned-containers`` does, by container name;
    each device takes the request of the entry whose profile has its memory, else
    ``gcu-request-size``, else 1."""
    two = {"hami.io/enflame-vgpu-devices-allocated":
           "e1-enflame-drs-0,Enflame,20480,50:;e1-enflame-drs-1,Enflame,6144,17:;",
           "enflame.com/gcu-request-size": "3",
           "assigned-containers": '{"a":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"},'
                                  '"b":{"allocated":true,"request":1,"profileID":"0","profileName":"1g.6gb"}}'}
    decoded = DRS.decode_allocation(two)
    assert decoded == [[ContainerDevice("e1-enflame-drs-0", "Enflame", 20480, 50, 3)],
                       [ContainerDevice("e1-enflame-drs-1", "Enflame", 6144, 17, 1)]]
    size_only = {"hami.io/enflame-vgpu-devices-allocated": "e1-enflame-drs-0,Enflame,40960,100:;",
                 "enflame.com/gcu-request-size": "6"}
    assert DRS.decode_allocation(size_only)[0][0].slots == 6
    bare = {"hami.io/enflame-vgpu-devices-allocated": "e1-enflame-drs-0,Enflame,6144,17:;"}
    assert DRS.decode_allocation(bare)[0][0].slots == 1
    assert DRS.decode_allocation({}) is None


def test_a_decisions_devices_encode_to_upstreams_annotations():
    custom = {"container": "main", "profileName": "3g.20gb", "profileID": "1", "drsSlice": 3, "minor": "1",
              "index": "1"}
    device = ContainerDevice("e1-enflame-drs-1", "Enflame", 20480, 50, 3, custom)
    out = DRS.encode_allocation([[], [device]], node="e1", now=1700000000.5)
    assert out["assigned-containers"] == \
        '{"main":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"}}'
    assert out["enflame.com/gcu-request-size"] == "3" and out["enflame.com/gcu-assigned-minor"] == "1"
    # HAMi #2877: a device of several slots carries them in a fifth field.
    assert out["hami.io/enflame-vgpu-devices-allocated"] == ";e1-enflame-drs-1,Enflame,20480,50,3:;"
    assert DRS.decode_allocation(out) == [[], [device]]
    # The fifth field alone says the slices (no assigned-containers, no request size).
    alone = DRS.decode_allocation({"hami.io/enflame-vgpu-devices-allocated": ";e1-enflame-drs-1,Enflame,20480,50,3:;"})
    assert alone[1][0].slots == 3
    with pytest.raises(ValueError, match="carries no profile"):
        DRS.encode_allocation([[ContainerDevice("e1-enflame-drs-1", "Enflame", 20480, 50)]])


# -- config ------------------------------------------------------------------------------------------

def test_config_section_keys_defaults_and_errors():
    assert EnflameConfig.from_section(Section.of("enflame", None)).drs_names() == (
        "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core")
    assert EnflameConfig.from_section(Section.of("enflame", {"resourceNameVGCU": "old/vgcu"})).drs_names()[0] == "old/vgcu"
    with pytest.raises(ConfigError) as err:
        EnflameConfig.from_section(Section.of("enflame", {"resourceNameGCU": ["x"]}))
    assert str(err.value) == "device config: enflame.resourceNameGCU: expected a string, got list"
    vendors = enflame.build_family(DeviceConfig(sections={}), None)
    assert [v.resource_names() for v in vendors] == [[], ["enflame.com/drs-gcu", "enflame.com/gcu-memory",
                                                          "enflame.com/gcu-core"]]


# -- end to end ------------------------------------------------------------------------------------------

def enflame_node(name, *, gcus=None, drs=None, gpus=0):
    node = gpu_node(name, gpus=max(gpus, 1))
    if not gpus:
        del node["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    if gcus is not None:
        node["status"]["capacity"]["enflame.com/gcu"] = gcus
        node["status"]["allocatable"]["enflame.com/gcu"] = gcus
    if drs is not None:
        node["metadata"]["annotations"]["enflame.com/gcu-drs-capacity"] = drs
    return node


gcu_pod = device_pod     # the family's pods in these tests


async def test_a_gcu_pod_is_filtered_bound_and_annotated(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", gcus="2"))
    pod, result = await place(api, extender, gcu_pod("g", {"enflame.com/gcu": "1"}), names)
    assert result["NodeNames"] == ["e1"], result
    ann = decision_annotations(api, app, "g")
    assert ann["hami.io/enflame-gcu-devices-allocated"] == ann["hami.io/enflame-gcu-devices-to-allocate"]
    assert ann["hami.io/enflame-gcu-devices-allocated"] in ("e1-GCU-0,GCU,100,100:;", "e1-GCU-1,GCU,100,100:;")
    assert (await extender.bind(pod, "e1"))["Error"] == ""
    await wait_until(lambda: api.get("pods", "g", namespace="default")["spec"].get("nodeName") == "e1", "bound")
    _, result = await place(api, extender, gcu_pod("g2", {"enflame.com/gcu": "1"}), names)
    assert result["NodeNames"] == ["e1"]
    _, result = await place(api, extender, gcu_pod("g3", {"enflame.com/gcu": "1"}), names)
    assert result["NodeNames"] is None      # both cards are given whole
    assert_books_balance(app)


# One card of 6 slices and 40 GB.
ONE_CARD = '{"devices":[{"index":"0","minor":"3","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}'


def usage(app, node, i=0):
    d = app.cache.device_usage(node)[i]
    return d["used"], d["usedmem"], d["usedcores"]


async def bind_and_read(api, extender, pod, node):
    """Bind the pod and return its annotations once bound (the decision is on the pod by then,
    whether /filter or the Binding carried it)."""
    assert (await extender.bind(pod, node))["Error"] == ""
    name = pod["metadata"]["name"]
    await wait_until(lambda: api.get("pods", name, namespace="default")["spec"].get("nodeName") == node, "bound")
    return api.get("pods", name, namespace="default")["metadata"]["annotations"]


async def test_a_drs_pod_is_placed_bound_and_annotated_as_upstream(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=ONE_CARD))
    pod, result = await place(api, extender, gcu_pod("d", {"enflame.com/drs-gcu": "3"}), names)
    assert result["NodeNames"] == ["e1"], result
    ann = await bind_and_read(api, extender, pod, "e1")
    assert ann["hami.io/enflame-vgpu-devices-allocated"] == "e1-enflame-drs-0,Enflame,20480,50,3:;"
    assert {k: ann[k] for k in ("enflame.com/gcu-assigned", "enflame.com/gcu-assigned-index",
                                "enflame.com/gcu-assigned-id", "enflame.com/gcu-assigned-minor",
                                "enflame.com/gcu-request-size", "assigned-containers")} == {
        "enflame.com/gcu-assigned": "false", "enflame.com/gcu-assigned-index": "0",
        "enflame.com/gcu-assigned-id": "0", "enflame.com/gcu-assigned-minor": "3",
        "enflame.com/gcu-request-size": "3",
        "assigned-containers": '{"main":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"}}'}
    assert int(ann["enflame.com/gcu-assigned-time"]) > 10**18          # Unix nanoseconds
    assert "hami.io/enflame-vgpu-devices-to-allocate" not in ann       # upstream writes none for DRS
    assert usage(app, "e1") == (3, 20480, 50)                          # 3 of the card's 6 slices
    assert_books_balance(app)


async def test_two_drs_pods_fill_a_card_by_slices_and_a_third_is_refused(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=ONE_CARD))
    for name in ("a", "b"):
        pod, result = await place(api, extender, gcu_pod(name, {"enflame.com/drs-gcu": "3"}), names)
        assert result["NodeNames"] == ["e1"], result
        await bind_and_read(api, extender, pod, "e1")
    assert usage(app, "e1") == (6, 40960, 100)
    _, result = await place(api, extender, gcu_pod("c", {"enflame.com/drs-gcu": "1"}), names)
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"e1": "1/1 CardTimeSlicingExhausted"}
    assert_books_balance(app)
    api.delete("pods", "a", namespace="default")
    await wait_until(lambda: usage(app, "e1") == (3, 20480, 50), "a's partition released")
    _, result = await place(api, extender, gcu_pod("c2", {"enflame.com/drs-gcu": "1"}), names)
    assert result["NodeNames"] == ["e1"], result
    assert usage(app, "e1") == (4, 20480 + 6144, 50 + 17)
    assert_books_balance(app)


async def test_a_card_too_full_is_refused_for_its_slices_and_a_missing_profile_reads_mode_not_fit(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=ONE_CARD))
    for i in range(4):          # four 1-slice partitions: 4 slices, 24 GB of 40
        _, result = await place(api, extender, gcu_pod(f"s{i}", {"enflame.com/drs-gcu": "1"}), names)
        assert result["NodeNames"] == ["e1"], result
    assert usage(app, "e1") == (4, 4 * 6144, 4 * 17)
    # 3 more slices (20 GB) do not fit: 2 slices and 16 GB are left. HAMi since #2877 tests the
    # slices first and says CardTimeSlicingExhausted (v2.10 tested them after memory and said
    # memory; docs/devices/enflame.md).
    _, result = await place(api, extender, gcu_pod("big", {"enflame.com/drs-gcu": "3"}), names)
    assert result["FailedNodes"] == {"e1": "1/1 CardTimeSlicingExhausted"}
    _, result = await place(api, extender, gcu_pod("two", {"enflame.com/drs-gcu": "2"}), names)
    assert result["FailedNodes"] == {"e1": "1/1 ModeNotFit"}          # no 2-slice profile
    assert_books_balance(app)


async def test_a_pod_of_several_drs_containers_is_charged_and_read_back_per_container(api, app, extender):
    """An init container and two app containers on one card: the card holds the larger of the
    init peak and the app sum (6 slices), and each container's profile is read back by name."""
    names = await register_nodes(api, app, enflame_node("e1", drs=ONE_CARD))
    pod = gcu_pod("multi", {"enflame.com/drs-gcu": "3"})
    pod["spec"]["containers"][0]["name"] = "a"
    pod["spec"]["containers"].append({"name": "b", "image": "x", "resources": {"limits": {"enflame.com/drs-gcu": "1"}}})
    pod["spec"]["initContainers"] = [{"name": "prep", "image": "x",
                                      "resources": {"limits": {"enflame.com/drs-gcu": "6"}}}]
    pod, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["e1"], result
    assert usage(app, "e1") == (6, 40960, 100)
    ann = await bind_and_read(api, extender, pod, "e1")
    assert ann["hami.io/enflame-vgpu-devices-allocated"] == (
        "e1-enflame-drs-0,Enflame,40960,100,6:;e1-enflame-drs-0,Enflame,20480,50,3:;e1-enflame-drs-0,Enflame,6144,17:;")
    assert ann["enflame.com/gcu-request-size"] == "6"                  # the first container's
    assert {k: (v["request"], v["profileName"]) for k, v in orjson.loads(ann["assigned-containers"]).items()} == \
        {"prep": (6, "6g.40gb"), "a": (3, "3g.20gb"), "b": (1, "1g.6gb")}
    decoded = DRS.decode_allocation(ann)
    assert [[d.slots for d in c] for c in decoded] == [[6], [3], [1]]
    assert usage(app, "e1") == (6, 40960, 100)
    assert_books_balance(app)


async def test_a_drs_pod_picks_or_avoids_cards_by_uuid(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=DRS_TEXT))
    pod, result = await place(api, extender, gcu_pod("u", {"enflame.com/drs-gcu": "1"},
                                                     annotations={"enflame.com/use-gpuuuid": "e1-enflame-drs-1"}), names)
    assert result["NodeNames"] == ["e1"], result
    ann = await bind_and_read(api, extender, pod, "e1")
    assert ann["hami.io/enflame-vgpu-devices-allocated"].startswith("e1-enflame-drs-1,")
    assert ann["enflame.com/gcu-assigned-index"] == "1"
    _, result = await place(api, extender, gcu_pod("n", {"enflame.com/drs-gcu": "1"}, annotations={
        "enflame.com/nouse-gpuuuid": "e1-enflame-drs-0,e1-enflame-drs-1"}), names)
    assert result["FailedNodes"] == {"e1": "2/2 CardUuidMismatch"}


async def test_a_by_spec_request_gets_the_smallest_fitting_profile(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=DRS_TEXT))
    cases = [("c60", {"enflame.com/gcu-core": "60"}, "6g.40gb", 40960, 100, 6),
             ("m15", {"enflame.com/gcu-memory": "15", "enflame.com/gcu-core": "30"}, "3g.20gb", 20480, 50, 3),
             ("m5", {"enflame.com/gcu-memory": "5"}, "1g.6gb", 6144, 17, 1)]
    for name, limits, profile, mem, cores, slices in cases:
        pod, result = await place(api, extender, gcu_pod(name, limits), names)
        assert result["NodeNames"] == ["e1"], (name, result)
        ann = await bind_and_read(api, extender, pod, "e1")
        assigned = orjson.loads(ann["assigned-containers"])["main"]
        assert (assigned["profileName"], assigned["request"]) == (profile, slices), name
        fields = [str(mem), str(cores), f"{slices}:;"] if slices > 1 else [str(mem), f"{cores}:;"]
        assert ann["hami.io/enflame-vgpu-devices-allocated"].split(",")[2:] == fields, name
    # 6 slices on one card, 3 + 1 on the other.
    assert sorted(usage(app, "e1", i)[0] for i in range(2)) == [4, 6]
    # A value above twice the largest profile is MiB: 15000 MiB is 15 GB, a 3g.20gb, which neither
    # the 2 slices (14 GB) left on one card nor the full other card can hold: both are refused for
    # their slices, tested before memory since HAMi #2877.
    _, result = await place(api, extender, gcu_pod("mib", {"enflame.com/gcu-memory": "15000"}), names)
    assert result["FailedNodes"] == {"e1": "2/2 CardTimeSlicingExhausted"}
    _, result = await place(api, extender, gcu_pod("huge", {"enflame.com/gcu-memory": "41"}), names)
    assert result["FailedNodes"] == {"e1": "1/2 ModeNotFit"}
    assert_books_balance(app)


async def test_a_restarted_scheduler_charges_drs_pods_from_their_annotations(api):
    api.create("nodes", enflame_node("e1", drs=ONE_CARD))
    async with running_scheduler(api) as first:
        await wait_until(lambda: "e1" in first.cache.node_index_of, "e1 registered")
        client = ExtenderClient(first.url)
        try:
            for name, slices in (("a", "3"), ("b", "1")):
                pod, result = await place(api, client, gcu_pod(name, {"enflame.com/drs-gcu": slices}), ["e1"])
                assert result["NodeNames"] == ["e1"], result
                await bind_and_read(api, client, pod, "e1")
        finally:
            await client.close()
        assert usage(first, "e1") == (4, 20480 + 6144, 50 + 17)
    async with running_scheduler(api) as second:
        await wait_until(lambda: usage(second, "e1")[0] == 4, "both partitions charged again")
        assert usage(second, "e1") == (4, 20480 + 6144, 50 + 17)
        assert_books_balance(second)
        client = ExtenderClient(second.url)
        try:
            _, result = await place(api, client, gcu_pod("c", {"enflame.com/drs-gcu": "3"}), ["e1"])
            assert result["FailedNodes"] == {"e1": "1/1 CardTimeSlicingExhausted"}   # 2 slices, 14 GB left
        finally:
            await client.close()


async def test_upstreams_drs_pods_are_charged_their_slices(api, app, extender):
    names = await register_nodes(api, app, enflame_node("e1", drs=ONE_CARD))
    legacy = gcu_pod("legacy", {"enflame.com/drs-gcu": "3"}, annotations={
        "hami.io/vgpu-node": "e1", "hami.io/enflame-vgpu-devices-allocated": "e1-enflame-drs-0,Enflame,20480,50:;",
        "enflame.com/gcu-assigned": "true", "enflame.com/gcu-request-size": "3",
        "assigned-containers": '{"main":{"allocated":true,"request":3,"profileID":"1","profileName":"3g.20gb"}}'})
    legacy["spec"]["nodeName"] = "e1"
    legacy["status"]["phase"] = "Running"
    api.create("pods", legacy)
    await wait_until(lambda: usage(app, "e1") == (3, 20480, 50), "the upstream DRS pod charged its 3 slices")
    assert_books_balance(app)
    _, result = await place(api, extender, gcu_pod("d", {"enflame.com/drs-gcu": "6"}), names)
    assert result["FailedNodes"] == {"e1": "1/1 CardTimeSlicingExhausted"}     # upstream's words (#2877)
    _, result = await place(api, extender, gcu_pod("d3", {"enflame.com/drs-gcu": "3"}), names)
    assert result["NodeNames"] == ["e1"]
    assert usage(app, "e1") == (6, 40960, 100)
    assert_books_balance(app)


async def test_a_garbled_drs_capacity_is_refused_while_the_nodes_gpus_work(api, app, extender):
    names = await register_nodes(api, app, enflame_node("mixed", drs='{"devices":[{"capacity":-1}],'
                                                                      '"profiles":{"1g.6gb":"0"}}', gpus=1))
    assert app.cache.nodes["mixed"].decode_error == \
        'enflame.com/gcu-drs-capacity: device 0: field "capacity": -1 is not a positive slice count'
    _, result = await place(api, extender, gpu_pod("gpu", gpumem=1000, gpucores=10), names)
    assert result["NodeNames"] == ["mixed"], result

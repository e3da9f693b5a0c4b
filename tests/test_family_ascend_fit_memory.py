"""HAMi #3107: a pod naming no vNPU mode keeps its memory as asked through admission, and each
candidate node decides it: rounded up to a vNPU template on a template node, as asked on a node
running hami-core. The decision says which in ``hami.io/effective-vnpu-mode``, and the books
charge the bound pod exactly what its allocation annotations say, before and after a restart.

Checked where it lives (the family's charger over a real usage cache) and end to end against the
in-repo API server (filter, bind, the device plugin's allocation, the books' recount).
"""
from __future__ import annotations

import orjson
import pytest

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.ascend.modes import NodeModes, effective_mode
from hami_py.devices.base import ContainerDevice
from hami_py.devices.registry import build_vendors
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.reasons import CARD_INSUFFICIENT_MEMORY
from tests.conftest import assert_books_balance, place, register_nodes, wait_until
from tests.test_family_ascend import ON, _allocated, _bind, npu_node, npu_pod, npu_registration, npu_uuid, vendor
from tests.test_family_ascend_enpu import CORE, ENPU, TEMPLATE, modes_node

EFFECTIVE = "hami.io/effective-vnpu-mode"


@pytest.mark.parametrize("mode, core, enpu, resolved", [
    (None, False, False, "template"),
    ("", False, False, "template"),
    (None, True, False, "hami-core"),
    (None, True, True, "hami-core"),
    ("hami_core", True, False, "hami-core"),      # a value no rule knows reads as none
    ("template", False, False, "template"),
    ("hami-core", True, True, "hami-core"),
    ("enpu", True, True, "enpu"),
    ("vcann-rt", False, True, "enpu"),
])
def test_the_mode_a_pod_resolves_to_on_a_node(mode, core, enpu, resolved):
    assert effective_mode(mode, NodeModes(hami_core=core, enpu=enpu)) == resolved


# ---------------------------------------------------------------------------------------------
# the charger over a real usage cache
# ---------------------------------------------------------------------------------------------

def _charger(node: dict, pod: dict):
    """(the 910B3 charger of ``pod``'s filter, the node's index) over a cache holding ``node``."""
    vendors = build_vendors(DeviceConfig.default(), ON)
    cache = UsageCache(vendors)
    cache.upsert_node(node)
    return vendors["Ascend910B3"].charger(cache, pod, [0]), cache.node_index_of[node["metadata"]["name"]]


@pytest.mark.parametrize("annotations, memory, on_template, on_hami_core", [
    ({}, 10000, 16384, 10000),              # mode-less: the node decides
    ({}, 16385, 32768, 16385),
    ({}, 40000, 65536, 40000),              # no template holds it: the whole NPU's memoryAllocatable
    ({}, 65536, 65536, 65536),
    (TEMPLATE, 10000, 16384, None),         # already rounded by the webhook; rounding again is a no-op
    (TEMPLATE, 16384, 16384, None),
    (CORE, 10000, None, 10000),
])
def test_each_node_charges_a_row_by_the_mode_the_pod_resolves_to_there(annotations, memory, on_template,
                                                                       on_hami_core):
    pod = npu_pod("p", memory=memory, annotations=annotations)
    for node, expected, mode in ((npu_node("hard", {"Ascend910B3": 2}), on_template, "template"),
                                 (modes_node("soft", core=True, enpu=False), on_hami_core, "hami-core")):
        if expected is None:
            continue          # the node refuses the pod's mode (the device selector's ModeNotFit)
        charger, index = _charger(node, pod)
        assert charger(index, 0) == (expected, 0, 1)
        device = ContainerDevice("npu", "Ascend910B3", expected, 0)
        charger.settle(index, 0, 0, device)
        assert (device.usedmem, device.custom) == (expected, {"effective_vnpu_mode": mode})


def test_a_request_no_vnpu_holds_is_refused_on_a_template_node_only():
    """A pod that skipped the webhook asking more than ``memoryCapacity``: no template node can
    carve it; a hami-core node is asked the request as it is (its NPUs' memory decides)."""
    pod = npu_pod("big", memory=70000)
    charger, index = _charger(npu_node("hard", {"Ascend910B3": 2}), pod)
    assert charger(index, 0) == CARD_INSUFFICIENT_MEMORY
    charger, index = _charger(modes_node("soft", core=True, enpu=False), pod)
    assert charger(index, 0) == (70000, 0, 1)


def test_a_row_asking_no_memory_is_charged_each_npus_whole_memory():
    """The kernel is told the smallest NPU's memory of the node; settle gives each chosen NPU its own."""
    devices = npu_registration("odd", "Ascend910B3", 2)
    devices[1]["devmem"] = 32768
    node = npu_node("odd", registrations={"Ascend910B3": devices})
    charger, index = _charger(node, npu_pod("whole", cores=None))
    assert charger(index, 0) == (32768, 0, 1)
    for position, memory in ((0, 65536), (1, 32768)):
        device = ContainerDevice(npu_uuid("odd", "Ascend910B3", position), "Ascend910B3", 32768, 0)
        charger.settle(index, position, 0, device)
        assert device.usedmem == memory


def test_the_decision_writes_the_resolved_mode_and_the_runtime_json_follows_it():
    """A mode-less pod on a hami-core node is soft split there: no template name for the plugin."""
    v = vendor()
    soft = [[ContainerDevice("npu-0", "Ascend910B3", 10000, 0, custom={"effective_vnpu_mode": "hami-core"})]]
    out = v.encode_allocation(soft, pod_annotations={})
    assert out[EFFECTIVE] == "hami-core"
    assert orjson.loads(out["huawei.com/Ascend910B3"]) == [{"UUID": "npu-0", "memory": 10000}]
    hard = [[ContainerDevice("npu-0", "Ascend910B3", 16384, 0, custom={"effective_vnpu_mode": "template"})]]
    out = v.encode_allocation(hard, pod_annotations={})
    assert out[EFFECTIVE] == "template"
    assert orjson.loads(out["huawei.com/Ascend910B3"]) == [{"UUID": "npu-0", "temp": "vir05_1c_16g", "memory": 16384}]
    assert set(out) == set(v.decision_annotations())
    # Encoded again from the pod's annotations (no filter): the written mode still decides, and
    # the key is not written a second time.
    again = v.encode_allocation([[ContainerDevice("npu-0", "Ascend910B3", 10000, 0)]],
                                pod_annotations={EFFECTIVE: "hami-core"})
    assert EFFECTIVE not in again and "temp" not in again["huawei.com/Ascend910B3"]


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def scheduler_options():
    return embedded_options(enable_ascend=True)


async def test_a_mode_less_pod_gets_a_template_on_a_template_node_and_its_request_on_a_hami_core_one(
        api, app, extender):
    names = await register_nodes(api, app, npu_node("hard", {"Ascend910B3": 1}),
                                 modes_node("soft", core=True, enpu=False, npus=1))
    # As the webhook now leaves a mode-less pod: 10000 MiB as asked.
    placed = {}
    for node in names:
        pod, result = await place(api, extender, npu_pod(f"on-{node}", memory=10000), [node])
        assert result["NodeNames"] == [node], result
        placed[node] = pod
    ann, devices = _allocated(api, app, "on-hard", "Ascend910B3")
    (npu,) = devices[0]
    assert (npu.usedmem, ann[EFFECTIVE]) == (16384, "template")
    assert orjson.loads(ann["huawei.com/Ascend910B3"]) == [{"UUID": npu.uuid, "temp": "vir05_1c_16g", "memory": 16384}]
    ann, devices = _allocated(api, app, "on-soft", "Ascend910B3")
    (npu,) = devices[0]
    assert (npu.usedmem, ann[EFFECTIVE]) == (10000, "hami-core")
    assert orjson.loads(ann["huawei.com/Ascend910B3"]) == [{"UUID": npu.uuid, "memory": 10000}]
    for node, pod in placed.items():
        assert (await _bind(app, extender, pod, node))["Error"] == ""
    usage = {node: app.cache.device_usage(node)[0]["usedmem"] for node in names}
    assert usage == {"hard": 16384, "soft": 10000}
    assert_books_balance(app)
    # A restart recounts every charge from the annotations: the same books (bound pods: those two).
    before = {node: app.cache.device_usage(node) for node in names}
    async with running_scheduler(api, options=embedded_options(enable_ascend=True), device_plugin=False) as second:
        await wait_until(lambda: {node: second.cache.device_usage(node) for node in names} == before,
                         "usage rebuilt from annotations")
        assert_books_balance(second)
    # 20000 MiB is a 32768-MiB template on the hard node: one more fits its 49152 MiB left, a
    # second does not, though the NPU has 29152 MiB free; the hami-core node takes it as asked.
    _, result = await place(api, extender, npu_pod("fill-0", memory=20000), ["hard"])
    assert result["NodeNames"] == ["hard"], result
    _, result = await place(api, extender, npu_pod("fill-1", memory=20000), ["hard"])
    assert result["FailedNodes"] == {"hard": "1/1 CardInsufficientMemory"}
    _, result = await place(api, extender, npu_pod("fill-2", memory=20000), ["hard", "soft"])
    assert result["NodeNames"] == ["soft"], result
    assert _allocated(api, app, "fill-2", "Ascend910B3")[1][0][0].usedmem == 20000
    assert_books_balance(app)


async def test_the_resolved_mode_of_soft_split_pods_is_their_own(api, app, extender):
    names = await register_nodes(api, app, modes_node("dual", core=True, enpu=True))
    for name, ann, mode in (("core", CORE, "hami-core"), ("vcann", {"huawei.com/vnpu-mode": "vcann-rt"}, "enpu")):
        _, result = await place(api, extender, npu_pod(name, memory=10000, cores=20, annotations=ann), names)
        assert result["NodeNames"] == ["dual"], result
        written, devices = _allocated(api, app, name, "Ascend910B3")
        assert (written[EFFECTIVE], devices[0][0].usedmem) == (mode, 10000)
    assert_books_balance(app)


async def test_whole_npus_on_a_node_whose_npus_differ_are_only_unused_ones(api, app, extender):
    """A row asking no memory takes only an NPU nothing uses memory of, charged that NPU's own memory."""
    devices = npu_registration("odd", "Ascend910B3", 2)
    devices[1]["devmem"] = 32768
    names = await register_nodes(api, app, npu_node(
        "odd", registrations={"Ascend910B3": devices}, allocatable={"huawei.com/Ascend910B3": "8"},
        annotations={"hami.io/node-handshake-Ascend910B3": "Reported_2026.01.01 00:00:00"}))
    big, small = npu_uuid("odd", "Ascend910B3", 0), npu_uuid("odd", "Ascend910B3", 1)
    _, result = await place(api, extender, npu_pod("part", memory=16384,
                                                   annotations={"hami.io/use-Ascend910B3-uuid": big}), names)
    assert result["NodeNames"] == ["odd"], result
    # NPU 0 has 49152 MiB free, more than NPU 1's whole 32768, yet it is not whole any more.
    _, result = await place(api, extender, npu_pod("whole"), names)
    assert result["NodeNames"] == ["odd"], result
    (npu,) = _allocated(api, app, "whole", "Ascend910B3")[1][0]
    assert (npu.uuid, npu.usedmem) == (small, 32768)
    _, result = await place(api, extender, npu_pod("whole-2"), names)
    assert result["FailedNodes"] == {"odd": "2/2 CardInsufficientMemory"}, result
    assert_books_balance(app)

"""A mixed cluster end to end: nodes of every device family behind one scheduler.

kube-scheduler sends every pod all the nodes (the device resources are ``ignoredByScheduler``),
so each family's pods must find their own family's nodes among the others, and a node that
carries two families must serve both, each pod getting one allocation annotation per family.
The scheduler runs with the switches the manifests pass (Ascend and Iluvatar on), against the
in-repo API server, and the books are recounted from the API server's objects at the end.
"""
from __future__ import annotations

import dataclasses

import orjson
import pytest

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options
from hami_py.fakeapi.families import find_device_model
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import assert_books_balance, device_pod, place, register_nodes, wait_until

ASCEND = find_device_model("Ascend910B3")
KUNLUN = find_device_model("P800")


@pytest.fixture
def scheduler_options():
    return dataclasses.replace(embedded_options(), enable_ascend=True, enable_iluvatar=True)


_pod = device_pod


def _both(name: str) -> dict:
    """A node with 2 NVIDIA GPUs and 8 Ascend 910B3 NPUs (two plugins, one node)."""
    ascend = ASCEND.parts(name)
    node = gpu_node(name, gpus=2)
    node["metadata"]["annotations"].update(ascend.annotations)
    node["status"] = {"capacity": {"cpu": "64", **ascend.capacity}, "allocatable": {"cpu": "64", **ascend.capacity}}
    return node


async def _bind(app, extender, pod: dict, node: str) -> None:
    assert await extender.bind(pod, node) == {"Error": ""}
    await wait_until(lambda: app.cache.bound_node(pod["metadata"]["uid"]) == node, f"{pod['metadata']['name']} bound")


async def test_each_familys_pods_land_on_its_own_nodes_among_the_others(api, app, extender):
    names = await register_nodes(api, app, gpu_node("gpu-0"), gpu_node("gpu-1"),
                                 ASCEND.node("npu-0"), ASCEND.node("npu-1"), KUNLUN.node("xpu-0"))
    placed = {}
    for pod in (gpu_pod("train", gpus=1, gpumem=20000),
                _pod("infer", {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}),
                _pod("search", {"kunlunxin.com/xpu": "2"})):
        stored, result = await place(api, extender, pod, names)
        assert result["Error"] == "" and len(result["NodeNames"]) == 1, result
        placed[stored["metadata"]["name"]] = (stored, result["NodeNames"][0])
    assert placed["train"][1].startswith("gpu-")
    assert placed["infer"][1].startswith("npu-")
    assert placed["search"][1] == "xpu-0"
    for stored, node in placed.values():
        await _bind(app, extender, stored, node)
    pods = {name: api.get("pods", name, namespace="default")["metadata"]["annotations"] for name in placed}
    assert decode_pod_devices(pods["train"]["hami.io/vgpu-devices-allocated"])[0][0].usedmem == 20000
    [[npu]] = decode_pod_devices(pods["infer"]["hami.io/Ascend910B3-devices-allocated"])
    assert npu.usedmem == 16384 and orjson.loads(pods["infer"]["huawei.com/Ascend910B3"])[0]["UUID"] == npu.uuid
    assert len(decode_pod_devices(pods["search"]["hami.io/kunlun-allocated"])[0]) == 2
    assert "BAIDU_COM_DEVICE_IDX" in pods["search"]
    assert_books_balance(app)


async def test_a_pod_asking_for_two_families_gets_one_allocation_per_family_on_a_node_with_both(api, app, extender):
    names = await register_nodes(api, app, _both("both"), gpu_node("gpu-only"), ASCEND.node("npu-only"))
    pod = gpu_pod("pair", gpus=1, gpumem=10000)
    pod["spec"]["containers"].append({"name": "npu", "image": "x", "resources": {"limits": {
        "huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}}})
    stored, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["both"], result
    await _bind(app, extender, stored, "both")
    annotations = api.get("pods", "pair", namespace="default")["metadata"]["annotations"]
    gpus = decode_pod_devices(annotations["hami.io/vgpu-devices-allocated"])
    npus = decode_pod_devices(annotations["hami.io/Ascend910B3-devices-allocated"])
    # One slot per container in each family's annotation; the other family's container is empty.
    assert [len(c) for c in gpus] == [1, 0] and [len(c) for c in npus] == [0, 1]
    assert_books_balance(app)


async def test_every_familys_devices_and_pods_are_in_upstreams_gauges(api, app, extender):
    """Upstream's ``hami_*`` gauges cover every family's devices and allocations, not NVIDIA's
    alone: one node of each family model the fake registrations know (one per family), and one
    pod of each asking what the model's first demo pod asks, placed on its own node and bound."""
    from tests.test_metrics import scrape, series
    from hami_py.devices.registry import _families
    models = _one_model_per_vendor()     # (a Vastai pod may take a die-mode node too)
    modules = {type(app.vendors[m.vendor_key]).__module__.split(".")[2] for m in models.values()} | {"nvidia"}
    # Remote GPUs (off in the chart's config) are a pool served by one node to pods on others:
    # tests/test_family_remotegpu.py places them.
    assert modules == {build.__module__.split(".")[2] for build in _families()} - {"remotegpu"}, modules
    names = await register_nodes(api, app, gpu_node("gpu-0", gpus=1), *(m.node(n) for n, m in models.items()))
    pods = {"gpu-0": gpu_pod("nvidia-pod", gpus=1, gpumem=20000)}
    pods.update({node: _pod(f"{m.key}-pod", dict(m.demo_limits[0][1])) for node, m in models.items()})
    for node, pod in pods.items():
        stored, result = await place(api, extender, pod, names)
        assert result["NodeNames"] == [node], (node, result)
        await _bind(app, extender, stored, node)
    models["gpu-0"] = None
    samples = await scrape(app)
    assert {dict(k)["node"] for k in series(samples, "hami_gpu_memory_limit_bytes")} == set(models)
    shares: dict[str, float] = {}
    for k, v in series(samples, "hami_gpu_shared_count").items():
        shares[dict(k)["node"]] = shares.get(dict(k)["node"], 0) + v
    assert shares == {node: 1 for node in models}, shares
    assert {dict(k)["pod"] for k in series(samples, "hami_vgpu_core_allocated_ratio")} >= {
        pod["metadata"]["name"] for pod in pods.values()} - {"biren-pod", "vastai-pod"}     # (slots only)
    assert_books_balance(app)


async def test_each_familys_memory_and_cores_read_in_upstreams_units(api, app, extender):
    """The gauges' values for families whose units differ: a Kunlun card is charged whole, an
    AWS Neuron core is its mask, AMD's compute units read as percent."""
    from tests.test_metrics import scrape, series
    names = await register_nodes(api, app, gpu_node("gpu-0", gpus=1), ASCEND.node("npu-0"), KUNLUN.node("xpu-0"),
                                 find_device_model("inf2").node("inf-0", devices=2),
                                 find_device_model("MI300X").node("amd-0", devices=1))
    pods = [gpu_pod("train", gpus=1, gpumem=20000),
            _pod("infer", {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}),
            _pod("search", {"kunlunxin.com/xpu": "1"}),
            _pod("neuron", {"aws.amazon.com/neuroncore": "1"}),
            _pod("rocm", {"amd.com/gpu": "1", "amd.com/gpumem": "8192", "amd.com/gpucores": "50"})]
    for pod in pods:
        stored, result = await place(api, extender, pod, names)
        await _bind(app, extender, stored, result["NodeNames"][0])
    samples = await scrape(app)
    limits = series(samples, "hami_gpu_memory_limit_bytes")
    assert {dict(k)["node"] for k in limits} == {"gpu-0", "npu-0", "xpu-0", "inf-0", "amd-0"}
    allocated = {dict(k)["pod"]: v for k, v in series(samples, "hami_vgpu_memory_allocated_bytes").items()}
    assert allocated["train"] == 20000 * 2**20 and allocated["infer"] == 16384 * 2**20
    assert allocated["search"] == 98304 * 2**20         # a whole Kunlun card
    assert allocated["neuron"] == 0 and allocated["rocm"] == 8192 * 2**20
    cores = {dict(k)["pod"]: v for k, v in series(samples, "hami_vgpu_core_allocated_ratio").items()}
    assert cores["neuron"] == 1                          # core 0's mask
    assert cores["rocm"] == 50                           # 152 of the MI300X's 304 compute units, in percent


async def test_metax_devices_and_pods_are_in_upstreams_gauges(api, app, extender):
    from tests.test_metrics import scrape, series
    names = await register_nodes(api, app, gpu_node("gpu-0", gpus=1), find_device_model("metax-gpu").node("mgpu-0"),
                                 find_device_model("metax-sgpu").node("sgpu-0"))
    for pod in (_pod("whole", {"metax-tech.com/gpu": "1"}),
                _pod("share", {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8", "metax-tech.com/vcore": "30"})):
        stored, result = await place(api, extender, pod, names)
        await _bind(app, extender, stored, result["NodeNames"][0])
    samples = await scrape(app)
    assert {dict(k)["node"] for k in series(samples, "hami_gpu_memory_limit_bytes")} == {"gpu-0", "mgpu-0", "sgpu-0"}
    allocated = {dict(k)["pod"]: v for k, v in series(samples, "hami_vgpu_memory_allocated_bytes").items()}
    assert allocated["whole"] == 65536 * 2**20 and allocated["share"] == 8 * 2**30


async def test_mthreads_biren_and_vastai_devices_and_pods_are_in_the_gauges(api, app, extender):
    from tests.test_metrics import scrape, series
    models = {"mt-0": find_device_model("S4000"), "br-0": find_device_model("BR104"),
              "va-0": find_device_model("VA1-die")}
    names = await register_nodes(api, app, *(m.node(n, devices=2) for n, m in models.items()))
    for pod in (_pod("sgpu", {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32", "mthreads.com/sgpu-core": "4"}),
                _pod("slot", {"birentech.com/gpu": "1"}), _pod("dies", {"vastaitech.com/va": "2"})):
        stored, result = await place(api, extender, pod, names)
        await _bind(app, extender, stored, result["NodeNames"][0])
    samples = await scrape(app)
    limits = series(samples, "hami_gpu_memory_limit_bytes")
    assert {dict(k)["node"] for k in limits} == set(models)
    assert {dict(k)["node"]: v for k, v in limits.items()}["mt-0"] == 49152 * 2**20   # 96 units of 512 MiB
    allocated = {dict(k)["pod"]: v for k, v in series(samples, "hami_vgpu_memory_allocated_bytes").items()}
    assert allocated["sgpu"] == 32 * 512 * 2**20
    assert allocated.get("slot", 0) == 0 and allocated.get("dies", 0) == 0   # slots only: no memory charged
    shares: dict[str, float] = {}
    for k, v in series(samples, "hami_gpu_shared_count").items():
        shares[dict(k)["node"]] = shares.get(dict(k)["node"], 0) + v
    assert shares == {"mt-0": 1, "br-0": 1, "va-0": 2}
    assert_books_balance(app)


def _one_model_per_vendor():
    """One fake model of each non-NVIDIA vendor (hami_py.fakeapi.families), with a demo request."""
    from hami_py.fakeapi.families import MODELS
    models = {}
    for model in MODELS:
        if model.demo_limits and model.vendor_key not in {m.vendor_key for m in models.values()}:
            models[f"{model.key}-0"] = model
    return models


async def test_the_nodes_path_fits_each_familys_pod_against_the_node_objects_sent(api, app, extender):
    """``nodeCacheCapable: false``: the node objects in the request are decoded by each family,
    and each family's pod fits only its own family's node among every family's."""
    from tests.conftest import node_list
    models = _one_model_per_vendor()
    nodes = [gpu_node("gpu-0", gpus=1)] + [m.node(name) for name, m in models.items()]
    for name, model in models.items():
        pod = api.create("pods", _pod(f"{model.key}-pod", dict(model.demo_limits[0][1])))
        _, body = await extender.post("filter", {"Pod": pod, "Nodes": node_list(*nodes)})
        assert body["Error"] == "", (model.key, body)
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == [name], (model.key, body)
        assert "gpu-0" in body["FailedNodes"]

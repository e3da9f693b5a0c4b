"""The fragmentation-aware policy, as a user meets it through /filter: whole devices stay whole,
shares go where devices are already shared, and memory is not left stranded on devices out of
slots. Each test shows a placement that today's policies get wrong and that the next pod pays for.
"""
from __future__ import annotations

from hami_py.devices.codec import decode_pod_devices
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from tests.conftest import decision_annotations, wait_until

FRAG = "fragmentation-aware"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
NODE_POLICY = "hami.io/node-scheduler-policy"
USE_UUID = "nvidia.com/use-gpuuuid"


def _devices_of(api, app, name):
    text = decision_annotations(api, app, name)["hami.io/vgpu-devices-allocated"]
    return [d.uuid for c in decode_pod_devices(text) for d in c]


async def _nodes(api, app, **devices_by_node):
    for name, devices in devices_by_node.items():
        api.create("nodes", gpu_node(name, devices=devices))
    await wait_until(lambda: all(n in app.cache.nodes for n in devices_by_node), "nodes registered")


async def _place(api, extender, name, nodes, **kw):
    pod = api.create("pods", gpu_pod(name, **kw))
    return (await extender.filter(pod, nodes)).get("NodeNames") or []


async def test_a_share_avoids_taking_the_last_slot_of_a_device_whose_memory_would_be_stranded(api, app, extender):
    devices = registration("n1", gpus=2, numa_nodes=1)
    devices[0]["count"] = 2          # GPU 0: two tasks at most; GPU 1: ten
    await _nodes(api, app, n1=devices)
    g0, g1 = devices[0]["id"], devices[1]["id"]
    assert await _place(api, extender, "on-g0", ["n1"], gpumem=40000, annotations={USE_UUID: g0}) == ["n1"]
    assert await _place(api, extender, "on-g1", ["n1"], gpumem=10000, annotations={USE_UUID: g1}) == ["n1"]
    # binpack takes GPU 0, the fuller: its last slot goes and ~43 GiB of it can never be used.
    assert await _place(api, extender, "bp", ["n1"], gpumem=60000, annotations={GPU_POLICY: "binpack"}) == ["n1"]
    assert _devices_of(api, app, "bp") == [g0]
    api.delete("pods", "bp", "default")
    await wait_until(lambda: not any(p.name == "bp" for p in app.cache.pods.values()), "bp released")
    assert await _place(api, extender, "fa", ["n1"], gpumem=60000, annotations={GPU_POLICY: FRAG}) == ["n1"]
    assert _devices_of(api, app, "fa") == [g1]


async def test_shares_go_onto_a_shared_device_so_whole_ones_stay_whole(api, app, extender):
    devices = registration("n1", gpus=4, numa_nodes=1)
    await _nodes(api, app, n1=devices)
    shared = devices[2]["id"]
    assert await _place(api, extender, "first", ["n1"], gpumem=10000, annotations={USE_UUID: shared}) == ["n1"]
    assert await _place(api, extender, "small", ["n1"], gpumem=1000, annotations={GPU_POLICY: FRAG}) == ["n1"]
    assert _devices_of(api, app, "small") == [shared]
    # Three whole GPUs are left for a pod that needs them.
    assert await _place(api, extender, "trainer", ["n1"], gpus=3, gpumem_percentage=100,
                        annotations={GPU_POLICY: FRAG}) == ["n1"]
    assert shared not in _devices_of(api, app, "trainer")


async def test_spread_breaks_a_whole_device_and_the_multi_device_pod_after_it_fits_nowhere(api, app, extender):
    devices = registration("n1", gpus=4, numa_nodes=1)
    await _nodes(api, app, n1=devices)
    assert await _place(api, extender, "first", ["n1"], gpumem=10000, annotations={USE_UUID: devices[2]["id"]}) \
        == ["n1"]
    assert await _place(api, extender, "small", ["n1"], gpumem=1000, annotations={GPU_POLICY: "spread"}) == ["n1"]
    assert _devices_of(api, app, "small") != [devices[2]["id"]]
    assert await _place(api, extender, "trainer", ["n1"], gpus=3, gpumem_percentage=100) == []


async def test_a_whole_device_is_broken_on_the_node_with_fewest_whole_ones_left(api, app, extender):
    # Whole devices (one task each). Node a: two busy with big tasks, two free. Node b: three busy
    # with small tasks, one free. binpack prefers a (more memory used) and leaves no node with two
    # free devices; fragmentation-aware breaks b's last free device and keeps a's pair.
    a = registration("a", gpus=4, split=1, numa_nodes=1)
    b = registration("b", gpus=4, split=1, numa_nodes=1)
    await _nodes(api, app, a=a, b=b)
    for i in (0, 1):
        assert await _place(api, extender, f"a-big-{i}", ["a"], gpumem=140000, annotations={USE_UUID: a[i]["id"]})
    for i in (0, 1, 2):
        assert await _place(api, extender, f"b-small-{i}", ["b"], gpumem=1000, annotations={USE_UUID: b[i]["id"]})
    both = ["a", "b"]
    assert await _place(api, extender, "bp", both, gpumem=1000, annotations={NODE_POLICY: "binpack"}) == ["a"]
    api.delete("pods", "bp", "default")
    await wait_until(lambda: not any(p.name == "bp" for p in app.cache.pods.values()), "bp released")
    assert await _place(api, extender, "fa", both, gpumem=1000, annotations={NODE_POLICY: FRAG}) == ["b"]
    assert await _place(api, extender, "pair", both, gpus=2, gpumem_percentage=100) == ["a"]

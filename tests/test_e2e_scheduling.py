"""End to end: kube-scheduler's view of the extender, against the embedded API server.

Placement per policy, the annotations the device plugin reads, usage kept through the watch (fill,
free, restart), and the bind with its node lock.
"""
from __future__ import annotations

import asyncio

import orjson
import pytest

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import A100_40, H200, gpu_node, gpu_pod, registration
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import assert_books_balance, bind_placed, place, register_nodes, wait_until


def scheduler_requests(app, method: str, resource: str) -> int:
    """How many requests of this kind the scheduler has made (its own API request histogram)."""
    for metric in app.metrics.api_request_seconds.collect():
        for sample in metric.samples:
            if (sample.name.endswith("_count") and sample.labels.get("method") == method
                    and sample.labels.get("resource") == resource):
                return int(sample.value)
    return 0


async def _bind_and_allocate(app, extender, pod, node):
    """Bind, then let the (simulated) device plugin allocate and release the node lock."""
    before = app.device_plugin.allocated
    result = await extender.bind(pod, node)
    if not result["Error"]:
        await wait_until(lambda: app.device_plugin.allocated > before, "device plugin allocation")
    return result


async def test_filter_reserves_and_bind_writes_upstream_annotations(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=2))
    pod, result = await place(api, extender, gpu_pod("p", gpus=1, gpumem=3000, gpucores=30), names)
    assert result == {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None,
                      "FailedAndUnresolvableNodes": None, "Error": ""}
    # The filter reserves and writes nothing: the pod is as kube-scheduler sent it.
    assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    usage = {d["id"]: d for d in app.cache.device_usage("n1")}
    assert sum(d["usedmem"] for d in usage.values()) == 3000
    # The Binding carries the decision onto the pod, with spec.nodeName, in one write.
    stored = await bind_placed(api, app, extender, pod, result)
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "n1"
    assert ann["hami.io/vgpu-node"] == "n1" and ann["hami.io/bind-phase"] in ("allocating", "success")
    # The label HAMi's vGPU monitor selects pods by comes with the Binding (Kubernetes >= 1.35
    # copies a Binding's labels): no pod patch at all.
    assert stored["metadata"]["labels"]["hami.io/vgpu-node"] == "n1"
    assert scheduler_requests(app, "PATCH", "pods") == 0
    assert ann["hami.io/vgpu-time"].isdigit()
    assert ann["hami.io/vgpu-devices-to-allocate"] == ann["hami.io/vgpu-devices-allocated"]
    devices = decode_pod_devices(ann["hami.io/vgpu-devices-to-allocate"])
    assert len(devices) == 1 and len(devices[0]) == 1
    dev = devices[0][0]
    assert (dev.type, dev.usedmem, dev.usedcores) == ("NVIDIA", 3000, 30)
    assert ann["hami.io/vgpu-devices-to-allocate"] == f"{dev.uuid},NVIDIA,3000,30:;"
    usage = {d["id"]: d for d in app.cache.device_usage("n1")}
    assert (usage[dev.uuid]["used"], usage[dev.uuid]["usedmem"], usage[dev.uuid]["usedcores"]) == (1, 3000, 30)
    assert_books_balance(app)


async def test_node_policy_binpack_prefers_busier_node_and_spread_the_idler(api, app, extender):
    names = await register_nodes(api, app, gpu_node("busy", gpus=2), gpu_node("idle", gpus=2))
    first, result = await place(api, extender, gpu_pod("seed", gpumem=10000, gpucores=10), ["busy"])
    assert result["NodeNames"] == ["busy"]
    _, result = await place(api, extender, gpu_pod("bp", gpumem=1000, gpucores=1), names)
    assert result["NodeNames"] == ["busy"]
    _, result = await place(api, extender, gpu_pod("sp", gpumem=1000, gpucores=1,
                                                   annotations={"hami.io/node-scheduler-policy": "spread"}), names)
    assert result["NodeNames"] == ["idle"]


def _gpu_of(api, pod_name: str) -> str:
    """The UUID of the one GPU the (bound) pod was given."""
    annotations = api.get("pods", pod_name, namespace="default")["metadata"]["annotations"]
    return decode_pod_devices(annotations["hami.io/vgpu-devices-allocated"])[0][0].uuid


async def _place_and_bind(api, app, extender, pod: dict, names: list[str]) -> dict:
    created, result = await place(api, extender, pod, names)
    return await bind_placed(api, app, extender, created, result)


async def test_gpu_policy_spread_uses_idle_gpu_and_binpack_shares(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=2, numa_nodes=1))
    await _place_and_bind(api, app, extender, gpu_pod("a", gpumem=1000, gpucores=10), names)
    a = _gpu_of(api, "a")
    await _place_and_bind(api, app, extender, gpu_pod("b", gpumem=3000, gpucores=30), names)  # default: spread
    b = _gpu_of(api, "b")
    assert a != b
    # b's GPU is now the busier one: binpack must share it, spread must take the other.
    await _place_and_bind(api, app, extender, gpu_pod("c", gpumem=1000, gpucores=10,
                                                      annotations={"hami.io/gpu-scheduler-policy": "binpack"}), names)
    assert _gpu_of(api, "c") == b
    await _place_and_bind(api, app, extender, gpu_pod("d", gpumem=1000, gpucores=10,
                                                      annotations={"hami.io/gpu-scheduler-policy": "spread"}), names)
    assert _gpu_of(api, "d") == a
    assert_books_balance(app)


async def test_fill_a_gpu_then_delete_frees_it_through_the_watch(api, app, extender):
    devices = registration("solo", gpus=1, split=10)
    names = await register_nodes(api, app, gpu_node("solo", devices=devices))
    total = devices[0]["devmem"]
    share = total // 4
    for i in range(4):
        _, result = await place(api, extender, gpu_pod(f"p{i}", gpumem=share, gpucores=20), names)
        assert result["NodeNames"] == ["solo"], result
    _, result = await place(api, extender, gpu_pod("p4", gpumem=share, gpucores=20), names)
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"solo": "1/1 CardInsufficientMemory"}
    assert_books_balance(app)
    api.delete("pods", "p0", namespace="default")
    await wait_until(lambda: app.cache.device_usage("solo")[0]["usedmem"] == 3 * share, "delete freed")
    _, result = await place(api, extender, gpu_pod("p5", gpumem=share, gpucores=20), names)
    assert result["NodeNames"] == ["solo"]
    assert_books_balance(app)


async def test_terminated_pod_releases_its_share(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    await place(api, extender, gpu_pod("done", gpumem=5000, gpucores=5), names)
    await wait_until(lambda: app.cache.device_usage("n1")[0]["usedmem"] == 5000, "reserved")
    api.patch("pods", "done", {"status": {"phase": "Succeeded"}}, namespace="default")
    await wait_until(lambda: app.cache.device_usage("n1")[0]["usedmem"] == 0, "terminated pod released")


async def test_restart_rebuilds_usage_from_annotations_without_double_counting(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=2))
    for i in range(3):
        pod, result = await place(api, extender, gpu_pod(f"p{i}", gpumem=7000, gpucores=15), names)
        assert (await _bind_and_allocate(app, extender, pod, result["NodeNames"][0]))["Error"] == ""
    before = app.cache.device_usage("n1")
    # A second scheduler process starting from scratch must see exactly the same books.
    async with running_scheduler(api, device_plugin=False) as second:
        await wait_until(lambda: "n1" in second.cache.nodes, "node registered in the restarted scheduler")
        assert second.cache.device_usage("n1") == before
        assert_books_balance(second)
    assert sum(d["usedmem"] for d in before) == 21000


async def test_unknown_and_unregistered_nodes_fail_with_upstream_reason(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    api.create("nodes", {"metadata": {"name": "cpu-only"}})
    await wait_until(lambda: "cpu-only" in app.cache.nodes, "cpu node seen")
    _, result = await place(api, extender, gpu_pod("p", gpumem=200000), names + ["cpu-only", "ghost"])
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory", "cpu-only": "node unregistered",
                                     "ghost": "node unregistered"}
    assert result["Error"] == ""


async def test_more_gpus_than_the_node_has_is_node_insufficient_device(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=2))
    _, result = await place(api, extender, gpu_pod("p", gpus=3), names)
    assert result["FailedNodes"] == {"n1": "NodeInsufficientDevice"}


async def test_gpu_type_selection_and_reason_strings(api, app, extender):
    names = await register_nodes(api, app, gpu_node("h", gpus=2, model=H200), gpu_node("a", gpus=2, model=A100_40))
    _, result = await place(api, extender, gpu_pod("want-a100", annotations={"nvidia.com/use-gputype": "A100"}),
                            names)
    assert result["NodeNames"] == ["a"]
    _, result = await place(api, extender, gpu_pod("no-such", annotations={"nvidia.com/use-gputype": "B200"}),
                            names)
    assert result["FailedNodes"] == {"h": "2/2 CardTypeMismatch", "a": "2/2 CardTypeMismatch"}


async def test_pod_without_device_request_passes_through_untouched(api, app, extender):
    await register_nodes(api, app, gpu_node("n1", gpus=1))
    pod = api.create("pods", {"metadata": {"name": "cpu", "namespace": "default"},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    _, body = await extender.post("filter", {"Pod": pod, "NodeNames": ["n1", "x"], "Nodes": None})
    assert body["NodeNames"] == ["n1", "x"] and body["Error"] == "" and body["FailedNodes"] is None
    assert "hami.io/vgpu-node" not in (api.get("pods", "cpu", namespace="default")["metadata"].get("annotations") or {})


async def test_bind_takes_the_node_lock_sets_bind_phase_and_binds(api):
    # No simulated device plugin here: the lock must stay until the plugin would release it.
    async with running_scheduler(api, device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, gpu_node("n1", gpus=1))
            pod, result = await place(api, extender, gpu_pod("p", gpumem=1000), names)
            assert await extender.bind(pod, "n1") == {"Error": ""}
        finally:
            await extender.close()
    stored = api.get("pods", "p", namespace="default")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"]["hami.io/bind-phase"] == "allocating"
    assert stored["metadata"]["annotations"]["hami.io/bind-time"].isdigit()
    lock = api.get("nodes", "n1")["metadata"]["annotations"][LOCK_ANNOTATION]
    stamp, ns, name = lock.split(",")
    assert (ns, name) == ("default", "p") and stamp.endswith("Z")


@pytest.mark.parametrize("scheduler_options", [embedded_options(node_lock_wait_s=0.3)])
async def test_bind_on_a_node_locked_by_another_live_pod_fails_and_rolls_back(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    api.create("pods", gpu_pod("holder"))
    from hami_py.k8s.nodelock import lock_value
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: lock_value("default", "holder")}}})
    pod, result = await place(api, extender, gpu_pod("p", gpumem=1000), names)
    assert app.cache.device_usage("n1")[0]["usedmem"] == 1000
    bound = await extender.bind(pod, "n1")   # waits --node-lock-wait for the holder's allocation
    assert bound["Error"] == "timed out after 300ms waiting for node n1 to be unlocked: node lock contention"
    assert app.cache.device_usage("n1")[0]["usedmem"] == 0
    assert "p" not in [p.name for p in app.cache.pods.values()]
    assert api.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    lock = api.get("nodes", "n1")["metadata"]["annotations"][LOCK_ANNOTATION]
    assert lock.endswith(",default,holder")  # somebody else's lock is never released by us


async def test_expired_or_orphaned_lock_is_taken_over(api, app, extender):
    await register_nodes(api, app, gpu_node("n1", gpus=1), gpu_node("n2", gpus=1))
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: "2020-01-01T00:00:00Z,default,old"}}})
    from hami_py.k8s.nodelock import lock_value
    api.patch("nodes", "n2", {"metadata": {"annotations": {LOCK_ANNOTATION: lock_value("default", "gone-pod")}}})
    for name, node in (("p1", "n1"), ("p2", "n2")):
        pod, result = await place(api, extender, gpu_pod(name, gpumem=1000), [node])
        assert (await _bind_and_allocate(app, extender, pod, node)) == {"Error": ""}


async def test_concurrent_filters_never_oversubscribe(api, app, extender):
    devices = registration("n1", gpus=2, split=10)
    names = await register_nodes(api, app, gpu_node("n1", devices=devices))
    per_gpu = 4
    share = devices[0]["devmem"] // per_gpu
    pods = [api.create("pods", gpu_pod(f"p{i}", gpumem=share, gpucores=5)) for i in range(20)]
    results = await asyncio.gather(*(extender.filter(p, names) for p in pods))
    placed = [r for r in results if r["NodeNames"]]
    assert len(placed) == 2 * per_gpu
    assert all(r["FailedNodes"] == {"n1": "2/2 CardInsufficientMemory"} for r in results if not r["NodeNames"])
    assert_books_balance(app)
    # Bound (the simulated device plugin frees the node lock after each), the placed pods carry
    # their decisions.
    for p, r in zip(pods, results):
        if r["NodeNames"]:
            await bind_placed(api, app, extender, p, r)
    # And the annotations agree with the books: every placed pod's allocation is distinct capacity.
    allocated = [api.get("pods", p["metadata"]["name"], namespace="default")["metadata"].get("annotations", {})
                 .get("hami.io/vgpu-devices-allocated") for p in pods]
    per_device: dict[str, int] = {}
    for text in filter(None, allocated):
        for dev in decode_pod_devices(text)[0]:
            per_device[dev.uuid] = per_device.get(dev.uuid, 0) + dev.usedmem
    assert all(v <= devices[0]["devmem"] for v in per_device.values())
    assert sum(per_device.values()) == 2 * per_gpu * share


async def test_refilter_of_the_same_pod_does_not_double_charge(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    pod = api.create("pods", gpu_pod("p", gpumem=1000, gpucores=10))
    for _ in range(3):
        result = await extender.filter(pod, names)
        assert result["NodeNames"] == ["n1"]
    assert app.cache.device_usage("n1")[0]["usedmem"] == 1000
    await bind_placed(api, app, extender, pod, result)
    await wait_until(lambda: app.cache.pods[pod["metadata"]["uid"]].resource_version is not None, "Binding seen")
    assert app.cache.device_usage("n1")[0]["usedmem"] == 1000
    assert_books_balance(app)


async def test_init_container_devices_are_reused_by_the_app(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1, numa_nodes=1))
    pod = gpu_pod("p", gpus=1, gpumem=2000, gpucores=10, init_gpus=1)
    pod["spec"]["initContainers"][0]["resources"]["limits"].update({"nvidia.com/gpumem": "5000",
                                                                     "nvidia.com/gpucores": "20"})
    created, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"]
    ann = (await bind_placed(api, app, extender, created, result))["metadata"]["annotations"]
    slots = decode_pod_devices(ann["hami.io/vgpu-devices-allocated"])
    assert [len(s) for s in slots] == [1, 1]  # init slot first, then the app container
    usage = app.cache.device_usage("n1")[0]
    assert (usage["used"], usage["usedmem"], usage["usedcores"]) == (1, 5000, 20)  # max(init, app)
    api.patch("pods", "p", {"status": {"initContainerStatuses": [
        {"name": "prepare", "state": {"terminated": {"exitCode": 0}}}]}}, namespace="default")
    await wait_until(lambda: app.cache.device_usage("n1")[0]["usedmem"] == 2000, "init usage released")


async def test_node_registration_garbled_on_one_node_does_not_stop_others(api, app, extender):
    good = gpu_node("good", gpus=1)
    bad = gpu_node("bad", gpus=1, annotations={"hami.io/node-nvidia-register": "[{not json"})
    api.create("nodes", bad)
    names = await register_nodes(api, app, good)
    await wait_until(lambda: "bad" in app.cache.nodes, "bad node seen")
    assert app.cache.nodes["bad"].decode_error
    _, result = await place(api, extender, gpu_pod("p", gpumem=1000), ["bad", *names])
    assert result["NodeNames"] == ["good"]
    assert result["Error"] == ""


async def test_multi_mib_node_object_arrives_through_the_watch(api, app, extender):
    node = gpu_node("big", gpus=1)
    node["metadata"]["annotations"]["example.com/huge"] = "x" * (3 << 20)
    api.create("nodes", node)
    await wait_until(lambda: "big" in app.cache.nodes, "3 MiB node delivered")
    _, result = await place(api, extender, gpu_pod("p", gpumem=1000), ["big"])
    assert result["NodeNames"] == ["big"]


async def test_registration_change_recounts_the_node(api, app, extender):
    devices = registration("n1", gpus=2)
    names = await register_nodes(api, app, gpu_node("n1", devices=devices))
    await _place_and_bind(api, app, extender, gpu_pod("p", gpumem=1000, gpucores=10), names)
    uuid = _gpu_of(api, "p")
    devices.append({**devices[0], "id": "GPU-new", "index": 2})
    api.patch("nodes", "n1", {"metadata": {"annotations": {"hami.io/node-nvidia-register": orjson.dumps(devices).decode()}}})
    await wait_until(lambda: len(app.cache.device_usage("n1")) == 3, "new device registered")
    usage = {d["id"]: d for d in app.cache.device_usage("n1")}
    assert usage[uuid]["usedmem"] == 1000
    assert_books_balance(app)


async def test_an_api_server_that_drops_a_bindings_labels_gets_the_label_patched_after_the_bind():
    """Before Kubernetes 1.35 the API server copies only a Binding's annotations: the pod's watch
    event shows the bound pod without the vgpu-node label, and the scheduler patches it then."""
    from hami_py.fakeapi.server import FakeApiServer
    server = FakeApiServer(binding_labels=False)
    await server.start()
    try:
        async with running_scheduler(server) as app:
            extender = ExtenderClient(app.url)
            try:
                names = await register_nodes(server, app, gpu_node("n1", gpus=2))
                pod, result = await place(server, extender, gpu_pod("p", gpumem=3000), names)
                stored = await bind_placed(server, app, extender, pod, result)
                assert "hami.io/vgpu-node" not in (stored["metadata"].get("labels") or {})
                await wait_until(lambda: (server.get("pods", "p", namespace="default")["metadata"].get("labels")
                                          or {}).get("hami.io/vgpu-node") == "n1", "the vgpu-node label patched")
                assert scheduler_requests(app, "PATCH", "pods") == 1
            finally:
                await extender.close()
    finally:
        await server.stop()

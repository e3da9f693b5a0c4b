"""/metrics on ``--metrics-bind-address``: upstream's allocation gauges and our request histograms.

Dashboards built for upstream HAMi select on these exact names and labels, so a renamed label
is a broken dashboard. The values follow the usage cache: a bind shows up, a delete disappears.
"""
from __future__ import annotations

import math

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from hami_py.allocation_metrics import AllocationMetrics, QuotaSample
from hami_py.cache.usage import PodUsage, UsageCache, UsageEntry
from hami_py.config import DeviceConfig
from hami_py.devices.nvidia import NvidiaVendor, nvidia_config
from hami_py.devices.registry import build_vendors
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import H200, gpu_node, gpu_pod, gpu_uuid, registration
from tests.conftest import assert_books_balance, wait_until
from tests.test_mig import H200_MIG_PROFILES, _mig_node

MIB = 1048576


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value}; the parser also proves the text is well-formed."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out


def series(samples, name: str) -> dict[frozenset, float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def labels(**kw) -> frozenset:
    return frozenset(kw.items())


async def scrape(app) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{app.metrics_url}/metrics") as response:
            assert response.status == 200
            return parse(await response.text())


async def _placed_pod(api, app, extender):
    """n1 with two H200s; pod p holds 3000 MiB and 30 % of one of them, bound and allocated."""
    api.create("nodes", gpu_node("n1", gpus=2))
    await wait_until(lambda: "n1" in app.cache.nodes, "node registered")
    pod = api.create("pods", gpu_pod("p", namespace="team-a", gpumem=3000, gpucores=30))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert (await extender.bind(pod, "n1"))["Error"] == ""
    used = next(d for d in app.cache.device_usage("n1") if d["used"])
    return pod, used["id"], used["index"]


async def test_device_and_pod_gauges_with_upstream_names_labels_and_units(api, app, extender):
    _, uuid, index = await _placed_pod(api, app, extender)
    other = next(d for d in app.cache.device_usage("n1") if d["id"] != uuid)
    samples = await scrape(app)
    dev = dict(node="n1", device_uuid=uuid, device_index=str(index), device_type=H200["type"], zone="vGPU")
    idle = dict(dev, device_uuid=other["id"], device_index=str(other["index"]))
    total = H200["devmem"]
    assert series(samples, "hami_gpu_memory_limit_bytes") == {
        labels(**dev): total * MIB, labels(**idle): total * MIB}
    assert series(samples, "hami_gpu_core_limit_ratio") == {labels(**dev): 100, labels(**idle): 100}
    assert series(samples, "hami_gpu_memory_allocated_bytes") == {
        labels(**dev, device_cores="100"): 3000 * MIB, labels(**idle, device_cores="100"): 0}
    assert series(samples, "hami_gpu_shared_count") == {labels(**dev): 1, labels(**idle): 0}
    assert series(samples, "hami_gpu_core_allocated_ratio") == {labels(**dev): 30, labels(**idle): 0}
    assert series(samples, "hami_node_gpu_overview") == {
        labels(**dev, device_cores="100", device_memory_limit=str(total)): 3000 * MIB,
        labels(**idle, device_cores="100", device_memory_limit=str(total)): 0}
    assert series(samples, "hami_node_gpu_memory_allocated_ratio") == {
        labels(**dev): 3000 / total, labels(**idle): 0}
    pod = dict(namespace="team-a", node="n1", pod="p", container_index="0", device_uuid=uuid, zone="vGPU")
    assert series(samples, "hami_vgpu_memory_allocated_bytes") == {labels(**pod): 3000 * MIB}
    assert series(samples, "hami_vgpu_core_allocated_ratio") == {labels(**pod): 30}
    (build,) = series(samples, "hami_build_info")
    assert set(dict(build)) == {"version", "revision", "build_date", "go_version", "compiler", "platform"}
    assert not any(name.startswith(("GPUDevice", "vGPU", "nodeGPU")) for name, _ in samples)


async def test_request_histograms_for_filter_and_bind(api, app, extender):
    await _placed_pod(api, app, extender)
    samples = await scrape(app)
    for verb in ("filter", "bind"):
        assert samples[("hami_extender_request_duration_seconds_count", labels(verb=verb))] == 1
        assert samples[("hami_extender_request_duration_seconds_bucket", labels(verb=verb, le="+Inf"))] == 1
        assert samples[("hami_extender_request_duration_seconds_sum", labels(verb=verb))] > 0


async def test_api_call_histogram_splits_filter_and_bind_into_their_api_calls(api, app, extender):
    """How long the scheduler waits on the API server, per call kind. /filter makes no call; the
    bind of a pod it filtered makes two, the node lock and the Binding (no read of the pod; the
    vgpu-node label comes with the Binding). Failed calls count too."""
    await _placed_pod(api, app, extender)
    assert (api.get("pods", "p", namespace="team-a")["metadata"].get("labels") or {}).get("hami.io/vgpu-node") == "n1"
    name = "hami_kube_api_request_duration_seconds_count"
    count = series(await scrape(app), name)
    assert labels(method="PATCH", resource="pods") not in count      # no pod patch at all
    assert count[labels(method="POST", resource="pods/binding")] == 1
    assert count[labels(method="PATCH", resource="nodes")] >= 1       # the node lock
    broken = api.create("pods", gpu_pod("broken", gpumem=1000))
    assert (await extender.filter(broken, ["n1"]))["NodeNames"] == ["n1"]
    writes = {k: v for k, v in series(await scrape(app), name).items() if dict(k)["resource"] != "events"}
    assert writes == {k: v for k, v in count.items() if dict(k)["resource"] != "events"}   # the filter: none
    api.faults.add(method="POST", path=r"/pods/broken/binding$", status=403)   # refused: nothing to read back
    assert (await extender.bind(broken, "n1"))["Error"]
    after = series(await scrape(app), name)
    assert after[labels(method="POST", resource="pods/binding")] == 2          # the failed one counts
    assert labels(method="PATCH", resource="pods") not in after                # nor a label patch
    assert not [r for r in api.requests if r[0] == "GET" and r[1].endswith("/pods/broken")]   # never read


def test_api_resource_names_the_resource_and_subresource():
    from hami_py.k8s.client import api_resource
    assert api_resource("/api/v1/namespaces/ns/pods/p") == "pods"
    assert api_resource("/api/v1/namespaces/ns/pods/p/binding") == "pods/binding"
    assert api_resource("/api/v1/nodes/n1") == "nodes"
    assert api_resource("/api/v1/namespaces/ns/events") == "events"
    assert api_resource("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/hami") == "leases"
    assert api_resource("/api/v1/pods?watch=1") == "pods"


async def test_gauges_follow_the_cache_when_the_pod_goes_away(api, app, extender):
    _, uuid, index = await _placed_pod(api, app, extender)
    assert series(await scrape(app), "hami_vgpu_memory_allocated_bytes")   # rendered (and cached) once
    api.delete("pods", "p", namespace="team-a")
    await wait_until(lambda: not app.cache.pods, "pod released")
    samples = await scrape(app)
    assert series(samples, "hami_vgpu_memory_allocated_bytes") == {}
    dev = labels(node="n1", device_uuid=uuid, device_index=str(index), device_type=H200["type"], zone="vGPU")
    assert series(samples, "hami_gpu_shared_count")[dev] == 0
    assert series(samples, "hami_gpu_core_allocated_ratio")[dev] == 0
    api.delete("nodes", "n1")
    await wait_until(lambda: "n1" not in app.cache.nodes, "node removed")
    assert series(await scrape(app), "hami_gpu_memory_limit_bytes") == {}


async def test_quota_gauges_follow_resource_quotas_and_usage(api, app, extender):
    api.create("resourcequotas", {"metadata": {"name": "gpu", "namespace": "team-a"},
                                  "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}})
    await wait_until(lambda: app.cache.quota.limits.get("team-a"), "quota seen")
    await _placed_pod(api, app, extender)
    samples = await scrape(app)
    assert series(samples, "hami_resource_quota_used") == {
        labels(namespace="team-a", quota_name="nvidia.com/gpumem", limit="10000", zone="vGPU"): 3000,
        # used but not limited: reported as upstream does, with limit 0 and no limit gauge
        labels(namespace="team-a", quota_name="nvidia.com/gpucores", limit="0", zone="vGPU"): 30}
    assert series(samples, "hami_resource_quota_limit") == {
        labels(namespace="team-a", quota_name="nvidia.com/gpumem", zone="vGPU"): 10000}


async def test_legacy_metrics_flag_adds_the_old_names(api):
    async with running_scheduler(api, options=embedded_options(legacy_metrics=True)) as app:
        extender = ExtenderClient(app.url)
        try:
            _, uuid, index = await _placed_pod(api, app, extender)
        finally:
            await extender.close()
        samples = await scrape(app)
    total = H200["devmem"]
    old = dict(nodeid="n1", deviceuuid=uuid, deviceidx=str(index), zone="vGPU")
    typed = dict(old, devicetype=H200["type"])
    assert series(samples, "GPUDeviceMemoryLimit")[labels(**typed)] == total * MIB
    assert series(samples, "GPUDeviceCoreLimit")[labels(**typed)] == 100
    assert series(samples, "GPUDeviceMemoryAllocated")[labels(**typed, devicecores="100")] == 3000 * MIB
    assert series(samples, "GPUDeviceSharedNum")[labels(**typed)] == 1
    assert series(samples, "GPUDeviceCoreAllocated")[labels(**typed)] == 30
    assert series(samples, "nodeGPUOverview")[
        labels(**typed, devicecores="100", devicememorylimit=str(total))] == 3000 * MIB
    assert series(samples, "nodeGPUMemoryPercentage")[labels(**old)] == 3000 / total
    pod = labels(podnamespace="team-a", nodename="n1", podname="p", containeridx="0", deviceuuid=uuid, zone="vGPU")
    assert series(samples, "vGPUMemoryAllocated") == {pod: 3000 * MIB}
    assert series(samples, "vGPUCoreAllocated") == {pod: 30}
    assert series(samples, "hami_gpu_shared_count")   # the new names stay


async def test_mig_instance_line_appears_once_the_plugin_created_it_and_goes_with_the_pod(api, app, extender):
    api.create("nodes", _mig_node())
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    pod = api.create("pods", gpu_pod("m", namespace="team-a", gpumem=10000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    # Reserved but not created yet (no identity in the annotation): no line, as upstream.
    assert series(await scrape(app), "hami_node_gpu_mig_instance_info") == {}
    assert (await extender.bind(pod, "n1"))["Error"] == ""

    def annotation():
        text = api.get("pods", "m", namespace="team-a")["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"]
        return orjson.loads(text)
    await wait_until(lambda: "migUUID" in annotation()[0], "the device plugin wrote the instance identity")
    [inst] = annotation()
    await wait_until(lambda: any(len(i) > 2 for p in app.cache.pods.values() for i in p.mig), "identity cached")
    gpu = gpu_uuid("n1", 0)
    assert series(await scrape(app), "hami_node_gpu_mig_instance_info") == {labels(
        node="n1", device_uuid=gpu, device_index="0", mig_uuid=inst["migUUID"], profile="1g.18gb",
        gpu_instance_id=str(inst["gpuInstanceID"]), compute_instance_id=str(inst["computeInstanceID"]),
        placement_start="6", placement_size="1", zone="vGPU"): 1}
    # Taking in the identity replaced the record without charging the pod twice.
    assert_books_balance(app)
    assert app.cache.mig_used[app.cache.nodes["n1"].offset] == 1 << 6
    api.delete("pods", "m", namespace="team-a")
    await wait_until(lambda: not app.cache.pods, "pod released")
    assert series(await scrape(app), "hami_node_gpu_mig_instance_info") == {}


# -- the renderer on its own: AMD normalisation, label escaping, the quota hook, MIG rules ------
def _cache_with(node: dict) -> UsageCache:
    cache = UsageCache(build_vendors(DeviceConfig.default()))
    cache.upsert_node(node)
    return cache


class _ComputeUnitVendor(NvidiaVendor):
    """A family that counts compute units, not percent (as AMD's does)."""
    def core_metrics(self, total_cores, used_cores):
        return (100, math.ceil(used_cores / total_cores * 100)) if total_cores > 0 else (total_cores, used_cores)


def test_compute_unit_core_counts_are_reported_as_percent_except_in_legacy_names():
    amd = {"type": "AMD-MI300X", "devmem": 196608, "devcore": 304}
    cache = UsageCache({"NVIDIA": _ComputeUnitVendor(nvidia_config(DeviceConfig.default()))})
    cache.upsert_node(gpu_node("a", devices=registration("a", gpus=1, model=amd)))
    uuid = gpu_uuid("a", 0)
    cache.add_pod_usage(PodUsage(uid="u1", namespace="ns", name="p", node="a",
                                 entries=[UsageEntry("NVIDIA", uuid, 1000, 100, 1)]))
    samples = parse(AllocationMetrics(cache, legacy=True).render_now().decode())
    dev = labels(node="a", device_uuid=uuid, device_index="0", device_type="AMD-MI300X", zone="vGPU")
    assert series(samples, "hami_gpu_core_limit_ratio")[dev] == 100
    assert series(samples, "hami_gpu_core_allocated_ratio")[dev] == 33      # ceil(100 / 304 * 100)
    assert list(series(samples, "hami_vgpu_core_allocated_ratio").values()) == [33]
    assert list(series(samples, "GPUDeviceCoreLimit").values()) == [304]
    assert list(series(samples, "GPUDeviceCoreAllocated").values()) == [100]
    assert list(series(samples, "vGPUCoreAllocated").values()) == [100]


def test_label_values_are_escaped():
    odd = {"type": 'NVIDIA "custom"\\model', "devmem": 1000, "devcore": 100}
    cache = _cache_with(gpu_node("a", devices=registration("a", gpus=1, model=odd)))
    samples = parse(AllocationMetrics(cache).render_now().decode())
    ((dev, _),) = series(samples, "hami_gpu_shared_count").items()
    assert dict(dev)["device_type"] == 'NVIDIA "custom"\\model'


def test_quota_gauges_come_from_the_quota_hook():
    cache = _cache_with(gpu_node("a", gpus=1))
    quotas = [QuotaSample("ns", "nvidia.com/gpumem", used=3000, limit=10000, limit_set=True),
              QuotaSample("ns", "nvidia.com/gpucores", used=30, limit=0, limit_set=False)]
    samples = parse(AllocationMetrics(cache, legacy=True, quotas=lambda: quotas).render_now().decode())
    assert series(samples, "hami_resource_quota_used") == {
        labels(namespace="ns", quota_name="nvidia.com/gpumem", limit="10000", zone="vGPU"): 3000,
        labels(namespace="ns", quota_name="nvidia.com/gpucores", limit="0", zone="vGPU"): 30}
    assert series(samples, "hami_resource_quota_limit") == {
        labels(namespace="ns", quota_name="nvidia.com/gpumem", zone="vGPU"): 10000}
    assert len(series(samples, "QuotaUsed")) == 2
    assert series(parse(AllocationMetrics(cache).render_now().decode()), "hami_resource_quota_used") == {}


def _mig_pod(uid: str, node: str, instances: list[dict]) -> dict:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid, "annotations": {
        "hami.io/vgpu-node": node, "hami.io/vgpu-mig-allocations": orjson.dumps(instances).decode()}},
        "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def _instance(gpu: str, device: int, profile: str, start: int, size: int, **identity) -> dict:
    return {"containerIndex": 0, "deviceIndex": device, "gpuUUID": gpu, "profile": profile,
            "placement": {"start": start, "size": size}, **identity}


def test_mig_instance_lines_only_for_created_instances_on_gpus_in_mig_mode():
    devices = registration("a", gpus=2, model=H200, mode="mig")
    for d in devices:
        d["migProfiles"] = H200_MIG_PROFILES
    devices[1]["mode"] = "hami-core"
    cache = _cache_with(gpu_node("a", devices=devices))
    mig_gpu, core_gpu = gpu_uuid("a", 0), gpu_uuid("a", 1)
    created = dict(migUUID="MIG-aaaa", gpuInstanceID=13, computeInstanceID=0)
    cache.on_pod_event("ADDED", _mig_pod("p1", "a", [
        _instance(mig_gpu, 0, "1g.18gb", 6, 1, **created),
        _instance(mig_gpu, 1, "3g.71gb", 0, 4),                                   # not created yet
        _instance(core_gpu, 2, "1g.18gb", 6, 1, migUUID="MIG-bbbb", gpuInstanceID=9, computeInstanceID=0)]))
    # An identity given in part makes the whole annotation untrustworthy, as upstream's decoder says.
    cache.on_pod_event("ADDED", _mig_pod("p2", "a", [
        _instance(mig_gpu, 0, "1g.18gb", 5, 1, migUUID="MIG-cccc", gpuInstanceID=11)]))
    metrics = AllocationMetrics(cache, legacy=True)
    samples = parse(metrics.render_now().decode())
    line = dict(node="a", device_uuid=mig_gpu, device_index="0", zone="vGPU")
    assert series(samples, "hami_node_gpu_mig_instance_info") == {labels(
        **line, mig_uuid="MIG-aaaa", profile="1g.18gb", gpu_instance_id="13", compute_instance_id="0",
        placement_start="6", placement_size="1"): 1}
    assert series(samples, "nodeGPUMigInstance") == {
        labels(nodeid="a", deviceuuid=mig_gpu, deviceidx="0", migname="1g.18gb-13", zone="vGPU"): 1}
    # The plugin creates the second instance: its line joins (the pod's cached lines are redone).
    cache.on_pod_event("MODIFIED", _mig_pod("p1", "a", [
        _instance(mig_gpu, 0, "1g.18gb", 6, 1, **created),
        _instance(mig_gpu, 1, "3g.71gb", 0, 4, migUUID="MIG-dddd", gpuInstanceID=1, computeInstanceID=0)]))
    samples = parse(metrics.render_now().decode())
    assert series(samples, "hami_node_gpu_mig_instance_info")[labels(
        **line, mig_uuid="MIG-dddd", profile="3g.71gb", gpu_instance_id="1", compute_instance_id="0",
        placement_start="0", placement_size="4")] == 1
    assert len(series(samples, "hami_node_gpu_mig_instance_info")) == len(series(samples, "nodeGPUMigInstance")) == 2
    assert series(parse(AllocationMetrics(cache).render_now().decode()), "nodeGPUMigInstance") == {}
    # The GPU re-registered out of mig mode: no instance lines on it any more.
    devices[0]["mode"] = "hami-core"
    cache.upsert_node(gpu_node("a", devices=devices))
    assert series(parse(metrics.render_now().decode()), "hami_node_gpu_mig_instance_info") == {}


async def test_leader_and_cache_synced_gauges(api):
    """HAMi #2758: 0/1 gauges. Without --leader-elect the replica leads; a follower shows 0, and
    a cache whose pod list fails shows 0 until it is in."""
    api.create("nodes", gpu_node("n1", gpus=1))
    api.faults.add(method="GET", path="^/api/v1/pods$", status=500, times=None)   # no sync yet
    async with running_scheduler(api, wait_ready=False, device_plugin=False) as app:
        gauges = await scrape(app)
        assert series(gauges, "hami_scheduler_cache_synced") == {labels(): 0.0}
        assert series(gauges, "hami_scheduler_is_leader") == {labels(): 1.0}
        api.faults.clear()
        await wait_until(lambda: app.ready, "sync", timeout=30)
        await wait_until(lambda: all(i.synced.is_set() for i in app.informers), "every informer synced")
        assert series(await scrape(app), "hami_scheduler_cache_synced") == {labels(): 1.0}
    namespace, lease = "hami-system", "hami-scheduler"
    api.create("leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": lease, "namespace": namespace},
                          "spec": {"holderIdentity": "someone-else_1", "leaseDurationSeconds": 3600,
                                   "renewTime": "2026-01-01T00:00:00.000000Z"}})
    options = embedded_options(leader_elect=True, leader_elect_resource_name=lease,
                               leader_elect_resource_namespace=namespace, hostname="b")
    async with running_scheduler(api, options=options, device_plugin=False) as follower:
        await wait_until(lambda: follower.leadership.synced.is_set() and all(i.synced.is_set() for i in follower.informers),
                         "the Lease read and every informer synced")
        gauges = await scrape(follower)
        assert series(gauges, "hami_scheduler_is_leader") == {labels(): 0.0}
        assert series(gauges, "hami_scheduler_cache_synced") == {labels(): 1.0}
        api.update("leases", {**api.get("leases", lease, namespace=namespace),
                              "spec": {**api.get("leases", lease, namespace=namespace)["spec"],
                                       "holderIdentity": "b_2"}})
        await wait_until(lambda: follower.service.synced.is_set(), "b to lead")
        assert series(await scrape(follower), "hami_scheduler_is_leader") == {labels(): 1.0}


def test_remote_gpus_are_reported_per_server_and_not_per_node():
    """Upstream's hami_remote_gpu_* (#3004): one series per card a lupine server serves, labelled
    by the server and its endpoint; the cards are left out of the per-node gauges. A card given
    to a pod (whole) is allocated 1 with its memory in the overview."""
    from tests.test_family_remotegpu import ALLOCATED, card, client_node, device_config, remote_pod, server_node
    cache = UsageCache(build_vendors(device_config()))
    cache.upsert_node(server_node("gpu-a", "10.0.0.5", [card("GPU-A0", index=0), card("GPU-A1", 81920, index=1)]))
    cache.upsert_node(client_node("cpu-1"))
    cache.upsert_node(gpu_node("local", gpus=1))
    samples = parse(AllocationMetrics(cache, legacy=True).render_now().decode())

    def card_labels(uuid: str, index: int) -> frozenset:
        return labels(server="gpu-a", endpoint="10.0.0.5:14833", device_uuid=f"gpu-a/{uuid}",
                      device_index=str(index), device_type="RemoteGPU", zone="vGPU")

    a0, a1 = card_labels("GPU-A0", 0), card_labels("GPU-A1", 1)
    assert series(samples, "hami_remote_gpu_memory_limit_bytes") == {a0: 40960 * MIB, a1: 81920 * MIB}
    assert series(samples, "hami_remote_gpu_allocated") == {a0: 0, a1: 0}
    assert series(samples, "hami_remote_gpu_overview") == {a0: 0, a1: 0}
    # the per-node gauges list the local GPU only, legacy names too
    for name in ("hami_gpu_memory_limit_bytes", "hami_node_gpu_overview", "GPUDeviceMemoryLimit"):
        assert {dict(k).get("node", dict(k).get("nodeid")) for k in series(samples, name)} == {"local"}, name

    text = "gpu-a/GPU-A0,RemoteGPU,40960,100:gpu-a/GPU-A1,RemoteGPU,81920,100:;"
    pod = remote_pod("p", {"name": "main"})
    pod["metadata"].update(uid="uid-p", resourceVersion="5", annotations={"hami.io/vgpu-node": "cpu-1", ALLOCATED: text})
    pod["spec"]["nodeName"] = "cpu-1"
    cache.on_pod_event("ADDED", pod)
    samples = parse(AllocationMetrics(cache).render_now().decode())
    assert series(samples, "hami_remote_gpu_allocated") == {a0: 1, a1: 1}
    assert series(samples, "hami_remote_gpu_overview") == {a0: 40960 * MIB, a1: 81920 * MIB}
    # off (the chart's default): no remote series at all
    off = _cache_with(server_node("gpu-a", "10.0.0.5", [card("GPU-A0")]))
    assert not [k for k in parse(AllocationMetrics(off).render_now().decode()) if k[0].startswith("hami_remote_gpu")]


def test_remote_gpu_series_follow_the_cache_between_scrapes():
    """Lines are cached per node until its usage changes: a card given and released shows."""
    from tests.test_family_remotegpu import ALLOCATED, card, device_config, remote_pod, server_node
    cache = UsageCache(build_vendors(device_config()))
    cache.upsert_node(server_node("gpu-b", "10.0.0.6", [card("GPU-B0")]))
    metrics = AllocationMetrics(cache)
    assert list(series(parse(metrics.render_now().decode()), "hami_remote_gpu_allocated").values()) == [0]
    pod = remote_pod("p", {"name": "main"})
    pod["metadata"].update(uid="uid-p", resourceVersion="5",
                           annotations={"hami.io/vgpu-node": "cpu-1", ALLOCATED: "gpu-b/GPU-B0,RemoteGPU,40960,100:;"})
    pod["spec"]["nodeName"] = "cpu-1"
    cache.on_pod_event("ADDED", pod)
    assert list(series(parse(metrics.render_now().decode()), "hami_remote_gpu_allocated").values()) == [1]
    cache.on_pod_event("DELETED", pod)
    assert list(series(parse(metrics.render_now().decode()), "hami_remote_gpu_allocated").values()) == [0]

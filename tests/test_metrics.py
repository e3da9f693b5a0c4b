"""/metrics on ``--metrics-bind-address``: upstream's allocation gauges and our request histograms.

Dashboards built for upstream HAMi select on these exact names and labels, so a renamed label
is a broken dashboard. The values follow the usage cache: a bind shows up, a delete disappears.
"""
from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from hami_py.allocation_metrics import AllocationMetrics, QuotaSample
from hami_py.cache.usage import PodUsage, UsageCache, UsageEntry
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import H200, gpu_node, gpu_pod, gpu_uuid, registration
from tests.conftest import wait_until

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


# -- the renderer on its own: AMD normalisation, label escaping, the quota hook ----------------
def _cache_with(node: dict) -> UsageCache:
    cache = UsageCache(build_vendors(DeviceConfig.default()))
    cache.upsert_node(node)
    return cache


def test_amd_core_counts_are_reported_as_percent_except_in_legacy_names():
    amd = {"type": "AMD-MI300X", "devmem": 196608, "devcore": 304}
    cache = _cache_with(gpu_node("a", devices=registration("a", gpus=1, model=amd)))
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

"""Feature-inventory rows of namespace ResourceQuotas on device memory and cores, enforced by the
NVIDIA fit. Each test names its inventory row (docs/FEATURES.md) in a docstring line."""
from __future__ import annotations


from hami_py.config import DeviceConfig
from hami_py.embedded import running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod
from tests.conftest import create_quota, place, register_nodes
from tests.test_inventory_filter import reference_node


async def _with_quota(api, app, **hard) -> None:
    await register_nodes(api, app, reference_node())
    await create_quota(api, app, hard, namespace="team")


async def test_a_zero_limit_blocks_every_request_of_that_resource(api, app, extender):
    """Inventory: quota-explicit-zero"""
    await _with_quota(api, app, **{"limits.nvidia.com/gpucores": "0"})
    _, result = await place(api, extender, gpu_pod("cores", namespace="team", gpumem=1000, gpucores=1), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
    _, result = await place(api, extender, gpu_pod("no-cores", namespace="team", gpumem=1000), ["n1"])
    assert result["NodeNames"] == ["n1"], result


async def test_whole_card_memory_is_charged_against_the_quota_at_fit(api, app, extender):
    """Inventory: quota-percentage-at-fit

    A count-only pod asks for no memory at admission; at fit it takes the whole 8192 MiB card,
    which a 4000 MiB quota does not allow (a percentage resolves the same way)."""
    await _with_quota(api, app, **{"limits.nvidia.com/gpumem": "4000"})
    _, result = await place(api, extender, gpu_pod("whole", namespace="team"), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
    _, result = await place(api, extender, gpu_pod("most", namespace="team", gpumem_percentage=60), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
    _, result = await place(api, extender, gpu_pod("some", namespace="team", gpumem_percentage=40), ["n1"])
    assert result["NodeNames"] == ["n1"], result


async def test_memory_limit_is_in_units_of_the_memory_factor(api):
    """Inventory: quota-factor (shown with NVIDIA's memoryFactor; upstream's example is Cambricon)

    With ``memoryFactor: 1024`` a pod's ``nvidia.com/gpumem: 4`` is 4096 MiB, and a quota of
    ``limits.nvidia.com/gpumem: 4`` allows 4096 MiB."""
    config = DeviceConfig.default()
    config.sections["nvidia"]["memoryFactor"] = 1024
    async with running_scheduler(api, device_config=config) as app:
        extender = ExtenderClient(app.url)
        try:
            await _with_quota(api, app, **{"limits.nvidia.com/gpumem": "4"})
            _, result = await place(api, extender, gpu_pod("four", namespace="team", gpumem=4), ["n1"])
            assert result["NodeNames"] == ["n1"], result
            assert app.cache.device_usage("n1")[0]["usedmem"] == 4096
            _, result = await place(api, extender, gpu_pod("one-more", namespace="team", gpumem=1), ["n1"])
            assert result["FailedNodes"] == {"n1": "1/1 ResourceQuotaNotFit"}
        finally:
            await extender.close()

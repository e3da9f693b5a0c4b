"""Namespace ResourceQuota on device memory and cores (upstream's ``limits.nvidia.com/gpumem`` and
``limits.nvidia.com/gpucores``), tracked from the quota watch and from pod usage, enforced at filter."""
from __future__ import annotations

from hami_py.cache.quota import scoped
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import create_quota, register_nodes, wait_until, watch_applied


async def _setup(api, app, hard: dict, name: str = "gpu"):
    await register_nodes(api, app, gpu_node("n1", gpus=2))
    await create_quota(api, app, hard, namespace="team", name=name)


async def test_memory_quota_blocks_the_pod_that_would_exceed_it(api, app, extender):
    await _setup(api, app, {"limits.nvidia.com/gpumem": "10000"})
    a = api.create("pods", gpu_pod("a", namespace="team", gpumem=6000))
    assert (await extender.filter(a, ["n1"]))["NodeNames"] == ["n1"]
    b = api.create("pods", gpu_pod("b", namespace="team", gpumem=6000))
    result = await extender.filter(b, ["n1"])
    assert result["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    # Another namespace is not limited.
    c = api.create("pods", gpu_pod("c", namespace="other", gpumem=6000))
    assert (await extender.filter(c, ["n1"]))["NodeNames"] == ["n1"]
    # Freeing usage in the namespace makes room again.
    api.delete("pods", "a", namespace="team")
    await wait_until(lambda: app.cache.quota.used["team"].get(("NVIDIA", "mem")) == 0, "usage released")
    assert (await extender.filter(b, ["n1"]))["NodeNames"] == ["n1"]


async def test_core_quota_and_quota_updates_apply_at_once(api, app, extender):
    await _setup(api, app, {"limits.nvidia.com/gpucores": "50"})
    p = api.create("pods", gpu_pod("p", namespace="team", gpumem=100, gpucores=60))
    assert (await extender.filter(p, ["n1"]))["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    api.patch("resourcequotas", "gpu", {"spec": {"hard": {"limits.nvidia.com/gpucores": "100"}}}, namespace="team")
    await wait_until(lambda: app.cache.quota.limits["team"][("NVIDIA", "cores")] == 100, "quota update")
    assert (await extender.filter(p, ["n1"]))["NodeNames"] == ["n1"]
    api.delete("resourcequotas", "gpu", namespace="team")
    await wait_until(lambda: "team" not in app.cache.quota.limits, "quota deleted")


async def test_multi_gpu_pod_counts_every_device_against_the_quota(api, app, extender):
    await _setup(api, app, {"limits.nvidia.com/gpumem": "7000"})
    p = api.create("pods", gpu_pod("p", namespace="team", gpus=2, gpumem=4000))
    result = await extender.filter(p, ["n1"])
    # The first device fits (4000), the second would make 8000 > 7000.
    assert result["FailedNodes"] == {"n1": "1/2 AllocatedCardsInsufficientRequest, 1/2 ResourceQuotaNotFit"}


async def test_ignored_quota_keys_and_smallest_of_several_quotas(api, app, extender):
    await _setup(api, app, {"limits.nvidia.com/gpumem": "9000", "requests.nvidia.com/gpumem": "1",
                            "nvidia.com/gpu": "1", "limits.nvidia.com/gpumem-percentage": "1"}, name="a")
    assert app.cache.quota.limits["team"] == {("NVIDIA", "mem"): 9000}
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "5000"}, namespace="team", name="b")
    assert app.cache.quota.limits["team"][("NVIDIA", "mem")] == 5000
    p = api.create("pods", gpu_pod("p", namespace="team", gpumem=6000))
    assert (await extender.filter(p, ["n1"]))["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    q = api.create("pods", gpu_pod("q", namespace="team", gpumem=4000))
    assert (await extender.filter(q, ["n1"]))["NodeNames"] == ["n1"]


async def _scoped_quota(api, app, name: str, hard: dict, **scope) -> None:
    created = api.create("resourcequotas", {"apiVersion": "v1", "kind": "ResourceQuota",
                                            "metadata": {"name": name, "namespace": "team"},
                                            "spec": {"hard": hard, **scope}})
    await watch_applied(app, "resourcequotas", created["metadata"]["resourceVersion"])


async def test_several_quotas_take_the_smallest_a_delete_recomputes_and_scoped_ones_are_skipped(api, app, extender):
    """HAMi #3094: per resource the minimum over the namespace's quotas; deleting one raises the
    limit to the next; a quota with ``scopes`` or a ``scopeSelector`` with match expressions
    limits only the pods it selects, so the book skips it. The filter and the webhook read the
    same book."""
    await _setup(api, app, {"limits.nvidia.com/gpumem": "1000"}, name="small")
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "4000"}, namespace="team", name="large")
    await _scoped_quota(api, app, "best-effort", {"limits.nvidia.com/gpumem": "10"}, scopes=["BestEffort"])
    await _scoped_quota(api, app, "by-class", {"limits.nvidia.com/gpumem": "20"}, scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["low"]}]})
    assert app.cache.quota.limits["team"] == {("NVIDIA", "mem"): 1000}
    assert app.fit_quota("team", "NVIDIA", 1000, 0) and not app.fit_quota("team", "NVIDIA", 1001, 0)
    p = api.create("pods", gpu_pod("p", namespace="team", gpumem=3000))
    assert (await extender.filter(p, ["n1"]))["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}
    api.delete("resourcequotas", "small", namespace="team")
    await wait_until(lambda: app.cache.quota.limits["team"] == {("NVIDIA", "mem"): 4000}, "the next smallest")
    assert app.fit_quota("team", "NVIDIA", 4000, 0) and not app.fit_quota("team", "NVIDIA", 4001, 0)
    assert (await extender.filter(p, ["n1"]))["NodeNames"] == ["n1"]
    # A quota that gains a scope stops counting; the last unscoped one gone, no limit is left.
    api.patch("resourcequotas", "large", {"spec": {"scopes": ["NotBestEffort"]}}, namespace="team")
    await wait_until(lambda: "team" not in app.cache.quota.limits, "the scoped quota skipped")
    assert app.fit_quota("team", "NVIDIA", 100_000, 0)


def test_an_empty_scope_selector_limits_every_pod():
    """A ``scopeSelector`` without match expressions selects every pod: the quota counts."""
    assert not scoped({"scopeSelector": {}}) and not scoped({"scopeSelector": {"matchExpressions": []}})
    assert scoped({"scopes": ["Terminating"]})


async def test_an_explicit_zero_blocks_at_the_filter_and_at_admission(api, app, extender):
    """An explicit 0 is a limit, not "no quota": nothing of that resource fits."""
    await _setup(api, app, {"limits.nvidia.com/gpumem": "0"})
    assert app.cache.quota.limits["team"] == {("NVIDIA", "mem"): 0}
    assert not app.fit_quota("team", "NVIDIA", 1, 0)
    p = api.create("pods", gpu_pod("p", namespace="team", gpumem=1))
    assert (await extender.filter(p, ["n1"]))["FailedNodes"] == {"n1": "2/2 ResourceQuotaNotFit"}

"""Feature-inventory rows of the admission webhook's quota pre-check, against real ResourceQuota
objects the running scheduler watches (tests/test_webhook.py covers the rules with a stub).

Each test names its inventory row (docs/FEATURES.md) in a docstring line.
"""
from __future__ import annotations

import orjson

from tests.conftest import create_quota, wait_until, watch_applied
from tests.test_webhook import container, envelope, make_pod

NAMESPACE = "team-a"


async def _admit(app, extender, pod: dict) -> dict:
    async with extender.session.post(f"{app.url}/webhook", data=orjson.dumps(envelope(pod)),
                                     headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        return orjson.loads(await r.read())["response"]


def _gpu(name: str, mem: int) -> dict:
    return container(name, limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)})


async def test_admission_denies_a_pod_over_its_namespace_quota(api, app, extender):
    """Inventory: quota-webhook"""
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "1000"}, namespace=NAMESPACE)
    response = await _admit(app, extender, make_pod(_gpu("main", 2000)))
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "exceeding resource quota"}
    assert (await _admit(app, extender, make_pod(_gpu("main", 1000))))["allowed"] is True


async def test_admission_charges_the_larger_of_app_sum_and_init_peak(api, app, extender):
    """Inventory: quota-webhook-init"""
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "5000"}, namespace=NAMESPACE)
    fits = make_pod(_gpu("main", 4000), init=[_gpu("setup", 4000)])
    assert (await _admit(app, extender, fits))["allowed"] is True
    too_big = make_pod(_gpu("main", 4000), init=[_gpu("setup", 6000)])
    response = await _admit(app, extender, too_big)
    assert response["allowed"] is False and response["status"]["message"] == "exceeding resource quota"


async def test_a_lowered_quota_applies_to_the_next_pod(api, app, extender):
    """Inventory: quota-update"""
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "4000"}, namespace=NAMESPACE)
    assert (await _admit(app, extender, make_pod(_gpu("main", 3000))))["allowed"] is True
    api.patch("resourcequotas", "gpu", {"spec": {"hard": {"limits.nvidia.com/gpumem": "2000"}}},
              namespace=NAMESPACE)
    await wait_until(lambda: app.cache.quota.limits[NAMESPACE][("NVIDIA", "mem")] == 2000, "quota lowered")
    response = await _admit(app, extender, make_pod(_gpu("main", 3000)))
    assert response["allowed"] is False and response["status"]["message"] == "exceeding resource quota"


async def test_admission_reads_the_smallest_of_several_quotas_and_skips_scoped_ones(api, app, extender):
    """Inventory: quota-multiple (HAMi #3094)

    The webhook's pre-check reads the filter's book: 1000 and 4000 give 1000, a BestEffort
    quota of 10 is skipped, deleting the 1000 leaves 4000."""
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "1000"}, namespace=NAMESPACE, name="small")
    await create_quota(api, app, {"limits.nvidia.com/gpumem": "4000"}, namespace=NAMESPACE, name="large")
    scoped = api.create("resourcequotas", {"metadata": {"name": "best-effort", "namespace": NAMESPACE},
                                           "spec": {"hard": {"limits.nvidia.com/gpumem": "10"},
                                                    "scopes": ["BestEffort"]}})
    await watch_applied(app, "resourcequotas", scoped["metadata"]["resourceVersion"])
    assert (await _admit(app, extender, make_pod(_gpu("main", 1000))))["allowed"] is True
    assert (await _admit(app, extender, make_pod(_gpu("main", 2000))))["allowed"] is False
    api.delete("resourcequotas", "small", namespace=NAMESPACE)
    await wait_until(lambda: app.cache.quota.limits[NAMESPACE][("NVIDIA", "mem")] == 4000, "quota recomputed")
    assert (await _admit(app, extender, make_pod(_gpu("main", 4000))))["allowed"] is True
    assert (await _admit(app, extender, make_pod(_gpu("main", 4001))))["allowed"] is False

"""HAMi's allocation outcome counters (its #3088), with its names and labels.

``hami_scheduler_allocations_total`` counts reservations /filter made, by family;
``hami_scheduler_allocation_failures_total`` the filters and binds that failed, by phase, family
and reason; ``hami_scheduler_bind_rollbacks_total`` the failed binds that gave the devices back.
"""
from __future__ import annotations

import pytest

from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from tests.conftest import register_nodes, wait_until


@pytest.fixture
def scheduler_options():
    return embedded_options(node_lock_wait_s=0.2)


def sample(app, name: str, phase: str, reason: str, device_type: str = "NVIDIA") -> float:
    return app.metrics.registry.get_sample_value(
        name, {"phase": phase, "device_type": device_type, "failure_reason": reason}) or 0


async def test_filter_and_bind_outcomes_are_counted_by_phase_family_and_reason(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1))
    placed = await extender.filter(api.create("pods", gpu_pod("fits", gpumem=1000)), nodes)
    assert placed["NodeNames"] == ["n1"]
    assert sample(app, "hami_scheduler_allocations_total", "filter", "none") == 1
    refused = await extender.filter(api.create("pods", gpu_pod("too-big", gpumem=10 ** 7)), nodes)
    assert not refused["NodeNames"]
    assert sample(app, "hami_scheduler_allocation_failures_total", "filter", "no_fit") == 1

    # Another pod's allocation holds the node lock: the bind gives up on it and its devices go back.
    api.create("pods", gpu_pod("holder", gpumem=1000))
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: lock_value("default", "holder")}}})
    await wait_until(lambda: (app.cache.lock_hint("n1")[0] or "").endswith(",holder"), "the lock seen")
    answer = await extender.bind(api.get("pods", "fits"), "n1")
    assert answer["Error"], answer
    assert sample(app, "hami_scheduler_allocation_failures_total", "bind", "lock") == 1
    assert sample(app, "hami_scheduler_bind_rollbacks_total", "bind", "lock") == 1
    assert "fits" not in {p.name for p in app.cache.pods.values()}

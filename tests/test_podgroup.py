"""PodGroup members wait for a contended node lock (``--node-lock-retry-timeout``); others do not."""
from __future__ import annotations

import asyncio

import pytest

from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from tests.conftest import wait_until


@pytest.fixture
def scheduler_options():
    return embedded_options(node_lock_retry_timeout_s=5.0)


async def _locked_node(api, app):
    api.create("nodes", gpu_node("n1", gpus=2))
    api.create("pods", gpu_pod("holder"))
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: lock_value("default", "holder")}}})
    await wait_until(lambda: "n1" in app.cache.nodes, "node registered")


def _node_reads(api):
    return sum(1 for m, p, _ in api.requests if m == "GET" and p == "/api/v1/nodes/n1")


async def test_pod_group_member_waits_for_the_lock_and_then_binds(api, app, extender):
    await _locked_node(api, app)
    pod = api.create("pods", gpu_pod("member", gpumem=1000))
    api.patch("pods", "member", {"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "g1"}}}, namespace="default")
    await extender.filter(pod, ["n1"])
    reads = _node_reads(api)
    bind = asyncio.create_task(extender.bind(pod, "n1"))
    await wait_until(lambda: _node_reads(api) >= reads + 3, "bind retrying on the contended lock")
    assert not bind.done()
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})  # the plugin releases it
    assert await bind == {"Error": ""}
    assert api.get("pods", "member", namespace="default")["spec"]["nodeName"] == "n1"


async def test_pod_outside_a_group_fails_at_once_on_contention(api, app, extender):
    await _locked_node(api, app)
    pod = api.create("pods", gpu_pod("loner", gpumem=1000))
    await extender.filter(pod, ["n1"])
    result = await extender.bind(pod, "n1")
    assert result["Error"] == "node n1 has been locked within 5m0s: node lock contention"


async def test_pod_group_member_gives_up_after_the_retry_timeout(api):
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    async with running_scheduler(api, options=embedded_options(node_lock_retry_timeout_s=0.3)) as app:
        client = ExtenderClient(app.url)
        try:
            await _locked_node(api, app)
            pod = api.create("pods", gpu_pod("member", gpumem=1000))
            api.patch("pods", "member", {"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "g"}}},
                      namespace="default")
            await client.filter(pod, ["n1"])
            result = await client.bind(pod, "n1")
            assert result["Error"] == ("timed out after 300ms waiting for node n1 to be unlocked: "
                                       "node lock contention")
            assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 0
        finally:
            await client.close()

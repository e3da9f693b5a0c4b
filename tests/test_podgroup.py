"""A bind waits for a node lock held by another pod's allocation in progress: PodGroup members up to
``--node-lock-retry-timeout`` (upstream's rule), every other pod up to ``--node-lock-wait`` (ours;
upstream fails them at once, and a failed bind costs the pod kube-scheduler's backoff)."""
from __future__ import annotations

import asyncio

import pytest

from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from tests.conftest import wait_until


@pytest.fixture
def scheduler_options():
    return embedded_options(node_lock_retry_timeout_s=5.0, node_lock_wait_s=0.3)


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
    await wait_until(lambda: _node_reads(api) >= reads + 1 and app.cache.lock_waiters("n1") == 1,
                     "bind queued for the contended lock")
    assert not bind.done()
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})  # the plugin releases it
    assert await bind == {"Error": ""}
    assert api.get("pods", "member", namespace="default")["spec"]["nodeName"] == "n1"


async def test_pod_outside_a_group_waits_for_the_node_lock_wait_then_fails(api, app, extender):
    await _locked_node(api, app)
    pod = api.create("pods", gpu_pod("loner", gpumem=1000))
    await extender.filter(pod, ["n1"])
    result = await extender.bind(pod, "n1")
    assert result["Error"] == "timed out after 300ms waiting for node n1 to be unlocked: node lock contention"
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 0


async def test_pod_group_member_gives_up_after_the_retry_timeout(api):
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    async with running_scheduler(api, options=embedded_options(node_lock_retry_timeout_s=0.3)) as app:
        client = ExtenderClient(app.url)
        try:
            await _locked_node(api, app)
            api.create("pods", gpu_pod("member", gpumem=1000))
            # kube-scheduler sends the pod as its informer has it: labelled. The bind judges the
            # group from that copy (it reads the pod no more).
            pod = api.patch("pods", "member", {"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "g"}}},
                            namespace="default")
            await client.filter(pod, ["n1"])
            result = await client.bind(pod, "n1")
            assert result["Error"] == ("timed out after 300ms waiting for node n1 to be unlocked: "
                                       "node lock contention")
            assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 0
        finally:
            await client.close()


def _owner_reads(api, owner: str = "holder") -> int:
    """Reads of the lock's owner pod: the lock's holder checked, so contention was seen."""
    return sum(1 for m, p, _ in api.requests if m == "GET" and p == f"/api/v1/namespaces/default/pods/{owner}")


async def test_a_bind_waits_for_the_allocation_before_it_and_is_woken_by_the_node_watch(api, monkeypatch):
    """The device plugin releases the lock once it has allocated the pod before: the waiting bind
    sees that through the node watch and binds, with no failure for kube-scheduler to back off on.
    The once-a-second retry is turned off, so only the watch can wake it in time."""
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    from hami_py.scheduling.verbs import bind as bind_module
    monkeypatch.setattr(bind_module, "LOCK_RECHECK_S", 3600.0)
    async with running_scheduler(api, options=embedded_options(node_lock_wait_s=30), device_plugin=False) as app:
        client = ExtenderClient(app.url)
        try:
            await _locked_node(api, app)
            await wait_until(lambda: app.cache.lock_hint("n1")[0], "the lock seen by the watch")
            pod = api.create("pods", gpu_pod("next", gpumem=1000))
            await client.filter(pod, ["n1"])
            bind = asyncio.create_task(client.bind(pod, "n1"))
            await wait_until(lambda: _owner_reads(api) >= 1 and app.cache.lock_waiters("n1") == 1,
                             "the bind queued after meeting the held lock")
            assert not bind.done()
            api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})   # allocated
            assert await bind == {"Error": ""}
            assert api.get("pods", "next", namespace="default")["spec"]["nodeName"] == "n1"
            assert not [e for e in api.list("events", namespace="default") if e["reason"] == "BindingFailed"]
        finally:
            await client.close()


async def test_queued_binds_take_the_lock_one_release_at_a_time(api, monkeypatch):
    """Five binds queue on one locked node, and the device plugin releases the lock after each
    allocation: each release wakes one waiter, which takes the lock with the version the watch
    showed. The queue drains without reading the node again per waiter per change (a wake-all
    cost about fifty requests a pod for twenty waiters)."""
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    from hami_py.scheduling.verbs import bind as bind_module
    monkeypatch.setattr(bind_module, "LOCK_RECHECK_S", 3600.0)
    async with running_scheduler(api, options=embedded_options(node_lock_wait_s=30)) as app:
        client = ExtenderClient(app.url)
        try:
            await _locked_node(api, app)
            await wait_until(lambda: app.cache.lock_hint("n1")[0], "the lock seen by the watch")
            pods = [api.create("pods", gpu_pod(f"q{i}", gpumem=1000)) for i in range(5)]
            for pod in pods:
                assert (await client.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            reads = _node_reads(api)
            binds = [asyncio.create_task(client.bind(pod, "n1")) for pod in pods]
            await wait_until(lambda: app.cache.lock_waiters("n1") == 5, "five binds queued")
            api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})   # holder allocated
            assert await asyncio.gather(*binds) == [{"Error": ""}] * 5
            # One read each when it met the held lock, and the device plugin's one per release.
            assert _node_reads(api) - reads <= 5 + 5 + 2, _node_reads(api) - reads
        finally:
            await client.close()

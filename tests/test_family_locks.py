"""A device family's own node lock, taken beside HAMi's (Cambricon's ``cambricon.com/dsmlu.lock``).

The family's device plugin waits for its own annotation, a bare RFC3339 time that expires after
two minutes. hami-py sets it in the same compare-and-set patch as ``hami.io/mutex.lock``, so the
bind still costs one write; a fresh copy from another bind is contention, an expired or
unreadable one is taken over, and a failed bind releases both. These tests drive the locker
against the in-repo API server over HTTP.
"""
from __future__ import annotations

import os
import tempfile
from datetime import datetime, timedelta, timezone

import pytest

from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi import write_kubeconfig
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.nodelock import LOCK_ANNOTATION, ExtraLock, NodeLocker, NodeLockError
from tests.conftest import assert_books_balance, register_nodes

DSMLU = ExtraLock("cambricon.com/dsmlu.lock", 120.0)


@pytest.fixture
async def locker(api):
    with tempfile.TemporaryDirectory(prefix="hami-py-") as tmp:
        kubeconfig = write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url)
        client = KubeClient(await load_configuration(kubeconfig), qps=0, burst=100)
        try:
            yield NodeLocker(client)
        finally:
            await client.close()


def _annotations(api) -> dict:
    return api.get("nodes", "n1")["metadata"].get("annotations") or {}


def _stamp(ago: timedelta) -> str:
    return (datetime.now(timezone.utc) - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_family_lock_is_set_in_the_same_write_as_hamis(api, locker):
    before = int(api.create("nodes", gpu_node("n1"))["metadata"]["resourceVersion"])
    await locker.acquire("n1", "default", "p1", extra=(DSMLU,))
    node = api.get("nodes", "n1")
    annotations = node["metadata"]["annotations"]
    assert annotations[LOCK_ANNOTATION].endswith(",default,p1")
    taken = datetime.fromisoformat(annotations[DSMLU.annotation])
    assert abs((datetime.now(timezone.utc) - taken).total_seconds()) < 60
    assert int(node["metadata"]["resourceVersion"]) == before + 1      # one write for both


async def test_a_fresh_family_lock_is_contention_and_an_expired_one_is_taken_over(api, locker):
    api.create("nodes", gpu_node("n1", annotations={DSMLU.annotation: _stamp(timedelta(seconds=30))}))
    with pytest.raises(NodeLockError) as caught:
        await locker.acquire("n1", "default", "p1", extra=(DSMLU,))
    assert caught.value.contention
    assert "node n1 has been locked within 2m0s (cambricon.com/dsmlu.lock)" in str(caught.value)
    assert LOCK_ANNOTATION not in _annotations(api)      # nothing half-taken

    api.patch("nodes", "n1", {"metadata": {"annotations": {DSMLU.annotation: _stamp(timedelta(minutes=3))}}})
    await locker.acquire("n1", "default", "p1", extra=(DSMLU,))
    assert _annotations(api)[LOCK_ANNOTATION].endswith(",default,p1")


async def test_an_unreadable_family_lock_counts_as_expired(api, locker):
    api.create("nodes", gpu_node("n1", annotations={DSMLU.annotation: "not a time"}))
    await locker.acquire("n1", "default", "p1", extra=(DSMLU,))
    assert datetime.fromisoformat(_annotations(api)[DSMLU.annotation])


async def test_release_drops_both_locks_and_only_the_owners(api, locker):
    api.create("nodes", gpu_node("n1"))
    await locker.acquire("n1", "default", "p1", extra=(DSMLU,))
    assert await locker.release("n1", "default", "other", extra=(DSMLU,))   # not its lock: untouched
    assert DSMLU.annotation in _annotations(api)
    assert await locker.release("n1", "default", "p1", extra=(DSMLU,))
    annotations = _annotations(api)
    assert LOCK_ANNOTATION not in annotations and DSMLU.annotation not in annotations


async def test_a_family_without_its_own_lock_is_unchanged(api, locker):
    api.create("nodes", gpu_node("n1", annotations={DSMLU.annotation: _stamp(timedelta(seconds=1))}))
    await locker.acquire("n1", "default", "p1")          # NVIDIA: HAMi's lock only
    assert _annotations(api)[DSMLU.annotation]          # another family's lock is not its business


# -- end to end: a pod of two locking families, and a bind that fails ---------------------------

def _gpu_and_mlu_node(name: str) -> dict:
    node = gpu_node(name, gpus=2)
    capacity = {"cambricon.com/vmlu": "20", "cambricon.com/mlu.smlu.vcore": "200",
                "cambricon.com/mlu.smlu.vmemory": "100", "nvidia.com/gpu": "20"}
    node.setdefault("status", {}).setdefault("capacity", {}).update(capacity)
    node["status"].setdefault("allocatable", {}).update(capacity)
    return node


def _gpu_and_mlu_pod(name: str) -> dict:
    pod = gpu_pod(name, gpumem=1000)
    pod["spec"]["containers"].append({"name": "mlu", "image": "mlu:latest", "resources": {
        "limits": {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "4"}}})
    return pod


@pytest.fixture
async def app(api):
    async with running_scheduler(api, options=embedded_options(node_lock_wait_s=0), device_plugin=False) as running:
        yield running


async def test_a_failed_bind_releases_every_lock_it_took_and_a_retry_binds(api, app):
    """Inventory: lock-rollback. A pod with a GPU and an MLU takes HAMi's lock and Cambricon's in
    one write; its Binding refused, both are released and nothing is charged; filtered again, it binds."""
    extender = ExtenderClient(app.url)
    try:
        names = await register_nodes(api, app, _gpu_and_mlu_node("n1"))
        pod = api.create("pods", _gpu_and_mlu_pod("p"))
        assert (await extender.filter(pod, names))["NodeNames"] == ["n1"]
        fault = api.faults.add(method="POST", path="/binding$", status=409, times=1)
        result = await extender.bind(pod, "n1")
        assert fault.hits == 1 and result["Error"]
        annotations = _annotations(api)
        assert LOCK_ANNOTATION not in annotations and DSMLU.annotation not in annotations
        assert not app.cache.pods
        assert (await extender.filter(pod, names))["NodeNames"] == ["n1"]
        assert await extender.bind(pod, "n1") == {"Error": ""}
        annotations = _annotations(api)
        assert annotations[LOCK_ANNOTATION].endswith(",default,p") and annotations[DSMLU.annotation]
        assert_books_balance(app)
    finally:
        await extender.close()

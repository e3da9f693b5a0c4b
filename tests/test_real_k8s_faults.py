"""Faults of a real control plane: kube-apiserver restarted mid-watch, etcd compaction forcing
410 Gone, and a burst of pod deletes during filters.

These run against control planes of their own (module-scoped), not the session's: one as the
session's, one with ``--watch-cache=false --etcd-compaction-interval=1s`` so that a watch from a
compacted resourceVersion reaches etcd and gets 410 (the watch cache would serve it from memory).
hami-scheduler reaches the API server through a loopback TCP relay (``Partition``) the test can
cut, so that it misses what the test changes meanwhile, deterministically; the test and the device
plugin stand-in talk to the API server directly. After each fault the scheduler's books must equal
the recount from the API server's annotations (tests/reliability_helpers.py).
"""
from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import orjson
import pytest

from hami_py.embedded import embedded_options, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod, registration
from tests.conftest import informer_of
from tests.realk8s import (
    SA_USER, Partition, RealKube, real_node, real_scheduler, unique, wait_books_balance,
)
from tests.realk8s_fixtures import started_plane

pytestmark = pytest.mark.real_k8s

T4 = {"type": "NVIDIA T4", "devmem": 10000, "devcore": 100}


@pytest.fixture(scope="module")
def fault_plane(real_k8s_binaries, tmp_path_factory):
    plane = started_plane(tmp_path_factory.mktemp("fault-plane"), real_k8s_binaries)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def compacting_plane(real_k8s_binaries, tmp_path_factory):
    plane = started_plane(tmp_path_factory.mktemp("compacting-plane"), real_k8s_binaries,
                          apiserver_flags=("--watch-cache=false", "--etcd-compaction-interval=1s"))
    try:
        yield plane
    finally:
        plane.stop()


class Cluster:
    """One test's view of a fault plane: the admin client, a namespace, nodes, and hami-scheduler
    behind a relay it can be cut off by."""

    def __init__(self, plane, kube: RealKube, partition: Partition, namespace: str):
        self.plane, self.kube, self.partition, self.namespace = plane, kube, partition, namespace
        self.app = None

    async def nodes(self, count: int, **kw) -> list[str]:
        names = []
        for _ in range(count):
            node = real_node(unique("fault"), **kw)
            await self.kube.create("nodes", node)
            names.append(node["metadata"]["name"])
        await wait_for(lambda: all(n in self.app.cache.node_index_of for n in names), timeout=20,
                       what=f"nodes {names} registered")
        return names

    async def place(self, name: str, nodes: list[str], *, bind: bool = True, **kw) -> str:
        pod = await self.kube.create("pods", gpu_pod(name, namespace=self.namespace, **kw))
        extender = ExtenderClient(self.app.url)
        try:
            result = await extender.filter(pod, nodes)
            assert result["NodeNames"], result
            node = result["NodeNames"][0]
            if bind:
                before = self.app.device_plugin.allocated
                assert await extender.bind(pod, node) == {"Error": ""}
                await wait_for(lambda: self.app.device_plugin.allocated > before, timeout=20, what=f"{name} allocated")
            return node
        finally:
            await extender.close()


@pytest.fixture
async def cluster(tmp_path):
    """``await cluster(plane, **options)``: the Cluster, its scheduler started behind a relay."""
    async with AsyncExitStack() as stack:
        async def make(plane, **options) -> Cluster:
            kube = await RealKube.connect(plane.admin_kubeconfig)
            stack.push_async_callback(kube.close)
            partition = Partition(plane.port)
            await partition.start()
            stack.push_async_callback(partition.stop)
            namespace = unique("faults")
            plane.ensure_namespace(namespace)
            relayed = plane.write_kubeconfig(tmp_path / "relayed.kubeconfig", plane.sa_token, user=SA_USER,
                                             server=f"https://127.0.0.1:{partition.port}")
            c = Cluster(plane, kube, partition, namespace)
            c.app = await stack.enter_async_context(real_scheduler(
                kubeconfig=relayed, plugin_kubeconfig=plane.admin_kubeconfig,
                options=embedded_options(scheduler_name="hami-scheduler", **options)))
            return c

        yield make


async def test_apiserver_restarted_mid_watch_the_scheduler_relists_and_loses_nothing(fault_plane, cluster):
    c = await cluster(fault_plane)
    nodes = await c.nodes(2, gpus=2, model=T4)
    for i in range(4):
        await c.place(f"p{i}", nodes, gpumem=2000, gpucores=10)
    await wait_books_balance(c.kube, c.app)
    pods = informer_of(c.app, "pods")
    watches = pods.stats.watches

    # The API server dies (SIGKILL: its graceful shutdown waits a minute for open watches to end)
    # while every watch of the scheduler is open, cutting them mid-stream; once it is gone, the
    # relay keeps the scheduler away until the restarted server has changed behind its back.
    fault_plane.apiserver.stop()
    c.partition.cut()
    fault_plane.start_apiserver()
    await c.kube.delete("pods", "p0", namespace=c.namespace)
    await c.kube.delete("pods", "p1", namespace=c.namespace)
    await c.kube.patch("nodes", nodes[1], {"metadata": {"annotations": {
        "hami.io/node-nvidia-register": orjson.dumps(registration(nodes[1], gpus=4, model=T4)).decode()}}})
    extra = real_node(unique("fault"), devices=registration("extra", gpus=1, model=T4))
    await c.kube.create("nodes", extra)
    assert "p0" in {p.name for p in c.app.cache.pods.values()}   # it has not seen any of it yet
    c.partition.heal()

    # Whether the pod watch resumes (the restarted server's watch cache may still serve its
    # resourceVersion) or gets 410 and relists, the deletions made behind its back must arrive.
    await wait_for(lambda: not {"p0", "p1"} & {p.name for p in c.app.cache.pods.values()}, timeout=60,
                   what="the pods deleted during the outage gone from the books")
    await wait_for(lambda: len(c.app.cache.device_usage(nodes[1])) == 4 and extra["metadata"]["name"]
                   in c.app.cache.node_index_of, timeout=30, what="the node changes seen")
    await wait_books_balance(c.kube, c.app)
    assert {p.name for p in c.app.cache.pods.values()} >= {"p2", "p3"}
    assert not {"p0", "p1"} & {p.name for p in c.app.cache.pods.values()}
    assert pods.stats.watches > watches
    # And it schedules on what it relisted.
    await c.place("after", [extra["metadata"]["name"]], gpumem=2000)
    await wait_books_balance(c.kube, c.app)


async def _compacted(kube: RealKube, resource_version: str) -> bool:
    """Does a watch of pods from ``resource_version`` get 410 Gone now (etcd compacted it)?"""
    response = await kube.client.open("GET", "/api/v1/pods", query=[
        ("watch", "true"), ("resourceVersion", resource_version), ("timeoutSeconds", "1")])
    async with response:
        if response.status == 410:
            return True
        first = (await response.content.readline()).strip()
    if not first:
        return False
    event = orjson.loads(first)
    return event.get("type") == "ERROR" and (event.get("object") or {}).get("code") == 410


async def test_etcd_compaction_forces_410_and_the_relist_drops_what_was_deleted_meanwhile(compacting_plane,
                                                                                          cluster):
    c = await cluster(compacting_plane)
    nodes = await c.nodes(1, gpus=2, model=T4)
    for i in range(3):
        await c.place(f"p{i}", nodes, gpumem=3000)
    await wait_books_balance(c.kube, c.app)
    pods = informer_of(c.app, "pods")
    gone_before = pods.stats.relists_on_gone
    c.partition.cut()
    seen = pods.resource_version
    await c.kube.delete("pods", "p0", namespace=c.namespace)
    await c.kube.delete("pods", "p1", namespace=c.namespace)
    deadline = time.monotonic() + 30
    while not await _compacted(c.kube, seen):       # the API server compacts etcd every second
        assert time.monotonic() < deadline, f"resourceVersion {seen} never compacted"
        await c.kube.patch("namespaces", c.namespace, {"metadata": {"annotations": {"tick": str(time.time())}}})
        await asyncio.sleep(0.2)
    c.partition.heal()
    await wait_for(lambda: pods.stats.relists_on_gone > gone_before, timeout=60,
                   what="the pod informer's relist on 410 Gone")
    await wait_books_balance(c.kube, c.app)
    assert {p.name for p in c.app.cache.pods.values() if p.name.startswith("p")} == {"p2"}


async def test_a_burst_of_pod_deletes_during_filters_never_oversubscribes(fault_plane, cluster):
    """16 pods fill four GPUs; 16 new pods are filtered, each retried until it fits (as
    kube-scheduler requeues), and once the first has been refused all 16 old pods are deleted at
    once: each new pod fits only into what a delete freed, delivered by the watch while the
    filters run."""
    c = await cluster(fault_plane)
    nodes = await c.nodes(2, gpus=2, model=T4)
    share = T4["devmem"] // 4
    for i in range(16):
        await c.place(f"old-{i}", nodes, bind=False, gpumem=share, gpucores=25)
    await wait_books_balance(c.kube, c.app)
    extender = ExtenderClient(c.app.url)
    placed: dict[str, str] = {}
    refused = asyncio.Event()
    new = [await c.kube.create("pods", gpu_pod(f"new-{i}", namespace=c.namespace, gpumem=share, gpucores=25))
           for i in range(16)]

    async def schedule(pod: dict) -> None:
        deadline = time.monotonic() + 60
        while True:
            result = await extender.filter(pod, nodes)
            if result.get("NodeNames"):
                placed[pod["metadata"]["name"]] = result["NodeNames"][0]
                return
            assert result["Error"] == "" and set(result["FailedNodes"]) == set(nodes), result
            refused.set()
            assert time.monotonic() < deadline, f"{pod['metadata']['name']} never fitted: {result}"
            await asyncio.sleep(0.02)      # kube-scheduler's backoff, shortened

    async def delete_burst() -> None:
        await refused.wait()
        await asyncio.gather(*(c.kube.delete("pods", f"old-{i}", namespace=c.namespace) for i in range(16)))

    try:
        await asyncio.wait_for(asyncio.gather(*(schedule(pod) for pod in new), delete_burst()), 90)
    finally:
        await extender.close()
    assert len(placed) == 16
    await wait_books_balance(c.kube, c.app)
    assert {p.name for p in c.app.cache.pods.values() if p.name.startswith(("old-", "new-"))} == set(placed)
    assert all(d["usedmem"] == T4["devmem"] for n in nodes for d in c.app.cache.device_usage(n))

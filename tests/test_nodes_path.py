"""The ``Nodes`` path (kube-scheduler or Cluster Autoscaler with ``nodeCacheCapable: false``):
fit against the node objects sent in the request, write nothing, answer with the node object."""
from __future__ import annotations

import asyncio

from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import node_list


async def test_nodes_path_returns_the_best_node_object_and_writes_nothing(api, app, extender):
    small = gpu_node("small", gpus=1)
    big = gpu_node("big", gpus=4)
    pod = api.create("pods", gpu_pod("p", gpus=2, gpumem=1000))
    rv_before = api.resource_version
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": node_list(small, big)})
    assert body["Error"] == ""
    assert body["NodeNames"] is None
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["big"]
    assert body["Nodes"]["items"][0] == big  # the request's own node object
    assert body["FailedNodes"] == {"small": "NodeInsufficientDevice"}
    await asyncio.wait_for(app.events.queue.join(), 10)   # any Event queued by the filter is written by now
    assert api.resource_version == rv_before  # no patch, no reservation, no Event
    assert "hami.io/vgpu-node" not in (api.get("pods", "p", namespace="default")["metadata"].get("annotations") or {})
    assert not app.cache.pods


async def test_nodes_path_with_no_fit_and_an_unregistered_node(api, app, extender):
    pod = api.create("pods", gpu_pod("p", gpumem=500000))
    plain = {"metadata": {"name": "cpu"}, "status": {}}
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": node_list(gpu_node("g", gpus=1), plain)})
    assert body["Nodes"] is None
    assert body["FailedNodes"] == {"g": "1/1 CardInsufficientMemory", "cpu": "node unregistered"}


async def test_pod_without_devices_gets_its_nodes_back_on_the_nodes_path(api, app, extender):
    pod = api.create("pods", {"metadata": {"name": "cpu", "namespace": "default"},
                              "spec": {"containers": [{"name": "c"}]}})
    nodes = node_list(gpu_node("g", gpus=1))
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": nodes})
    assert body["Nodes"] == nodes and body["Error"] == ""


async def test_malformed_nodes_list(api, app, extender):
    pod = api.create("pods", gpu_pod("p"))
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": {"items": "nope"}})
    assert body["Error"] == "extender args Nodes must be a NodeList with an items list"

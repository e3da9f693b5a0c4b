"""Feature-inventory rows of the /filter verb that no other test pinned down yet.

The inventory (upstream HAMi's scheduler behaviours, one row per behaviour) is mapped row by row in
docs/FEATURES.md; each test here names its row in a docstring line ``Inventory: <row id>``. The
setup is the inventory's reference node: one NVIDIA A100 registered as ``GPU-0`` with 8192 MiB,
100 cores and a split count of 10. The other ``test_inventory_*`` modules reuse the helpers below
(``register`` and ``place`` are tests/conftest.py's, re-exported).
"""
from __future__ import annotations

import pytest

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import (UNBOUND_WINDOW_S, bind_placed, decision_annotations, node_list, place,
                            register_nodes as register, wait_until)

A100_MIB = 8192
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"


def a100(index: int = 0, **overrides) -> dict:
    """One device of the inventory's reference registration (``GPU-<index>``)."""
    device = {"id": f"GPU-{index}", "index": index, "count": 10, "devmem": A100_MIB, "devcore": 100,
              "type": "NVIDIA-A100", "numa": 0, "health": True, "mode": "hami-core"}
    device.update(overrides)
    return device


def reference_node(name: str = "n1", *devices: dict, **kw) -> dict:
    """A node registered as HAMi's NVIDIA device plugin would; by default the single ``GPU-0``."""
    return gpu_node(name, devices=list(devices) or [a100()], **kw)


def allocation(api, app, pod_name: str, namespace: str = "default") -> list[list]:
    """The pod's ``hami.io/vgpu-devices-to-allocate`` as its Binding writes it, decoded: one
    device list per container (tests/conftest.py::decision_annotations)."""
    annotations = decision_annotations(api, app, pod_name, namespace)
    return decode_pod_devices(annotations[TO_ALLOCATE])


def pod_uid(api, name: str, namespace: str = "default") -> str:
    return api.get("pods", name, namespace=namespace)["metadata"]["uid"]


def used_mem(app, node: str = "n1") -> int:
    return sum(d["usedmem"] for d in app.cache.device_usage(node))


def events_of(api, pod_name: str, namespace: str = "default") -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in api.list("events", namespace=namespace)
            if e["involvedObject"]["name"] == pod_name]


# ---------------------------------------------------------------------------------------------
# live filter
# ---------------------------------------------------------------------------------------------

async def test_bind_of_a_pod_missing_from_the_api_server_fails_and_frees_the_reservation(api, app, extender):
    """Inventory: filter-patch-rollback

    kube-scheduler may filter a pod the API server does not have: the watch does not vouch for
    it, so the read after the filter's answer (HAMi v2.11's live-pod check, off kube-scheduler's
    wait) releases what it reserved. A pod deleted after its filter and its
    bind's check: the filter wrote nothing, the Binding that carries the decision is a 404, the
    bind's answer carries the error, and the node lock and the capacity reserved are free for
    the next pod."""
    names = await register(api, app, reference_node())
    ghost = gpu_pod("ghost", gpumem=A100_MIB)
    ghost["metadata"]["uid"] = "9d0c7e5e-ghost"            # never created in the API server
    result = await extender.filter(ghost, names)
    assert result["NodeNames"] == ["n1"], result
    await wait_until(lambda: used_mem(app) == 0, "the ghost's reservation released")
    ghost = api.create("pods", gpu_pod("ghost", gpumem=A100_MIB))
    result = await extender.filter(ghost, names)
    assert result["NodeNames"] == ["n1"] and used_mem(app) == A100_MIB, result
    api.faults.add(method="POST", path="/pods/ghost/binding$", status=404)   # deleted meanwhile
    bound = await extender.bind(ghost, "n1")
    assert bound["Error"], bound
    assert used_mem(app) == 0
    assert LOCK_ANNOTATION not in (api.get("nodes", "n1")["metadata"].get("annotations") or {})
    _, result = await place(api, extender, gpu_pod("next", gpumem=A100_MIB), names)
    assert result["NodeNames"] == ["n1"], result


async def test_same_pod_on_fifty_nodes_gets_the_same_answer_every_time(api, app, extender):
    """Inventory: concurrency-nodes

    Fifty nodes failing for five different reasons: repeated filters report exactly the same
    reason per node, and a pod that fits many equally good nodes gets the same one each time
    (upstream may pick another among exact ties; we take the first in kube-scheduler's order)."""
    nodes = []
    for i in range(50):
        kind = i % 5
        if kind == 0:
            devices = [a100(devmem=4096)]
        elif kind == 1:
            devices = [a100(health=False)]
        elif kind == 2:
            devices = [a100(count=0)]
        elif kind == 3:
            devices = [a100(0, devmem=4096), a100(1, health=False)]
        else:
            devices = [a100(devmem=4096), a100(1, devmem=4096)]
        nodes.append(reference_node(f"node-{i:02d}", *devices))
    names = await register(api, app, *nodes)
    expected_kind = {0: "1/1 CardInsufficientMemory", 1: "1/1 CardNotHealth", 2: "1/1 CardTimeSlicingExhausted",
                     3: "1/2 CardInsufficientMemory, 1/2 CardNotHealth", 4: "2/2 CardInsufficientMemory"}
    big = api.create("pods", gpu_pod("big", gpumem=6000))
    answers = [await extender.filter(big, names) for _ in range(3)]
    assert answers[0]["FailedNodes"] == {name: expected_kind[i % 5] for i, name in enumerate(names)}
    assert answers[1] == answers[0] and answers[2] == answers[0]
    small = api.create("pods", gpu_pod("small", gpumem=1000))
    winners = {tuple((await extender.filter(small, names))["NodeNames"]) for _ in range(3)}
    assert winners == {("node-00",)}


async def test_an_init_container_without_devices_keeps_its_empty_slot(api, app, extender):
    """Inventory: padding-bug (deliberate difference, docs/COMPATIBILITY.md "Fit and score")

    Upstream writes ``GPU-0,NVIDIA,..:;`` for [init: no GPU, app: GPU], which puts the app's
    device in the init slot; the usage then vanishes once the init container finishes. We keep
    one slot per container, so the device stays charged while the app runs."""
    names = await register(api, app, reference_node())
    pod = gpu_pod("p", gpumem=3000, gpucores=30)
    pod["spec"]["initContainers"] = [{"name": "setup", "image": "busybox"}]
    created, result = await place(api, extender, pod, names)
    assert result["NodeNames"] == ["n1"], result
    annotations = (await bind_placed(api, app, extender, created, result))["metadata"]["annotations"]
    assert annotations[TO_ALLOCATE] == annotations[ALLOCATED] == ";GPU-0,NVIDIA,3000,30:;"
    api.patch("pods", "p", {"status": {"initContainerStatuses": [
        {"name": "setup", "state": {"terminated": {"exitCode": 0}}}]}}, namespace="default")
    patched_rv = int(api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"])
    uid = pod_uid(api, "p")
    await wait_until(lambda: (app.cache.pods[uid].resource_version or 0) >= patched_rv, "init status seen")
    assert used_mem(app) == 3000


# ---------------------------------------------------------------------------------------------
# the Nodes path (nodeCacheCapable: false, Cluster Autoscaler's simulation)
# ---------------------------------------------------------------------------------------------

async def test_simulation_returns_only_the_best_of_several_fitting_nodes(api, app, extender):
    """Inventory: simulation-best-only"""
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    templates = [reference_node("t1"), reference_node("t2")]
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": node_list(*templates)})
    assert body["Error"] == "" and body["NodeNames"] is None
    assert len(body["Nodes"]["items"]) == 1
    assert body["Nodes"]["items"][0]["metadata"]["name"] in ("t1", "t2")


@pytest.mark.parametrize("scheduler_options", [embedded_options(filtering_succeed_window_s=UNBOUND_WINDOW_S)])
async def test_simulation_leaves_no_trace_for_the_live_filter(api, app, extender):
    """Inventory: simulation-no-side-effects

    A simulation on the live node's own object takes the whole GPU on paper: afterwards the pod
    has no HAMi annotation, no event was recorded for it, and the live filter still finds the
    whole GPU free."""
    names = await register(api, app, reference_node())
    pod = api.create("pods", gpu_pod("p", gpumem=A100_MIB))
    _, body = await extender.post("filter", {"Pod": pod, "Nodes": node_list(api.get("nodes", "n1"))})
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["n1"]
    assert not any(k.startswith("hami.io/") for k in
                   api.get("pods", "p", namespace="default")["metadata"].get("annotations") or {})
    assert used_mem(app) == 0
    result = await extender.filter(pod, names)           # the live filter: the GPU is whole
    assert result["NodeNames"] == ["n1"], result
    await wait_until(lambda: events_of(api, "p"), "the live filter's event")
    assert [reason for reason, _ in events_of(api, "p")] == ["FilteringSucceed"]

"""Faults between the scheduler and the API server, and what the books look like afterwards.

Every test here breaks something the scheduler depends on (watches, history, individual API
calls, the whole API server, objects vanishing or changing under it), lets kube-scheduler do what
it does (retry), and then requires the usage books to equal a recount from the pods' annotations
as the API server holds them, with no GPU charged beyond its capacity
(``tests/reliability_helpers.py::wait_books_balance``). docs/RELIABILITY.md lists each fault with
the behaviour these tests pin down.
"""
from __future__ import annotations

import asyncio

import orjson
import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.base import ContainerDevice
from hami_py.devices.registry import build_vendors
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import write_kubeconfig
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import H200, gpu_node, gpu_pod, registration
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.informer import Informer
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from hami_py.scheduling.verbs.stale import decision_keys
from tests.conftest import filtered, informer_of, pod_events_applied
from tests.reliability_helpers import schedule_with_retries, wait_books_balance, wait_lock_free

WATCHED = r"^/api/v1/(pods|nodes)$"     # list and watch paths of the informers
FULL_CARD = H200["devmem"]


@pytest.fixture
def scheduler_options():
    # A client-side timeout, so a hung API call ends (as --kube-timeout does in production).
    return embedded_options(kube_timeout=1.0)


async def add_nodes(api, app, *names: str, gpus: int = 2) -> list[str]:
    for name in names:
        api.create("nodes", gpu_node(name, gpus=gpus))
    await wait_for(lambda: all(n in app.cache.nodes for n in names), what="nodes registered")
    return list(names)


async def place(api, app, extender, name: str, node_names: list[str], **request) -> dict:
    """Create a pod and have it filtered, bound and allocated; the stored pod."""
    pod = api.create("pods", gpu_pod(name, **request))
    placement = await schedule_with_retries(extender, api, pod, node_names)
    assert placement.node, placement
    await wait_for(lambda: api.get("pods", name, namespace="default")["metadata"]["annotations"]
                   .get("hami.io/bind-phase") == "success", what=f"{name} allocated")
    await wait_lock_free(api, placement.node)
    return api.get("pods", name, namespace="default")


def placed_elsewhere(name: str, node: str, uuid: str, mem: int, cores: int) -> dict:
    """A running pod that another scheduler replica placed: only its annotations tell."""
    pod = gpu_pod(name, gpumem=mem, gpucores=cores)
    vendor = build_vendors(DeviceConfig.default())["NVIDIA"]
    pod["metadata"]["annotations"].update({"hami.io/vgpu-node": node, **vendor.encode_allocation(
        [[ContainerDevice(uuid, "NVIDIA", mem, cores)]])})
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


async def hold_watches(api, *, reconnects: int = 3):
    """Cut every watch and keep the reconnects hanging (the scheduler's two informers and the
    device plugin's one) until ``api.faults.clear()``: changes made meanwhile are missed live."""
    fault = api.faults.add(method="GET", path=WATCHED, hang=True, times=None)
    api.drop_watches()
    await wait_for(lambda: fault.hits >= reconnects, what="the informers to reconnect into the hang")
    return fault


async def change_cluster_while_away(api, app, names: list[str]) -> None:
    """Deletes, terminations, new pods, a new node and a registration change, none seen live."""
    api.delete("pods", "a", namespace="default")
    api.patch("pods", "b", {"status": {"phase": "Succeeded"}}, namespace="default")
    devices = registration(names[1], gpus=3)
    api.patch("nodes", names[1], {"metadata": {"annotations": {
        "hami.io/node-nvidia-register": orjson.dumps(devices).decode()}}})
    api.create("nodes", gpu_node("late", gpus=1))
    late_uuid = registration("late", gpus=1)[0]["id"]
    api.create("pods", placed_elsewhere("elsewhere", "late", late_uuid, 5000, 20))


# ---------------------------------------------------------------------------------------- watches

async def test_dropped_watches_resume_and_replay_what_was_missed(api, app, extender):
    names = await add_nodes(api, app, "n1", "n2")
    for name in ("a", "b", "c"):
        await place(api, app, extender, name, names, gpumem=10000, gpucores=10)
    pods = informer_of(app, "pods")
    relists = pods.stats.relists_on_gone
    await hold_watches(api)
    await change_cluster_while_away(api, app, names)
    api.faults.clear()
    await wait_books_balance(api, app)
    assert "late" in app.cache.nodes and len(app.cache.device_usage("n2")) == 3
    assert pods.stats.relists_on_gone == relists   # resumed from its resourceVersion, no relist
    await place(api, app, extender, "after", names, gpumem=10000)
    await wait_books_balance(api, app)


async def test_compacted_history_relists_and_drops_what_was_deleted_meanwhile(api, app, extender):
    names = await add_nodes(api, app, "n1", "n2")
    for name in ("a", "b", "c"):
        await place(api, app, extender, name, names, gpumem=10000, gpucores=10)
    pods, nodes = informer_of(app, "pods"), informer_of(app, "nodes")
    relists = (pods.stats.relists_on_gone, nodes.stats.relists_on_gone)
    await hold_watches(api)
    await change_cluster_while_away(api, app, names)
    api.compact()    # the resourceVersions the informers hold are gone: 410 on resume
    api.faults.clear()
    await wait_books_balance(api, app)
    assert pods.stats.relists_on_gone > relists[0] and nodes.stats.relists_on_gone > relists[1]
    assert "a" not in {p.name for p in app.cache.pods.values()}
    await place(api, app, extender, "after", names, gpumem=10000)
    await wait_books_balance(api, app)


@pytest.mark.parametrize("status, retry_after", [(500, None), (429, 1), (503, None)])
async def test_watch_reconnect_errors_back_off_and_recover(api, app, extender, status, retry_after):
    names = await add_nodes(api, app, "n1", "n2")
    for name in ("a", "b"):
        await place(api, app, extender, name, names, gpumem=10000)
    refused = api.faults.add(method="GET", path=WATCHED, status=status, retry_after=retry_after, times=3)
    held = api.faults.add(method="GET", path=WATCHED, hang=True, times=None)
    api.drop_watches()
    await wait_for(lambda: refused.hits == 3 and held.hits >= 3, what="errors, then reconnects into the hang")
    await change_cluster_while_away(api, app, names)
    api.faults.clear()
    await wait_books_balance(api, app)
    await place(api, app, extender, "after", names, gpumem=10000)
    await wait_books_balance(api, app)


# ---------------------------------------------------------------------------------------- lists

@pytest.mark.parametrize("fault", [
    {"status": 500, "times": 3},
    {"status": 429, "retry_after": 1, "times": 1},
    {"hang": True, "times": 2},
])
async def test_startup_list_failures_delay_sync_but_lose_nothing(api, fault):
    api.create("nodes", gpu_node("n1", gpus=2))
    uuid = registration("n1", gpus=2)[0]["id"]
    api.create("pods", placed_elsewhere("running", "n1", uuid, 7000, 30))
    injected = api.faults.add(method="GET", path=WATCHED, **fault)
    async with running_scheduler(api, device_plugin=False, wait_ready=False,
                                 options=embedded_options(sync_timeout_s=0.2, kube_timeout=1.0)) as app:
        client = ExtenderClient(app.url)
        try:
            await wait_for(lambda: injected.hits >= 1, what="the faulty list")
            if fault.get("hang"):
                pod = api.create("pods", gpu_pod("early", gpumem=1000))
                result = await client.filter(pod, ["n1"])
                assert result["Error"] == "scheduler cache is not synced yet"
                assert not app.ready
                api.faults.clear()
            await wait_for(lambda: app.ready, timeout=30, what="sync once the lists succeed")
            await wait_books_balance(api, app)
            assert app.cache.device_usage("n1")[0]["usedmem"] == 7000
        finally:
            await client.close()


# ---------------------------------------------------------------------------------------- filter

WRITES = ("PATCH", "PUT", "POST", "DELETE")


@pytest.mark.parametrize("fault", [{"status": 500}, {"hang": True}, {"delay": 0.5}], ids=["fail", "hang", "delay"])
async def test_filter_answers_whatever_the_api_server_does_with_writes(api, app, extender, fault):
    """/filter writes nothing: with every write failing, hung or slowed, it still decides and
    reserves (a write awaited would have failed it, or timed out by --kube-timeout)."""
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000, gpucores=20))
    for method in WRITES:
        api.faults.add(method=method, times=None, **fault)
    try:
        result = await extender.filter(pod, names)
        assert result["NodeNames"] == names and result["Error"] == "", result
        assert app.cache.pods[pod["metadata"]["uid"]].node == "n1"
        assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
        assert not [r for r in api.requests if r[0] != "GET" and "/pods/" in r[1]]   # no pod write tried
    finally:
        api.faults.clear()
    placement = await schedule_with_retries(extender, api, pod, names)
    assert placement.node == "n1", placement
    await wait_books_balance(api, app)


@pytest.mark.parametrize("fault", [
    {"status": 500},
    {"status": 429, "retry_after": 1},
    {"status": 409},
    {"status": 504, "after_apply": True},     # the Binding landed, the answer was lost
    {"hang": True},                           # ends by the client timeout (--kube-timeout)
])
async def test_binding_failure_rolls_back_then_retry_places(api, app, extender, fault):
    """The decision travels with the Binding: a Binding that fails leaves nothing on the pod and
    releases the reservation and the node lock; one that landed despite the error is kept."""
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000, gpucores=20))
    injected = api.faults.add(method="POST", path="/pods/p/binding$", **fault)
    assert (await extender.filter(pod, names))["NodeNames"] == names
    assert injected.hits == 0                                     # the filter wrote nothing
    result = await extender.bind(pod, "n1")
    assert injected.hits == 1
    stored = api.get("pods", "p", namespace="default")
    if fault.get("after_apply"):
        assert result == {"Error": ""}, result                    # read back: it is bound
        assert stored["spec"]["nodeName"] == stored["metadata"]["annotations"]["hami.io/vgpu-node"] == "n1"
    else:
        assert result["Error"], result
        assert stored["spec"].get("nodeName") is None
        assert not carried_decision(api, "p")                     # nothing half-applied
        assert pod["metadata"]["uid"] not in app.cache.pods
        assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 0
        assert LOCK_ANNOTATION not in (api.get("nodes", "n1")["metadata"].get("annotations") or {})
    api.faults.clear()    # a hung Binding lands now, late: the pod is bound all the same
    placement = await schedule_with_retries(extender, api, pod, names)
    assert placement.node == "n1", placement
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 20000


async def test_a_late_decision_of_another_node_on_the_pod_is_replaced_by_the_binding(api, app, extender):
    """A decision naming n1 lands on the pod (an older scheduler's patch, resent late) after this
    scheduler's filter placed it on n2: the Binding carries this decision, which replaces the
    other in the same write as spec.nodeName, so the pod runs where its devices are."""
    await add_nodes(api, app, "n1", "n2")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    late = await leave_decision(api, app, extender, pod, "n1")
    assert (await extender.filter(pod, ["n2"]))["NodeNames"] == ["n2"]
    written = api.patch("pods", "p", {"metadata": {"annotations": late}}, namespace="default")   # the late write
    await pod_events_applied(app, written)
    assert app.cache.pods[pod["metadata"]["uid"]].node == "n2"    # the newer reservation holds
    await wait_books_balance(api, app)
    assert (await extender.bind(pod, "n2")) == {"Error": ""}
    stored = api.get("pods", "p", namespace="default")
    assert stored["spec"]["nodeName"] == stored["metadata"]["annotations"]["hami.io/vgpu-node"] == "n2"
    await pod_events_applied(app, stored)
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 0


# ---------------------------------------------------------------------------------------- bind

@pytest.mark.parametrize("status", [500, 429])
@pytest.mark.parametrize("steps", [
    [("POST", "/pods/p/binding$", 504), ("GET", "/pods/p$")],   # the Binding uncertain, its read-back failed
    [("PATCH", "/nodes/n1$")],                       # taking the node lock
    [("PATCH", "/nodes/n1$", 409), ("GET", "/nodes/n1$")],   # lock lost a race, then re-reading the node
    [("POST", "/pods/p/binding$")],                  # the Binding
], ids=["binding-readback", "lock", "lock-reread", "binding"])
async def test_bind_step_failure_undoes_everything_then_retry_binds(api, app, extender, steps, status):
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, names))["NodeNames"] == names
    faults = [api.faults.add(method=method, path=path, status=rest[0] if rest else status,
                             retry_after=1 if status == 429 else None) for method, path, *rest in steps]
    result = await extender.bind(pod, "n1")
    assert all(f.hits == 1 for f in faults) and result["Error"], result
    stored = api.get("pods", "p", namespace="default")
    assert stored["spec"].get("nodeName") is None and not carried_decision(api, "p")
    assert LOCK_ANNOTATION not in (api.get("nodes", "n1")["metadata"].get("annotations") or {})
    placement = await schedule_with_retries(extender, api, pod, names)
    assert placement.node == "n1", placement
    await wait_books_balance(api, app)


async def test_binding_landed_but_every_answer_was_lost(api, app, extender):
    """The Binding commits, its answer is a 504 and the read-back fails too: the bind is
    reported failed and rolled back, yet the pod is bound. The pod's own events (the Binding's,
    the device plugin's) show it bound, and the books charge it again."""
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    await extender.filter(pod, names)
    paused = api.faults.add(method="PATCH", path="/nodes/n1$", hang=True)   # the node lock
    bind = asyncio.create_task(extender.bind(pod, "n1"))
    await wait_for(lambda: paused.hits == 1, what="the bind to reach the node lock")
    api.faults.add(method="POST", path="/binding$", status=504, after_apply=True)
    read_back = api.faults.add(method="GET", path="/pods/p$", status=500)
    api.faults.release()
    result = await bind
    assert result["Error"] and read_back.hits == 1
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "n1"
    await wait_for(lambda: api.get("pods", "p", namespace="default")["metadata"]["annotations"]
                   .get("hami.io/bind-phase") == "success", what="the device plugin to allocate")
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 20000


# ---------------------------------------------------------------------------------------- restart

async def test_api_server_killed_and_restarted_mid_traffic(api, app, extender):
    names = await add_nodes(api, app, "n1", "n2")
    await place(api, app, extender, "before", names, gpumem=10000)
    pods = [api.create("pods", gpu_pod(f"p{i}", gpumem=9000, gpucores=5)) for i in range(12)]
    served = len(api.requests)
    traffic = [asyncio.create_task(extender.schedule(p, names)) for p in pods]
    await wait_for(lambda: len(api.requests) >= served + 6, what="traffic to reach the API server")
    await api.stop()                      # killed: watches and in-flight requests cut
    api.delete("pods", "before", namespace="default")      # changes nobody sees live
    api.create("nodes", gpu_node("n3", gpus=1))
    first = await asyncio.gather(*traffic)
    await api.start(port=api.port)
    assert any(p.error for p in first), "the outage should have failed some requests"
    # kube-scheduler retries them all, concurrently. A node lock taken by a bind that the
    # outage broke (its write landed, its answer lost) is released once the API server answers.
    retried = await asyncio.gather(*(schedule_with_retries(extender, api, pod, names, attempts=60)
                                     for pod, placement in zip(pods, first) if placement.error))
    assert all(r.node or not r.error for r in retried), retried
    await wait_for(lambda: "n3" in app.cache.nodes, what="the node created during the outage")
    await wait_books_balance(api, app)


# ---------------------------------------------------------------------------------------- pods vanish

async def test_a_lock_write_whose_answer_is_lost_is_released_not_left_for_five_minutes(api, app, extender):
    """The lock's compare-and-set lands, but its answer is lost (504 after apply): the bind
    fails, and releases the lock it may hold, so the next bind onto the node goes through at
    once instead of waiting for the lock to expire (before: 5 minutes of node lock contention)."""
    names = await add_nodes(api, app, "n1")
    first = api.create("pods", gpu_pod("first", gpumem=1000))
    assert (await extender.filter(first, names))["NodeNames"] == names
    api.faults.add(method="PATCH", path="/nodes/n1$", status=504, after_apply=True)
    assert (await extender.bind(first, "n1"))["Error"]
    await wait_lock_free(api, "n1", timeout=5)
    second = api.create("pods", gpu_pod("second", gpumem=1000))
    assert (await extender.schedule(second, names)).node == "n1"
    await wait_books_balance(api, app)


async def test_a_lock_release_that_fails_is_retried_once_the_api_server_answers(api, app, extender):
    """The Binding fails and so does every attempt to release the lock (the API server refuses
    node writes for a while): a background task keeps releasing it, and it is gone soon after
    the API server answers again, with no other bind needed to notice."""
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, names))["NodeNames"] == names
    await wait_for(lambda: app.cache.lock_hint("n1") is not None, what="the node watch's view of n1")
    api.faults.add(method="POST", path="/binding$", status=403)
    # The lock is taken on the watch's view, with no read; a release reads the node first.
    refused = api.faults.add(method="GET", path="/nodes/n1$", status=503, times=None)
    assert (await extender.bind(pod, "n1"))["Error"]
    assert refused.hits >= 1
    assert LOCK_ANNOTATION in api.get("nodes", "n1")["metadata"]["annotations"]   # every release failed
    api.faults.clear()
    await wait_lock_free(api, "n1", timeout=10)


async def test_pod_deleted_between_filter_and_bind(api, app, extender):
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, names))["NodeNames"] == names
    api.delete("pods", "p", namespace="default")
    assert await extender.bind(pod, "n1") == {"Error": 'pod "p" not found'}
    await wait_books_balance(api, app)
    assert not app.cache.pods


async def test_pod_deleted_while_its_bind_is_in_flight(api, app, extender):
    names = await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, names))["NodeNames"] == names
    hung = api.faults.add(method="PATCH", path="/nodes/n1$", hang=True)
    task = asyncio.create_task(extender.bind(pod, "n1"))
    await wait_for(lambda: hung.hits == 1, what="the node lock to be in flight")
    api.delete("pods", "p", namespace="default")    # lands while the lock write is held
    api.faults.release()
    result = await task
    # Refused by the Binding (404), or before it once the watch showed the delete.
    assert "not found" in result["Error"] or "no device reservation" in result["Error"], result
    await wait_books_balance(api, app)
    assert not app.cache.pods
    await wait_lock_free(api, "n1")


async def test_pod_recreated_under_the_same_name_between_filter_and_bind(api, app, extender):
    names = await add_nodes(api, app, "n1")
    old = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(old, names))["NodeNames"] == names
    api.delete("pods", "p", namespace="default")
    new = api.create("pods", gpu_pod("p", gpumem=30000))
    result = await extender.bind(old, "n1")
    # Refused by the pod read (the watch showed the delete) or by the Binding's UID precondition.
    assert "uid" in result["Error"].lower(), result
    assert api.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    placement = await schedule_with_retries(extender, api, new, names)
    assert placement.node == "n1"
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 30000


# ---------------------------------------------------------------------------------------- nodes change

async def test_node_deleted_while_pods_run_then_registered_again(api, app, extender):
    names = await add_nodes(api, app, "n1", "n2")
    for i in range(3):
        await place(api, app, extender, f"p{i}", ["n1"], gpumem=10000, gpucores=10)
    node = api.get("nodes", "n1")
    api.delete("nodes", "n1")
    await wait_for(lambda: "n1" not in app.cache.nodes, what="node removed")
    await wait_books_balance(api, app)
    q = api.create("pods", gpu_pod("q", gpumem=1000))
    assert (await extender.filter(q, ["n1"]))["FailedNodes"] == {"n1": "node unregistered"}
    assert (await extender.filter(q, names))["NodeNames"] == ["n2"]
    del node["metadata"]["resourceVersion"], node["metadata"]["uid"]
    api.create("nodes", node)
    await wait_for(lambda: "n1" in app.cache.nodes, what="node back")
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 30000


async def test_registration_changes_under_running_pods(api, app, extender):
    devices = registration("n1", gpus=2, split=4)
    api.create("nodes", gpu_node("n1", devices=devices))
    await wait_for(lambda: "n1" in app.cache.nodes, what="node")
    for i in range(4):
        await place(api, app, extender, f"p{i}", ["n1"], gpumem=10000, gpucores=10)
    held = {d["id"]: d["used"] for d in app.cache.device_usage("n1")}

    def register(devs):
        api.patch("nodes", "n1", {"metadata": {"annotations": {
            "hami.io/node-nvidia-register": orjson.dumps(devs).decode()}}})

    # A device that holds pods disappears from the registration, then comes back.
    register(devices[1:])
    await wait_for(lambda: len(app.cache.device_usage("n1")) == 1, what="device gone")
    await wait_books_balance(api, app)
    register(devices)
    await wait_for(lambda: len(app.cache.device_usage("n1")) == 2, what="device back")
    await wait_books_balance(api, app)
    assert {d["id"]: d["used"] for d in app.cache.device_usage("n1")} == held
    # The split count drops below what is in use: nothing new fits there, nothing is lost.
    register([{**d, "count": 1} for d in devices])
    await wait_for(lambda: app.cache.device_usage("n1")[0]["count"] == 1, what="split count lowered")
    await wait_books_balance(api, app, check_capacity=False)
    result = await extender.filter(api.create("pods", gpu_pod("more", gpumem=1000)), ["n1"])
    assert result["NodeNames"] is None and result["FailedNodes"]["n1"].endswith("CardTimeSlicingExhausted")
    # A garbled registration drops the node's devices until it is fixed; the pods stay charged.
    api.patch("nodes", "n1", {"metadata": {"annotations": {"hami.io/node-nvidia-register": "[{garbled"}}})
    await wait_for(lambda: app.cache.nodes["n1"].decode_error, what="garbled registration seen")
    assert app.cache.device_usage("n1") == []
    register(devices)
    await wait_for(lambda: len(app.cache.device_usage("n1")) == 2, what="registration fixed")
    await wait_books_balance(api, app)
    assert {d["id"]: d["used"] for d in app.cache.device_usage("n1")} == held


# ---------------------------------------------------------------------------------------- same pod twice

async def test_two_concurrent_filters_for_one_pod_leave_one_decision(api, app, extender):
    names = await add_nodes(api, app, "n1", "n2")
    pod = api.create("pods", gpu_pod("p", gpumem=30000, gpucores=30))
    results = await asyncio.gather(extender.filter(pod, ["n1"]), extender.filter(pod, ["n2"]),
                                   extender.filter(pod, names))
    assert all(r["NodeNames"] for r in results)
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for n in names for d in app.cache.device_usage(n)) == 30000
    node = app.cache.pods[pod["metadata"]["uid"]].node
    assert (await extender.bind(pod, node)) == {"Error": ""}
    assert api.get("pods", "p", namespace="default")["metadata"]["annotations"]["hami.io/vgpu-node"] == node
    await wait_books_balance(api, app)


async def test_relist_during_a_refilter_keeps_the_newer_reservation(api, app, extender):
    """The pod carries a decision for n1 (an older scheduler's), this scheduler's filter placed it
    on n2, not bound yet, and the informer relists: the list shows the pod with the n1 decision,
    but the reservation on n2 is newer and must stay charged, or its GPU is handed out twice."""
    await add_nodes(api, app, "n1", "n2", gpus=1)
    pod = api.create("pods", gpu_pod("p", gpumem=FULL_CARD))
    await leave_decision(api, app, extender, pod, "n1")
    uid = pod["metadata"]["uid"]
    assert (await extender.filter(pod, ["n2"]))["NodeNames"] == ["n2"]
    assert app.cache.pods[uid].node == "n2"
    pods = informer_of(app, "pods")
    lists = pods.stats.lists
    api.patch("nodes", "n1", {"metadata": {"labels": {"touched": "yes"}}})   # history moves on
    api.compact()
    api.drop_watches()
    await wait_for(lambda: pods.stats.lists > lists, what="the relist")
    assert app.cache.pods[uid].node == "n2", "the relisted (older) decision replaced the newer one"
    other = api.create("pods", gpu_pod("q", gpumem=FULL_CARD))
    assert (await extender.filter(other, ["n2"]))["NodeNames"] is None   # n2's card is taken
    await wait_books_balance(api, app)
    assert (await extender.bind(pod, "n2")) == {"Error": ""}
    await wait_books_balance(api, app)


async def test_repeated_bind_of_a_bound_pod_changes_nothing(api, app, extender):
    """kube-scheduler lost our answer to /bind and asks again: the pod is bound already, so the
    answer is success, and nothing (lock, bind-phase, books) is touched."""
    await add_nodes(api, app, "n1", "n2")
    pod = await place(api, app, extender, "p", ["n1"], gpumem=20000)
    before = api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"]
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == before
    result = await extender.bind(pod, "n2")
    assert result["Error"] == "pod default/p is already assigned to node n1"
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 20000


async def test_an_event_the_handler_chokes_on_is_skipped_not_retried_forever(api, tmp_path):
    """Resuming the watch from before an event the handler cannot take would meet it again,
    forever, and every later change of every object would be lost: it is skipped and counted."""
    configuration = await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", api.url)))
    client = KubeClient(configuration, qps=0, burst=1000)
    seen = []

    def handler(kind, obj):
        if obj["metadata"]["name"] == "poison":
            raise ValueError("cannot digest this one")
        seen.append(obj["metadata"]["name"])

    watcher = Informer(client=client, path="/api/v1/nodes", on_event=handler,
                       on_relist=lambda items, rv: seen.extend(i["metadata"]["name"] for i in items))
    watcher.start()
    try:
        await wait_for(lambda: watcher.synced.is_set() and api.open_watches, what="watching")
        for name in ("poison", "after"):
            api.create("nodes", gpu_node(name, gpus=1))
        await wait_for(lambda: "after" in seen, what="the event after the poisoned one")
        assert watcher.stats.handler_errors == 1
    finally:
        await watcher.stop()
        await client.close()


async def test_filter_of_a_stale_pod_object_never_decides_for_its_successor(api, app, extender):
    """kube-scheduler filters a pod from its cache after the pod was deleted and re-created under
    the same name: the decision must not land on the new pod (whose UID the reservation does not
    carry), or its devices are charged twice, once for each UID, with nothing to release one."""
    names = await add_nodes(api, app, "n1")
    old = api.create("pods", gpu_pod("p", gpumem=20000))
    api.delete("pods", "p", namespace="default")
    successor = api.create("pods", gpu_pod("p", gpumem=20000))
    await pod_events_applied(app, successor)    # the scheduler knows of the delete and the successor
    result = await extender.filter(old, names)
    assert result["Error"], result
    assert "hami.io/vgpu-node" not in api.get("pods", "p", namespace="default")["metadata"]["annotations"]
    await wait_books_balance(api, app)
    assert not app.cache.pods


def carried_decision(api, name: str) -> dict:
    """The decision annotations and label the pod carries as the API server has it."""
    meta = api.get("pods", name, namespace="default")["metadata"]
    keys = set(decision_keys(build_vendors(DeviceConfig.default())))
    return {**{k: v for k, v in (meta.get("annotations") or {}).items() if k in keys},
            **{f"label:{k}": v for k, v in (meta.get("labels") or {}).items() if k == "hami.io/vgpu-node"}}


async def leave_decision(api, app, extender, pod: dict, node: str) -> dict:
    """Write onto the unbound pod the decision a filter makes for it on ``node``, annotations and
    label, as an older hami-py (whose /filter patched the pod) or upstream's scheduler leaves it;
    wait until the scheduler's watch has seen it. The annotations written."""
    meta = pod["metadata"]
    assert (await extender.filter(pod, [node]))["NodeNames"] == [node]
    decision = dict(app.cache.pods[meta["uid"]].annotations)
    written = api.patch("pods", meta["name"], {"metadata": {"uid": meta["uid"], "annotations": decision,
                                                            "labels": {"hami.io/vgpu-node": node}}},
                        namespace=meta["namespace"])
    await pod_events_applied(app, written)
    return decision


async def rolled_back_then_crowded_out(api, app, extender) -> dict:
    """``first`` carries a decision for n1's one GPU that an older scheduler left (its bind
    failed and was rolled back), and ``second`` takes the whole GPU: ``first`` (returned, as
    kube-scheduler's copy) fits nowhere now."""
    await add_nodes(api, app, "n1", gpus=1)
    first = api.create("pods", gpu_pod("first", gpumem=FULL_CARD))
    await leave_decision(api, app, extender, first, "n1")
    first = api.get("pods", "first", namespace="default")       # kube-scheduler's copy shows it
    api.faults.add(method="POST", path="/binding$", status=500)
    assert (await extender.bind(first, "n1"))["Error"]          # rolled back
    assert carried_decision(api, "first")                        # ...but still on the pod
    await place(api, app, extender, "second", ["n1"], gpumem=FULL_CARD)
    return first


async def test_a_rolled_back_decision_left_on_an_unschedulable_pod_is_not_charged_after_restart(api, app, extender):
    """The filter that finds no node for a pod carrying a void decision clears it from the pod,
    so the annotations, and a scheduler restarted from them, agree with the live books."""
    first = await rolled_back_then_crowded_out(api, app, extender)
    retry = await filtered(app, extender, first, ["n1"])                # kube-scheduler retries: no room now
    assert retry["NodeNames"] is None and not retry["Error"]
    assert carried_decision(api, "first") == {}
    await wait_books_balance(api, app)
    async with running_scheduler(api, device_plugin=False) as restarted:
        await wait_for(lambda: "n1" in restarted.cache.nodes, what="restarted scheduler synced")
        assert restarted.cache.device_usage("n1") == app.cache.device_usage("n1")
    # The pod is placed normally once there is room again.
    api.delete("pods", "second", namespace="default")
    await wait_for(lambda: not app.cache.pods, what="the delete seen")
    placement = await schedule_with_retries(extender, api, api.get("pods", "first", namespace="default"), ["n1"])
    assert placement.node == "n1"
    await wait_books_balance(api, app)


async def test_a_failed_cleanup_of_a_stale_decision_loses_nothing_and_the_next_filter_retries(api, app, extender):
    first = await rolled_back_then_crowded_out(api, app, extender)
    stale = carried_decision(api, "first")
    held = [(d["used"], d["usedmem"]) for d in app.cache.device_usage("n1")]
    assert held == [(1, FULL_CARD)]                              # second only
    fault = api.faults.add(method="PATCH", path="/pods/first$", status=500)
    retry = await filtered(app, extender, first, ["n1"])
    assert fault.hits == 1
    assert retry["NodeNames"] is None and not retry["Error"]   # the filter's answer, untouched
    assert carried_decision(api, "first") == stale
    # The live books still do not charge it, even when an event shows the pod with it again.
    api.patch("pods", "first", {"metadata": {"labels": {"touched": "1"}}}, namespace="default")
    second_uid = api.get("pods", "second", namespace="default")["metadata"]["uid"]
    rv = int(api.patch("pods", "second", {"metadata": {"labels": {"touched": "1"}}},
                       namespace="default")["metadata"]["resourceVersion"])
    await wait_for(lambda: app.cache.pods[second_uid].resource_version == rv, what="both events seen")
    assert [(d["used"], d["usedmem"]) for d in app.cache.device_usage("n1")] == held
    # kube-scheduler's next attempt clears it.
    retry = await filtered(app, extender, first, ["n1"])
    assert retry["NodeNames"] is None and not retry["Error"]
    assert carried_decision(api, "first") == {}
    await wait_books_balance(api, app)


async def test_the_cleanup_never_lands_on_a_pod_that_changed_after_it_was_read(api, app, extender):
    """The cleanup patch carries the resourceVersion it read: whatever happened to the pod in
    between (here a label; a Binding or a newer decision alike), the API server refuses it."""
    first = await rolled_back_then_crowded_out(api, app, extender)
    stale = carried_decision(api, "first")
    hung = api.faults.add(method="PATCH", path="/pods/first$", hang=True)
    retry = await extender.filter(first, ["n1"])                # answered; the cleanup runs after it
    assert retry["NodeNames"] is None and not retry["Error"]
    await wait_for(lambda: hung.hits == 1, what="the cleanup patch in flight")
    busy = await extender.filter(first, ["n1"])
    assert busy["Error"] == "pod default/first: its cleanup is still running (kube-scheduler retries the pod)"
    api.patch("pods", "first", {"metadata": {"labels": {"changed": "meanwhile"}}}, namespace="default")
    api.faults.release()
    await asyncio.wait_for(app.service.settled(), timeout=10)
    assert carried_decision(api, "first") == stale               # 409: nothing removed
    assert api.get("pods", "first", namespace="default")["metadata"]["labels"]["changed"] == "meanwhile"
    retry = await filtered(app, extender, first, ["n1"])                # the next attempt reads afresh
    assert carried_decision(api, "first") == {}
    await wait_books_balance(api, app)


async def test_an_unschedulable_pod_whose_only_decisions_were_reservations_costs_no_request(api, app, extender):
    """kube-scheduler retries an unschedulable pod over and over. Its earlier decisions were this
    scheduler's reservations, never written to the pod (a decision reaches a pod with its Binding
    only): filtering it again where it fits nowhere reads and writes nothing, and its next filter
    is never told that a cleanup still runs."""
    await add_nodes(api, app, "n1", "n2", gpus=1)
    await place(api, app, extender, "other", ["n2"], gpumem=FULL_CARD)
    pod = api.create("pods", gpu_pod("retried", gpumem=FULL_CARD))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]   # reserved, never bound
    served = len(api.requests)
    for _ in range(3):   # n1 is no longer offered (kube-scheduler's own filters): it fits nowhere
        retry = await extender.filter(pod, ["n2"])
        assert retry["NodeNames"] is None and not retry["Error"], retry
    assert not [r for r in list(api.requests)[served:] if "/pods/retried" in r[1]]
    await wait_books_balance(api, app)


async def test_a_stale_copy_of_a_bound_pod_that_fits_nowhere_keeps_its_decision_and_charge(api, app, extender):
    """kube-scheduler filters only unbound pods, but its copy may lag: a filter of a pod that is
    in fact bound must neither clear the decision the device plugin acts on nor leave the
    running pod uncharged."""
    await add_nodes(api, app, "n1", gpus=1)
    created = api.create("pods", gpu_pod("p", gpumem=FULL_CARD))
    placement = await schedule_with_retries(extender, api, created, ["n1"])
    assert placement.node == "n1"
    await wait_for(lambda: "label:hami.io/vgpu-node" in carried_decision(api, "p"), what="the label after the bind")
    decision = carried_decision(api, "p")
    result = await extender.filter(created, ["gone"])           # the stale, unbound copy; no usable node
    assert result["NodeNames"] is None and result["Error"] == "pod default/p is already assigned to node n1"
    assert carried_decision(api, "p") == decision
    assert [(d["used"], d["usedmem"]) for d in app.cache.device_usage("n1")] == [(1, FULL_CARD)]
    await wait_books_balance(api, app)


async def test_a_delete_missed_before_any_pod_event_is_still_seen(api, app, extender):
    """The pods informer listed an empty collection (resourceVersion "0") and has seen no pod
    event since; its watch is cut, and meanwhile a pod it holds a reservation for is deleted.
    A watch resumed from "0" means "from any state" and would never deliver that delete."""
    await add_nodes(api, app, "n1")
    await hold_watches(api)
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    api.delete("pods", "p", namespace="default")
    api.faults.clear()
    await wait_books_balance(api, app)
    assert not app.cache.pods


def filters_waiting(app, uid: str) -> int:
    """Filters queued on the pod's lock behind the one holding it."""
    return app.service.pod_locks.waiting(uid)


async def test_a_filter_of_a_pod_whose_cleanup_is_still_running_never_runs_beside_it(api, app, extender):
    """Filters of one pod, and the work one leaves for after its answer, run one at a time (the
    cache relies on that to tell an older decision from a newer one, and the stale-decision
    cleanup on no newer decision being in flight), and a filter never waits for any of it
    (kube-scheduler's serial cycle waits for the filter): while one filter's cleanup is in
    flight, the next answers at once that it runs, and does nothing. Here the filter finds no
    node for a pod carrying an old decision, and its cleanup's read of the pod hangs."""
    await add_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    uid = pod["metadata"]["uid"]
    await leave_decision(api, app, extender, pod, "n1")
    pod = api.get("pods", "p", namespace="default")            # kube-scheduler's copy shows it
    hung = api.faults.add(method="GET", path="/pods/p$", hang=True, times=None)
    try:
        first = await extender.filter(pod, ["gone"])           # answered before its cleanup
        assert first["NodeNames"] is None and not first["Error"]
        await wait_for(lambda: hung.hits == 1, what="the cleanup's read in flight")
        second = await extender.filter(pod, ["gone"])
        assert second["Error"] == "pod default/p: its cleanup is still running (kube-scheduler retries the pod)"
        assert hung.hits == 1 and filters_waiting(app, uid) == 0, "a second filter ran beside the cleanup"
    finally:
        api.faults.clear()
    await asyncio.wait_for(app.service.settled(), timeout=10)
    assert carried_decision(api, "p") == {}
    third = await filtered(app, extender, pod, ["gone"])        # the pod's lock is free again
    assert third["NodeNames"] is None and not third["Error"]
    await wait_books_balance(api, app)


async def test_shutdown_never_hangs_when_the_registration_keeper_is_woken_at_the_same_moment(app):
    """Stopping cancels the keeper's loop; if something wakes it in the same turn (an event, a
    change of leadership), Python 3.11's asyncio.wait_for returns the wake-up and swallows the
    cancellation, and the stop then waits forever (a SIGTERM that never finishes)."""
    keeper = app.keeper
    keeper.leadership_changed(True)          # wakes the keeper's loop...
    stopping = asyncio.create_task(keeper.stop())   # ...and the cancel lands in the same turn
    try:
        async with asyncio.timeout(5):
            await asyncio.shield(stopping)
    finally:
        # Leave nothing running for the fixture's teardown, within a bound of its own.
        deadline = asyncio.get_running_loop().time() + 5
        while not stopping.done() and asyncio.get_running_loop().time() < deadline:
            keeper._task.cancel()
            await asyncio.sleep(0.01)
        stopping.cancel()                    # a no-op when it finished


async def test_a_decision_whose_cleanup_cannot_read_the_pod_is_not_charged_again_by_its_next_event(api, app, extender):
    """A decision an older scheduler left on the pod (charged); kube-scheduler filters the pod again
    against nodes where it fits nowhere, and the cleanup's read of the pod fails. The filter has
    already dropped the charge; the pod's next event (kube-scheduler's Unschedulable status, in
    life) still carries the decision and must not charge it back: the GPU would stay booked for
    a pod that runs nowhere."""
    await add_nodes(api, app, "n1", "n2", gpus=1)
    api.patch("nodes", "n2", {"metadata": {"annotations": {"hami.io/device-cordon": ",".join(
        d["id"] for d in registration("n2", gpus=1))}}})
    await wait_for(lambda: "n2" in app.cache.annotated_nodes, what="n2's cordon seen")
    pod = api.create("pods", gpu_pod("p", gpumem=FULL_CARD))
    await leave_decision(api, app, extender, pod, "n1")
    assert carried_decision(api, "p") and app.cache.device_usage("n1")[0]["usedmem"] == FULL_CARD
    fault = api.faults.add(method="GET", path="/pods/p$", status=500)
    retry = await filtered(app, extender, pod, ["n2"])          # fits nowhere there: all cordoned
    assert retry["NodeNames"] is None and not retry["Error"] and fault.hits == 1
    api.faults.clear()
    touched = api.patch("pods", "p", {"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}},
                        namespace="default")
    await pod_events_applied(app, touched)
    assert carried_decision(api, "p")                           # still on the pod: the read failed
    assert app.cache.device_usage("n1")[0]["usedmem"] == 0

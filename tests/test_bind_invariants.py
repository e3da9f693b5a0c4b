"""No bind without a live reservation; no bind to a missing node; no work for a caller that left;
no node whose device plugin has not answered yet.

A device pod's annotations are no proof that its devices are free: an older scheduler may have
left a decision on an unbound pod, and its capacity may have gone to the next pod since. The
reservation in the usage cache, made by this scheduler's own /filter for that node, is what a
/bind may trust; without one the answer is an Error that sends kube-scheduler back to /filter.
The /filter itself writes nothing: the decision reaches the pod only with its Binding.
"""
from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import orjson
import pytest

from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import UNBOUND_WINDOW_S, register_nodes, wait_until, watch_applied
from tests.reliability_helpers import finish_allocation, oversubscribed, wait_books_balance

ONE_GPU = {"type": "NVIDIA A10", "devmem": 24000, "devcore": 100}


def no_reservation(pod: str, node: str) -> str:
    return f"pod default/{pod} has no device reservation on node {node} (filter it again)"


async def one_gpu_nodes(api, app, *names: str) -> list[str]:
    return await register_nodes(api, app, *(gpu_node(n, devices=registration(n, gpus=1, model=ONE_GPU))
                                            for n in names))


def events_of(api, pod: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in api.list("events", namespace="default")
            if e["involvedObject"]["name"] == pod]


async def wait_event(api, pod: str, reason: str, message: str) -> None:
    await wait_until(lambda: (reason, message) in events_of(api, pod),
                     f"{reason} '{message}' on {pod}; have {events_of(api, pod)}")


def node_of(api, pod: str) -> str | None:
    return api.get("pods", pod, namespace="default")["spec"].get("nodeName")


def plain_pod(name: str) -> dict:
    """A pod that asks for no managed device."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def used_mem(app, node: str) -> int:
    return sum(d["usedmem"] for d in app.cache.device_usage(node))


# -------------------------------------------------------------------- 1. the bind invariant

async def test_a_bind_retried_after_a_failed_bind_is_refused_until_filtered_again(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    api.faults.add(method="POST", path="/binding$", status=500)
    assert (await extender.bind(pod, "n1"))["Error"]
    assert used_mem(app, "n1") == 0                       # rolled back
    # The decision went with the Binding that failed: nothing of it is on the pod, and a bind
    # retried as it is finds no reservation to bind.
    assert "hami.io/vgpu-node" not in (api.get("pods", "p", namespace="default")["metadata"].get("annotations") or {})
    assert (await extender.bind(pod, "n1")) == {"Error": no_reservation("p", "n1")}
    assert node_of(api, "p") is None
    await wait_event(api, "p", "BindingFailed", no_reservation("p", "n1"))
    # kube-scheduler filters it again, and then the bind goes through.
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert (await extender.bind(pod, "n1")) == {"Error": ""}
    assert node_of(api, "p") == "n1" and used_mem(app, "n1") == 20000


async def test_a_bind_refuses_devices_another_schedulers_bind_took_after_the_filter(api, app, extender):
    """A pod bound onto our reservation's GPU by someone else after our filter (a former leader
    whose bind landed after we took over, another scheduler): our bind finds the GPU charged
    beyond what it has once the node lock is held, and sends its pod back to /filter."""
    await one_gpu_nodes(api, app, "n1")
    ours = api.create("pods", gpu_pod("ours", gpumem=20000))
    assert (await extender.filter(ours, ["n1"]))["NodeNames"] == ["n1"]
    [device] = app.cache.device_usage("n1")
    foreign = gpu_pod("foreign", gpumem=20000)
    text = f"{device['id']},NVIDIA,20000,0:;"
    foreign["metadata"]["annotations"] = {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": text,
                                          "hami.io/vgpu-devices-to-allocate": text, "hami.io/bind-phase": "success"}
    foreign["spec"]["nodeName"] = "n1"
    created = api.create("pods", foreign)
    await wait_until(lambda: app.cache.bound_node(created["metadata"]["uid"]) == "n1", "the foreign pod charged")
    assert (await extender.bind(ours, "n1")) == {"Error": no_reservation("ours", "n1")}
    assert node_of(api, "ours") is None
    assert used_mem(app, "n1") == 20000 and not oversubscribed(api, app, bound_only=True)


async def test_a_retried_bind_never_lands_on_capacity_another_pod_took(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    first = api.create("pods", gpu_pod("first", gpumem=20000))
    assert (await extender.filter(first, ["n1"]))["NodeNames"] == ["n1"]
    api.faults.add(method="POST", path="/binding$", status=500)
    assert (await extender.bind(first, "n1"))["Error"]
    second = api.create("pods", gpu_pod("second", gpumem=20000))
    assert (await extender.filter(second, ["n1"]))["NodeNames"] == ["n1"]
    assert (await extender.bind(second, "n1")) == {"Error": ""}
    finish_allocation(api, "second", "n1")
    assert (await extender.bind(first, "n1")) == {"Error": no_reservation("first", "n1")}
    assert node_of(api, "first") is None
    assert not oversubscribed(api, app, bound_only=True)
    # Filtered again, it fits nowhere: the GPU is the second pod's.
    again = await extender.filter(first, ["n1"])
    assert again["NodeNames"] is None and "CardInsufficientMemory" in again["FailedNodes"]["n1"]
    await wait_books_balance(api, app)


async def test_a_pod_never_filtered_or_filtered_elsewhere_is_not_bound(api, app, extender):
    await one_gpu_nodes(api, app, "n1", "n2")
    never = api.create("pods", gpu_pod("never", gpumem=1000))
    assert (await extender.bind(never, "n1")) == {"Error": no_reservation("never", "n1")}
    elsewhere = api.create("pods", gpu_pod("elsewhere", gpumem=1000))
    assert (await extender.filter(elsewhere, ["n2"]))["NodeNames"] == ["n2"]
    assert (await extender.bind(elsewhere, "n1")) == {
        "Error": "pod default/elsewhere was scheduled to node n2, bind request names node n1"}
    assert node_of(api, "never") is None and node_of(api, "elsewhere") is None
    assert LOCK_ANNOTATION not in api.get("nodes", "n1")["metadata"]["annotations"]
    # The reservation on n2 is untouched by the refused bind, and still binds there.
    assert used_mem(app, "n2") == 1000
    assert (await extender.bind(elsewhere, "n2")) == {"Error": ""}


async def test_a_decision_lost_to_a_restart_is_filtered_again_before_it_binds(api):
    api.create("nodes", gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU)))
    async with running_scheduler(api) as first:
        await wait_until(lambda: "n1" in first.cache.node_index_of, "n1 registered")
        pod = api.create("pods", gpu_pod("p", gpumem=1000))
        async with aiohttp.ClientSession() as session:
            assert (await ExtenderClient(first.url, session=session).filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    # The filter wrote nothing: the decision went with the first process.
    assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    async with running_scheduler(api) as second:
        async with aiohttp.ClientSession() as session:
            extender = ExtenderClient(second.url, session=session)
            # The restarted scheduler finds nothing to charge and made no decision.
            assert used_mem(second, "n1") == 0
            assert (await extender.bind(pod, "n1")) == {"Error": no_reservation("p", "n1")}
            assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            assert (await extender.bind(pod, "n1")) == {"Error": ""}
            assert node_of(api, "p") == "n1" and used_mem(second, "n1") == 1000


async def test_a_pod_without_device_requests_is_bound_as_before(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    plain = api.create("pods", plain_pod("plain"))
    assert (await extender.bind(plain, "n1")) == {"Error": ""}
    assert node_of(api, "plain") == "n1"
    assert LOCK_ANNOTATION not in api.get("nodes", "n1")["metadata"]["annotations"]


async def test_a_filter_of_a_pod_whose_bind_is_in_flight_answers_at_once_and_keeps_its_devices(api, app, extender):
    """A second profile (or a retry) filters the pod while its Binding is on the wire: the filter
    does not queue behind the bind (kube-scheduler's serial cycle, and every other pod, would wait
    with it) but answers at once that the bind is running, and releases nothing; once bound, a
    filter answers that the pod is bound."""
    await one_gpu_nodes(api, app, "n1", "n2")
    pod = api.create("pods", gpu_pod("p", gpumem=20000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    hung = api.faults.add(method="POST", path="/binding$", hang=True)
    bind = asyncio.create_task(extender.bind(pod, "n1"))
    await wait_for(lambda: hung.hits == 1, what="the Binding in flight")
    refilter = await extender.filter(pod, ["n1", "n2"])
    assert refilter["Error"] == "pod default/p: its bind is still running (kube-scheduler retries the pod)"
    assert refilter["NodeNames"] is None and not bind.done()
    assert used_mem(app, "n1") == 20000 and used_mem(app, "n2") == 0
    api.faults.release()
    assert (await bind) == {"Error": ""}
    assert (await extender.filter(pod, ["n1", "n2"]))["Error"] == "pod default/p is already assigned to node n1"
    assert used_mem(app, "n1") == 20000 and used_mem(app, "n2") == 0
    finish_allocation(api, "p", "n1")
    await wait_books_balance(api, app)


# -------------------------------------------------------------------- 2. a node that does not exist

async def test_a_bind_to_a_node_that_does_not_exist_fails_and_leaves_the_pod_unbound(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    plain = api.create("pods", plain_pod("plain"))
    assert (await extender.bind(plain, "ghost")) == {"Error": "failed to get node ghost"}
    assert node_of(api, "plain") is None
    await wait_event(api, "plain", "BindingFailed", "failed to get node ghost")
    gpu = api.create("pods", gpu_pod("gpu", gpumem=1000))
    assert (await extender.bind(gpu, "ghost")) == {"Error": "failed to get node ghost"}
    assert node_of(api, "gpu") is None


async def test_a_node_deleted_between_filter_and_bind(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    api.delete("nodes", "n1")
    await wait_until(lambda: "n1" not in app.cache.nodes, "n1 gone from the cache")
    assert (await extender.bind(pod, "n1")) == {"Error": "failed to get node n1"}
    assert node_of(api, "p") is None
    await wait_event(api, "p", "BindingFailed", "failed to get node n1")
    assert "p" not in {r.name for r in app.cache.pods.values()}


# -------------------------------------------------------------------- 3. callers that left

def filter_body(pod: dict, nodes: list[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "NodeNames": nodes, "Nodes": None})


async def post_and_give_up(url: str, body: bytes, *, timeout: float | None = None, cancel_when=None) -> None:
    """POST /filter as kube-scheduler does, and leave: after ``timeout`` seconds (its httpTimeout),
    or by closing the connection once ``cancel_when()`` holds."""
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(session.post(f"{url}/filter", data=body,
                                                     headers={"Content-Type": "application/json"},
                                                     timeout=aiohttp.ClientTimeout(total=timeout)))
        if timeout is not None:
            try:
                await request
                raise AssertionError("the filter answered; it was expected to wait")
            except asyncio.TimeoutError:
                return
        await wait_for(cancel_when, what="the filter to wait")
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)


def untouched(api, app, name: str) -> bool:
    """No reservation, no decision on the pod, no event about it."""
    pod = api.get("pods", name, namespace="default")
    return (pod["metadata"]["uid"] not in app.cache.pods
            and "hami.io/vgpu-node" not in (pod["metadata"].get("annotations") or {})
            and not events_of(api, name))


def parked(app) -> int:
    """/filter requests waiting for the replica to be synced and leading (Event._waiters)."""
    return len(app.service.synced._waiters)


async def test_a_filter_whose_caller_timed_out_waiting_for_the_sync_never_runs(api):
    api.create("nodes", gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU)))
    api.faults.add(method="GET", path="^/api/v1/pods$", status=500, times=None)   # no sync yet
    # The other pod is never bound: its FilteringSucceed comes after a short window.
    options = embedded_options(filtering_succeed_window_s=UNBOUND_WINDOW_S)
    async with running_scheduler(api, options=options, wait_ready=False, device_plugin=False) as app:
        pod = api.create("pods", gpu_pod("p", gpumem=1000))
        # kube-scheduler's httpTimeout runs out while the filter waits.
        await post_and_give_up(app.url, filter_body(pod, ["n1"]), timeout=0.5)
        await wait_for(lambda: parked(app) == 0, what="the waiting filter to be cancelled")
        api.faults.clear()
        await wait_until(lambda: app.ready, "sync", timeout=30)
        # Proof that the scheduler is serving by now: another pod's filter is answered.
        other = api.create("pods", gpu_pod("other", gpumem=1000))
        async with aiohttp.ClientSession() as session:
            assert (await ExtenderClient(app.url, session=session).filter(other, ["n1"]))["NodeNames"] == ["n1"]
        await wait_until(lambda: events_of(api, "other"), "the other pod's event")
        assert untouched(api, app, "p")
        assert used_mem(app, "n1") == 1000


async def test_a_follower_drops_a_filter_whose_caller_disconnected_before_it_led(api):
    namespace, lease = "hami-system", "hami-scheduler"

    def lease_held_by(holder: str) -> dict:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease, "namespace": namespace},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3600,
                         "renewTime": "2026-01-01T00:00:00.000000Z"}}
    api.create("leases", lease_held_by("someone-else_1"))
    api.create("nodes", gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU)))
    options = embedded_options(leader_elect=True, leader_elect_resource_name=lease,
                               leader_elect_resource_namespace=namespace, hostname="b",
                               filtering_succeed_window_s=UNBOUND_WINDOW_S)   # "other" is never bound
    async with AsyncExitStack() as stack:
        app = await stack.enter_async_context(running_scheduler(api, options=options, device_plugin=False))
        await wait_for(lambda: app.leadership.synced.is_set() and "n1" in app.cache.node_index_of,
                       what="the Lease and the node read")
        pod = api.create("pods", gpu_pod("p", gpumem=1000))
        await post_and_give_up(app.url, filter_body(pod, ["n1"]), cancel_when=lambda: parked(app) == 1)
        await wait_for(lambda: parked(app) == 0, what="the parked filter to be cancelled")
        api.update("leases", {**api.get("leases", lease, namespace=namespace),
                              "spec": lease_held_by("b_2")["spec"]})
        await wait_for(lambda: app.service.synced.is_set(), what="b to lead")
        other = api.create("pods", gpu_pod("other", gpumem=1000))
        async with aiohttp.ClientSession() as session:
            assert (await ExtenderClient(app.url, session=session).filter(other, ["n1"]))["NodeNames"] == ["n1"]
        await wait_until(lambda: events_of(api, "other"), "the other pod's event")
        assert untouched(api, app, "p")


async def test_a_filter_during_the_same_pods_failing_bind_decides_nothing(api, app, extender):
    """The pod's bind holds the pod's lock (its node lock write hangs, then its Binding fails): a
    filter of the pod meanwhile answers at once and decides nothing, so nothing is reserved after."""
    await one_gpu_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    hung = api.faults.add(method="PATCH", path="/nodes/n1$", hang=True)
    api.faults.add(method="POST", path="/binding$", status=500)
    bind = asyncio.create_task(extender.bind(pod, "n1"))
    await wait_for(lambda: hung.hits == 1, what="the bind's node lock in flight")
    assert "its bind is still running" in (await extender.filter(pod, ["n1"]))["Error"]
    api.faults.release()
    assert (await bind)["Error"]
    assert used_mem(app, "n1") == 0 and node_of(api, "p") is None
    await wait_until(lambda: any(r == "BindingFailed" for r, _ in events_of(api, "p")), "BindingFailed")
    filtered = [e for e in events_of(api, "p") if e[0] == "FilteringSucceed"]
    assert len(filtered) == 1, filtered       # the refused filter never decided
    await wait_books_balance(api, app)


@pytest.mark.parametrize("scheduler_options", [embedded_options(filtering_succeed_window_s=UNBOUND_WINDOW_S)])
async def test_a_decision_nobody_binds_leaves_the_pod_untouched_and_the_next_filter_replaces_it(api, app, extender):
    """kube-scheduler asked /filter and never bound (its caller left, another plugin refused the
    node): nothing was written, the reservation holds until the pod's next filter replaces it."""
    await one_gpu_nodes(api, app, "n1", "n2")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    await post_and_give_up(app.url, filter_body(pod, ["n1"]), cancel_when=lambda: pod["metadata"]["uid"] in app.cache.pods)
    await wait_until(lambda: events_of(api, "p"), "the FilteringSucceed event")
    assert api.get("pods", "p", namespace="default")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert used_mem(app, "n1") == 1000
    assert (await extender.filter(pod, ["n2"]))["NodeNames"] == ["n2"]
    assert used_mem(app, "n1") == 0 and used_mem(app, "n2") == 1000
    assert (await extender.bind(pod, "n1")) == {
        "Error": "pod default/p was scheduled to node n2, bind request names node n1"}
    assert (await extender.bind(pod, "n2")) == {"Error": ""}
    await wait_books_balance(api, app)


# -------------------------------------------------------------------- 4. an unanswered handshake

async def test_a_node_first_seen_requesting_a_handshake_with_nothing_allocatable_is_not_used(api, app, extender):
    node = gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU),
                    annotations={"hami.io/node-handshake": "Requesting_2026-12-01 10:00:00"})
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    node["status"]["capacity"]["nvidia.com/gpu"] = "0"
    api.create("nodes", node)
    await wait_until(lambda: "n1" in app.cache.nodes, "n1 seen")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    result = await extender.filter(pod, ["n1"])
    assert result["NodeNames"] is None and result["FailedNodes"] == {"n1": "node unregistered"}, result
    # The plugin answers: the node is used.
    answered = api.patch("nodes", "n1", {"metadata": {"annotations": {"hami.io/node-handshake": "Reported 2026-12-01 10:00:01"}}})
    await watch_applied(app, "nodes", answered["metadata"]["resourceVersion"])
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]


async def test_a_node_first_seen_requesting_with_allocatable_devices_is_used(api, app, extender):
    node = gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU),
                    annotations={"hami.io/node-handshake": "Requesting_2099-12-01 10:00:00"})
    api.create("nodes", node)
    await wait_until(lambda: "n1" in app.cache.node_index_of, "n1 registered")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]


@pytest.mark.parametrize("scheduler_options", [embedded_options(bind_answer_s=0.5)])
async def test_a_bind_is_answered_in_time_whatever_it_waits_for_and_runs_on_to_its_end(api, app, extender):
    """kube-scheduler gives up on a /bind after its httpTimeout: a bind whose Binding hangs is
    answered within the bind's answer time (here 0.5 s) with what it is doing, runs on to its end,
    keeps the pod's lock until then (the pod's next filter answers at once), and binds the pod."""
    await one_gpu_nodes(api, app, "n1")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    hung = api.faults.add(method="POST", path="/binding$", hang=True)
    answer = await extender.bind(pod, "n1")
    assert answer == {"Error": "bind of pod default/p to node n1 is still running after 500ms; "
                               "its outcome goes to the pod's events"}
    assert hung.hits == 1
    assert "its bind is still running" in (await extender.filter(pod, ["n1"]))["Error"]
    # A second bind of the pod meanwhile waits for the first one's lock, and is answered in time too.
    assert (await extender.bind(pod, "n1")) == {"Error": "pod default/p: another bind of it is still running after 500ms"}
    api.faults.release()
    await wait_until(lambda: node_of(api, "p") == "n1", "the bind carried on to its end")
    await wait_until(lambda: not app.service.pod_locks.waiting(pod["metadata"]["uid"])
                     and not len(app.service.pod_locks), "the pod's lock released")
    assert used_mem(app, "n1") == 1000
    finish_allocation(api, "p", "n1")
    await wait_books_balance(api, app)

"""``POST /refit`` (NUMA refit) against the in-repo API server: callers, rules and the books.

The device plugin of the pod's node asks the scheduler to move a container's pending devices onto
the ones kubelet's Topology Manager allows (scheduling/verbs/refit.py). The API server's own part (a
real TokenReview of a real bound ServiceAccount token) is proven in tests/test_real_k8s_refit.py;
here the in-repo server's TokenReview answers for tokens the test gives it, so that every rule,
fault and the books can be checked.
"""
from __future__ import annotations

import aiohttp
import orjson
import pytest

from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.families import BY_KEY, demo_pods
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import T4, gpu_node, gpu_pod, gpu_uuid
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import assert_books_balance, bind_placed, pod_events_applied, register_nodes, wait_until

PLUGIN_NS, PLUGIN_SA = "hami-system", "hami-device-plugin"
PLUGIN_USER = f"system:serviceaccount:{PLUGIN_NS}:{PLUGIN_SA}"
TO_ALLOCATE, ALLOCATED = "hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated"


@pytest.fixture
def scheduler_options():
    return embedded_options(device_plugin_namespace=PLUGIN_NS, device_plugin_service_account=PLUGIN_SA)


@pytest.fixture
async def app(api, scheduler_options):
    # No simulated device plugin: the pods' allocations stay pending, as when kubelet asks for them.
    async with running_scheduler(api, options=scheduler_options, device_plugin=False) as running:
        yield running


def plugin_pod(api, node: str, *, namespace: str = PLUGIN_NS, token: str, user: str = PLUGIN_USER) -> dict:
    """The device plugin's pod on ``node`` and its bound ServiceAccount token."""
    pod = api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                              "metadata": {"name": f"device-plugin-{node}", "namespace": namespace},
                              "spec": {"nodeName": node, "serviceAccountName": PLUGIN_SA,
                                       "containers": [{"name": "plugin", "image": "hami"}]}})
    api.add_token(token, user, pod=pod)
    return pod


async def refit(app, body: dict, *, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{app.cluster_url}/refit", data=orjson.dumps(body), headers=headers) as r:
            return r.status, await r.json()


async def placed(api, app, extender, name: str, node: str, *, gpumem: int = 4000, **kw) -> dict:
    """A pod filtered and bound onto ``node``, its allocation still pending; the lock its bind
    took is released as a device plugin would, once it is done."""
    pod = api.create("pods", gpu_pod(name, gpumem=gpumem, **kw))
    result = await extender.filter(pod, [node])
    assert result["NodeNames"] == [node], result
    stored = await bind_placed(api, app, extender, pod, result)
    api.patch("nodes", node, {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})
    await wait_until(lambda: app.cache.lock_hint(node)[0] is None, "the lock release seen")
    return stored


def request_for(pod: dict, node: str, allowed: list[str], *, container: int = 0) -> dict:
    meta = pod["metadata"]
    return {"podUID": meta["uid"], "podNamespace": meta["namespace"], "podName": meta["name"], "nodeName": node,
            "containerIndex": container, "containerName": pod["spec"]["containers"][container]["name"],
            "deviceType": "NVIDIA", "allowedDeviceUUIDs": allowed}


def gpu_of(pod: dict) -> str:
    return pod["metadata"]["annotations"][ALLOCATED].split(",", 1)[0]


def used_mem(app, node: str) -> list[int]:
    return [d["usedmem"] for d in app.cache.device_usage(node)]


async def two_gpu_node(api, app) -> list[str]:
    return await register_nodes(api, app, gpu_node("n1", gpus=2, model=T4), gpu_node("n2", gpus=2, model=T4))


# ---------------------------------------------------------------------------------------------
# callers
# ---------------------------------------------------------------------------------------------

async def test_no_token_is_401_and_a_token_nobody_issued_is_401(api, app, extender):
    await two_gpu_node(api, app)
    pod = await placed(api, app, extender, "p", "n1")
    body = request_for(pod, "n1", [gpu_uuid("n1", 1)])
    status, answer = await refit(app, body, token=None)
    assert (status, answer) == (401, {"succeeded": False,
                                      "failureReason": "caller authentication failed: no bearer token"})
    status, answer = await refit(app, body, token="forged")
    assert status == 401 and answer["failureReason"] == "caller authentication failed: invalid bearer token"
    assert api.get("pods", "p")["metadata"]["annotations"] == pod["metadata"]["annotations"]


async def test_a_token_that_is_not_the_device_plugins_is_403(api, app, extender):
    await two_gpu_node(api, app)
    pod = await placed(api, app, extender, "p", "n1")
    plugin_pod(api, "n1", namespace="default", token="other", user="system:serviceaccount:default:default")
    status, answer = await refit(app, request_for(pod, "n1", [gpu_uuid("n1", 1)]), token="other")
    assert status == 403
    assert answer["failureReason"] == ("caller authentication failed: system:serviceaccount:default:default is not "
                                       f"the device plugin's ServiceAccount {PLUGIN_USER}")
    api.add_token("unbound", PLUGIN_USER)   # the right account, but a token bound to no pod
    status, answer = await refit(app, request_for(pod, "n1", [gpu_uuid("n1", 1)]), token="unbound")
    assert (status, answer["failureReason"]) == (403, "caller authentication failed: the token is not bound to a pod")


async def test_the_device_plugin_of_another_node_is_403(api, app, extender):
    await two_gpu_node(api, app)
    pod = await placed(api, app, extender, "p", "n1")
    plugin_pod(api, "n2", token="n2-plugin")
    status, answer = await refit(app, request_for(pod, "n1", [gpu_uuid("n1", 1)]), token="n2-plugin")
    assert status == 403
    assert answer["failureReason"] == (f"caller authentication failed: device plugin pod {PLUGIN_NS}/device-plugin-n2 "
                                       "runs on node n2, not n1")
    assert api.get("pods", "p")["metadata"]["annotations"] == pod["metadata"]["annotations"]


async def test_without_the_device_plugin_account_the_refit_is_not_configured(api):
    async with running_scheduler(api, options=embedded_options(), device_plugin=False) as app:
        status, answer = await refit(app, {}, token="anything")
    assert status == 503 and answer["failureReason"].startswith("NUMA refit is not configured")


# ---------------------------------------------------------------------------------------------
# the refit and the books
# ---------------------------------------------------------------------------------------------

async def test_the_device_plugin_moves_a_pending_allocation_onto_the_allowed_gpu(api, app, extender):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    pod = await placed(api, app, extender, "p", "n1")
    old = gpu_of(pod)
    other = next(gpu_uuid("n1", i) for i in range(2) if gpu_uuid("n1", i) != old)
    status, answer = await refit(app, request_for(pod, "n1", [other]), token="n1-plugin")
    assert status == 200 and answer["succeeded"] is True, answer
    assert answer["containerDevices"].startswith(f"{other},NVIDIA,4000,")
    stored = api.get("pods", "p")
    annotations = stored["metadata"]["annotations"]
    assert annotations[TO_ALLOCATE] == answer["containerDevices"] + ";"
    assert gpu_of(stored) == other
    await pod_events_applied(app, stored)
    usage = {d["id"]: d["usedmem"] for d in app.cache.device_usage("n1")}
    assert usage[other] == 4000 and usage[old] == 0
    assert_books_balance(app)          # the books equal a recount from the pods as stored
    # Asked again with the devices it has now: nothing to do.
    status, again = await refit(app, request_for(stored, "n1", [other]), token="n1-plugin")
    assert (status, again) == (200, {"succeeded": True, "containerDevices": answer["containerDevices"]})


async def test_a_refit_onto_a_full_gpu_is_refused_and_changes_nothing(api, app, extender):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    first = await placed(api, app, extender, "first", "n1", gpumem=T4["devmem"])   # fills one T4
    second = await placed(api, app, extender, "second", "n1", gpumem=4000)
    assert gpu_of(first) != gpu_of(second)
    before = used_mem(app, "n1")
    status, answer = await refit(app, request_for(second, "n1", [gpu_of(first)]), token="n1-plugin")
    assert status == 200 and answer["succeeded"] is False
    assert answer["failureReason"].startswith("no allowed device fits container 0: "), answer
    assert "CardInsufficientMemory" in answer["failureReason"]
    assert api.get("pods", "second")["metadata"]["annotations"] == second["metadata"]["annotations"]
    assert used_mem(app, "n1") == before
    assert_books_balance(app)


async def test_a_refit_whose_patch_fails_puts_the_books_back(api, app, extender):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    pod = await placed(api, app, extender, "p", "n1")
    other = next(gpu_uuid("n1", i) for i in range(2) if gpu_uuid("n1", i) != gpu_of(pod))
    before = used_mem(app, "n1")
    fault = api.faults.add(method="PATCH", path="/pods/p$", status=500)
    status, answer = await refit(app, request_for(pod, "n1", [other]), token="n1-plugin")
    assert fault.hits == 1 and status == 200 and answer["succeeded"] is False
    assert answer["failureReason"].startswith("pod default/p: refit not written: "), answer
    assert used_mem(app, "n1") == before
    assert api.get("pods", "p")["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert_books_balance(app)


async def test_an_allocation_the_device_plugin_has_taken_is_not_refitted(api, app, extender):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    pod = await placed(api, app, extender, "p", "n1")
    taken = api.patch("pods", "p", {"metadata": {"annotations": {TO_ALLOCATE: ";", "hami.io/bind-phase": "success"}}})
    await pod_events_applied(app, taken)
    status, answer = await refit(app, request_for(pod, "n1", [gpu_uuid("n1", 1), gpu_uuid("n1", 0)]),
                                 token="n1-plugin")
    assert status == 200 and answer == {
        "succeeded": False, "failureReason": "pod default/p has no pending NVIDIA allocation for container 0 "
                                             "(its device plugin has taken it already)"}


@pytest.mark.parametrize("change, reason", [
    ({"podUID": "not-a-pod"}, "pod default/p with uid not-a-pod is not tracked by the scheduler"),
    ({"nodeName": "n2"}, None),   # the caller is n1's plugin: refused as a caller first
    ({"containerIndex": 3}, "container index 3 is outside the pod's containers (1)"),
    ({"containerName": "sidecar"}, "container 0 is 'main', not 'sidecar'"),
    ({"deviceType": "Quantum"}, "unknown device type 'Quantum'"),
])
async def test_requests_that_do_not_match_the_pod_are_refused(api, app, extender, change, reason):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    pod = await placed(api, app, extender, "p", "n1")
    body = {**request_for(pod, "n1", [gpu_uuid("n1", 1)]), **change}
    status, answer = await refit(app, body, token="n1-plugin")
    if reason is None:
        assert status == 403
    else:
        assert (status, answer) == (200, {"succeeded": False, "failureReason": reason})
    assert api.get("pods", "p")["metadata"]["annotations"] == pod["metadata"]["annotations"]


@pytest.mark.parametrize("body, reason", [
    ({"nodeName": "n1"}, "incomplete refit request: podUID, podNamespace, podName, deviceType, containerIndex "
                         "missing or invalid"),
    ({"nodeName": "n1", "podUID": "u", "podNamespace": "d", "podName": "p", "deviceType": "NVIDIA",
      "containerIndex": 0, "allowedDeviceUUIDs": []}, "empty allowed device set"),
])
async def test_incomplete_requests_are_400(api, app, body, reason):
    await two_gpu_node(api, app)
    plugin_pod(api, "n1", token="n1-plugin")
    status, answer = await refit(app, body, token="n1-plugin")
    assert (status, answer) == (400, {"succeeded": False, "failureReason": reason})


# ---------------------------------------------------------------------------------------------
# every family of the shared to-allocate/allocated pair
# ---------------------------------------------------------------------------------------------

# Families whose decision is the shared to-allocate/allocated pair are refitted; the others are
# refused with the annotations the refit would have to rewrite (and nothing changes).
REFITTED = ["z100", "mr-v100", "mi300x", "metax-gpu", "kunlun-vxpu"]
REFUSED = {"mlu370": "MLU allocations are written in annotations the NUMA refit does not rewrite "
                     "(CAMBRICON_DSMLU_ASSIGNED, CAMBRICON_DSMLU_PROFILE)",
           "ascend910b3": "Ascend910B3 allocations are written in annotations the NUMA refit does not rewrite "
                          "(huawei.com/Ascend910B3, predicate-time)"}


@pytest.mark.parametrize("key", REFITTED + sorted(REFUSED))
async def test_other_families_are_refitted_or_refused_by_name(api, key):
    model = BY_KEY[key]
    options = embedded_options(device_plugin_namespace=PLUGIN_NS, device_plugin_service_account=PLUGIN_SA,
                               enable_ascend=True, enable_iluvatar=True)
    async with running_scheduler(api, options=options, device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            await register_nodes(api, app, model.node("n1", devices=2))
            plugin_pod(api, "n1", token="n1-plugin")
            pod = demo_pods(model, "default")[0]
            pod["spec"]["schedulerName"] = "hami-scheduler"
            created = api.create("pods", pod)
            result = await extender.filter(created, ["n1"])
            assert result["NodeNames"] == ["n1"], result
            stored = await bind_placed(api, app, extender, created, result)
        finally:
            await extender.close()
        devices = [d.id for d in app.cache.nodes["n1"].devices]
        held = {d.id for d in devices_of(app, stored)}
        others = [d for d in devices if d not in held]
        status, answer = await refit(app, {**request_for(stored, "n1", others), "deviceType": model.vendor_key},
                                     token="n1-plugin")
        assert status == 200
        if key in REFUSED:
            assert answer == {"succeeded": False, "failureReason": REFUSED[key]}
            assert api.get("pods", stored["metadata"]["name"])["metadata"]["annotations"] == \
                stored["metadata"]["annotations"]
        else:
            assert answer["succeeded"] is True, answer
            assert answer["containerDevices"].split(",", 1)[0] in others
            refitted = api.get("pods", stored["metadata"]["name"])
            await pod_events_applied(app, refitted)
            assert {d.id for d in devices_of(app, refitted)} <= set(others)
        assert_books_balance(app)


def devices_of(app, pod: dict):
    usage = app.cache.pods[pod["metadata"]["uid"]]
    return [app.cache.nodes[usage.node].devices[j - app.cache.nodes[usage.node].offset] for j in usage.resolved]

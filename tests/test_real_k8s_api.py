"""hami-scheduler against a real kube-apiserver (v1.36, RBAC on), as its own ServiceAccount.

The scheduler runs with a token of ``hami-system/hami-scheduler`` minted through the TokenRequest
API and the permissions manifests/rbac.yaml grants, nothing more: every test fails on any 403
the audit log shows for that account (tests/realk8s_fixtures.py). The test plays kube-scheduler
(/filter, then /bind) and, where said, the device plugin (the stand-in of
hami_py/fakeapi/deviceplugin.py, through the API as the admin).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options, wait_for
from hami_py.fakeapi.deviceplugin import SimulatedDevicePlugin
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod, registration
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from hami_py.k8s.registration import COMPONENT_LABEL, ROLE_LABEL, is_requesting
from tests.conftest import HANDSHAKE
from tests.realk8s import SA_NAMESPACE, real_scheduler, wait_books_balance, wait_for_value

pytestmark = pytest.mark.real_k8s

T4 = {"type": "NVIDIA T4", "devmem": 10000, "devcore": 100}   # round numbers


async def registered(app, names: list[str]) -> None:
    await wait_for(lambda: all(n in app.cache.node_index_of for n in names), timeout=20,
                   what=f"nodes {names} in the scheduler's cache")


async def create_pod(kube, namespace: str, name: str, **kw) -> dict:
    return await kube.create("pods", gpu_pod(name, namespace=namespace, **kw))


def annotations(obj: dict | None) -> dict:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


async def test_filter_reserves_and_bind_locks_binds_with_the_decision_and_hands_over(control_plane, real_kube,
                                                                                    real_namespace, real_nodes):
    """The whole path with the real admission chain and storage: the filter writes nothing, the
    lock by compare-and-set, the Binding whose annotations (the decision and the bind-phase) and
    vgpu-node label the real API server copies onto the pod with spec.nodeName (no pod patch), and
    the device plugin's half (the stand-in) releasing the lock."""
    (node,) = await real_nodes(1, gpus=2)
    ns = real_namespace
    audit_from = control_plane.audit_size()
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None) as app:
        await registered(app, [node])
        extender = ExtenderClient(app.url)
        try:
            pod = await create_pod(real_kube, ns, "trainer", gpumem=3000, gpucores=25)
            result = await extender.filter(pod, [node])
            assert (result["NodeNames"], result["Error"]) == ([node], ""), result
            stored = await real_kube.get("pods", "trainer", namespace=ns)
            assert stored["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]   # untouched

            assert await extender.bind(pod, node) == {"Error": ""}
        finally:
            await extender.close()
        bound = await real_kube.get("pods", "trainer", namespace=ns)
        assert bound["spec"]["nodeName"] == node
        ann = annotations(bound)
        assert ann["hami.io/vgpu-node"] == node
        devices = decode_pod_devices(ann["hami.io/vgpu-devices-allocated"])
        assert [(d.usedmem, d.usedcores) for d in devices[0]] == [(3000, 25)]
        assert ann["hami.io/vgpu-devices-to-allocate"] == ann["hami.io/vgpu-devices-allocated"]
        assert annotations(bound)["hami.io/bind-phase"] == "allocating"     # from the Binding's metadata
        assert annotations(bound)["hami.io/bind-time"].isdigit()
        lock = annotations(await real_kube.get("nodes", node))[LOCK_ANNOTATION]
        stamp, owner_ns, owner = lock.split(",")
        assert (owner_ns, owner) == (ns, "trainer") and stamp.endswith("Z")
        assert app.cache.device_usage(node)[0]["usedmem"] + app.cache.device_usage(node)[1]["usedmem"] == 3000

        # The device plugin's part (no kubelet here): allocation done, lock released.
        plugin = SimulatedDevicePlugin(KubeClient(await load_configuration(str(control_plane.admin_kubeconfig)),
                                                  qps=0, burst=1000))
        plugin.start()
        try:
            await wait_for(lambda: plugin.allocated == 1, timeout=20, what="the stand-in's allocation")
        finally:
            await plugin.stop()
            await plugin.client.close()
        assert annotations(await real_kube.get("pods", "trainer", namespace=ns))["hami.io/bind-phase"] == "success"
        assert LOCK_ANNOTATION not in annotations(await real_kube.get("nodes", node))
        labelled = await real_kube.get("pods", "trainer", namespace=ns)
        assert labelled["metadata"]["labels"]["hami.io/vgpu-node"] == node
        # The pod itself is written once, by the Binding: no label patch after it.
        ours = [(e.verb, e.resource) for e in control_plane.audit_entries(audit_from)
                if e.resource.startswith("pods") and e.verb not in ("list", "watch")]
        assert ours == [("create", "pods/binding")], ours
        await wait_books_balance(real_kube, app)


async def test_a_node_locked_by_another_live_pod_refuses_the_bind_and_rolls_back(real_hami, real_extender, real_kube,
                                                                                  real_namespace, real_nodes):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=1)
    await registered(app, [node])
    await create_pod(real_kube, ns, "holder", scheduler_name="nobody")
    await real_kube.patch("nodes", node, {"metadata": {"annotations": {LOCK_ANNOTATION: lock_value(ns, "holder")}}})
    await wait_for(lambda: app.cache.lock_hint(node)[0], what="the lock seen through the node watch")
    pod = await create_pod(real_kube, ns, "p", gpumem=1000)
    assert (await real_extender.filter(pod, [node]))["NodeNames"] == [node]
    assert app.cache.device_usage(node)[0]["usedmem"] == 1000
    bound = await real_extender.bind(pod, node)
    assert bound["Error"] == f"timed out after 1s waiting for node {node} to be unlocked: node lock contention"
    assert app.cache.device_usage(node)[0]["usedmem"] == 0
    assert (await real_kube.get("pods", "p", namespace=ns))["spec"].get("nodeName") is None
    assert annotations(await real_kube.get("nodes", node))[LOCK_ANNOTATION].endswith(f",{ns},holder")
    # The holder goes away: its lock is orphaned and the next bind takes it over.
    await real_kube.delete("pods", "holder", namespace=ns)
    assert (await real_extender.filter(pod, [node]))["NodeNames"] == [node]
    assert await real_extender.bind(pod, node) == {"Error": ""}
    assert (await real_kube.get("pods", "p", namespace=ns))["spec"]["nodeName"] == node
    await wait_for(lambda: app.device_plugin.allocated >= 1, timeout=20, what="the stand-in's allocation")
    await wait_books_balance(real_kube, app)


async def test_fill_a_gpu_then_a_delete_frees_it_through_the_real_watch(real_hami, real_extender, real_kube,
                                                                         real_namespace, real_nodes):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, devices=None, gpus=1, model=T4, split=10)
    await registered(app, [node])
    share = T4["devmem"] // 4
    for i in range(4):
        pod = await create_pod(real_kube, ns, f"p{i}", gpumem=share, gpucores=20)
        assert (await real_extender.filter(pod, [node]))["NodeNames"] == [node]
        assert await real_extender.bind(pod, node) == {"Error": ""}
        await wait_for(lambda i=i: app.device_plugin.allocated == i + 1, timeout=20, what=f"p{i} allocated")
    extra = await create_pod(real_kube, ns, "p4", gpumem=share, gpucores=20)
    result = await real_extender.filter(extra, [node])
    assert result["NodeNames"] is None and result["FailedNodes"] == {node: "1/1 CardInsufficientMemory"}
    await real_kube.delete("pods", "p0", namespace=ns)
    await wait_for(lambda: app.cache.device_usage(node)[0]["usedmem"] == 3 * share, timeout=20,
                   what="the delete seen through the watch")
    assert (await real_extender.filter(extra, [node]))["NodeNames"] == [node]
    await wait_books_balance(real_kube, app)


async def test_a_restarted_scheduler_rebuilds_the_same_books_from_the_cluster(control_plane, real_hami, real_extender,
                                                                               real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, real_hami
    nodes = await real_nodes(2, gpus=2)
    await registered(app, nodes)
    for i in range(5):
        pod = await create_pod(real_kube, ns, f"p{i}", gpumem=7000, gpucores=15)
        result = await real_extender.filter(pod, nodes)
        assert await real_extender.bind(pod, result["NodeNames"][0]) == {"Error": ""}
        # The next bind on that node waits for the device plugin to release its lock.
        await wait_for(lambda i=i: app.device_plugin.allocated == i + 1, timeout=20, what=f"p{i} allocated")
    await wait_books_balance(real_kube, app)
    before = {n: app.cache.device_usage(n) for n in nodes}
    assert sum(d["usedmem"] for n in nodes for d in before[n]) == 35000
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None) as second:
        await registered(second, nodes)
        assert {n: second.cache.device_usage(n) for n in nodes} == before
        await wait_books_balance(real_kube, second)


async def test_events_land_in_the_real_events_api(real_hami, real_extender, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=1, model=T4)
    await registered(app, [node])
    pod = await create_pod(real_kube, ns, "fits", gpumem=1000)
    assert (await real_extender.filter(pod, [node, "ghost"]))["NodeNames"] == [node]
    assert await real_extender.bind(pod, node) == {"Error": ""}
    big = await create_pod(real_kube, ns, "too-big", gpumem=20000)
    assert (await real_extender.filter(big, [node]))["NodeNames"] is None
    fits = await wait_for_value(lambda: real_kube.events_for(pod), lambda ev: "BindingSucceed" in {r for _, _, r, _ in ev},
                                what="the bind's event")
    # One Event for a bound pod: its filter's FilteringSucceed was dropped at the bind.
    assert fits == [("hami-scheduler", "Normal", "BindingSucceed", f"Successfully binding node [{node}] to {ns}/fits")]
    expected = {("hami-scheduler", "Warning", "FilteringFailed", f"1 nodes CardInsufficientMemory({node})"),
                ("hami-scheduler", "Warning", "FilteringFailed", "no available node, 1 nodes do not meet")}
    failed = await wait_for_value(lambda: real_kube.events_for(big), lambda ev: expected <= set(ev),
                                  what="the FilteringFailed events")
    assert len(failed) == 2, failed


async def test_a_real_resource_quota_bounds_the_namespace(real_hami, real_extender, real_kube, real_namespace,
                                                          real_nodes):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=2)
    await registered(app, [node])
    quota = await real_kube.create("resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}}})
    informer = next(i for i in app.informers if i.path == "/api/v1/resourcequotas")
    await wait_for(lambda: int(informer.resource_version or 0) >= int(quota["metadata"]["resourceVersion"]),
                   timeout=20, what="the quota watch")
    first = await create_pod(real_kube, ns, "first", gpumem=3000)
    assert (await real_extender.filter(first, [node]))["NodeNames"] == [node]
    second = await create_pod(real_kube, ns, "second", gpumem=3000)
    result = await real_extender.filter(second, [node])
    assert result["NodeNames"] is None and result["FailedNodes"] == {node: "2/2 ResourceQuotaNotFit"}, result
    small = await create_pod(real_kube, ns, "small", gpumem=2000)
    assert (await real_extender.filter(small, [node]))["NodeNames"] == [node]
    # The quota raised: seen through the watch, and the refused pod fits.
    await real_kube.patch("resourcequotas", "gpu", {"spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}}},
                          namespace=ns)
    await wait_for_value(lambda: real_extender.filter(second, [node]), lambda r: r["NodeNames"] == [node],
                         what="the raised quota applied")


def _lease(holder: str, *, duration: int = 3600) -> dict:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "hami-scheduler", "namespace": SA_NAMESPACE},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}}


async def test_leadership_follows_a_real_lease_and_the_leader_labels_its_pod(control_plane, real_kube, real_nodes):
    """The Lease kube-scheduler would hold, written here: the replica it names serves /filter
    and labels its pod ``leader``; when it names another, /filter waits until it names this
    replica again."""
    pod_name = "hami-test-replica"
    await real_kube.delete("leases", "hami-scheduler", namespace=SA_NAMESPACE, grace=None)
    await real_kube.delete("pods", pod_name, namespace=SA_NAMESPACE)
    await real_kube.create("leases", _lease("replica-a_5f0c3a4e"))
    await real_kube.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": SA_NAMESPACE, "labels": {COMPONENT_LABEL: "hami-scheduler"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "hami-py", "image": "hami-py"}]}})
    (node,) = await real_nodes(1, gpus=1)
    options = embedded_options(scheduler_name="hami-scheduler", leader_elect=True,
                               leader_elect_resource_name="hami-scheduler",
                               leader_elect_resource_namespace=SA_NAMESPACE, hostname="replica-a",
                               pod_name=pod_name, pod_namespace=SA_NAMESPACE, registration_interval_s=0.1)
    try:
        async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None,
                                  options=options) as app:
            extender = ExtenderClient(app.url)
            try:
                # (ready means the caches are in; the Lease is read by a watch of its own)
                await wait_for(lambda: app.leadership.is_leader, timeout=20, what="leadership from the Lease")
                await registered(app, [node])
                await wait_for_value(lambda: real_kube.get("pods", pod_name, namespace=SA_NAMESPACE),
                                     lambda p: p["metadata"]["labels"].get(ROLE_LABEL) == "leader",
                                     what="the leader's role label")
                pod = gpu_pod("p", namespace=SA_NAMESPACE)
                pod = await real_kube.create("pods", pod)
                assert (await extender.filter(pod, [node]))["NodeNames"] == [node]

                lease = await real_kube.get("leases", "hami-scheduler", namespace=SA_NAMESPACE)
                lease["spec"]["holderIdentity"] = "replica-b_0d7f3c9b"
                await real_kube.client.request("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{SA_NAMESPACE}"
                                               "/leases/hami-scheduler", body=lease)
                await wait_for(lambda: not app.leadership.is_leader, timeout=20, what="leadership lost")
                parked = asyncio.create_task(extender.filter(pod, [node]))
                await wait_for(lambda: len(app.service.synced._waiters) == 1, what="the filter parked")
                assert not parked.done()
                lease = await real_kube.get("leases", "hami-scheduler", namespace=SA_NAMESPACE)
                lease["spec"]["holderIdentity"] = "replica-a_77aa"
                await real_kube.client.request("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{SA_NAMESPACE}"
                                               "/leases/hami-scheduler", body=lease)
                assert (await asyncio.wait_for(parked, 20))["NodeNames"] == [node]
            finally:
                await extender.close()
    finally:
        await real_kube.delete("pods", pod_name, namespace=SA_NAMESPACE)
        await real_kube.delete("pods", "p", namespace=SA_NAMESPACE)
        await real_kube.delete("leases", "hami-scheduler", namespace=SA_NAMESPACE, grace=None)


def _reported() -> str:
    return f"Reported {time.strftime('%Y-%m-%d %H:%M:%S')} +0000 UTC"


async def test_registration_handshake_and_a_gone_plugin_against_the_real_api_server(control_plane, real_kube,
                                                                                     real_namespace, real_nodes):
    """The scheduler stamps ``Requesting_`` on a node whose plugin reported; a plugin that
    answers stays usable; a silent one with nothing allocatable is cleaned up and refused."""
    answering, silent = await real_nodes(2, gpus=1)
    for node in (answering, silent):
        await real_kube.patch("nodes", node, {"status": {"allocatable": {"nvidia.com/gpu": "0"}}},
                              subresource="status")
    options = embedded_options(scheduler_name="hami-scheduler", handshake_timeout_s=3, registration_interval_s=0.1)
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None,
                              options=options) as app:
        extender = ExtenderClient(app.url)
        stop = asyncio.Event()

        async def plugin_answers(node: str) -> None:
            while not stop.is_set():   # a device plugin re-registering on its period, answering
                current = await real_kube.get("nodes", node)
                if is_requesting(annotations(current).get(HANDSHAKE)):
                    await real_kube.patch("nodes", node, {"metadata": {"annotations": {HANDSHAKE: _reported()}}})
                try:
                    await asyncio.wait_for(stop.wait(), 0.3)
                except asyncio.TimeoutError:
                    pass

        answer = asyncio.create_task(plugin_answers(answering))
        try:
            await wait_for_value(lambda: real_kube.get("nodes", silent), lambda n: HANDSHAKE not in annotations(n),
                                 timeout=30, what="the silent plugin's handshake cleaned up")
            # The keeper counts its cleanup once the API server's answer is back, which may come
            # after the test's own read shows the cleanup.
            await wait_for(lambda: app.keeper.stats.cleanups == 1, timeout=10, what="the keeper's cleanup counted")
            assert app.keeper.stats.requests >= 2
            pod = await create_pod(real_kube, real_namespace, "p")
            assert (await extender.filter(pod, [answering]))["NodeNames"] == [answering]
            assert (await extender.filter(pod, [silent]))["FailedNodes"] == {silent: "node unregistered"}
        finally:
            stop.set()
            await answer
            await extender.close()


async def test_devices_come_and_go_with_the_registration_annotation(real_hami, real_extender, real_kube,
                                                                    real_namespace, real_nodes):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, devices=registration("x", gpus=1, model=T4))
    await registered(app, [node])
    pod = await create_pod(real_kube, ns, "two", gpus=2)
    assert (await real_extender.filter(pod, [node]))["FailedNodes"] == {node: "NodeInsufficientDevice"}
    import orjson
    await real_kube.patch("nodes", node, {"metadata": {"annotations": {
        "hami.io/node-nvidia-register": orjson.dumps(registration(node, gpus=2, model=T4)).decode()}}})
    await wait_for(lambda: len(app.cache.device_usage(node)) == 2, timeout=20, what="the new registration")
    assert (await real_extender.filter(pod, [node]))["NodeNames"] == [node]


async def test_a_stale_pod_object_never_gets_a_decision_on_its_successor(real_hami, real_extender, real_kube,
                                                                         real_namespace, real_nodes):
    """kube-scheduler filters a pod from its cache after the pod was deleted and re-created under
    the same name: the watch showed the delete, so the filter refuses the old UID (and a Binding
    would carry it as a precondition, which the real API server refuses): the decision never
    lands on the successor and nothing stays charged."""
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=1)
    await registered(app, [node])
    old = await create_pod(real_kube, ns, "p", gpumem=20000)
    await real_kube.delete("pods", "p", namespace=ns)
    successor = await create_pod(real_kube, ns, "p", gpumem=20000)
    informer = next(i for i in app.informers if i.path == "/api/v1/pods")
    await wait_for(lambda: int(informer.resource_version or 0) >= int(successor["metadata"]["resourceVersion"]),
                   timeout=20, what="the successor seen")
    result = await real_extender.filter(old, [node])
    assert result["Error"] and result["NodeNames"] is None, result
    assert "hami.io/vgpu-node" not in annotations(await real_kube.get("pods", "p", namespace=ns))
    await wait_books_balance(real_kube, app)
    assert old["metadata"]["uid"] not in app.cache.pods and successor["metadata"]["uid"] not in app.cache.pods
    # The successor itself is scheduled normally.
    assert (await real_extender.filter(successor, [node]))["NodeNames"] == [node]

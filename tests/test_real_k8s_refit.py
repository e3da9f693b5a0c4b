"""``POST /refit`` against the real kube-apiserver: TokenReview of real ServiceAccount tokens.

hami-scheduler runs as the manifests' ServiceAccount (its RBAC now grants ``create
tokenreviews``), with ``--device-plugin-namespace``/``--device-plugin-service-account`` naming the
device plugin's account. The device plugin's pod runs on the pod's node with a token bound to it
(TokenRequest with a boundObjectRef, as the kubelet projects it): the API server, not the test,
says whose each token is. No simulated device plugin: the pod's allocation stays pending, as when
kubelet asks for it.
"""
from __future__ import annotations

from dataclasses import replace

import aiohttp
import pytest

from hami_py.embedded import wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import T4, gpu_pod, gpu_uuid
from tests.realk8s import real_scheduler, wait_books_balance
from tests.realk8s_fixtures import DEVICE_PLUGIN_ACCOUNT, DEVICE_PLUGIN_NAMESPACE, device_plugin_account  # noqa: F401

pytestmark = pytest.mark.real_k8s

ALLOCATED = "hami.io/vgpu-devices-allocated"


@pytest.fixture
async def refitting_hami(control_plane, real_options, device_plugin_account):
    options = replace(real_options, device_plugin_namespace=DEVICE_PLUGIN_NAMESPACE,
                      device_plugin_service_account=DEVICE_PLUGIN_ACCOUNT)
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None,
                              options=options) as app:
        yield app


async def plugin_pod_token(control_plane, real_kube, node: str) -> str:
    """The device plugin's pod on ``node``, and a token of its account bound to that pod."""
    pod = await real_kube.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "hami-device-plugin-", "namespace": DEVICE_PLUGIN_NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": DEVICE_PLUGIN_ACCOUNT,
                 "containers": [{"name": "plugin", "image": "projecthami/hami"}]}})
    answer = control_plane.must(
        "POST", f"/api/v1/namespaces/{DEVICE_PLUGIN_NAMESPACE}/serviceaccounts/{DEVICE_PLUGIN_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600, "boundObjectRef": {
             "kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}})
    return answer["status"]["token"]


async def post_refit(app, body: dict, token: str | None) -> tuple[int, dict]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{app.cluster_url}/refit", json=body, headers=headers) as answer:
            return answer.status, await answer.json()


async def test_refit_answers_401_403_and_refits_for_the_device_plugin_of_the_node(
        control_plane, real_kube, real_namespace, real_nodes, refitting_hami):
    app = refitting_hami
    first, second = await real_nodes(2, gpus=2, model=T4)
    await wait_for(lambda: all(n in app.cache.node_index_of for n in (first, second)), timeout=20,
                   what="both nodes in the scheduler's cache")
    extender = ExtenderClient(app.url)
    try:
        pod = await real_kube.create("pods", gpu_pod("numa", namespace=real_namespace, gpumem=4000))
        placement = await extender.schedule(pod, [first])
        assert (placement.node, placement.error) == (first, "")
    finally:
        await extender.close()
    stored = await real_kube.get("pods", "numa", namespace=real_namespace)
    held = stored["metadata"]["annotations"][ALLOCATED].split(",", 1)[0]
    other = next(u for u in (gpu_uuid(first, 0), gpu_uuid(first, 1)) if u != held)
    body = {"podUID": stored["metadata"]["uid"], "podNamespace": real_namespace, "podName": "numa",
            "nodeName": first, "containerIndex": 0, "containerName": "main", "deviceType": "NVIDIA",
            "allowedDeviceUUIDs": [other]}

    status, answer = await post_refit(app, body, None)
    assert status == 401 and not answer["succeeded"]
    status, answer = await post_refit(app, body, "not-a-token")
    assert status == 401 and not answer["succeeded"], answer
    # hami-scheduler's own token: authenticated by the API server, and not the device plugin's.
    status, answer = await post_refit(app, body, control_plane.token())
    assert status == 403 and "is not the device plugin's ServiceAccount" in answer["failureReason"], answer
    # The device plugin's account, but its pod runs on the other node.
    status, answer = await post_refit(app, body, await plugin_pod_token(control_plane, real_kube, second))
    assert status == 403 and f"runs on node {second}, not {first}" in answer["failureReason"], answer
    unchanged = await real_kube.get("pods", "numa", namespace=real_namespace)
    assert unchanged["metadata"]["annotations"] == stored["metadata"]["annotations"]

    status, answer = await post_refit(app, body, await plugin_pod_token(control_plane, real_kube, first))
    assert status == 200 and answer["succeeded"] is True, answer
    assert answer["containerDevices"].startswith(f"{other},NVIDIA,4000,")
    refitted = await real_kube.get("pods", "numa", namespace=real_namespace)
    assert refitted["metadata"]["annotations"][ALLOCATED].split(",", 1)[0] == other
    await wait_books_balance(real_kube, app)

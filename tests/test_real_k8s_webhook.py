"""The admission webhook called by a real kube-apiserver, through manifests/webhook.yaml's
MutatingWebhookConfiguration over TLS.

The configuration is the manifest's, with one change: ``clientConfig`` names a loopback URL (the
scheduler's webhook listener on a free port) and a ``caBundle`` of a throwaway CA instead of the
Service (there is no Service network here). Pods created through the API server come out mutated
(scheduler name, NVIDIA defaults, with the API server's own defaulting of the patched pod) or
are refused with the webhook's reason; excluded namespaces and opted-out pods are never sent.
"""
from __future__ import annotations

import base64
import copy
import pytest

from hami_py.embedded import embedded_options, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod
from hami_py.k8s.client import KubeApiError
from tests.realk8s import SA_NAMESPACE, manifest_docs, resource_path, wait_books_balance, wait_for_value

pytestmark = pytest.mark.real_k8s

WEBHOOK = next(d for d in manifest_docs("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration")


@pytest.fixture
def tls_files(ca, tmp_path):
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(cert_file), str(key_file)


@pytest.fixture
def real_options(tls_files):
    cert_file, key_file = tls_files
    return embedded_options(scheduler_name="hami-scheduler", cert_file=cert_file, key_file=key_file,
                            webhook_bind_address="127.0.0.1:0")


def webhook_configuration(url: str, ca_pem: bytes) -> dict:
    doc = copy.deepcopy(WEBHOOK)
    (hook,) = doc["webhooks"]
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    return doc


def pod_without_scheduler(name: str, namespace: str, limits: dict, **kw) -> dict:
    pod = gpu_pod(name, namespace=namespace, **kw)
    del pod["spec"]["schedulerName"]
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(limits)}
    return pod


@pytest.fixture
async def webhook(control_plane, real_hami, real_kube, real_namespace, ca):
    """The manifest's MutatingWebhookConfiguration pointing at this test's scheduler, active
    (a dry-run create comes back mutated) before the test starts; deleted afterwards."""
    doc = webhook_configuration(f"{real_hami.webhook_url}/webhook", ca.cert_pem.bytes())
    assert real_hami.webhook_url != real_hami.url
    control_plane.apply(doc)
    probe = pod_without_scheduler("probe", real_namespace, {"nvidia.com/gpu": "1"})
    path = resource_path("pods", namespace=real_namespace)
    try:
        await wait_for_value(lambda: real_kube.client.post(path, probe, query=[("dryRun", "All")]),
                             lambda created: created["spec"]["schedulerName"] == "hami-scheduler",
                             what="the MutatingWebhookConfiguration in effect")
        yield doc
    finally:
        await real_kube.delete("mutatingwebhookconfigurations", doc["metadata"]["name"], grace=None)


async def test_a_gpu_pod_comes_out_mutated_and_is_scheduled_over_https(webhook, real_hami, real_kube, real_namespace,
                                                                       real_nodes, https):
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=2)
    await wait_for(lambda: node in app.cache.node_index_of, timeout=20, what="the node registered")
    created = await real_kube.create("pods", pod_without_scheduler("trainer", ns, {"nvidia.com/gpumem": "4000"}))
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    resources = created["spec"]["containers"][0]["resources"]
    # The default count added; and the API server stores quantities in canonical form ("4000" is
    # "4k"), which the scheduler reads as the same 4000 MiB below.
    assert resources["limits"] == {"nvidia.com/gpumem": "4k", "nvidia.com/gpu": "1"}
    # The API server defaults the patched pod again: requests follow the limits it now has.
    assert resources["requests"] == resources["limits"]
    whole = await real_kube.create("pods", pod_without_scheduler("whole", ns, {"nvidia.com/gpu": "1"}))
    assert whole["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"   # exclusive

    extender = ExtenderClient(app.url, session=https)
    assert app.url.startswith("https://")
    placement = await extender.schedule(created, [node])
    assert (placement.node, placement.error) == (node, "")
    assert (await real_kube.get("pods", "trainer", namespace=ns))["spec"]["nodeName"] == node
    await wait_for(lambda: app.device_plugin.allocated == 1, timeout=20, what="the stand-in's allocation")
    await wait_books_balance(real_kube, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage(node)) == 4000


async def test_refusals_carry_the_webhooks_reason(webhook, real_kube, real_namespace, real_hami):
    ns = real_namespace
    privileged = pod_without_scheduler("root", ns, {"nvidia.com/gpu": "1"})
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(KubeApiError) as refused:
        await real_kube.create("pods", privileged)
    assert refused.value.status == 403
    assert refused.value.message == 'admission webhook "vgpu.hami.io" denied the request: container main is privileged'

    malformed = pod_without_scheduler("half", ns, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})
    with pytest.raises(KubeApiError) as refused:
        await real_kube.create("pods", malformed)
    assert "nvidia.com/gpumem-percentage" in refused.value.message and "vgpu.hami.io" in refused.value.message
    assert await real_kube.get("pods", "root", namespace=ns) is None


async def test_a_real_resource_quota_refuses_the_pod_at_admission(webhook, real_hami, real_kube, real_namespace):
    ns, app = real_namespace, real_hami
    quota = await real_kube.create("resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "2048"}}})
    informer = next(i for i in app.informers if i.path == "/api/v1/resourcequotas")
    await wait_for(lambda: int(informer.resource_version or 0) >= int(quota["metadata"]["resourceVersion"]),
                   timeout=20, what="the quota watch")
    with pytest.raises(KubeApiError) as refused:
        await real_kube.create("pods", pod_without_scheduler("big", ns, {"nvidia.com/gpumem": "2049"}))
    assert refused.value.status == 403
    assert refused.value.message == 'admission webhook "vgpu.hami.io" denied the request: exceeding resource quota'
    fits = await real_kube.create("pods", pod_without_scheduler("fits", ns, {"nvidia.com/gpumem": "2048"}))
    assert fits["spec"]["schedulerName"] == "hami-scheduler"


async def test_excluded_namespaces_and_opted_out_pods_are_never_sent(webhook, real_hami, real_kube, real_namespace):
    def reviews() -> float:
        return real_hami.metrics.registry.get_sample_value(
            "hami_extender_request_duration_seconds_count", {"verb": "webhook"}) or 0

    before = reviews()
    system = await real_kube.create("pods", pod_without_scheduler("in-hami-system", SA_NAMESPACE,
                                                                  {"nvidia.com/gpu": "1"}))
    try:
        assert system["spec"]["schedulerName"] == "default-scheduler"
    finally:
        await real_kube.delete("pods", "in-hami-system", namespace=SA_NAMESPACE)
    opted_out = pod_without_scheduler("opted-out", real_namespace, {"nvidia.com/gpu": "1"})
    opted_out["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
    assert (await real_kube.create("pods", opted_out))["spec"]["schedulerName"] == "default-scheduler"
    assert reviews() == before
    sent = await real_kube.create("pods", pod_without_scheduler("sent", real_namespace, {"nvidia.com/gpu": "1"}))
    assert sent["spec"]["schedulerName"] == "hami-scheduler"
    assert reviews() == before + 1

"""The admission webhook called by a real kube-apiserver, through manifests/webhook.yaml's
MutatingWebhookConfiguration over TLS.

The configuration is the manifest's, with one change: each webhook's ``clientConfig`` names a
loopback URL (the scheduler's webhook listener on a free port) and a ``caBundle`` of a throwaway
CA instead of the Service (there is no Service network here). Pods created through the API server
come out mutated (scheduler name, NVIDIA defaults, with the API server's own defaulting of the
patched pod) or are refused with the webhook's reason; excluded namespaces and opted-out pods are
never sent. Scheduler-owned annotations: a forged pod is refused whatever its scheduler or
labels; whether an update may change one is the real API server's answer to hami-py's
SubjectAccessReview (may its author write Nodes?): a namespace's editor (a ServiceAccount bound to
the built-in ``edit`` role) cannot rewrite a decision, a device plugin's ServiceAccount (the
stand-in runs as one here) still writes its answers, and the API server evaluates the
matchConditions itself: an ordinary update never reaches hami-py.
"""
from __future__ import annotations

import base64
import copy
import pytest

from hami_py.embedded import embedded_options, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod, gpu_uuid
from hami_py.k8s.client import KubeApiError
from hami_py.scheduling.admission.rules import scheduler_owned_annotations
from tests.realk8s import (
    SA_NAMESPACE, RealKube, manifest_docs, real_scheduler, resource_path, wait_books_balance, wait_for_value,
)
from tests.realk8s_fixtures import device_plugin_account, real_editor  # noqa: F401  (fixtures, found by name)

pytestmark = pytest.mark.real_k8s

WEBHOOK = next(d for d in manifest_docs("webhook.yaml") if d["kind"] == "MutatingWebhookConfiguration")
GUARD = "owned-annotations.vgpu.hami.io"
# A decision as a person would forge it: a whole 80 GB GPU, bound and being allocated.
FORGED = {"hami.io/vgpu-devices-to-allocate": "GPU-0f7a1c2e-5b8d-4e3f-9a6b-1c2d3e4f5a6b,NVIDIA,80000,100:;",
          "hami.io/vgpu-devices-allocated": "GPU-0f7a1c2e-5b8d-4e3f-9a6b-1c2d3e4f5a6b,NVIDIA,80000,100:;",
          "hami.io/vgpu-node": "gpu-node-1", "hami.io/bind-phase": "allocating"}
FORGED_REFUSAL = (f'admission webhook "{GUARD}" denied the request: annotations hami.io/bind-phase, '
                  "hami.io/vgpu-devices-allocated, hami.io/vgpu-devices-to-allocate, hami.io/vgpu-node "
                  "are written by the scheduler and cannot be set when creating a pod")


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
                            extender_bind="127.0.0.1:0")   # HAMi's layout after v2.10: /webhook on --http_bind


@pytest.fixture
async def real_hami(control_plane, real_options, device_plugin_account):
    """hami-scheduler as in tests/realk8s_fixtures.py, with the device plugin stand-in running
    as a device plugin's ServiceAccount (not the admin): its bind-phase answer passes the guard
    only as an account's."""
    _, plugin_kubeconfig = device_plugin_account
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=plugin_kubeconfig,
                              options=real_options) as app:
        yield app


def webhook_configuration(url: str, ca_pem: bytes) -> dict:
    doc = copy.deepcopy(WEBHOOK)
    assert {h["clientConfig"]["service"]["path"] for h in doc["webhooks"]} == {"/webhook"}
    for hook in doc["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    return doc


def reviews(app) -> float:
    """How many AdmissionReviews hami-py has answered (its request histogram's count)."""
    return app.metrics.registry.get_sample_value("hami_extender_request_duration_seconds_count",
                                                 {"verb": "webhook"}) or 0


def pod_without_scheduler(name: str, namespace: str, limits: dict, **kw) -> dict:
    pod = gpu_pod(name, namespace=namespace, **kw)
    del pod["spec"]["schedulerName"]
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(limits)}
    return pod


@pytest.fixture
async def webhook(control_plane, real_hami, real_kube, real_namespace, ca):
    """The manifest's MutatingWebhookConfiguration pointing at this test's scheduler, both of its
    webhooks active (a dry-run create comes back mutated, a forged one is refused) before the
    test starts; deleted afterwards."""
    doc = webhook_configuration(f"{real_hami.webhook_url}/webhook", ca.cert_pem.bytes())
    assert real_hami.webhook_url != real_hami.url
    control_plane.apply(doc)
    probe = pod_without_scheduler("probe", real_namespace, {"nvidia.com/gpu": "1"})
    forged = pod_without_scheduler("forged-probe", real_namespace, {"nvidia.com/gpu": "1"}, annotations=FORGED)
    forged["metadata"]["labels"] = {"hami.io/webhook": "ignore"}     # only the guard sees it
    path = resource_path("pods", namespace=real_namespace)

    async def dry_run_forged() -> str:
        try:
            await real_kube.client.post(path, forged, query=[("dryRun", "All")])
        except KubeApiError as exc:
            return exc.message
        return "admitted"

    try:
        await wait_for_value(lambda: real_kube.client.post(path, probe, query=[("dryRun", "All")]),
                             lambda created: created["spec"]["schedulerName"] == "hami-scheduler",
                             what="the MutatingWebhookConfiguration in effect")
        await wait_for_value(dry_run_forged, lambda message: message == FORGED_REFUSAL, what="the guard in effect")
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

    misaligned = pod_without_scheduler("numa", ns, {"nvidia.com/gpu": "1"},
                                       annotations={"hami.io/numa-alignment": "best_effort"})
    with pytest.raises(KubeApiError) as refused:
        await real_kube.create("pods", misaligned)
    # Whichever of the two webhooks the API server calls first refuses it, for the same reason.
    assert refused.value.message.endswith("vgpu.hami.io\" denied the request: invalid hami.io/numa-alignment "
                                          "annotation 'best_effort': expected best-effort or strict"), refused.value


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
    before = reviews(real_hami)
    system = await real_kube.create("pods", pod_without_scheduler("in-hami-system", SA_NAMESPACE,
                                                                  {"nvidia.com/gpu": "1"}))
    try:
        assert system["spec"]["schedulerName"] == "default-scheduler"
    finally:
        await real_kube.delete("pods", "in-hami-system", namespace=SA_NAMESPACE)
    opted_out = pod_without_scheduler("opted-out", real_namespace, {"nvidia.com/gpu": "1"})
    opted_out["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
    assert (await real_kube.create("pods", opted_out))["spec"]["schedulerName"] == "default-scheduler"
    assert reviews(real_hami) == before
    sent = await real_kube.create("pods", pod_without_scheduler("sent", real_namespace, {"nvidia.com/gpu": "1"}))
    assert sent["spec"]["schedulerName"] == "hami-scheduler"
    assert reviews(real_hami) == before + 1


# -- scheduler-owned annotations ----------------------------------------------------------------

async def refusal(call) -> KubeApiError:
    """The API server's refusal of ``call()`` (a coroutine function); fails if it succeeds."""
    with pytest.raises(KubeApiError) as refused:
        await call()
    assert refused.value.status == 403, refused.value
    return refused.value


async def test_a_forged_pod_is_refused_whatever_its_scheduler_and_labels(webhook, real_hami, real_kube,
                                                                        real_namespace):
    ns = real_namespace
    ours = pod_without_scheduler("forged", ns, {"nvidia.com/gpu": "1"}, annotations=FORGED)
    other = gpu_pod("forged-other", namespace=ns, annotations=FORGED, scheduler_name="other-scheduler")
    opted_out = pod_without_scheduler("forged-opted-out", ns, {"nvidia.com/gpu": "1"}, annotations=FORGED)
    opted_out["metadata"]["labels"] = {"hami.io/webhook": "ignore"}    # the mutation's opt-out only
    for pod in (ours, other, opted_out):
        refused = await refusal(lambda: real_kube.create("pods", pod))
        assert refused.message == FORGED_REFUSAL
        assert await real_kube.get("pods", pod["metadata"]["name"], namespace=ns) is None
    # One preset key is enough, and named alone in upstream's words.
    one = gpu_pod("one-key", namespace=ns, annotations={"hami.io/bind-phase": "success"})
    refused = await refusal(lambda: real_kube.create("pods", one))
    assert refused.message == (f'admission webhook "{GUARD}" denied the request: annotation hami.io/bind-phase '
                               "is written by the scheduler and cannot be set when creating a pod")


async def test_the_device_plugin_writes_its_answers_and_a_namespace_editor_cannot(
        webhook, real_hami, real_kube, real_namespace, real_nodes, device_plugin_account, real_editor, https):
    """The whole path through the real API server: the pod is admitted and bound (the Binding
    carries the decision, no UPDATE of the pod), the device plugin's ServiceAccount (which may
    write Nodes) writes bind-phase success and rewrites the allocation annotations; then a
    namespace editor's rewrite of the decision is refused although it is a ServiceAccount allowed
    to patch the pod, and the device plugin's write on another scheduler's pod too. The answers
    are the real authorizer's (SubjectAccessReview)."""
    ns, app = real_namespace, real_hami
    plugin_user, plugin_kubeconfig = device_plugin_account
    editor_user, editor_kubeconfig = real_editor
    (node,) = await real_nodes(1, gpus=2)
    await wait_for(lambda: node in app.cache.node_index_of, timeout=20, what="the node registered")
    created = await real_kube.create("pods", pod_without_scheduler("trainer", ns, {"nvidia.com/gpumem": "4000"}))
    placement = await ExtenderClient(app.url, session=https).schedule(created, [node])
    assert (placement.node, placement.error) == (node, "")
    # The stand-in plugin, as the account, answered bind-phase success through the guard.
    await wait_for(lambda: app.device_plugin.allocated == 1, timeout=20, what="the stand-in's allocation")
    bound = await real_kube.get("pods", "trainer", namespace=ns)
    annotations = bound["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "success"
    decision = annotations["hami.io/vgpu-devices-to-allocate"]
    assert ",NVIDIA,4000," in decision

    plugin = await RealKube.connect(plugin_kubeconfig)
    editor = await RealKube.connect(editor_kubeconfig)
    try:
        # As HAMi's device plugin does once a container has its devices: the allocation written
        # again, what is left to allocate emptied.
        answered = await plugin.patch("pods", "trainer", {"metadata": {"annotations": {
            "hami.io/vgpu-devices-allocated": decision, "hami.io/vgpu-devices-to-allocate": ";"}}}, namespace=ns)
        assert answered["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"] == ";"

        before = reviews(app)
        forged = "GPU-0f7a1c2e-5b8d-4e3f-9a6b-1c2d3e4f5a6b,NVIDIA,80000,100:;"
        refused = await refusal(lambda: editor.patch("pods", "trainer", {"metadata": {"annotations": {
            "hami.io/vgpu-devices-to-allocate": forged}}}, namespace=ns))
        assert refused.message == (f'admission webhook "{GUARD}" denied the request: annotation '
                                   "hami.io/vgpu-devices-to-allocate is written by the scheduler and cannot be set "
                                   f"by {editor_user}")
        # Removing a decision is a change too.
        refused = await refusal(lambda: editor.patch("pods", "trainer", {"metadata": {"annotations": {
            "hami.io/vgpu-node": None}}}, namespace=ns))
        assert "annotation hami.io/vgpu-node is written by the scheduler" in refused.message
        refused_reviews = reviews(app)
        # Up to 4: the API server runs a refused update again when its cached copy was stale.
        assert 2 <= refused_reviews - before <= 4
        kept = (await real_kube.get("pods", "trainer", namespace=ns))["metadata"]["annotations"]
        assert kept["hami.io/vgpu-devices-to-allocate"] == ";" and kept["hami.io/vgpu-node"] == node
        # The real authorizer's answers, kept per user: the plugin may write Nodes, the editor not.
        assert {s.user: allowed for s, (_, allowed) in app.node_writers.answers.items()} == \
            {plugin_user: True, editor_user: False}

        # An ordinary update is allowed, and the matchConditions keep it from hami-py altogether.
        relabelled = await editor.patch("pods", "trainer", {"metadata": {
            "labels": {"team": "vision"}, "annotations": {"owner": "alice"}}}, namespace=ns)
        assert relabelled["metadata"]["labels"]["team"] == "vision"
        assert reviews(app) == refused_reviews

        # The same account on a pod kube-scheduler places without us: refused.
        other = await real_kube.create("pods", gpu_pod("elsewhere", namespace=ns, scheduler_name="other-scheduler"))
        assert other["spec"]["schedulerName"] == "other-scheduler"
        refused = await refusal(lambda: plugin.patch("pods", "elsewhere", {"metadata": {"annotations": {
            "hami.io/bind-phase": "success"}}}, namespace=ns))
        assert refused.message == (f'admission webhook "{GUARD}" denied the request: annotation hami.io/bind-phase '
                                   f'is written by the scheduler and cannot be set by {plugin_user} on a pod of '
                                   'scheduler "other-scheduler"')
    finally:
        await plugin.close()
        await editor.close()


async def test_the_scheduler_clears_a_void_decision_through_the_guard(webhook, real_hami, real_kube, real_namespace,
                                                                     real_nodes, device_plugin_account, https):
    """hami-scheduler's own write of scheduler-owned annotations (scheduling/verbs/stale.py) passes: a
    pod of ours carrying a decision that a filter finds no node for has it removed, as the
    hami-scheduler ServiceAccount (a refusal would be a 403 in the audit log, which fails every
    real_k8s test)."""
    ns, app = real_namespace, real_hami
    (node,) = await real_nodes(1, gpus=1)
    await wait_for(lambda: node in app.cache.node_index_of, timeout=20, what="the node registered")
    created = await real_kube.create("pods", pod_without_scheduler("too-big", ns, {"nvidia.com/gpumem": "900000"}))
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    # A decision left from an earlier scheduler (written here by an account, which the guard allows).
    plugin = await RealKube.connect(device_plugin_account[1])
    try:
        void = await plugin.patch("pods", "too-big", {"metadata": {"annotations": {
            "hami.io/vgpu-node": node,
            "hami.io/vgpu-devices-to-allocate": f"{gpu_uuid(node, 0)},NVIDIA,1000,0:;"}}}, namespace=ns)
    finally:
        await plugin.close()
    answer = await ExtenderClient(app.url, session=https).filter(void, [node])
    assert not answer.get("NodeNames") and answer.get("FailedNodes"), answer
    cleared = await wait_for_value(lambda: real_kube.get("pods", "too-big", namespace=ns),
                                   lambda pod: "hami.io/vgpu-node" not in (pod["metadata"].get("annotations") or {}),
                                   what="the void decision cleared")
    assert "hami.io/vgpu-devices-to-allocate" not in (cleared["metadata"].get("annotations") or {})


async def test_the_api_server_sends_only_updates_that_touch_scheduler_owned_keys(webhook, real_hami, real_kube,
                                                                                 real_namespace, device_plugin_account,
                                                                                 real_editor):
    """manifests/webhook.yaml's matchConditions as the real API server evaluates them: each
    update by a namespace's editor either never reaches hami-py and is applied, or reaches it
    (one review more) and gets its answer."""
    ns, app = real_namespace, real_hami
    editor = await RealKube.connect(real_editor[1])
    # A family's key outside hami.io/, in the guard's list; owned by this scheduler's families too
    # (the list is the Deployment's, with every switch on; this scheduler runs with the defaults).
    listed = "mthreads.com/gpu-index"
    assert listed in scheduler_owned_annotations(app.vendors)
    created = await real_kube.create("pods", gpu_pod("held", namespace=ns, annotations={"owner": "alice"}))
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    plugin = await RealKube.connect(device_plugin_account[1])
    try:
        await plugin.patch("pods", "held", {"metadata": {"annotations": {
            "hami.io/vgpu-node": "gpu-1", listed: "0"}}}, namespace=ns)
    finally:
        await plugin.close()

    async def person_patches(metadata: dict) -> tuple[bool, float]:
        """(applied, reviews it cost: 0 or 1). An update the guard refuses costs two when the API
        server first tried it on its watch cache's copy of the pod and that copy was stale (one
        write behind): etcd's GuaranteedUpdate then runs the admission again on the fresh pod."""
        before = reviews(app)
        try:
            await editor.patch("pods", "held", {"metadata": metadata}, namespace=ns)
            applied = True
        except KubeApiError as exc:
            assert exc.status == 403 and exc.message.startswith(f'admission webhook "{GUARD}" denied'), exc
            applied = False
        cost = reviews(app) - before
        return applied, min(cost, 1) if not applied else cost

    cases = [   # (what a person patches, applied, reviews)
        ({"labels": {"team": "vision"}}, True, 0),
        ({"annotations": {"owner": "bob"}}, True, 0),
        ({"annotations": {"hami.io/vgpu-node": "gpu-1"}}, True, 0),               # the same value: no change
        ({"annotations": {"hami.io/gpu-scheduler-policy": "spread"}}, True, 1),    # hami.io/, not owned: asked
        ({"annotations": {"hami.io/vgpu-node": "gpu-2"}}, False, 1),               # changed
        ({"annotations": {"hami.io/vgpu-node": None}}, False, 1),                  # removed
        ({"annotations": {listed: "1"}}, False, 1),                                # a listed key outside hami.io/
        ({"annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,80000,100:;"}}, False, 1),   # added
    ]
    try:
        for metadata, applied, cost in cases:
            assert await person_patches(metadata) == (applied, cost), metadata
    finally:
        await editor.close()
    kept = (await real_kube.get("pods", "held", namespace=ns))["metadata"]
    assert kept["labels"]["team"] == "vision"
    assert {k: kept["annotations"].get(k) for k in ("owner", "hami.io/vgpu-node", listed,
                                                    "hami.io/vgpu-devices-to-allocate")} == \
        {"owner": "bob", "hami.io/vgpu-node": "gpu-1", listed: "0", "hami.io/vgpu-devices-to-allocate": None}


async def test_a_node_writer_may_rewrite_a_decision_the_api_servers_answer_decides(webhook, real_hami, real_kube,
                                                                                  real_namespace, real_editor):
    """The same change, two users, two answers, and nothing of hami-py's own deciding: the admin
    (system:masters: the authorizer lets it write Nodes) may change a decision, the editor may
    not; once the editor is granted Nodes (a ClusterRole of its own) it may, after its kept
    answer expires."""
    ns, app = real_namespace, real_hami
    editor_user, editor_kubeconfig = real_editor
    created = await real_kube.create("pods", gpu_pod("held", namespace=ns))
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    admin_wrote = await real_kube.patch("pods", "held", {"metadata": {"annotations": {
        "hami.io/vgpu-node": "gpu-1"}}}, namespace=ns)
    assert admin_wrote["metadata"]["annotations"]["hami.io/vgpu-node"] == "gpu-1"
    editor = await RealKube.connect(editor_kubeconfig)
    try:
        refused = await refusal(lambda: editor.patch("pods", "held", {"metadata": {"annotations": {
            "hami.io/vgpu-node": "gpu-2"}}}, namespace=ns))
        assert refused.message.endswith(f"annotation hami.io/vgpu-node is written by the scheduler and cannot be set "
                                        f"by {editor_user}")
        grant = f"{ns}-nodes"
        await real_kube.create("clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": grant},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]})
        await real_kube.create("clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": grant},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": grant},
            "subjects": [{"kind": "ServiceAccount", "name": editor_user.rsplit(":", 1)[1], "namespace": ns}]})
        try:
            app.node_writers.answers.clear()        # what the few seconds' wait would do

            async def editor_writes() -> bool:
                try:
                    await editor.patch("pods", "held", {"metadata": {"annotations": {
                        "hami.io/vgpu-node": "gpu-2"}}}, namespace=ns)
                    return True
                except KubeApiError:
                    app.node_writers.answers.clear()    # RBAC's cache may lag the binding a moment
                    return False

            await wait_for_value(editor_writes, bool, what="the editor's write once it may write Nodes")
        finally:
            await real_kube.delete("clusterrolebindings", grant, grace=None)
            await real_kube.delete("clusterroles", grant, grace=None)
    finally:
        await editor.close()

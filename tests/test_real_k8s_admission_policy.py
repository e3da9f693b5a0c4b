"""The guard holds while the scheduler is down: manifests/admission-policy.yaml in a real API server.

A control plane of its own (the policy binds every pod of the cluster: the session's plane keeps
its tests' forged pods), ``kubectl apply -k manifests/`` as an operator deploys, and no hami-py
anywhere: the Deployment has no controller to run it and the MutatingWebhookConfiguration points
at a Service with nothing behind it, so the webhook is down (``failurePolicy: Ignore``: a GPU pod
keeps the default scheduler). The ValidatingAdmissionPolicy, evaluated by kube-apiserver itself,
still refuses a namespace editor (a ServiceAccount bound to the built-in ``edit`` role in one
namespace) a pod carrying a decision and a change of one on an existing pod, and lets through the
identities the cluster trusts with Nodes: the device plugin's account writes its
``hami.io/bind-phase: success``, the scheduler's account (manifests/rbac.yaml) clears a decision.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from hami_py.fakeapi.objects import gpu_pod
from hami_py.k8s.client import KubeApiError
from tests.realk8s import MANIFESTS, SA_USER, RealKube, resource_path, wait_for_value
from tests.realk8s_fixtures import device_plugin_identity, namespace_editor, started_plane

pytestmark = pytest.mark.real_k8s

NAMESPACE = "team-a"
POLICY = "hami-scheduler-owned-annotations"
DENIED = (f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: ")
DECISION = {"hami.io/vgpu-node": "gpu-1", "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,3000,0:;",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;", "hami.io/bind-phase": "allocating"}


def kubectl(plane, *args: str) -> str:
    done = subprocess.run(["kubectl", f"--cache-dir={plane.workdir / 'kubectl-cache'}", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig)})
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def guarded(real_k8s_binaries, tmp_path_factory):
    """A plane with the manifests applied by kubectl, and no scheduler."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed: the manifests are applied as an operator applies them")
    plane = started_plane(tmp_path_factory.mktemp("guarded-plane"), real_k8s_binaries)
    try:
        version = plane.must("GET", "/version")
        assert (int(version["major"]), int(version["minor"].rstrip("+"))) >= (1, 30), version   # VAP v1 is GA
        applied = kubectl(plane, "apply", "-k", str(MANIFESTS))
        assert f"validatingadmissionpolicy.admissionregistration.k8s.io/{POLICY} created" in applied, applied
        assert f"validatingadmissionpolicybinding.admissionregistration.k8s.io/{POLICY} created" in applied, applied
        plane.ensure_namespace(NAMESPACE)
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def admin(guarded):
    kube = await RealKube.connect(guarded.admin_kubeconfig)
    try:
        forged = gpu_pod("probe", namespace=NAMESPACE, annotations={"hami.io/vgpu-node": "gpu-1"})

        async def dry_run() -> str:        # the policy is in effect once the API server has loaded it
            try:
                await kube.client.post(resource_path("pods", namespace=NAMESPACE), forged, query=[("dryRun", "All")])
            except KubeApiError as exc:
                return exc.message
            return "admitted"

        await wait_for_value(dry_run, lambda message: DENIED in message, what="the policy in effect", timeout=60)
        yield kube
    finally:
        for pod in await kube.list("pods", namespace=NAMESPACE):
            await kube.delete("pods", pod["metadata"]["name"], namespace=NAMESPACE)
        await kube.close()


@asynccontextmanager
async def signed_in(identity: tuple[str, Path]):
    """A client with ``identity``'s (username, kubeconfig); ``.user`` is the name."""
    user, kubeconfig = identity
    kube = await RealKube.connect(kubeconfig)
    kube.user = user
    try:
        yield kube
    finally:
        await kube.close()


def scheduler_account(plane) -> tuple[str, Path]:
    """hami-scheduler's ServiceAccount (manifests/rbac.yaml, applied by kubectl), its token minted
    as the plane started."""
    return SA_USER, plane.sa_kubeconfig


@pytest.fixture
async def editor(guarded):
    async with signed_in(namespace_editor(guarded, NAMESPACE)) as kube:
        yield kube


@pytest.fixture
async def device_plugin(guarded):
    async with signed_in(device_plugin_identity(guarded)) as kube:
        yield kube


async def refusal(call) -> str:
    with pytest.raises(KubeApiError) as refused:
        await call()
    assert refused.value.status == 403, refused.value
    assert DENIED in refused.value.message, refused.value.message
    return refused.value.message.split(DENIED, 1)[1]


def plain_pod(name: str, *, scheduler: str = "hami-scheduler", annotations: dict | None = None) -> dict:
    return gpu_pod(name, namespace=NAMESPACE, scheduler_name=scheduler, annotations=annotations)


async def test_the_scheduler_is_down(guarded, admin):
    """Nothing answers the webhook: a GPU pod is admitted without hami-py's mutation."""
    assert not await admin.list("pods", namespace="hami-system")
    pod = gpu_pod("unmutated", namespace=NAMESPACE)
    del pod["spec"]["schedulerName"]
    created = await admin.create("pods", pod)
    assert created["spec"]["schedulerName"] == "default-scheduler"


async def test_a_namespace_editor_cannot_create_a_pod_carrying_a_decision(admin, editor):
    message = await refusal(lambda: editor.create("pods", plain_pod("forged", annotations={
        "hami.io/vgpu-node": "gpu-1", "team": "vision"})))
    assert message == "annotation hami.io/vgpu-node is written by the scheduler and cannot be set when creating a pod"
    # Several keys named together, in the webhook's order and words; another scheduler's pod alike.
    message = await refusal(lambda: editor.create("pods", plain_pod("forged-2", scheduler="other", annotations=DECISION)))
    assert message == ("annotations hami.io/bind-phase, hami.io/vgpu-devices-allocated, "
                       "hami.io/vgpu-devices-to-allocate, hami.io/vgpu-node are written by the scheduler and cannot "
                       "be set when creating a pod")
    for key in ("hami.io/defrag-hold", "hami.io/bind-time", "huawei.com/Ascend910B3", "mthreads.com/gpu-index"):
        assert key in await refusal(lambda: editor.create("pods", plain_pod("forged-3", annotations={key: "x"})))
    # Nobody creates one: not even the admin (a decision is written by a Binding, never preset).
    await refusal(lambda: admin.create("pods", plain_pod("forged-4", annotations=DECISION)))
    # Everything else is the editor's to create.
    ok = await editor.create("pods", plain_pod("fine", annotations={"hami.io/gpu-scheduler-policy": "spread"}))
    assert ok["metadata"]["annotations"] == {"hami.io/gpu-scheduler-policy": "spread"}
    assert {p["metadata"]["name"] for p in await admin.list("pods", namespace=NAMESPACE)} >= {"fine"}
    assert not {"forged", "forged-2", "forged-3", "forged-4"} & {
        p["metadata"]["name"] for p in await admin.list("pods", namespace=NAMESPACE)}


async def test_a_namespace_editor_cannot_change_a_decision_and_node_writers_can(admin, editor, device_plugin, guarded):
    await admin.create("pods", plain_pod("trainer"))
    # The admin may write Nodes (system:masters): it stands in for the Binding's decision here.
    await admin.patch("pods", "trainer", {"metadata": {"annotations": DECISION}}, namespace=NAMESPACE)

    for change in ({"hami.io/vgpu-node": "gpu-2"}, {"hami.io/vgpu-node": None},
                   {"hami.io/vgpu-mig-allocations": "[]"}, {"hami.io/bind-phase": "success"}):
        key = next(iter(change))
        message = await refusal(lambda: editor.patch("pods", "trainer", {"metadata": {"annotations": change}},
                                                     namespace=NAMESPACE))
        assert message == f"annotation {key} is written by the scheduler and cannot be set by {editor.user}"
    # The same value again is no change; labels and other annotations are the editor's.
    relabelled = await editor.patch("pods", "trainer", {"metadata": {"labels": {"team": "vision"}, "annotations": {
        "hami.io/vgpu-node": "gpu-1", "owner": "alice"}}}, namespace=NAMESPACE)
    assert relabelled["metadata"]["labels"] == {"team": "vision"}
    assert {k: relabelled["metadata"]["annotations"][k] for k in DECISION} == DECISION

    # The defragmenter's hold: its operator (admin credentials, which may write Nodes) writes it,
    # the editor may not.
    hold = '{"node": "gpu-1", "victims": [], "until": "2030-01-01T00:00:00Z"}'
    await admin.patch("pods", "trainer", {"metadata": {"annotations": {"hami.io/defrag-hold": hold}}},
                      namespace=NAMESPACE)
    message = await refusal(lambda: editor.patch("pods", "trainer", {"metadata": {"annotations": {
        "hami.io/defrag-hold": None}}}, namespace=NAMESPACE))
    assert message.startswith("annotation hami.io/defrag-hold is written by the scheduler")
    # The device plugin's account (it may write Nodes) answers, as it does once the devices are handed out.
    answered = await device_plugin.patch("pods", "trainer", {"metadata": {"annotations": {
        "hami.io/bind-phase": "success", "hami.io/vgpu-devices-to-allocate": ";"}}}, namespace=NAMESPACE)
    assert answered["metadata"]["annotations"]["hami.io/bind-phase"] == "success"
    # hami-scheduler's own account (manifests/rbac.yaml: nodes patch) clears a void decision.
    async with signed_in(scheduler_account(guarded)) as scheduler:
        cleared = await scheduler.patch("pods", "trainer", {"metadata": {"annotations": {
            k: None for k in DECISION}}}, namespace=NAMESPACE)
        assert not set(DECISION) & set(cleared["metadata"].get("annotations") or {})


async def test_node_writers_act_on_this_schedulers_pods_only(admin, device_plugin):
    await admin.create("pods", plain_pod("elsewhere", scheduler="other-scheduler"))
    message = await refusal(lambda: device_plugin.patch("pods", "elsewhere", {"metadata": {"annotations": {
        "hami.io/bind-phase": "success"}}}, namespace=NAMESPACE))
    assert message == (f"annotation hami.io/bind-phase is written by the scheduler and cannot be set by "
                       f'{device_plugin.user} on a pod of scheduler "other-scheduler"')


async def test_the_status_subresource_is_guarded_too(admin, guarded):
    """pods/status writes carry the pod's metadata: one who may write a pod's status (and not
    Nodes) cannot change a decision through it."""
    await admin.create("pods", plain_pod("status-held"))
    await admin.patch("pods", "status-held", {"metadata": {"annotations": DECISION}}, namespace=NAMESPACE)
    name = "status-writer"
    guarded.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}})
    guarded.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": name, "namespace": NAMESPACE},
                   "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]}]})
    guarded.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": name, "namespace": NAMESPACE},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                   "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
    user = f"system:serviceaccount:{NAMESPACE}:{name}"
    kubeconfig = guarded.write_kubeconfig(guarded.workdir / f"{name}.kubeconfig", guarded.token(NAMESPACE, name),
                                          user=user)
    async with signed_in((user, kubeconfig)) as writer:
        message = await refusal(lambda: writer.patch("pods", "status-held", {"metadata": {"annotations": {
            "hami.io/vgpu-node": "gpu-9"}}}, namespace=NAMESPACE, subresource="status"))
        assert message == f"annotation hami.io/vgpu-node is written by the scheduler and cannot be set by {user}"
        # Its status writes themselves pass.
        await writer.patch("pods", "status-held", {"status": {"message": "waiting"}}, namespace=NAMESPACE,
                           subresource="status")
    kept = await admin.get("pods", "status-held", namespace=NAMESPACE)
    assert kept["metadata"]["annotations"]["hami.io/vgpu-node"] == "gpu-1"


async def test_the_binding_still_carries_the_decision(admin, guarded):
    """hami-scheduler writes a decision through the Binding (pods/binding, which the policy does
    not match: only schedulers may bind), never by a pod update: its binds pass, scheduler up or
    down."""
    await admin.create("pods", plain_pod("bound"))
    async with signed_in(scheduler_account(guarded)) as scheduler:
        await scheduler.client.post(resource_path("pods", "bound", namespace=NAMESPACE) + "/binding", {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "bound", "namespace": NAMESPACE, "annotations": DECISION},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}})
    bound = await admin.get("pods", "bound", namespace=NAMESPACE)
    assert bound["spec"]["nodeName"] == "gpu-1"
    assert {k: bound["metadata"]["annotations"][k] for k in DECISION} == DECISION

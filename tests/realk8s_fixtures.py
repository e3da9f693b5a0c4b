"""Fixtures and hooks of the real control-plane tests (``@pytest.mark.real_k8s``), imported by
tests/conftest.py. The control plane itself is tests/realk8s.py.

* ``control_plane`` (session): etcd + kube-apiserver, started on the first test that needs it,
  with manifests/namespace.yaml and manifests/rbac.yaml applied and a token of the
  ``hami-scheduler`` ServiceAccount minted; stopped by PID when the session ends.
* ``real_kube`` (admin client), ``real_namespace``, ``real_nodes`` (made and cleaned up per test).
* Every real_k8s test fails if the ServiceAccount got a 403 while it ran (the audit log says),
  and under ``CI=true`` a real_k8s test that skips is reported as failed.
* ``run_last``: a test moved to the end of the session (the audit of the whole run).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.realk8s import (
    CONTROL_PLANE, KUBE_SCHEDULER, SA_USER, BinariesMissing, ControlPlane, RealKube, dns_name, find_binaries,
    forbidden, real_node, required, unique,
)

REAL_K8S = "real_k8s"
_deselected_real: list[str] = []
_skipped_real: dict[str, int] = {}     # reason -> how many real_k8s tests skipped for it


def binaries_or_skip(names: tuple[str, ...]) -> dict[str, Path]:
    """The binaries; else the test skips (or, under CI=true, errors) saying how to provide them."""
    try:
        return find_binaries(names)
    except BinariesMissing as exc:
        missing = str(exc)
    if required():
        pytest.fail(f"{missing} (CI=true: these tests must run)", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="session")
def real_k8s_binaries() -> dict[str, Path]:
    return binaries_or_skip(CONTROL_PLANE)


@pytest.fixture(scope="session")
def kube_scheduler_binary(real_k8s_binaries) -> Path:
    return binaries_or_skip((KUBE_SCHEDULER,))[KUBE_SCHEDULER]


def started_plane(workdir: Path, binaries: dict[str, Path], **kw) -> ControlPlane:
    plane = ControlPlane(workdir, binaries, **kw)
    plane.start()
    try:
        return plane.prepare()
    except BaseException:
        plane.stop()
        raise


@pytest.fixture(scope="session")
def control_plane(real_k8s_binaries, tmp_path_factory):
    plane = started_plane(tmp_path_factory.mktemp("control-plane"), real_k8s_binaries)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def real_kube(control_plane):
    kube = await RealKube.connect(control_plane.admin_kubeconfig)
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture
async def real_namespace(request, control_plane, real_kube):
    """A namespace of the test's own (with its default ServiceAccount); its pods are deleted
    afterwards (grace period 0: no kubelet would confirm a graceful one)."""
    name = unique(dns_name(request.node.name, 30))
    control_plane.ensure_namespace(name)
    try:
        yield name
    finally:
        for pod in await real_kube.list("pods", namespace=name):
            await real_kube.delete("pods", pod["metadata"]["name"], namespace=name)


@pytest.fixture
async def real_nodes(request, real_kube):
    """``await real_nodes(count, **gpu_node kwargs)``: that many GPU nodes with names and a
    ``hami-test`` label of this test's own; deleted afterwards."""
    made: list[str] = []
    label = unique(dns_name(request.node.name, 30))

    async def make(count: int = 1, *, labels: dict | None = None, **kw) -> list[str]:
        names = []
        for _ in range(count):
            node = real_node(unique(label), labels={"hami-test": label, **(labels or {})}, **kw)
            await real_kube.create("nodes", node)
            made.append(node["metadata"]["name"])
            names.append(node["metadata"]["name"])
        return names

    make.label = label
    try:
        yield make
    finally:
        for name in made:
            await real_kube.delete("nodes", name, grace=None)


# -- hooks (tests/conftest.py imports them) ---------------------------------------------------

@pytest.fixture(autouse=True)
def _real_k8s_no_forbidden(request):
    """A real_k8s test fails when the hami-scheduler ServiceAccount (hami-py or its kube-scheduler
    sidecar) was refused anything while it ran: the ClusterRole and Roles must be sufficient."""
    if request.node.get_closest_marker(REAL_K8S) is None:
        yield
        return
    offsets = {id(p): p.audit_size() for p in ControlPlane.started}
    yield
    refused = []
    for plane in ControlPlane.started:
        refused += forbidden(plane.audit_entries(since=offsets.get(id(plane), 0)))
    assert not refused, f"{SA_USER} was refused (403) during this test:\n  " + "\n  ".join(refused[:20])


def run_last(function):
    """Run this test after every other one of the session (it audits the whole run)."""
    function._hami_run_last = True
    return function


def pytest_deselected(items):
    _deselected_real.extend(i.nodeid for i in items if i.get_closest_marker(REAL_K8S) is not None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    last = [i for i in items if getattr(getattr(i, "function", None), "_hami_run_last", False)]
    if last:
        items[:] = [i for i in items if i not in last] + last


def whole_real_k8s_run(session) -> str:
    """'' when every real_k8s test module was collected and none of their tests deselected,
    else why not."""
    if _deselected_real:
        return f"{len(_deselected_real)} real_k8s tests were deselected"
    here = Path(__file__).resolve().parent
    modules = {p.name for p in here.glob("test_real_k8s_*.py")}
    collected = {Path(str(i.path)).name for i in session.items if i.get_closest_marker(REAL_K8S) is not None}
    if missing := sorted(modules - collected):
        return f"real_k8s modules not collected: {', '.join(missing)}"
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a real_k8s test that skips (for any reason) is a failure; elsewhere its
    skip is counted for the one summary line."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or item.get_closest_marker(REAL_K8S) is None or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: "):]
    if required():
        report.outcome = "failed"
        report.longrepr = f"real_k8s test skipped under CI=true, where it must run: {reason}"
    else:
        _skipped_real[reason] = _skipped_real.get(reason, 0) + 1


def pytest_terminal_summary(terminalreporter):
    """One line per reason the real control-plane tests skipped, however many they are."""
    for reason, count in _skipped_real.items():
        terminalreporter.write_line(f"real_k8s: {count} tests skipped: {reason}", yellow=True)


# -- hami-scheduler against the session's control plane ---------------------------------------

@pytest.fixture
def real_options():
    """Override in a module to start hami-scheduler with other flags."""
    from hami_py.embedded import embedded_options
    # A bind meeting a held node lock waits 1 s for it here (10 s by default): the tests that
    # hold a lock on purpose would otherwise wait the default out.
    return embedded_options(scheduler_name="hami-scheduler", node_lock_wait_s=1.0)


@pytest.fixture
async def real_hami(control_plane, real_options):
    """hami-scheduler (SchedulerApp, in-process) as the hami-scheduler ServiceAccount, with the
    device plugin stand-in beside it (as the admin); ``app.device_plugin``."""
    from tests.realk8s import real_scheduler
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=control_plane.admin_kubeconfig,
                              options=real_options) as app:
        yield app


@pytest.fixture
async def real_extender(real_hami):
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    client = ExtenderClient(real_hami.url)
    try:
        yield client
    finally:
        await client.close()


# -- a device plugin's identity ----------------------------------------------------------------

DEVICE_PLUGIN_NAMESPACE = "kube-system"    # where HAMi's chart runs its device plugins
DEVICE_PLUGIN_ACCOUNT = "hami-device-plugin"


def device_plugin_identity(plane: ControlPlane) -> tuple[str, Path]:
    """A ServiceAccount standing in for a device plugin's (``kube-system/hami-device-plugin``),
    with what the stand-in plugin does over the API: watch pods and patch their annotations,
    write nodes (HAMi's chart grants its device plugins node writes: the guard of
    scheduler-owned annotations asks for exactly that). ``(username, kubeconfig)``; the token
    comes from TokenRequest, as the control plane's for hami-scheduler."""
    name, namespace = DEVICE_PLUGIN_ACCOUNT, DEVICE_PLUGIN_NAMESPACE
    plane.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
    plane.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch", "patch"]}]})
    plane.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    user = f"system:serviceaccount:{namespace}:{name}"
    kubeconfig = plane.write_kubeconfig(plane.workdir / f"{name}.kubeconfig", plane.token(namespace, name), user=user)
    return user, kubeconfig


@pytest.fixture(scope="session")
def device_plugin_account(control_plane):
    """``device_plugin_identity`` on the session's control plane."""
    return device_plugin_identity(control_plane)


def namespace_editor(plane: ControlPlane, namespace: str, name: str = "editor") -> tuple[str, Path]:
    """A ServiceAccount of ``namespace`` bound there to the built-in ``edit`` ClusterRole: what a
    namespace admin can hand out (patch any pod of the namespace), and no right on Nodes.
    ``(username, kubeconfig)``."""
    plane.aggregate_cluster_role("edit")
    plane.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
    plane.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{name}-edit", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    user = f"system:serviceaccount:{namespace}:{name}"
    kubeconfig = plane.write_kubeconfig(plane.workdir / f"{namespace}-{name}.kubeconfig",
                                        plane.token(namespace, name), user=user)
    return user, kubeconfig


@pytest.fixture
def real_editor(control_plane, real_namespace):
    """``namespace_editor`` of the test's namespace on the session's control plane."""
    return namespace_editor(control_plane, real_namespace)

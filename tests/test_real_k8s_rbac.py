"""manifests/rbac.yaml is sufficient and minimal, by the real API server's audit log.

The session's kube-apiserver logs every request of the ``hami-scheduler`` ServiceAccount
(``--audit-policy-file``, tests/realk8s.py). Every real_k8s test already fails on a 403 of that
account while it runs (sufficient). This test runs after all the others of the session
(``run_last``) and reads the whole log: every verb on every resource the ClusterRole and the
Role grant was used by the end of the run (minimal), hami-py's own requests needed nothing but
those two (it does not lean on the sidecar's built-in kube-scheduler roles), and the sidecar
used the Lease verbs granted for it and read the ConfigMap the kube-system RoleBinding is for.
Requests are told apart by user agent: kube-scheduler's start with ``kube-scheduler/``.
"""
from __future__ import annotations

import pytest

from tests.realk8s import SA_NAMESPACE, forbidden, manifest_docs
from tests.realk8s_fixtures import run_last, whole_real_k8s_run

pytestmark = pytest.mark.real_k8s

RBAC = manifest_docs("rbac.yaml")
SIDECAR_LEASE_VERBS = {"get", "create", "update"}     # kube-scheduler's own election on the Lease


def granted(kind: str, name: str) -> set[tuple[str, str, str]]:
    (doc,) = [d for d in RBAC if d["kind"] == kind and d["metadata"]["name"] == name]
    return {(group, resource, verb) for rule in doc["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@run_last
def test_every_grant_was_used_and_nothing_was_refused(request, control_plane):
    if why := whole_real_k8s_run(request.session):
        pytest.skip(f"audits the whole real_k8s run, and this one is partial: {why}")
    entries = control_plane.audit_entries()
    assert not forbidden(entries), "refused:\n  " + "\n  ".join(forbidden(entries)[:20])
    sidecar = [e for e in entries if e.user_agent.startswith("kube-scheduler/")]
    hami = [e for e in entries if not e.user_agent.startswith("kube-scheduler/")]
    assert sidecar and hami

    cluster = granted("ClusterRole", "hami-scheduler")
    role = granted("Role", "hami-scheduler")
    hami_used = {(e.group, e.resource, e.verb) for e in hami}
    hami_in_namespace = {(e.group, e.resource, e.verb) for e in hami if e.namespace == SA_NAMESPACE}
    sidecar_in_namespace = {(e.group, e.resource, e.verb) for e in sidecar if e.namespace == SA_NAMESPACE}

    assert not cluster - hami_used, f"the ClusterRole grants what hami-py never used: {sorted(cluster - hami_used)}"
    # Device preemption's two grants, used by the real kube-scheduler preemption tests
    # (tests/test_real_k8s_kube_scheduler.py): the victims' evictions and the nominatedNodeName.
    preemption = {("", "pods/eviction", "create"), ("", "pods/status", "patch")}
    assert preemption <= cluster and preemption <= hami_used, sorted(preemption - hami_used)
    # The sidecar's grants are the Lease verbs of its own election (the Role also grants hami-py
    # pods create/delete in its namespace, for the remote-GPU session stubs).
    for_sidecar = {g for g in role if g[1] == "leases" and g[2] in SIDECAR_LEASE_VERBS}
    unused = (role - for_sidecar - hami_in_namespace) | (for_sidecar - sidecar_in_namespace)
    assert not unused, f"the Role grants what nobody used: {sorted(unused)}"
    beyond = {(e.group, e.resource, e.verb, e.namespace) for e in hami
              if (e.group, e.resource, e.verb) not in cluster
              and not ((e.group, e.resource, e.verb) in role and e.namespace == SA_NAMESPACE)}
    assert not beyond, f"hami-py used what only the sidecar's built-in roles grant: {sorted(beyond)}"

    (binding,) = [d for d in RBAC if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "kube-system"]
    assert binding["roleRef"]["name"] == "extension-apiserver-authentication-reader"
    read = {e.verb for e in sidecar if e.namespace == "kube-system" and e.resource == "configmaps"}
    # (client-go lists by a watch that sends the initial state first: get and watch, no list)
    assert {"get", "watch"} <= read, f"the sidecar never read kube-system's ConfigMap ({read})"

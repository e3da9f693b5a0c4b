"""Under HAMi's own chart, the chart's RBAC is enough for everything hami-py does.

Replacing HAMi's scheduler means changing the extender's image and nothing else, so the
ServiceAccount keeps the chart's grants, not ``manifests/rbac.yaml``. ``test_real_k8s_rbac``
proves from the audit log that ``manifests/rbac.yaml`` covers every request hami-py makes. This
test applies the chart's scheduler RBAC to another ServiceAccount, written down below as data
from reading the chart's templates (``charts/hami/templates/scheduler/clusterrole.yaml``,
``clusterrolebinding.yaml``, ``role.yaml``, ``rolebinding.yaml``; no copy of the files), and
asks the real API server (SubjectAccessReview) whether each verb our manifests grant is allowed
to it: the chart's own ClusterRole lacks ``events patch`` (the Event correlator's count updates),
which its binding to the built-in ``system:kube-scheduler`` role supplies.
"""
from __future__ import annotations

import pytest

from tests.realk8s import manifest_docs

pytestmark = pytest.mark.real_k8s

CHART_NAMESPACE = "hami-chart"
CHART_SA = "hami-scheduler"
_NAME = "hami-chart-scheduler"


def _chart_rbac() -> list[dict]:
    subject = [{"kind": "ServiceAccount", "name": CHART_SA, "namespace": CHART_NAMESPACE}]
    rbac = "rbac.authorization.k8s.io/v1"

    def cluster_binding(name: str, role: str) -> dict:
        return {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subject}

    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CHART_SA, "namespace": CHART_NAMESPACE}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": _NAME}, "rules": [
            {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "watch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "list"]},
            {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "list", "watch"]},
        ]},
        cluster_binding(f"{_NAME}-kube", "system:kube-scheduler"),
        cluster_binding(f"{_NAME}-volume", "system:volume-scheduler"),
        cluster_binding(_NAME, _NAME),
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": _NAME, "namespace": CHART_NAMESPACE}, "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["create", "list", "watch", "get", "update", "patch"]}]},
        {"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": _NAME, "namespace": CHART_NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": _NAME}, "subjects": subject},
    ]


def _our_grants() -> list[tuple[str, str, str, bool]]:
    """(group, resource[/subresource], verb, namespaced-in-our-own-namespace) of manifests/rbac.yaml's
    hami-scheduler ClusterRole and Role: what the audit test proves hami-py uses."""
    grants = []
    for doc in manifest_docs("rbac.yaml"):
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] == "hami-scheduler":
            for rule in doc["rules"]:
                grants += [(g, r, v, doc["kind"] == "Role") for g in rule["apiGroups"]
                           for r in rule["resources"] for v in rule["verbs"]]
    return grants


# Grants only an opt-in feature of ours uses, which the chart does not give: a user who turns the
# feature on under the chart adds them (README "Device preemption", docs/devices/remotegpu-webhook.md).
OPT_IN_BEYOND_THE_CHART = {"create core/pods/eviction": "--device-preemption (off by default)",
                           "create core/pods": "remote-GPU session stubs (remotegpu sessionImage, unset by default)",
                           # Without them hami-py says at start that PodGroup gangs are off (a 403 is
                           # read as "not installed"); Kueue pod groups need no grant (docs/GANGS.md).
                           "list scheduling.x-k8s.io/podgroups": "gangs of scheduler-plugins' PodGroups",
                           "watch scheduling.x-k8s.io/podgroups": "gangs of scheduler-plugins' PodGroups"}


def test_the_charts_rbac_allows_every_request_hami_py_makes(control_plane):
    control_plane.ensure_namespace(CHART_NAMESPACE)
    for doc in _chart_rbac():
        control_plane.apply(doc)
    grants = _our_grants()
    assert grants, "manifests/rbac.yaml has no hami-scheduler ClusterRole/Role"
    refused = []
    for group, resource, verb, in_namespace in grants:
        resource, _, subresource = resource.partition("/")
        attributes = {"group": group, "resource": resource, "verb": verb,
                      "namespace": CHART_NAMESPACE if in_namespace else "some-namespace"}
        if subresource:
            attributes["subresource"] = subresource
        if resource in ("nodes",):
            attributes.pop("namespace")
        review = control_plane.must("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": f"system:serviceaccount:{CHART_NAMESPACE}:{CHART_SA}",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{CHART_NAMESPACE}",
                                "system:authenticated"],
                     "resourceAttributes": attributes}})
        if not review["status"].get("allowed"):
            refused.append(f"{verb} {group or 'core'}/{resource}{'/' + subresource if subresource else ''}")
    beyond = [r for r in refused if r not in OPT_IN_BEYOND_THE_CHART]
    assert not beyond, f"the chart's RBAC refuses what hami-py does: {beyond}"
    # Each opt-in grant is still needed beyond the chart (else the exception above is stale).
    assert sorted(refused) == sorted(OPT_IN_BEYOND_THE_CHART), refused


def test_the_review_tells_a_grant_from_none(control_plane):
    """The check above can fail: a verb no role of the chart's grants is refused."""
    control_plane.ensure_namespace(CHART_NAMESPACE)
    for doc in _chart_rbac():
        control_plane.apply(doc)
    review = control_plane.must("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{CHART_NAMESPACE}:{CHART_SA}",
                 "resourceAttributes": {"group": "", "resource": "secrets", "verb": "list", "namespace": "kube-system"}}})
    assert review["status"].get("allowed") is not True

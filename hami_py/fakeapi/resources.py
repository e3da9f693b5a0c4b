"""The resource types the in-repo API server serves, and the URL prefixes of their API groups.

Why a module of its own: the store, the URL parser and the Status errors all name resources the
same way (plural, kind, apiVersion, scope); one table keeps them agreeing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource type: its URL plural, kind and scope."""
    plural: str
    kind: str
    api_version: str
    namespaced: bool

    @property
    def group_resource(self) -> str:
        """The name Status messages use: ``pods``, ``leases.coordination.k8s.io``."""
        group = self.api_version.rpartition("/")[0]
        return f"{self.plural}.{group}" if group else self.plural


RESOURCES = {r.plural: r for r in (
    Resource("nodes", "Node", "v1", False),
    Resource("pods", "Pod", "v1", True),
    Resource("resourcequotas", "ResourceQuota", "v1", True),
    Resource("events", "Event", "v1", True),
    Resource("configmaps", "ConfigMap", "v1", True),
    Resource("leases", "Lease", "coordination.k8s.io/v1", True),
    Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", True),
    # scheduler-plugins' PodGroup CRD: served only by a FakeApiServer(podgroups=True).
    Resource("podgroups", "PodGroup", "scheduling.x-k8s.io/v1alpha1", True),
)}
API_PREFIXES = {("api", "v1"): "v1", ("apis", "coordination.k8s.io", "v1"): "coordination.k8s.io/v1",
                ("apis", "policy", "v1"): "policy/v1",
                ("apis", "scheduling.x-k8s.io", "v1alpha1"): "scheduling.x-k8s.io/v1alpha1"}
CRD_RESOURCES = frozenset({"podgroups"})   # answered 404 unless the server is told the CRD is installed
BINDINGS = Resource("pods/binding", "Binding", "v1", True)   # names the subresource in errors

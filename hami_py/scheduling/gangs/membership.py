"""Which gang a pod belongs to, and what the gang asks for (how many members, how long to wait).

Two conventions are read, both from labels kube-scheduler's users already put on their pods:

* scheduler-plugins' coscheduling: the label ``scheduling.x-k8s.io/pod-group: <name>`` names a
  PodGroup object (``scheduling.x-k8s.io/v1alpha1``) in the pod's namespace, whose
  ``spec.minMember`` members must be placed together, within ``spec.scheduleTimeoutSeconds``.
  Its coscheduling plugin waits 60 seconds when the PodGroup gives no timeout (its
  ``permitWaitingTimeSeconds`` default); so do we.
* Kueue's plain pod groups: the label ``kueue.x-k8s.io/pod-group-name`` and the annotation
  ``kueue.x-k8s.io/pod-group-total-count`` on every member; no object, so no CRD is needed, and
  every member must be placed (the minimum is the total).

A pod carrying both is read as a PodGroup member (the label kube-scheduler's plugins look at).
"""
from __future__ import annotations

from typing import NamedTuple

PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"
PODGROUPS_PATH = f"/apis/{PODGROUP_API}/podgroups"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
DEFAULT_TIMEOUT_S = 60.0

PODGROUP = "PodGroup"
KUEUE = "Kueue pod group"


class GangKey(NamedTuple):
    """One gang: which convention names it, and its namespace and name."""
    kind: str          # PODGROUP or KUEUE
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


class GangSpec(NamedTuple):
    min_member: int
    timeout_s: float


class GangSpecError(ValueError):
    """A gang's own description cannot be used (its text says which field and value)."""


def gang_of(pod: dict) -> GangKey | None:
    """The gang the pod's labels name, or None."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    namespace = meta.get("namespace") or "default"
    name = labels.get(PODGROUP_LABEL)
    if isinstance(name, str) and name:
        return GangKey(PODGROUP, namespace, name)
    name = labels.get(KUEUE_GROUP_LABEL)
    if isinstance(name, str) and name:
        return GangKey(KUEUE, namespace, name)
    return None


def podgroup_key(obj: dict) -> GangKey | None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    return GangKey(PODGROUP, meta.get("namespace") or "default", name) if isinstance(name, str) and name else None


def podgroup_spec(obj: dict) -> GangSpec:
    """A PodGroup object's minimum and timeout; GangSpecError naming the field that is wrong."""
    spec = obj.get("spec") or {}
    minimum = spec.get("minMember", 0)
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise GangSpecError(f"spec.minMember is {minimum!r}, not a whole number >= 0")
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is None or timeout == 0:
        timeout_s = DEFAULT_TIMEOUT_S
    elif isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise GangSpecError(f"spec.scheduleTimeoutSeconds is {timeout!r}, not a whole number of seconds >= 0")
    else:
        timeout_s = float(timeout)
    return GangSpec(minimum, timeout_s)


def kueue_spec(pod: dict) -> GangSpec:
    """A Kueue pod group's size as its member says it; GangSpecError when the annotation is
    missing or not a positive whole number."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(KUEUE_TOTAL_ANNOTATION)
    if raw is None:
        raise GangSpecError(f"annotation {KUEUE_TOTAL_ANNOTATION} is missing")
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise GangSpecError(f"annotation {KUEUE_TOTAL_ANNOTATION} is {raw!r}, not a whole number >= 1")
    return GangSpec(int(text), DEFAULT_TIMEOUT_S)

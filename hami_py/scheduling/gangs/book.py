"""The gangs as the watches show them: PodGroup specs, and each gang's living members.

Fed synchronously by the app's pod watch (every pod event, after the usage cache applied it) and
by a PodGroup informer (when the CRD is served), so a /filter reads them with no await, in the
same stretch as the books it reserves in. Only a gang's UNBOUND device members are kept as whole
objects (the planner decides for them before their own /filter comes); every other member is a
UID and two flags: clusters run thousands of pods and few of them wait in a gang.
"""
from __future__ import annotations

import structlog

from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.scheduling.decision.requests import parse_pod_requests
from hami_py.scheduling.gangs.membership import (
    PODGROUP, GangKey, GangSpec, GangSpecError, gang_of, kueue_spec, podgroup_key, podgroup_spec,
)

log = structlog.get_logger(__name__)
_TERMINAL = ("Succeeded", "Failed")


class Member:
    """A living member of a gang: bound or not, asking for devices or not, held back by a
    scheduling gate or not (Kueue gates its pods until it admits the job: kube-scheduler does not
    schedule them); the object itself only while it is an unbound device member (for the planner)."""

    __slots__ = ("uid", "bound", "device", "gated", "pod")

    def __init__(self, uid: str, bound: bool, device: bool, pod: dict | None, gated: bool = False):
        self.uid = uid
        self.bound = bound
        self.device = device
        self.gated = gated
        self.pod = pod


class GangBook:
    def __init__(self, vendors: dict[str, DeviceVendor], vendor_ids: dict[str, int]):
        self.vendors = vendors
        self.vendor_ids = vendor_ids
        # Whether PodGroup objects are watched (the CRD is served): without them a
        # scheduling.x-k8s.io/pod-group label names no gang this scheduler can size.
        self.podgroups_on = False
        self.specs: dict[GangKey, GangSpec] = {}
        self.spec_errors: dict[GangKey, str] = {}
        self.members: dict[GangKey, dict[str, Member]] = {}
        self.gang_of_uid: dict[str, GangKey] = {}
        self.kueue_minimum: dict[str, int] = {}     # uid → the size a Kueue member's annotation states
        self._relist_seen: set[str] | None = None

    # ------------------------------------------------------------------ PodGroups
    def observe_podgroup(self, kind: str, obj: dict) -> None:
        key = podgroup_key(obj)
        if key is None:
            return
        self.specs.pop(key, None)
        self.spec_errors.pop(key, None)
        if kind == "DELETED":
            return
        try:
            self.specs[key] = podgroup_spec(obj)
        except GangSpecError as exc:
            self.spec_errors[key] = str(exc)
            log.warning("PodGroup cannot be used", podgroup=f"{key.namespace}/{key.name}", error=str(exc))

    def replace_podgroups(self, items: list[dict]) -> None:
        self.specs.clear()
        self.spec_errors.clear()
        for obj in items:
            self.observe_podgroup("ADDED", obj)

    # ------------------------------------------------------------------ pods
    def observe_pod(self, kind: str, pod: dict) -> GangKey | None:
        """A pod event; the gang it concerns (the pod's, or the one it just left), or None."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        if self._relist_seen is not None and kind != "DELETED":
            self._relist_seen.add(uid)
        old = self.gang_of_uid.get(uid)
        key = None if kind == "DELETED" or (pod.get("status") or {}).get("phase") in _TERMINAL else gang_of(pod)
        if old is not None and old != key:
            self._drop(uid, old)
        if key is None:
            return old
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        try:
            device = parse_pod_requests(pod, self.vendors, self.vendor_ids) is not None
        except RequestError:
            device = True    # the planner names the error when it decides for it
        gated = not bound and bool((pod.get("spec") or {}).get("schedulingGates"))
        self.members.setdefault(key, {})[uid] = Member(uid, bound, device, None if bound or not device else pod,
                                                       gated)
        self.gang_of_uid[uid] = key
        if key.kind != PODGROUP:     # a Kueue member states its gang's size itself
            try:
                self.kueue_minimum[uid] = kueue_spec(pod).min_member
            except GangSpecError:
                self.kueue_minimum.pop(uid, None)
        return key

    def _drop(self, uid: str, key: GangKey) -> None:
        self.gang_of_uid.pop(uid, None)
        self.kueue_minimum.pop(uid, None)
        members = self.members.get(key)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self.members[key]

    def begin_relist(self) -> None:
        self._relist_seen = set()

    def finish_relist(self) -> list[GangKey]:
        """The members a relist lacked were deleted while the watch was down; their gangs."""
        seen, self._relist_seen = self._relist_seen or set(), None
        gone = [(uid, key) for uid, key in self.gang_of_uid.items() if uid not in seen]
        for uid, key in gone:
            self._drop(uid, key)
        return list(dict.fromkeys(key for _, key in gone))

    # ------------------------------------------------------------------ queries
    def spec(self, key: GangKey, pod: dict) -> GangSpec | str | None:
        """The gang's minimum and timeout; a string saying why it cannot be used; None when the
        pod is to be scheduled on its own (no PodGroup object of that name, or none watched)."""
        if key.kind == PODGROUP:
            if not self.podgroups_on:
                return None
            return self.spec_errors.get(key) or self.specs.get(key)
        try:
            return kueue_spec(pod)
        except GangSpecError as exc:
            return str(exc)

    def living(self, key: GangKey) -> dict[str, Member]:
        return self.members.get(key, {})

    def schedulable(self, key: GangKey) -> dict[str, Member]:
        """The living members kube-scheduler may place (no scheduling gate left)."""
        return {uid: m for uid, m in self.members.get(key, {}).items() if not m.gated}

    def is_member(self, uid: str) -> bool:
        """Whether the pod of this UID is a member of a gang that is placed all or nothing
        (preemption and the defragmenter pass it over): a label alone, naming no PodGroup the
        watch has, a gang of one or a size that cannot be read, spares nothing."""
        key = self.gang_of_uid.get(uid)
        if key is None:
            return False
        if key.kind == PODGROUP:
            spec = self.specs.get(key) if self.podgroups_on else None
            return spec is not None and spec.min_member > 1
        return self.kueue_minimum.get(uid, 0) > 1

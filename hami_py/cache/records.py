"""The records the parts of the usage cache hand each other: a pod's charge and a node's entry.

They live apart from the parts so that the device table, the partition tables, the pod ledger and
the node inventory can all name them without importing one another (hami_py/cache/usage.py, the
facade, composes the parts and re-exports these names).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from hami_py.cache.pod_states import PodState
from hami_py.devices.base import DeviceInfo


# HAMi's protocol: the Binding sets the pod's bind-phase to "allocating"; the device plugin ends it
# with "success" or "failed" (and then releases the node lock).
BIND_PHASE_ANNOTATION = "hami.io/bind-phase"
FINISHED_BIND_PHASES = frozenset(("success", "failed"))


def allocation_finished(annotations: dict | None) -> bool:
    """Whether the device plugin is done with the pod its annotations belong to."""
    return (annotations or {}).get(BIND_PHASE_ANNOTATION) in FINISHED_BIND_PHASES


def awaiting_allocation(pod: dict, locked_at: datetime) -> bool:
    """Whether ``pod``, named by a node lock taken at ``locked_at``, still waits for its device
    plugin (HAMi #3127): Pending with bind-phase ``allocating``, and created no later than the
    lock (one created after it is another pod of the same name)."""
    meta = pod.get("metadata") or {}
    created = meta.get("creationTimestamp")
    if isinstance(created, str):
        try:
            when = datetime.fromisoformat(created)
        except ValueError:
            when = None
        if when is not None:
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            if when > locked_at:
                return False
    return (pod.get("status") or {}).get("phase") == "Pending" \
        and (meta.get("annotations") or {}).get(BIND_PHASE_ANNOTATION) == "allocating"


def parse_lock(value: str) -> tuple[datetime, str | None, str | None]:
    """A node lock annotation (``hami.io/mutex.lock``) as (time, owner namespace, owner name);
    legacy values carry only the time. The time is RFC 3339, with any fraction of a second
    (HAMi writes RFC3339Nano since #3127, RFC3339 before; a fraction past microseconds is cut).
    Raises ValueError for a malformed one."""
    if "," in value:
        parts = value.split(",")
        if len(parts) != 3:
            raise ValueError(f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}")
        stamp, ns, name = parts
    else:
        stamp, ns, name = value, None, None
    try:
        t = datetime.fromisoformat(stamp.strip())
    except ValueError as exc:
        raise ValueError(f"malformed lock annotation time {stamp!r} in {value!r}") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t, ns, name


@dataclass(slots=True)
class UsageEntry:
    """One device's share held by one pod (already collapsed over its containers)."""
    vendor: str
    uuid: str
    mem: int
    cores: int
    slots: int


@dataclass(slots=True)
class PodUsage:
    uid: str
    namespace: str
    name: str
    node: str
    entries: list[UsageEntry]
    resolved: list[int] = field(default_factory=list)   # device slot per entry, -1 if unknown
    # MIG instances: (GPU UUID, slice mask), and once the device plugin has created the instance
    # (profile, MIG UUID, GPU instance id, compute instance id) appended to that tuple. Only MIG
    # pods carry any of it; a change of the identity replaces the record like any other change.
    mig: list[tuple] = field(default_factory=list)
    fingerprint: tuple | None = None   # the annotations it was decoded from (skip re-decoding)
    resource_version: int | None = None                  # events older than this are stale
    # Where the charge is in its life (cache/pod_states.py): moved only by the pod ledger.
    state: PodState = PodState.REBUILT
    # The decision's pod annotations, kept with a reservation of our own /filter until the bind
    # carries them in its Binding (the filter itself writes nothing).
    annotations: dict[str, str] | None = None
    # The pod as that /filter saw it, trimmed to what the bind and its events read (name,
    # namespace, uid, resourceVersion, labels, scheduling group): the bind then reads no pod.
    pod: dict | None = None
    # The resourceVersion of the pod object that /filter decided for: a relist taken after it
    # that no longer has the pod proves the pod deleted, and the unbound reservation goes.
    filtered_rv: int | None = None
    # The pod's annotations that device families keep with its charge (DeviceVendor.pod_marks).
    marks: dict[str, str] = field(default_factory=dict)
    # spec.priority and when the pod started (status.startTime, else its creation), seconds since
    # the epoch: what device preemption orders its victims by (scheduling/eviction/victims.py).
    priority: int = 0
    started: float = 0.0


@dataclass(slots=True)
class NodeEntry:
    """One node as the node inventory keeps it. ``index``, ``offset``, ``length``, ``devices``
    and ``uuid_to_slot`` are its place in the device table, written only by the table."""
    name: str
    index: int
    offset: int = 0
    length: int = 0
    devices: list[DeviceInfo] = field(default_factory=list)
    uuid_to_slot: dict[str, int] = field(default_factory=dict)
    register_text: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    annotation_key: tuple = ()          # ``annotations`` as a sorted tuple: its group in the inventory
    labels: dict[str, str] = field(default_factory=dict)
    # Families whose device plugin registration upkeep judged gone on this node: their devices
    # are left out (the node's other families stay usable); ``registered`` keeps them all.
    gone_vendors: frozenset = frozenset()
    registered: list = field(default_factory=list)     # [(vendor id, DeviceInfo)] as decoded
    # First seen asking for a handshake (Requesting_) that no plugin has answered, with nothing
    # allocatable: not used until the plugin answers or allocatable devices appear (upstream
    # adds no such node either; the kubelet would refuse its pods, OutOf<resource>).
    unanswered: bool = False
    decode_error: str | None = None
    # Per family (vendor key), why its registration on this node is refused (``decode_error``
    # joins them): its devices are left out, and /filter names the reason for the node.
    refused: dict[str, str] = field(default_factory=dict)
    lock_value: str | None = None       # hami.io/mutex.lock as last seen (a hint for the bind)
    resource_version: str = ""

    @property
    def plugin_gone(self) -> bool:
        return bool(self.gone_vendors)

"""Device inventory and usage, kept incrementally from watch events in flat typed arrays.

Upstream HAMi rebuilds every node's usage from every pod on each /filter call. Here the books are
kept as the events arrive: a node's registration annotation is decoded only when its text
changes, a pod's allocation is added once under its UID (so a replayed event is harmless) and
subtracted exactly on delete, termination or rollback. The devices live in struct-of-arrays form
(one ``array.array`` per field, a node owning a contiguous slice) so the Cython kernel can walk
any set of candidate nodes without touching a Python object.

Everything here runs on the event loop thread and never awaits: a filter reads free capacity and
records its reservation in one synchronous stretch, so two concurrent filters cannot both take the
last share of a GPU.
"""
from __future__ import annotations

import asyncio
import functools
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Iterable

import structlog

from hami_py.cache.quota import QuotaBook
from hami_py.devices.base import (
    MODE_MIG, AllocationDecodeError, DeviceDecodeError, DeviceInfo, NodeView, DeviceVendor, PodDevices,
)

log = structlog.get_logger(__name__)

VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"
HANDSHAKE_TIMEOUT_S = 60.0
DELETED_UIDS_KEPT = 16384
_TERMINAL_PHASES = ("Succeeded", "Failed")


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
    reserved: bool = False          # made by our own /filter, not yet seen back from the watch
    # Made by this process's /filter and not rolled back since: the only kind of charge a /bind
    # may trust. One rebuilt from a pod's annotations (a restart, a relist) is not: the pod may
    # carry a decision whose capacity was given to another pod since.
    decided: bool = False
    bound: bool = False             # the pod is bound (by our /bind, or as the watch shows it)
    # The decision's pod annotations, kept with a reservation of our own /filter until the bind
    # carries them in its Binding (the filter itself writes nothing).
    annotations: dict[str, str] | None = None
    # The pod as that /filter saw it, trimmed to what the bind and its events read (name,
    # namespace, uid, labels, scheduling group): the bind then needs no read of the pod.
    pod: dict | None = None
    # The resourceVersion of the pod object that /filter decided for: a relist taken after it
    # that no longer has the pod proves the pod deleted, and the unbound reservation goes.
    filtered_rv: int | None = None


@dataclass(slots=True)
class NodeEntry:
    name: str
    index: int
    offset: int = 0
    length: int = 0
    devices: list[DeviceInfo] = field(default_factory=list)
    uuid_to_slot: dict[str, int] = field(default_factory=dict)
    register_text: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
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
    lock_value: str | None = None       # hami.io/mutex.lock as last seen (a hint for the bind)
    resource_version: str = ""

    @property
    def plugin_gone(self) -> bool:
        return bool(self.gone_vendors)


def collapse(pod_devices: PodDevices, vendor: str, num_init: int, init_done: bool) -> list[UsageEntry]:
    """Per-device usage of one vendor's allocation, init containers folded in as upstream does.

    Init containers run one at a time before the app containers, so a device's charge is the
    larger of the peak over init containers and the sum over app containers. Once every init
    container has succeeded only the app containers count.
    """
    peak: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for position, container in enumerate(pod_devices):
        is_init = position < num_init
        if is_init and init_done:
            continue
        for dev in container:
            if is_init:
                cur = peak.setdefault(dev.uuid, [0, 0])
                cur[0] = max(cur[0], dev.usedmem)
                cur[1] = max(cur[1], dev.usedcores)
            else:
                cur = app.setdefault(dev.uuid, [0, 0, 0])
                cur[0] += dev.usedmem
                cur[1] += dev.usedcores
                cur[2] += 1
    entries = []
    for uuid in sorted(peak.keys() | app.keys()):
        p = peak.get(uuid, (0, 0))
        a = app.get(uuid, (0, 0, 0))
        entries.append(UsageEntry(vendor, uuid, max(p[0], a[0]), max(p[1], a[1]), max(a[2], 1)))
    return entries


def init_containers_done(pod: dict) -> bool:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not statuses:
        return False
    for st in statuses:
        term = (st.get("state") or {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            return False
    return True


# The handshake annotation, as the scheduler writes it: "Requesting_" and a local time stamp.
REQUESTING_PREFIX = "Requesting_"
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S"      # Go's time.DateTime, in the scheduler's local zone


def is_requesting(value: str | None) -> bool:
    """Upstream tests the handshake with strings.Contains(value, "Requesting")."""
    return value is not None and "Requesting" in value


def parse_handshake_deadline(value: str | None, *, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> float | None:
    """When a ``Requesting_<local time>`` handshake goes stale; None when it cannot."""
    if not value or not is_requesting(value):
        return None
    _, sep, stamp = value.partition("_")
    if not sep:
        return None
    stamped = _parse_local_stamp(stamp.strip())
    return None if stamped is None else stamped + timeout_s


@functools.lru_cache(maxsize=4096)
def _parse_local_stamp(stamp: str) -> float | None:
    # strptime costs ~15 µs, and every node event (a lock taken or released, a heartbeat) carries
    # the same stamp until the next handshake: parse each one once.
    try:
        return time.mktime(time.strptime(stamp, STAMP_FORMAT))
    except (ValueError, OverflowError):
        return None


def _rv(obj: dict) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


# Per-device columns of the cache: (attribute, array typecode, value of a new slot). Most are the
# kernel's inputs; MIG ones are a flag, the slices taken (bit mask) and the device's slice of the
# profile table; ``kind`` is the device kind's id (UsageCache.kind_ids).
_DEVICE_COLUMNS = (
    ("total_mem", "i", 0), ("total_cores", "i", 0), ("count", "i", 0), ("numa", "i", 0),
    ("health", "b", 0), ("vendor", "i", -1), ("used_mem", "q", 0), ("used_cores", "q", 0),
    ("used", "q", 0), ("dev_mig", "b", 0), ("mig_used", "q", 0), ("mig_prof_off", "i", 0),
    ("mig_prof_len", "i", 0), ("kind", "B", 0),
)


class UsageCache:
    """The scheduler's books: what every registered device has and what is taken of it."""

    def __init__(self, vendors: dict[str, DeviceVendor], *, node_selector: dict[str, str] | None = None,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S):
        self.vendors = vendors
        self.vendor_ids = {key: i for i, key in enumerate(vendors)}
        self.node_selector = node_selector or {}
        self.handshake_timeout_s = handshake_timeout_s
        # Per-device columns (_DEVICE_COLUMNS), one slot per registered device.
        for name, typecode, _ in _DEVICE_COLUMNS:
            setattr(self, name, array(typecode))
        self.device_ids: list[str] = []
        # Device kinds: (vendor id, model, mode) → the small id kept per device in ``kind``, and
        # one device of each kind, so a pod's model and mode gates are judged once per kind.
        self.kind_ids: dict[tuple[int, str, str], int] = {}
        self.kind_samples: list[tuple[int, DeviceInfo] | None] = [None]   # id 0: kinds beyond 255
        # Per-node-index arrays.
        self.node_offset = array("i")
        self.node_len = array("i")
        # NVLink-style pair scores for topology-aware placement: an n x n block per node
        # (score of device a towards device b at [offset + a*n + b]), offset -1 when none.
        self.pair_score = array("i")
        self.node_pair_offset = array("i")
        # MIG profiles, sorted by (memory, slices), each with its placements as masks in try order.
        self.prof_mem = array("i")
        self.prof_core = array("i")
        self.prof_place_off = array("i")
        self.prof_place_len = array("i")
        self.place_mask = array("q")
        self.prof_names: list[str] = []
        self.place_spans: list[tuple[int, int]] = []
        self._profile_tables: dict[tuple, tuple[int, int]] = {}
        self.mig_doubts: dict[tuple[str, str], int] = {}   # (node, GPU) → pods that make it doubtful
        self.nodes: dict[str, NodeEntry] = {}
        # name → node index for nodes with devices: one dict lookup per candidate in /filter.
        self.node_index_of: dict[str, int] = {}
        # Nodes carrying per-device annotations (cordons): only they need a device mask.
        self.annotated_nodes: set[str] = set()
        # Nodes whose handshake is pending with nothing allocatable: name → the wall-clock time
        # the stamp goes stale, when /filter leaves them out (upstream's handshake rule).
        self.handshake_deadlines: dict[str, float] = {}
        self._lock_waiters: dict[str, list[asyncio.Future]] = {}   # binds queued for a node's lock, in order
        self._free_node_indexes: list[int] = []
        self._gate_annotations = frozenset(k for v in vendors.values() for k in v.gate_annotations)
        self._devices_at: dict[int, list[DeviceInfo]] = {}   # node index -> its devices, in slice order
        self._dead_slots = 0
        # Pods.
        self.pods: dict[str, PodUsage] = {}
        self.node_pods: dict[str, set[str]] = {}
        # Decisions rolled back (failed patch or bind) that the pod's annotations may still
        # carry: events repeating exactly that decision must not charge it again.
        self.released: dict[str, tuple[str, list[UsageEntry]]] = {}
        # UIDs of pods the watch showed deleted, most recent last (bounded): a /filter of a stale
        # copy of one (kube-scheduler's cache lags) must not reserve for a pod nothing will
        # ever release, since the filter no longer writes to the pod (which would refuse it).
        self.deleted: dict[str, None] = {}
        self.quota = QuotaBook(vendors, self.vendor_ids)
        # Every annotation a pod's charge is decoded from.
        self._allocation_keys = [VGPU_NODE_ANNOTATION, *dict.fromkeys(
            k for v in vendors.values() for k in (v.allocated_annotation, *v.decision_annotations()) if k)]
        self.nodes_synced = False
        self.pods_synced = False
        self._relist_nodes_seen: set[str] = set()
        self._relist_pods_seen: set[str] = set()

    # ------------------------------------------------------------------ queries
    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    def set_plugin_gone(self, name: str, gone: frozenset[str]) -> None:
        """Registration upkeep (hami_py/k8s/registration.py) judged these families' device plugins
        on the node gone (or back, when they leave the set): their devices are left out of
        /filter as if unregistered, the node's other families stay. The pods charged keep their
        records; their devices are found again when the plugin comes back."""
        entry = self.nodes.get(name)
        gone = frozenset(gone)
        if entry is None or entry.gone_vendors == gone:
            return
        entry.gone_vendors = gone
        self._place_devices(entry, entry.registered)

    def live_reservation(self, uid: str, node: str) -> PodUsage | None:
        """The decision this process's /filter reserved for pod ``uid`` on ``node``, if it still
        holds every device it names there; None otherwise (the bind must not happen)."""
        pod = self.pods.get(uid)
        if pod is None or not pod.decided or pod.node != node or node not in self.nodes \
                or len(pod.resolved) != len(pod.entries) or -1 in pod.resolved:
            return None
        return pod

    def bound_node(self, uid: str) -> str | None:
        """The node a charged pod is bound to, None when it is not bound (or not charged)."""
        pod = self.pods.get(uid)
        return pod.node if pod is not None and pod.bound else None

    def uid_of(self, namespace: str, name: str, node: str) -> str:
        """The UID of a pod charged to ``node`` under that name ("" when there is none)."""
        for uid in self.node_pods.get(node, ()):
            pod = self.pods[uid]
            if pod.name == name and pod.namespace == namespace:
                return uid
        return ""

    def wait_lock_release(self, node: str, *, front: bool = False) -> asyncio.Future:
        """Queue for the node's lock: the future resolves when the node watch shows the lock
        released and this waiter is the first still waiting (one waiter per release, so a queue
        of binds costs one lock write each, not one per waiter per change), or when the node
        goes. ``front``: back to the head of the queue (a waiter that was woken and lost the race)."""
        future = asyncio.get_running_loop().create_future()
        waiting = [f for f in self._lock_waiters.get(node, ()) if not f.done()]   # drop given-up ones
        if front:
            waiting.insert(0, future)
        else:
            waiting.append(future)
        self._lock_waiters[node] = waiting
        return future

    def lock_waiters(self, node: str) -> int:
        """How many binds are queued for the node's lock."""
        return sum(1 for f in self._lock_waiters.get(node, ()) if not f.done())

    def first_lock_waiter(self, node: str, future: asyncio.Future) -> bool:
        return next((f for f in self._lock_waiters.get(node, ()) if not f.done()), None) is future

    def _wake_lock_waiter(self, node: str, *, every: bool = False) -> None:
        waiting = self._lock_waiters.get(node)
        while waiting:
            future = waiting.pop(0)
            if not future.done():
                future.set_result(None)
                if not every:
                    break
        if not waiting:
            self._lock_waiters.pop(node, None)

    def lock_hint(self, node: str) -> tuple[str | None, str] | None:
        """(lock annotation, resourceVersion) of the node as the watch last showed it."""
        e = self.nodes.get(node)
        if e is None or not e.resource_version:
            return None
        return e.lock_value, e.resource_version

    def device_usage(self, node: str) -> list[dict]:
        """A readable snapshot of one node's devices (for tests, the demo and metrics)."""
        e = self.nodes.get(node)
        if e is None:
            return []
        out = []
        for k, dev in enumerate(e.devices):
            j = e.offset + k
            out.append({
                "id": dev.id, "index": dev.index, "type": dev.type, "count": self.count[j],
                "used": self.used[j], "totalmem": self.total_mem[j], "usedmem": self.used_mem[j],
                "totalcore": self.total_cores[j], "usedcores": self.used_cores[j],
                "health": bool(self.health[j]),
            })
        return out

    def devices_at(self, node_index: int) -> list[DeviceInfo]:
        """The devices of the node at ``node_index`` (the kernel's node numbering), in the order
        of its slice of the device columns: what a vendor's chooser reads."""
        return self._devices_at.get(node_index, [])

    # ------------------------------------------------------------------ nodes
    def upsert_node(self, node: dict) -> None:
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in self.node_selector.items()):
            self.remove_node(name)
            return
        annotations = meta.get("annotations") or {}
        entry = self.nodes.get(name)
        first_seen = entry is None
        if first_seen:
            entry = NodeEntry(name=name, index=self._new_node_index())
            self.nodes[name] = entry
        entry.labels = labels
        lock = annotations.get("hami.io/mutex.lock")
        if lock != entry.lock_value:
            entry.lock_value = lock
            if lock is None:
                self._wake_lock_waiter(name)
        entry.resource_version = meta.get("resourceVersion") or ""
        handshake_deadline = None
        requesting = allocatable_positive = False
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for key, vendor in self.vendors.items():
            if vendor.handshake_annotation:
                d = parse_handshake_deadline(annotations.get(vendor.handshake_annotation),
                                             timeout_s=self.handshake_timeout_s)
                if d is not None:
                    handshake_deadline = d if handshake_deadline is None else min(handshake_deadline, d)
                requesting = requesting or is_requesting(annotations.get(vendor.handshake_annotation))
            res = vendor.count_resource_name
            if res and str(allocatable.get(res, "0")) not in ("0", ""):
                allocatable_positive = True
        # Keep only what the per-pod device selectors may read (cordon list and the like).
        gates = self._gate_annotations
        entry.annotations = {k: v for k, v in annotations.items() if k.startswith("hami.io/device-") or k in gates}
        if entry.annotations:
            self.annotated_nodes.add(name)
        else:
            self.annotated_nodes.discard(name)
        if first_seen or entry.unanswered:
            entry.unanswered = requesting and not allocatable_positive
        if entry.unanswered:
            self.handshake_deadlines[name] = 0.0    # expired from the start
        elif handshake_deadline is not None and not allocatable_positive:
            self.handshake_deadlines[name] = handshake_deadline
        else:
            self.handshake_deadlines.pop(name, None)
        view = NodeView(name=name, annotations=annotations, labels=labels,
                        capacity=(node.get("status") or {}).get("capacity") or {}, allocatable=allocatable)
        texts = {k: v.registration_inputs(view) for k, v in self.vendors.items()}
        if texts == entry.register_text:
            return
        entry.register_text = texts
        devices: list[tuple[int, DeviceInfo]] = []
        errors = []
        for key, vendor in self.vendors.items():
            try:
                found = vendor.parse_node_devices(view)
                for dev in found:
                    # Upstream's numa is a Go int; our column is int32 (a larger one would raise
                    # in the watch handler and stall every later node event).
                    if not -(1 << 31) <= dev.numa < 1 << 31:
                        raise DeviceDecodeError(f"device {dev.id}: numa {dev.numa} is out of range")
                ids = [dev.id for dev in found]
                if len(set(ids)) != len(ids):
                    # Usage is charged by device id: two devices under one id would have one of
                    # them charged for what the other was given.
                    twice = next(i for i in ids if ids.count(i) > 1)
                    raise DeviceDecodeError(f"device id {twice} is registered more than once")
                devices.extend((self.vendor_ids[key], dev) for dev in found)
            except DeviceDecodeError as exc:
                errors.append(f"{vendor.registration_source()}: {exc}")
        entry.decode_error = "; ".join(errors) or None
        if errors:
            log.warning("node registration rejected", node=name, error=entry.decode_error)
        self._place_devices(entry, devices)

    def _new_node_index(self) -> int:
        if self._free_node_indexes:
            return self._free_node_indexes.pop()
        self.node_offset.append(0)
        self.node_len.append(0)
        self.node_pair_offset.append(-1)
        return len(self.node_offset) - 1

    def _place_devices(self, entry: NodeEntry, devices: list[tuple[int, DeviceInfo]]) -> None:
        entry.registered = devices
        if entry.gone_vendors:
            gone_ids = {self.vendor_ids[k] for k in entry.gone_vendors if k in self.vendor_ids}
            devices = [(vid, dev) for vid, dev in devices if vid not in gone_ids]
        n = len(devices)
        if n != entry.length:
            self._kill_slice(entry)
            entry.offset = len(self.total_mem)
            entry.length = n
            for arr, fill in self._arrays_with_fill():
                arr.extend([fill] * n)
            self.device_ids.extend([""] * n)
        entry.devices = [d for _, d in devices]
        self._devices_at[entry.index] = entry.devices
        entry.uuid_to_slot = {}
        for k, (vid, dev) in enumerate(devices):
            j = entry.offset + k
            self.total_mem[j] = dev.devmem
            self.total_cores[j] = dev.devcore
            self.count[j] = dev.count
            self.numa[j] = dev.numa
            self.health[j] = 1 if dev.health else 0
            self.vendor[j] = vid
            self.device_ids[j] = dev.id
            is_mig = dev.mode == MODE_MIG
            self.dev_mig[j] = 1 if is_mig else 0
            self.mig_prof_off[j], self.mig_prof_len[j] = self._profile_table(dev) if is_mig else (0, 0)
            self.kind[j] = self._kind_id(vid, dev)
            entry.uuid_to_slot.setdefault(dev.id, j)
        self.node_offset[entry.index] = entry.offset
        self.node_len[entry.index] = entry.length
        self._place_pair_scores(entry)
        if entry.length:
            self.node_index_of[entry.name] = entry.index
        else:
            self.node_index_of.pop(entry.name, None)
        self._recount_node(entry)
        if self._dead_slots > 1024 and self._dead_slots > len(self.total_mem) // 2:
            self._compact()

    def _place_pair_scores(self, entry: NodeEntry) -> None:
        scored = [d.custom.get("pair_scores") for d in entry.devices]
        if not any(scored):
            self.node_pair_offset[entry.index] = -1
            return
        n = entry.length
        position = {d.id: k for k, d in enumerate(entry.devices)}
        block = [0] * (n * n)
        for a, scores in enumerate(scored):
            for other, value in (scores or {}).items():
                b = position.get(other)
                if b is not None:
                    block[a * n + b] = int(value)
        # A block is reused only by the same slice (same device count): _kill_slice drops it.
        offset = self.node_pair_offset[entry.index]
        if offset < 0:
            offset = len(self.pair_score)
            self.pair_score.extend(block)
        else:
            self.pair_score[offset:offset + n * n] = array("i", block)
        self.node_pair_offset[entry.index] = offset

    def _arrays_with_fill(self):
        return [(getattr(self, name), fill) for name, _, fill in _DEVICE_COLUMNS]

    def _kind_id(self, vendor_id: int, dev: DeviceInfo) -> int:
        key = (vendor_id, dev.type, dev.mode)
        kind = self.kind_ids.get(key)
        if kind is None:
            kind = len(self.kind_samples) if len(self.kind_samples) < 256 else 0
            self.kind_ids[key] = kind
            if kind:
                self.kind_samples.append((vendor_id, dev))
        return kind

    def _profile_table(self, dev: DeviceInfo) -> tuple[int, int]:
        """Where a MIG GPU's profiles sit in the profile table (shared by identical GPUs)."""
        key = tuple((p.name, p.memory_mb, p.core, p.slice_count, tuple((q.start, q.size) for q in p.placements))
                    for p in dev.mig_profiles)
        known = self._profile_tables.get(key)
        if known is not None:
            return known
        first_by_name: dict[str, list] = {}
        for p in dev.mig_profiles:
            first_by_name.setdefault(p.name, p.placements)
        offset = len(self.prof_mem)
        for p in sorted(dev.mig_profiles, key=lambda p: (p.memory_mb, p.slice_count)):
            high_first = p.name.startswith(("1g.", "3g."))
            places = sorted(first_by_name[p.name], key=lambda q: q.start, reverse=high_first)
            places = [q for q in places if 0 <= q.start and 0 < q.size and q.start + q.size <= 62]
            self.prof_mem.append(p.memory_mb)
            self.prof_core.append(p.core)
            self.prof_names.append(p.name)
            self.prof_place_off.append(len(self.place_mask))
            self.prof_place_len.append(len(places))
            for q in places:
                self.place_mask.append(((1 << q.size) - 1) << q.start)
                self.place_spans.append((q.start, q.size))
        table = (offset, len(dev.mig_profiles))
        self._profile_tables[key] = table
        return table

    def _kill_slice(self, entry: NodeEntry) -> None:
        for j in range(entry.offset, entry.offset + entry.length):
            self.vendor[j] = -1
            self.health[j] = 0
            self.device_ids[j] = ""
        self._dead_slots += entry.length
        entry.length = 0
        entry.uuid_to_slot = {}
        self.node_len[entry.index] = 0
        # Its pair-score block was sized for this slice: a bigger one (or the next node given
        # this index) must not write over the blocks behind it.
        self.node_pair_offset[entry.index] = -1

    def _recount_node(self, entry: NodeEntry) -> None:
        """Rebuild one node's usage from the pods charged to it (after its inventory changed)."""
        for j in range(entry.offset, entry.offset + entry.length):
            self.used[j] = 0
            self.used_mem[j] = 0
            self.used_cores[j] = 0
            self.mig_used[j] = 0
        for key in [k for k in self.mig_doubts if k[0] == entry.name]:
            del self.mig_doubts[key]
        for uid in self.node_pods.get(entry.name, ()):
            pod = self.pods[uid]
            pod.resolved = self._resolve(pod)
            self._apply(pod, +1)

    def _compact(self) -> None:
        live = sorted((e for e in self.nodes.values() if e.length), key=lambda e: e.offset)
        columns = [getattr(self, name) for name, _, _ in _DEVICE_COLUMNS]
        new_cols = [array(a.typecode) for a in columns]
        new_ids: list[str] = []
        pos = 0
        for e in live:
            old = e.offset
            for col, arr in zip(new_cols, columns):
                col.extend(arr[old:old + e.length])
            new_ids.extend(self.device_ids[old:old + e.length])
            e.offset = pos
            self.node_offset[e.index] = pos
            e.uuid_to_slot = {uuid: pos + (slot - old) for uuid, slot in e.uuid_to_slot.items()}
            pos += e.length
        for (name, _, _), col in zip(_DEVICE_COLUMNS, new_cols):
            setattr(self, name, col)
        self.device_ids = new_ids
        self._dead_slots = 0
        for pod in self.pods.values():
            pod.resolved = self._resolve(pod)

    def remove_node(self, name: str) -> None:
        entry = self.nodes.pop(name, None)
        if entry is None:
            return
        self._wake_lock_waiter(name, every=True)
        self._kill_slice(entry)
        self.node_index_of.pop(name, None)
        self.handshake_deadlines.pop(name, None)
        self.annotated_nodes.discard(name)
        self._free_node_indexes.append(entry.index)
        self._devices_at.pop(entry.index, None)
        # Pods charged to the node keep their records: they are released by their own events.
        for uid in self.node_pods.get(name, ()):
            self.pods[uid].resolved = []

    def replace_nodes(self, nodes: Iterable[dict]) -> None:
        """A fresh list: upsert everything in it, drop every node that is no longer there."""
        self.begin_node_relist()
        self.relist_nodes_page(nodes)
        self.finish_node_relist()

    # A relist arrives page by page: apply each page, remember what was seen, diff at the end.
    def begin_node_relist(self) -> None:
        self._relist_nodes_seen: set[str] = set()

    def relist_nodes_page(self, nodes: Iterable[dict]) -> None:
        for node in nodes:
            self.upsert_node(node)
            self._relist_nodes_seen.add((node.get("metadata") or {}).get("name"))

    def finish_node_relist(self, _list_rv: int | None = None) -> None:
        for name in [n for n in self.nodes if n not in self._relist_nodes_seen]:
            self.remove_node(name)
        self._relist_nodes_seen = set()
        self.nodes_synced = True

    # ------------------------------------------------------------------ pods
    def _resolve(self, pod: PodUsage) -> list[int]:
        entry = self.nodes.get(pod.node)
        if entry is None:
            return []
        return [entry.uuid_to_slot.get(e.uuid, -1) for e in pod.entries]

    def _apply(self, pod: PodUsage, sign: int) -> None:
        for e, j in zip(pod.entries, pod.resolved):
            if j < 0:
                continue
            self.used[j] += sign * e.slots
            self.used_mem[j] += sign * e.mem
            self.used_cores[j] += sign * e.cores
        entry = self.nodes.get(pod.node)
        if entry is not None:
            self._fail_closed(entry, pod, sign)
        if pod.mig:
            if entry is None:
                return
            if sign > 0:
                for inst in pod.mig:
                    j = entry.uuid_to_slot.get(inst[0], -1)
                    if j >= 0:
                        self.mig_used[j] |= inst[1]
            else:
                self._refresh_mig(entry, pod.uid)

    def _fail_closed(self, entry: NodeEntry, pod: PodUsage, sign: int) -> None:
        """Upstream's MIG fail-closed rule: a pod on a MIG GPU without a placement record, or a
        placement record on a GPU that is not in MIG mode, means the books cannot say which
        slices are free, so that GPU is offered to nobody until the pod is gone."""
        mig_uuids = {inst[0] for inst in pod.mig}
        doubtful = set()
        for e in pod.entries:
            j = entry.uuid_to_slot.get(e.uuid, -1)
            if j >= 0 and self.dev_mig[j] and e.uuid not in mig_uuids:
                doubtful.add(e.uuid)
        for uuid in mig_uuids:
            j = entry.uuid_to_slot.get(uuid, -1)
            if j >= 0 and not self.dev_mig[j]:
                doubtful.add(uuid)
        for uuid in doubtful:
            key = (entry.name, uuid)
            left = self.mig_doubts.get(key, 0) + sign
            if left > 0:
                self.mig_doubts[key] = left
            else:
                self.mig_doubts.pop(key, None)
            j = entry.uuid_to_slot[uuid]
            if left > 0:
                self.health[j] = 0
            else:
                self.health[j] = 1 if entry.devices[j - entry.offset].health else 0
            if sign > 0:
                log.warning("GPU withheld: MIG placement unknown", node=entry.name, gpu=uuid,
                            pod=f"{pod.namespace}/{pod.name}")

    def _refresh_mig(self, entry: NodeEntry, leaving: str) -> None:
        """Slices are a union, not a sum: recompute them from the node's other pods."""
        slots = {j for j in range(entry.offset, entry.offset + entry.length) if self.dev_mig[j]}
        for j in slots:
            self.mig_used[j] = 0
        for uid in self.node_pods.get(entry.name, ()):
            if uid == leaving:
                continue
            for inst in self.pods[uid].mig:
                j = entry.uuid_to_slot.get(inst[0], -1)
                if j in slots:
                    self.mig_used[j] |= inst[1]

    def add_pod_usage(self, pod: PodUsage) -> None:
        """Charge a pod's usage; a pod already charged is replaced (add is idempotent per UID)."""
        if pod.reserved:
            self.released.pop(pod.uid, None)
        old = self.pods.get(pod.uid)
        if old is not None:
            if old.node == pod.node and old.entries == pod.entries and old.mig == pod.mig:
                old.resource_version = pod.resource_version or old.resource_version
                old.reserved = pod.reserved
                old.decided = old.decided or pod.decided
                return
            self.remove_pod(old.uid)
        pod.resolved = self._resolve(pod)
        if pod.resolved and -1 in pod.resolved:
            log.warning("pod holds a device its node does not register", pod=f"{pod.namespace}/{pod.name}",
                        node=pod.node)
        self.pods[pod.uid] = pod
        self.node_pods.setdefault(pod.node, set()).add(pod.uid)
        self._apply(pod, +1)
        self.quota.charge(pod.namespace, pod.entries, +1)

    def release_pod(self, uid: str) -> PodUsage | None:
        """Roll back a decision: free its usage and ignore events that still carry it."""
        pod = self.remove_pod(uid)
        if pod is not None:
            self.released[uid] = (pod.node, pod.entries)
        return pod

    def release_unbound_reservations(self) -> int:
        """Roll back every decision of this process's /filter that is not bound yet (at the end
        of its leadership): /filter writes nothing, so no other replica can see them, and the new
        leader may give their devices to other pods; a bind of one is sent back to /filter. How
        many were released."""
        unbound = [uid for uid, p in self.pods.items()
                   if p.reserved and p.decided and p.resource_version is None and not p.bound]
        for uid in unbound:
            self.release_pod(uid)
        return len(unbound)

    def forget_decision(self, pod: dict) -> None:
        """The decision an unbound pod object carries holds nothing any more (the pod was filtered
        again and fits nowhere; scheduling/stale.py clears it from the pod): uncharge it and, as
        after release_pod, ignore events that still carry it unless the pod is bound."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        self.remove_pod(uid)
        try:
            usage = self.pod_usage_from_object(pod)
        except AllocationDecodeError:
            return  # a garbled allocation was never charged
        if usage is not None:
            self.released[uid] = (usage.node, usage.entries)

    def remove_pod(self, uid: str) -> PodUsage | None:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return None
        self._apply(pod, -1)
        self.quota.charge(pod.namespace, pod.entries, -1)
        members = self.node_pods.get(pod.node)
        if members is not None:
            members.discard(uid)
            if not members:
                del self.node_pods[pod.node]
        return pod

    def pod_usage_from_object(self, pod: dict) -> PodUsage | None:
        """The usage a pod object's annotations claim, or None when it claims none."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node = annotations.get(VGPU_NODE_ANNOTATION)
        if not node:
            return None
        spec = pod.get("spec") or {}
        num_init = len(spec.get("initContainers") or [])
        init_done = num_init > 0 and init_containers_done(pod)
        entries: list[UsageEntry] = []
        mig: list[tuple] = []
        for key, vendor in self.vendors.items():
            devices = vendor.decode_allocation(annotations)
            if devices:
                entries.extend(collapse(devices, key, num_init, init_done))
            for uuid, start, size, runtime in vendor.decode_partitions(annotations):
                if start + size <= 62:
                    mask = ((1 << size) - 1) << start
                    mig.append((uuid, mask) if runtime is None else
                               (uuid, mask, sys.intern(runtime[0]), *runtime[1:]))
        return PodUsage(uid=meta.get("uid", ""), namespace=meta.get("namespace", ""),
                        name=meta.get("name", ""), node=node, entries=entries,
                        resource_version=_rv(pod), mig=mig)

    def on_pod_event(self, event_type: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self.remove_pod(uid)
            self.released.pop(uid, None)
            self.deleted[uid] = None
            if len(self.deleted) > DELETED_UIDS_KEPT:
                del self.deleted[next(iter(self.deleted))]
            return
        if self.deleted:
            self.deleted.pop(uid, None)   # the UID lives (again, where a test re-creates it)
        current = self.pods.get(uid)
        rv = _rv(pod)
        if current is not None and current.resource_version is not None and rv is not None \
                and rv < current.resource_version:
            return  # older than what our own patch produced: a stale event in flight
        if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            self.remove_pod(uid)
            return
        fingerprint = self._fingerprint(pod, meta)
        if current is not None and fingerprint is not None and current.fingerprint == fingerprint:
            # Most pod events (status, labels, the bind-phase patch) leave the allocation alone.
            if rv is not None:
                current.resource_version = rv
            current.reserved = False
            return
        try:
            usage = self.pod_usage_from_object(pod)
        except AllocationDecodeError as exc:
            log.warning("pod allocation annotation rejected", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                        error=str(exc))
            return
        if usage is None:
            # No scheduler decision on this object. A reservation of our /filter not bound yet
            # stays (the filter writes nothing: its Binding carries the decision), unless the pod
            # shows itself bound without it (bound by someone else: it runs on no device of ours);
            # one the API server has seen and that is now gone is released.
            if current is not None and rv is not None and (
                    current.resource_version is not None
                    or (not current.bound and (pod.get("spec") or {}).get("nodeName"))):
                self.remove_pod(uid)
            return
        if current is not None and current.reserved and current.resource_version is None \
                and (usage.node, usage.entries) != (current.node, current.entries) \
                and not ((pod.get("spec") or {}).get("nodeName") and not current.bound):
            # Our reservation is not bound yet, so any other decision an unbound object shows
            # predates it (left by an older scheduler, or a relist or a late event): keep the
            # newer reservation charged. A pod bound with another decision runs on that one.
            return
        if self.released.get(uid) == (usage.node, usage.entries) and not (pod.get("spec") or {}).get("nodeName"):
            # The annotations still show a decision we rolled back. A pod that is bound all the
            # same (a Binding that landed after we gave up on it) is always charged.
            return
        self.add_pod_usage(usage)
        record = self.pods[uid]
        record.fingerprint = fingerprint
        record.bound = record.bound or bool((pod.get("spec") or {}).get("nodeName"))   # never unbound

    def _fingerprint(self, pod: dict, meta: dict) -> tuple | None:
        annotations = meta.get("annotations") or {}
        if VGPU_NODE_ANNOTATION not in annotations:
            return None
        spec = pod.get("spec") or {}
        num_init = len(spec.get("initContainers") or [])
        return (tuple(annotations.get(k) for k in self._allocation_keys), num_init,
                num_init > 0 and init_containers_done(pod), bool(spec.get("nodeName")))

    def replace_pods(self, pods: Iterable[dict], list_rv: int | None) -> None:
        """A fresh list: apply everything in it; pods missing from it were deleted meanwhile."""
        self.begin_pod_relist()
        self.relist_pods_page(pods)
        self.finish_pod_relist(list_rv)

    def begin_pod_relist(self) -> None:
        self._relist_pods_seen: set[str] = set()

    def relist_pods_page(self, pods: Iterable[dict]) -> None:
        seen = self._relist_pods_seen
        for pod in pods:
            seen.add((pod.get("metadata") or {}).get("uid"))
            self.on_pod_event("ADDED", pod)

    def finish_pod_relist(self, list_rv: int | None) -> None:
        """Pods the list no longer has were deleted meanwhile. A reservation not yet seen back
        from the watch (no resourceVersion: our /filter's, not bound or its Binding not seen yet)
        is kept unless the list is newer than the pod object that filter decided for: the list
        may simply predate the pod, but one taken after it that lacks the pod proves it deleted
        (while the watch was down; a reservation never bound would otherwise leak)."""
        seen = self._relist_pods_seen
        for uid in [u for u in self.pods if u not in seen]:
            p = self.pods[uid]
            if p.resource_version is None and p.reserved and (
                    list_rv is None or p.filtered_rv is None or p.filtered_rv > list_rv):
                continue
            if list_rv is not None and p.resource_version is not None and p.resource_version > list_rv:
                continue
            self.remove_pod(uid)
        self._relist_pods_seen = set()
        self.pods_synced = True

    # ------------------------------------------------------------------ checks
    def recount(self) -> dict[str, tuple[int, int, int]]:
        """Usage recomputed from scratch from the pod records (for invariant checks in tests)."""
        totals: dict[str, list[int]] = {}
        for pod in self.pods.values():
            for e, j in zip(pod.entries, pod.resolved):
                if j >= 0:
                    t = totals.setdefault(self.device_ids[j], [0, 0, 0])
                    t[0] += e.slots
                    t[1] += e.mem
                    t[2] += e.cores
        return {k: tuple(v) for k, v in totals.items()}

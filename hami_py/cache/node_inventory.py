"""The node inventory: which nodes are schedulable, what they register, and who waits for their locks.

A node's registration annotations are decoded only when the text a family reads changes (most
node events are heartbeats and lock changes), and the devices found are laid out in the device
table; the pod ledger then charges the node's pods again. Besides devices a node carries state
the scheduler must honour without decoding anything: the node selector, upstream's handshake
rule (a pending ``Requesting_`` stamp with nothing allocatable goes stale and leaves the node
out), families whose device plugin registration upkeep judged gone, the per-device gate
annotations (cordons) a pod's selectors read, and ``hami.io/mutex.lock``, whose release wakes
the next bind queued for it.
"""
from __future__ import annotations

import asyncio
import functools
import time
from typing import Iterable

import structlog

from hami_py.cache.device_table import DeviceTable
from hami_py.cache.pod_ledger import PodLedger
from hami_py.cache.records import NodeEntry
from hami_py.devices.base import (
    DeviceDecodeError, DeviceInfo, DeviceVendor, NodeView, NoDevicesRegistered, internal_ip,
)
from hami_py.devices.codec import check_device_id

log = structlog.get_logger(__name__)

HANDSHAKE_TIMEOUT_S = 60.0
NODE_LOCK_ANNOTATION = "hami.io/mutex.lock"

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


class NodeInventory:
    """Nodes by name, their registered devices, handshake deadlines and lock-waiter queues."""

    def __init__(self, vendors: dict[str, DeviceVendor], vendor_ids: dict[str, int], table: DeviceTable,
                 ledger: PodLedger, nodes: dict[str, NodeEntry], *, node_selector: dict[str, str] | None = None,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S):
        self.vendors = vendors
        self.vendor_ids = vendor_ids
        self.table = table
        self.ledger = ledger
        self.nodes = nodes
        self.node_selector = node_selector or {}
        self.handshake_timeout_s = handshake_timeout_s
        # Nodes carrying per-device annotations (cordons) or a family's node switch: only they
        # need gates of their own. Grouped by the annotations they carry, so a filter builds the
        # gates once per group (a family's plugin may write the same switch on all its nodes).
        self.annotated_nodes: set[str] = set()
        self.annotation_groups: dict[tuple, set[str]] = {}
        # Nodes whose handshake is pending with nothing allocatable: name → the wall-clock time
        # the stamp goes stale, when /filter leaves them out (upstream's handshake rule).
        self.handshake_deadlines: dict[str, float] = {}
        # Nodes whose registration of some family is refused (NodeEntry.refused): /filter names
        # the reason for them.
        self.refused_nodes: set[str] = set()
        # on_refused(node, why): told once per new reason a node's registration is refused (the
        # app makes it a warning Event on the node).
        self.on_refused = None
        self._lock_waiters: dict[str, list[asyncio.Future]] = {}   # binds queued for a node's lock, in order
        self._gate_annotations = frozenset(k for v in vendors.values() for k in v.gate_annotations)
        self.nodes_synced = False
        self._relist_nodes_seen: set[str] = set()

    # ------------------------------------------------------------------ node events
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
            entry = NodeEntry(name=name, index=self.table.new_node_index())
            self.nodes[name] = entry
        entry.labels = labels
        lock = annotations.get(NODE_LOCK_ANNOTATION)
        if lock != entry.lock_value:
            entry.lock_value = lock
            if lock is None:
                self._wake_lock_waiter(name)
        entry.resource_version = meta.get("resourceVersion") or ""
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        self._judge_handshake(entry, annotations, allocatable, first_seen)
        # Keep only what the per-pod device selectors may read (cordon list and the like).
        gates = self._gate_annotations
        kept = {k: v for k, v in annotations.items() if k.startswith("hami.io/device-") or k in gates}
        if kept != entry.annotations or first_seen:
            self._regroup(entry, kept)
        view = NodeView(name=name, annotations=annotations, labels=labels,
                        capacity=(node.get("status") or {}).get("capacity") or {}, allocatable=allocatable,
                        internal_ip=internal_ip(node))
        texts = {k: v.registration_inputs(view) for k, v in self.vendors.items()}
        if texts == entry.register_text:
            return
        entry.register_text = texts
        self._place_devices(entry, self._decode_devices(entry, view))

    def _judge_handshake(self, entry: NodeEntry, annotations: dict, allocatable: dict, first_seen: bool) -> None:
        handshake_deadline = None
        requesting = allocatable_positive = False
        for vendor in self.vendors.values():
            if vendor.handshake_annotation:
                d = parse_handshake_deadline(annotations.get(vendor.handshake_annotation),
                                             timeout_s=self.handshake_timeout_s)
                if d is not None:
                    handshake_deadline = d if handshake_deadline is None else min(handshake_deadline, d)
                requesting = requesting or is_requesting(annotations.get(vendor.handshake_annotation))
            res = vendor.count_resource_name
            if res and str(allocatable.get(res, "0")) not in ("0", ""):
                allocatable_positive = True
        if first_seen or entry.unanswered:
            entry.unanswered = requesting and not allocatable_positive
        if entry.unanswered:
            self.handshake_deadlines[entry.name] = 0.0    # expired from the start
        elif handshake_deadline is not None and not allocatable_positive:
            self.handshake_deadlines[entry.name] = handshake_deadline
        else:
            self.handshake_deadlines.pop(entry.name, None)

    def _decode_devices(self, entry: NodeEntry, view: NodeView) -> list[tuple[int, DeviceInfo]]:
        devices: list[tuple[int, DeviceInfo]] = []
        refused: dict[str, str] = {}
        empty: list[str] = []
        for key, vendor in self.vendors.items():
            try:
                found = vendor.parse_node_devices(view)
                for dev in found:
                    # Upstream's numa is a Go int; our column is int32 (a larger one would raise
                    # in the watch handler and stall every later node event).
                    if not -(1 << 31) <= dev.numa < 1 << 31:
                        raise DeviceDecodeError(f"device {dev.id}: numa {dev.numa} is out of range")
                    # A decision names its devices by id in a list split on ',', ':' and ';': a
                    # device whose id holds one could be chosen and never written.
                    check_device_id(dev.id)
                ids = [dev.id for dev in found]
                if len(set(ids)) != len(ids):
                    # Usage is charged by device id: two devices under one id would have one of
                    # them charged for what the other was given.
                    twice = next(i for i in ids if ids.count(i) > 1)
                    raise DeviceDecodeError(f"device id {twice} is registered more than once")
                devices.extend((self.vendor_ids[key], dev) for dev in found)
            except NoDevicesRegistered as exc:     # as if nothing were registered: no refusal
                empty.append(f"{vendor.registration_source()}: {exc}")
            except DeviceDecodeError as exc:
                refused[key] = f"{vendor.registration_source()}: {exc}"
        before = entry.refused
        entry.refused = refused
        entry.decode_error = "; ".join([*refused.values(), *empty]) or None
        if entry.decode_error:
            log.warning("node registration rejected", node=entry.name, error=entry.decode_error)
        if refused:
            self.refused_nodes.add(entry.name)
            if refused != before and self.on_refused is not None:
                self.on_refused(entry.name, "; ".join(refused.values()))
        else:
            self.refused_nodes.discard(entry.name)
        return devices

    def _place_devices(self, entry: NodeEntry, devices: list[tuple[int, DeviceInfo]]) -> None:
        """Lay the node's usable devices out in the device table and charge its pods again."""
        entry.registered = devices
        if entry.gone_vendors:
            gone_ids = {self.vendor_ids[k] for k in entry.gone_vendors if k in self.vendor_ids}
            devices = [(vid, dev) for vid, dev in devices if vid not in gone_ids]
        self.table.place(entry, devices)
        self.ledger.recharge_node(entry)
        if self.table.needs_compaction():
            self.table.compact()
            self.ledger.resolve_all()

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

    def _regroup(self, entry: NodeEntry, kept: dict[str, str]) -> None:
        old = self.annotation_groups.get(entry.annotation_key)
        if old is not None:
            old.discard(entry.name)
            if not old:
                del self.annotation_groups[entry.annotation_key]
        entry.annotations = kept
        entry.annotation_key = tuple(sorted(kept.items()))
        if kept:
            self.annotated_nodes.add(entry.name)
            self.annotation_groups.setdefault(entry.annotation_key, set()).add(entry.name)
        else:
            self.annotated_nodes.discard(entry.name)

    def remove_node(self, name: str) -> None:
        entry = self.nodes.pop(name, None)
        if entry is None:
            return
        self._wake_lock_waiter(name, every=True)
        self.table.release(entry)
        self.handshake_deadlines.pop(name, None)
        self.refused_nodes.discard(name)
        self._regroup(entry, {})
        # Pods charged to the node keep their records: they are released by their own events.
        self.ledger.unresolve_node(name)

    # ------------------------------------------------------------------ relists
    def replace_nodes(self, nodes: Iterable[dict]) -> None:
        """A fresh list: upsert everything in it, drop every node that is no longer there."""
        self.begin_node_relist()
        self.relist_nodes_page(nodes)
        self.finish_node_relist()

    # A relist arrives page by page: apply each page, remember what was seen, diff at the end.
    def begin_node_relist(self) -> None:
        self._relist_nodes_seen = set()

    def relist_nodes_page(self, nodes: Iterable[dict]) -> None:
        for node in nodes:
            self.upsert_node(node)
            self._relist_nodes_seen.add((node.get("metadata") or {}).get("name"))

    def finish_node_relist(self, _list_rv: int | None = None) -> None:
        for name in [n for n in self.nodes if n not in self._relist_nodes_seen]:
            self.remove_node(name)
        self._relist_nodes_seen = set()
        self.nodes_synced = True

    # ------------------------------------------------------------------ node locks
    def lock_hint(self, node: str) -> tuple[str | None, str] | None:
        """(lock annotation, resourceVersion) of the node as the watch last showed it."""
        e = self.nodes.get(node)
        if e is None or not e.resource_version:
            return None
        return e.lock_value, e.resource_version

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

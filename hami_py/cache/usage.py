"""The scheduler's books, as one object: UsageCache, the facade over the cache's four parts.

Callers (the filter, the bind, the informers, registration upkeep, the metrics) see one
``UsageCache`` with the API it always had; behind it the work is split so that each kind of
change touches one part:

* ``device_table.DeviceTable``      every device as a slot of flat typed columns (the kernel's input)
* ``partitions.PartitionTables``    MIG profiles, slices taken, the fail-closed rule
* ``pod_ledger.PodLedger``          what each pod UID is charged; events, relists, rollbacks
* ``node_inventory.NodeInventory``  nodes, their registration, handshakes, gone plugins, lock waiters

The facade only composes them: the parts never import it, and each is handed the parts it
writes to. Everything runs on the event loop thread and never awaits: a filter reads free capacity
and records its reservation in one synchronous stretch, so two concurrent filters cannot both take
the last share of a GPU.

The parts' state and verbs are bound onto the facade as plain attributes (the same objects, not
copies): ``cache.total_mem`` is ``cache.table.total_mem``, ``cache.add_pod_usage`` is the ledger's
bound method, so /filter pays one attribute lookup per use and no extra call. That holds because
no part ever rebinds them: the device table compacts its columns in place.
"""
from __future__ import annotations

from datetime import datetime

from hami_py.cache.device_table import DeviceTable
from hami_py.cache.node_inventory import (
    HANDSHAKE_TIMEOUT_S, REQUESTING_PREFIX, STAMP_FORMAT, NodeInventory, is_requesting, parse_handshake_deadline,
)
from hami_py.cache.partitions import PartitionTables
from hami_py.cache.pod_ledger import VGPU_NODE_ANNOTATION, PodLedger, collapse
from hami_py.cache.pod_states import PodState
from hami_py.cache.quota import QuotaBook
from hami_py.cache.records import NodeEntry, PodUsage, UsageEntry
from hami_py.cache.stuck_locks import DEFAULT_STUCK_AFTER_S, StuckLock, stuck_lock, stuck_locks
from hami_py.devices.base import DeviceInfo, DeviceVendor

__all__ = [
    "HANDSHAKE_TIMEOUT_S", "REQUESTING_PREFIX", "STAMP_FORMAT", "VGPU_NODE_ANNOTATION", "NodeEntry", "PodState", "PodUsage",
    "UsageCache", "UsageEntry", "collapse", "is_requesting", "parse_handshake_deadline",
]

# What each part shows through the facade, by name (state and verbs alike).
_TABLE_ATTRIBUTES = ("device_ids", "kind_ids", "kind_samples", "node_index_of", "candidates")
_PARTITION_ATTRIBUTES = ("prof_names", "place_spans", "mig_doubts")
_LEDGER_ATTRIBUTES = (
    "pods", "node_pods", "released", "deleted", "live_pods",
    "live_reservation", "scheduled_node", "bound_node", "uid_of", "add_pod_usage", "release_pod", "release_unbound_reservations",
    "forget_decision", "remove_pod", "mark_bound", "mark_held", "marks_of", "charge_of",
    "pod_usage_from_object", "on_pod_event", "replace_pods", "begin_pod_relist", "relist_pods_page",
    "finish_pod_relist", "recount",
)
_INVENTORY_ATTRIBUTES = (
    "nodes", "annotated_nodes", "annotation_groups", "handshake_deadlines", "refused_nodes",
    "upsert_node", "remove_node", "set_plugin_gone", "replace_nodes", "begin_node_relist", "relist_nodes_page",
    "finish_node_relist", "lock_hint", "wait_lock_release", "lock_waiters", "first_lock_waiter",
)


class UsageCache:
    """The scheduler's books: what every registered device has and what is taken of it."""

    def __init__(self, vendors: dict[str, DeviceVendor], *, node_selector: dict[str, str] | None = None,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, lock_stuck_after_s: float = DEFAULT_STUCK_AFTER_S):
        self.vendors = vendors
        self.vendor_ids = {key: i for i, key in enumerate(vendors)}
        self.table = DeviceTable()
        self.partitions = PartitionTables(self.table)
        self.quota = QuotaBook(vendors, self.vendor_ids)
        nodes: dict[str, NodeEntry] = {}     # the inventory's, read by the ledger to resolve slots
        self.ledger = PodLedger(vendors, self.table, self.partitions, self.quota, nodes)
        self.inventory = NodeInventory(vendors, self.vendor_ids, self.table, self.ledger, nodes,
                                       node_selector=node_selector, handshake_timeout_s=handshake_timeout_s)
        self.node_selector = self.inventory.node_selector
        self.handshake_timeout_s = handshake_timeout_s
        self.lock_stuck_after_s = lock_stuck_after_s
        # Every kernel input by its name (total_mem, …, dev_mig, …, prof_mem, …, place_mask).
        for name in self.table.kernel_arrays():
            setattr(self, name, getattr(self.table, name))
        for part, names in ((self.table, _TABLE_ATTRIBUTES), (self.partitions, _PARTITION_ATTRIBUTES),
                            (self.ledger, _LEDGER_ATTRIBUTES), (self.inventory, _INVENTORY_ATTRIBUTES)):
            for name in names:
                setattr(self, name, getattr(part, name))

    @property
    def nodes_synced(self) -> bool:
        return self.inventory.nodes_synced

    @property
    def pods_synced(self) -> bool:
        return self.ledger.pods_synced

    @property
    def synced(self) -> bool:
        return self.inventory.nodes_synced and self.ledger.pods_synced

    def stuck_lock(self, node: str, now: datetime | None = None) -> StuckLock | None:
        """The node's lock if its holder's allocation has made no progress (cache/stuck_locks.py)."""
        entry = self.nodes.get(node)
        if entry is None or not entry.lock_value:
            return None
        return stuck_lock(entry, allocating=self._allocating_holder, after_s=self.lock_stuck_after_s, now=now)

    def stuck_locks(self) -> list[StuckLock]:
        """Every stuck node lock (for the metrics)."""
        return stuck_locks(self.nodes.values(), allocating=self._allocating_holder, after_s=self.lock_stuck_after_s)

    def lock_holder_waiting(self, node: str, namespace: str, name: str, locked_at: datetime) -> bool | None:
        """What the books know of the pod an expired node lock names (k8s/nodelock.py, HAMi
        #3127): False when it is bound to the node and its device plugin is done with it; True
        when it is bound there, still allocating, and its start (``status.startTime``, else its
        creation) is no later than the lock: created before the lock and not yet taken in by the
        kubelet, so Pending. None otherwise (not charged there, or started after the lock): the
        pod is read."""
        pod = self.pods.get(self.ledger.uid_of(namespace, name, node))
        if pod is None or not pod.state.bound:
            return None
        if not pod.state.allocating:
            return False
        return True if 0 < pod.started <= locked_at.timestamp() else None

    def _allocating_holder(self, namespace: str, name: str, node: str) -> bool:
        # Bound onto the node and its device plugin not done with it: the allocation the lock guards.
        pod = self.pods.get(self.ledger.uid_of(namespace, name, node))
        return pod is not None and pod.state.allocating

    def device_usage(self, node: str) -> list[dict]:
        """A readable snapshot of one node's devices (for tests, the demo and metrics)."""
        entry = self.nodes.get(node)
        return [] if entry is None else self.table.snapshot(entry)

    def device_marks(self, node_index: int) -> list[list[tuple[dict[str, str], UsageEntry]]]:
        """Per device of the node at ``node_index`` (as :meth:`devices_at` orders them), each pod
        charged to it: (its marks, ``DeviceVendor.pod_marks``, and its charge there). For the
        choosers of families whose devices take a mode from the tasks they host."""
        entry = self.table.entry_at(node_index)
        return [] if entry is None else self.ledger.device_marks(entry)

    def devices_at(self, node_index: int) -> list[DeviceInfo]:
        """The devices of the node at ``node_index`` (the kernel's node numbering), in the order
        of its slice of the device columns: what a vendor's chooser reads."""
        return self.table.devices_at(node_index)

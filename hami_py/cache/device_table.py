"""The device table: every registered device as one slot of flat typed columns, the kernel's input.

Upstream HAMi walks Go structs per node on each /filter. Here the Cython kernel
(``hami_py._kernel.filter_nodes``) walks any set of candidate nodes without touching a Python
object, so each device is one slot in a set of ``array.array`` columns and each node owns a
contiguous slice of them, found through its node index (``node_offset``/``node_len``). This module
owns that layout and nothing else: slots, node indexes, NVLink-style pair-score blocks, device
kinds, and compaction of the slots that removed nodes leave behind. What is charged to a slot is
decided by the pod ledger; partition kinds (partitions.py) add columns and lookup arrays of their
own through ``add_columns`` and ``add_lookup``, and every one of them is an attribute of the table
by its kernel name.

Columns are never replaced, only resized in place: an alias of one (the UsageCache facade's
attributes, a kernel call's argument) is always the live column, compaction or not.
"""
from __future__ import annotations

from array import array
from typing import Callable, Iterable

from hami_py.cache.candidates import CandidateLists
from hami_py.cache.records import NodeEntry, UsageEntry
from hami_py.devices.base import DeviceInfo

# Per-device columns: (attribute, array typecode, value of a new slot). ``kind`` is the device
# kind's id (DeviceTable.kind_ids); the rest are the kernel's capacity and usage inputs.
BASE_COLUMNS = (
    ("total_mem", "i", 0), ("total_cores", "i", 0), ("count", "i", 0), ("numa", "i", 0),
    ("health", "b", 0), ("vendor", "i", -1), ("used_mem", "q", 0), ("used_cores", "q", 0),
    ("used", "q", 0), ("kind", "B", 0),
)
# Compact once removed nodes have left this many dead slots, and more dead than live ones.
_COMPACT_AFTER_DEAD_SLOTS = 1024


class DeviceTable:
    """Struct-of-arrays device columns, one slice per node, in the kernel's numbering."""

    def __init__(self) -> None:
        self.columns: list[tuple[str, str, int]] = []       # every per-device column, in order
        # Partition kinds' per-device setters, called for each device placed: (slot, device).
        self._device_fillers: list[Callable[[int, DeviceInfo], None]] = []
        self.lookups: list[str] = []       # per-kind arrays that are not per device (never compacted)
        self.device_ids: list[str] = []    # slot → device id ("" for a dead slot)
        self.add_columns(BASE_COLUMNS)
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
        # name → node index for nodes with devices: one dict lookup per candidate in /filter.
        self.node_index_of: dict[str, int] = {}
        # Candidate lists mapped to node indexes, remembered until node_index_of changes.
        self.candidates = CandidateLists(self.node_index_of)
        self._free_node_indexes: list[int] = []
        self._owners: dict[int, NodeEntry] = {}       # node index → the entry holding it
        self.dead_slots = 0

    def add_columns(self, columns: Iterable[tuple[str, str, int]],
                    fill: Callable[[int, DeviceInfo], None] | None = None) -> None:
        """More per-device columns (before any device is placed); ``fill(slot, device)`` sets
        them for each device placed."""
        if self.device_ids:
            raise RuntimeError("device columns are added before any device is placed")
        for name, typecode, default in columns:
            setattr(self, name, array(typecode))
            self.columns.append((name, typecode, default))
        if fill is not None:
            self._device_fillers.append(fill)

    def add_lookup(self, name: str, typecode: str) -> array:
        """A kernel input that is not per device (a profile table): appended to, never moved."""
        setattr(self, name, array(typecode))
        self.lookups.append(name)
        return getattr(self, name)

    def kernel_arrays(self) -> list[str]:
        """The names of every array the kernel reads (per device, per node index, lookups)."""
        return [name for name, _, _ in self.columns] + [
            "node_offset", "node_len", "pair_score", "node_pair_offset", *self.lookups]

    # ------------------------------------------------------------------ node indexes and slices
    def new_node_index(self) -> int:
        if self._free_node_indexes:
            return self._free_node_indexes.pop()
        self.node_offset.append(0)
        self.node_len.append(0)
        self.node_pair_offset.append(-1)
        return len(self.node_offset) - 1

    def place(self, entry: NodeEntry, devices: list[tuple[int, DeviceInfo]]) -> None:
        """Lay out a node's devices ([(vendor id, device)]) in its slice: the same slice when the
        count is unchanged, a fresh one at the end otherwise (the old one goes dead)."""
        n = len(devices)
        if n != entry.length:
            self.kill_slice(entry)
            entry.offset = len(self.total_mem)
            entry.length = n
            for name, _, default in self.columns:
                getattr(self, name).extend([default] * n)
            self.device_ids.extend([""] * n)
        entry.devices = [d for _, d in devices]
        self._owners[entry.index] = entry
        entry.uuid_to_slot = {}
        fillers = self._device_fillers
        for k, (vid, dev) in enumerate(devices):
            j = entry.offset + k
            self.total_mem[j] = dev.devmem
            self.total_cores[j] = dev.devcore
            self.count[j] = dev.count
            self.numa[j] = dev.numa
            self.health[j] = 1 if dev.health else 0
            self.vendor[j] = vid
            self.device_ids[j] = dev.id
            self.kind[j] = self._kind_id(vid, dev)
            for fill in fillers:
                fill(j, dev)
            entry.uuid_to_slot.setdefault(dev.id, j)
        self.node_offset[entry.index] = entry.offset
        self.node_len[entry.index] = entry.length
        self._place_pair_scores(entry)
        if entry.length:
            if self.node_index_of.get(entry.name) != entry.index:
                self.node_index_of[entry.name] = entry.index
                self.candidates.forget()
        elif self.node_index_of.pop(entry.name, None) is not None:
            self.candidates.forget()

    def release(self, entry: NodeEntry) -> None:
        """The node is gone: its slice goes dead and its index is free for the next node."""
        self.kill_slice(entry)
        if self.node_index_of.pop(entry.name, None) is not None:
            self.candidates.forget()
        self._free_node_indexes.append(entry.index)
        self._owners.pop(entry.index, None)

    def kill_slice(self, entry: NodeEntry) -> None:
        for j in range(entry.offset, entry.offset + entry.length):
            self.vendor[j] = -1
            self.health[j] = 0
            self.device_ids[j] = ""
        self.dead_slots += entry.length
        entry.length = 0
        entry.uuid_to_slot = {}
        self.node_len[entry.index] = 0
        # Its pair-score block was sized for this slice: a bigger one (or the next node given
        # this index) must not write over the blocks behind it.
        self.node_pair_offset[entry.index] = -1

    def entry_at(self, node_index: int) -> NodeEntry | None:
        """The node entry holding ``node_index``, if any."""
        return self._owners.get(node_index)

    def devices_at(self, node_index: int) -> list[DeviceInfo]:
        """The devices of the node at ``node_index`` (the kernel's node numbering), in the order
        of its slice of the device columns: what a vendor's chooser reads."""
        entry = self._owners.get(node_index)
        return entry.devices if entry is not None else []

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
        # A block is reused only by the same slice (same device count): kill_slice drops it.
        offset = self.node_pair_offset[entry.index]
        if offset < 0:
            offset = len(self.pair_score)
            self.pair_score.extend(block)
        else:
            self.pair_score[offset:offset + n * n] = array("i", block)
        self.node_pair_offset[entry.index] = offset

    def _kind_id(self, vendor_id: int, dev: DeviceInfo) -> int:
        key = (vendor_id, dev.type, dev.mode)
        kind = self.kind_ids.get(key)
        if kind is None:
            kind = len(self.kind_samples) if len(self.kind_samples) < 256 else 0
            self.kind_ids[key] = kind
            if kind:
                self.kind_samples.append((vendor_id, dev))
        return kind

    # ------------------------------------------------------------------ usage columns
    def charge(self, entries: list[UsageEntry], slots: list[int], sign: int) -> None:
        """Add (sign +1) or take back (-1) one pod's shares on the slots they resolved to."""
        for e, j in zip(entries, slots):
            if j < 0:
                continue
            self.used[j] += sign * e.slots
            self.used_mem[j] += sign * e.mem
            self.used_cores[j] += sign * e.cores

    def clear_usage(self, entry: NodeEntry) -> None:
        for j in range(entry.offset, entry.offset + entry.length):
            self.used[j] = 0
            self.used_mem[j] = 0
            self.used_cores[j] = 0

    def snapshot(self, entry: NodeEntry) -> list[dict]:
        """A readable view of one node's devices (for tests, the demo and metrics)."""
        out = []
        for k, dev in enumerate(entry.devices):
            j = entry.offset + k
            out.append({
                "id": dev.id, "index": dev.index, "type": dev.type, "count": self.count[j],
                "used": self.used[j], "totalmem": self.total_mem[j], "usedmem": self.used_mem[j],
                "totalcore": self.total_cores[j], "usedcores": self.used_cores[j],
                "health": bool(self.health[j]),
            })
        return out

    # ------------------------------------------------------------------ compaction
    def needs_compaction(self) -> bool:
        return self.dead_slots > _COMPACT_AFTER_DEAD_SLOTS and self.dead_slots > len(self.total_mem) // 2

    def compact(self) -> None:
        """Move the live slices together, in place. Slot numbers change: whoever holds slots
        (the pod ledger's ``resolved``) must resolve them again."""
        live = sorted((e for e in self._owners.values() if e.length), key=lambda e: e.offset)
        columns = [getattr(self, name) for name, _, _ in self.columns]
        packed = [array(col.typecode) for col in columns]
        packed_ids: list[str] = []
        pos = 0
        for e in live:
            old = e.offset
            for new, col in zip(packed, columns):
                new.extend(col[old:old + e.length])
            packed_ids.extend(self.device_ids[old:old + e.length])
            e.offset = pos
            self.node_offset[e.index] = pos
            e.uuid_to_slot = {uuid: pos + (slot - old) for uuid, slot in e.uuid_to_slot.items()}
            pos += e.length
        for col, new in zip(columns, packed):
            col[:] = new
        self.device_ids[:] = packed_ids
        self.dead_slots = 0

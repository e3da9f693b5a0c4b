"""Partition tables: devices cut into fixed instances (MIG mode) rather than shared by quota.

A partitioned GPU is not charged by adding memory and cores: each instance takes a run of slices,
what a GPU has taken is the union of its pods' slices, and each profile may only sit at fixed
placements. The kernel reads that from per-device columns this module adds to the device table
(``dev_mig``, ``mig_used``, ``mig_prof_off``/``mig_prof_len``) and from a profile table
(``prof_mem``, ``prof_core``, ``prof_place_off``/``prof_place_len``, ``place_mask``) shared by
identical GPUs; ``prof_names`` and ``place_spans`` turn the kernel's answer back into a record.

Everything a partition kind means to the books is here: its columns, its profile table, how a
pod's instances are charged and given back, and upstream's fail-closed rule. The pod ledger and
the device table call only ``instance``, ``charge`` and ``reset_node``, so a new partition kind
changes this module alone.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable

import structlog

from hami_py.cache.device_table import DeviceTable
from hami_py.cache.records import NodeEntry, PodUsage
from hami_py.devices.base import MODE_MIG, DeviceInfo

log = structlog.get_logger(__name__)

# Per-device MIG columns: a flag, the slices taken (bit mask) and the device's run of the profile
# table. Slice masks are int64 with the top bits kept clear: at most 62 slices.
MIG_COLUMNS = (("dev_mig", "b", 0), ("mig_used", "q", 0), ("mig_prof_off", "i", 0), ("mig_prof_len", "i", 0))
_MAX_SLICES = 62


class PartitionTables:
    """MIG profile tables, per-GPU slices taken, and the GPUs withheld as doubtful."""

    def __init__(self, table: DeviceTable):
        self.table = table
        table.add_columns(MIG_COLUMNS, fill=self._place_device)
        # MIG profiles, sorted by (memory, slices), each with its placements as masks in try order.
        self.prof_mem = table.add_lookup("prof_mem", "i")
        self.prof_core = table.add_lookup("prof_core", "i")
        self.prof_place_off = table.add_lookup("prof_place_off", "i")
        self.prof_place_len = table.add_lookup("prof_place_len", "i")
        self.place_mask = table.add_lookup("place_mask", "q")
        self.prof_names: list[str] = []
        self.place_spans: list[tuple[int, int]] = []
        self._profile_tables: dict[tuple, tuple[int, int]] = {}
        self.mig_doubts: dict[tuple[str, str], int] = {}   # (node, GPU) → pods that make it doubtful

    # ------------------------------------------------------------------ placement
    def _place_device(self, slot: int, dev: DeviceInfo) -> None:
        is_mig = dev.mode == MODE_MIG
        table = self.table
        table.dev_mig[slot] = 1 if is_mig else 0
        table.mig_prof_off[slot], table.mig_prof_len[slot] = self._profile_table(dev) if is_mig else (0, 0)

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
            places = [q for q in places if 0 <= q.start and 0 < q.size and q.start + q.size <= _MAX_SLICES]
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

    # ------------------------------------------------------------------ pods' instances
    @staticmethod
    def instance(uuid: str, start: int, size: int, runtime: tuple | None) -> tuple | None:
        """A pod's record of one instance decoded from its annotations (a vendor's
        ``decode_partitions``): (GPU UUID, slice mask[, profile, MIG UUID, GI id, CI id]), None
        when the placement cannot be a slice mask."""
        if start + size > _MAX_SLICES:
            return None
        mask = ((1 << size) - 1) << start
        return (uuid, mask) if runtime is None else (uuid, mask, sys.intern(runtime[0]), *runtime[1:])

    def charge(self, entry: NodeEntry, pod: PodUsage, sign: int,
               pods_on_node: Callable[[str, str], Iterable[PodUsage]]) -> None:
        """Charge (sign +1) or give back (-1) a pod's instances on its node. ``pods_on_node(node,
        except_uid)``: the node's other charged pods, read only when slices are given back."""
        self._fail_closed(entry, pod, sign)
        if not pod.mig:
            return
        if sign > 0:
            mig_used = self.table.mig_used
            for inst in pod.mig:
                j = entry.uuid_to_slot.get(inst[0], -1)
                if j >= 0:
                    mig_used[j] |= inst[1]
        else:
            self._refresh(entry, pods_on_node(entry.name, pod.uid))

    def reset_node(self, entry: NodeEntry) -> None:
        """Forget what the node's pods took (before they are charged again from scratch)."""
        mig_used = self.table.mig_used
        for j in range(entry.offset, entry.offset + entry.length):
            mig_used[j] = 0
        for key in [k for k in self.mig_doubts if k[0] == entry.name]:
            del self.mig_doubts[key]

    def _fail_closed(self, entry: NodeEntry, pod: PodUsage, sign: int) -> None:
        """Upstream's MIG fail-closed rule: a pod on a MIG GPU without a placement record, or a
        placement record on a GPU that is not in MIG mode, means the books cannot say which
        slices are free, so that GPU is offered to nobody until the pod is gone."""
        dev_mig = self.table.dev_mig
        mig_uuids = {inst[0] for inst in pod.mig}
        doubtful = set()
        for e in pod.entries:
            j = entry.uuid_to_slot.get(e.uuid, -1)
            if j >= 0 and dev_mig[j] and e.uuid not in mig_uuids:
                doubtful.add(e.uuid)
        for uuid in mig_uuids:
            j = entry.uuid_to_slot.get(uuid, -1)
            if j >= 0 and not dev_mig[j]:
                doubtful.add(uuid)
        health = self.table.health
        for uuid in doubtful:
            key = (entry.name, uuid)
            left = self.mig_doubts.get(key, 0) + sign
            if left > 0:
                self.mig_doubts[key] = left
            else:
                self.mig_doubts.pop(key, None)
            j = entry.uuid_to_slot[uuid]
            if left > 0:
                health[j] = 0
            else:
                health[j] = 1 if entry.devices[j - entry.offset].health else 0
            if sign > 0:
                log.warning("GPU withheld: MIG placement unknown", node=entry.name, gpu=uuid,
                            pod=f"{pod.namespace}/{pod.name}")

    def _refresh(self, entry: NodeEntry, others: Iterable[PodUsage]) -> None:
        """Slices are a union, not a sum: recompute them from the node's other pods."""
        dev_mig, mig_used = self.table.dev_mig, self.table.mig_used
        slots = {j for j in range(entry.offset, entry.offset + entry.length) if dev_mig[j]}
        for j in slots:
            mig_used[j] = 0
        for pod in others:
            for inst in pod.mig:
                j = entry.uuid_to_slot.get(inst[0], -1)
                if j in slots:
                    mig_used[j] |= inst[1]

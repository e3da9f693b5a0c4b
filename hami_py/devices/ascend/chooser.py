"""The per-node choice of NPUs for one Ascend request row (the family's FLAG_CHOOSE chooser).

The kernel hands it every NPU of the node that passed upstream's generic checks, in the policy's
preferred order. It first drops the NPUs the pod may not share (modes.py: an ENPU pod never on an
NPU beside a hami-core pod, and the reverse; ENPU pods of one NPU with one policy), then the NPUs
a deliberate oversell must not open (below), and chooses among the rest (topology.py: 910C module
pairs behind the super-pod gate, NetworkID groups, first fit).

Oversell (HAMi #2952): on a node running a soft split an NPU's cores are a percentage budget, 100
or, when the plugin advertises more, a deliberate oversell (200: twice the requests of 100). A
pod holding the whole NPU's compute (100 cores: HAMi's "this card exclusively") keeps it for
itself all the same: nothing joins an NPU where one pod holds 100 or more, and a row asking 100
takes only an NPU nothing uses. At a budget of exactly 100 the kernel's generic checks say so
already; above it only this chooser sees the holders. Upstream's ``hamiCoreExclusiveOccupant``
says no more than that such an NPU is not oversold; the rule for a row asking 100 is ours,
HAMi's meaning of 100.

A row asking no memory asks for whole NPUs: the charger (charger.py) charges the node's smallest
NPU memory, so on a node whose NPUs differ an NPU partly used could pass the kernel's check; this
chooser keeps only NPUs nothing holds memory of (CardInsufficientMemory for the others).

The pods on an NPU are read from the books (``cache.device_marks``: their charge and their mode
annotations, ``DeviceVendor.pod_marks``); the pod's own earlier app rows on the node, which the
books do not hold yet, are tracked here.
"""
from __future__ import annotations

from hami_py.devices.ascend import topology
from hami_py.devices.ascend.modes import PERCENT_BASE, NodeModes, npu_refuses
from hami_py.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST, CARD_COMPUTE_UNITS_EXHAUSTED, CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY, EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, MODE_NOT_FIT,
)


class AscendChooser:
    """Built once per /filter for one chip kind; called once per request row and node."""

    def __init__(self, vendor, cache, ask, *, mode: str | None, policy: str | None):
        self.cache = cache
        self.cw = vendor.vendor_key
        self.vendor_id = cache.vendor_ids.get(self.cw)
        self.mode = mode
        self.policy = policy
        self.rows = ask.rows
        self.init_rows = ask.init_rows
        self.scored = self.cw.startswith(topology.ASCEND910_PREFIX)
        # Upstream pairs 910C NPUs by module only with the super-pod gate (HAMi #2853).
        self.pairs = self.cw == topology.ASCEND910C and vendor.config.super_pod
        # node index -> (the device list read, (indexes, NetworkIDs, topology mode)), kept by the
        # vendor across filters: a node's facts change only with its registration.
        self.known = vendor.node_facts
        self.calls: dict[int, int] = {}                     # node -> rows asked so far
        self.own: dict[int, list[tuple[int, int]]] = {}     # node -> this pod's app rows' (NPU, cores)

    def __call__(self, node_index: int, positions: list[int], nums: int):
        row = self.calls.get(node_index, 0)
        self.calls[node_index] = row + 1
        cores = min(self.rows[row].coresreq, PERCENT_BASE) if row < len(self.rows) else 0
        whole = row < len(self.rows) and self.rows[row].memreq == 0
        # Upstream fits each init container from the node as it was before the pod.
        init = self.init_rows[row] if row < len(self.init_rows) else False
        own = [] if init else self.own.setdefault(node_index, [])
        kept, refusal = self._sharable(node_index, positions, cores, own, whole)
        if len(kept) < nums:
            return refusal or ALLOCATED_CARDS_INSUFFICIENT_REQUEST
        answer = self._choose(node_index, kept, nums)
        if isinstance(answer, int):
            return answer
        if not init:
            own.extend((p, cores) for p in answer[0])
        return answer

    # -- which NPUs the pod may share ------------------------------------------------------------

    def _sharable(self, node_index: int, positions: list[int], cores: int,
                  own: list[tuple[int, int]], whole: bool) -> tuple[list[int], int]:
        """The positions the row may take, and the reason for the others (0: none refused).
        ``whole``: the row asks for whole NPUs (no memory named)."""
        cache = self.cache
        devices = cache.devices_at(node_index)
        offset = cache.node_offset[node_index]
        used, used_mem = cache.used, cache.used_mem
        mine: dict[int, list[int]] = {}
        for p, c in own:
            mine.setdefault(p, []).append(c)
        node = NodeModes.from_tag(devices[positions[0]].mode) if positions else NodeModes(False, False)
        tenants = None
        kept: list[int] = []
        mode_refused = 0
        core_refusal = 0
        memory_refused = 0
        for p in positions:
            busy = used[offset + p] > 0
            ours = mine.get(p, ())
            if not busy and not ours:
                kept.append(p)
                continue
            if whole and (ours or used_mem[offset + p] > 0):
                memory_refused += 1
                continue
            held: list[int] = list(ours)
            if busy:
                if tenants is None:
                    tenants = cache.device_marks(node_index)
                here = tenants[p] if p < len(tenants) else ()
                if npu_refuses(self.mode, self.policy, node, (marks for marks, _ in here)):
                    mode_refused += 1
                    continue
                held.extend(entry.cores for _, entry in here)
            if devices[p].devcore > PERCENT_BASE:
                if cores >= PERCENT_BASE:
                    core_refusal = core_refusal or EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
                    continue
                if any(c >= PERCENT_BASE for c in held):
                    core_refusal = core_refusal or (CARD_COMPUTE_UNITS_EXHAUSTED if cores == 0
                                                    else CARD_INSUFFICIENT_CORE)
                    continue
            kept.append(p)
        if mode_refused:
            return kept, MODE_NOT_FIT
        return kept, core_refusal or (CARD_INSUFFICIENT_MEMORY if memory_refused else 0)

    # -- which of them -----------------------------------------------------------------------------

    def _facts(self, node_index: int) -> tuple[list[int], list[int | None], bool]:
        """Each position's registered index and NetworkID, and whether every NPU of this kind on
        the node has one (upstream's topology mode, 910 kinds only)."""
        cache = self.cache
        devices = cache.devices_at(node_index)
        found = self.known.get(node_index)
        if found is not None and found[0] is devices:
            return found[1]
        offset = cache.node_offset[node_index]
        index_of = [d.index for d in devices]
        network_of = [topology.network_id_of(d.custom) for d in devices]
        mine = [k for k in range(len(devices)) if cache.vendor[offset + k] == self.vendor_id]
        has_networks = self.scored and bool(mine) and all(network_of[k] is not None for k in mine)
        facts = (index_of, network_of, has_networks)
        self.known[node_index] = (devices, facts)
        return facts

    def _choose(self, node_index: int, positions: list[int], nums: int):
        if not self.scored:
            return list(positions[:nums]), 0.0          # 310P: upstream's first-fit walk, no score
        index_of, network_of, has_networks = self._facts(node_index)
        if nums == 1:
            # One NPU: the first in the policy's order; the score is 10 when it has a network.
            first = positions[0]
            return [first], (float(topology.NETWORK_WEIGHT) if network_of[first] is not None else 0.0)
        chosen = topology.choose(self.cw, positions, nums, index_of=index_of, network_of=network_of,
                                 topology=has_networks, pairs=self.pairs)
        if chosen is None:
            return ALLOCATED_CARDS_INSUFFICIENT_REQUEST
        return chosen, topology.score(self.cw, chosen, network_of)

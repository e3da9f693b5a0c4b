"""What one Ascend NPU of a request row costs on a candidate node (the family's FLAG_CHARGE charger).

HAMi #3107: a pod naming no vNPU mode keeps its memory as asked through admission, because the
webhook cannot know where the pod will run; the node decides. On a node running hami-core the
pod is a soft-split one there and is charged exactly what it asked; on a template node (hard
split) the device plugin carves a vNPU template, so the pod is charged the smallest template
holding the request (``memoryAllocatable`` when only the whole NPU holds it). Each candidate node
is judged with its own answer: a mode-less pod may fit a hami-core node where the template its
request rounds to no longer fits a template node.

The same rounding applies to a pod naming ``template`` (or a mode no rule knows) on a template
node: the webhook rounded it already, rounding again changes nothing, and a pod that did not pass
the webhook is charged the vNPU the plugin will really carve. Soft-split pods (hami-core, ENPU)
are charged as asked everywhere they may go.

A row asking no memory asks for whole NPUs (upstream's 100 percent of each NPU's memory). The
kernel charges one value per row and node, so the charger gives the smallest memory among the
node's NPUs of this kind (never more than any of them really costs), the chooser keeps only NPUs
nothing uses memory of (what 100 percent means), and :meth:`AscendCharger.settle` gives each
chosen NPU its own whole memory. The decision's annotations carry the charge, and every recount
of the books reads them back: a bound pod is charged what the filter charged.

``settle`` also records, on each device of the decision, the mode the pod resolves to on the
chosen node (``hami.io/effective-vnpu-mode``, written by the vendor's ``encode_allocation``).
"""
from __future__ import annotations

from hami_py.devices.ascend.modes import (
    PERCENT_BASE, VNPU_MODE_ANNOTATION, VNPU_MODE_TEMPLATE, NodeModes, effective_mode,
)
from hami_py.devices.base import Charger, ContainerDevice, ContainerRequest
from hami_py.devices.perdevice import pod_containers
from hami_py.reasons import CARD_INSUFFICIENT_MEMORY

# The key of ContainerDevice.custom that carries the resolved mode from settle to the encoder.
EFFECTIVE_MODE_KEY = "effective_vnpu_mode"


class AscendCharger(Charger):
    """Built once per /filter for one chip kind; called once per request row and candidate node."""

    def __init__(self, vendor, cache, pod: dict, row_container: list[int]):
        self.vendor = vendor
        self.cache = cache
        self.vid = cache.vendor_ids.get(vendor.vendor_key)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        self.mode = annotations.get(VNPU_MODE_ANNOTATION)
        self.row_container = row_container
        containers = pod_containers(pod)
        # container position -> this kind's request of it (parsed as the filter's rows were)
        self.asks: dict[int, ContainerRequest] = {}
        for position in set(row_container):
            if 0 <= position < len(containers):
                ask = vendor.container_request(containers[position], pod_annotations=annotations)
                if ask is not None:
                    self.asks[position] = ask
        self._nodes: dict[int, tuple[str, int]] = {}        # node -> (resolved mode, least NPU memory)

    def _node(self, node_index: int) -> tuple[str, int]:
        """The pod's mode on the node (modes.effective_mode) and its smallest NPU of this kind."""
        known = self._nodes.get(node_index)
        if known is not None:
            return known
        cache = self.cache
        offset = cache.node_offset[node_index]
        devices = cache.devices_at(node_index)
        mine = [k for k in range(len(devices)) if cache.vendor[offset + k] == self.vid]
        node = NodeModes.from_tag(devices[mine[0]].mode) if mine else NodeModes(False, False)
        least = min((cache.total_mem[offset + k] for k in mine), default=0)
        known = self._nodes[node_index] = (effective_mode(self.mode, node), least)
        return known

    def __call__(self, node_index: int, row: int) -> tuple[int, int, int] | int:
        ask = self.asks.get(self.row_container[row])
        if ask is None:
            raise ValueError(f"{self.vendor.vendor_key} charger asked about row {row}, which asks for no such NPU")
        mode, least = self._node(node_index)
        cores = min(ask.coresreq, PERCENT_BASE)
        if ask.memreq == 0:
            return max(least, 0), cores, 1
        memory = self.row_memory(ask.memreq, mode)
        if memory <= 0:
            return CARD_INSUFFICIENT_MEMORY
        return memory, cores, 1

    def row_memory(self, memreq: int, mode: str) -> int:
        """One NPU's memory for a row asking ``memreq`` MiB from a pod resolving to ``mode``; 0
        when a template node has no vNPU that holds it (beyond every template and
        ``memoryCapacity``: the webhook refuses such a request, a pod that skipped it is refused
        here). As upstream, no rounding when ``memoryAllocatable`` is not set."""
        if mode != VNPU_MODE_TEMPLATE or self.vendor.config.memory_allocatable <= 0:
            return memreq
        trimmed, _ = self.vendor.trim_memory(memreq)
        return trimmed

    def whole(self, container: int) -> bool:
        """Whether the container asks for whole NPUs (no memory named)."""
        ask = self.asks.get(container)
        return ask is not None and ask.memreq == 0

    def settle(self, node_index: int, position: int, container: int, device: ContainerDevice) -> None:
        mode, _ = self._node(node_index)
        device.custom = {EFFECTIVE_MODE_KEY: mode}
        if self.whole(container):
            device.usedmem = self.cache.total_mem[self.cache.node_offset[node_index] + position]


def settled_mode(pod_devices) -> str | None:
    """The mode a decision resolved for the pod on its node (what settle recorded on its
    devices); None for devices no filter settled (a decision read back and encoded again)."""
    for container in pod_devices:
        for device in container:
            if device.custom and EFFECTIVE_MODE_KEY in device.custom:
                return device.custom[EFFECTIVE_MODE_KEY]
    return None


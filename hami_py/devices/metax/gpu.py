"""Metax whole GPUs (upstream's ``Metax-GPU``): cards from node capacity, one container each.

The plugin advertises ``metax-tech.com/gpu``; the node's capacity says how many cards it has
(``<node>-metax-<i>``, 65536 MiB and 100 cores each). A container asks for a number of cards
(``metax-tech.com/gpu``, limits then requests) and gets each card whole.

Node score (binpack): the plugin publishes, per number of cards, how much of the node's
interconnect a pod of that many cards would cost (``metax-tech.com/gpu.topology.losses``, a JSON
object ``{"<n>": <loss>}``) and, for spread, how well it would be connected
(``metax-tech.com/gpu.topology.scores``). Upstream adds ``2000 - losses[n]`` under binpack and
``2000 - scores[n]`` under spread, ``n`` being every card the pod gets on the node; a value that
does not parse or lacks ``n`` reads as 0. The chooser here adds the same, one row at a time (the
deltas telescope to upstream's total).

Each container gets cards of its own. HAMi v2.10's custom rule required every card of a pod to
be the card its earlier containers got, which a card of count 1 can never be, so a pod of several
containers asking for Metax GPUs never fitted; HAMi after v2.10 removed the rule (#2837).
"""
from __future__ import annotations

import re

import orjson
import structlog

from hami_py.devices.base import FLAG_CHOOSE, ContainerRequest, DeviceInfo
from hami_py.devices.template import CapacityCards, TemplateSpec, TemplateVendor

log = structlog.get_logger(__name__)

GPU_KEY = "Metax-GPU"
GPU_TO_ALLOCATE = "hami.io/metax-gpu-devices-to-allocate"
GPU_ALLOCATED = "hami.io/metax-gpu-devices-allocated"
TOPOLOGY_LOSSES = "metax-tech.com/gpu.topology.losses"
TOPOLOGY_SCORES = "metax-tech.com/gpu.topology.scores"

CARD_MEMORY = 65536
TOPOLOGY_BASE = 2000.0
_GO_INT_KEY = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def parse_topology_map(text: str | None) -> dict[int, int] | None:
    """A ``{"<n>": <int>}`` annotation as upstream's ``map[int]int`` reads it: None when absent,
    {} when it does not parse (every lookup then reads 0, as upstream's failed Unmarshal)."""
    if text is None:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    if value is None:
        return {}
    if type(value) is not dict:
        return {}
    out: dict[int, int] = {}
    for key, number in value.items():
        if not _GO_INT_KEY.fullmatch(key) or type(number) is not int:
            return {}
        k = int(key)
        if not (_INT64[0] <= k <= _INT64[1] and _INT64[0] <= number <= _INT64[1]):
            return {}
        out[k] = number
    return out


def topology_score(custom: dict, node_policy: str, cards: int) -> float:
    """Upstream's ``ScoreNode`` for a pod of ``cards`` cards on a node (its parsed annotations in
    a device's ``custom``)."""
    if node_policy == "binpack":
        table = custom.get("losses")
    elif node_policy == "spread":
        table = custom.get("scores")
    else:
        return 0.0
    if table is None:
        return 0.0
    return TOPOLOGY_BASE - float(table.get(cards, 0))


class MetaxGPUVendor(CapacityCards, TemplateVendor):
    """Whole Metax GPUs from ``status.capacity[metax-tech.com/gpu]``."""

    # Each card registers a count of 1, so the kernel's slot check already gives a card to one
    # container, refused as upstream words it (CardTimeSlicingExhausted: its Fit tests
    # ``Count <= Used`` first). FLAG_EXCLUSIVE would word it ExclusiveDeviceAllocateConflict.
    kernel_flags = FLAG_CHOOSE
    uses_node_lock = False

    def __init__(self, config):
        super().__init__(TemplateSpec(vendor_key=GPU_KEY, count_resource=config.resource_count_name,
                                      to_allocate_annotation=GPU_TO_ALLOCATE, allocated_annotation=GPU_ALLOCATED))

    def registration_inputs(self, node) -> object:
        annotations = node.annotations
        return (node.capacity.get(self.spec.count_resource) if self.spec.count_resource else None,
                annotations.get(TOPOLOGY_LOSSES), annotations.get(TOPOLOGY_SCORES))

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        cards = self.capacity_cards(node)
        if not cards:
            return []
        custom = {"losses": parse_topology_map(node.annotations.get(TOPOLOGY_LOSSES)),
                  "scores": parse_topology_map(node.annotations.get(TOPOLOGY_SCORES))}
        for key, name in (("losses", TOPOLOGY_LOSSES), ("scores", TOPOLOGY_SCORES)):
            if custom[key] == {} and node.annotations.get(name) not in (None, "null", "{}"):
                log.warning("metax topology annotation does not parse: every lookup reads 0", node=node.name,
                            annotation=name)
        return [DeviceInfo(id=f"{node.name}-metax-{i}", index=i, count=1, devmem=CARD_MEMORY, devcore=100,
                           type=GPU_KEY, health=True, custom=custom) for i in range(cards)]

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        request.memreq, request.mempct, request.coresreq = 0, 100, 100
        return request

    def device_selector(self, pod_annotations, node_annotations):
        return None     # upstream's Metax GPU selects no card by id or type

    def chooser(self, cache, ask):
        """The first ``nums`` fitting cards (the policy's order); the node score delta makes the
        node's total upstream's topology score of every card the pod gets there."""
        cards_on: dict[int, int] = {}
        score_on: dict[int, float] = {}

        def choose(node_index: int, positions: list[int], nums: int):
            devices = cache.devices_at(node_index)
            cards = cards_on.get(node_index, 0) + nums
            cards_on[node_index] = cards
            total = topology_score(devices[positions[0]].custom, ask.node_policy, cards)
            delta = total - score_on.get(node_index, 0.0)
            score_on[node_index] = total
            return positions[:nums], delta

        return choose

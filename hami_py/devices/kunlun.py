"""Kunlun (Kunlunxin): whole XPUs (vendor key ``kunlun``) and vXPU shares (vendor key ``XPU``).

Whole XPUs register nothing: the device plugin advertises ``kunlunxin.com/xpu`` and the node's
capacity says how many cards it has (``<node>-kunlun-<i>``, the upper half on NUMA node 1).
vXPUs register a JSON inventory in ``hami.io/node-register-xpu`` and answer the
``hami.io/node-handshake-xpu`` handshake; a vXPU is a quarter, a half or a whole card
(24576/49152/98304 MiB), and only shares of one size may share a card.

Both choose their cards with the 8-card topology of a Kunlun node (two groups of four, 0-3 and
4-7, linked pairwise 0-4, 1-5, 2-6, 3-7): :func:`choose_topology`, a pure function of the free
cards' **physical indexes** (upstream reads the list position after the policy sort, which is
a different card as soon as the sort moves one; see docs/devices/kunlun.md). Whole XPUs also
adjust the node score by upstream's "bubble" rule (:func:`bubble_score`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py import reasons as R
from hami_py.devices.base import (
    FLAG_CHOOSE, FLAG_EQUAL_SHARE, FLAG_EXCLUSIVE, ContainerRequest, DeviceInfo, PodDevices,
)
from hami_py.devices.codec import encode_pod_devices
from hami_py.devices.template import (
    MISSING, CapacityCards, TemplateSpec, TemplateVendor, ensure_limits, lookup, resource_lists, rounded_quantity,
    whole_number,
)
from hami_py.quantity import INT64_MAX
from hami_py.reasons import NUMA_NOT_FIT

# -- names ---------------------------------------------------------------------------------------

KUNLUN_KEY = "kunlun"
XPU_KEY = "XPU"
KUNLUN_ALLOCATED = "hami.io/kunlun-allocated"
DEVICE_IDX_ANNOTATION = "BAIDU_COM_DEVICE_IDX"
XPU_REGISTER = "hami.io/node-register-xpu"
XPU_HANDSHAKE = "hami.io/node-handshake-xpu"
XPU_TO_ALLOCATE = "hami.io/xpu-devices-to-allocate"
XPU_ALLOCATED = "hami.io/xpu-devices-allocated"
USE_UUID = ("hami.io/use-xpu-uuid", "baidu.com/use-gpuuuid")
NOUSE_UUID = ("hami.io/no-use-xpu-uuid", "baidu.com/nouse-gpuuuid")

CARD_MEMORY = 98304             # MiB of one card
VXPU_SIZES = (24576, 49152)     # a quarter and a half card; anything larger is the whole card
CARD_MEMORY_WHOLE_CORES = 100


# -- config ---------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class KunlunConfig:
    """The ``kunlun`` section (upstream's ``KunlunConfig``)."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName", "resourceVCountName", "resourceVMemoryName")
    resource_count_name: str = ""
    resource_vcount_name: str = ""
    resource_vmemory_name: str = ""

    @classmethod
    def from_section(cls, section: Section) -> KunlunConfig:
        """Only strings: a number or boolean where a resource name belongs is refused."""
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))


CONFIG_SECTION = ConfigSection("kunlun", KunlunConfig.KEYS)


# -- the 8-card topology ------------------------------------------------------------------------

INTER_PAIRS = ((0, 4), (1, 5), (2, 6), (3, 7))
INTRA_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7))
QUADS = ((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6))
ODD_ORDER = (1, 3, 2, 4)   # for one card: a group with exactly 1 free, then 3, then 2, then 4


def choose_topology(free: Iterable[int], nums: int) -> tuple[int, ...] | None:
    """The physical indexes to give a request of ``nums`` cards, or None when no acceptable set
    exists. ``free``: the indexes of the cards that fit the request (any order; only 0-7 belong
    to the topology, others are never chosen).

    Upstream's rule (``graghSelect``), on indexes: 8 cards only when all eight are free. For 1, 2
    or 4: when a group has enough free cards, the first group (left first) whose free count is,
    in turn, each of ``nums..4`` (for one card: 1, 3, 2, 4) gives its lowest free indexes;
    otherwise the cross-group links: 2 → the first linked pair ``i, i±4``; 4 → with 4 or 5 free,
    the first fully free quad; with 6 free, the first fully free quad whose two leftover cards
    are linked (any pair), else the last fully free quad. Any other count: None.
    Work is constant (at most 8 indexes are looked at after one pass over ``free``).
    """
    have = sorted({i for i in free if 0 <= i < 8})
    if nums == 8:
        return tuple(range(8)) if len(have) == 8 else None
    if nums not in (1, 2, 4):
        return None
    left = [i for i in have if i < 4]
    right = [i for i in have if i >= 4]
    if len(left) >= nums or len(right) >= nums:
        for slots in range(nums, 5):
            num = ODD_ORDER[slots - 1] if nums % 2 == 1 else slots
            if len(left) == num:
                return tuple(left[:nums])
            if len(right) == num:
                return tuple(right[:nums])
    have_set = set(have)
    if nums == 2:
        for i in have:
            partner = i + 4 if i < 4 else i - 4
            if partner in have_set:
                return (i, partner)
        return None
    if nums == 4:
        if len(have) in (4, 5):
            for quad in QUADS:
                if have_set.issuperset(quad):
                    return quad
            return None
        if len(have) == 6:
            last = None
            for quad in QUADS:
                if have_set.issuperset(quad):
                    last = quad
                    rest = have_set.difference(quad)
                    if any(rest.issuperset(pair) for pair in INTER_PAIRS + INTRA_PAIRS):
                        return quad
            return last
    return None


def _group_value(n: int) -> int:
    return 0 if n == 4 else 2 if n == 1 else 1


def bubbles(indexes: Iterable[int]) -> int:
    """Upstream's fragmentation count of a set of card indexes (``countbubble``)."""
    s = set(indexes)
    if not s:
        return 1
    left = sum(1 for i in s if i < 4)
    return _group_value(left) + _group_value(len(s) - left)


def bubble_score(previous: Iterable[int], current: Iterable[int]) -> float:
    """The node score upstream adds for a whole-XPU pod: ``previous`` = the indexes of the cards
    in use before the pod, ``current`` = the pod's cards (``calcscore``)."""
    delta = bubbles(current) - bubbles(previous)
    return {-1: 3000.0, 0: 2000.0, 1: 1000.0, 2: 0.0}.get(delta, 1000.0)


# Both depend on sets of at most 8 card indexes: computed once per set (as a bit mask) and kept.
_TOPOLOGY_CHOICES: dict[tuple[int, int], tuple[int, ...] | None] = {}
_BUBBLES: dict[int, int] = {}


def _choice_of(mask: int, nums: int) -> tuple[int, ...] | None:
    key = (mask, nums)
    if key not in _TOPOLOGY_CHOICES:
        _TOPOLOGY_CHOICES[key] = choose_topology([i for i in range(8) if mask >> i & 1], nums)
    return _TOPOLOGY_CHOICES[key]


def _bubbles_of(mask: int) -> int:
    found = _BUBBLES.get(mask)
    if found is None:
        found = _BUBBLES[mask] = bubbles(i for i in range(8) if mask >> i & 1)
    return found


_BUBBLE_SCORES = {-1: 3000.0, 0: 2000.0, 1: 1000.0, 2: 0.0}


def topology_chooser(cache, *, score: bool):
    """The FLAG_CHOOSE callable for one filter: maps the fitting positions to physical indexes,
    chooses with :func:`choose_topology` and maps back (the first position, in the policy's
    order, holding each index). With ``score`` the node score delta is the bubble score of the
    pod's cards on that node; the calls of one node (its rows, in order) telescope, so the sum
    of the deltas is the score of every card the pod gets there, as upstream computes it."""
    chosen_on: dict[int, int] = {}       # node index -> bit mask of the pod's cards there so far
    score_on: dict[int, float] = {}
    used = cache.used

    def choose(node_index: int, positions: list[int], nums: int):
        if node_index in chosen_on:
            return choose_now(node_index, positions, nums)
        # A pod's first row on a node: the answer depends on the node's cards, their usage and
        # the fitting positions alone, which most filters find unchanged since the last one.
        offset = cache.node_offset[node_index]
        devices = cache.devices_at(node_index)
        key = (node_index, nums, tuple(positions), used[offset:offset + len(devices)].tobytes())
        found = _ANSWERS.get(key)
        if found is not None and found[0] is devices:
            chosen_on[node_index], score_on[node_index] = found[2], found[3]
            return found[1]
        answer = choose_now(node_index, positions, nums)
        if len(_ANSWERS) > 50000:
            _ANSWERS.clear()
        _ANSWERS[key] = (devices, answer, chosen_on.get(node_index, 0), score_on.get(node_index, 0.0))
        return answer

    def choose_now(node_index: int, positions: list[int], nums: int):
        devices = cache.devices_at(node_index)
        by_index: dict[int, int] = {}
        mask = 0
        for p in positions:
            index = devices[p].index
            if index not in by_index:
                by_index[index] = p
                if 0 <= index < 8:
                    mask |= 1 << index
        picked = _choice_of(mask, nums) if nums in (1, 2, 4, 8) else None
        if picked is None:
            return NUMA_NOT_FIT
        chosen = [by_index[i] for i in picked]
        if not score or not _only_kunlun(devices):
            return chosen, 0.0     # upstream scores 0 on a node with other devices
        offset = cache.node_offset[node_index]
        previous = 0
        for k, d in enumerate(devices):
            if used[offset + k] > 0 and 0 <= d.index < 8:
                previous |= 1 << d.index
        pod_cards = chosen_on.get(node_index, 0)
        for i in picked:
            pod_cards |= 1 << i
        chosen_on[node_index] = pod_cards
        total = _BUBBLE_SCORES.get(_bubbles_of(pod_cards) - _bubbles_of(previous), 1000.0)
        delta = total - score_on.get(node_index, 0.0)
        score_on[node_index] = total
        return chosen, delta

    return choose


# (node index, nums, fitting positions, the node's usage) -> (its device list, the answer, the
# pod's cards there, the score so far): kept across filters; a registration change replaces the
# device list, which the entry is checked against.
_ANSWERS: dict[tuple, tuple] = {}
_ONLY_KUNLUN: dict[int, tuple[list, bool]] = {}


def _only_kunlun(devices: list) -> bool:
    """Whether every device of the node is a whole Kunlun card (kept per device list: a node's
    list is replaced whenever its registration changes)."""
    found = _ONLY_KUNLUN.get(id(devices))
    if found is not None and found[0] is devices:
        return found[1]
    answer = all(KUNLUN_KEY in d.type for d in devices)
    if len(_ONLY_KUNLUN) > 8192:
        _ONLY_KUNLUN.clear()
    _ONLY_KUNLUN[id(devices)] = (devices, answer)
    return answer


# -- whole XPU ----------------------------------------------------------------------------------

def summary_refusal(counts: dict[int, int], total: int, *kept: int) -> tuple[dict[int, int], int]:
    """Upstream's Kunlun Fits look for a placement of the whole request at once and, finding none,
    name one reason for the node: the first of ``kept`` any card was refused for (with its count),
    else NumaNotFit once, whatever each card lacked (``DeviceVendor.upstream_refusal``)."""
    for reason in kept:
        if counts.get(reason):
            return {reason: counts[reason]}, total
    return {R.NUMA_NOT_FIT: 1}, total


def card_index(uuid: str) -> int | None:
    """The index of a synthesised whole-XPU id ``<node>-kunlun-<i>``."""
    head, sep, tail = uuid.rpartition(f"-{KUNLUN_KEY}-")
    if not sep or not tail.isdigit():
        return None
    return int(tail)


class KunlunVendor(CapacityCards, TemplateVendor):
    """Whole XPUs from ``status.capacity[kunlunxin.com/xpu]``."""

    kernel_flags = FLAG_EXCLUSIVE | FLAG_CHOOSE
    uses_node_lock = False

    def __init__(self, config: KunlunConfig):
        super().__init__(TemplateSpec(vendor_key=KUNLUN_KEY, count_resource=config.resource_count_name,
                                      allocated_annotation=KUNLUN_ALLOCATED,
                                      use_uuid=USE_UUID, nouse_uuid=NOUSE_UUID))

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        cards = self.capacity_cards(node)
        return [DeviceInfo(id=f"{node.name}-{KUNLUN_KEY}-{i}", index=i, count=100, devmem=CARD_MEMORY,
                           devcore=100, type=KUNLUN_KEY, numa=1 if i >= cards // 2 else 0, health=True)
                for i in range(cards)]

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        # Each card is given whole: upstream's allocation carries the card's memory and cores.
        request.memreq, request.mempct, request.coresreq = 0, 100, 100
        return request

    def chooser(self, cache, ask):
        return topology_chooser(cache, score=True)

    def upstream_refusal(self, counts: dict[int, int], total: int) -> tuple[dict[int, int], int]:
        """Upstream's whole-XPU Fit: the cards its UUID annotations ruled out, else NumaNotFit once."""
        return summary_refusal(counts, total, R.CARD_UUID_MISMATCH)

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None):
        if not any(pod_devices):
            return {}
        out = {KUNLUN_ALLOCATED: encode_pod_devices(pod_devices)}
        for container in pod_devices:      # the last container with cards wins, as upstream
            if container:
                indexes = [card_index(d.uuid) for d in container]
                out[DEVICE_IDX_ANNOTATION] = ",".join("" if i is None else str(i) for i in indexes)
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return (KUNLUN_ALLOCATED, DEVICE_IDX_ANNOTATION)


# -- vXPU ---------------------------------------------------------------------------------------

def round_vxpu_memory(mib: int) -> int:
    """A vXPU's memory: the smallest share size holding ``mib`` (upstream's ``trimMemory``)."""
    for size in VXPU_SIZES:
        if mib <= size:
            return size
    return CARD_MEMORY


class VXPUVendor(TemplateVendor):
    """vXPU shares of the cards in ``hami.io/node-register-xpu``."""

    kernel_flags = FLAG_EQUAL_SHARE | FLAG_CHOOSE

    def __init__(self, config: KunlunConfig):
        super().__init__(TemplateSpec(vendor_key=XPU_KEY, count_resource=config.resource_vcount_name,
                                      memory_resource=config.resource_vmemory_name,
                                      register_annotation=XPU_REGISTER, handshake_annotation=XPU_HANDSHAKE,
                                      to_allocate_annotation=XPU_TO_ALLOCATE, allocated_annotation=XPU_ALLOCATED,
                                      use_uuid=USE_UUID, nouse_uuid=NOUSE_UUID))

    def request_memory(self, container: str, limits: dict, requests: dict) -> int:
        spec = self.spec
        raw = lookup(limits, requests, spec.memory_resource)
        if raw is MISSING:
            return 0
        # Any whole number is a share size: above half a card is the whole card, as upstream
        # (and as the webhook rounds "24Gi").
        mib = whole_number(container, spec.memory_resource, raw, low=0, high=INT64_MAX, unit="MiB")
        return round_vxpu_memory(mib)

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        if request.memreq == 0:      # no memory asked: a whole card
            request.memreq, request.mempct, request.coresreq = CARD_MEMORY, 100, 100
        else:
            request.mempct, request.coresreq = 0, request.memreq * 100 // CARD_MEMORY
        return request

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: a vXPU container's memory limit is rounded to its share size, in
        limits and in requests."""
        limits, _ = resource_lists(container)
        spec = self.spec
        if spec.count_resource not in limits:
            return False
        if spec.memory_resource and spec.memory_resource in limits:
            name = str(container.get("name") or "")
            rounded = str(round_vxpu_memory(rounded_quantity(name, spec.memory_resource, limits[spec.memory_resource])))
            ensure_limits(container)[spec.memory_resource] = rounded
            resources = container["resources"]
            if not isinstance(resources.get("requests"), dict):
                resources["requests"] = {}
            resources["requests"][spec.memory_resource] = rounded
        return True

    def chooser(self, cache, ask):
        return topology_chooser(cache, score=False)

    def upstream_refusal(self, counts: dict[int, int], total: int) -> tuple[dict[int, int], int]:
        """Upstream's vXPU Fit words a refusal as its whole-XPU Fit does (:func:`summary_refusal`),
        naming first the busy cards under the mutex policy."""
        return summary_refusal(counts, total, R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, R.CARD_UUID_MISMATCH)


def build_family(config: DeviceConfig, switches) -> list:
    kunlun = KunlunConfig.from_section(config.section(CONFIG_SECTION.name))
    return [KunlunVendor(kunlun), VXPUVendor(kunlun)]

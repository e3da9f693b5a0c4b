"""Moore Threads (Mthreads) sGPUs: shares of MTT GPUs, from the node's capacity.

Mthreads' device plugin registers no annotation: it advertises ``mthreads.com/sgpu-core`` (16
cores a GPU) and ``mthreads.com/sgpu-memory`` (units of 512 MiB, the whole node) as node
capacity, and the scheduler synthesises one device per 16 cores: ``<node>-mthreads-<i>``, 100
shares, ``memory × 512 × 16 / cores`` MiB, 16 cores, type ``Mthreads``, always healthy. ``<i>``
is the physical card id: the node label ``mthreads.com/sgpu.cores`` lists the cards bound to
sGPU (``0-2-3``; HAMi after v2.10, #2988), and must then account for the core capacity exactly;
without it the cards are 0..N-1.

A container asks with ``mthreads.com/vgpu`` (count), ``mthreads.com/sgpu-memory`` (units of
512 MiB) and ``mthreads.com/sgpu-core``, both **for all its GPUs together**: each GPU is charged
the total divided by the count. Upstream's webhook sizes a request: one GPU asks a legal memory
size (powers of two from 2 up to a card's size, and the whole card, for every card size of
``mthreads.memoryPerCard``: [96] by default, the MTT S4000; S5000 is 160), default 16 cores and,
when one card size is configured, that size; several GPUs get 16 cores each and no memory (each
is charged the whole card of the node chosen), and the pod annotation
``mthreads.com/request-gpu-num``. A container may not ask both the whole-card resource
``mthreads.com/gpu`` (served by Moore Threads' own plugin, outside HAMi) and sGPU slices.
Namespace quotas on ``limits.mthreads.com/sgpu-memory`` (units of 512 MiB) and
``limits.mthreads.com/sgpu-core`` hold at admission and at filter. Upstream's custom rule: a
container may only use the device the pod's earlier containers got (all of a pod's shares on one
GPU), which :func:`same_device_chooser` applies per node. No node lock. The decision writes
``hami.io/mthreads-vgpu-devices-allocated`` and what Mthreads' device plugin reads:
``mthreads.com/gpu-index`` (the device indexes), ``mthreads.com/predicate-time`` (Unix
nanoseconds) and ``mthreads.com/predicate-node``.

Deliberate differences (docs/devices/mthreads.md): a malformed count, memory or core value
refuses the pod naming container, resource and value (upstream v2.10 drops the request, or reads
cores as 0; HAMi after v2.10 refuses a core total that does not divide by the count, or is above
100 a GPU, as we do); a capacity that is not a whole number is refused (upstream reads it as 0 or
no devices).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.base import (
    FLAG_CHOOSE, ContainerRequest, DeviceDecodeError, DeviceInfo, PodDevices, RequestError,
)
from hami_py.devices.codec import encode_pod_devices, go_quote
from hami_py.devices.template import (
    MISSING, MAX_CAPACITY_CARDS, TemplateSpec, TemplateVendor, cores_per_device, ensure_limits,
    lookup, request_error, resource_lists, rounded_quantity,
)
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import CARD_NOT_FOUND_CUSTOM_FILTER_RULE

VENDOR_KEY = "Mthreads"
SECTION = "mthreads"

ALLOCATED_ANNOTATION = "hami.io/mthreads-vgpu-devices-allocated"
# Registered by upstream as the family's in-request key, but never written: not ours either.
TO_ALLOCATE_ANNOTATION = "hami.io/mthreads-vgpu-devices-to-allocate"
GPU_INDEX_ANNOTATION = "mthreads.com/gpu-index"
PREDICATE_TIME_ANNOTATION = "mthreads.com/predicate-time"
PREDICATE_NODE_ANNOTATION = "mthreads.com/predicate-node"
REQUEST_GPU_NUM_ANNOTATION = "mthreads.com/request-gpu-num"
USE_UUID_ANNOTATION = "mthreads.ai/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "mthreads.ai/nouse-gpuuuid"
# The physical card ids bound to sGPU ("0-2-3"), written by Moore Threads' stack.
SGPU_CORES_LABEL = "mthreads.com/sgpu.cores"
# Whole cards, delivered by Moore Threads' own device plugin outside HAMi's books.
WHOLE_GPU_RESOURCE = "mthreads.com/gpu"

MEMORY_UNIT = 512              # MiB per unit of mthreads.com/sgpu-memory
CORES_PER_GPU = 16
MEMORY_PER_GPU = 96            # units of 512 MiB: an MTT S4000 (48 GiB), the default card
MAX_CARD_UNITS = INT32_MAX // MEMORY_UNIT
SHARES_PER_GPU = 100


@dataclass(slots=True, frozen=True)
class MthreadsConfig:
    """The ``mthreads`` section: count, memory and core names, and ``memoryPerCard``, each card
    model's memory in 512 MiB units (a list; a single number is read as a list of one, as the
    chart renders a scalar; missing or empty: [96])."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName", "resourceMemoryName", "resourceCoreName",
                                       "memoryPerCard")
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""
    memory_per_card: tuple[int, ...] = (MEMORY_PER_GPU,)

    @classmethod
    def from_section(cls, section: Section) -> "MthreadsConfig":
        names = [section.str(key, only_strings=True) for key in cls.KEYS[:3]]
        raw = section.get("memoryPerCard")
        if isinstance(raw, list):
            cards = tuple(section.int64("memoryPerCard", i) for i in range(len(raw)))
        elif raw is None:
            cards = ()
        else:
            cards = (section.int64("memoryPerCard"),)
        return cls(*names, cards or (MEMORY_PER_GPU,))

    def problems(self) -> list[str]:
        return [f"mthreads: memoryPerCard {units} is out of range: a card's memory in 512 MiB units must be "
                f"between 1 and {MAX_CARD_UNITS}" for units in self.memory_per_card if not 1 <= units <= MAX_CARD_UNITS]


CONFIG_SECTION = ConfigSection(SECTION, MthreadsConfig.KEYS)


def legal_memory(memory_per_card) -> tuple[int, ...]:
    """The memory sizes (512 MiB units) a one-GPU request may ask: for every card size, the powers
    of two from 2 below it, and the whole card (96: 2, 4, ..., 64, 96)."""
    sizes = set()
    for card in memory_per_card:
        if card <= 0:
            continue
        sizes.add(card)
        power = 2
        while power < card:
            sizes.add(power)
            power *= 2
    return tuple(sorted(sizes))


_CARD_SEPARATORS = re.compile(r"[-,]")


def sgpu_card_ids(node) -> list[int] | None:
    """The physical card ids of the label ``mthreads.com/sgpu.cores`` (``0-2-3`` or ``0,2,3``),
    None without the label. An id that is not a whole number, or is listed twice, is refused."""
    raw = node.labels.get(SGPU_CORES_LABEL)
    if not raw:
        return None
    ids: list[int] = []
    seen: set[int] = set()
    for part in _CARD_SEPARATORS.split(raw):
        part = part.strip()
        if not part:
            continue
        if not (part.isascii() and part.isdigit()) or int(part) > INT32_MAX:
            raise DeviceDecodeError(f"label {SGPU_CORES_LABEL} {go_quote(raw)}: card id {go_quote(part)} is not "
                                    f"a whole number between 0 and {INT32_MAX}")
        card = int(part)
        if card in seen:
            raise DeviceDecodeError(f"label {SGPU_CORES_LABEL} {go_quote(raw)}: card {part} is listed twice")
        seen.add(card)
        ids.append(card)
    return ids


def device_index(uuid: str) -> int | None:
    """The index of a synthesised id ``<node>-mthreads-<i>``."""
    head, sep, tail = uuid.rpartition("-mthreads-")
    if not sep or not tail.isdigit():
        return None
    return int(tail)


def same_device_chooser(cache, init_rows: list[bool] = ()):
    """Upstream's custom rule, per node: a device fits a container only when every device the
    pod's earlier containers got there is that same device. The first container takes the first
    ``nums`` fitting devices (the generic fit's choice); a later one the one device already
    given, when it fits, else the node is refused (CardNotFoundCustomFilterRule). As upstream,
    init containers are held to the earlier init containers' devices and app containers to the
    earlier app containers' (``init_rows``: whether each of the family's rows is an init
    container's; see ``ChoiceAsk.init_rows``). Constant work beyond one pass over the
    fitting positions."""
    given: dict[tuple[int, bool], set[str]] = {}   # (node index, init?) -> ids the pod got there
    calls: dict[int, int] = {}                     # node index -> rows chosen so far

    def choose(node_index: int, positions: list[int], nums: int):
        row = calls.get(node_index, 0)
        calls[node_index] = row + 1
        group = (node_index, row < len(init_rows) and bool(init_rows[row]))
        earlier = given.get(group)
        devices = cache.devices_at(node_index)
        if not earlier:
            chosen = positions[:nums]
        elif len(earlier) > 1:
            return CARD_NOT_FOUND_CUSTOM_FILTER_RULE   # no device equals two others
        else:
            chosen = [p for p in positions if devices[p].id in earlier][:nums]
            if len(chosen) < nums:
                return CARD_NOT_FOUND_CUSTOM_FILTER_RULE
        given.setdefault(group, set()).update(devices[p].id for p in chosen)
        return chosen, 0.0

    return choose


class MthreadsVendor(TemplateVendor):
    """Upstream's ``Mthreads`` vendor."""

    kernel_flags = FLAG_CHOOSE
    uses_node_lock = False

    def __init__(self, config: MthreadsConfig):
        self.config = config
        self.legal_memory = legal_memory(config.memory_per_card)
        super().__init__(TemplateSpec(
            vendor_key=VENDOR_KEY,
            count_resource=config.resource_count_name,
            memory_resource=config.resource_memory_name,
            core_resource=config.resource_core_name,
            memory_unit=MEMORY_UNIT,
            allocated_annotation=ALLOCATED_ANNOTATION,
            use_uuid=(USE_UUID_ANNOTATION,),
            nouse_uuid=(NOUSE_UUID_ANNOTATION,),
            # Upstream accounts namespace quota on the memory (x 512) and core names and checks
            # it at admission; as for Ascend, the filter checks it too.
            quota=True,
        ))

    def config_problems(self) -> list[str]:
        return self.config.problems()

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        spec = self.spec
        capacity = node.capacity
        return (capacity.get(spec.core_resource) if spec.core_resource else None,
                capacity.get(spec.memory_resource) if spec.memory_resource else None,
                node.labels.get(SGPU_CORES_LABEL))

    def registration_source(self) -> str:
        return f"{self.spec.core_resource} capacity"

    def _capacity(self, node, resource: str, high: int) -> int:
        raw = node.capacity.get(resource, 0) if resource else 0
        number = parse_exact_int(raw)
        if number is None:
            raise DeviceDecodeError(f"{resource} {raw!r} is not a whole number")
        if not 0 <= number <= high:
            raise DeviceDecodeError(f"{resource} {raw!r} is out of range: must be between 0 and {high}")
        return number

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        """One device per 16 cores of capacity (the last one also for a remainder), as upstream;
        with the label ``mthreads.com/sgpu.cores``, one per card it lists, which must be exactly
        the core capacity (16 a card)."""
        spec = self.spec
        if not spec.core_resource or spec.core_resource not in node.capacity:
            return []
        cores = self._capacity(node, spec.core_resource, CORES_PER_GPU * MAX_CAPACITY_CARDS)
        cards = sgpu_card_ids(node)
        if cards is not None and len(cards) * CORES_PER_GPU != cores:
            label = go_quote(node.labels[SGPU_CORES_LABEL])
            raise DeviceDecodeError(
                f"sgpu capacity mismatch on {node.name}: label {SGPU_CORES_LABEL} {label} lists {len(cards)} cards "
                f"({len(cards) * CORES_PER_GPU} cores) but {spec.core_resource} capacity is {cores}")
        if cores == 0:
            return []
        memory = self._capacity(node, spec.memory_resource, INT32_MAX)
        devmem = memory * MEMORY_UNIT * CORES_PER_GPU // cores
        if devmem > INT32_MAX:
            raise DeviceDecodeError(f"{spec.memory_resource} {node.capacity.get(spec.memory_resource)!r} gives "
                                    f"{devmem} MiB a device over {cores} cores, beyond int32")
        if cards is None:
            cards = range(-(-cores // CORES_PER_GPU))
        return [DeviceInfo(id=f"{node.name}-mthreads-{i}", index=i, count=SHARES_PER_GPU, devmem=devmem,
                           devcore=CORES_PER_GPU, type=VENDOR_KEY, health=True) for i in cards]

    # -- requests --------------------------------------------------------------------------

    def request_cores(self, container: str, limits: dict, requests: dict, nums: int) -> int:
        """The container's total over its GPUs, divided evenly among them (HAMi after v2.10,
        #2994: a total that does not divide, or a GPU's part above 100, is refused)."""
        raw = lookup(limits, requests, self.spec.core_resource)
        if raw is MISSING:
            return self.spec.default_cores
        return cores_per_device(container, self.spec.core_resource, raw, nums, always_divide=True)

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        # Memory is the container's total too: each of its devices gets an equal part.
        request.memreq //= request.nums
        return request

    # -- admission -------------------------------------------------------------------------

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: no whole card beside sGPU slices; the count from limits, else
        requests; a multi-GPU container gets 16 cores a GPU and no memory (and the pod
        ``mthreads.com/request-gpu-num``), a one-GPU container without memory 16 cores and, with
        one card size configured, that size; a one-GPU memory must be a legal size."""
        spec = self.spec
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        self._refuse_mixing(name, limits, requests)
        raw = lookup(limits, requests, spec.count_resource)
        if raw is MISSING:
            return False
        count = rounded_quantity(name, spec.count_resource, raw)
        if count <= 0:
            raise request_error(name, spec.count_resource, raw, "must be greater than 0")
        limits = ensure_limits(container)
        if count > 1:
            if spec.core_resource:
                limits[spec.core_resource] = str(count * CORES_PER_GPU)
            meta = pod.get("metadata")
            if not isinstance(meta, dict):
                meta = pod["metadata"] = {}
            if not isinstance(meta.get("annotations"), dict):
                meta["annotations"] = {}
            meta["annotations"][REQUEST_GPU_NUM_ANNOTATION] = str(count)
            return True
        if not spec.memory_resource or spec.memory_resource not in limits:
            self._set_defaults(limits, count)
            return True
        memory = limits[spec.memory_resource]
        if parse_exact_int(memory) not in self.legal_memory:
            raise request_error(name, spec.memory_resource, memory,
                                "is invalid: sGPU memory request value is invalid, valid values are "
                                f"[{', '.join(map(str, self.legal_memory))}]")
        return True

    def _set_defaults(self, limits: dict, count: int) -> None:
        """One GPU: a whole one (16 cores; the card size when only one is configured, else no memory:
        the scheduler charges the chosen card's whole memory)."""
        spec = self.spec
        if spec.core_resource:
            limits[spec.core_resource] = str(count * CORES_PER_GPU)
        if spec.memory_resource and len(set(self.config.memory_per_card)) == 1:
            limits[spec.memory_resource] = str(count * self.config.memory_per_card[0])

    def _refuse_mixing(self, name: str, limits: dict, requests: dict) -> None:
        """HAMi after v2.10 (#2988): a whole card comes from Moore Threads' own plugin, outside
        these books; beside sGPU slices in one container it would overcommit the node silently.
        Limits and requests both count, so that a split does not slip through."""
        if WHOLE_GPU_RESOURCE not in limits and WHOLE_GPU_RESOURCE not in requests:
            return
        spec = self.spec
        slices = [r for r in (spec.count_resource, spec.memory_resource, spec.core_resource) if r]
        if any(r in limits or r in requests for r in slices):
            raise RequestError(f"container {go_quote(name)}: cannot mix {WHOLE_GPU_RESOURCE} (whole card, delivered "
                               f"outside HAMi) with {'/'.join(slices)} (sGPU slices) in the same container")

    # -- fit -------------------------------------------------------------------------------

    def chooser(self, cache, ask):
        return same_device_chooser(cache, ask.init_rows)

    # -- allocation annotations ------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        out = {ALLOCATED_ANNOTATION: encode_pod_devices(pod_devices)}
        for container in pod_devices:      # the last container with devices wins, as upstream
            if container:
                indexes = [device_index(d.uuid) for d in container]
                out[GPU_INDEX_ANNOTATION] = ",".join("" if i is None else str(i) for i in indexes)
                out[PREDICATE_TIME_ANNOTATION] = str(round(now * 1_000_000) * 1000)   # Unix ns (a float has µs)
                out[PREDICATE_NODE_ANNOTATION] = node
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return (ALLOCATED_ANNOTATION, GPU_INDEX_ANNOTATION, PREDICATE_TIME_ANNOTATION, PREDICATE_NODE_ANNOTATION)


def build_family(config: DeviceConfig, switches) -> list[MthreadsVendor]:
    """Always built, as upstream always initialises it."""
    return [MthreadsVendor(MthreadsConfig.from_section(config.section(SECTION)))]

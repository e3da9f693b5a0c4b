"""AWS Neuron (Inferentia / Trainium): whole devices and NeuronCores (vendor key ``AWSNeuron``).

The device plugin registers nothing: the node's capacity says how many devices
(``aws.amazon.com/neuron``) and cores (``aws.amazon.com/neuroncore``) it has, and the label
``node.kubernetes.io/instance-type`` says which instance it is. Each device ``<node>-AWSNeuron-<i>``
has ``cores / devices`` cores, recorded as a core **mask** (``2^cores - 1``): the books charge
masks, as upstream's annotations carry them (core 0 = 1, core 1 = 2, both = 3).

A container asks for devices (``aws.amazon.com/neuron: n``) or cores
(``aws.amazon.com/neuroncore: c``; 1 or 2 take one device, more must be a multiple of 2, one
whole device per 2 cores). One device is given a core mask: an unused device gives 1 (one core)
or 3 (two), a half-used one its other core. Several devices are given as a contiguous window of
unused devices: on ``inf*`` instances any window, on the others only 4, 8 or 16 devices aligned
on their size.

The family is FLAG_CHARGE | FLAG_CHOOSE (hami_py/devices/perdevice.py): the mask a device is
charged depends on its own usage, which the chooser reads. Cores per device are derived per node
(upstream learns them from the first node it sees and applies them to every node; see
docs/devices/awsneuron.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceVendor,
    PodDevices, RequestError,
)
from hami_py.devices.codec import decode_pod_devices, encode_pod_devices, go_quote
from hami_py.devices.gates import uuid_selector
from hami_py.devices.perdevice import DeviceCharge, PerDeviceCharging
from hami_py.devices.template import MAX_CAPACITY_CARDS, MISSING, lookup, quote_value, resource_lists
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import CARD_INSUFFICIENT_CORE, NUMA_NOT_FIT

NEURON_KEY = "AWSNeuron"
ALLOCATED = "hami.io/aws-neuron-devices-allocated"
USE_UUID = "aws.amazon.com/use-neuron-uuid"
NOUSE_UUID = "aws.amazon.com/nouse-neuron-uuid"
ASSIGNED_INDEX = "AWS_NEURON_IDS"
ASSIGNED_NODE = "aws.amazon.com/predicate-node"
PREDICATE_TIME = "NEURON_ALLOC_TIME"
RESOURCE_TYPE = "NEURON_RESOURCE_TYPE"
NEURON_ALLOCATED = "NEURON_ALLOCATED"
NODE_TYPE = "AWSNodeType"                       # the device's custom info: the instance type
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

MAX_DEVICES = INT32_MAX
CORES_PER_DEVICE_CAP = 2                        # upstream's addressable cores per device
MAX_CORES = MAX_DEVICES * CORES_PER_DEVICE_CAP
MAX_CORES_PER_DEVICE = 30                       # a mask must fit an int32 core column
ALIGNED_WINDOWS = (1, 4, 8, 16)                 # window sizes off inf* instances


# -- config ---------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class AWSNeuronConfig:
    """The ``awsneuron`` section (upstream's ``AWSNeuronConfig``); missing keys are ""."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName", "resourceCoreName")
    resource_count_name: str = ""
    resource_core_name: str = ""

    @classmethod
    def from_section(cls, section: Section) -> AWSNeuronConfig:
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))


CONFIG_SECTION = ConfigSection("awsneuron", AWSNeuronConfig.KEYS)


# -- requests ---------------------------------------------------------------------------------------

class InvalidNeuronRequest(ValueError):
    """A request upstream refuses: ``resource`` and its ``raw`` value; the message is upstream's."""

    def __init__(self, resource: str, raw: object, problem: str):
        super().__init__(f"{resource} {problem}")
        self.resource, self.raw, self.problem = resource, raw, problem


@dataclass(slots=True, frozen=True)
class NeuronAsk:
    """One container's Neuron request: ``nums`` devices with ``cores`` each (``whole``: the
    device count was asked, every core of each device; ``count_in_limits``: upstream's
    annotations then name device indexes instead of core indexes)."""
    nums: int
    cores: int
    whole: bool
    count_in_limits: bool = False


def validate(raw: object, resource: str, maximum: int) -> int:
    """Upstream's ``validateResourceRequest``: an integer in [1, maximum], messages as upstream."""
    value = parse_exact_int(raw)
    if value is None:
        raise InvalidNeuronRequest(resource, raw, "must be an integer")
    if value <= 0:
        raise InvalidNeuronRequest(resource, raw, "must be greater than 0")
    if value > maximum:
        raise InvalidNeuronRequest(resource, raw, f"must not exceed {maximum}")
    return value


def split_cores(cores: int, resource: str, raw: object) -> tuple[int, int]:
    """(devices, cores each) of a core request (upstream's ``splitCoreRequest`` with its
    addressable 2 cores a device)."""
    per = CORES_PER_DEVICE_CAP
    if cores <= per:
        return 1, cores
    if cores % per:
        raise InvalidNeuronRequest(resource, raw, f"must be 1 or a multiple of {per}, got {cores}")
    nums = cores // per
    if nums > MAX_DEVICES:   # unreachable with 2 cores a device and the core maximum; kept as upstream
        raise InvalidNeuronRequest(resource, raw, f"needs {nums} devices, which exceeds the maximum of {MAX_DEVICES}")
    return nums, per


def core_mask(current: int, need: int) -> int:
    """Upstream's ``addCoreUsage``: the mask a one-device request gets on a device whose cores
    in use are ``current`` (an unused device: 3 for two cores, 1 for one; else the other core)."""
    if current == 0:
        if need == 2:
            return 3
        if need == 1:
            return 1
    return 3 - current


def unix_nanos(now: float) -> int:
    """``now`` (Unix seconds) in nanoseconds, as Go's ``UnixNano`` prints it (without the float
    rounding of ``now * 1e9``)."""
    seconds = int(now)
    return seconds * 1_000_000_000 + round((now - seconds) * 1e9)


def popcount(mask: int) -> int:
    return bin(mask).count("1") if mask > 0 else 0


def choose_window(free: set[int], devices: int, nums: int, instance_type: str) -> int | None:
    """The first index of ``nums`` consecutive free devices (indexes 0..devices-1), upstream's
    ``graphSelect``: on ``inf``/``Inf`` instance types any start, on the others only for
    ``nums`` in 1, 4, 8, 16 and starts aligned on ``nums``. None when no window is free."""
    if "inf" in instance_type or "Inf" in instance_type:
        step = 1
    elif nums in ALIGNED_WINDOWS:
        step = nums
    else:
        return None
    for start in range(0, devices, step):
        if start + nums > devices:
            return None
        if all(i in free for i in range(start, start + nums)):
            return start
    return None


# -- the per-filter charge ---------------------------------------------------------------------------

class NeuronCharge(DeviceCharge):
    """The kernel checks each device against the mask size of the request (1 core: 1, 2 cores:
    3, a whole device: its full mask; at most 100, the kernel's bound), which refuses exactly the
    devices upstream refuses on two-core devices and never one it accepts; the chooser applies
    upstream's rules and gives the mask."""

    def __init__(self, cache, asks, row_container, shape):
        super().__init__(cache, NEURON_KEY, asks, row_container, shape)
        self._node: dict[int, tuple[int, int, int, str]] = {}

    def node_shape(self, node_index: int) -> tuple[int, int, int, str]:
        """(cores per device, full mask, devices, instance type) of the node's Neuron devices."""
        shape = self._node.get(node_index)
        if shape is None:
            positions = self.family_positions(node_index)
            devices = self.cache.devices_at(node_index)
            first = devices[positions[0]] if positions else None
            shape = self._node[node_index] = (
                (first.count, first.devcore, len(positions), str(first.custom.get(NODE_TYPE) or ""))
                if first is not None else (0, 0, 0, ""))
        return shape

    def row_charge(self, node_index: int, ask: NeuronAsk):
        cpd, mask, _, _ = self.node_shape(node_index)
        if ask.whole or ask.nums > 1:
            check = mask
        else:
            check = (1 << ask.cores) - 1
        return 0, max(1, min(check, 100)), 1

    def pick(self, node_index: int, ask: NeuronAsk, positions, nums, extra):
        cache = self.cache
        off = cache.node_offset[node_index]
        devices = cache.devices_at(node_index)
        used, used_cores = cache.used, cache.used_cores
        cpd, _, count, instance_type = self.node_shape(node_index)
        if nums > 1:
            free = {devices[p].index: p for p in positions
                    if used[off + p] == 0 and used_cores[off + p] == 0 and p not in extra}
            start = choose_window(set(free), count, nums, instance_type)
            if start is None:
                return NUMA_NOT_FIT
            return [(free[i], 0, devices[free[i]].devcore, self.data(devices[free[i]], cpd, ask))
                    for i in range(start, start + nums)]
        need = cpd if ask.whole else ask.cores
        for p in positions:
            dev = devices[p]
            current = used_cores[off + p] + (extra[p][1] if p in extra else 0)
            if popcount(dev.devcore) - popcount(current) < need:
                continue
            mask = core_mask(current, need)
            if mask <= 0 or mask & current or mask & ~dev.devcore:
                continue     # upstream's two-core rule has no free mask here (more than 2 cores a device)
            return [(p, 0, mask, self.data(dev, cpd, ask))]
        return CARD_INSUFFICIENT_CORE

    @staticmethod
    def data(dev: DeviceInfo, cpd: int, ask: NeuronAsk) -> dict:
        return {"index": dev.index, "coresPerDevice": cpd, "countInLimits": ask.count_in_limits}


# -- the vendor ---------------------------------------------------------------------------------------

class AWSNeuronVendor(PerDeviceCharging, DeviceVendor):
    vendor_key = NEURON_KEY
    allocated_annotation = ALLOCATED
    uses_node_lock = False
    kernel_flags = FLAG_CHARGE | FLAG_CHOOSE
    charge_type = NeuronCharge

    def __init__(self, config: AWSNeuronConfig):
        self.count_resource = config.resource_count_name
        self.core_resource = config.resource_core_name
        self.count_resource_name = self.count_resource

    def resource_names(self) -> list[str]:
        return [n for n in (self.count_resource, self.core_resource) if n]

    def quota_resources(self) -> tuple[str, str, int]:
        return "", self.core_resource, 1

    # -- inventory ---------------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        return (node.capacity.get(self.count_resource) if self.count_resource else None,
                node.capacity.get(self.core_resource) if self.core_resource else None,
                node.labels.get(INSTANCE_TYPE_LABEL))

    def registration_source(self) -> str:
        return f"{self.count_resource} capacity"

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        if not self.count_resource or self.count_resource not in node.capacity:
            return []
        raw = node.capacity[self.count_resource]
        count = parse_exact_int(raw)
        if count is None:
            raise DeviceDecodeError(f"{self.count_resource} {raw!r} is not a whole number of devices")
        if not 0 <= count <= MAX_CAPACITY_CARDS:
            raise DeviceDecodeError(f"{self.count_resource} {raw!r} is out of range: must be between 0 and "
                                    f"{MAX_CAPACITY_CARDS}")
        if count == 0:
            return []
        raw_cores = node.capacity.get(self.core_resource, "0") if self.core_resource else "0"
        cores = parse_exact_int(raw_cores)
        if cores is None or cores < 0:
            raise DeviceDecodeError(f"{self.core_resource} {raw_cores!r} is not a whole number of cores")
        cpd = cores // count
        if not 1 <= cpd <= MAX_CORES_PER_DEVICE:
            raise DeviceDecodeError(
                f"{self.core_resource} {raw_cores!r} over {self.count_resource} {raw!r} gives {cpd} cores a device: "
                f"must be between 1 and {MAX_CORES_PER_DEVICE}")
        mask = (1 << cpd) - 1
        custom = {NODE_TYPE: node.labels.get(INSTANCE_TYPE_LABEL, "")}
        return [DeviceInfo(id=f"{node.name}-{NEURON_KEY}-{i}", index=i, count=cpd, devmem=0, devcore=mask,
                           type=NEURON_KEY, health=True, custom=custom) for i in range(count)]

    # -- requests ----------------------------------------------------------------------------------

    def ask(self, container: dict) -> NeuronAsk | None:
        """The container's request (limits, then requests), or None; InvalidNeuronRequest."""
        limits, requests = resource_lists(container)
        raw = lookup(limits, requests, self.count_resource)
        if raw is not MISSING:
            nums = validate(raw, self.count_resource, MAX_DEVICES)
            in_limits = self.count_resource in limits and (parse_exact_int(limits[self.count_resource]) or 0) > 0
            return NeuronAsk(nums, CORES_PER_DEVICE_CAP, True, in_limits)
        raw = lookup(limits, requests, self.core_resource)
        if raw is MISSING:
            return None
        cores = validate(raw, self.core_resource, MAX_CORES)
        nums, per = split_cores(cores, self.core_resource, raw)
        return NeuronAsk(nums, per, False)

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        try:
            ask = self.ask(container)
        except InvalidNeuronRequest as err:
            name = str(container.get("name") or "")
            raise RequestError(f"container {go_quote(name)}: {err.resource} {quote_value(err.raw)} {err.problem}") from None
        if ask is None:
            return None
        return ContainerRequest(NEURON_KEY, ask.nums, 0, 0, ask.cores)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: the request is validated, with upstream's messages."""
        try:
            return self.ask(container) is not None
        except InvalidNeuronRequest as err:
            raise RequestError(str(err)) from None

    # -- fit ---------------------------------------------------------------------------------------

    def device_selector(self, pod_annotations, node_annotations):
        return uuid_selector(pod_annotations, (USE_UUID,), (NOUSE_UUID,))

    # -- allocation annotations --------------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        out = {ALLOCATED: encode_pod_devices(pod_devices)}
        ids: list[str] = []
        for position, container in enumerate(pod_devices):
            for dev in container:
                info = dev.custom
                if not info:
                    raise ValueError(f"AWSNeuron device {dev.uuid} of container {position} carries no index: "
                                     "only a decision's allocation can be encoded")
                index, cpd = info["index"], info["coresPerDevice"]
                if info["countInLimits"]:
                    ids.append(str(index))
                    continue
                if dev.usedcores & 1:
                    ids.append(str(cpd * index))
                    out[RESOURCE_TYPE] = self.core_resource
                if dev.usedcores & 2:
                    ids.append(str(cpd * index + 1))
                    out[RESOURCE_TYPE] = self.core_resource
        if ids:
            out[ASSIGNED_INDEX] = ",".join(ids)
            out[PREDICATE_TIME] = str(unix_nanos(now))
            out[NEURON_ALLOCATED] = "false"
            out[ASSIGNED_NODE] = node
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return (ALLOCATED, ASSIGNED_INDEX, RESOURCE_TYPE, PREDICATE_TIME, NEURON_ALLOCATED, ASSIGNED_NODE)

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(ALLOCATED)
        if text is None:
            return None
        return decode_pod_devices(text)

    def core_share(self, total_cores: int, used_cores: int) -> float:
        """Cores are masks here (the device's: every core's bit), so the share counts bits."""
        return round(100.0 * popcount(used_cores & total_cores) / popcount(total_cores), 1) if total_cores > 0 else 0.0


def build_family(config: DeviceConfig, switches) -> list[DeviceVendor]:
    return [AWSNeuronVendor(AWSNeuronConfig.from_section(config.section(CONFIG_SECTION.name)))]

"""AWS Neuron (Inferentia / Trainium): whole devices and NeuronCores (vendor key ``AWSNeuron``).

The device plugin registers nothing: the node's capacity says how many devices
(``aws.amazon.com/neuron``) and cores (``aws.amazon.com/neuroncore``) it has, and the label
``node.kubernetes.io/instance-type`` says which instance it is. Each device ``<node>-AWSNeuron-<i>``
has ``c = cores / devices`` cores (a capacity that does not divide evenly is refused, as HAMi after
v2.10 refuses it); at most 4 of them are addressable (Inferentia1 has 4, Inferentia2 and Trainium
2), recorded as a core **mask** (``2^min(c, 4) - 1``): the books charge masks, as upstream's
annotations carry them (core 0 = 1, core 1 = 2, cores 0-1 = 3, ...).

A container asks for devices (``aws.amazon.com/neuron: n``) or cores
(``aws.amazon.com/neuroncore: k``). A core request is sized by each node's addressable cores a
device ``a`` (HAMi after v2.10, #3082): ``k <= a`` cores take one device, more are spread ``a``
cores a device over ``ceil(k / a)`` unused devices (the last one gets what is left): 4 cores are
one inf1 device but two inf2 devices. One device is given one contiguous run of free cores, the
lowest that fits (upstream's ``allocateCoreMask``). Several devices are given as a contiguous
window of unused devices: on ``inf*`` instances any window, on the others only 4, 8 or 16 devices
aligned on their size.

The family is FLAG_CHARGE | FLAG_CHOOSE (hami_py/devices/perdevice.py): the mask a device is
charged depends on its own usage, which the chooser reads. Since the device count of a core
request depends on the node, its request row asks the most devices any node could give it (one a
core, at most :data:`ROW_DEVICES`) and the charger answers the node's own count (the kernel's
4-tuple, ``devices.base.Charger``).
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
from hami_py.reasons import CARD_INSUFFICIENT_CORE, NUMA_NOT_FIT, RESOURCE_QUOTA_NOT_FIT

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
ADDRESSABLE_CORES = 4                           # upstream's maxCoresPerNeuronDevice (Inferentia1)
COMMON_CORES = 2                                # the cores every Neuron device has (inf2, trn1: all of them)
MAX_CORES = MAX_DEVICES * ADDRESSABLE_CORES
# A core request's row asks one device a core, the most any node (one core a device) could give,
# capped past the most devices a node registers: a node is then short of devices for the cap as it
# is for the count its charger sizes (NodeInsufficientDevice either way).
ROW_DEVICES = MAX_CAPACITY_CARDS + 1
MAX_CORES_PER_DEVICE = INT32_MAX                # the device's slots column is an int32
LEGACY_CORES_PER_DEVICE = 2                     # what upstream assumes of an allocation without its geometry
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
    """One container's Neuron request: ``nums`` devices, each with every addressable core
    (``whole``: the device count was asked), or ``cores`` in all, spread by :func:`split_cores`
    over a node's devices (``nums`` is then the row's bound, :data:`ROW_DEVICES`);
    ``count_in_limits``: upstream's annotations then name device indexes instead of core indexes."""
    nums: int
    cores: int
    whole: bool
    count_in_limits: bool = False

    def part(self, i: int, per_device: int) -> int:
        """The cores device ``i`` (window order) of a core request gets on devices of
        ``per_device`` addressable cores (:func:`split_cores`), computed, never listed: a request
        may name billions of cores."""
        last = device_count(self.cores, per_device) - 1
        return (self.cores - per_device * last) if i == last else per_device

    def smallest_part(self, per_device: int) -> int:
        return self.part(device_count(self.cores, per_device) - 1, per_device)


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


def split_cores(cores: int, per_device: int) -> tuple[int, ...]:
    """The cores each device of a core request gets on devices of ``per_device`` addressable
    cores, as HAMi after v2.10 spreads ``TotalCoresreq``: one device for up to ``per_device``
    cores, else ``per_device`` a device with the rest on the last (5 cores: 4, 1 on inf1; 2, 2, 1
    on inf2)."""
    whole, rest = divmod(cores, per_device)
    return (per_device,) * whole + ((rest,) if rest else ())


def device_count(cores: int, per_device: int) -> int:
    """The devices ``cores`` take on devices of ``per_device`` addressable cores."""
    return -(-cores // per_device)


def allocate_core_mask(used: int, available: int, need: int) -> int | None:
    """Upstream's ``allocateCoreMask``: the lowest contiguous run of ``need`` cores of the mask
    ``available`` that ``used`` leaves free, as a mask; None when there is none (the Neuron runtime
    takes a contiguous core range, so scattered free cores do not add up)."""
    if not 0 < need <= ADDRESSABLE_CORES:
        return None
    run = (1 << need) - 1
    for start in range(ADDRESSABLE_CORES - need + 1):
        mask = run << start
        if available & mask == mask and not used & mask:
            return mask
    return None


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
    """The kernel checks each device against the smallest mask the row can be given there (a
    run of n cores is at least ``2^n - 1``; a whole device: its full mask; at most 100, the
    kernel's bound), which never refuses a device the chooser would take, and a core request
    takes the node's own count of devices (:func:`device_count` by its addressable cores a
    device); the chooser applies upstream's rules and gives the masks."""

    def __init__(self, cache, asks, row_container, shape):
        super().__init__(cache, NEURON_KEY, asks, row_container, shape)
        self._node: dict[int, tuple[int, int, int, str]] = {}
        self.namespace = "default"
        # node -> device position -> the most cores an ordinary init container (with the sidecars
        # started before it) holds there: the init side of the pod's per-device quota peak.
        self._init_cores: dict[int, dict[int, int]] = {}

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
        _, mask, _, _ = self.node_shape(node_index)
        if ask.whole:
            return 0, max(1, min(mask, 100)), 1
        per_device = popcount(mask)
        if per_device == 0:
            return CARD_INSUFFICIENT_CORE          # no addressable core here (upstream's reason)
        # More devices than the row's bound: only past any node's devices (ROW_DEVICES), so the
        # kernel reads NodeInsufficientDevice, as upstream does for a count beyond the node's.
        nums = min(device_count(ask.cores, per_device), ask.nums)
        check = (1 << ask.smallest_part(per_device)) - 1
        return 0, max(1, min(check, 100)), 1, nums

    def pick(self, node_index: int, ask: NeuronAsk, positions, nums, extra):
        answer = self.place(node_index, ask, positions, nums, extra)
        if isinstance(answer, int) or (NEURON_KEY, "cores") not in self.cache.quota.limits.get(self.namespace, {}):
            return answer
        return answer if self.quota_fits(node_index, answer, extra) else RESOURCE_QUOTA_NOT_FIT

    def quota_fits(self, node_index: int, answer, extra) -> bool:
        """Upstream's NeuronCore quota check (HAMi after v2.10, #3082), in cores (the masks' bits):
        the pod's cores on this node with this row's devices in, each device counting the larger
        of its ordinary init containers' peak and its app containers' (and sidecars') sum, as the
        books charge it, against what the namespace's quota leaves."""
        init = self.shape.is_init(self.row_container[self._row[node_index]])
        app = {p: popcount(held[1]) for p, held in self._app.get(node_index, {}).items()}
        peak = dict(self._init_cores.get(node_index, {}))
        for position, _, mask, _ in answer:
            if init:
                beside = popcount(extra[position][1]) if position in extra else 0
                peak[position] = max(peak.get(position, 0), beside + popcount(mask))
            else:
                app[position] = app.get(position, 0) + popcount(mask)
        cores = sum(max(peak.get(p, 0), app.get(p, 0)) for p in peak.keys() | app.keys())
        if not self.cache.quota.fits(self.namespace, NEURON_KEY, 0, cores):
            return False
        if init:
            self._init_cores[node_index] = peak
        return True

    def place(self, node_index: int, ask: NeuronAsk, positions, nums, extra):
        """Upstream's placement of one row: a window of unused devices, or one run of free cores."""
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
            window = [free[i] for i in range(start, start + nums)]
            per_device = popcount(devices[window[0]].devcore)
            masks = ([devices[p].devcore for p in window] if ask.whole
                     else [(1 << ask.part(i, per_device)) - 1 for i in range(len(window))])
            return [(p, 0, mask, self.data(devices[p], cpd, ask)) for p, mask in zip(window, masks)]
        for p in positions:
            dev = devices[p]
            current = used_cores[off + p] + (extra[p][1] if p in extra else 0)
            mask = allocate_core_mask(current, dev.devcore, popcount(dev.devcore) if ask.whole else ask.cores)
            if mask is not None:
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
    # The books charge core masks (core 1 is 2), a quota counts cores: the chooser checks it.
    quota_in_chooser = True

    def __init__(self, config: AWSNeuronConfig):
        self.count_resource = config.resource_count_name
        self.core_resource = config.resource_core_name
        self.count_resource_name = self.count_resource

    def resource_names(self) -> list[str]:
        return [n for n in (self.count_resource, self.core_resource) if n]

    def request_resource_names(self) -> frozenset[str]:
        """Devices or cores, each alone asks (:meth:`ask`)."""
        return frozenset(self.resource_names())

    def quota_resources(self) -> tuple[str, str, int]:
        return "", self.core_resource, 1

    def quota_cores(self, cores: int) -> int:
        """A device's charge is a core mask: it counts its cores (HAMi after v2.10, #3082)."""
        return popcount(cores)

    def quota_request(self, container: dict, request: ContainerRequest) -> tuple[int, int]:
        """The cores a core request asks in all (whatever devices they take); a whole device
        counts the 2 cores every Neuron device has (its own count is the node's)."""
        ask = self.ask(container)
        return 0, (ask.cores if ask is not None and not ask.whole else COMMON_CORES * request.nums)

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
        raw_cores = node.capacity.get(self.core_resource) if self.core_resource else None
        if raw_cores is None:
            raise DeviceDecodeError(f"{self.core_resource or 'the core resource'} is missing: "
                                    f"{self.count_resource} {raw!r} needs its cores")
        cores = parse_exact_int(raw_cores)
        if cores is None:
            raise DeviceDecodeError(f"{self.core_resource} {raw_cores!r} is not a whole number of cores")
        if cores <= 0:
            raise DeviceDecodeError(f"{self.core_resource} {raw_cores!r} must be a positive number of cores")
        if cores % count:
            # HAMi v2.11's words (it refuses the node's devices too).
            raise DeviceDecodeError(f"{self.core_resource} capacity {cores} is not divisible by "
                                    f"{self.count_resource} capacity {count}")
        cpd = cores // count
        if cpd > MAX_CORES_PER_DEVICE:
            raise DeviceDecodeError(f"cores per AWS Neuron device {cpd} exceeds the maximum of {MAX_CORES_PER_DEVICE}")
        mask = (1 << min(cpd, ADDRESSABLE_CORES)) - 1
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
            return NeuronAsk(nums, 0, True, in_limits)
        raw = lookup(limits, requests, self.core_resource)
        if raw is MISSING:
            return None
        cores = validate(raw, self.core_resource, MAX_CORES)
        return NeuronAsk(min(cores, ROW_DEVICES), cores, False)

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        try:
            ask = self.ask(container)
        except InvalidNeuronRequest as err:
            name = str(container.get("name") or "")
            raise RequestError(f"container {go_quote(name)}: {err.resource} {quote_value(err.raw)} {err.problem}") from None
        if ask is None:
            return None
        # Cores a device, as the generic readers of a request take them: a whole device counts its
        # 2 common cores, a core request the most one device may take; the charger gives each
        # device its mask and a core request its device count on each node.
        return ContainerRequest(NEURON_KEY, ask.nums, 0, 0,
                                COMMON_CORES if ask.whole else min(ask.cores, ADDRESSABLE_CORES))

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: the request is validated, with upstream's messages."""
        try:
            return self.ask(container) is not None
        except InvalidNeuronRequest as err:
            raise RequestError(str(err)) from None

    # -- fit ---------------------------------------------------------------------------------------

    def device_selector(self, pod_annotations, node_annotations):
        return uuid_selector(pod_annotations, (USE_UUID,), (NOUSE_UUID,))

    def charger(self, cache, pod: dict, row_container: list[int]) -> NeuronCharge:
        charge = super().charger(cache, pod, row_container)
        charge.namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        return charge

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
                # Data without the node's geometry (written before devices carried it) is read
                # with upstream's old two cores a device, as upstream reads it.
                index = info["index"]
                cpd = info.get("coresPerDevice") or LEGACY_CORES_PER_DEVICE
                if info.get("countInLimits"):
                    ids.append(str(index))
                    continue
                for core in range(min(cpd, ADDRESSABLE_CORES)):
                    if dev.usedcores >> core & 1:
                        ids.append(str(cpd * index + core))
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

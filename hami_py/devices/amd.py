"""AMD GPUs (vendor key ``AMD``): shares of memory and compute units.

HAMi's AMD device plugin registers a JSON inventory in ``hami.io/node-amd-register`` (upstream's
generic device list); ``devcore`` is the GPU's physical compute-unit (CU) count, ``type`` its
product (e.g. ``AMD-MI300X``) and ``numa`` its NUMA node. The node's devices count only while its
**allocatable** ``amd.com/gpu`` is a whole number above 0 (HAMi after v2.10, #3194: kubelet keeps
an unhealthy GPU in capacity and drops it from allocatable): otherwise the plugin is judged
unhealthy and its devices dropped.

A container asks in **limits only**: ``amd.com/gpu: n`` devices, optionally ``amd.com/gpumem``
(MiB; none = the whole device's memory) or the configured ``resourceMemoryPercentageName``
(``amd.com/gpumem-percentage``, limits else requests, an integer 0..100: each device is charged
``max(its memory x percent / 100, 1)`` MiB; 0 = the whole device; ``gpumem`` wins when both are
set), and ``amd.com/gpucores``, a percentage of each device's CUs (default 100). Each device is
charged ``clamp(floor(CUs x percent / 100), 1, CUs)`` CUs, rounded up to whole WGPs on a device
whose registration publishes ``custominfo.cuPerWGP`` (RDNA: the plugin can only mask whole WGPs, so
it carves the rounded count and the books must hold what it carves). The charge depends on the
device: the family is FLAG_CHARGE | FLAG_CHOOSE (hami_py/devices/perdevice.py). Pods pick devices by
product type (``amd.com/use-gputype`` / ``amd.com/nouse-gputype``), by id
(``amd.com/use-gpu-uuid`` / ``amd.com/nouse-gpu-uuid``) and may ask for all of a container's
GPUs on one NUMA node (``amd.com/numa-bind``, read with Go's ParseBool). A namespace
ResourceQuota on ``limits.amd.com/gpumem`` holds at filter, device by device, as upstream's
``fitQuota`` (memory only: cores are CUs here while a quota would be written in percent).

The webhook checks the core percentage (with the count), the memory percentage (always), gives a
container asking only a memory percentage one device, turns the configured
``resourcePriorityName`` into the ``AMD_TASK_PRIORITY`` env and sets the configured
``runtimeClassName`` on a pod asking AMD devices that names none. The metrics report cores as
percent of the CUs (``core_metrics``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceInfo, DeviceVendor, NoDevicesRegistered,
    PodDevices,
)
from hami_py.devices.codec import decode_json_devices, decode_pod_devices, encode_pod_devices, parse_go_bool
from hami_py.devices.gates import uuid_selector
from hami_py.devices.perdevice import DeviceCharge, PerDeviceCharging
from hami_py.devices.template import (
    MISSING, device_count, ensure_limits, invalid_request, lookup, percentage, resource_lists, shown_value,
    whole_number,
)
from hami_py.devices.webhook_values import checked_integers
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import CARD_INSUFFICIENT_CORE, CARD_INSUFFICIENT_MEMORY, NUMA_NOT_FIT, RESOURCE_QUOTA_NOT_FIT

AMD_KEY = "AMD"
REGISTER = "hami.io/node-amd-register"
TO_ALLOCATE = "hami.io/amd-devices-to-allocate"
ALLOCATED = "hami.io/amd-devices-allocated"
USE_TYPE = "amd.com/use-gputype"
NOUSE_TYPE = "amd.com/nouse-gputype"
USE_UUID = "amd.com/use-gpu-uuid"
NOUSE_UUID = "amd.com/nouse-gpu-uuid"
NUMA_BIND = "amd.com/numa-bind"
# The container env the priority resource becomes; amd-hami-core reads it (0 = the high class).
TASK_PRIORITY_ENV = "AMD_TASK_PRIORITY"
# The registration's custom-info key holding how many CUs the device plugin hands out together:
# 2 on RDNA (gfx10 and later), whose CU mask is applied a WGP at a time; absent or 1 elsewhere.
CU_PER_WGP = "cuPerWGP"


@dataclass(slots=True, frozen=True)
class AMDConfig:
    """The ``amd`` section. A missing key is Go's zero value (""): the resource, runtime class or
    priority is then not used; a number or boolean where a name belongs is refused."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName", "resourceMemoryName", "resourceCoreName",
                                       "resourceMemoryPercentageName", "runtimeClassName", "resourcePriorityName")
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""
    resource_memory_percentage_name: str = ""
    runtime_class_name: str = ""
    resource_priority_name: str = ""

    @classmethod
    def from_section(cls, section: Section) -> "AMDConfig":
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))


CONFIG_SECTION = ConfigSection("amd", AMDConfig.KEYS)


def cus_per_wgp(custom: dict) -> int:
    """How many CUs the device plugin masks together on this device: the registration's
    ``custominfo.cuPerWGP`` when it is a whole number above 1 (up to MaxInt32), else 1. Upstream
    reads the key as a JSON number and ignores anything else (a string, a fraction, a boolean)
    rather than refusing the inventory: such a device is booked CU by CU, as before."""
    value = custom.get(CU_PER_WGP)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 1
    if not 1 < value <= INT32_MAX or value != int(value):
        return 1
    return int(value)


def compute_units(devcore: int, percent: int, wgp: int = 1) -> int:
    """The CUs a device of ``devcore`` CUs gives a request of ``percent``: at least one, rounded up
    to whole WGPs of ``wgp`` CUs (what the plugin masks on RDNA), at most all; 0 for a device
    without CUs (which no request fits)."""
    if devcore <= 0:
        return 0
    cus = max(devcore * percent // 100, 1)
    if wgp > 1:
        cus = -(-cus // wgp) * wgp
    return min(cus, devcore)


def device_compute_units(device: DeviceInfo, percent: int) -> int:
    """What ``device`` is charged for ``percent`` of its CUs (whole WGPs where it publishes them)."""
    return compute_units(device.devcore, percent, cus_per_wgp(device.custom))


def numa_bound(pod_annotations: dict[str, str]) -> bool:
    """Whether the pod asks for each container's GPUs on one NUMA node (``amd.com/numa-bind``,
    Go's ParseBool: ``true``/``1``/``t``...; anything unparsable is false)."""
    text = pod_annotations.get(NUMA_BIND)
    return text is not None and parse_go_bool(text) is True


@dataclass(slots=True, frozen=True)
class AMDAsk:
    nums: int
    memory: int      # MiB; 0 = the memory share, else the whole device
    percent: int     # of each device's CUs
    share: int = 0   # percent of each device's memory when no memory is asked; 0 = none

    def device_memory(self, devmem: int) -> int:
        """What one device of ``devmem`` MiB is charged (upstream's Fit)."""
        if self.memory > 0:
            return self.memory
        total = max(devmem, 0)
        if self.share > 0 and total > 0:
            return max(total * self.share // 100, 1)
        return total


class AMDCharge(DeviceCharge):
    """The kernel checks each device against what every AMD device of the node would need when
    they all agree (the usual node: one model), else against the least any needs (1 CU, the
    smallest memory charge); the chooser checks each device's own need, the namespace's memory
    quota with the pod's own devices counted in, and NUMA binding."""

    def __init__(self, cache, asks, row_container, shape):
        super().__init__(cache, AMD_KEY, asks, row_container, shape)
        self.namespace = "default"
        self.numa_bound = False
        self.numa_ascending = False      # binpack walks the lowest NUMA node first, as the kernel
        self._peak: dict[int, int] = {}  # node -> the pod's AMD memory there so far (quota)

    def row_charge(self, node_index: int, ask: AMDAsk):
        devices = self.cache.devices_at(node_index)
        family = [devices[p] for p in self.family_positions(node_index)]
        sizes = {ask.device_memory(d.devmem) for d in family}
        memory = sizes.pop() if len(sizes) == 1 else min(sizes, default=0)
        needs = {device_compute_units(d, ask.percent) for d in family}
        cores = needs.pop() if len(needs) == 1 else 1
        return min(memory, INT32_MAX), max(1, min(cores, 100)), 1

    def pick(self, node_index: int, ask: AMDAsk, positions, nums, extra):
        if not self.numa_bound:
            chosen, refused = self._pick_run(node_index, ask, positions, nums, extra)
            return chosen if len(chosen) == nums else _worst(refused)
        # Upstream walks the devices NUMA node by NUMA node and starts over on each: the first
        # node where ``nums`` devices fit wins. The kernel's order is kept within a node.
        devices = self.cache.devices_at(node_index)
        ordered = sorted(positions, key=lambda p: devices[p].numa, reverse=not self.numa_ascending)
        refused: dict[int, int] = {}
        split = False
        start = 0
        while start < len(ordered):
            numa = devices[ordered[start]].numa
            end = start
            while end < len(ordered) and devices[ordered[end]].numa == numa:
                end += 1
            chosen, why = self._pick_run(node_index, ask, ordered[start:end], nums, extra)
            if len(chosen) == nums:
                return chosen
            split = split or bool(chosen)
            for reason, count in why.items():
                refused[reason] = refused.get(reason, 0) + count
            start = end
        return NUMA_NOT_FIT if split else _worst(refused)

    def _pick_run(self, node_index: int, ask: AMDAsk, positions, nums, extra):
        """Up to ``nums`` of ``positions`` that take the ask, in order, and why the others did not."""
        cache = self.cache
        off = cache.node_offset[node_index]
        devices = cache.devices_at(node_index)
        total_mem, used_mem, total_cores, used_cores = cache.total_mem, cache.used_mem, cache.total_cores, cache.used_cores
        quota = cache.quota
        pod_so_far = sum(held[0] for held in extra.values())
        peak = self._peak.get(node_index, 0)
        chosen: list = []
        row_memory = 0
        refused = {CARD_INSUFFICIENT_MEMORY: 0, CARD_INSUFFICIENT_CORE: 0, RESOURCE_QUOTA_NOT_FIT: 0}
        for p in positions:
            dev, j = devices[p], off + p
            held_mem, held_cores = extra[p] if p in extra else (0, 0)
            memory = ask.device_memory(dev.devmem)
            # Upstream's fitQuota: the pod's AMD memory with this device in, against the namespace's quota.
            if not quota.fits(self.namespace, AMD_KEY, max(peak, pod_so_far + row_memory + memory), 0):
                refused[RESOURCE_QUOTA_NOT_FIT] += 1
                continue
            if total_mem[j] - used_mem[j] - held_mem < memory:
                refused[CARD_INSUFFICIENT_MEMORY] += 1
                continue
            need = device_compute_units(dev, ask.percent)
            if need <= 0 or total_cores[j] - used_cores[j] - held_cores < need:
                refused[CARD_INSUFFICIENT_CORE] += 1
                continue
            chosen.append((p, memory, need, dev.type))
            row_memory += memory
            if len(chosen) == nums:
                self._peak[node_index] = max(peak, pod_so_far + row_memory)
                break
        return chosen, refused

    def finish(self, node_index: int, position: int, device: ContainerDevice, data) -> None:
        device.type = data       # upstream keeps the registered product type in the allocation


def _core_refusal(resource: str, raw: object) -> str:
    """Upstream's webhook words for a core limit that is no percentage of 1..100."""
    return f"{resource} must be an integer percentage between 1 and 100"


def _worst(refused: dict[int, int]) -> int:
    """The reason that refused the most devices (on a tie: cores, then memory, then quota)."""
    order = (CARD_INSUFFICIENT_CORE, CARD_INSUFFICIENT_MEMORY, RESOURCE_QUOTA_NOT_FIT)
    return max(order, key=lambda r: (refused.get(r, 0), -order.index(r)))


class AMDVendor(PerDeviceCharging, DeviceVendor):
    vendor_key = AMD_KEY
    register_annotation = REGISTER
    to_allocate_annotation = TO_ALLOCATE
    allocated_annotation = ALLOCATED
    kernel_flags = FLAG_CHARGE | FLAG_CHOOSE
    charge_type = AMDCharge

    def __init__(self, config: AMDConfig):
        self.config = config
        self.count_resource = config.resource_count_name
        self.memory_resource = config.resource_memory_name
        self.core_resource = config.resource_core_name
        self.share_resource = config.resource_memory_percentage_name
        self.priority_resource = config.resource_priority_name
        self.count_resource_name = self.count_resource

    def request_resources(self) -> tuple[str, str, str, int]:
        return self.count_resource, self.memory_resource, self.core_resource, 1

    def resource_names(self) -> list[str]:
        # Upstream's GetResourceNames: a percentage alone is given the count at admission.
        return [n for n in (self.count_resource, self.memory_resource, self.core_resource) if n]

    def request_resource_names(self) -> frozenset[str]:
        """What :meth:`ask` reads: the count (which gates the rest), memory, its share and cores."""
        return frozenset(n for n in (self.count_resource, self.memory_resource, self.share_resource,
                                     self.core_resource) if n)

    def quota_resources(self) -> tuple[str, str, int]:
        """Memory only (HAMi after v2.10, #3180): the core quota would be percent, the charge CUs."""
        return self.memory_resource, "", 1

    # -- inventory ---------------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        return (node.annotations.get(REGISTER),
                node.allocatable.get(self.count_resource) if self.count_resource else None)

    def healthy(self, node) -> bool:
        """Upstream's ``CheckHealth``: the count's allocatable is a whole number above 0 (always,
        when the family has no count resource)."""
        if not self.count_resource:
            return True
        count = parse_exact_int(node.allocatable.get(self.count_resource))
        return count is not None and count > 0

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        text = node.annotations.get(REGISTER)
        if text is None or not self.healthy(node):
            return []
        devices = decode_json_devices(text)
        if not devices:
            raise NoDevicesRegistered("the registration lists no device")
        return devices

    # -- requests ----------------------------------------------------------------------------------

    def memory_share(self, container: str, limits: dict, requests: dict) -> int:
        """The memory percentage (limits, else requests), 0 when not asked; 0..100 or RequestError."""
        raw = lookup(limits, requests, self.share_resource)
        if raw is MISSING:
            return 0
        return percentage(container, self.share_resource, raw)

    def ask(self, container: dict) -> AMDAsk | None:
        """Upstream reads limits only: the count, then memory (MiB) or its share, and the core
        percentage."""
        limits, requests = resource_lists(container)
        if not self.count_resource or self.count_resource not in limits:
            return None
        name = str(container.get("name") or "")
        nums = device_count(name, self.count_resource, limits[self.count_resource])
        if nums == 0:
            return None
        memory = 0
        if self.memory_resource and self.memory_resource in limits:
            memory = whole_number(name, self.memory_resource, limits[self.memory_resource], low=0, high=INT32_MAX,
                                  unit="MiB")
        share = self.memory_share(name, limits, requests)
        percent = 100
        if self.core_resource and self.core_resource in limits:
            raw = limits[self.core_resource]
            percent = parse_exact_int(raw)
            if percent is None or not 1 <= percent <= 100:
                raise invalid_request(name, self.core_resource, f"core percentage request {shown_value(raw)} "
                                                                "is out of range (must be an integer between 1 and 100)")
        return AMDAsk(nums, memory, percent, share if memory == 0 else 0)

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        ask = self.ask(container)
        if ask is None:
            return None
        mempct = 0 if ask.memory else ask.share or 100
        return ContainerRequest(AMD_KEY, ask.nums, ask.memory, mempct, ask.percent)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: with the count in limits, a core limit must be a percentage; a
        memory percentage must be one of 0..100; the priority becomes the container's
        ``AMD_TASK_PRIORITY``; the count, the memory, the memory percentage (which is given one
        device) or the core limit makes it an AMD container, whose pod gets the configured
        runtime class when it names none."""
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        asked = bool(self.count_resource) and self.count_resource in limits
        if asked:
            checked_integers(name, ((self.core_resource, 1, 100),), limits, refusal=_core_refusal)
        checked_integers(name, ((self.share_resource, 0, 100),), limits, requests, first_only=True)
        self._set_priority(container, name, limits)
        if not asked and self.memory_resource:
            asked = self.memory_resource in limits
        if not asked and self.share_resource and (self.share_resource in limits or self.share_resource in requests):
            asked = True
            if self.count_resource:    # a percentage alone still needs a device
                ensure_limits(container)[self.count_resource] = "1"
        if not asked and self.core_resource:
            asked = self.core_resource in limits
        if asked and self.config.runtime_class_name:
            spec = pod.setdefault("spec", {})
            if spec.get("runtimeClassName") is None:
                spec["runtimeClassName"] = self.config.runtime_class_name
        return asked

    def _set_priority(self, container: dict, name: str, limits: dict) -> None:
        """The priority resource as the container's ``AMD_TASK_PRIORITY`` (0..MaxInt32), replacing
        a variable of that name the container sets: the resource is the one source of the value."""
        if not self.priority_resource or self.priority_resource not in limits:
            return
        value = str(checked_integers(name, ((self.priority_resource, 0, INT32_MAX),), limits)[self.priority_resource])
        env = container.get("env")
        if not isinstance(env, list):
            env = container["env"] = []
        for var in env:
            if isinstance(var, dict) and var.get("name") == TASK_PRIORITY_ENV:
                var.pop("valueFrom", None)
                var["value"] = value
                return
        env.append({"name": TASK_PRIORITY_ENV, "value": value})

    # -- fit ---------------------------------------------------------------------------------------

    def device_selector(self, pod_annotations, node_annotations):
        return uuid_selector(pod_annotations, (USE_UUID,), (NOUSE_UUID,), use_type=USE_TYPE, nouse_type=NOUSE_TYPE)

    def numa_bind(self, pod_annotations: dict[str, str]) -> bool:
        """False even for ``amd.com/numa-bind``: the kernel's NUMA regrouping hands a choosing
        family the devices of the first NUMA node where enough of them pass the kernel's check,
        which measures every device by the row's common charge; AMD's chooser measures each by its
        own CUs and the quota, so that NUMA node may still not hold the container while a later one
        does. The chooser applies the binding itself, over every device that fits (:meth:`chooser`)."""
        return False

    def charger(self, cache, pod: dict, row_container: list[int]) -> AMDCharge:
        charge = super().charger(cache, pod, row_container)
        charge.namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        return charge

    def chooser(self, cache, ask):
        choose = super().chooser(cache, ask)
        charge = ask.charger
        charge.numa_bound = numa_bound(ask.pod_annotations)
        charge.numa_ascending = ask.gpu_policy.strip() == "binpack"
        return choose

    # -- allocation annotations --------------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        return {TO_ALLOCATE: text, ALLOCATED: text}

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(ALLOCATED)
        if text is None:
            return None
        return decode_pod_devices(text)

    # -- metrics -----------------------------------------------------------------------------------

    def core_metrics(self, total_cores: int, used_cores: int) -> tuple[int, int]:
        """Upstream's ``normalizeAMDCoreMetrics``: CUs as percent of the device's CUs, rounded up
        (the legacy metrics keep the raw counts)."""
        if total_cores <= 0:
            return total_cores, used_cores
        return 100, math.ceil(used_cores / total_cores * 100)


def build_family(config: DeviceConfig, switches) -> list[DeviceVendor]:
    return [AMDVendor(AMDConfig.from_section(config.section(CONFIG_SECTION.name)))]

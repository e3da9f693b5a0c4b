"""AMD GPUs (vendor key ``AMD``): shares of memory and compute units.

HAMi's AMD device plugin registers a JSON inventory in ``hami.io/node-amd-register`` (upstream's
generic device list); ``devcore`` is the GPU's physical compute-unit (CU) count and ``type`` its
product (e.g. ``AMD-MI300X``). The node's devices count only while its capacity advertises
``amd.com/gpu`` (a whole number above 0): otherwise upstream judges the plugin unhealthy and
drops them.

A container asks in **limits only**: ``amd.com/gpu: n`` devices, optionally ``amd.com/gpumem``
(MiB; none = the whole device's memory) and ``amd.com/gpucores``, a percentage of each device's
CUs (default 100). Each device is charged ``clamp(floor(CUs x percent / 100), 1, CUs)`` CUs, so
the charge depends on the device: the family is FLAG_CHARGE | FLAG_CHOOSE
(hami_py/devices/perdevice.py). Pods pick devices by product type (``amd.com/use-gputype`` /
``amd.com/nouse-gputype``) and by id (``amd.com/use-gpu-uuid`` / ``amd.com/nouse-gpu-uuid``).
The metrics report cores as percent of the CUs (``core_metrics``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hami_py.config import ConfigSection, DeviceConfig
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_CHOOSE, ContainerDevice, ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceVendor,
    NoDevicesRegistered, PodDevices, RequestError,
)
from hami_py.devices.codec import decode_json_devices, decode_pod_devices, encode_pod_devices
from hami_py.devices.gates import uuid_selector
from hami_py.devices.perdevice import DeviceCharge, PerDeviceCharging
from hami_py.devices.template import (
    ResourceNamesConfig, device_count, invalid_request, resource_lists, shown_value, whole_number,
)
from hami_py.quantity import INT32_MAX, parse_exact_int
from hami_py.reasons import CARD_INSUFFICIENT_CORE, CARD_INSUFFICIENT_MEMORY

AMD_KEY = "AMD"
REGISTER = "hami.io/node-amd-register"
TO_ALLOCATE = "hami.io/amd-devices-to-allocate"
ALLOCATED = "hami.io/amd-devices-allocated"
USE_TYPE = "amd.com/use-gputype"
NOUSE_TYPE = "amd.com/nouse-gputype"
USE_UUID = "amd.com/use-gpu-uuid"
NOUSE_UUID = "amd.com/nouse-gpu-uuid"


AMDConfig = ResourceNamesConfig     # the ``amd`` section: count, memory and core names
CONFIG_SECTION = ConfigSection("amd", AMDConfig.KEYS)

def compute_units(devcore: int, percent: int) -> int:
    """The CUs a device of ``devcore`` CUs gives a request of ``percent`` (at least one, at most
    all); 0 for a device without CUs (which no request fits)."""
    if devcore <= 0:
        return 0
    return min(max(devcore * percent // 100, 1), devcore)


@dataclass(slots=True, frozen=True)
class AMDAsk:
    nums: int
    memory: int      # MiB; 0 = the whole device
    percent: int


class AMDCharge(DeviceCharge):
    """The kernel checks each device against what every AMD device of the node would need when
    they all agree (the usual node: one model), else against the least any needs (1 CU, and
    memory only when asked); the chooser checks each device's own need."""

    def __init__(self, cache, asks, row_container, shape):
        super().__init__(cache, AMD_KEY, asks, row_container, shape)

    def row_charge(self, node_index: int, ask: AMDAsk):
        devices = self.cache.devices_at(node_index)
        family = [devices[p] for p in self.family_positions(node_index)]
        memory = ask.memory
        if memory == 0:
            sizes = {max(d.devmem, 0) for d in family}
            memory = sizes.pop() if len(sizes) == 1 else 0
        needs = {compute_units(d.devcore, ask.percent) for d in family}
        cores = needs.pop() if len(needs) == 1 else 1
        return min(memory, INT32_MAX), max(1, min(cores, 100)), 1

    def pick(self, node_index: int, ask: AMDAsk, positions, nums, extra):
        cache = self.cache
        off = cache.node_offset[node_index]
        devices = cache.devices_at(node_index)
        total_mem, used_mem, total_cores, used_cores = cache.total_mem, cache.used_mem, cache.total_cores, cache.used_cores
        chosen = []
        short_of_memory = short_of_cores = 0
        for p in positions:
            dev, j = devices[p], off + p
            held_mem, held_cores = extra[p] if p in extra else (0, 0)
            memory = ask.memory if ask.memory > 0 else max(dev.devmem, 0)
            if total_mem[j] - used_mem[j] - held_mem < memory:
                short_of_memory += 1
                continue
            need = compute_units(dev.devcore, ask.percent)
            if need <= 0 or total_cores[j] - used_cores[j] - held_cores < need:
                short_of_cores += 1
                continue
            chosen.append((p, memory, need, dev.type))
            if len(chosen) == nums:
                return chosen
        return CARD_INSUFFICIENT_MEMORY if short_of_memory > short_of_cores else CARD_INSUFFICIENT_CORE

    def finish(self, node_index: int, position: int, device: ContainerDevice, data) -> None:
        device.type = data       # upstream keeps the registered product type in the allocation


class AMDVendor(PerDeviceCharging, DeviceVendor):
    vendor_key = AMD_KEY
    register_annotation = REGISTER
    to_allocate_annotation = TO_ALLOCATE
    allocated_annotation = ALLOCATED
    kernel_flags = FLAG_CHARGE | FLAG_CHOOSE
    charge_type = AMDCharge

    def __init__(self, config: AMDConfig):
        self.count_resource = config.resource_count_name
        self.memory_resource = config.resource_memory_name
        self.core_resource = config.resource_core_name
        self.count_resource_name = self.count_resource

    def request_resources(self) -> tuple[str, str, str, int]:
        return self.count_resource, self.memory_resource, self.core_resource, 1

    def resource_names(self) -> list[str]:
        return [n for n in (self.count_resource, self.memory_resource, self.core_resource) if n]

    # -- inventory ---------------------------------------------------------------------------------

    def registration_inputs(self, node) -> object:
        return (node.annotations.get(REGISTER),
                node.capacity.get(self.count_resource) if self.count_resource else None)

    def healthy(self, node) -> bool:
        """Upstream's ``CheckHealth``: the count capacity is a whole number above 0 (always, when
        the family has no count resource)."""
        if not self.count_resource:
            return True
        count = parse_exact_int(node.capacity.get(self.count_resource))
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

    def ask(self, container: dict) -> AMDAsk | None:
        """Upstream reads limits only: the count, then memory (MiB) and the core percentage."""
        limits, _ = resource_lists(container)
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
        percent = 100
        if self.core_resource and self.core_resource in limits:
            raw = limits[self.core_resource]
            percent = parse_exact_int(raw)
            if percent is None or not 1 <= percent <= 100:
                raise invalid_request(name, self.core_resource, f"core percentage request {shown_value(raw)} "
                                                                "is out of range (must be an integer between 1 and 100)")
        return AMDAsk(nums, memory, percent)

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        ask = self.ask(container)
        if ask is None:
            return None
        return ContainerRequest(AMD_KEY, ask.nums, ask.memory, 100 if ask.memory == 0 else 0, ask.percent)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: with the count in limits, a core limit must be a percentage; the
        count, the memory or the core limit alone makes it an AMD container."""
        limits, _ = resource_lists(container)
        asked = bool(self.count_resource) and self.count_resource in limits
        if asked and self.core_resource and self.core_resource in limits:
            percent = parse_exact_int(limits[self.core_resource])
            if percent is None or not 1 <= percent <= 100:
                raise RequestError(f"{self.core_resource} must be an integer percentage between 1 and 100")
        if not asked and self.memory_resource:
            asked = self.memory_resource in limits
        if not asked and self.core_resource:
            asked = self.core_resource in limits
        return asked

    # -- fit ---------------------------------------------------------------------------------------

    def device_selector(self, pod_annotations, node_annotations):
        return uuid_selector(pod_annotations, (USE_UUID,), (NOUSE_UUID,), use_type=USE_TYPE, nouse_type=NOUSE_TYPE)

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

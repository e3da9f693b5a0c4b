"""Enflame: whole GCUs (vendor key ``GCU``) and DRS partitions (vendor key ``Enflame``).

Whole GCUs register nothing: ``status.capacity[enflame.com/gcu]`` says how many cards the node
has (``<node>-GCU-<i>``), each given whole to one container.

DRS partitions are hardware slices of a card, announced in ``enflame.com/gcu-drs-capacity``
(cards with their slice capacity, and the node's profiles such as ``3g.20gb``). A request asks
for slices directly or for memory/cores "by spec"; the profile it gets depends on the node, so
the family is a FLAG_CHARGE one: its :class:`DrsCharger` tells the kernel, per node, what one
partition costs there (the profile's memory, cores and slices), and the kernel checks and
charges each card with that (``count - used >= slices``, before memory: FLAG_SLOTS_FIRST, as
HAMi after v2.10, #2877). The decision's annotations are upstream's; a pod's slices are read
back from ``assigned-containers`` (docs/devices/enflame.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import orjson

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py import reasons as R
from hami_py.devices.base import (
    FLAG_CHARGE, FLAG_EXCLUSIVE, FLAG_SLOTS_FIRST, Charger, ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceVendor,
    NoDevicesRegistered, PodDevices,
)
from hami_py.devices.codec import decode_pod_devices, encode_pod_devices, parse_go_int
from hami_py.devices.gates import uuid_selector
from hami_py.devices.template import (
    MISSING, CapacityCards, TemplateSpec, TemplateVendor, lookup, request_error, resource_lists, rounded_quantity, whole_number,
)
from hami_py.quantity import INT32_MAX, INT32_MIN

GCU_KEY = "GCU"
DRS_KEY = "Enflame"
GCU_TO_ALLOCATE = "hami.io/enflame-gcu-devices-to-allocate"
GCU_ALLOCATED = "hami.io/enflame-gcu-devices-allocated"
DRS_CAPACITY = "enflame.com/gcu-drs-capacity"
DRS_ALLOCATED = "hami.io/enflame-vgpu-devices-allocated"
DRS_USE_UUID = "enflame.com/use-gpuuuid"
DRS_NOUSE_UUID = "enflame.com/nouse-gpuuuid"
ASSIGNED = "enflame.com/gcu-assigned"
ASSIGNED_TIME = "enflame.com/gcu-assigned-time"
ASSIGNED_INDEX = "enflame.com/gcu-assigned-index"
ASSIGNED_ID = "enflame.com/gcu-assigned-id"
ASSIGNED_MINOR = "enflame.com/gcu-assigned-minor"
REQUEST_SIZE = "enflame.com/gcu-request-size"
ASSIGNED_CONTAINERS = "assigned-containers"

DEFAULT_DRS_COUNT = "enflame.com/drs-gcu"
DEFAULT_DRS_MEMORY = "enflame.com/gcu-memory"
DEFAULT_DRS_CORE = "enflame.com/gcu-core"


# -- config ---------------------------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class EnflameConfig:
    """The ``enflame`` section (upstream's ``EnflameConfig``); missing keys are ""."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceNameGCU", "resourceNameDRSGCU", "resourceNameGCUMemory",
                                       "resourceNameGCUCore", "resourceNameVGCU", "resourceNameVGCUPercentage")
    resource_name_gcu: str = ""
    resource_name_drs_gcu: str = ""
    resource_name_memory: str = ""
    resource_name_core: str = ""
    resource_name_vgcu: str = ""
    resource_name_vgcu_percentage: str = ""

    @classmethod
    def from_section(cls, section: Section) -> EnflameConfig:
        """Only strings: a number or boolean where a resource name belongs is refused."""
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))

    def drs_names(self) -> tuple[str, str, str]:
        """(count, memory, core) DRS resources, with upstream's fallbacks for empty names."""
        count = self.resource_name_drs_gcu or self.resource_name_vgcu or DEFAULT_DRS_COUNT
        return count, self.resource_name_memory or DEFAULT_DRS_MEMORY, self.resource_name_core or DEFAULT_DRS_CORE


CONFIG_SECTION = ConfigSection("enflame", EnflameConfig.KEYS)


# -- whole GCU ----------------------------------------------------------------------------------

class GCUVendor(CapacityCards, TemplateVendor):
    """Whole GCUs from ``status.capacity[enflame.com/gcu]``, always exclusive."""

    kernel_flags = FLAG_EXCLUSIVE
    uses_node_lock = False

    def __init__(self, config: EnflameConfig):
        super().__init__(TemplateSpec(vendor_key=GCU_KEY, count_resource=config.resource_name_gcu,
                                      to_allocate_annotation=GCU_TO_ALLOCATE, allocated_annotation=GCU_ALLOCATED))

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        cards = self.capacity_cards(node)
        return [DeviceInfo(id=f"{node.name}-{GCU_KEY}-{i}", index=i, count=1, devmem=100, devcore=100,
                           type=GCU_KEY, health=True) for i in range(cards)]

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        request.memreq, request.mempct, request.coresreq = 100, 100, 100
        return request

    def device_selector(self, pod_annotations, node_annotations):
        return None     # upstream's GCU has no device selection


# -- DRS: inventory -------------------------------------------------------------------------------

def parse_profile(name: str) -> tuple[int, int]:
    """(slices, memory GB) of a profile name such as ``3g.20gb``; 0 for a part that does not parse."""
    parts = name.strip().lower().split(".")
    if len(parts) < 2:
        return 0, 0
    size = parse_go_int(parts[0].strip().removesuffix("g"), INT32_MIN, INT32_MAX)
    if size is None:
        return 0, 0
    mem = parse_go_int(parts[1].strip().removesuffix("gb"), INT32_MIN, INT32_MAX)
    return size, (0 if mem is None else mem)


def _field(obj: dict, name: str) -> object:
    """A JSON object's field as Go's decoder finds it: the exact key, else any case."""
    if name in obj:
        return obj[name]
    for key, value in obj.items():
        if key.lower() == name.lower():
            return value
    return None


def _capacity(raw: object) -> int | None:
    if type(raw) is int:
        return max(min(raw, INT32_MAX), INT32_MIN)
    if type(raw) is float:
        return int(raw) if INT32_MIN <= raw <= INT32_MAX else None
    if type(raw) is str:
        value = parse_go_int(raw.strip(), -(1 << 63), (1 << 63) - 1)
        return None if value is None else max(min(value, INT32_MAX), INT32_MIN)
    return None


def decode_drs_capacity(text: str, node: str) -> list[DeviceInfo]:
    """The DRS inventory of ``enflame.com/gcu-drs-capacity``; DeviceDecodeError naming the field."""
    try:
        spec = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        raise DeviceDecodeError(f"invalid JSON: {err}") from None
    if type(spec) is not dict:
        raise DeviceDecodeError("expected a JSON object with devices and profiles")
    devices = _field(spec, "devices")
    profiles = _field(spec, "profiles")
    if devices is not None and type(devices) is not list:
        raise DeviceDecodeError('field "devices": expected an array')
    if profiles is not None and type(profiles) is not dict:
        raise DeviceDecodeError('field "profiles": expected an object')
    profiles = profiles or {}
    for name, pid in profiles.items():
        if type(pid) is not str:
            raise DeviceDecodeError(f'field "profiles.{name}": expected a string')
    max_slice = max_mem = 0
    for name in profiles:
        size, mem = parse_profile(name)
        max_slice, max_mem = max(max_slice, size), max(max_mem, mem)
    if max_slice <= 0:
        raise DeviceDecodeError(f"no valid DRS profile in {sorted(profiles)}")
    if max_mem <= 0:
        max_mem = max_slice
    out = []
    for position, dev in enumerate(devices or []):
        if type(dev) is not dict:
            raise DeviceDecodeError(f"device {position}: expected an object")
        index_text, minor = _field(dev, "index"), _field(dev, "minor")
        for what, value in (("index", index_text), ("minor", minor)):
            if value is not None and type(value) is not str:
                raise DeviceDecodeError(f'device {position}: field "{what}": expected a string')
        index = parse_go_int(index_text or "", 0, INT32_MAX)
        if index is None:
            index = position       # upstream: an index that does not parse is the position
        raw_capacity = _field(dev, "capacity")
        capacity = _capacity(raw_capacity)
        if capacity is None or capacity <= 0:
            raise DeviceDecodeError(
                f'device {position}: field "capacity": {raw_capacity!r} is not a positive slice count')
        minor = (minor or "").strip() or str(index)
        out.append(DeviceInfo(id=f"{node}-enflame-drs-{index}", index=index, count=capacity, devmem=max_mem * 1024,
                              devcore=100, type=DRS_KEY, health=True,
                              custom={"minor": minor, "index": str(index), "profiles": dict(profiles),
                                      "maxSlice": max_slice}))
    if not out:
        raise NoDevicesRegistered("the DRS capacity lists no device")
    return out


# -- DRS: profiles and requests ---------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class DrsProfile:
    name: str
    id: str
    size: int          # slices
    memory_gb: int
    core_percent: int


@dataclass(slots=True, frozen=True)
class DrsRequest:
    """One container's DRS request: ``slices`` (direct) or ``memory``/``cores`` (by spec)."""
    direct: bool
    slices: int = 0
    memory: int = 0
    cores: int = 0


def collect_profiles(devices: list[DeviceInfo]) -> list[DrsProfile]:
    """The node's profiles, by slices then memory (upstream's ``collectDRSProfiles``)."""
    max_slice = max((int(d.custom.get("maxSlice") or 0) for d in devices), default=0)
    if max_slice <= 0:
        max_slice = max((parse_profile(n)[0] for d in devices for n in d.custom.get("profiles", {})), default=0)
    if max_slice <= 0:
        return []
    seen: dict[str, DrsProfile] = {}
    for d in devices:
        for name, pid in (d.custom.get("profiles") or {}).items():
            size, mem = parse_profile(name)
            if size <= 0 or mem <= 0:
                continue
            seen[name] = DrsProfile(name, pid, size, mem, math.ceil(size * 100 / max_slice))
    return sorted(seen.values(), key=lambda p: (p.size, p.memory_gb, p.name))


def select_profile(profiles: list[DrsProfile], request: DrsRequest) -> DrsProfile | None:
    """The profile a request gets on a node (upstream's ``selectProfileByRequest``): direct →
    the profile of exactly that many slices; by spec → the first with at least the memory (GB;
    a value above twice the largest profile is MiB) and the cores asked."""
    if not profiles:
        return None
    if request.direct:
        return next((p for p in profiles if p.size == request.slices), None)
    largest = profiles[-1].memory_gb
    memory_gb = request.memory
    if memory_gb > 0 and largest > 0 and memory_gb > 2 * largest:
        memory_gb = math.ceil(memory_gb / 1024)
    for p in profiles:
        if memory_gb > 0 and p.memory_gb < memory_gb:
            continue
        if request.cores > 0 and p.core_percent < request.cores:
            continue
        return p
    return None


@dataclass(slots=True, frozen=True)
class DrsAssignment:
    """What one container got: its card and profile (the input of the DRS annotations)."""
    container: str
    index: str
    minor: str
    profile: DrsProfile


def drs_annotations(pod_devices: PodDevices, assignments: list[DrsAssignment | None], *, now_ns: int) -> dict[str, str]:
    """Upstream's DRS pod annotations (hami-protocol.md §4.3) for one decision: ``assignments``
    is aligned with the containers (None for one without a partition)."""
    if not any(pod_devices):
        return {}
    out = {DRS_ALLOCATED: encode_pod_devices(pod_devices), ASSIGNED: "false", ASSIGNED_TIME: str(now_ns)}
    assigned: dict[str, dict] = {}
    for a in assignments:
        if a is None:
            continue
        slices = a.profile.size if a.profile.size > 0 else 1
        info = {"allocated": False, "request": slices}
        if a.profile.id:
            info["profileID"] = a.profile.id
        if a.profile.name:
            info["profileName"] = a.profile.name
        assigned[a.container] = info
        if ASSIGNED_INDEX not in out and a.index:
            out[ASSIGNED_INDEX] = out[ASSIGNED_ID] = a.index
        if ASSIGNED_MINOR not in out and a.minor:
            out[ASSIGNED_MINOR] = a.minor
        out.setdefault(REQUEST_SIZE, str(slices))
    if assigned:
        # Go marshals a map with sorted keys, each value in its struct's field order.
        out[ASSIGNED_CONTAINERS] = orjson.dumps({k: assigned[k] for k in sorted(assigned)}).decode()
    return out


def _profiles_of(devices: list[DeviceInfo]) -> list[DrsProfile]:
    return collect_profiles([d for d in devices if d.type == DRS_KEY])


def _container_names(pod: dict) -> list[str]:
    spec = pod.get("spec") or {}
    return [str(c.get("name") or "") for part in ("initContainers", "containers") for c in spec.get(part) or []]


class DrsCharger(Charger):
    """One pod's DRS charge per node: the profile each DRS row gets there (upstream's
    ``selectProfileByRequest`` over the node's cards), as (profile MiB, core percent, slices);
    ModeNotFit when the node has no profile for it. Per node and container, computed once."""

    __slots__ = ("cache", "requests", "row_container", "names", "_profiles", "_chosen")

    def __init__(self, cache, requests: dict[int, DrsRequest], row_container: list[int], names: list[str]):
        self.cache = cache
        self.requests = requests            # container position -> its DRS request
        self.row_container = row_container
        self.names = names
        self._profiles: dict[int, list[DrsProfile]] = {}
        self._chosen: dict[tuple[int, int], DrsProfile | None] = {}

    def profile(self, node_index: int, container: int) -> DrsProfile | None:
        key = (node_index, container)
        if key not in self._chosen:
            profiles = self._profiles.get(node_index)
            if profiles is None:
                profiles = self._profiles[node_index] = _profiles_of(self.cache.devices_at(node_index))
            request = self.requests.get(container)
            p = None if request is None else select_profile(profiles, request)
            if p is not None and not (0 < p.size <= INT32_MAX and 0 < p.memory_gb <= INT32_MAX // 1024
                                      and 0 <= p.core_percent <= 100):
                p = None
            self._chosen[key] = p
        return self._chosen[key]

    def __call__(self, node_index: int, row: int):
        p = self.profile(node_index, self.row_container[row])
        if p is None:
            return R.MODE_NOT_FIT
        return p.memory_gb * 1024, p.core_percent, p.size

    def describe(self, node_index: int, position: int, container: int) -> dict | None:
        p = self.profile(node_index, container)
        devices = self.cache.devices_at(node_index)
        if p is None or not 0 <= position < len(devices):
            return None
        dev = devices[position]
        name = self.names[container] if container < len(self.names) else f"container-{container}"
        return {"container": name, "profileName": p.name, "profileID": p.id, "drsSlice": p.size,
                "minor": str(dev.custom.get("minor") or ""), "index": str(dev.custom.get("index") or "")}


def _assigned_slices(annotations: dict[str, str]) -> list[tuple[int, int]]:
    """(profile MiB, slices) of each ``assigned-containers`` entry that names them (profile MiB
    0 when its profile name does not parse)."""
    text = annotations.get(ASSIGNED_CONTAINERS)
    if not text:
        return []
    try:
        assigned = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    out = []
    if type(assigned) is dict:
        for info in assigned.values():
            if type(info) is not dict:
                continue
            request = info.get("request")
            size, mem = parse_profile(str(info.get("profileName") or ""))
            if type(request) is not int or request <= 0:
                request = size
            if request > 0:
                out.append((mem * 1024, min(request, INT32_MAX)))
    return out


def slices_of(pod_devices: PodDevices, annotations: dict[str, str]) -> PodDevices:
    """The allocation with each device's slices, as upstream's annotations let them be read
    back: the allocation's own fifth field when it names more than 1 (HAMi #2877 writes it, and
    so do we), else the ``assigned-containers`` entry (keyed by container name, which the
    allocation does not carry) whose profile has the device's memory (the largest such request
    when several do), else ``enflame.com/gcu-request-size``, else 1 (upstream's floor)."""
    assigned = _assigned_slices(annotations)
    fallback = parse_go_int((annotations.get(REQUEST_SIZE) or "").strip(), 1, INT32_MAX)
    if fallback is None:
        fallback = max((s for _, s in assigned), default=1) if len(assigned) == 1 else 1
    for container in pod_devices:
        for dev in container:
            if dev.slots > 1:
                continue       # the allocation says it
            matching = [s for mem, s in assigned if mem == dev.usedmem]
            dev.slots = max(matching) if matching else fallback
    return pod_devices


class EnflameDRSVendor(DeviceVendor):
    """DRS partitions: inventory, requests, webhook, the per-node charge and upstream's annotations."""

    vendor_key = DRS_KEY
    register_annotation = DRS_CAPACITY
    allocated_annotation = DRS_ALLOCATED
    uses_node_lock = False
    # The charger says what a partition costs here; its slices are checked before its memory
    # (HAMi #2877: a card too full for the partition is CardTimeSlicingExhausted).
    kernel_flags = FLAG_CHARGE | FLAG_SLOTS_FIRST

    def __init__(self, config: EnflameConfig):
        self.count_resource, self.memory_resource, self.core_resource = config.drs_names()
        self.count_resource_name = self.count_resource

    def resource_names(self) -> list[str]:
        return [self.count_resource, self.memory_resource, self.core_resource]

    def request_resource_names(self) -> frozenset[str]:
        """A partition is asked by slices, or by memory or cores alone (:meth:`parse_request`)."""
        return frozenset(n for n in (self.count_resource, self.memory_resource, self.core_resource) if n)

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        text = node.annotations.get(DRS_CAPACITY)
        if text is None:
            return []
        return decode_drs_capacity(text, node.name)

    def parse_request(self, container: dict) -> DrsRequest | None:
        """The container's DRS request, or None; RequestError for a malformed value."""
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        raw = lookup(limits, requests, self.count_resource)
        if raw is not MISSING:
            slices = whole_number(name, self.count_resource, raw, low=0, high=INT32_MAX, unit="slices")
            if slices > 0:
                return DrsRequest(direct=True, slices=slices)
        memory = lookup(limits, requests, self.memory_resource)
        cores = lookup(limits, requests, self.core_resource)
        if memory is MISSING and cores is MISSING:
            return None
        mem = 0 if memory is MISSING else rounded_quantity(name, self.memory_resource, memory)
        core = 0 if cores is MISSING else rounded_quantity(name, self.core_resource, cores)
        # Cores are a percentage of a card: above 100 is refused, not clamped (HAMi after v2.10).
        for resource, raw_value, value, high in ((self.memory_resource, memory, mem, INT32_MAX),
                                                 (self.core_resource, cores, core, 100)):
            if not 0 <= value <= high:
                raise request_error(name, resource, raw_value, f"is out of range: must be between 0 and {high}")
        return DrsRequest(direct=False, memory=mem, cores=core)

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """One partition (upstream's row: slices direct with mempct 0, or memory/cores by spec with
        mempct -1). The kernel charges what the charger says, not these numbers."""
        request = self.parse_request(container)
        if request is None:
            return None
        if request.direct:
            return ContainerRequest(DRS_KEY, 1, request.slices, 0, 0)
        return ContainerRequest(DRS_KEY, 1, request.memory, -1, request.cores)

    def device_selector(self, pod_annotations, node_annotations):
        """``enflame.com/use-gpuuuid`` / ``nouse-gpuuuid`` (upstream's CheckUUID, after the profile)."""
        return uuid_selector(pod_annotations, (DRS_USE_UUID,), (DRS_NOUSE_UUID,))

    def charger(self, cache, pod: dict, row_container: list[int]) -> DrsCharger:
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        requests = {}
        for position in set(row_container):
            if 0 <= position < len(containers):
                request = self.parse_request(containers[position])
                if request is not None:
                    requests[position] = request
        return DrsCharger(cache, requests, row_container, _container_names(pod))

    def admission(self, container: dict) -> bool:
        """Upstream's DRS webhook: validate and mirror each present value into limits and
        requests. True when the container asks for DRS partitions."""
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        raw = lookup(limits, requests, self.count_resource)
        memory = lookup(limits, requests, self.memory_resource)
        cores = lookup(limits, requests, self.core_resource)
        if raw is MISSING and memory is MISSING and cores is MISSING:
            return False      # not a DRS container: left exactly as it came (no empty lists added)
        resources = container.get("resources")
        if not isinstance(resources, dict):
            resources = container["resources"] = {}
        for part in ("limits", "requests"):
            if not isinstance(resources.get(part), dict):
                resources[part] = {}
        limits, requests = resources["limits"], resources["requests"]
        if raw is not MISSING:
            if rounded_quantity(name, self.count_resource, raw) <= 0:
                raise request_error(name, self.count_resource, raw, "must be greater than 0")
            limits.setdefault(self.count_resource, raw)
            requests.setdefault(self.count_resource, raw)
            return True
        if memory is not MISSING and rounded_quantity(name, self.memory_resource, memory) <= 0:
            raise request_error(name, self.memory_resource, memory, "must be greater than 0")
        if cores is not MISSING and not 0 < rounded_quantity(name, self.core_resource, cores) <= 100:
            raise request_error(name, self.core_resource, cores, "must be in range (0,100]")
        for resource, value in ((self.memory_resource, memory), (self.core_resource, cores)):
            if value is not MISSING:
                limits.setdefault(resource, value)
                requests.setdefault(resource, value)
        return True

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        if not self.admission(container):
            return False
        self.parse_request(container)     # a value the scheduler could not read refuses the pod now
        return True

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions=(), now: float = 0.0,
                          pod_annotations=None):
        if not any(pod_devices):
            return {}
        assignments = []
        for position, container in enumerate(pod_devices):
            info = container[0].custom if container else None
            if not container:
                assignments.append(None)
                continue
            if not info:
                raise ValueError(f"Enflame DRS device {container[0].uuid} of container {position} carries no "
                                 "profile: only a decision's allocation can be encoded")
            profile = DrsProfile(info["profileName"], info["profileID"], info["drsSlice"], 0, 0)
            assignments.append(DrsAssignment(info["container"], info["index"], info["minor"], profile))
        return drs_annotations(pod_devices, assignments, now_ns=int(now * 1e9))

    def decision_annotations(self) -> tuple[str, ...]:
        return (DRS_ALLOCATED, ASSIGNED, ASSIGNED_TIME, ASSIGNED_INDEX, ASSIGNED_ID, ASSIGNED_MINOR,
                REQUEST_SIZE, ASSIGNED_CONTAINERS)

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(DRS_ALLOCATED)
        if text is None:
            return None
        return slices_of(decode_pod_devices(text), annotations)


def build_family(config: DeviceConfig, switches) -> list:
    enflame = EnflameConfig.from_section(config.section(CONFIG_SECTION.name))
    return [GCUVendor(enflame), EnflameDRSVendor(enflame)]

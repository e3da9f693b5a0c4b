"""The generic-template family: a count, a memory and a core resource, shared devices.

Most of upstream's families (Cambricon, Hygon, Iluvatar, Ascend, Kunlun vXPU, and the next
ones) differ from each other only in names, units and defaults: where the inventory comes from,
how many MiB one unit of the memory resource is, what cores a container gets when it names
none, and which annotations pick devices. :class:`TemplateVendor` is that shape, driven by a
:class:`TemplateSpec`; a family module subclasses it and overrides the hook that makes it
different (the inventory, the webhook, the chooser).

Requests follow upstream's reading order (limits, then requests) and units, with the one
deliberate difference NVIDIA has too: a value that is present but malformed raises
:class:`RequestError` naming the container, the resource and the value, instead of silently
turning the container into one without a device request (upstream drops it, and the pod is bound
without devices, to fail later on the node).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import orjson

from hami_py.config import Section
from hami_py.devices.base import (
    ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceSelector, DeviceVendor, NoDevicesRegistered, PodDevices,
    RequestError,
)
from hami_py.devices.codec import decode_json_devices, decode_legacy_devices, decode_pod_devices, encode_pod_devices, go_quote
from hami_py.devices.gates import uuid_selector
from hami_py.quantity import INT32_MAX, parse_exact_int, parse_quantity_ceil

MISSING = object()


@dataclass(slots=True, frozen=True)
class TemplateSpec:
    """Names, units and defaults of one generic-template family."""
    vendor_key: str
    count_resource: str
    memory_resource: str = ""
    core_resource: str = ""
    memory_unit: int = 1              # MiB per unit of the memory resource (×256 for MLU)
    default_cores: int = 0
    register_annotation: str | None = None
    register_format: str = "json"     # "json" or "legacy" (the colon format)
    handshake_annotation: str | None = None
    to_allocate_annotation: str | None = None
    allocated_annotation: str = ""
    use_uuid: tuple[str, ...] = ()     # pod annotations admitting device ids
    nouse_uuid: tuple[str, ...] = ()   # pod annotations refusing device ids
    use_type: str | None = None
    nouse_type: str | None = None
    quota: bool = False                # upstream checks namespace quota for this family


def quote_value(raw: object) -> str:
    """A resource value as written in the pod (JSON numbers and null appear as JSON does)."""
    if type(raw) is str:
        return go_quote(raw)
    if raw is None or type(raw) in (int, float, bool):
        return go_quote(orjson.dumps(raw).decode())
    return go_quote(repr(raw))


def resource_lists(container: dict) -> tuple[dict, dict]:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        return {}, {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return (limits if isinstance(limits, dict) else {}), (requests if isinstance(requests, dict) else {})


def lookup(limits: dict, requests: dict, resource: str) -> object:
    """The value in limits, else in requests, else MISSING (upstream's reading order)."""
    if not resource:
        return MISSING
    if resource in limits:
        return limits[resource]
    if resource in requests:
        return requests[resource]
    return MISSING


def request_error(container: str, resource: str, raw: object, problem: str) -> RequestError:
    return RequestError(f"container {go_quote(container)}: {resource} {quote_value(raw)} {problem}")


def whole_number(container: str, resource: str, raw: object, *, low: int, high: int, unit: str = "") -> int:
    """An exact integer in [low, high], or RequestError naming the container and the value."""
    number = parse_exact_int(raw)
    what = f"a whole number of {unit}" if unit else "a whole number"
    if number is None:
        raise request_error(container, resource, raw, f"is not {what}")
    if not low <= number <= high:
        raise request_error(container, resource, raw, f"is out of range: must be between {low} and {high}"
                            + (f" {unit}" if unit else ""))
    return number


# -- HAMi after v2.10's fail-closed request checks (#2740, #2784, #2994, #2789) ------------------
# An invalid request is refused with upstream's reason, never read as no request or a clamped one.

_PLAIN_VALUE = re.compile(r"[0-9A-Za-z.+-]{1,64}", re.ASCII)


def shown_value(raw: object) -> str:
    """A resource value as upstream's messages print a quantity (``1Ei``, ``-1``); anything that is
    not one plain token is quoted, so the message stays one unambiguous line."""
    if type(raw) is str and _PLAIN_VALUE.fullmatch(raw):
        return raw
    if type(raw) in (int, float):
        return orjson.dumps(raw).decode()
    return quote_value(raw)


def invalid_request(container: str, resource: str, reason: str) -> RequestError:
    return RequestError(f"invalid {resource} request in container {container}: {reason}")


def device_count(container: str, resource: str, raw: object) -> int:
    """A device count: a whole number in 0..MaxInt32 (0: the container asks for none of them)."""
    count = parse_exact_int(raw)
    if count is None:
        raise invalid_request(container, resource, f"device count {shown_value(raw)} is not a plain integer")
    if not 0 <= count <= INT32_MAX:
        raise invalid_request(container, resource, f"device count {shown_value(raw)} is out of range")
    return count


def integer_between(container: str, resource: str, raw: object, low: int, high: int) -> int:
    """An exact integer in [low, high] (a percentage: 0..100), refused in upstream's words."""
    value = parse_exact_int(raw)
    if value is None or not low <= value <= high:
        raise RequestError(f"invalid {resource} value {shown_value(raw)} in container {container}: "
                           f"must be an integer between {low} and {high}")
    return value


def percentage(container: str, resource: str, raw: object) -> int:
    return integer_between(container, resource, raw, 0, 100)


def cores_per_device(container: str, resource: str, raw: object, nums: int, *, always_divide: bool) -> int:
    """A core percentage written as the container's total over its ``nums`` devices (the webhook
    writes ``count x 100`` or ``count x 16``): divided evenly per device when ``nums`` > 1
    (``always_divide``), or only when the total is above 100; each device's part is 0..100."""
    total = integer_between(container, resource, raw, 0, INT32_MAX)
    if nums > 1 and (always_divide or total > 100):
        if total % nums:
            raise RequestError(f"invalid {resource} value {shown_value(raw)} in container {container}: "
                               f"{total} does not divide evenly across {nums} devices")
        total //= nums
    if total > 100:
        raise RequestError(f"invalid {resource} value {shown_value(raw)} in container {container}: "
                           f"{total} a device, must be an integer between 0 and 100")
    return total


def rounded_quantity(container: str, resource: str, raw: object) -> int:
    """The value rounded up, as admission reads it (Kubernetes' ``Quantity.Value()``)."""
    value = parse_quantity_ceil(raw)
    if value is None:
        raise request_error(container, resource, raw, "is not a quantity")
    return value


def ensure_limits(container: dict) -> dict:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        resources = container["resources"] = {}
    if not isinstance(resources.get("limits"), dict):
        resources["limits"] = {}
    return resources["limits"]


def append_env(container: dict, name: str, value: str) -> None:
    """Append, as upstream does: an existing variable of that name is not replaced. Idempotent
    (HAMi #2936): when the last variable of that name already holds ``value`` as a literal, the
    webhook is seeing its own work again (``reinvocationPolicy: IfNeeded``) and adds nothing."""
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    last = next((var for var in reversed(env) if isinstance(var, dict) and var.get("name") == name), None)
    if last is not None and "valueFrom" not in last and (last.get("value") or "") == value:
        return
    env.append({"name": name, "value": value})


class TemplateVendor(DeviceVendor):
    """A family of shared devices following upstream's generic template fit."""

    def __init__(self, spec: TemplateSpec):
        self.spec = spec
        self.vendor_key = spec.vendor_key
        self.register_annotation = spec.register_annotation
        self.handshake_annotation = spec.handshake_annotation
        self.to_allocate_annotation = spec.to_allocate_annotation
        self.allocated_annotation = spec.allocated_annotation
        self.count_resource_name = spec.count_resource
        self._max_memory = INT32_MAX // max(spec.memory_unit, 1)

    # -- resources -------------------------------------------------------------------------

    def resource_names(self) -> list[str]:
        spec = self.spec
        return [n for n in (spec.count_resource, spec.memory_resource, spec.core_resource) if n]

    def request_resources(self) -> tuple[str, str, str, int]:
        spec = self.spec
        return spec.count_resource, spec.memory_resource, spec.core_resource, max(spec.memory_unit, 1)

    def request_resource_names(self) -> frozenset[str]:
        """The spec's three names: the count gates every request (no count, no request and no
        error), and the families built on this read their memory and cores from the spec too."""
        spec = self.spec
        return frozenset(n for n in (spec.count_resource, spec.memory_resource, spec.core_resource) if n)

    def quota_resources(self) -> tuple[str, str, int]:
        spec = self.spec
        if not spec.quota:
            return "", "", 1
        return spec.memory_resource, spec.core_resource, max(spec.memory_unit, 1)

    # -- inventory -------------------------------------------------------------------------

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        """The registration annotation, decoded; devices of other families' kinds are kept as
        registered (the plugin of this family wrote them)."""
        text = node.annotations.get(self.spec.register_annotation) if self.spec.register_annotation else None
        if text is None:
            return []
        if self.spec.register_format == "legacy":
            devices = decode_legacy_devices(text)
        else:
            devices = decode_json_devices(text)
        if not devices:
            raise NoDevicesRegistered("the registration lists no device")
        return devices

    # -- requests --------------------------------------------------------------------------

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        spec = self.spec
        limits, requests = resource_lists(container)
        raw = lookup(limits, requests, spec.count_resource)
        if raw is MISSING:
            return None
        name = str(container.get("name") or "")
        nums = device_count(name, spec.count_resource, raw)
        if nums == 0:
            return None
        memreq = self.request_memory(name, limits, requests)
        cores = self.request_cores(name, limits, requests, nums)
        return self.finish_request(ContainerRequest(spec.vendor_key, nums, memreq, 100 if memreq == 0 else 0, cores),
                                   pod_annotations=pod_annotations)

    def request_memory(self, container: str, limits: dict, requests: dict) -> int:
        """The memory asked for, in MiB (0 when not asked: the whole device, ``mempct`` 100)."""
        spec = self.spec
        raw = lookup(limits, requests, spec.memory_resource)
        if raw is MISSING:
            return 0
        unit = "MiB" if spec.memory_unit == 1 else f"units of {spec.memory_unit} MiB"
        return whole_number(container, spec.memory_resource, raw, low=0, high=self._max_memory,
                            unit=unit) * spec.memory_unit

    def request_cores(self, container: str, limits: dict, requests: dict, nums: int) -> int:
        """Each device's cores, a percentage (0..100: never clamped) of ``nums`` devices."""
        spec = self.spec
        raw = lookup(limits, requests, spec.core_resource)
        if raw is MISSING:
            return spec.default_cores
        return percentage(container, spec.core_resource, raw)

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        """A family's last word on a parsed request (rounding, derived cores)."""
        return request

    # -- admission -------------------------------------------------------------------------

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook for these families only recognises the count in limits."""
        limits, _ = resource_lists(container)
        return self.spec.count_resource in limits

    # -- fit -------------------------------------------------------------------------------

    def device_selector(self, pod_annotations: dict[str, str], node_annotations: dict[str, str]) -> DeviceSelector | None:
        spec = self.spec
        return uuid_selector(pod_annotations, spec.use_uuid, spec.nouse_uuid,
                             use_type=spec.use_type, nouse_type=spec.nouse_type)

    # -- allocation annotations ------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: dict[str, str] | None = None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        out = {self.spec.allocated_annotation: text}
        if self.spec.to_allocate_annotation:
            out[self.spec.to_allocate_annotation] = text
        return out

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(self.spec.allocated_annotation)
        if text is None:
            return None
        return decode_pod_devices(text)


# A capacity beyond this is a garbled one, not a machine, and is refused rather than synthesised
# (10^15 would make the cache build that many devices).
MAX_CAPACITY_CARDS = 1024


class CapacityCards:
    """For families whose plugins register nothing but advertise whole cards as node capacity
    (Enflame GCU, Kunlun XPU): the inventory is decoded again only when that capacity changes,
    and a capacity that is not a whole number of cards is refused with the resource and value."""

    def registration_inputs(self, node) -> object:
        return (node.capacity.get(self.spec.count_resource),) if self.spec.count_resource else (None,)

    def registration_source(self) -> str:
        return f"{self.spec.count_resource} capacity"

    def capacity_cards(self, node) -> int:
        """How many cards the node's capacity advertises (0 when it advertises none)."""
        resource = self.spec.count_resource
        if not resource or resource not in node.capacity:
            return 0
        raw = node.capacity[resource]
        cards = parse_exact_int(raw)
        if cards is None:
            raise DeviceDecodeError(f"{resource} {raw!r} is not a whole number of cards")
        if not 0 <= cards <= MAX_CAPACITY_CARDS:
            raise DeviceDecodeError(f"{resource} {raw!r} is out of range: must be between 0 and {MAX_CAPACITY_CARDS}")
        return cards


class SlotsOnly:
    """For families whose devices are shared by slots alone (Biren, Vastai): whatever the plugin
    registers, a device has 100 cores, and a request takes a slot and nothing else (memory
    resolves to 0 MiB, as upstream's ``Usedmem`` stays 0; no cores)."""

    def parse_node_devices(self, node) -> list[DeviceInfo]:
        devices = super().parse_node_devices(node)
        for device in devices:
            device.devcore = 100
        return devices

    def finish_request(self, request: ContainerRequest, *, pod_annotations: dict[str, str]) -> ContainerRequest:
        request.memreq, request.mempct, request.coresreq = 0, 0, 0
        return request


@dataclass(slots=True, frozen=True)
class CountOnlyConfig:
    """The config section of a family asked for by a count alone (Biren's, Vastai's: upstream's
    ``BirenConfig``/``VastaiConfig`` with ``resourceCountName`` only)."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName",)   # the section's keys, for its ConfigSection
    resource_count_name: str = ""

    @classmethod
    def from_section(cls, section: Section) -> "CountOnlyConfig":
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))


@dataclass(slots=True, frozen=True)
class ResourceNamesConfig:
    """The config section of a family asked for by count, memory and cores (Cambricon's,
    Mthreads', AMD's: ``resourceCountName``, ``resourceMemoryName``, ``resourceCoreName``). A
    missing key is Go's zero value (""); a number or boolean where a name belongs is refused."""
    KEYS: ClassVar[tuple[str, ...]] = ("resourceCountName", "resourceMemoryName", "resourceCoreName")
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""

    @classmethod
    def from_section(cls, section: Section) -> "ResourceNamesConfig":
        return cls(*(section.str(key, only_strings=True) for key in cls.KEYS))

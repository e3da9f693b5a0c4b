"""Hygon DCUs, shared through HAMi's DCU device plugin.

The plugin registers its cards in ``hami.io/node-dcu-register`` in the legacy colon format
(``<id>,<count>,<devmem>,<devcore>,<type>,<numa>,<health>[,<index>,<mode>]:`` per card) and keeps
the handshake ``hami.io/node-handshake-dcu``; the kubelet's allocatable ``hygon.com/dcunum`` is the
liveness fallback. A container asks with ``hygon.com/dcunum`` (count), ``hygon.com/dcumem`` (MiB,
times the config's ``memoryFactor`` when above 1) and ``hygon.com/dcucores`` (percent, default
100: a card is exclusive unless the container names its cores). Pods pick cards by model with
``hygon.com/use-dcutype`` / ``hygon.com/nouse-dcutype`` (case-insensitive substrings) and by id
with ``hygon.com/use-gpuuuid`` / ``hygon.com/nouse-gpuuuid``. No quota is checked (upstream's fit
does not), and the fit is the generic template's.

Deliberate difference from upstream v2.10 (docs/devices/hygon.md): a malformed or out-of-range
value (count, memory, memory after the factor, cores above 100) refuses the pod with a
RequestError naming the container, the resource and the value; upstream v2.10 drops the
container's request, or, for a memory value that is not a whole number, silently treats it as 0
(the whole card). HAMi after v2.10 refuses them too, and its webhook checks the values (#3012).
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.template import (
    MISSING, TemplateSpec, TemplateVendor, integer_between, lookup, resource_lists, whole_number,
)
from hami_py.quantity import INT32_MAX

VENDOR_KEY = "DCU"
SECTION = "hygon"
CONFIG_SECTION = ConfigSection(SECTION, ("resourceCountName", "resourceMemoryName", "resourceCoreName", "memoryFactor"))

REGISTER_ANNOTATION = "hami.io/node-dcu-register"
HANDSHAKE_ANNOTATION = "hami.io/node-handshake-dcu"
TO_ALLOCATE_ANNOTATION = "hami.io/dcu-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/dcu-devices-allocated"
USE_TYPE_ANNOTATION = "hygon.com/use-dcutype"
NOUSE_TYPE_ANNOTATION = "hygon.com/nouse-dcutype"
USE_UUID_ANNOTATION = "hygon.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "hygon.com/nouse-gpuuuid"


@dataclass(slots=True, frozen=True)
class HygonConfig:
    """The ``hygon`` section; a missing key is Go's zero value, as upstream."""
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""
    memory_factor: int = 0           # int32; <= 1 means 1

    @classmethod
    def from_section(cls, section: Section) -> HygonConfig:
        """Names only as strings (a number or boolean is refused); the factor as an int32."""
        return cls(resource_count_name=section.str("resourceCountName", only_strings=True),
                   resource_memory_name=section.str("resourceMemoryName", only_strings=True),
                   resource_core_name=section.str("resourceCoreName", only_strings=True),
                   memory_factor=section.int32("memoryFactor"))


class HygonVendor(TemplateVendor):
    """Upstream's ``DCU`` vendor: legacy registration, type and UUID gates, no quota."""

    def __init__(self, config: HygonConfig):
        self.config = config
        self.memory_factor = max(config.memory_factor, 1)
        super().__init__(TemplateSpec(
            vendor_key=VENDOR_KEY,
            count_resource=config.resource_count_name,
            memory_resource=config.resource_memory_name,
            core_resource=config.resource_core_name,
            memory_unit=self.memory_factor,
            default_cores=100,
            register_annotation=REGISTER_ANNOTATION,
            register_format="legacy",
            handshake_annotation=HANDSHAKE_ANNOTATION,
            to_allocate_annotation=TO_ALLOCATE_ANNOTATION,
            allocated_annotation=ALLOCATED_ANNOTATION,
            use_uuid=(USE_UUID_ANNOTATION,),
            nouse_uuid=(NOUSE_UUID_ANNOTATION,),
            use_type=USE_TYPE_ANNOTATION,
            nouse_type=NOUSE_TYPE_ANNOTATION,
        ))

    def config_problems(self) -> list[str]:
        factor = self.config.memory_factor
        return [f"{SECTION}: memoryFactor must not be negative, got {factor}"] if factor < 0 else []

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook (HAMi after v2.10, #3012): the count and memory, in limits and in
        requests, integers in 0..MaxInt32, the cores in 0..100; the count in limits makes the
        container this family's (nothing is mutated)."""
        spec = self.spec
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        for resource, high in ((spec.count_resource, INT32_MAX), (spec.memory_resource, INT32_MAX),
                               (spec.core_resource, 100)):
            for values in (limits, requests):
                if resource and resource in values:
                    integer_between(name, resource, values[resource], 0, high)
        return super().mutate_admission(container, pod)

    def request_memory(self, container: str, limits: dict, requests: dict) -> int:
        """MiB, times ``memoryFactor``: the value must be a whole number whose product still fits int32."""
        spec = self.spec
        raw = lookup(limits, requests, spec.memory_resource)
        if raw is MISSING:
            return 0
        unit = "MiB" if self.memory_factor == 1 else f"units of {self.memory_factor} MiB (memoryFactor)"
        return whole_number(container, spec.memory_resource, raw, low=0, high=INT32_MAX // self.memory_factor,
                            unit=unit) * self.memory_factor


def build_family(config: DeviceConfig, switches) -> list[HygonVendor]:
    """Always built, as upstream always initialises it (without a section, with empty names,
    so it matches no container)."""
    return [HygonVendor(HygonConfig.from_section(config.section(SECTION)))]

"""Hygon accelerators, under both names their device plugins have had: HCU (HAMi after v2.10)
and DCU (HAMi v2.10), one vendor each, served side by side.

HAMi renamed the family (#2969) without aliases: resources ``hygon.com/hcunum|hcumem|hcucores``,
node annotations ``hami.io/node-hcu-register`` / ``hami.io/node-handshake-hcu``, decisions in
``hami.io/hcu-devices-to-allocate|-allocated``, type ``HCU``, gates ``hygon.com/use-hcutype`` /
``nouse-hcutype``. A cluster upgrading its plugins node by node runs both generations at once, and
each plugin reads only its own annotations and serves only its own resource: the kubelet calls a
plugin's Allocate only for a container asking the resource that plugin advertises. So each
generation is its own vendor here (:data:`HCU`, :data:`DCU`): a pod is placed on the cards of the
generation its resources name, and its decision is written under that generation's annotations,
which are the annotations the node's plugin reads. A pod asking ``hygon.com/dcunum`` is never
placed on an HCU-only node (nor the reverse): its container would start without a card and the
node lock its bind takes would wait for an Allocate that never comes.

The plugins register cards in the legacy colon format (``<id>,<count>,<devmem>,<devcore>,<type>,
<numa>,<health>[,<index>,<mode>]:`` per card); the kubelet's allocatable count is the liveness
fallback. A container asks with the count, the memory (MiB, times the config's ``memoryFactor``
when above 1) and the cores (percent, default 100: a card is exclusive unless the container names
its cores). No quota is checked (upstream's fit does not), and the fit is the generic template's.

A node carrying both registrations is read as HCU: the new plugin replaces the old one on a
node, and the old plugin leaves its registration behind when it is removed; reading both would
offer the same cards twice. The DCU vendor therefore ignores a node that has an HCU registration.

Names (the ``hygon`` section of the device config): the section's ``resourceCountName`` /
``resourceMemoryName`` / ``resourceCoreName`` are the HCU generation's, as upstream reads them
(the chart's defaults ``hygon.com/hcu*``). The DCU generation's names come from ``hygon.dcu``
(ours: a mapping of the same three keys; absent, v2.10's ``hygon.com/dcu*``; a key left out is
"", so ``dcu: {}`` serves no DCU resource; a section naming no count serves neither). A section
that names the DCU count itself without a ``dcu`` mapping is a v2.10 file: its names are the DCU
generation's, as v2.10 read them, and the HCU generation keeps its defaults, so neither
generation claims the other's resource. ``memoryFactor`` applies to both.

Deliberate difference from upstream v2.10 (docs/devices/hygon.md): a malformed or out-of-range
value (count, memory, memory after the factor, cores above 100) refuses the pod with a
RequestError naming the container, the resource and the value; upstream v2.10 drops the
container's request, or, for a memory value that is not a whole number, silently treats it as 0
(the whole card). HAMi after v2.10 refuses them too, and its webhook checks the values (#3012).
"""
from __future__ import annotations

from dataclasses import dataclass

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.base import DeviceInfo, NodeView
from hami_py.devices.template import (
    MISSING, TemplateSpec, TemplateVendor, lookup, resource_lists, whole_number,
)
from hami_py.devices.webhook_values import checked_integers
from hami_py.quantity import INT32_MAX

SECTION = "hygon"
LEGACY_KEY = "dcu"          # ours: the DCU generation's names inside the hygon section
NAME_KEYS = ("resourceCountName", "resourceMemoryName", "resourceCoreName")
CONFIG_SECTION = ConfigSection(SECTION, (*NAME_KEYS, "memoryFactor"))

# The UUID gates kept their names through the rename.
USE_UUID_ANNOTATION = "hygon.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION = "hygon.com/nouse-gpuuuid"


@dataclass(slots=True, frozen=True)
class Generation:
    """What one generation of Hygon's device plugin reads and writes, and its default names."""
    vendor_key: str
    register_annotation: str
    handshake_annotation: str
    to_allocate_annotation: str
    allocated_annotation: str
    use_type_annotation: str
    nouse_type_annotation: str
    default_names: tuple[str, str, str]      # count, memory, cores


HCU = Generation(
    vendor_key="HCU",
    register_annotation="hami.io/node-hcu-register",
    handshake_annotation="hami.io/node-handshake-hcu",
    to_allocate_annotation="hami.io/hcu-devices-to-allocate",
    allocated_annotation="hami.io/hcu-devices-allocated",
    use_type_annotation="hygon.com/use-hcutype",
    nouse_type_annotation="hygon.com/nouse-hcutype",
    default_names=("hygon.com/hcunum", "hygon.com/hcumem", "hygon.com/hcucores"),
)
DCU = Generation(
    vendor_key="DCU",
    register_annotation="hami.io/node-dcu-register",
    handshake_annotation="hami.io/node-handshake-dcu",
    to_allocate_annotation="hami.io/dcu-devices-to-allocate",
    allocated_annotation="hami.io/dcu-devices-allocated",
    use_type_annotation="hygon.com/use-dcutype",
    nouse_type_annotation="hygon.com/nouse-dcutype",
    default_names=("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"),
)


@dataclass(slots=True, frozen=True)
class HygonConfig:
    """The ``hygon`` section; a missing key is Go's zero value, as upstream. ``dcu_names`` is the
    ``dcu`` mapping's (count, memory, cores), None when the section has none."""
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""
    memory_factor: int = 0           # int32; <= 1 means 1
    dcu_names: tuple[str, str, str] | None = None

    @classmethod
    def from_section(cls, section: Section) -> HygonConfig:
        """Names only as strings (a number or boolean is refused); the factor as an int32."""
        legacy = None
        if section.get(LEGACY_KEY) is not None:
            inner = section.section(LEGACY_KEY)
            legacy = tuple(inner.str(key, only_strings=True) for key in NAME_KEYS)
        return cls(resource_count_name=section.str("resourceCountName", only_strings=True),
                   resource_memory_name=section.str("resourceMemoryName", only_strings=True),
                   resource_core_name=section.str("resourceCoreName", only_strings=True),
                   memory_factor=section.int32("memoryFactor"),
                   dcu_names=legacy)

    def generation_names(self) -> dict[str, tuple[str, str, str]]:
        """Each generation's (count, memory, cores) names, by vendor key (see the module's
        docstring: the section's names are HCU's unless they are a v2.10 file's DCU names)."""
        section = (self.resource_count_name, self.resource_memory_name, self.resource_core_name)
        if self.dcu_names is not None:
            return {HCU.vendor_key: section, DCU.vendor_key: self.dcu_names}
        if not self.resource_count_name:
            # No Hygon count named (no section, as upstream's "not configured"): neither is served.
            return {HCU.vendor_key: section, DCU.vendor_key: ("", "", "")}
        if self.resource_count_name == DCU.default_names[0]:
            return {HCU.vendor_key: HCU.default_names, DCU.vendor_key: section}
        return {HCU.vendor_key: section, DCU.vendor_key: DCU.default_names}


class HygonVendor(TemplateVendor):
    """One generation of upstream's Hygon vendor: legacy registration, type and UUID gates, no quota.

    ``superseded_by`` is a node registration that, when present, makes this vendor read the node
    as having none of its cards (the DCU vendor's, naming the HCU registration)."""

    def __init__(self, config: HygonConfig, generation: Generation = HCU, *, superseded_by: str | None = None):
        self.config = config
        self.generation = generation
        self.superseded_by = superseded_by
        self.memory_factor = max(config.memory_factor, 1)
        count, memory, cores = config.generation_names()[generation.vendor_key]
        super().__init__(TemplateSpec(
            vendor_key=generation.vendor_key,
            count_resource=count,
            memory_resource=memory,
            core_resource=cores,
            memory_unit=self.memory_factor,
            default_cores=100,
            register_annotation=generation.register_annotation,
            register_format="legacy",
            handshake_annotation=generation.handshake_annotation,
            to_allocate_annotation=generation.to_allocate_annotation,
            allocated_annotation=generation.allocated_annotation,
            use_uuid=(USE_UUID_ANNOTATION,),
            nouse_uuid=(NOUSE_UUID_ANNOTATION,),
            use_type=generation.use_type_annotation,
            nouse_type=generation.nouse_type_annotation,
        ))

    def config_problems(self) -> list[str]:
        # Both generations share the factor: the HCU vendor alone reports it.
        factor = self.config.memory_factor
        if self.generation is HCU and factor < 0:
            return [f"{SECTION}: memoryFactor must not be negative, got {factor}"]
        return []

    # -- inventory -------------------------------------------------------------------------

    def registration_inputs(self, node: NodeView) -> object:
        """The superseding registration counts too: its arrival or removal changes our cards."""
        own = super().registration_inputs(node)
        return own if self.superseded_by is None else (own, node.annotations.get(self.superseded_by))

    def parse_node_devices(self, node: NodeView) -> list[DeviceInfo]:
        if self.superseded_by is not None and self.superseded_by in node.annotations:
            return []
        return super().parse_node_devices(node)

    # -- requests and admission --------------------------------------------------------------

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook (HAMi after v2.10, #3012): the count and memory, in limits and in
        requests, integers in 0..MaxInt32, the cores in 0..100; the count in limits makes the
        container this family's (nothing is mutated)."""
        spec = self.spec
        limits, requests = resource_lists(container)
        name = str(container.get("name") or "")
        checked_integers(name, ((spec.count_resource, 0, INT32_MAX), (spec.memory_resource, 0, INT32_MAX),
                                (spec.core_resource, 0, 100)), limits, requests)
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
    """Both generations, always (as upstream always initialises its Hygon vendor: without a
    section, the HCU vendor has empty names and matches no container); HCU first, so its
    resources lead in ``managedResources``."""
    hygon = HygonConfig.from_section(config.section(SECTION))
    return [HygonVendor(hygon, HCU),
            HygonVendor(hygon, DCU, superseded_by=HCU.register_annotation)]

"""Iluvatar GPUs (MR-V100, MR-V50, BI-V150, BI-V100), shared through Iluvatar's vGPU plugin.

Only with ``--enable-iluvatar``; then one vendor per entry of the config's ``iluvatars`` list,
keyed by the entry's ``commonWord`` (``<cw>``). Each kind registers in ``hami.io/node-<cw>-register``
(legacy colon format) with the handshake ``hami.io/node-handshake-<cw>`` (allocatable fallback on
the kind's count resource). A container asks with ``iluvatar.ai/<cw>-vgpu`` (count),
``iluvatar.ai/<cw>.vMem`` (units of 256 MiB) and ``iluvatar.ai/<cw>.vCore`` (percent, default 0).
Pods pick cards with ``hami.io/use-<cw>-uuid`` / ``hami.io/no-use-<cw>-uuid``. No type gate, no
quota; the fit is the generic template's.

Webhook (upstream's): a container limiting the count gets ``<cw>.vCore = count x 100`` in its
limits when the count is above 1 (several whole cards), and the environment variable
``SOL_CONTINER_NAME=<container name>`` (upstream's spelling, which the runtime reads) unless it
already has one or has no name.

Deliberate differences (docs/devices/iluvatar.md): a malformed value refuses the pod with a
RequestError instead of dropping the request (count, memory) or silently using the default
(cores); the webhook refuses a count that is not a whole number instead of rounding it up. As in
HAMi after v2.10, cores above 100 for several cards are their total, which must divide evenly.
"""
from __future__ import annotations

from dataclasses import dataclass

import structlog

from hami_py.config import ConfigSection, DeviceConfig, Section
from hami_py.devices.template import (
    MISSING, TemplateSpec, TemplateVendor, append_env, cores_per_device, device_count, ensure_limits, lookup,
    resource_lists,
)

log = structlog.get_logger(__name__)

SECTION = "iluvatars"
CONFIG_SECTION = ConfigSection(SECTION, is_list=True)   # a list of chip entries: any entry counts
MEMORY_UNIT = 256                       # MiB per unit of the memory resource
CONTAINER_NAME_ENV = "SOL_CONTINER_NAME"  # sic: upstream's (and the runtime's) spelling


def register_annotation(common_word: str) -> str:
    return f"hami.io/node-{common_word}-register"


def handshake_annotation(common_word: str) -> str:
    return f"hami.io/node-handshake-{common_word}"


def to_allocate_annotation(common_word: str) -> str:
    return f"hami.io/{common_word}-devices-to-allocate"


def allocated_annotation(common_word: str) -> str:
    return f"hami.io/{common_word}-devices-allocated"


def use_uuid_annotation(common_word: str) -> str:
    return f"hami.io/use-{common_word}-uuid"


def nouse_uuid_annotation(common_word: str) -> str:
    return f"hami.io/no-use-{common_word}-uuid"


# yaml key -> attribute of one entry
_KEYS = (("commonWord", "common_word"), ("chipName", "chip_name"),
         ("resourceCountName", "resource_count_name"), ("resourceMemoryName", "resource_memory_name"),
         ("resourceCoreName", "resource_core_name"))


@dataclass(slots=True, frozen=True)
class IluvatarConfig:
    """One entry of the ``iluvatars`` list; a missing key is Go's zero value, as upstream."""
    common_word: str = ""
    chip_name: str = ""
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""


def parse_iluvatar_configs(section: Section, *, enabled: bool = True) -> list[IluvatarConfig]:
    """The ``iluvatars`` list. Wrong types are refused always (upstream decodes the whole file at
    start), and so are non-string names and null entries; when the kinds are ``enabled``, so are an
    entry without ``commonWord`` and two entries sharing one: the common word names every
    annotation of the kind."""
    entries: list[IluvatarConfig] = []
    seen: set[str] = set()
    for item in section.sections():
        if item.is_null:
            raise item.error("expected a mapping, got null")
        entry = IluvatarConfig(**{attribute: item.str(key, only_strings=True) for key, attribute in _KEYS})
        entries.append(entry)
        if not enabled:
            continue
        if not entry.common_word:
            raise item.error("must not be empty (it names the kind's annotations)", "commonWord")
        if entry.common_word in seen:
            raise item.error(f"{entry.common_word!r} is already used by an earlier entry", "commonWord")
        seen.add(entry.common_word)
    return entries


class IluvatarVendor(TemplateVendor):
    """One Iluvatar chip kind (vendor key = its common word)."""

    def __init__(self, config: IluvatarConfig):
        self.config = config
        cw = config.common_word
        super().__init__(TemplateSpec(
            vendor_key=cw,
            count_resource=config.resource_count_name,
            memory_resource=config.resource_memory_name,
            core_resource=config.resource_core_name,
            memory_unit=MEMORY_UNIT,
            default_cores=0,
            register_annotation=register_annotation(cw),
            register_format="legacy",
            handshake_annotation=handshake_annotation(cw),
            to_allocate_annotation=to_allocate_annotation(cw),
            allocated_annotation=allocated_annotation(cw),
            use_uuid=(use_uuid_annotation(cw),),
            nouse_uuid=(nouse_uuid_annotation(cw),),
        ))

    def request_cores(self, container: str, limits: dict, requests: dict, nums: int) -> int:
        """Percent of each card; above 100 with several cards, the container's total (the webhook
        writes ``count x 100``), divided evenly among them (HAMi after v2.10)."""
        raw = lookup(limits, requests, self.spec.core_resource)
        if raw is MISSING:
            return self.spec.default_cores
        return cores_per_device(container, self.spec.core_resource, raw, nums, always_divide=False)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        """Upstream's webhook: only a count in limits makes the container this kind's. A count
        above 1 gets ``count x 100`` cores (written over any core limit, as upstream); the
        container's name goes into ``SOL_CONTINER_NAME`` unless the variable is set already.

        Raises RequestError for a count that is not a whole number in 0..MaxInt32."""
        spec = self.spec
        limits, _ = resource_lists(container)
        if not spec.count_resource or spec.count_resource not in limits:
            return False
        name = str(container.get("name") or "")
        count = device_count(name, spec.count_resource, limits[spec.count_resource])
        if count > 1 and spec.core_resource:
            ensure_limits(container)[spec.core_resource] = str(count * 100)
        env = container.get("env")
        has_env = isinstance(env, list) and any(isinstance(var, dict) and var.get("name") == CONTAINER_NAME_ENV
                                                for var in env)
        if not has_env and name:
            append_env(container, CONTAINER_NAME_ENV, name)
        return True


def build_family(config: DeviceConfig, switches) -> list[IluvatarVendor]:
    """One vendor per ``iluvatars`` entry, only with ``--enable-iluvatar`` (the section is
    validated either way: upstream decodes the whole file at start)."""
    entries = parse_iluvatar_configs(config.section(SECTION), enabled=switches.enable_iluvatar)
    if not switches.enable_iluvatar:
        return []
    for entry in entries:
        log.info("iluvatar device kind loaded", common_word=entry.common_word, chip=entry.chip_name,
                 count_resource=entry.resource_count_name)
    return [IluvatarVendor(entry) for entry in entries]

"""The ``vnpus`` section of the device config: the default vNPU mode and one entry per chip kind.

Upstream decodes it with yaml.v2 into ``VNPUs{HamiVnpuMode, EnpuPolicy, HamiVnpuCore, Configs}``:
unknown keys (the chart's old ``topologyPairs``) are ignored, a missing key is the Go zero value
and a value of the wrong type is fatal. We keep those rules and refuse, with the key named, what
upstream would turn into a broken vendor: an empty or duplicated ``commonWord`` (it is the vendor
key and part of every annotation key), or one that cannot appear in an annotation key.

HAMi after v2.10 (#3110) names the default mode of nodes that do not say theirs:
``hamiVnpuMode`` is ``template``, ``hami-core`` (or ``hamiCore``) or ``enpu``, in any case and
padding; anything else stops the scheduler at start, Ascend enabled or not (upstream refuses it
while decoding the file). The boolean ``hamiVnpuCore`` it replaces still counts when
``hamiVnpuMode`` is empty. ``enpuPolicy`` is kept as written: an invalid one refuses ENPU pods
only (modes.py), as upstream does. ``vnpuDeviceSplitCount`` (#3203, the chart's hami-core slots
per NPU for the device plugin) must be a positive integer when present, as the chart requires.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from hami_py.config import ConfigSection, Section
from hami_py.devices.ascend.modes import VNPU_MODE_TEMPLATE, config_mode
from hami_py.devices.codec import go_quote

SECTION = "vnpus"
# {hamiVnpuCore, configs: [...]}: only chip kinds (configs) make the file a usable one.
CONFIG_SECTION = ConfigSection(SECTION, ("configs",))

# The name part of a qualified annotation key (``node-handshake-<cw>`` is the longest we build).
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LONGEST_PREFIX = "node-handshake-"


@dataclass(slots=True, frozen=True)
class VnpuTemplate:
    """One hard-split vNPU template (``vir05_1c_16g``): the memory it gives, in MiB."""
    name: str = ""
    memory: int = 0
    ai_core: int = 0
    ai_cpu: int = 0


@dataclass(slots=True)
class VnpuConfig:
    """One chip kind (``Ascend910B3``). Templates are sorted by memory, ascending."""
    common_word: str = ""
    chip_name: str = ""
    resource_name: str = ""
    resource_memory_name: str = ""
    resource_core_name: str = ""
    memory_allocatable: int = 0     # MiB a whole device gives a container
    memory_capacity: int = 0        # MiB of the device
    memory_factor: int = 0          # <= 1 means 1
    ai_core: int = 0
    ai_cpu: int = 0
    runtime_class_name: str = ""
    overwrite_env: bool = False
    super_pod: bool = False         # Ascend910C: NPUs are given in module pairs
    templates: list[VnpuTemplate] = field(default_factory=list)


# The chart's hami-core slots per NPU when vnpuDeviceSplitCount is not written (HAMi #3203).
DEFAULT_SPLIT_COUNT = 10


@dataclass(slots=True)
class VnpusConfig:
    # The mode of every node without its own capability annotations: template, hami-core or enpu.
    mode: str = VNPU_MODE_TEMPLATE
    enpu_policy: str = ""           # ENPU pods' policy when they name none (as written)
    hami_vnpu_core: bool = False    # deprecated: the mode when hamiVnpuMode is empty
    vnpu_device_split_count: int = DEFAULT_SPLIT_COUNT
    configs: list[VnpuConfig] = field(default_factory=list)


_STR_KEYS = {"commonWord": "common_word", "chipName": "chip_name", "resourceName": "resource_name",
             "resourceMemoryName": "resource_memory_name", "resourceCoreName": "resource_core_name",
             "runtimeClassName": "runtime_class_name"}
_INT64_KEYS = {"memoryAllocatable": "memory_allocatable", "memoryCapacity": "memory_capacity"}
_INT32_KEYS = {"memoryFactor": "memory_factor", "aiCore": "ai_core", "aiCPU": "ai_cpu"}
_BOOL_KEYS = {"overwriteEnv": "overwrite_env", "superPod": "super_pod"}


def _template(section: Section) -> VnpuTemplate:
    return VnpuTemplate(name=section.str("name"), memory=section.int64("memory"),
                        ai_core=section.int32("aiCore"), ai_cpu=section.int32("aiCPU"))


def _chip(section: Section) -> VnpuConfig:
    config = VnpuConfig()
    for key, attribute in _STR_KEYS.items():
        setattr(config, attribute, section.str(key))
    for key, attribute in _INT64_KEYS.items():
        setattr(config, attribute, section.int64(key))
    for key, attribute in _INT32_KEYS.items():
        setattr(config, attribute, section.int32(key))
    for key, attribute in _BOOL_KEYS.items():
        setattr(config, attribute, section.bool(key))
    templates = [_template(entry) for entry in section.sections("templates")]
    # Upstream sorts by memory at start-up; a stable sort keeps equal-memory templates in file order.
    config.templates = sorted(templates, key=lambda t: t.memory)
    _check_common_word(section, config.common_word)
    return config


def _check_common_word(section: Section, word: str) -> None:
    if not word:
        raise section.error("must not be empty (it names the device kind in every Ascend annotation)", "commonWord")
    name = _LONGEST_PREFIX + word
    if len(name) > 63 or not _NAME_RE.match(name):
        raise section.error(f'"{word}" cannot be part of an annotation key (hami.io/{name}): use letters, '
                            "digits, '-', '_' and '.', at most 48 characters", "commonWord")


def parse_vnpus(section: Section) -> VnpusConfig:
    """The typed ``vnpus`` section (absent: no chip kinds), read from ``config.section("vnpus")``.

    Raises ConfigError naming the key for a value of the wrong type or a unusable ``commonWord``.
    """
    entries = section.sections("configs")
    configs = [_chip(entry) for entry in entries]
    seen: dict[str, int] = {}
    for i, config in enumerate(configs):
        first = seen.setdefault(config.common_word, i)
        if first != i:
            raise entries[i].error(f'"{config.common_word}" is already the commonWord of {entries[first].name}',
                                   "commonWord")
    legacy = section.bool("hamiVnpuCore")
    written = section.str("hamiVnpuMode")
    mode = config_mode(written, legacy)
    if mode is None:
        # Upstream's words, after the key path every config error starts with.
        raise section.error(f"must be template, hami-core (or hamiCore), or enpu, got {go_quote(written)}",
                            "hamiVnpuMode")
    split = section.optional_int64("vnpuDeviceSplitCount")
    if split is not None and split <= 0:
        raise section.error(f"must be a positive integer (hami-core slots per NPU), got {split}",
                            "vnpuDeviceSplitCount")
    return VnpusConfig(mode=mode, enpu_policy=section.str("enpuPolicy"), hami_vnpu_core=legacy,
                       vnpu_device_split_count=DEFAULT_SPLIT_COUNT if split is None else split, configs=configs)


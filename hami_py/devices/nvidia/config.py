"""The ``nvidia`` section of the device config: the NVIDIA family's own config type.

Read with :class:`hami_py.config.Section`, so it follows yaml.v2's rules like every other
section. Field defaults are the values of a *missing* key (Go zero values), as upstream: a file
that leaves out ``defaultGPUNum`` gets 0, not the chart's 1. The device-plugin-only keys are
kept (``None`` when absent: they are pointers upstream) and the MIG profile allowlist is
validated here, because upstream refuses to start on a malformed one although only the device
plugin applies it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hami_py.config import ConfigSection, DeviceConfig, Section, kind_of

SECTION = "nvidia"
CONFIG_SECTION = ConfigSection(
    SECTION,
    keys=("resourceCountName", "resourceMemoryName", "resourceMemoryPercentageName", "resourceCoreName",
          "resourcePriorityName", "overwriteEnv", "defaultMemory", "defaultCores", "defaultGPUNum", "memoryFactor",
          "disableCoreLimit", "gpuCorePolicy", "runtimeClassName", "migProfileAllowlist"),
    # The NVIDIA device plugin's keys: pointers upstream, so present at all (zero included) they count.
    pointer_keys=("deviceSplitCount", "deviceMemoryScaling", "deviceCoreScaling", "preConfiguredDeviceMemory",
                  "libCudaLogLevel", "enableNumaTopology"))


@dataclass(slots=True)
class MigProfileAllowlistEntry:
    """GPU models (e.g. ``H200 NVL``) and the MIG profiles the device plugin may create on them."""
    models: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)


@dataclass(slots=True)
class NvidiaConfig:
    """The ``nvidia`` section; :func:`nvidia_config` reads it from a device config."""
    resource_count_name: str = ""
    resource_memory_name: str = ""
    resource_memory_percentage_name: str = ""
    resource_core_name: str = ""
    resource_priority_name: str = ""
    overwrite_env: bool = False
    default_memory: int = 0          # MiB; not multiplied by memory_factor
    default_cores: int = 0
    default_gpu_num: int = 0
    memory_factor: int = 0           # <= 1 means 1
    disable_core_limit: bool = False
    gpu_core_policy: str = ""        # "", "default", "force" or "disable"
    runtime_class_name: str = ""
    mig_profile_allowlist: list[MigProfileAllowlistEntry] = field(default_factory=list)
    # device-plugin-only keys
    device_split_count: int | None = None
    device_memory_scaling: float | None = None
    device_core_scaling: float | None = None
    pre_configured_device_memory: int | None = None
    lib_cuda_log_level: str | None = None
    enable_numa_topology: bool | None = None


def nvidia_config(config: DeviceConfig) -> NvidiaConfig:
    """The typed ``nvidia`` section of ``config`` (all zero values without one).

    Raises ConfigError naming the file, line and key for a value of the wrong type or a
    malformed MIG profile allowlist entry."""
    return read_nvidia(config.section(SECTION))


def read_nvidia(section: Section) -> NvidiaConfig:
    return NvidiaConfig(
        resource_count_name=section.str("resourceCountName"),
        resource_memory_name=section.str("resourceMemoryName"),
        resource_memory_percentage_name=section.str("resourceMemoryPercentageName"),
        resource_core_name=section.str("resourceCoreName"),
        resource_priority_name=section.str("resourcePriorityName"),
        overwrite_env=section.bool("overwriteEnv"),
        default_memory=section.int32("defaultMemory"),
        default_cores=section.int32("defaultCores"),
        default_gpu_num=section.int32("defaultGPUNum"),
        memory_factor=section.int32("memoryFactor"),
        disable_core_limit=section.bool("disableCoreLimit"),
        gpu_core_policy=section.str("gpuCorePolicy"),
        runtime_class_name=section.str("runtimeClassName"),
        mig_profile_allowlist=_read_allowlist(section),
        device_split_count=section.optional_uint("deviceSplitCount"),
        device_memory_scaling=section.optional_float("deviceMemoryScaling"),
        device_core_scaling=section.optional_float("deviceCoreScaling"),
        pre_configured_device_memory=section.optional_int64("preConfiguredDeviceMemory"),
        lib_cuda_log_level=section.optional_str("libCudaLogLevel"),
        enable_numa_topology=section.optional_bool("enableNumaTopology"),
    )


def _read_allowlist(section: Section) -> list[MigProfileAllowlistEntry]:
    key = "migProfileAllowlist"
    items = section.get(key)
    if items is not None and not isinstance(items, list):
        raise section.error(f"expected a list of {{models, profiles}} entries, got {kind_of(items)}", key)
    entries = []
    for i, item in enumerate(items or ()):
        if item is not None and not isinstance(item, dict):
            raise section.error(f"expected a mapping with models and profiles, got {kind_of(item)}", key, i)
        entry_section = section.section(key, i)
        entry = MigProfileAllowlistEntry(models=entry_section.str_list("models"),
                                         profiles=entry_section.str_list("profiles"))
        _validate_allowlist_entry(entry_section, entry)
        entries.append(entry)
    return entries


def _validate_allowlist_entry(section: Section, entry: MigProfileAllowlistEntry) -> None:
    """Upstream refuses to start unless every entry names models and well-formed profiles."""
    if not entry.models or not entry.profiles:
        raise section.error("MIG profile allowlist entry must define models and profiles")
    for i, profile in enumerate(entry.profiles):
        # "<n>g.<rest>": the part before the first '.' has at least two bytes and ends in 'g'.
        prefix, dot, _ = profile.partition(".")
        if not dot or len(prefix.encode()) < 2 or not prefix.endswith("g"):
            raise section.error(f"invalid MIG profile {profile!r}: expected <n>g.<memory>, e.g. 1g.18gb",
                                "profiles", i)


def config_problems(config: NvidiaConfig) -> list[str]:
    """Upstream's start-up check of the section (HAMi after v2.10, #3010): the values a request
    falls back on must be ones a request could ask for."""
    problems = []
    if not 0 <= config.default_cores <= 100:
        problems.append(f"{SECTION}: defaultCores is a percentage and must be between 0 and 100, "
                        f"got {config.default_cores}")
    if config.default_memory < 0:
        problems.append(f"{SECTION}: defaultMemory must not be negative, got {config.default_memory}")
    if config.memory_factor < 0:
        problems.append(f"{SECTION}: memoryFactor must not be negative, got {config.memory_factor}")
    return problems

"""The device configuration file (``--device-config-file``), in upstream HAMi's schema.

The Helm chart mounts one YAML file that upstream's scheduler and device plugins share; we read
the same file so an existing HAMi installation can switch schedulers without touching it. The
file, not the command line, is the source of truth for resource names (upstream overwrites its
vendor flags with it).

Upstream decodes it with Go's yaml.v2: unknown keys are ignored, a missing key is the Go zero
value (``""``, 0, false) and a wrong type is fatal. We keep those rules, but report the
problem as one line naming the file, the line and the field (``nvidia.defaultMemory``), which
the CLI prints before exiting with status 2. The NVIDIA section is typed (:class:`NvidiaConfig`);
the other vendor sections are kept as raw data until their vendor modules exist.
"""
from __future__ import annotations

import datetime
from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami_py.quantity import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT64_MAX


class ConfigError(ValueError):
    """The device config cannot be used; the message is one line naming file, line and field."""


@dataclass(slots=True)
class MigProfileAllowlistEntry:
    """GPU models (e.g. ``H200 NVL``) and the MIG profiles the device plugin may create on them."""
    models: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)


@dataclass(slots=True)
class NvidiaConfig:
    """The ``nvidia`` section.

    Field defaults are the values of a *missing* key (Go zero values), as upstream: a file that
    leaves out ``defaultGPUNum`` gets 0, not the chart's 1; ``DeviceConfig.default().nvidia``
    holds the values the Helm chart writes. The device-plugin-only keys are ``None`` when absent
    (they are pointers upstream) and are kept so the whole file round-trips.
    """
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

# Vendor sections other than nvidia, and the keys upstream reads from each (used only to tell
# an all-empty file, which upstream refuses, from a usable one).
OTHER_SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "cambricon": ("resourceCountName", "resourceMemoryName", "resourceCoreName"),
    "hygon": ("resourceCountName", "resourceMemoryName", "resourceCoreName", "memoryFactor"),
    "metax": ("resourceCountName", "resourceVCountName", "resourceVMemoryName", "resourceVCoreName",
              "sgpuTopologyAware"),
    "enflame": ("resourceNameGCU", "resourceNameDRSGCU", "resourceNameGCUMemory", "resourceNameGCUCore",
                "resourceNameVGCU", "resourceNameVGCUPercentage"),
    "mthreads": ("resourceCountName", "resourceMemoryName", "resourceCoreName"),
    "kunlun": ("resourceCountName", "resourceVCountName", "resourceVMemoryName"),
    "awsneuron": ("resourceCountName", "resourceCoreName"),
    "amd": ("resourceCountName", "resourceMemoryName", "resourceCoreName"),
    "vastai": ("resourceCountName",),
    "biren": ("resourceCountName",),
    "iluvatars": (),   # a list of chip entries
    "vnpus": (),       # {hamiVnpuCore, configs: [...]}
}
_LIST_SECTIONS = frozenset({"iluvatars"})


@dataclass(slots=True)
class DeviceConfig:
    """The whole file: the typed NVIDIA section plus every other vendor section, raw."""
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    other_sections: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def default(cls) -> DeviceConfig:
        """The device config the Helm chart installs by default (a fresh copy each call)."""
        return parse_device_config(CHART_DEFAULT_DEVICE_CONFIG, "<chart defaults>")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def load_device_config(path: str | Path) -> DeviceConfig:
    """Read and validate the device config file; ConfigError (one line) on any problem."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"{source}: cannot read device config: {err.strerror or err}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source}: not UTF-8 text (byte {err.start})") from None
    return parse_device_config(text, source)


def parse_device_config(text: str, source: str = "<string>") -> DeviceConfig:
    """Like :func:`load_device_config` for text already in memory; ``source`` names it in errors."""
    root, data = _read_yaml(text, source)
    doc = _Document(source, root)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise doc.error((), f"expected a mapping of vendor sections, got {_kind(data)}")
    nvidia = _read_nvidia(doc, data.get("nvidia"))
    others = _read_other_sections(doc, data)
    config = DeviceConfig(nvidia=nvidia, other_sections=others)
    if _is_empty(config):
        raise ConfigError(f"{source}: all configurations are empty")
    return config


# libyaml's loader when PyYAML has it (its wheels do): the chart's default config is parsed at every
# start, and the pure-Python scanner took ~50 ms of it. Node marks (line, column) are the same; a
# file it refuses is read again by the pure-Python loader, whose error texts the messages keep.
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _read_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """The first YAML document as (node tree, plain data); yaml.v2 also reads only the first."""
    if _FAST_LOADER is not None:
        try:
            return _load_first(_FAST_LOADER, text)
        except yaml.YAMLError:
            pass
    try:
        return _load_first(yaml.SafeLoader, text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join((err.problem or err.context or "invalid YAML").split())
        raise ConfigError(f"{source}: {where}YAML syntax error: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: YAML syntax error: {' '.join(str(err).split())}") from None


def _load_first(loader_type, text: str) -> tuple[yaml.Node | None, Any]:
    loader = loader_type(text)
    try:
        root = loader.get_node() if loader.check_node() else None
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return root, data


_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
          (list, "list"), (dict, "mapping"), (datetime.date, "timestamp"), (bytes, "binary"))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    for python_type, name in _KINDS:
        if isinstance(value, python_type):
            return name
    return type(value).__name__


class _Document:
    """The parsed file's node tree, to put line numbers and original text into messages."""

    def __init__(self, source: str, root: yaml.Node | None):
        self.source = source
        self.root = root

    def node(self, path: tuple) -> yaml.Node | None:
        node = self.root
        for step in path:
            if isinstance(node, yaml.MappingNode):
                found = None
                for key_node, value_node in node.value:
                    if isinstance(key_node, yaml.ScalarNode) and key_node.value == step:
                        found = value_node  # the last duplicate wins, as in the constructed data
                node = found
            elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
                node = node.value[step]
            else:
                return None
        return node

    def error(self, path: tuple, problem: str) -> ConfigError:
        node = self.node(path)
        line = f"line {node.start_mark.line + 1}: " if node is not None else ""
        where = f"{_dotted(path)}: " if path else ""
        return ConfigError(f"{self.source}: {line}{where}{problem}")

    def scalar_text(self, path: tuple, value: Any) -> str:
        """A scalar as text the way yaml.v2 fills a Go string field: the text as written."""
        node = self.node(path)
        if isinstance(node, yaml.ScalarNode):
            return node.value
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def _dotted(path: tuple) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


# -- scalar readers: each takes the raw value and its path, returns the typed value --------------

def _read_str(doc: _Document, path: tuple, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        raise doc.error(path, f"expected a string, got {_kind(value)}")
    return doc.scalar_text(path, value)


def _read_optional_str(doc: _Document, path: tuple, value: Any) -> str | None:
    return None if value is None else _read_str(doc, path, value)


def _read_bool(doc: _Document, path: tuple, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise doc.error(path, f"expected true or false, got {_got(doc, path, value)}")
    return value


def _read_optional_bool(doc: _Document, path: tuple, value: Any) -> bool | None:
    return None if value is None else _read_bool(doc, path, value)


def _got(doc: _Document, path: tuple, value: Any) -> str:
    """What was found instead, for messages: ``string "abc"``, ``list``."""
    if isinstance(value, (list, dict)):
        return _kind(value)
    return f'{_kind(value)} "{doc.scalar_text(path, value)}"'


def _read_int(doc: _Document, path: tuple, value: Any, low: int, high: int, kind: str) -> int:
    if value is None:
        return 0
    # Whole floats (2.0) are accepted as yaml.v2 does; fractional ones are refused where yaml.v2
    # would silently truncate them.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.error(path, f"expected an integer, got {_got(doc, path, value)}")
    if not low <= value <= high:
        raise doc.error(path, f"{value} is out of range for {kind} ({low}..{high})")
    return value


def _read_int32(doc: _Document, path: tuple, value: Any) -> int:
    return _read_int(doc, path, value, INT32_MIN, INT32_MAX, "int32")


def _read_optional_uint(doc: _Document, path: tuple, value: Any) -> int | None:
    return None if value is None else _read_int(doc, path, value, 0, UINT64_MAX, "uint")


def _read_optional_int64(doc: _Document, path: tuple, value: Any) -> int | None:
    return None if value is None else _read_int(doc, path, value, INT64_MIN, INT64_MAX, "int64")


def _read_optional_float(doc: _Document, path: tuple, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise doc.error(path, f"expected a number, got {_got(doc, path, value)}")
    return float(value)


def _read_str_list(doc: _Document, path: tuple, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise doc.error(path, f"expected a list of strings, got {_kind(value)}")
    return [_read_str(doc, path + (i,), item) for i, item in enumerate(value)]


def _read_allowlist(doc: _Document, path: tuple, value: Any) -> list[MigProfileAllowlistEntry]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise doc.error(path, f"expected a list of {{models, profiles}} entries, got {_kind(value)}")
    entries = []
    for i, item in enumerate(value):
        entry_path = path + (i,)
        if item is None:
            item = {}
        if not isinstance(item, dict):
            raise doc.error(entry_path, f"expected a mapping with models and profiles, got {_kind(item)}")
        entry = MigProfileAllowlistEntry(
            models=_read_str_list(doc, entry_path + ("models",), item.get("models")),
            profiles=_read_str_list(doc, entry_path + ("profiles",), item.get("profiles")))
        _validate_allowlist_entry(doc, entry_path, entry)
        entries.append(entry)
    return entries


def _validate_allowlist_entry(doc: _Document, path: tuple, entry: MigProfileAllowlistEntry) -> None:
    """Upstream refuses to start unless every entry names models and well-formed profiles."""
    if not entry.models or not entry.profiles:
        raise doc.error(path, "MIG profile allowlist entry must define models and profiles")
    for i, profile in enumerate(entry.profiles):
        # "<n>g.<rest>": the part before the first '.' has at least two bytes and ends in 'g'.
        prefix, dot, _ = profile.partition(".")
        if not dot or len(prefix.encode()) < 2 or not prefix.endswith("g"):
            raise doc.error(path + ("profiles", i),
                            f"invalid MIG profile {profile!r}: expected <n>g.<memory>, e.g. 1g.18gb")


# yaml key -> (attribute, reader)
_NVIDIA_FIELDS = {
    "resourceCountName": ("resource_count_name", _read_str),
    "resourceMemoryName": ("resource_memory_name", _read_str),
    "resourceMemoryPercentageName": ("resource_memory_percentage_name", _read_str),
    "resourceCoreName": ("resource_core_name", _read_str),
    "resourcePriorityName": ("resource_priority_name", _read_str),
    "overwriteEnv": ("overwrite_env", _read_bool),
    "defaultMemory": ("default_memory", _read_int32),
    "defaultCores": ("default_cores", _read_int32),
    "defaultGPUNum": ("default_gpu_num", _read_int32),
    "memoryFactor": ("memory_factor", _read_int32),
    "disableCoreLimit": ("disable_core_limit", _read_bool),
    "gpuCorePolicy": ("gpu_core_policy", _read_str),
    "runtimeClassName": ("runtime_class_name", _read_str),
    "migProfileAllowlist": ("mig_profile_allowlist", _read_allowlist),
    "deviceSplitCount": ("device_split_count", _read_optional_uint),
    "deviceMemoryScaling": ("device_memory_scaling", _read_optional_float),
    "deviceCoreScaling": ("device_core_scaling", _read_optional_float),
    "preConfiguredDeviceMemory": ("pre_configured_device_memory", _read_optional_int64),
    "libCudaLogLevel": ("lib_cuda_log_level", _read_optional_str),
    "enableNumaTopology": ("enable_numa_topology", _read_optional_bool),
}


def _read_nvidia(doc: _Document, section: Any) -> NvidiaConfig:
    config = NvidiaConfig()
    if section is None:
        return config
    if not isinstance(section, dict):
        raise doc.error(("nvidia",), f"expected a mapping, got {_kind(section)}")
    for key, value in section.items():
        spec = _NVIDIA_FIELDS.get(key)  # keys are case-sensitive; unknown ones are ignored
        if spec is not None:
            attribute, reader = spec
            setattr(config, attribute, reader(doc, ("nvidia", key), value))
    return config


def _read_other_sections(doc: _Document, data: dict) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for name in OTHER_SECTION_KEYS:
        value = data.get(name)
        if value is None:
            continue
        expected = list if name in _LIST_SECTIONS else dict
        if not isinstance(value, expected):
            shape = "a list" if expected is list else "a mapping"
            raise doc.error((name,), f"expected {shape}, got {_kind(value)}")
        sections[name] = value
    return sections


def _is_empty(config: DeviceConfig) -> bool:
    """Upstream's "all configurations are empty": no section sets anything it reads."""
    if config.nvidia != NvidiaConfig():
        return False
    for name, section in config.other_sections.items():
        if name == "iluvatars":
            if section:
                return False
        elif name == "vnpus":
            if section.get("configs"):
                return False
        elif any(section.get(key) not in (None, "", False, 0) for key in OTHER_SECTION_KEYS[name]):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The Helm chart's default device config
# ---------------------------------------------------------------------------------------------

def _chart_default_text() -> str:
    return (resources.files("hami_py") / "data" / "device-config.yaml").read_text(encoding="utf-8")


# What the chart renders into the scheduler's device ConfigMap with default values: one package
# data file, read once.
CHART_DEFAULT_DEVICE_CONFIG = _chart_default_text()

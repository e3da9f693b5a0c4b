"""The ``vnpus`` section of the device config: one entry per Ascend chip kind.

Upstream decodes it with yaml.v2 into ``VNPUs{HamiVnpuCore, Configs []VNPUConfig}``: unknown keys
(the chart's old ``topologyPairs``) are ignored, a missing key is the Go zero value and a value of
the wrong type is fatal. We keep those rules and refuse, with the key named, what upstream would
turn into a broken vendor: an empty or duplicated ``commonWord`` (it is the vendor key and part of
every annotation key), or one that cannot appear in an annotation key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hami_py.config import ConfigError
from hami_py.quantity import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

SOURCE = "device config"
SECTION = "vnpus"

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


@dataclass(slots=True)
class VnpusConfig:
    hami_vnpu_core: bool = False    # soft split (hami-core) on every node without its own annotation
    configs: list[VnpuConfig] = field(default_factory=list)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _path(path: tuple) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _error(path: tuple, problem: str) -> ConfigError:
    return ConfigError(f"{SOURCE}: {_path(path)}: {problem}")


def _expected(path: tuple, kind: str, value: Any) -> ConfigError:
    return _error(path, f"expected {kind}, got {_kind(value)}")


def _str(path: tuple, value: Any) -> str:
    """yaml.v2 fills a string field from any scalar (``chipName: 910`` is ``"910"``)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise _expected(path, "a string", value)


def _bool(path: tuple, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _expected(path, "true or false", value)
    return value


def _int(path: tuple, value: Any, low: int, high: int, width: str) -> int:
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expected(path, "an integer", value)
    if not low <= value <= high:
        raise _error(path, f"{value} is out of range for {width} ({low}..{high})")
    return value


def _int32(path: tuple, value: Any) -> int:
    return _int(path, value, INT32_MIN, INT32_MAX, "int32")


def _int64(path: tuple, value: Any) -> int:
    return _int(path, value, INT64_MIN, INT64_MAX, "int64")


def _mapping(path: tuple, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _expected(path, "a mapping", value)
    return value


def _list(path: tuple, value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _expected(path, "a list", value)
    return value


def _template(path: tuple, raw: Any) -> VnpuTemplate:
    data = _mapping(path, raw)
    return VnpuTemplate(name=_str(path + ("name",), data.get("name")),
                        memory=_int64(path + ("memory",), data.get("memory")),
                        ai_core=_int32(path + ("aiCore",), data.get("aiCore")),
                        ai_cpu=_int32(path + ("aiCPU",), data.get("aiCPU")))


_STR_KEYS = {"commonWord": "common_word", "chipName": "chip_name", "resourceName": "resource_name",
             "resourceMemoryName": "resource_memory_name", "resourceCoreName": "resource_core_name",
             "runtimeClassName": "runtime_class_name"}
_INT64_KEYS = {"memoryAllocatable": "memory_allocatable", "memoryCapacity": "memory_capacity"}
_INT32_KEYS = {"memoryFactor": "memory_factor", "aiCore": "ai_core", "aiCPU": "ai_cpu"}
_BOOL_KEYS = {"overwriteEnv": "overwrite_env", "superPod": "super_pod"}


def _chip(path: tuple, raw: Any) -> VnpuConfig:
    data = _mapping(path, raw)
    config = VnpuConfig()
    for key, attribute in _STR_KEYS.items():
        setattr(config, attribute, _str(path + (key,), data.get(key)))
    for key, attribute in _INT64_KEYS.items():
        setattr(config, attribute, _int64(path + (key,), data.get(key)))
    for key, attribute in _INT32_KEYS.items():
        setattr(config, attribute, _int32(path + (key,), data.get(key)))
    for key, attribute in _BOOL_KEYS.items():
        setattr(config, attribute, _bool(path + (key,), data.get(key)))
    templates = [_template(path + ("templates", i), t)
                 for i, t in enumerate(_list(path + ("templates",), data.get("templates")))]
    # Upstream sorts by memory at start-up; a stable sort keeps equal-memory templates in file order.
    config.templates = sorted(templates, key=lambda t: t.memory)
    _check_common_word(path + ("commonWord",), config.common_word)
    return config


def _check_common_word(path: tuple, word: str) -> None:
    if not word:
        raise _error(path, "must not be empty (it names the device kind in every Ascend annotation)")
    name = _LONGEST_PREFIX + word
    if len(name) > 63 or not _NAME_RE.match(name):
        raise _error(path, f'"{word}" cannot be part of an annotation key (hami.io/{name}): use letters, '
                           "digits, '-', '_' and '.', at most 48 characters")


def parse_vnpus(raw: Any) -> VnpusConfig:
    """The typed ``vnpus`` section from its raw YAML data (None: no section, no chip kinds).

    Raises ConfigError naming the key for a value of the wrong type or a unusable ``commonWord``.
    """
    data = _mapping((SECTION,), raw)
    configs = [_chip((SECTION, "configs", i), c)
               for i, c in enumerate(_list((SECTION, "configs"), data.get("configs")))]
    seen: dict[str, int] = {}
    for i, config in enumerate(configs):
        first = seen.setdefault(config.common_word, i)
        if first != i:
            raise _error((SECTION, "configs", i, "commonWord"),
                         f'"{config.common_word}" is already the commonWord of {SECTION}.configs[{first}]')
    return VnpusConfig(hami_vnpu_core=_bool((SECTION, "hamiVnpuCore"), data.get("hamiVnpuCore")), configs=configs)

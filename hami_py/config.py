"""The device configuration file (``--device-config-file``), in upstream HAMi's schema, and the
readers every device family parses its own section with.

The Helm chart mounts one YAML file that upstream's scheduler and device plugins share; we read
the same file so an existing HAMi installation can switch schedulers without touching it. The
file, not the command line, is the source of truth for resource names (upstream overwrites its
vendor flags with it).

Upstream decodes it with Go's yaml.v2: unknown keys are ignored, a missing key is the Go zero
value (``""``, 0, false) and a wrong type is fatal. Those rules live here once, in
:class:`Section`: each family's ``build_family`` reads its section with ``config.section(name)``
into its own config type, beside its module (``hami_py/devices/``), and a problem is reported as
one line naming the file, the line and the field (``<file>: line 3: nvidia.defaultMemory:
expected an integer, got string "abc"``), which the CLI prints before exiting with status 2.
This module names no family's fields and imports no family: the device layer depends on it, not
the other way round. Each family declares its top-level section (:class:`ConfigSection`: name,
shape, the keys upstream counts) beside its ``build_family``, and ``hami_py.devices.registry``
hands those declarations over here, so a new family never edits this file. The sections
themselves are kept as parsed, so the file round-trips.
"""
from __future__ import annotations

import datetime
from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from hami_py.quantity import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT64_MAX


class ConfigError(ValueError):
    """The device config cannot be used; the message is one line naming file, line and field."""


@dataclass(slots=True, frozen=True)
class ConfigSection:
    """A top-level section of the file as the family reading it declares it (its module's
    ``CONFIG_SECTION``): the name, its shape, and the keys upstream reads from it, which are
    only looked at here to tell an all-empty file, which upstream refuses, from a usable one
    (the family reads its section itself, with :class:`Section`)."""
    name: str
    keys: tuple[str, ...] = ()          # set when not the Go zero value
    pointer_keys: tuple[str, ...] = ()  # Go pointer fields: any value, zero included, sets them
    is_list: bool = False               # a list of entries (set when not empty), not a mapping

    def is_set(self, value: Any) -> bool:
        """Whether the section, as parsed, sets anything upstream reads."""
        if self.is_list:
            return bool(value)
        return (any(not _is_zero(value.get(key)) for key in self.keys)
                or any(value.get(key) is not None for key in self.pointer_keys))


# Where the families' sections come from: hami_py.devices.registry declares its gatherer when it
# is imported (this module imports no family). Other top-level keys are ignored, as yaml.v2 does.
_family_sections: Callable[[], Iterable[ConfigSection]] | None = None


def declare_family_sections(source: Callable[[], Iterable[ConfigSection]]) -> None:
    """Read the device config file's sections as ``source()`` declares them, in that order."""
    global _family_sections
    _family_sections = source


def _declared_sections() -> dict[str, ConfigSection]:
    if _family_sections is None:
        raise RuntimeError("the device families have not declared their config sections: "
                           "import hami_py.devices.registry before reading a device config")
    return {section.name: section for section in _family_sections()}


# The source named in messages about a config built in memory, not read from a file.
UNNAMED_SOURCE = "device config"


@dataclass(slots=True)
class DeviceConfig:
    """The whole file: every family's section, as parsed (a mapping, or a list where the family
    declares one), plus the node tree that points messages at the file's lines."""
    sections: dict[str, Any] = field(default_factory=dict)
    document: Document | None = field(default=None, compare=False, repr=False)

    @classmethod
    def default(cls) -> DeviceConfig:
        """The device config the Helm chart installs by default (a fresh copy each call).

        Package data holding only families' sections (tests pin them and check that a file of
        the same text parses alike), so it is kept as written, without the families'
        declarations: code that loads no family (the fake cluster's node builders) reads it too."""
        return _parse(CHART_DEFAULT_DEVICE_CONFIG, "<chart defaults>", None)

    def section(self, name: str) -> Section:
        """The reader of one vendor section; an absent section reads as all zero values."""
        if self.document is None:
            return Section.of(name, self.sections.get(name))
        return Section(self.document, (name,), self.sections.get(name))

    def error(self, problem: str) -> ConfigError:
        """A ConfigError about the file as a whole (its values together), naming the file."""
        return ConfigError(f"{self.document.source if self.document is not None else UNNAMED_SOURCE}: {problem}")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def load_device_config(path: str | Path) -> DeviceConfig:
    """Read the device config file and check its shape; ConfigError (one line) on any problem.

    The sections' keys are checked by the families that read them (``build_family``)."""
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
    return _parse(text, source, _declared_sections())


def _parse(text: str, source: str, declared: dict[str, ConfigSection] | None) -> DeviceConfig:
    """The file's ``declared`` sections, checked; None keeps every top-level section unchecked."""
    root, data = _read_yaml(text, source)
    doc = Document(source, root)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise doc.error((), f"expected a mapping of vendor sections, got {kind_of(data)}")
    if data.get("kind") == "ConfigMap" and "data" in data:
        raise ConfigError(_configmap_refusal(source, data))
    if declared is None:
        return DeviceConfig(sections={name: value for name, value in data.items() if value is not None}, document=doc)
    config = DeviceConfig(sections=_read_sections(doc, data, declared), document=doc)
    # Upstream's "all configurations are empty": no section sets anything it reads.
    if not any(declared[name].is_set(section) for name, section in config.sections.items()):
        raise ConfigError(f"{source}: all configurations are empty")
    return config


def _configmap_refusal(source: str, data: dict) -> str:
    """A ConfigMap given where its content is expected (manifests/device-config.yaml is one):
    say which of its keys is the device config, and how to get it as a file."""
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    keys = sorted(str(k) for k in (data.get("data") or {})) if isinstance(data.get("data"), dict) else []
    key = next((k for k in keys if k == "device-config.yaml"), keys[0] if keys else "device-config.yaml")
    name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    return (f"{source}: this is a Kubernetes ConfigMap ({name}), not a device config file: the device config "
            f"is the text under its data key {key!r}, which the Deployment mounts as a file. Save that text to a "
            f"file and pass it, or leave --device-config-file out to use the embedded default (HAMi's chart "
            f"defaults, the same as manifests/device-config.yaml's)")


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


def _read_sections(doc: Document, data: dict, declared: dict[str, ConfigSection]) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for name, declaration in declared.items():   # other top-level keys are ignored, as yaml.v2 does
        value = data.get(name)
        if value is None:
            continue
        expected = list if declaration.is_list else dict
        if not isinstance(value, expected):
            shape = "a list" if expected is list else "a mapping"
            raise doc.error((name,), f"expected {shape}, got {kind_of(value)}")
        sections[name] = value
    return sections


def _is_zero(value: Any) -> bool:
    """Whether a parsed value reads as its Go zero value ("", 0, false, empty list or mapping)."""
    if value is None or value is False:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    return isinstance(value, (str, list, dict)) and not value


# ---------------------------------------------------------------------------------------------
# Reading a section
# ---------------------------------------------------------------------------------------------

_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
          (list, "list"), (dict, "mapping"), (datetime.date, "timestamp"), (bytes, "binary"))
# The YAML tag each plain Python scalar is constructed from (to trust a node's text for a value).
_TAGS = ((bool, "bool"), (int, "int"), (float, "float"), (datetime.date, "timestamp"))


def kind_of(value: Any) -> str:
    """The YAML kind of a parsed value, as messages name it (``string``, ``mapping``)."""
    if value is None:
        return "null"
    for python_type, name in _KINDS:
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def dotted(path: tuple) -> str:
    """A key path as messages write it: ``vnpus.configs[0].commonWord``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


class Document:
    """The parsed file's node tree, to put line numbers and original text into messages.

    A config built in memory has no tree (``root`` None): its messages name ``source`` alone."""

    __slots__ = ("source", "root")

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
        where = f"{dotted(path)}: " if path else ""
        return ConfigError(f"{self.source}: {line}{where}{problem}")

    def scalar_text(self, path: tuple, value: Any) -> str:
        """A scalar as text the way yaml.v2 fills a Go string field: the text as written
        (``0x10`` stays ``0x10``), when the file's node still holds this kind of value."""
        node = self.node(path)
        if isinstance(node, yaml.ScalarNode) and _tag_matches(node.tag, value):
            return node.value
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def _tag_matches(tag: str, value: Any) -> bool:
    for python_type, name in _TAGS:
        if isinstance(value, python_type):
            return tag == f"tag:yaml.org,2002:{name}"
    return False


class Section:
    """One mapping of the device config (a vendor section, or an entry inside one), read key by
    key with yaml.v2's rules: a missing or null key is the Go zero value, a wrong type raises
    ConfigError naming the file, the line (when known) and the key path.

    Every reader takes the key path below this section (``str("resourceCountName")``,
    ``int64("templates", 0, "memory")``); ``section(...)`` hands an entry to a reader of its own.
    """

    __slots__ = ("document", "path", "value")

    def __init__(self, document: Document, path: tuple, value: Any):
        self.document = document
        self.path = path
        self.value = value   # as parsed: a mapping, a list, or None when absent

    @classmethod
    def of(cls, name: str, value: Any) -> Section:
        """A reader over a section built in memory, not read from a file (messages name no line)."""
        return cls(Document(UNNAMED_SOURCE, None), (name,), value)

    @property
    def name(self) -> str:
        """The section's key path as messages write it (``vnpus.configs[0]``)."""
        return dotted(self.path)

    @property
    def is_null(self) -> bool:
        """Whether the section is absent or null (which reads as all zero values)."""
        return self.value is None

    def error(self, problem: str, *steps: str | int) -> ConfigError:
        """A ConfigError about this section, or about the key at ``steps`` below it."""
        return self.document.error(self.path + steps, problem)

    def _at(self, steps: tuple) -> tuple[tuple, Any]:
        """(full path, value) of the key at ``steps``; None once a step is missing or null."""
        value, path = self.value, self.path
        for step in steps:
            if value is None:
                return self.path + steps, None
            if isinstance(step, int):
                if not isinstance(value, list):
                    raise self.document.error(path, f"expected a list, got {kind_of(value)}")
                value = value[step] if 0 <= step < len(value) else None
            else:
                if not isinstance(value, dict):
                    raise self.document.error(path, f"expected a mapping, got {kind_of(value)}")
                value = value.get(step)
            path += (step,)
        return path, value

    def _got(self, path: tuple, value: Any) -> str:
        """What was found instead, for messages: ``string "abc"``, ``list``."""
        if isinstance(value, (list, dict)) or value is None:
            return kind_of(value)
        return f'{kind_of(value)} "{self.document.scalar_text(path, value)}"'

    # -- nested structure ---------------------------------------------------------------------

    def get(self, *steps: str | int) -> Any:
        """The value at ``steps`` as parsed, unchecked (None when missing or null)."""
        return self._at(steps)[1]

    def section(self, *steps: str | int) -> Section:
        """The mapping at ``steps`` (null or missing: an empty one)."""
        path, value = self._at(steps)
        if value is not None and not isinstance(value, dict):
            raise self.document.error(path, f"expected a mapping, got {kind_of(value)}")
        return Section(self.document, path, value)

    def list(self, *steps: str | int) -> list:
        """The list at ``steps`` as parsed (null or missing: [])."""
        path, value = self._at(steps)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.document.error(path, f"expected a list, got {kind_of(value)}")
        return value

    def sections(self, *steps: str | int) -> list[Section]:
        """A reader for each entry of the list at ``steps`` (a null entry reads as empty)."""
        return [self.section(*steps, i) for i in range(len(self.list(*steps)))]

    # -- scalars --------------------------------------------------------------------------------

    def str(self, *steps: str | int, only_strings: bool = False) -> str:
        """A string key (missing or null: ""). Any other scalar gives its text as written, as
        yaml.v2 fills a Go string; with ``only_strings`` it is refused instead."""
        path, value = self._at(steps)
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if only_strings or isinstance(value, (list, dict)):
            raise self.document.error(path, f"expected a string, got {self._got(path, value)}")
        return self.document.scalar_text(path, value)

    def optional_str(self, *steps: str | int) -> str | None:
        """Like :meth:`str`, but None when missing or null (a Go ``*string``)."""
        return None if self._at(steps)[1] is None else self.str(*steps)

    def bool(self, *steps: str | int) -> bool:
        """A true/false key (missing or null: False); YAML 1.1 spellings (``yes``) count, text does not."""
        path, value = self._at(steps)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.document.error(path, f"expected true or false, got {self._got(path, value)}")
        return value

    def optional_bool(self, *steps: str | int) -> bool | None:
        return None if self._at(steps)[1] is None else self.bool(*steps)

    def _int(self, steps: tuple, low: int, high: int, kind: str) -> int:
        path, value = self._at(steps)
        if value is None:
            return 0
        # Whole floats (2.0) are accepted as yaml.v2 does; fractional ones are refused where yaml.v2
        # would silently truncate them.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.document.error(path, f"expected an integer, got {self._got(path, value)}")
        if not low <= value <= high:
            raise self.document.error(path, f"{value} is out of range for {kind} ({low}..{high})")
        return value

    def int32(self, *steps: str | int) -> int:
        """An int32 key (missing or null: 0)."""
        return self._int(steps, INT32_MIN, INT32_MAX, "int32")

    def int64(self, *steps: str | int) -> int:
        """An int64 key (missing or null: 0)."""
        return self._int(steps, INT64_MIN, INT64_MAX, "int64")

    def optional_int64(self, *steps: str | int) -> int | None:
        return None if self._at(steps)[1] is None else self.int64(*steps)

    def optional_uint(self, *steps: str | int) -> int | None:
        """A Go ``*uint`` key (64 bits): None when missing or null."""
        return None if self._at(steps)[1] is None else self._int(steps, 0, UINT64_MAX, "uint")

    def optional_float(self, *steps: str | int) -> float | None:
        """A Go ``*float64`` key: None when missing or null; integers count."""
        path, value = self._at(steps)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.document.error(path, f"expected a number, got {self._got(path, value)}")
        return float(value)

    def str_list(self, *steps: str | int) -> list[str]:
        """A list of strings (missing or null: []); each item read as :meth:`str` reads a key."""
        path, value = self._at(steps)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.document.error(path, f"expected a list of strings, got {kind_of(value)}")
        return [self.str(*steps, i) for i in range(len(value))]


# ---------------------------------------------------------------------------------------------
# The Helm chart's default device config
# ---------------------------------------------------------------------------------------------

def _chart_default_text() -> str:
    return (resources.files("hami_py") / "data" / "device-config.yaml").read_text(encoding="utf-8")


# What the chart renders into the scheduler's device ConfigMap with default values: one package
# data file, read once.
CHART_DEFAULT_DEVICE_CONFIG = _chart_default_text()

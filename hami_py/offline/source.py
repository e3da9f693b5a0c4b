"""The offline tools' input files, read so that every bad value can be named by file, line and field.

A planner feeding in a hand-written cluster file or a ``kubectl get -o yaml`` dump of hundreds of
objects must not have to bisect it to find a typo. YAML is loaded into dict and list subclasses
that remember the line of every key and item, and the readers below turn a wrong value into an
:class:`InputError` such as ``cluster.yaml: line 12: nodes[2].gpus: expected an integer, got
string "eight"``. Duplicate keys are errors too (YAML would silently keep the last one).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import yaml


class InputError(ValueError):
    """An input file (or a listed object) cannot be used; ``str()`` is one line naming file, line and field."""

    def __init__(self, path: str, line: int | None, field: str, problem: str):
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [self.path]
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.field:
            parts.append(self.field)
        parts.append(self.problem)
        return ": ".join(parts)


class LocatedMap(dict):
    """A YAML mapping that knows its own line and the line of each key."""
    line: int | None = None
    lines: dict


class LocatedList(list):
    """A YAML sequence that knows its own line and the line of each item."""
    line: int | None = None
    lines: dict


class _Loader(yaml.SafeLoader):
    """SafeLoader with located containers, duplicate-key errors, and timestamps left as text
    (Kubernetes objects carry RFC 3339 strings that must round-trip as strings)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> LocatedMap:
    own = {id(key) for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"}
    loader.flatten_mapping(node)
    out = LocatedMap()
    out.line = node.start_mark.line + 1
    out.lines = {}
    owners: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a scalar", key_node.start_mark) from None
        if key in out and id(key_node) in own and owners.get(key) in own:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
        owners[key] = id(key_node)
    return out


def _construct_list(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    out = LocatedList(loader.construct_object(item, deep=True) for item in node.value)
    out.line = node.start_mark.line + 1
    out.lines = {i: item.start_mark.line + 1 for i, item in enumerate(node.value)}
    return out


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_list)


@dataclass(frozen=True, slots=True)
class Where:
    """A position in an input file: the file, the dotted field path and the line."""
    path: str
    field: str = ""
    line: int | None = None

    def at(self, container: Any, key: Any) -> Where:
        """The position of ``container[key]``."""
        if isinstance(key, int):
            field = f"{self.field}[{key}]"
        elif "." in str(key) or "/" in str(key):
            field = f'{self.field}["{key}"]'
        else:
            field = f"{self.field}.{key}" if self.field else str(key)
        lines = getattr(container, "lines", None) or {}
        return Where(self.path, field, lines.get(key, self.line))

    def error(self, problem: str) -> InputError:
        return InputError(self.path, self.line, self.field, problem)


def load_documents(path: str) -> list[tuple[Any, Where]]:
    """Every non-empty YAML document of ``path`` with its position; InputError when unreadable."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise InputError(path, None, "", f"cannot read file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, None, "", f"not UTF-8 text (byte {exc.start})") from None
    loader = _Loader(text)
    docs: list[tuple[Any, Where]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            if data is not None:
                docs.append((data, Where(path, "", node.start_mark.line + 1)))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        column = f" column {mark.column + 1}" if mark else ""
        raise InputError(path, mark.line + 1 if mark else None, "",
                         f"invalid YAML{column and ' (' + column.strip() + ')'}: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(path, None, "", f"invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    if not docs:
        raise InputError(path, None, "", "the file holds no YAML document")
    return docs


# -- readers ----------------------------------------------------------------------------------

def kind_of(value: Any) -> str:
    """How a value is named in messages: ``string "eight"``, ``integer 3``, ``list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'string "{shown}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def read_map(where: Where, value: Any) -> LocatedMap:
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping, got {kind_of(value)}")
    return value


def read_list(where: Where, value: Any) -> LocatedList:
    if not isinstance(value, list):
        raise where.error(f"expected a list, got {kind_of(value)}")
    return value


def read_str(where: Where, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"expected a non-empty string, got {kind_of(value)}")
    return value


def read_int(where: Where, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        else:
            raise where.error(f"expected an integer, got {kind_of(value)}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise where.error(f"must be at most {maximum}, got {value}")
    return value


_MIB_UNITS = {"": 1, "mi": 1, "mib": 1, "gi": 1024, "gib": 1024, "ti": 1024 * 1024, "tib": 1024 * 1024}


def read_mib(where: Where, value: Any) -> int:
    """Device memory in MiB: a whole number (MiB, as ``nvidia.com/gpumem`` counts) or text with a
    binary unit, ``80Gi`` / ``20480Mi`` / ``1Ti``."""
    if isinstance(value, str):
        text = value.strip()
        digits = len(text) - len(text.lstrip("0123456789"))
        number, unit = text[:digits], text[digits:].strip().lower()
        if number and unit in _MIB_UNITS:
            value = int(number) * _MIB_UNITS[unit]
        else:
            raise where.error(f'expected MiB as a whole number or with a unit (Mi, Gi, Ti), got {kind_of(value)}')
    return read_int(where, value, minimum=1)


def read_str_map(where: Where, value: Any) -> dict[str, str]:
    """Labels, annotations, nodeSelector: string keys, values as text (numbers allowed, as text)."""
    mapping = read_map(where, value)
    out = {}
    for key, item in mapping.items():
        if not isinstance(key, str):
            raise where.error(f"keys must be strings, got {kind_of(key)}")
        if isinstance(item, (dict, list)) or item is None:
            raise where.at(mapping, key).error(f"expected a string, got {kind_of(item)}")
        out[key] = str(item).lower() if isinstance(item, bool) else str(item)
    return out


def optional(where: Where, mapping: dict, key: str, reader: Callable[..., Any], default: Any = None, **kw) -> Any:
    """``reader`` applied to ``mapping[key]`` when present (and not null), else ``default``."""
    if mapping.get(key) is None:
        return default
    return reader(where.at(mapping, key), mapping[key], **kw)


def required(where: Where, mapping: dict, key: str, reader: Callable[..., Any], **kw) -> Any:
    if mapping.get(key) is None:
        raise where.error(f'missing required field "{key}"')
    return reader(where.at(mapping, key), mapping[key], **kw)


def check_keys(where: Where, mapping: dict, allowed: Iterable[str]) -> None:
    """Unknown keys are errors, with the closest known name suggested (typos are common)."""
    known = list(allowed)
    for key in mapping:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else f" (known: {', '.join(known)})"
            raise where.at(mapping, key).error(f'unknown field "{key}"{hint}')


def plain(value: Any) -> Any:
    """A located value as plain JSON-compatible Python (dicts, lists, scalars)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def kubernetes_objects(docs: list[tuple[Any, Where]]):
    """Every Kubernetes object of the documents, Lists expanded, each with its position."""
    for doc, where in docs:
        obj = read_map(where, doc)
        kind = obj.get("kind")
        if not isinstance(kind, str) or not kind:
            raise where.error(f'expected a Kubernetes object with a "kind", got kind {kind_of(kind)}')
        if not kind.endswith("List"):
            yield obj, where
            continue
        items_where = where.at(obj, "items")
        items = read_list(items_where, obj.get("items") or [])
        for i, item in enumerate(items):
            item_where = items_where.at(items, i)
            item = read_map(item_where, item)
            if not isinstance(item.get("kind"), str):
                if kind == "List":
                    raise item_where.error('expected a Kubernetes object with a "kind"')
                item["kind"] = kind[:-4]  # a NodeList's items may leave their kind out
            yield item, item_where

"""Shape checks for what arrives at /filter and /bind, before any of it is used.

Upstream decodes ExtenderArgs into Go structs, so a field of the wrong JSON type is a decode
error there. Here the body stays plain JSON (decoding a pod into objects would cost more than
the whole decision), so the fields the scheduler reads are checked once, at the door: a wrong
type gets an error naming the field instead of a crash deep inside, names that go into API URLs
must be valid Kubernetes names (a ``/`` in a pod name would address another resource), and the
nesting depth is bounded, so whatever we hand back (an untouched ``Nodes`` list) can be written
out again.

Every function returns None when the input is acceptable, else the message for ``Error``.
"""
from __future__ import annotations

import re
from typing import Any

from hami_py.scheduling.verbs.service import lower_keys

MAX_JSON_DEPTH = 100    # a real ExtenderArgs nests about 15 deep; orjson writes at most 254

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_CONTAINERS = frozenset((dict, list))   # orjson makes exactly these types, never subclasses
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
               type(None): "null"}


def _kind(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def may_nest_deeper(body: bytes, *, limit: int = MAX_JSON_DEPTH) -> bool:
    """False when the JSON text cannot nest deeper than ``limit``: it has no more opening
    brackets than that (strings may hold some too, which only makes this an overestimate), so
    the common filter request (a pod has some sixty) skips ``nesting_error``'s walk.

    Brackets are found with ``bytes.find`` (memchr: the thousands of node names between them
    are skipped many bytes at a time) and counted up to ``limit``: several times quicker than
    ``bytes.count`` over a body of thousands of names."""
    found = 0
    for bracket in (b"{", b"["):
        at = body.find(bracket)
        while at >= 0:
            found += 1
            if found > limit:
                return True
            at = body.find(bracket, at + 1)
    return False


def nesting_error(value: Any, *, limit: int = MAX_JSON_DEPTH) -> str | None:
    """An error when objects and arrays nest deeper than ``limit`` (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return f"request body nests deeper than {limit} levels"
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            # Long flat lists (NodeNames: thousands of names) are checked at C speed.
            if len(node) > 16 and _CONTAINERS.isdisjoint(set(map(type, node))):
                continue
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return None


def _expect(value: Any, types: tuple, where: str, what: str) -> str | None:
    """An error unless ``value`` is null (Go's zero value) or of one of ``types``."""
    if value is None or isinstance(value, types):
        return None
    return f"extender args {where} must be {what}, not {_kind(value)}"


def _string_map(value: Any, where: str) -> str | None:
    if error := _expect(value, (dict,), where, "an object"):
        return error
    for key, item in (value or {}).items():
        if not isinstance(item, str):
            return f"extender args {where}[{key!r}] must be a string, not {_kind(item)}"
    return None


def _name(value: Any, where: str, pattern: re.Pattern, what: str) -> str | None:
    if error := _expect(value, (str,), where, "a string"):
        return error
    if value and not pattern.fullmatch(value):
        return f"extender args {where} {value!r} is not a valid {what}"
    return None


def _metadata_error(meta: Any, where: str) -> str | None:
    if error := _expect(meta, (dict,), where, "an object"):
        return error
    meta = meta or {}
    return (_name(meta.get("name"), f"{where}.name", _DNS_SUBDOMAIN, "object name")
            or _name(meta.get("namespace"), f"{where}.namespace", _DNS_LABEL, "namespace name")
            or _expect(meta.get("uid"), (str,), f"{where}.uid", "a string")
            or _string_map(meta.get("annotations"), f"{where}.annotations")
            or _string_map(meta.get("labels"), f"{where}.labels"))


def _container_error(container: Any, where: str) -> str | None:
    if not isinstance(container, dict):
        return f"extender args {where} must be an object, not {_kind(container)}"
    if error := _expect(container.get("name"), (str,), f"{where}.name", "a string"):
        return error
    resources = container.get("resources")
    if error := _expect(resources, (dict,), f"{where}.resources", "an object"):
        return error
    for part in ("limits", "requests"):
        quantities = (resources or {}).get(part)
        if error := _expect(quantities, (dict,), f"{where}.resources.{part}", "an object"):
            return error
        for key, item in (quantities or {}).items():
            if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                return f"extender args {where}.resources.{part}[{key!r}] must be a quantity, not {_kind(item)}"
    return None


def pod_error(pod: Any, where: str = "Pod") -> str | None:
    """The pod fields the scheduler reads have the types a Kubernetes pod gives them."""
    if not isinstance(pod, dict):
        return None     # the service answers a missing or non-object pod itself
    if error := _metadata_error(pod.get("metadata"), f"{where}.metadata"):
        return error
    spec = pod.get("spec")
    if error := _expect(spec, (dict,), f"{where}.spec", "an object"):
        return error
    for field in ("initContainers", "containers"):
        containers = (spec or {}).get(field)
        if error := _expect(containers, (list,), f"{where}.spec.{field}", "an array"):
            return error
        for i, container in enumerate(containers or []):
            if error := _container_error(container, f"{where}.spec.{field}[{i}]"):
                return error
    status = pod.get("status")
    if error := _expect(status, (dict,), f"{where}.status", "an object"):
        return error
    return _expect((status or {}).get("phase"), (str,), f"{where}.status.phase", "a string")


def _node_error(node: Any, where: str) -> str | None:
    if not isinstance(node, dict):
        return f"extender args {where} must be an object, not {_kind(node)}"
    if error := _metadata_error(node.get("metadata"), f"{where}.metadata"):
        return error
    status = node.get("status")
    if error := _expect(status, (dict,), f"{where}.status", "an object"):
        return error
    for part in ("allocatable", "capacity"):
        if error := _expect((status or {}).get(part), (dict,), f"{where}.status.{part}", "an object"):
            return error
    return None


def extender_args_error(args: Any) -> str | None:
    """Checks an ExtenderArgs body (keys matched case-insensitively, as Go's decoder does)."""
    if not isinstance(args, dict):
        return None     # the service answers that itself
    fields = lower_keys(args)
    if error := pod_error(fields.get("pod")):
        return error
    nodes = fields.get("nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        for i, node in enumerate(nodes["items"]):
            if error := _node_error(node, f"Nodes.items[{i}]"):
                return error
    return None


def binding_args_error(args: Any) -> str | None:
    """Checks an ExtenderBindingArgs body: strings, and names that are Kubernetes names."""
    if not isinstance(args, dict):
        return None
    fields = lower_keys(args)
    return (_name(fields.get("podname"), "PodName", _DNS_SUBDOMAIN, "pod name")
            or _name(fields.get("podnamespace"), "PodNamespace", _DNS_LABEL, "namespace name")
            or _expect(fields.get("poduid"), (str,), "PodUID", "a string")
            or _name(fields.get("node"), "Node", _DNS_SUBDOMAIN, "node name"))

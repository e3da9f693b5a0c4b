"""Label and field selectors of the in-repo API server, compiled once into a predicate.

Why a module of its own: LIST and watch both filter by them, and a watch re-evaluates the
predicate on every event. Simplification: any dotted path is accepted as a field selector (a real
server allows only a per-kind list).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from hami_py.fakeapi.errors import ApiError

Matcher = Callable[[dict], bool]
_SET_TERM = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_TERMS = re.compile(r"(?:[^,(]|\([^)]*\))+")   # split on commas outside ``in (a,b)`` lists


def _labels(obj: dict) -> dict:
    return obj.get("metadata", {}).get("labels") or {}


def _label_predicate(term: str) -> Matcher:
    if m := _SET_TERM.match(term):
        key, op, raw = m.groups()
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda o: _labels(o).get(key) in values
        return lambda o: _labels(o).get(key) not in values
    for op in ("!=", "==", "="):
        key, found, value = term.partition(op)
        if found:
            key, value = key.strip(), value.strip()
            if not key:
                raise ApiError(400, f"unable to parse requirement: {term!r}")
            if op == "!=":
                return lambda o: _labels(o).get(key) != value
            return lambda o: _labels(o).get(key) == value
    key = term.strip()
    if key.startswith("!") and key[1:].strip():
        absent = key[1:].strip()
        return lambda o: absent not in _labels(o)
    if not key or not re.fullmatch(r"[\w./-]+", key):
        raise ApiError(400, f"unable to parse requirement: {term!r}")
    return lambda o: key in _labels(o)


def _field_value(obj: dict, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""                      # so ``spec.nodeName=`` selects unscheduled pods, as upstream
    return str(node).lower() if isinstance(node, bool) else str(node)


def _field_predicate(term: str) -> Matcher:
    for op in ("!=", "==", "="):
        path, found, value = term.partition(op)
        if found and path.strip():
            path, value = path.strip(), value.strip()
            if op == "!=":
                return lambda o: _field_value(o, path) != value
            return lambda o: _field_value(o, path) == value
    raise ApiError(400, f"invalid field selector: {term!r}: field selectors need = or !=")


def compile_selectors(label_selector: str = "", field_selector: str = "") -> Matcher | None:
    """One predicate for both selectors, or None when nothing is selected (the fast path)."""
    preds = [_label_predicate(t) for t in _TERMS.findall(label_selector) if t.strip()]
    preds += [_field_predicate(t) for t in field_selector.split(",") if t.strip()]
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    return lambda obj: all(p(obj) for p in preds)

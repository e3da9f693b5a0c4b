"""The PATCH bodies the in-repo API server accepts: RFC 7386 merge and RFC 6902 JSON patches.

Why a module of its own: patch semantics (what is replaced, what fails with 400 or 422) are pure
functions on a private copy of the object, independent of storage and HTTP. Simplification: a
strategic merge patch is applied as an RFC 7386 merge patch (fine for the metadata maps we patch;
lists are replaced, never merged by key).
"""
from __future__ import annotations

import copy
from typing import Any, Callable

from hami_py.fakeapi.errors import ApiError


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch; mutates and returns ``target`` (callers pass a private copy)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiError(400, f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


class _PatchFailed(Exception):
    """An RFC 6902 operation that cannot be applied to the current object."""


def _index(token: str, size: int, *, append_ok: bool) -> int:
    if append_ok and token == "-":
        return size
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise _PatchFailed(f"invalid array index {token!r}")
    index = int(token)
    if index > size or (index == size and not append_ok):
        raise _PatchFailed(f"array index {index} out of bounds")
    return index


def _walk(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_index(token, len(doc), append_ok=False)]
        else:
            raise _PatchFailed(f"path /{'/'.join(tokens)} does not exist")
    return doc


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), append_ok=True), value)
    else:
        raise _PatchFailed(f"cannot add to a scalar at /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise _PatchFailed("cannot remove the whole document")
    parent, last = _walk(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(last, len(parent), append_ok=False))
    raise _PatchFailed(f"path /{'/'.join(tokens)} does not exist")


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; mutates and returns ``doc`` (callers pass a private copy).

    A malformed patch is 400 BadRequest; one that cannot be applied (missing path, failed
    ``test``) is 422 Invalid, as kube-apiserver's PATCH handler answers (patch.go,
    NewGenericServerResponse(StatusUnprocessableEntity, ...)).
    """
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a list of operations")
    try:
        for op in operations:
            doc = _apply_op(doc, op)
    except _PatchFailed as err:
        raise ApiError(422, "the server rejected our request due to an error in our request",
                       details={"causes": [{"reason": "UnexpectedServerResponse",
                                            "message": str(err)}]}) from None
    return doc


def _apply_op(doc: Any, op: Any) -> Any:
    if not isinstance(op, dict) or "path" not in op:
        raise ApiError(400, f"invalid json patch operation: {op!r}")
    kind, tokens = op.get("op"), _pointer(op["path"])
    if kind in ("add", "replace", "test") and "value" not in op:
        raise ApiError(400, f"json patch operation {kind!r} needs a value")
    if kind == "add":
        return _add(doc, tokens, op["value"])
    if kind == "remove":
        _remove(doc, tokens)
        return doc
    if kind == "replace":
        _walk(doc, tokens)                   # replace needs an existing target
        if tokens:
            _remove(doc, tokens)
        return _add(doc, tokens, op["value"])
    if kind == "test":
        if _walk(doc, tokens) != op["value"]:
            raise _PatchFailed(f"testing value {op['path']} failed: test failed")
        return doc
    if kind in ("move", "copy"):
        source = _pointer(op.get("from"))
        if kind == "move":
            if tokens[:len(source)] == source and tokens != source:
                raise _PatchFailed("cannot move a value into one of its children")
            return _add(doc, tokens, _remove(doc, source))
        return _add(doc, tokens, copy.deepcopy(_walk(doc, source)))
    raise ApiError(400, f"unexpected json patch operation {kind!r}")


PATCHERS: dict[str, Callable[[Any, Any], Any]] = {
    "application/merge-patch+json": merge_patch,
    # Treated as a merge patch on purpose: see the module docstring.
    "application/strategic-merge-patch+json": merge_patch,
    "application/json-patch+json": json_patch,
}

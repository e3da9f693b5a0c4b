"""An in-repo fake kube-apiserver for tests, benchmarks and the ``make run`` demo.

Why: the extender talks to Kubernetes through kubernetes-asyncio and raw aiohttp. Mocking those
clients would test our mocks, so this module serves the real REST paths over loopback HTTP with the
real semantics the code depends on: one global resourceVersion, Status error objects, optimistic
concurrency (409 Conflict), limit/continue paging over a consistent snapshot, watches that replay
history from a resourceVersion, bookmarks, ``410 Expired`` after compaction, the pod binding
subresource, and fault injection (errors, 429 + Retry-After, hangs, delays, cut watches, restarts).

Speed: every stored object is an immutable dict kept next to its orjson bytes. Reads (GET, LIST,
watch replay) reuse the bytes, writes replace both (copy on write), and each watch event is
rendered once and shared by every watcher.

Deliberate simplifications: a strategic merge patch is applied as an RFC 7386 merge patch (fine for
the metadata maps we patch; lists are replaced, never merged by key); server-side apply, protobuf,
graceful pod deletion, admission and validation beyond names are not implemented; any dotted path
is accepted as a field selector (a real server allows only a per-kind list); every write bumps the
resourceVersion, even a no-op one (a real server skips no-op writes).
"""
from __future__ import annotations

import asyncio
import base64
import collections
import copy
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import orjson
import structlog
import yaml
from aiohttp import web

from hami_py.fakeapi.disruption import eviction_refusal
from hami_py.k8s.tokenreview import TOKEN_REVIEWS

log = structlog.get_logger()

_SNAPSHOT_TTL = 300.0      # seconds a continue token stays valid (a real server: until compaction)
_MAX_SNAPSHOTS = 256       # bounds memory when callers abandon paged lists
_PACE_TICK_S = 0.002      # a paced watch writes what is due this often
_WRITE_CHUNK = 1 << 20     # batch watch lines into ~1 MiB writes so replay is not one write per line
_VERSION = orjson.dumps({
    "major": "1", "minor": "31", "gitVersion": "v1.31.0", "gitTreeState": "clean",
    "gitCommit": "9ea7c6b4e1c4d8e5e1e8c6d8f3f0b6d1e1a2b3c4", "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
    "compiler": "gc", "platform": "linux/amd64"})


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource type: its URL plural, kind and scope."""
    plural: str
    kind: str
    api_version: str
    namespaced: bool

    @property
    def group_resource(self) -> str:
        """The name Status messages use: ``pods``, ``leases.coordination.k8s.io``."""
        group = self.api_version.rpartition("/")[0]
        return f"{self.plural}.{group}" if group else self.plural


RESOURCES = {r.plural: r for r in (
    Resource("nodes", "Node", "v1", False),
    Resource("pods", "Pod", "v1", True),
    Resource("resourcequotas", "ResourceQuota", "v1", True),
    Resource("events", "Event", "v1", True),
    Resource("configmaps", "ConfigMap", "v1", True),
    Resource("leases", "Lease", "coordination.k8s.io/v1", True),
    Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", True),
)}
_API_PREFIXES = {("api", "v1"): "v1", ("apis", "coordination.k8s.io", "v1"): "coordination.k8s.io/v1",
                 ("apis", "policy", "v1"): "policy/v1"}
_BINDINGS = Resource("pods/binding", "Binding", "v1", True)   # names the subresource in errors

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A request failure, rendered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 details: dict | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.retry_after = retry_after

    def status(self) -> dict:
        """The Status object a real API server would answer with."""
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(res: Resource, name: str) -> dict:
    group = res.api_version.rpartition("/")[0]
    return {"name": name, **({"group": group} if group else {}), "kind": res.plural}


def _not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.group_resource} "{name}" not found', details=_details(res, name))


def _conflict(res: Resource, name: str, why: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {res.group_resource} "{name}": {why}',
                    details=_details(res, name))


_STALE = "the object has been modified; please apply your changes to the latest version and try again"



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


_PATCHERS: dict[str, Callable[[Any, Any], Any]] = {
    "application/merge-patch+json": merge_patch,
    # Treated as a merge patch on purpose: see the module docstring.
    "application/strategic-merge-patch+json": merge_patch,
    "application/json-patch+json": json_patch,
}



class _Stored(NamedTuple):
    obj: dict       # never mutated once stored: writers build a new dict (copy on write)
    raw: bytes      # orjson of obj, reused by GET, LIST and watch


class _Event:
    """One write in the watch history; each line is rendered once, whoever watches."""
    __slots__ = ("rv", "type", "namespace", "obj", "prev", "raw", "_lines")

    def __init__(self, rv: int, type_: str, namespace: str, obj: dict, prev: dict | None,
                 raw: bytes) -> None:
        self.rv, self.type, self.namespace = rv, type_, namespace
        self.obj, self.prev, self.raw = obj, prev, raw
        self._lines: dict[str, bytes] = {}

    def line(self, type_: str | None = None) -> bytes:
        type_ = type_ or self.type
        if (cached := self._lines.get(type_)) is None:
            cached = self._lines[type_] = _event_line(type_, self.raw)
        return cached


def _event_line(type_: str, raw: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (type_.encode(), raw)


class _Watcher:
    """One open watch stream: filters events and buffers their lines for the writer task.

    Delivery can be held or paced (``FakeApiServer.pace_watches``): ``rate`` None streams lines
    as they come, 0 holds them, a positive rate releases that many lines a second from ``t0``
    and records, after each write, how many paced lines have gone out (``marks``)."""
    __slots__ = ("namespace", "match", "bookmarks", "pending", "wake", "cut", "transport",
                 "rate", "t0", "sent", "marks")

    def __init__(self, *, namespace: str | None, match: Matcher | None, bookmarks: bool) -> None:
        self.namespace, self.match, self.bookmarks = namespace, match, bookmarks
        self.pending: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.cut = False
        self.transport: asyncio.BaseTransport | None = None
        self.rate: float | None = None
        self.t0 = 0.0
        self.sent = 0
        self.marks: list[tuple[int, float]] = []

    def next_lines(self) -> list[bytes]:
        """The lines to write now (maybe none while held or ahead of the pace)."""
        if self.rate is None:
            lines = list(self.pending)
            self.pending.clear()
            return lines
        if self.rate <= 0:
            return []
        due = min(int(self.rate * (time.monotonic() - self.t0)) - self.sent, len(self.pending))
        return [self.pending.popleft() for _ in range(max(due, 0))]

    def push(self, line: bytes) -> None:
        self.pending.append(line)
        self.wake.set()

    def offer(self, event: _Event) -> None:
        if self.namespace is not None and event.namespace != self.namespace:
            return
        if self.match is None:
            self.push(event.line())
            return
        # Like the watch cache: an update moving an object into (out of) the selection is seen as
        # ADDED (DELETED) by this watcher.
        now = self.match(event.obj)
        before = event.prev is not None and self.match(event.prev)
        if event.type != "MODIFIED":
            if now:
                self.push(event.line())
        elif now or before:
            self.push(event.line("MODIFIED" if now and before else "ADDED" if now else "DELETED"))

    def abort(self) -> None:
        """Cut the connection without a clean end of stream, as a crash or network cut does."""
        self.cut = True
        if self.transport is not None:
            self.transport.abort()
        self.wake.set()


_clock = [0, ""]    # (second, its timestamp): creating 40k objects should not format 40k dates


def _now() -> str:
    second = int(time.time())
    if second != _clock[0]:
        _clock[:] = second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    return _clock[1]


def _uid() -> str:
    """A random (version 4) UUID, formatted directly: uuid.uuid4() is slow when seeding."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def _owned_copy(obj: Any) -> Any:
    """A deep copy that shares nothing with the caller (orjson round trip beats deepcopy)."""
    return orjson.loads(orjson.dumps(obj))


class _Store:
    """All objects, the resourceVersion counter, the watch history and the open watchers."""

    def __init__(self, *, history_limit: int) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], _Stored]] = {p: {} for p in RESOURCES}
        self.history = {p: collections.deque(maxlen=history_limit) for p in RESOURCES}
        self.compacted = {p: 0 for p in RESOURCES}   # events up to this RV are gone
        self.watchers: dict[str, set[_Watcher]] = {p: set() for p in RESOURCES}
        # Keys in list order, rebuilt lazily after a create or delete (updates keep the order).
        self._sorted: dict[str, list[tuple[str, str]] | None] = {p: None for p in RESOURCES}
        self.snapshots: collections.OrderedDict[int, tuple[float, str, list[bytes]]] = (
            collections.OrderedDict())
        self._snapshot_ids = 0
        self.binding_labels = True     # copy a Binding's labels onto the pod (Kubernetes >= 1.35)

    # -- writes -----------------------------------------------------------------------------

    def _commit(self, res: Resource, key: tuple[str, str], type_: str, obj: dict,
                prev: _Stored | None) -> _Stored:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        stored = _Stored(obj, orjson.dumps(obj))
        if type_ == "DELETED":
            del self.objects[res.plural][key]
        else:
            self.objects[res.plural][key] = stored
        if type_ != "MODIFIED":
            self._sorted[res.plural] = None
        event = _Event(self.rv, type_, key[0], obj, prev.obj if prev else None, stored.raw)
        history = self.history[res.plural]
        if len(history) == history.maxlen:
            self.compacted[res.plural] = history[0].rv
        history.append(event)
        for watcher in self.watchers[res.plural]:
            watcher.offer(event)
        return stored

    def create(self, res: Resource, obj: Any, *, namespace: str | None) -> _Stored:
        if not isinstance(obj, dict):
            raise ApiError(400, "the request body must be a JSON object")
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + os.urandom(3).hex()[:5]
        if not meta.get("name"):
            raise ApiError(422, f'{res.kind} "" is invalid: metadata.name: Required value: '
                                "name or generateName is required",
                           details={"kind": res.kind, "name": ""})
        self._place(res, meta, namespace)
        key = (meta.get("namespace", ""), meta["name"])
        if key in self.objects[res.plural]:
            raise ApiError(409, f'{res.group_resource} "{meta["name"]}" already exists',
                           reason="AlreadyExists", details=_details(res, meta["name"]))
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        meta.setdefault("uid", _uid())
        meta.setdefault("creationTimestamp", _now())
        if res.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")   # as pod defaulting does
        return self._commit(res, key, "ADDED", obj, None)

    @staticmethod
    def _place(res: Resource, meta: dict, namespace: str | None) -> None:
        if not res.namespaced:
            meta.pop("namespace", None)
            return
        if namespace is not None and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "the namespace of the provided object does not match the "
                                "namespace sent on the request")
        meta["namespace"] = namespace or meta.get("namespace") or "default"

    def get(self, res: Resource, key: tuple[str, str]) -> _Stored:
        if (stored := self.objects[res.plural].get(key)) is None:
            raise _not_found(res, key[1])
        return stored

    def replace(self, res: Resource, key: tuple[str, str], obj: Any) -> _Stored:
        """PUT semantics, also the last step of every patch: identity and RV checks, commit."""
        stored = self.get(res, key)
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            raise ApiError(400, "the request body must be a JSON object")
        meta = obj.setdefault("metadata", {})
        name = meta.setdefault("name", key[1])
        if name != key[1]:
            raise ApiError(400, f"the name of the object ({name}) does not match the name on "
                                f"the URL ({key[1]})")
        self._place(res, meta, key[0] if res.namespaced else None)
        old_meta = stored.obj["metadata"]
        if meta.get("uid") not in (None, "", old_meta["uid"]):
            raise _conflict(res, name, f"Precondition failed: UID in precondition: "
                                       f"{meta['uid']}, UID in object meta: {old_meta['uid']}")
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise _conflict(res, name, _STALE)
        meta["uid"] = old_meta["uid"]
        meta["creationTimestamp"] = old_meta.get("creationTimestamp")
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        return self._commit(res, key, "MODIFIED", obj, stored)

    def patch(self, res: Resource, key: tuple[str, str], apply: Callable[[Any, Any], Any],
              patch: Any) -> _Stored:
        # A patch that sets metadata.resourceVersion is a compare-and-set: replace() checks it.
        doc = orjson.loads(self.get(res, key).raw)
        return self.replace(res, key, apply(doc, patch))

    def delete(self, res: Resource, key: tuple[str, str], preconditions: dict) -> _Stored:
        stored = self.get(res, key)
        meta = stored.obj["metadata"]
        if preconditions.get("uid") not in (None, meta["uid"]):
            raise _conflict(res, key[1], f"Precondition failed: UID in precondition: "
                                         f"{preconditions['uid']}, UID in object meta: {meta['uid']}")
        if preconditions.get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise _conflict(res, key[1], _STALE)
        # Only the top level and metadata change, so share the rest with the stored version.
        gone = {**stored.obj, "metadata": {**meta}}
        return self._commit(res, key, "DELETED", gone, stored)

    def bind(self, namespace: str, binding: Any, name: str) -> None:
        """The pods/binding subresource: set spec.nodeName once, as the scheduler does."""
        pods = RESOURCES["pods"]
        if not isinstance(binding, dict) or not isinstance(binding.get("target"), dict):
            raise ApiError(400, "a Binding needs a target")
        meta = binding.get("metadata") or {}
        if meta.get("name") not in (None, "", name):
            raise ApiError(400, "name in URL does not match name in Binding object")
        node = binding["target"].get("name")
        if not node or binding["target"].get("kind") not in (None, "", "Node"):
            raise ApiError(422, f'Binding "{name}" is invalid: target: must be a Node with a name')
        stored = self.get(pods, (namespace, name))
        pod = orjson.loads(stored.raw)
        if meta.get("uid") not in (None, "", pod["metadata"]["uid"]):
            raise _conflict(_BINDINGS, name, f"Precondition failed: UID in precondition: "
                                             f"{meta['uid']}, UID in object meta: {pod['metadata']['uid']}")
        if bound := (pod.get("spec") or {}).get("nodeName"):
            raise ApiError(409, f'Operation cannot be fulfilled on pods/binding "{name}": '
                                f'pod {name} is already assigned to node "{bound}"',
                           reason="Conflict", details=_details(_BINDINGS, name))
        pod.setdefault("spec", {})["nodeName"] = node
        if annotations := meta.get("annotations"):   # the apiserver copies these onto the pod
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        # And its labels, with PodTopologyLabelsAdmission (on by default since Kubernetes 1.35);
        # an older API server drops them (binding_labels=False).
        if self.binding_labels and (labels := meta.get("labels")):
            pod["metadata"].setdefault("labels", {}).update(labels)
        status = pod.setdefault("status", {})
        status["conditions"] = [c for c in status.get("conditions") or []
                                if c.get("type") != "PodScheduled"]
        status["conditions"].append({"type": "PodScheduled", "status": "True",
                                     "lastTransitionTime": _now()})
        self._commit(pods, (namespace, name), "MODIFIED", pod, stored)

    # -- reads ------------------------------------------------------------------------------

    def select(self, res: Resource, namespace: str | None, match: Matcher | None) -> list[_Stored]:
        """Matching objects in key order, as a real server lists them."""
        items = self.objects[res.plural]
        if (keys := self._sorted[res.plural]) is None:
            keys = self._sorted[res.plural] = sorted(items)
        if namespace is None and match is None:
            return [items[k] for k in keys]
        return [items[k] for k in keys if (namespace is None or k[0] == namespace)
                and (match is None or match(items[k].obj))]

    def snapshot(self, raws: list[bytes]) -> int:
        """Keep a list for its continue tokens: later pages see the first page's state."""
        self._expire_snapshots()
        self._snapshot_ids += 1
        self.snapshots[self._snapshot_ids] = (time.monotonic(), str(self.rv), raws)
        return self._snapshot_ids

    def _expire_snapshots(self) -> None:
        deadline = time.monotonic() - _SNAPSHOT_TTL
        while self.snapshots and (len(self.snapshots) >= _MAX_SNAPSHOTS
                                  or next(iter(self.snapshots.values()))[0] < deadline):
            self.snapshots.popitem(last=False)

    # -- watches ----------------------------------------------------------------------------

    def watch(self, res: Resource, watcher: _Watcher, since: int | None) -> None:
        """Queue the backlog and register, in one synchronous step so no event is lost."""
        if since is None:
            for stored in self.select(res, watcher.namespace, watcher.match):
                watcher.pending.append(_event_line("ADDED", stored.raw))
        else:
            if since < self.compacted[res.plural]:
                raise ApiError(410, f"too old resource version: {since} "
                                    f"({self.compacted[res.plural]})")
            backlog = []
            for event in reversed(self.history[res.plural]):
                if event.rv <= since:
                    break
                backlog.append(event)
            for event in reversed(backlog):
                watcher.offer(event)
        self.watchers[res.plural].add(watcher)

    def bookmark(self) -> None:
        rv = str(self.rv)
        for plural, watchers in self.watchers.items():
            res = RESOURCES[plural]
            line = b'{"type":"BOOKMARK","object":%s}\n' % orjson.dumps(
                {"kind": res.kind, "apiVersion": res.api_version,
                 "metadata": {"resourceVersion": rv}})
            for watcher in watchers:
                if watcher.bookmarks:
                    watcher.push(line)

    def abort_watchers(self) -> None:
        for watchers in self.watchers.values():
            for watcher in watchers:
                watcher.abort()
            watchers.clear()

    def compact(self) -> None:
        for plural, history in self.history.items():
            history.clear()
            self.compacted[plural] = self.rv
        self.snapshots.clear()    # continue tokens older than a compaction expire too



@dataclass(eq=False)
class Fault:
    """One injected failure; ``hits`` counts the requests it caught."""
    method: str | None
    path: re.Pattern | None
    status: int = 500
    retry_after: float | None = None
    hang: bool = False
    times: int | None = 1
    delay: float | None = None
    after_apply: bool = False
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or self.path.search(path) is not None))

    def error(self) -> ApiError:
        message = ("Too many requests, please try again later." if self.status == 429
                   else f"Internal error occurred: injected fault ({self.status})")
        details = None if self.retry_after is None else {
            "retryAfterSeconds": math.ceil(self.retry_after)}
        return ApiError(self.status, message, retry_after=self.retry_after, details=details)


class FaultSet:
    """The faults a server applies, first match wins; hung requests wait here for release."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._released = asyncio.Event()

    def add(self, *, method: str | None = None, path: str | None = None, status: int = 500,
            retry_after: float | None = None, hang: bool = False, times: int | None = 1,
            delay: float | None = None, after_apply: bool = False) -> Fault:
        """Fail (``status``), stall (``hang``) or slow down (``delay``) matching requests.

        ``after_apply`` serves the request first and then answers with the error anyway: the
        write landed but the client saw a failure (a timeout after commit). Not for watches.
        """
        fault = Fault(method.upper() if method else None, re.compile(path) if path else None,
                      status, retry_after, hang, times, delay, after_apply)
        self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Forget every fault; requests hung by one are served normally."""
        self._faults.clear()
        self.release()

    def take(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.matches(method, path):
                fault.hits += 1
                if fault.times is not None and fault.hits >= fault.times:
                    self._faults.remove(fault)
                return fault
        return None

    def release(self) -> None:
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def wait_released(self) -> None:
        await self._released.wait()



def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def _error_response(err: ApiError) -> web.Response:
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(math.ceil(err.retry_after))
    return web.Response(body=orjson.dumps(err.status()), status=err.code, headers=headers,
                        content_type="application/json")


def _parse_path(path: str) -> tuple[Resource, str | None, str | None, str | None]:
    """``(resource, namespace, name, subresource)`` for a resource URL, or 404."""
    parts = path.strip("/").split("/")
    for prefix, api_version in _API_PREFIXES.items():
        if tuple(parts[:len(prefix)]) == prefix:
            rest = parts[len(prefix):]
            break
    else:
        raise ApiError(404, "the server could not find the requested resource", details={})
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    res = RESOURCES.get(rest[0] if rest else "")
    if (res is None or res.api_version != api_version or len(rest) > 3 or "" in rest
            or (namespace is not None and not res.namespaced)
            or (namespace is None and res.namespaced and len(rest) > 1)):
        raise ApiError(404, "the server could not find the requested resource", details={})
    return res, namespace, (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)


# Go's strconv.ParseBool spellings; kubernetes-asyncio sends Python's "True".
_TRUE = frozenset(("1", "t", "T", "true", "TRUE", "True"))


def _int_param(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"invalid {name}: {value!r}") from None


async def _read_json(request: web.Request, *, optional: bool = False) -> Any:
    body = await request.read()
    if not body and optional:
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None


def _require_json(request: web.Request) -> None:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type not in ("", "application/json", "*/*"):
        raise ApiError(415, 'the body of the request was in an unknown format - accepted media '
                            'types include: application/json')


async def _write_lines(response: web.StreamResponse, lines: list[bytes]) -> None:
    batch: list[bytes] = []
    size = 0
    for line in lines:
        batch.append(line)
        size += len(line)
        if size >= _WRITE_CHUNK:
            await response.write(b"".join(batch))
            batch, size = [], 0
    if batch:
        await response.write(b"".join(batch))


class FakeApiServer:
    """A kube-apiserver stand-in on 127.0.0.1; see the module docstring for what it models.

    ``history_limit`` bounds the watch history of each resource type (older resourceVersions get
    410 Expired); ``bookmark_interval`` (seconds) sends BOOKMARKs periodically to watches that
    allow them. State lives in this object, so it survives stop() and start() again.
    """

    def __init__(self, *, history_limit: int = 10000, bookmark_interval: float | None = None,
                 binding_labels: bool = True) -> None:
        """``binding_labels=False``: a Binding's labels are dropped, as before Kubernetes 1.35."""
        self._store = _Store(history_limit=history_limit)
        self._store.binding_labels = binding_labels
        self.bookmark_interval = bookmark_interval
        self.faults = FaultSet()
        self.tokens: dict[str, dict] = {}   # TokenReview: token -> user (add_token)
        self.requests: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=100_000)
        self.url: str | None = None
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._bookmark_task: asyncio.Task | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port); after stop(), serves the same state."""
        if host != "127.0.0.1":
            raise ValueError("the fake API server only binds to 127.0.0.1")
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A short shutdown timeout: stop() has already ended every long-running request.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        self.url = f"http://{host}:{self.port}"
        if self.bookmark_interval:
            self._bookmark_task = asyncio.create_task(self._bookmark_loop(self.bookmark_interval))
        return self.url

    async def stop(self) -> None:
        """Go away like a killed process: cut watches and hung requests, close the socket."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        if self._bookmark_task is not None:
            self._bookmark_task.cancel()
            self._bookmark_task = None
        self._store.abort_watchers()
        self.faults.release()
        await runner.cleanup()

    async def _bookmark_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.send_bookmarks()

    # -- in-process access (tests, seeding) ------------------------------------------------

    @staticmethod
    def _resource(kind_plural: str) -> Resource:
        if kind_plural not in RESOURCES:
            raise KeyError(f"unknown resource {kind_plural!r}; known: {sorted(RESOURCES)}")
        return RESOURCES[kind_plural]

    @staticmethod
    def _key(res: Resource, name: str, namespace: str | None) -> tuple[str, str]:
        return (namespace or "default", name) if res.namespaced else ("", name)

    def create(self, kind_plural: str, obj: dict) -> dict:
        """Create like POST (raises ApiError on conflicts); returns a private copy."""
        res = self._resource(kind_plural)
        return orjson.loads(self._store.create(res, _owned_copy(obj), namespace=None).raw)

    def get(self, kind_plural: str, name: str, namespace: str | None = None) -> dict | None:
        res = self._resource(kind_plural)
        stored = self._store.objects[res.plural].get(self._key(res, name, namespace))
        return None if stored is None else orjson.loads(stored.raw)

    def update(self, kind_plural: str, obj: dict) -> dict:
        """Replace like PUT, including the resourceVersion check; raises ApiError."""
        res = self._resource(kind_plural)
        meta = obj.get("metadata") or {}
        key = self._key(res, meta.get("name", ""), meta.get("namespace"))
        return orjson.loads(self._store.replace(res, key, _owned_copy(obj)).raw)

    def patch(self, kind_plural: str, name: str, patch: dict, namespace: str | None = None) -> dict:
        """Merge-patch like PATCH; raises ApiError."""
        res = self._resource(kind_plural)
        key = self._key(res, name, namespace)
        return orjson.loads(self._store.patch(res, key, merge_patch, _owned_copy(patch)).raw)

    def delete(self, kind_plural: str, name: str, namespace: str | None = None) -> dict:
        """Delete like DELETE; raises ApiError (404) when absent."""
        res = self._resource(kind_plural)
        return orjson.loads(self._store.delete(res, self._key(res, name, namespace), {}).raw)

    def list(self, kind_plural: str, namespace: str | None = None) -> list[dict]:
        res = self._resource(kind_plural)
        return [orjson.loads(s.raw) for s in self._store.select(res, namespace, None)]

    @property
    def resource_version(self) -> int:
        return self._store.rv

    @property
    def open_watches(self) -> int:
        """Watch streams currently open, so tests can wait for a client to be watching."""
        return sum(len(w) for w in self._store.watchers.values())

    def compact(self) -> None:
        """Drop all watch history (and continue tokens), like an etcd compaction."""
        self._store.compact()

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to watches that allow them."""
        self._store.bookmark()

    def pace_watches(self, kind_plural: str, *, rate: float | None) -> list[_Watcher]:
        """Hold (``rate`` 0), pace (``rate`` lines a second from now) or free (None) the delivery
        of the open watches of one resource type; the watchers, for their queues and ``marks``.

        For benchmarks: commit a long stream while held, then release it at a set rate, to
        measure a client at an event rate this Python stand-in could not commit live."""
        watchers = list(self._store.watchers[self._resource(kind_plural).plural])
        now = time.monotonic()
        for watcher in watchers:
            watcher.rate, watcher.t0, watcher.sent, watcher.marks = rate, now, 0, []
            watcher.wake.set()
        return watchers

    def drop_watches(self) -> None:
        """Abruptly cut every open watch connection, as a network failure would."""
        self._store.abort_watchers()

    # -- HTTP -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.query_string))
        try:
            fault = self.faults.take(request.method, request.path)
            if fault is None or await self._stall(request, fault):
                return await self._route(request)
            if fault.after_apply:
                await self._route(request)
            raise fault.error()
        except ApiError as err:
            return _error_response(err)
        except ConnectionError:
            raise
        except Exception as err:  # a bug here must not look like a hung server
            log.exception("fakeapi.request_failed", method=request.method, path=request.path)
            return _error_response(ApiError(500, f"Internal error occurred: {err!r}"))

    async def _stall(self, request: web.Request, fault: Fault) -> bool:
        """Apply a delay or hang fault; True when the request should then be served normally."""
        if fault.delay is not None:
            await asyncio.sleep(fault.delay)
            return True
        if not fault.hang:
            return False
        await self.faults.wait_released()
        if self._runner is None:   # stopped while the request hung: cut it like a kill
            if request.transport is not None:
                request.transport.abort()
            raise ApiError(503, "the server is shutting down")
        return True

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(_VERSION)
        if path == TOKEN_REVIEWS and method == "POST":
            return _json(orjson.dumps(self._review(await _read_json(request))), 201)
        res, namespace, name, sub = _parse_path(path)
        if name is None:
            if method == "GET":
                query = request.query
                if query.get("watch") in _TRUE:
                    return await self._watch(request, res, namespace)
                return self._list(res, namespace, query)
            if method == "POST" and (namespace is not None or not res.namespaced):
                _require_json(request)
                stored = self._store.create(res, await _read_json(request), namespace=namespace)
                return _json(stored.raw, 201)
        elif sub in (None, "status"):
            return await self._object(request, res, self._key(res, name, namespace))
        elif sub == "eviction" and res.plural == "pods" and method == "POST":
            self._evict(namespace, name, await _read_json(request))
            return _json(b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",'
                         b'"code":201}', 201)
        elif sub == "binding" and res.plural == "pods" and method == "POST":
            self._store.bind(namespace, await _read_json(request), name)
            return _json(b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",'
                         b'"code":201}', 201)
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def add_token(self, token: str, username: str, *, pod: dict | None = None) -> None:
        """Make ``token`` authenticate as ``username``; with ``pod``, bound to that pod (the
        ``authentication.kubernetes.io/pod-name`` and ``pod-uid`` extras of a projected token)."""
        extra = {}
        if pod is not None:
            meta = pod["metadata"]
            extra = {"authentication.kubernetes.io/pod-name": [meta["name"]],
                     "authentication.kubernetes.io/pod-uid": [meta["uid"]]}
        self.tokens[token] = {"username": username, "uid": f"uid-{username}", "extra": extra}

    def _review(self, review: Any) -> dict:
        """authentication.k8s.io/v1 TokenReview against the tokens ``add_token`` made."""
        token = ((review or {}).get("spec") or {}).get("token") if isinstance(review, dict) else None
        if not isinstance(token, str) or not token:
            raise ApiError(422, "TokenReview.authentication.k8s.io is invalid: spec.token: Required value")
        user = self.tokens.get(token)
        status = {"authenticated": True, "user": user} if user else {"authenticated": False,
                                                                    "error": "invalid bearer token"}
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                "spec": {"token": token}, "status": status}

    def _evict(self, namespace: str, name: str, eviction: Any) -> None:
        """pods/eviction (hami_py/fakeapi/disruption.py): the budgets decide, then the delete."""
        pods = RESOURCES["pods"]
        if not isinstance(eviction, dict) or (eviction.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "name in URL does not match name in Eviction object")
        pod = self._store.get(pods, (namespace, name)).obj
        options = eviction.get("deleteOptions") or {}
        preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
        if preconditions.get("uid") not in (None, pod["metadata"]["uid"]):
            raise _conflict(pods, name, f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                                        f"UID in object meta: {pod['metadata']['uid']}")
        budgets = [s.obj for s in self._store.select(RESOURCES["poddisruptionbudgets"], namespace, None)]
        same_namespace = [s.obj for s in self._store.select(pods, namespace, None)]
        refusal = eviction_refusal(pod, budgets, same_namespace)
        if refusal is not None:
            code, message, details = refusal
            raise ApiError(code, message, details=details)
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return   # already terminating: allowed, nothing more to do
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        if isinstance(grace, int) and grace > 0 and (pod.get("spec") or {}).get("nodeName"):
            # A bound pod with a grace period only starts terminating: its kubelet (here: the test,
            # with api.delete) removes it once its containers have stopped.
            self._store.patch(pods, (namespace, name), merge_patch, {"metadata": {
                "deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}})
            return
        self._store.delete(pods, (namespace, name), preconditions)

    async def _object(self, request: web.Request, res: Resource,
                      key: tuple[str, str]) -> web.Response:
        method = request.method
        if method == "GET":
            return _json(self._store.get(res, key).raw)
        if method == "PUT":
            _require_json(request)
            return _json(self._store.replace(res, key, await _read_json(request)).raw)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if (patcher := _PATCHERS.get(content_type)) is None:
                raise ApiError(415, f"the body of the request was in an unknown format - "
                                    f"accepted media types include: {', '.join(_PATCHERS)}")
            return _json(self._store.patch(res, key, patcher, await _read_json(request)).raw)
        if method == "DELETE":
            options = await _read_json(request, optional=True)
            preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
            return _json(self._store.delete(res, key, preconditions).raw)
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _list(self, res: Resource, namespace: str | None, query: Any) -> web.Response:
        limit = _int_param(query, "limit") or 0
        if token := query.get("continue"):
            snapshot_id, start = self._decode_continue(token)
            if (snapshot := self._store.snapshots.get(snapshot_id)) is None:
                raise ApiError(410, "The provided continue parameter is too old to display a "
                                    "consistent list result. You can start a new list without "
                                    "the continue parameter.")
            _, rv, raws = snapshot
        else:
            match = compile_selectors(query.get("labelSelector", ""), query.get("fieldSelector", ""))
            raws = [s.raw for s in self._store.select(res, namespace, match)]
            rv, start, snapshot_id = str(self._store.rv), 0, None
            if 0 < limit < len(raws):
                snapshot_id = self._store.snapshot(raws)
        end = start + limit if limit > 0 else len(raws)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if end < len(raws):
            meta["continue"] = self._encode_continue(snapshot_id, end, rv)
            meta["remainingItemCount"] = len(raws) - end
        return _json(b'{"kind":"%sList","apiVersion":"%s","metadata":%s,"items":[%s]}' % (
            res.kind.encode(), res.api_version.encode(), orjson.dumps(meta),
            b",".join(raws[start:end])))

    @staticmethod
    def _encode_continue(snapshot_id: int | None, start: int, rv: str) -> str:
        token = {"v": "meta.k8s.io/v1", "rv": int(rv), "snapshot": snapshot_id, "start": start}
        return base64.urlsafe_b64encode(orjson.dumps(token)).decode()

    @staticmethod
    def _decode_continue(token: str) -> tuple[int, int]:
        try:
            decoded = orjson.loads(base64.urlsafe_b64decode(token.encode()))
            return int(decoded["snapshot"]), int(decoded["start"])
        except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
            raise ApiError(400, f"continue key is not valid: {token!r}") from None

    async def _watch(self, request: web.Request, res: Resource,
                     namespace: str | None) -> web.StreamResponse:
        query = request.query
        since = _int_param(query, "resourceVersion") or None      # absent and "0": full state
        timeout = _int_param(query, "timeoutSeconds")
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        watcher = _Watcher(
            namespace=namespace, bookmarks=query.get("allowWatchBookmarks") in _TRUE,
            match=compile_selectors(query.get("labelSelector", ""), query.get("fieldSelector", "")))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            self._store.watch(res, watcher, since)
        except ApiError as err:
            if err.code != 410:
                raise
            # A real server answers an expired watch with 200 and a single ERROR event.
            await response.prepare(request)
            await response.write(b'{"type":"ERROR","object":%s}\n' % orjson.dumps(err.status()))
            await response.write_eof()
            return response
        watcher.transport = request.transport
        try:
            await response.prepare(request)
            if await self._pump(response, watcher, deadline):
                await response.write_eof()
        except ConnectionError:
            pass      # the client went away; nothing to tell it
        finally:
            self._store.watchers[res.plural].discard(watcher)
        return response

    @staticmethod
    async def _pump(response: web.StreamResponse, watcher: _Watcher, deadline: float | None) -> bool:
        """Stream queued lines until timed out (True) or cut (False)."""
        while not watcher.cut:
            if watcher.pending and (lines := watcher.next_lines()):
                await _write_lines(response, lines)
                if watcher.rate is not None:
                    watcher.sent += len(lines)
                    watcher.marks.append((watcher.sent, time.monotonic()))
                continue
            if watcher.pending and watcher.rate:
                await asyncio.sleep(_PACE_TICK_S)      # paced, and ahead of the pace
                continue
            watcher.wake.clear()
            try:
                # A held or paced watch does not time out: the measurement it serves would be lost.
                async with asyncio.timeout_at(deadline if watcher.rate is None else None):
                    await watcher.wake.wait()
            except TimeoutError:
                return True
        return False


def write_kubeconfig(path: str | Path, url: str, *, namespace: str = "default") -> str | Path:
    """Write a kubeconfig that points kubernetes-asyncio (or kubectl) at ``url``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": namespace}}],
        "current-context": "fake",
        "preferences": {},
    }
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
    return path

"""The in-repo API server's state: objects, the resourceVersion counter and the watch history.

Why a module of its own: the semantics clients depend on (optimistic concurrency, consistent
paged snapshots, history replay and 410 Expired, the binding subresource) live here, apart from
HTTP. Speed: every stored object is an immutable dict kept next to its orjson bytes. Reads (GET,
LIST, watch replay) reuse the bytes, writes replace both (copy on write).
"""
from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, NamedTuple

import orjson

from hami_py.fakeapi.errors import STALE, ApiError, conflict, not_found, status_details
from hami_py.fakeapi.resources import BINDINGS, RESOURCES, Resource
from hami_py.fakeapi.label_selectors import Matcher
from hami_py.fakeapi.watch import Event, Watcher, event_line

_SNAPSHOT_TTL = 300.0      # seconds a continue token stays valid (a real server: until compaction)
_MAX_SNAPSHOTS = 256       # bounds memory when callers abandon paged lists


class _Stored(NamedTuple):
    obj: dict       # never mutated once stored: writers build a new dict (copy on write)
    raw: bytes      # orjson of obj, reused by GET, LIST and watch


_clock = [0, ""]    # (second, its timestamp): creating 40k objects should not format 40k dates


def timestamp() -> str:
    """Now, as metadata timestamps are written (one-second resolution, UTC)."""
    second = int(time.time())
    if second != _clock[0]:
        _clock[:] = second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
    return _clock[1]


def _uid() -> str:
    """A random (version 4) UUID, formatted directly: uuid.uuid4() is slow when seeding."""
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


class Store:
    """All objects, the resourceVersion counter, the watch history and the open watchers."""

    def __init__(self, *, history_limit: int) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], _Stored]] = {p: {} for p in RESOURCES}
        self.history = {p: collections.deque(maxlen=history_limit) for p in RESOURCES}
        self.compacted = {p: 0 for p in RESOURCES}   # events up to this RV are gone
        self.watchers: dict[str, set[Watcher]] = {p: set() for p in RESOURCES}
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
        event = Event(self.rv, type_, key[0], obj, prev.obj if prev else None, stored.raw)
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
                           reason="AlreadyExists", details=status_details(res, meta["name"]))
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        meta.setdefault("uid", _uid())
        meta.setdefault("creationTimestamp", timestamp())
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
            raise not_found(res, key[1])
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
            raise conflict(res, name, f"Precondition failed: UID in precondition: "
                                       f"{meta['uid']}, UID in object meta: {old_meta['uid']}")
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise conflict(res, name, STALE)
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
            raise conflict(res, key[1], f"Precondition failed: UID in precondition: "
                                         f"{preconditions['uid']}, UID in object meta: {meta['uid']}")
        if preconditions.get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise conflict(res, key[1], STALE)
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
            raise conflict(BINDINGS, name, f"Precondition failed: UID in precondition: "
                                             f"{meta['uid']}, UID in object meta: {pod['metadata']['uid']}")
        if bound := (pod.get("spec") or {}).get("nodeName"):
            raise ApiError(409, f'Operation cannot be fulfilled on pods/binding "{name}": '
                                f'pod {name} is already assigned to node "{bound}"',
                           reason="Conflict", details=status_details(BINDINGS, name))
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
                                     "lastTransitionTime": timestamp()})
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

    def watch(self, res: Resource, watcher: Watcher, since: int | None) -> None:
        """Queue the backlog and register, in one synchronous step so no event is lost."""
        if since is None:
            for stored in self.select(res, watcher.namespace, watcher.match):
                watcher.pending.append(event_line("ADDED", stored.raw))
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

"""An in-repo fake kube-apiserver for tests, benchmarks and the ``make run`` demo.

Why: the extender talks to Kubernetes through kubernetes-asyncio and raw aiohttp. Mocking those
clients would test our mocks, so this module serves the real REST paths over loopback HTTP with the
real semantics the code depends on: one global resourceVersion, Status error objects, optimistic
concurrency (409 Conflict), limit/continue paging over a consistent snapshot, watches that replay
history from a resourceVersion, bookmarks, ``410 Expired`` after compaction, the pod binding
subresource, TokenReviews (``add_token``) and SubjectAccessReviews (who may write Nodes:
``node_writers``), and fault injection (errors, 429 + Retry-After, hangs, delays, cut watches, restarts).

This module is the server itself (lifecycle, in-process access, request dispatch); the rest lives
beside it, one job a module: resources.py (what is served), errors.py (Status errors), wire.py
(URLs, query parameters, bodies), selectors.py, patch.py, store.py (objects, resourceVersions,
history), watch.py (watch streams) and faults.py (fault injection).

Deliberate simplifications: a strategic merge patch is applied as an RFC 7386 merge patch (fine for
the metadata maps we patch; lists are replaced, never merged by key); server-side apply, protobuf,
graceful pod deletion, admission and validation beyond names are not implemented; any dotted path
is accepted as a field selector (a real server allows only a per-kind list); every write bumps the
resourceVersion, even a no-op one (a real server skips no-op writes).
"""
from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path
from typing import Any

import orjson
import structlog
import yaml
from aiohttp import web

from hami_py.fakeapi.disruption import eviction_refusal
from hami_py.fakeapi.errors import ApiError, conflict
from hami_py.fakeapi.faults import Fault, FaultSet
from hami_py.fakeapi.patch import PATCHERS, merge_patch
from hami_py.fakeapi.resources import CRD_RESOURCES, RESOURCES, Resource
from hami_py.fakeapi.label_selectors import compile_selectors
from hami_py.fakeapi.store import Store, timestamp
from hami_py.fakeapi.watch import Watcher, pump
from hami_py.fakeapi.wire import (
    TRUE, decode_continue, encode_continue, error_response, int_param, json_response, parse_path, read_json,
    require_json)
from hami_py.k8s.accessreview import SUBJECT_ACCESS_REVIEWS
from hami_py.k8s.tokenreview import TOKEN_REVIEWS

log = structlog.get_logger()

_VERSION = orjson.dumps({
    "major": "1", "minor": "31", "gitVersion": "v1.31.0", "gitTreeState": "clean",
    "gitCommit": "9ea7c6b4e1c4d8e5e1e8c6d8f3f0b6d1e1a2b3c4", "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
    "compiler": "gc", "platform": "linux/amd64"})


# Who the fake's SubjectAccessReviews let write Nodes by default: the manifests' scheduler and the
# device plugin's account, in the manifests' namespace and in kube-system, where HAMi's chart
# runs its device plugins.
NODE_WRITERS = ("system:serviceaccount:hami-system:hami-scheduler", "system:serviceaccount:hami-system:hami-device-plugin",
                "system:serviceaccount:kube-system:hami-device-plugin")


def _owned_copy(obj: Any) -> Any:
    """A deep copy that shares nothing with the caller (orjson round trip beats deepcopy)."""
    return orjson.loads(orjson.dumps(obj))


class FakeApiServer:
    """A kube-apiserver stand-in on 127.0.0.1; see the module docstring for what it models.

    ``history_limit`` bounds the watch history of each resource type (older resourceVersions get
    410 Expired); ``bookmark_interval`` (seconds) sends BOOKMARKs periodically to watches that
    allow them. State lives in this object, so it survives stop() and start() again.
    """

    def __init__(self, *, history_limit: int = 10000, bookmark_interval: float | None = None,
                 binding_labels: bool = True, podgroups: bool = False) -> None:
        """``binding_labels=False``: a Binding's labels are dropped, as before Kubernetes 1.35.
        ``podgroups=True``: scheduler-plugins' PodGroup CRD is installed (else its URLs are 404)."""
        self.crds = {"podgroups"} if podgroups else set()
        self._store = Store(history_limit=history_limit)
        self._store.binding_labels = binding_labels
        self.bookmark_interval = bookmark_interval
        self.faults = FaultSet()
        self.tokens: dict[str, dict] = {}   # TokenReview: token -> user (add_token)
        # SubjectAccessReview: who may write (update, patch) Nodes; everything else is refused.
        self.node_writers: set[str] = set(NODE_WRITERS)
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

    def pace_watches(self, kind_plural: str, *, rate: float | None) -> list[Watcher]:
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
            return error_response(err)
        except ConnectionError:
            raise
        except Exception as err:  # a bug here must not look like a hung server
            log.exception("fakeapi.request_failed", method=request.method, path=request.path)
            return error_response(ApiError(500, f"Internal error occurred: {err!r}"))

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
            return json_response(_VERSION)
        if path == TOKEN_REVIEWS and method == "POST":
            return json_response(orjson.dumps(self._review(await read_json(request))), 201)
        if path == SUBJECT_ACCESS_REVIEWS and method == "POST":
            return json_response(orjson.dumps(self._access_review(await read_json(request))), 201)
        res, namespace, name, sub = parse_path(path)
        if res.plural in CRD_RESOURCES and res.plural not in self.crds:
            raise ApiError(404, "the server could not find the requested resource")
        if name is None:
            if method == "GET":
                query = request.query
                if query.get("watch") in TRUE:
                    return await self._watch(request, res, namespace)
                return self._list(res, namespace, query)
            if method == "POST" and (namespace is not None or not res.namespaced):
                require_json(request)
                stored = self._store.create(res, await read_json(request), namespace=namespace)
                return json_response(stored.raw, 201)
        elif sub in (None, "status"):
            return await self._object(request, res, self._key(res, name, namespace))
        elif sub == "eviction" and res.plural == "pods" and method == "POST":
            self._evict(namespace, name, await read_json(request))
            return json_response(b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",'
                         b'"code":201}', 201)
        elif sub == "binding" and res.plural == "pods" and method == "POST":
            self._store.bind(namespace, await read_json(request), name)
            return json_response(b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",'
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

    def _access_review(self, review: Any) -> dict:
        """authorization.k8s.io/v1 SubjectAccessReview: ``update`` and ``patch`` of ``nodes``
        (core group) are allowed to the users in ``node_writers`` and to ``system:masters``;
        everything else is refused, with no opinion, as RBAC refuses."""
        spec = (review or {}).get("spec") if isinstance(review, dict) else None
        if not isinstance(spec, dict) or not (spec.get("user") or spec.get("groups")):
            raise ApiError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.user: Invalid value: "
                                '"": at least one of user or group must be specified')
        attributes = spec.get("resourceAttributes") or {}
        allowed = ("system:masters" in (spec.get("groups") or []) or (
            spec.get("user") in self.node_writers and attributes.get("group", "") == ""
            and attributes.get("resource") == "nodes" and attributes.get("verb") in ("update", "patch")))
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
                "spec": spec, "status": {"allowed": allowed}}

    def _evict(self, namespace: str, name: str, eviction: Any) -> None:
        """pods/eviction (hami_py/fakeapi/disruption.py): the budgets decide, then the delete."""
        pods = RESOURCES["pods"]
        if not isinstance(eviction, dict) or (eviction.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError(400, "name in URL does not match name in Eviction object")
        pod = self._store.get(pods, (namespace, name)).obj
        options = eviction.get("deleteOptions") or {}
        preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
        if preconditions.get("uid") not in (None, pod["metadata"]["uid"]):
            raise conflict(pods, name, f"Precondition failed: UID in precondition: {preconditions['uid']}, "
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
                "deletionTimestamp": timestamp(), "deletionGracePeriodSeconds": grace}})
            return
        self._store.delete(pods, (namespace, name), preconditions)

    async def _object(self, request: web.Request, res: Resource,
                      key: tuple[str, str]) -> web.Response:
        method = request.method
        if method == "GET":
            return json_response(self._store.get(res, key).raw)
        if method == "PUT":
            require_json(request)
            return json_response(self._store.replace(res, key, await read_json(request)).raw)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if (patcher := PATCHERS.get(content_type)) is None:
                raise ApiError(415, f"the body of the request was in an unknown format - "
                                    f"accepted media types include: {', '.join(PATCHERS)}")
            return json_response(self._store.patch(res, key, patcher, await read_json(request)).raw)
        if method == "DELETE":
            options = await read_json(request, optional=True)
            preconditions = (options.get("preconditions") or {}) if isinstance(options, dict) else {}
            return json_response(self._store.delete(res, key, preconditions).raw)
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _list(self, res: Resource, namespace: str | None, query: Any) -> web.Response:
        limit = int_param(query, "limit") or 0
        if token := query.get("continue"):
            snapshot_id, start = decode_continue(token)
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
            meta["continue"] = encode_continue(snapshot_id, end, rv)
            meta["remainingItemCount"] = len(raws) - end
        return json_response(b'{"kind":"%sList","apiVersion":"%s","metadata":%s,"items":[%s]}' % (
            res.kind.encode(), res.api_version.encode(), orjson.dumps(meta),
            b",".join(raws[start:end])))

    async def _watch(self, request: web.Request, res: Resource,
                     namespace: str | None) -> web.StreamResponse:
        query = request.query
        since = int_param(query, "resourceVersion") or None      # absent and "0": full state
        timeout = int_param(query, "timeoutSeconds")
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        watcher = Watcher(
            namespace=namespace, bookmarks=query.get("allowWatchBookmarks") in TRUE,
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
            if await pump(response, watcher, deadline):
                await response.write_eof()
        except ConnectionError:
            pass      # the client went away; nothing to tell it
        finally:
            self._store.watchers[res.plural].discard(watcher)
        return response


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

"""The extender's HTTP surface: /filter, /bind, /prioritize (--filter-mode=all), /preempt,
/healthz, /readyz; the cluster-facing listener (/webhook, /refit, the probes) when the extender
has its own (``--extender-bind``); and /metrics on its own port.

The /webhook and /refit handlers are built in :mod:`hami_py.http.webhook` and
:mod:`hami_py.http.refit`.

kube-scheduler treats any answer that is not a well-formed result as an extender failure, and
upstream's contract is that errors travel inside an HTTP 200 body with ``Error`` set. So every
way a request can be wrong (oversized, not JSON, nested too deep, missing fields) ends in such a
body with a precise message, and only a result we cannot serialise is a 500.
"""
from __future__ import annotations

import asyncio
import time

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hami_py.http.gc_pacing import collect_young, collection_due
from hami_py.http.node_names import NodeNamesDecoder
from hami_py.http.args import binding_args_error, extender_args_error, may_nest_deeper, nesting_error
from hami_py.metrics import Metrics
from hami_py.scheduling.verbs.service import SchedulerService, filter_result

log = structlog.get_logger(__name__)

DEFAULT_BODY_LIMIT = 1 << 20
_JSON = "application/json"


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; more is an error, never a silent truncation."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge()
    content = request.content
    if content.is_eof():
        # The whole body is in already (the usual case on a local connection): taken as it
        # is, without a round through the stream's iterator and the event loop for each chunk.
        body = content.read_nowait(-1)
        if len(body) > limit:
            raise BodyTooLarge()
        return body
    chunks = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: web.Request, limit: int, *, empty: str = "empty request body: EOF",
                    invalid: str = "invalid JSON request body", loads=orjson.loads):
    """(decoded body, None) or (None, error message): size-limited, JSON, nesting bounded (so
    whatever is echoed back can be written out again and never recurses too deep). ``empty``
    and ``invalid`` word the errors for the verb's callers; ``loads`` decodes (ExtenderArgs: a
    NodeNamesDecoder's, which does not decode a repeated node list again)."""
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        return None, f"request body exceeds the limit of {limit} bytes"
    if not body.strip():
        return None, empty
    try:
        value = loads(body)
    except orjson.JSONDecodeError as exc:
        return None, f"{invalid}: {exc}"
    error = nesting_error(value) if may_nest_deeper(body) else None
    return (None, error) if error else (value, None)


def _respond(result: dict, what: str) -> web.Response:
    try:
        return web.Response(body=orjson.dumps(result), content_type=_JSON)
    except (TypeError, orjson.JSONEncodeError) as exc:
        body = orjson.dumps({**{k: None for k in result}, "Error": f"Failed to marshal {what} result: {exc}"})
        return web.Response(status=500, body=body, content_type=_JSON)


async def _answer(call, verb: str) -> dict:
    """The service's result; a bug of ours still gets an answer, never a dropped request."""
    try:
        return await call
    except Exception as exc:  # noqa: BLE001 - logged with its traceback, answered with its message
        log.exception("extender request failed unexpectedly", verb=verb)
        message = f"internal error in the extender {verb}: {type(exc).__name__}: {exc}"
        return filter_result(error=message) if verb == "filter" else {"Error": message}


def build_app(*, service: SchedulerService, metrics: Metrics, ready, body_limit: int = DEFAULT_BODY_LIMIT,
              extra_routes=None) -> web.Application:
    """``ready`` is a zero-argument callable: True once the initial lists are in."""

    # The verbs' own series, labelled once: a labels() call per request costs more than the count.
    filter_seconds, filter_errors = metrics.request_seconds.labels("filter"), metrics.request_errors.labels("filter")
    filter_args = NodeNamesDecoder()

    async def filter_handler(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        args, error = await read_json(request, body_limit, loads=filter_args.loads)
        error = error or extender_args_error(args)
        result = filter_result(error=error) if error else await _answer(service.filter(args), "filter")
        if result.get("Error"):
            filter_errors.inc()
        response = _respond(result, "extender filter")
        filter_seconds.observe(time.perf_counter() - t0)
        if collection_due():
            asyncio.get_running_loop().call_soon(collect_young)   # after the answer is written
        return response

    async def bind_handler(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        args, error = await read_json(request, body_limit)
        error = error or binding_args_error(args)
        result = {"Error": error} if error else await _answer(service.bind(args), "bind")
        if result.get("Error"):
            metrics.request_errors.labels("bind").inc()
        response = _respond(result, "binding")
        metrics.request_seconds.labels("bind").observe(time.perf_counter() - t0)
        return response

    app = web.Application(client_max_size=body_limit)
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/bind", bind_handler)
    app.router.add_post("/prioritize", prioritize_handler(service, metrics, body_limit))
    app.router.add_post("/preempt", preempt_handler(service, metrics, body_limit))
    add_probes(app, ready)
    for method, path, handler in extra_routes or ():
        app.router.add_route(method, path, handler)
    return app


def build_cluster_app(routes, *, ready, body_limit: int = DEFAULT_BODY_LIMIT) -> web.Application:
    """The cluster-facing listener: ``routes`` (``(method, path, handler)``: /webhook, /refit),
    ``/healthz`` and ``/readyz``, and nothing else. The listener the API server, the device
    plugins (and so the whole cluster network) can reach never serves ``/filter`` or ``/bind``,
    which change the cluster with the scheduler's credentials; the probes are here because the
    kubelet probes the pod's IP, which a loopback-only extender listener does not answer on."""
    app = web.Application(client_max_size=body_limit)
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    add_probes(app, ready)
    return app


def warn_unless_loopback(flag: str, host: str, why: str) -> None:
    """Upstream's rule for its loopback listeners (``host`` as split from the flag's address):
    another address is allowed, with a warning."""
    if host == "localhost" or host == "::1" or host.startswith("127."):
        return
    log.warning(f"{flag} is not a loopback address", host=host, why=why)


def prioritize_handler(service: SchedulerService, metrics: Metrics, body_limit: int):
    """``POST /prioritize`` (--filter-mode=all): a HostPriorityList. Its result type has no
    ``Error`` field and kube-scheduler ignores a failed prioritize ("No score given by this
    extender"), so a request that cannot be scored is logged, counted, and answered ``[]``
    with HTTP 200: no score from us, and no error in kube-scheduler's log for every pod."""

    prioritize_args = NodeNamesDecoder()

    async def handler(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        args, error = await read_json(request, body_limit, loads=prioritize_args.loads)
        error = error or extender_args_error(args)
        body = b"[]"
        if not error:
            try:
                result, error = service.prioritize(args)
                body = result.to_json()
            except Exception as exc:  # noqa: BLE001 - logged with its traceback, answered []
                log.exception("extender request failed unexpectedly", verb="prioritize")
                body, error = b"[]", f"internal error in the extender prioritize: {type(exc).__name__}: {exc}"
        if error:
            metrics.request_errors.labels("prioritize").inc()
            log.warning("prioritize gives no scores", error=error)
        response = web.Response(body=body, content_type=_JSON)
        metrics.request_seconds.labels("prioritize").observe(time.perf_counter() - t0)
        return response

    return handler


def preempt_handler(service: SchedulerService, metrics: Metrics, body_limit: int):
    """``preemptVerb: preempt``: ExtenderPreemptionResult, or a 500 with the error (the result has
    no Error field; kube-scheduler reads a non-200 answer as the extender's failure)."""

    async def handler(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        args, error = await read_json(request, body_limit)
        if not error:
            try:
                result, error = await service.preempt(args)
            except Exception as exc:  # noqa: BLE001 - logged with its traceback, answered with its message
                log.exception("extender request failed unexpectedly", verb="preempt")
                result, error = {}, f"internal error in the extender preempt: {type(exc).__name__}: {exc}"
        if error:
            metrics.request_errors.labels("preempt").inc()
            response = web.Response(status=500, body=orjson.dumps({"NodeNameToMetaVictims": None, "Error": error}),
                                    content_type=_JSON)
        else:
            response = _respond(result, "extender preemption")
        metrics.request_seconds.labels("preempt").observe(time.perf_counter() - t0)
        return response

    return handler


def add_probes(app: web.Application, ready) -> None:
    """``GET /healthz`` (always 200) and ``GET /readyz`` (200 once ``ready()``, else 503): served
    on the extender listener and on the webhook listener (where the kubelet's probes reach)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(status=200)
        return web.Response(status=503, text="usage cache not synced yet")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def build_metrics_app(metrics: Metrics, *, extra=None) -> web.Application:
    """``extra``: a callable returning an async iterator of more exposition text (the allocation
    gauges, tens of MB in a large cluster: streamed a metric family at a time, never joined)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        own = generate_latest(metrics.registry)
        if extra is None:
            return web.Response(body=own, headers={"Content-Type": CONTENT_TYPE_LATEST})
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        await response.prepare(request)
        await response.write(own)
        async for chunk in extra():
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app

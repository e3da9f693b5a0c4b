"""``POST /refit``: the NUMA refit's HTTP side (the rules are in :mod:`hami_py.scheduling.verbs.refit`).

Wire-compatible with the device plugin of HAMi after v2.10 (``requestNumaRefit``): a JSON
NumaRefitRequest in, ``{"succeeded", "containerDevices", "failureReason"}`` out. The plugin
treats any answer but a 200 with ``succeeded`` as a failed refit, so the status codes here are
for people and monitoring; the reason is in ``failureReason`` whatever the status:

* 401: no bearer token, or one the API server does not authenticate;
* 403: a token of anyone but the device plugin of the pod's node;
* 400: a body that is not a complete NumaRefitRequest;
* 503: the refit is not configured (no --device-plugin-namespace/--device-plugin-service-account),
  or this replica is not serving (cache not synced, not the leader);
* 200 with ``succeeded: false``: the refit was refused (nothing changed), and why;
* 200 with ``succeeded: true``: the container's devices, in the family's annotation encoding.

Upstream answers every failure with a 200; the device plugin reads both alike.
"""
from __future__ import annotations

import time
from typing import Callable

import orjson
from aiohttp import web

from hami_py.http.server import DEFAULT_BODY_LIMIT, read_json
from hami_py.metrics import Metrics
from hami_py.scheduling.verbs.refit import RefitEndpoint, bearer_token, refit_failure

REFIT_PATH = "/refit"


def refit_route(*, refit: RefitEndpoint, metrics: Metrics | None = None,
                body_limit: int = DEFAULT_BODY_LIMIT) -> tuple[str, str, Callable]:
    """``(method, path, handler)``: reads the request, times and counts it, writes the answer."""

    async def handler(request: web.Request) -> web.Response:
        started = time.perf_counter()
        token = bearer_token(request.headers.get("Authorization"))
        args, error = await read_json(request, body_limit) if token else (None, None)
        status, body = (400, refit_failure(error)) if error else await refit.answer(args, token)
        if metrics is not None:
            if not body.get("succeeded"):
                metrics.request_errors.labels("refit").inc()
            metrics.request_seconds.labels("refit").observe(time.perf_counter() - started)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    return ("POST", REFIT_PATH, handler)

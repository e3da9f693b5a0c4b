"""``POST /webhook``: the mutating admission webhook's HTTP side.

The kube-apiserver posts an AdmissionReview and expects one back with HTTP 200; whatever goes
wrong (a body that is too large, not JSON, the wrong content type) is answered the same way,
as an AdmissionReview whose status carries the code and the reason, as controller-runtime
(which upstream uses) answers. Only the rules' outcome is decided in
:mod:`hami_py.scheduling.admission.rules`; this module reads, times and writes, and puts the
UPDATE rule's question (may this user write Nodes?) to the API server through ``node_writers``
(hami_py/k8s/accessreview.py: a SubjectAccessReview, answers kept a few seconds).
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

import orjson
import structlog
from aiohttp import web

from hami_py.devices.base import DeviceVendor
from hami_py.http.server import DEFAULT_BODY_LIMIT, read_json
from hami_py.k8s.accessreview import AccessReviewFailed, NodeWriters, Subject
from hami_py.metrics import Metrics
from hami_py.scheduling.admission.rules import (
    ADMISSION_V1, AdmissionSettings, FitQuota, Verdict, review_asking, review_response,
)

log = structlog.get_logger(__name__)

WEBHOOK_PATH = "/webhook"
_JSON = "application/json"


def webhook_route(*, settings: AdmissionSettings, vendors: Mapping[str, DeviceVendor],
                  fit_quota: FitQuota, node_writers: NodeWriters | None, metrics: Metrics | None = None,
                  body_limit: int = DEFAULT_BODY_LIMIT) -> tuple[str, str, Callable]:
    """``(method, path, handler)`` for ``build_app(extra_routes=...)``.

    ``fit_quota`` is called for every admitted device pod; pass a function that looks the
    current quota cache up rather than a snapshot of it. ``node_writers`` answers the UPDATE
    rule (None: nobody may write Nodes, so every change of a scheduler-owned key is refused).
    """

    async def ask(subject: Subject) -> bool | str:
        if node_writers is None:
            return False
        try:
            return await node_writers.allowed(subject)
        except AccessReviewFailed as exc:
            log.warning("cannot tell whether a user may write nodes", user=subject.user, error=str(exc))
            return str(exc)

    async def handler(request: web.Request) -> web.Response:
        started = time.perf_counter()
        body, problem = await _read_review(request, body_limit)
        if problem is not None:
            log.warning("malformed admission review", error=problem, remote=request.remote)
            answer = review_response(version=ADMISSION_V1, uid="", verdict=Verdict.error(400, problem))
        else:
            answer = await review_asking(body, settings=settings, vendors=vendors, fit_quota=fit_quota, ask=ask)
        if metrics is not None:
            if answer["response"]["status"]["code"] >= 400 and answer["response"]["status"]["code"] != 403:
                metrics.request_errors.labels("webhook").inc()  # errors only: a denial is an answer
            metrics.request_seconds.labels("webhook").observe(time.perf_counter() - started)
        return web.Response(body=orjson.dumps(answer), content_type=_JSON)

    return ("POST", WEBHOOK_PATH, handler)


async def _read_review(request: web.Request, limit: int) -> tuple[object, str | None]:
    """(decoded body, None) or (None, what is wrong with it)."""
    if request.content_type != _JSON:
        shown = request.headers.get("Content-Type", "")
        return None, f"contentType={shown}, expected {_JSON}"
    return await read_json(request, limit, empty="request body is empty", invalid="invalid JSON in AdmissionReview")

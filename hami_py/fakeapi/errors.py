"""Request failures of the in-repo API server, as the Kubernetes ``Status`` objects clients parse.

Why a module of its own: every layer (selectors, patches, the store, fault injection, the HTTP
handlers) fails the same way, and clients depend on the exact reason, code and message text.
"""
from __future__ import annotations

from hami_py.fakeapi.resources import Resource

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


def status_details(res: Resource, name: str) -> dict:
    group = res.api_version.rpartition("/")[0]
    return {"name": name, **({"group": group} if group else {}), "kind": res.plural}


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, f'{res.group_resource} "{name}" not found', details=status_details(res, name))


def conflict(res: Resource, name: str, why: str) -> ApiError:
    return ApiError(409, f'Operation cannot be fulfilled on {res.group_resource} "{name}": {why}',
                    details=status_details(res, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"

"""The HTTP surface of the in-repo API server: URLs, query parameters, bodies and responses.

Why a module of its own: parsing requests and rendering replies the way kube-apiserver does
(404 for unknown paths, 400 and 415 for bad bodies, Status errors with Retry-After, opaque continue
tokens) is separate from what the requests do.
"""
from __future__ import annotations

import base64
import math
from typing import Any

import orjson
from aiohttp import web

from hami_py.fakeapi.errors import ApiError
from hami_py.fakeapi.resources import API_PREFIXES, RESOURCES, Resource


def json_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    headers = {}
    if err.retry_after is not None:
        headers["Retry-After"] = str(math.ceil(err.retry_after))
    return web.Response(body=orjson.dumps(err.status()), status=err.code, headers=headers,
                        content_type="application/json")


def parse_path(path: str) -> tuple[Resource, str | None, str | None, str | None]:
    """``(resource, namespace, name, subresource)`` for a resource URL, or 404."""
    parts = path.strip("/").split("/")
    for prefix, api_version in API_PREFIXES.items():
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
TRUE = frozenset(("1", "t", "T", "true", "TRUE", "True"))


def int_param(query: Any, name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"invalid {name}: {value!r}") from None


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    body = await request.read()
    if not body and optional:
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None


def require_json(request: web.Request) -> None:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type not in ("", "application/json", "*/*"):
        raise ApiError(415, 'the body of the request was in an unknown format - accepted media '
                            'types include: application/json')


def encode_continue(snapshot_id: int | None, start: int, rv: str) -> str:
    token = {"v": "meta.k8s.io/v1", "rv": int(rv), "snapshot": snapshot_id, "start": start}
    return base64.urlsafe_b64encode(orjson.dumps(token)).decode()


def decode_continue(token: str) -> tuple[int, int]:
    try:
        decoded = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return int(decoded["snapshot"]), int(decoded["start"])
    except (ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        raise ApiError(400, f"continue key is not valid: {token!r}") from None

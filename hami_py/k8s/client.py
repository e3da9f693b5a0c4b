"""A thin, fast door to the Kubernetes API on top of kubernetes-asyncio.

kubernetes-asyncio gives us what is hard to get right: kubeconfig and in-cluster configuration,
bearer tokens, client certificates, TLS and a pooled aiohttp session. What we do not want from it
is its model classes: deserialising a pod into generated Python objects costs far more than the
whole /filter decision, so every call here goes through ``ApiClient.call_api`` with
``_preload_content=False`` and the raw JSON is parsed with orjson.

Client-side rate limiting follows client-go's ``--kube-qps``/``--kube-burst`` token bucket, so the
scheduler behaves towards the API server the way upstream's does; watches are not limited.
"""
from __future__ import annotations

import asyncio
import copy
import os
import time
from typing import Any, Callable
from urllib.parse import urlencode, urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

MERGE_PATCH = "application/merge-patch+json"


class KubeApiError(Exception):
    """An API call failed: ``status`` is the HTTP code (0 for a transport failure or timeout)."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def uncertain(self) -> bool:
        """The request may or may not have been applied (timeout, dropped connection, 5xx)."""
        return self.status == 0 or self.status >= 500

    def __str__(self) -> str:
        return self.message


class TokenBucket:
    """client-go's flowcontrol token bucket: ``qps`` tokens a second, at most ``burst`` saved."""

    def __init__(self, qps: float, burst: int):
        self.qps = qps
        self.burst = max(1, burst)
        self.tokens = float(self.burst)
        self.stamp = time.monotonic()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.qps)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.qps)


async def load_configuration(kubeconfig: str | None, *, context: str | None = None) -> k8s_client.Configuration:
    """``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster;
    ``context``: the kubeconfig's context to use (its current one when None)."""
    configuration = k8s_client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        return configuration
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        default = os.path.expanduser("~/.kube/config")
        await k8s_config.load_kube_config(config_file=default, client_configuration=configuration)
    return configuration


class KubeClient:
    """JSON in, JSON out, over the configured kubernetes-asyncio ApiClient."""

    def __init__(self, configuration: k8s_client.Configuration, *, qps: float = 5.0, burst: int = 10,
                 timeout: float = 0.0, observe: Callable[[str, str, float], None] | None = None):
        """``observe(method, resource, seconds)`` is called after every request-response call
        (not watch streams), answered or failed: the scheduler's API latency histogram."""
        self.observe = observe
        configuration.connection_pool_maxsize = max(getattr(configuration, "connection_pool_maxsize", 0) or 0, 64)
        self.api = k8s_client.ApiClient(configuration)
        self.bucket = TokenBucket(qps, burst)
        self.owns_connections = True     # False for a view of another client (with_budget)
        self.timeout = timeout if timeout > 0 else None
        rest = self.api.rest_client
        # Our own session on the ApiClient's connector (its TLS context and pool). Theirs trusts
        # the environment, which makes aiohttp look up .netrc and proxies in a worker thread on
        # every request: two thread hops per API call. The proxy is resolved here, once.
        self.proxy = getattr(rest, "proxy", None) or _env_proxy(configuration.host)
        self.session = aiohttp.ClientSession(connector=rest.pool_manager.connector, connector_owner=False,
                                             trust_env=False, read_bufsize=2 ** 21)

    def with_budget(self, qps: float, burst: int) -> "KubeClient":
        """The same client (connection pool, authentication, session) drawing on a token bucket
        of its own: work off the critical path (registration upkeep, label follow-ups, requeue
        nudges) then never waits for tokens a bind's lock and Binding need, nor they for it.
        Closing the view closes nothing: the client it came from owns the connections."""
        view = copy.copy(self)
        view.bucket = TokenBucket(qps, burst)
        view.owns_connections = False
        return view

    async def close(self) -> None:
        if not self.owns_connections:
            return
        await self.session.close()
        await self.api.close()

    async def open(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                   body: Any = None, content_type: str = "application/json",
                   timeout: float | aiohttp.ClientTimeout | None = None,
                   limited: bool = True) -> aiohttp.ClientResponse:
        """Send a request and return the unread response (for watch streams).

        The request goes out on the ApiClient's own pooled session (its TLS context carries client
        certificates and the cluster CA) with the ApiClient's authentication (tokens refreshed by
        its hook), but the body is encoded with orjson and nothing passes through the generated
        client's parameter sanitising: on the /filter path that machinery cost more than the
        decision itself."""
        if limited:
            await self.bucket.acquire()
        configuration = self.api.configuration
        url = configuration.host + path
        if query:
            url += "?" + urlencode(query)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        for setting in (await configuration.auth_settings()).values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        rest = self.api.rest_client
        kwargs: dict[str, Any] = {"headers": headers, "timeout": _timeout(timeout if timeout is not None else self.timeout)}
        if body is not None:
            kwargs["data"] = body if isinstance(body, bytes) else orjson.dumps(body)
        if self.proxy:
            kwargs["proxy"] = self.proxy
            if getattr(rest, "proxy_headers", None):
                kwargs["proxy_headers"] = rest.proxy_headers
        if getattr(rest, "server_hostname", None):
            kwargs["server_hostname"] = rest.server_hostname
        try:
            return await self.session.request(method, url, **kwargs)
        except asyncio.TimeoutError as exc:
            raise KubeApiError(0, "Timeout", f"{method} {path}: timed out") from exc
        except aiohttp.ClientError as exc:
            raise KubeApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc

    async def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: float | None = None, limited: bool = True) -> dict:
        """One API call; the decoded JSON body, or KubeApiError with the server's own message.
        ``limited=False`` skips the client's --kube-qps bucket (a caller with a budget of its own)."""
        t0 = time.perf_counter()
        try:
            response = await self.open(method, path, query=query, body=body, content_type=content_type,
                                       timeout=timeout, limited=limited)
            async with response:
                data = await response.read()
        except asyncio.TimeoutError as exc:
            raise KubeApiError(0, "Timeout", f"{method} {path}: timed out") from exc
        except aiohttp.ClientError as exc:
            raise KubeApiError(0, "ConnectionError", f"{method} {path}: {exc}") from exc
        finally:
            if self.observe is not None:
                self.observe(method, api_resource(path), time.perf_counter() - t0)
        if 200 <= response.status < 300:
            return orjson.loads(data) if data else {}
        raise error_from_response(response.status, data, response.headers.get("Retry-After"),
                                  what=f"{method} {path}")

    async def get(self, path: str, **kw) -> dict:
        return await self.request("GET", path, **kw)

    async def patch(self, path: str, body: Any, *, content_type: str = MERGE_PATCH, **kw) -> dict:
        return await self.request("PATCH", path, body=body, content_type=content_type, **kw)

    async def post(self, path: str, body: Any, **kw) -> dict:
        return await self.request("POST", path, body=body, **kw)

    async def evict(self, *, namespace: str, name: str, uid: str, **kw) -> dict:
        """An eviction through the Eviction API (``pods/eviction``), so that PodDisruptionBudgets
        are honoured (a 429 when one allows no disruption), of exactly this pod (uid precondition)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        return await self.post(pod_path(namespace, name) + "/eviction", body, **kw)


def _env_proxy(host_url: str) -> str | None:
    """The proxy ``$HTTPS_PROXY``/``$HTTP_PROXY`` name for the API server, unless ``$NO_PROXY``
    exempts it (what a trust_env session would find, resolved once)."""
    parsed = urlsplit(host_url)
    if not parsed.hostname or proxy_bypass(parsed.hostname):
        return None
    return getproxies().get(parsed.scheme or "https")


def _timeout(value: float | aiohttp.ClientTimeout | None) -> aiohttp.ClientTimeout:
    if isinstance(value, aiohttp.ClientTimeout):
        return value
    if value:
        return aiohttp.ClientTimeout(total=value)
    return aiohttp.ClientTimeout()


def error_from_response(status: int, data: bytes, retry_after: str | None, *, what: str) -> KubeApiError:
    reason, message = "Unknown", ""
    try:
        st = orjson.loads(data)
        if isinstance(st, dict):
            reason = st.get("reason") or reason
            message = st.get("message") or ""
    except orjson.JSONDecodeError:
        message = data[:200].decode("utf-8", "replace")
    try:
        ra = float(retry_after) if retry_after is not None else None
    except ValueError:
        ra = None
    return KubeApiError(status, reason, message or f"{what}: HTTP {status}", retry_after=ra)


def api_resource(path: str) -> str:
    """The resource (and subresource) a request path addresses, for metric labels:
    ``/api/v1/namespaces/ns/pods/p/binding`` → ``pods/binding``, ``/api/v1/nodes/n`` → ``nodes``."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    # /api/v1/... or /apis/<group>/<version>/...; then optionally namespaces/<ns>/
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest:
        return "namespaces" if len(parts) > 2 else "unknown"
    return rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"

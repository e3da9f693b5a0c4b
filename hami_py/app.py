"""One scheduler process: API client, watches, usage cache, extender and metrics servers.

Everything shares one asyncio event loop. The watches are the only writers of cluster state into
the cache, /filter the only writer of reservations, and neither ever awaits in the middle of an
update, so no lock is needed around the books.
"""
from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.http.server import DEFAULT_BODY_LIMIT, build_app, build_metrics_app
from hami_py.k8s.client import KubeClient
from hami_py.k8s.informer import Informer
from hami_py.k8s.nodelock import NodeLocker
from hami_py.metrics import Metrics
from hami_py.scheduling.bind import Binder
from hami_py.scheduling.filter import Filterer
from hami_py.scheduling.service import SchedulerService

log = structlog.get_logger(__name__)


@dataclass
class Options:
    """The scheduler's settings; names and defaults follow upstream's command-line flags."""
    http_bind: str = "127.0.0.1:8080"
    cert_file: str = ""
    key_file: str = ""
    scheduler_name: str = ""
    node_scheduler_policy: str = "binpack"
    gpu_scheduler_policy: str = "spread"
    metrics_bind_address: str = ":9395"
    node_label_selector: dict[str, str] = field(default_factory=dict)
    kube_qps: float = 5.0
    kube_burst: int = 10
    kube_timeout: float = 0.0
    profiling: bool = False
    node_lock_timeout_s: float = 300.0
    node_lock_retry_timeout_s: float = 28.0
    force_overwrite_default_scheduler: bool = True
    leader_elect: bool = False
    leader_elect_resource_name: str = ""
    leader_elect_resource_namespace: str = ""
    legacy_metrics: bool = False
    device_config_file: str = ""
    kubeconfig: str | None = None
    debug: bool = False
    verbosity: int = 0
    body_limit: int = DEFAULT_BODY_LIMIT
    sync_timeout_s: float = 30.0


def split_host_port(address: str, *, default_host: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address!r} has no port")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"address {address!r} has a non-numeric port") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"address {address!r} has a port out of range")
    return (host.strip("[]") or default_host), number


class SchedulerApp:
    def __init__(self, options: Options, *, device_config: DeviceConfig, configuration):
        self.options = options
        self.device_config = device_config
        self.configuration = configuration
        self.vendors = build_vendors(device_config)
        self.metrics = Metrics()
        self.cache = UsageCache(self.vendors, node_selector=options.node_label_selector)
        self.client: KubeClient | None = None
        self.service: SchedulerService | None = None
        self.informers: list[Informer] = []
        self._runners: list[web.AppRunner] = []
        self.url = ""
        self.metrics_url = ""
        self._sync_task: asyncio.Task | None = None
        self.device_plugin = None  # set by the embedded harness when it simulates one

    @property
    def ready(self) -> bool:
        return self.cache.synced

    async def start(self) -> None:
        o = self.options
        self.client = KubeClient(self.configuration, qps=o.kube_qps, burst=o.kube_burst, timeout=o.kube_timeout)
        locker = NodeLocker(self.client, timeout_s=o.node_lock_timeout_s)
        binder = Binder(client=self.client, cache=self.cache, locker=locker,
                        lock_retry_timeout_s=o.node_lock_retry_timeout_s)
        filterer = Filterer(self.cache, self.vendors, default_node_policy=o.node_scheduler_policy,
                            default_gpu_policy=o.gpu_scheduler_policy)
        self.service = SchedulerService(cache=self.cache, vendors=self.vendors, client=self.client,
                                        binder=binder, filterer=filterer, sync_timeout_s=o.sync_timeout_s)
        selector = ",".join(f"{k}={v}" for k, v in o.node_label_selector.items()) or None
        self.informers = [
            Informer(client=self.client, path="/api/v1/nodes", label_selector=selector,
                     on_event=self._on_node_event, on_relist=lambda items, rv: self.cache.replace_nodes(items)),
            Informer(client=self.client, path="/api/v1/pods", on_event=self._on_pod_event,
                     on_relist=self.cache.replace_pods),
        ]
        for informer in self.informers:
            informer.start()
        self._sync_task = asyncio.create_task(self._mark_synced())

        app = build_app(service=self.service, metrics=self.metrics, ready=lambda: self.ready,
                        body_limit=o.body_limit)
        host, port = split_host_port(o.http_bind, default_host="0.0.0.0")
        self.url = await self._serve(app, host, port, self._tls_context())
        if o.metrics_bind_address:
            mhost, mport = split_host_port(o.metrics_bind_address, default_host="0.0.0.0")
            self.metrics_url = await self._serve(build_metrics_app(self.metrics), mhost, mport, None)
        log.info("hami-scheduler serving", url=self.url, metrics=self.metrics_url)

    async def _mark_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self.service.synced.set()
        log.info("usage cache synced", nodes=len(self.cache.nodes), pods=len(self.cache.pods))

    def _on_node_event(self, kind: str, node: dict) -> None:
        self.metrics.watch_events.labels("nodes").inc()
        if kind == "DELETED":
            self.cache.remove_node((node.get("metadata") or {}).get("name", ""))
        else:
            self.cache.upsert_node(node)

    def _on_pod_event(self, kind: str, pod: dict) -> None:
        self.metrics.watch_events.labels("pods").inc()
        self.cache.on_pod_event(kind, pod)

    def _tls_context(self) -> ssl.SSLContext | None:
        o = self.options
        if not (o.cert_file and o.key_file):
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(o.cert_file, o.key_file)
        return ctx

    async def _serve(self, app: web.Application, host: str, port: int, ssl_context) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        self._runners.append(runner)
        sock = site._server.sockets[0]  # the real port when 0 was asked for
        bound = sock.getsockname()[1]
        scheme = "https" if ssl_context else "http"
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"{scheme}://{shown}:{bound}"

    async def stop(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        for informer in self.informers:
            await informer.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self.client is not None:
            await self.client.close()

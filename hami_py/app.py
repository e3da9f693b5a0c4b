"""One scheduler process: API client, watches, usage cache, extender and metrics servers.

Everything shares one asyncio event loop. The watches are the only writers of cluster state into
the cache, /filter the only writer of reservations, and neither ever awaits in the middle of an
update, so no lock is needed around the books.
"""
from __future__ import annotations

import asyncio
import gc
import os
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from hami_py.aio import cancel_and_wait
from hami_py.allocation_metrics import AllocationMetrics, quota_samples
from hami_py.cache.usage import PodState, UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.base import DeviceVendor
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.http.profiling import build_profiling_app
from hami_py.http.refit import refit_route
from hami_py.http.server import DEFAULT_BODY_LIMIT, build_app, build_cluster_app, build_metrics_app, warn_unless_loopback
from hami_py.http.tls import DEFAULT_CHECK_INTERVAL_S, ReloadingTLS
from hami_py.http.webhook import webhook_route
from hami_py.k8s.budget import DEFAULT_BURST, DEFAULT_QPS, log_budget
from hami_py.k8s.client import KubeClient
from hami_py.k8s.event_parking import DEFAULT_WINDOW_S, UNBOUND
from hami_py.k8s.family_upkeep import upkeep as family_upkeep
from hami_py.k8s.events import (
    ALLOCATION_DECODE_FAILED, DEFAULT_MAX_AGE_S, DEFAULT_QUEUE_SIZE, NODE_LOCK_STUCK, REGISTRATION_REFUSED, WARNING,
    EventRecorder,
)
from hami_py.k8s.informer import Informer, PagedRelist
from hami_py.k8s.leader import build_leadership, check_leader_options, leader_identity
from hami_py.k8s.nodelock import NodeLocker
from hami_py.k8s.registration import RegistrationKeeper
from hami_py.k8s.requeue import RequeueNudger
from hami_py.k8s.accessreview import NodeWriters
from hami_py.k8s.tokenreview import DevicePluginIdentity
from hami_py.metrics import Metrics, StuckLockCollector
from hami_py.scheduling.admission.rules import AdmissionSettings
from hami_py.scheduling.verbs.bind import Binder
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.eviction.preempting import Preemptor
from hami_py.scheduling.gangs.watch import podgroup_informer
from hami_py.scheduling.verbs.refit import RefitEndpoint, Refitter
from hami_py.scheduling.verbs.service import SchedulerService

log = structlog.get_logger(__name__)


@dataclass
class Options:
    """The scheduler's settings; names and defaults follow upstream's command-line flags."""
    http_bind: str = "127.0.0.1:8080"
    # HAMi after v2.10: the extender's verbs on a listener of their own (--extender-bind), and
    # --http_bind for /webhook, /refit and the probes. Empty: everything on http_bind (v2.10).
    extender_bind: str = ""
    # /refit's only accepted caller: the device plugin's ServiceAccount (both empty: not configured).
    device_plugin_namespace: str = ""
    device_plugin_service_account: str = ""
    profiling_bind_address: str = "127.0.0.1:6060"
    # Not upstream's: the webhook on a listener of its own (/webhook, /healthz, /readyz only), so
    # that the extender's listener can stay on loopback. Empty: /webhook on the extender's listener.
    webhook_bind_address: str = ""
    cert_file: str = ""
    key_file: str = ""
    scheduler_name: str = ""
    node_scheduler_policy: str = "binpack"
    gpu_scheduler_policy: str = "spread"
    metrics_bind_address: str = ":9395"
    node_label_selector: dict[str, str] = field(default_factory=dict)
    # Neither --kube-qps nor --kube-burst given: the budget of hami_py.k8s.budget (100 pods/s).
    kube_qps: float = DEFAULT_QPS
    kube_burst: int = DEFAULT_BURST
    kube_budget_source: str = "default"      # or "flags": named in the start-up log
    kube_timeout: float = 0.0
    profiling: bool = False
    node_lock_timeout_s: float = 300.0
    node_lock_retry_timeout_s: float = 28.0
    # Ours: how long any /bind waits for a node lock held by another pod's allocation in progress
    # (PodGroup members wait node_lock_retry_timeout_s, as upstream). 0 = fail at once (upstream).
    node_lock_wait_s: float = 10.0
    # Ours: a node lock held this long by a bound pod whose allocation is unfinished is stuck: the
    # filter passes the node over and a bind onto it fails at once (cache/stuck_locks.py). 0: never.
    node_lock_stuck_after_s: float = 30.0
    # Ours: a /bind is answered within this, whatever it waits for (it runs on to its end): well
    # inside kube-scheduler's 30 s httpTimeout (scheduling/verbs/service.py).
    bind_answer_s: float = 25.0
    # Ours: device preemption by the extender (scheduling/eviction/preempting.py), and how long it holds
    # the room it freed for its pod.
    device_preemption: bool = False
    device_preemption_hold_s: float = 120.0
    force_overwrite_default_scheduler: bool = True
    leader_elect: bool = False
    leader_elect_resource_name: str = ""
    leader_elect_resource_namespace: str = ""
    legacy_metrics: bool = False
    device_config_file: str = ""
    enable_ascend: bool = False          # upstream's switches for the families it gates
    enable_iluvatar: bool = False
    kubeconfig: str | None = None
    debug: bool = False
    verbosity: int = 0
    body_limit: int = DEFAULT_BODY_LIMIT
    # Ours: "best" (upstream's: /filter answers one node and reserves it) or "all" (every fitting
    # node, /prioritize scores them, /bind fits again on kube-scheduler's choice; prioritize.py).
    filter_mode: str = "best"
    sync_timeout_s: float = 30.0
    gc_freeze: bool = True   # after the initial sync (off where many instances share a process)
    # Registration upkeep and leadership (hami_py/k8s/registration.py, leader.py). Not flags
    # upstream: the timeout and interval are its hard-coded values, the names come from the
    # machine ($POD_NAME/$POD_NAMESPACE, hostname); tests set them.
    handshake_timeout_s: float = 60.0
    registration_interval_s: float = 15.0
    hostname: str = ""          # identity looked for in the Lease; empty = socket.gethostname()
    pod_name: str = ""          # empty = $POD_NAME (scheduler-role label)
    pod_namespace: str = ""     # empty = $POD_NAMESPACE
    event_queue_size: int = DEFAULT_QUEUE_SIZE  # Kubernetes Events waiting to be written; more are dropped
    event_max_age_s: float = DEFAULT_MAX_AGE_S  # an Event queued longer is merged into a later one or dropped
    # Ours: "unbound" writes a FilteringSucceed only for a pod whose bind fails or does not come
    # within the window (a bound pod gets one Event, BindingSucceed); "always" is upstream's.
    filtering_succeed_events: str = UNBOUND
    filtering_succeed_window_s: float = DEFAULT_WINDOW_S
    cert_check_interval_s: float = DEFAULT_CHECK_INTERVAL_S  # how often a handshake re-checks the cert files


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
    def __init__(self, options: Options, *, device_config: DeviceConfig, configuration,
                 vendors: dict[str, DeviceVendor] | None = None):
        """``vendors``: the families already built from ``device_config`` (the CLI builds them
        first, to refuse a bad config before connecting); built here when not given."""
        self.options = options
        self.configuration = configuration
        self.vendors = vendors if vendors is not None else build_vendors(device_config, FamilySwitches(
            enable_ascend=options.enable_ascend, enable_iluvatar=options.enable_iluvatar))
        self.metrics = Metrics()
        self._pod_events_counter = self.metrics.watch_events.labels("pods")
        self._node_events_counter = self.metrics.watch_events.labels("nodes")
        self._quota_events_counter = self.metrics.watch_events.labels("resourcequotas")
        self.cache = UsageCache(self.vendors, node_selector=options.node_label_selector,
                                lock_stuck_after_s=options.node_lock_stuck_after_s,
                                handshake_timeout_s=options.handshake_timeout_s)
        self.metrics.registry.register(StuckLockCollector(self.cache.stuck_locks))
        self.metrics.is_leader.set_function(lambda: float(self.leadership is not None and self.leadership.is_leader))
        self.metrics.cache_synced.set_function(
            lambda: float(bool(self.informers) and all(i.synced.is_set() for i in self.informers)))
        self.cache.ledger.on_undecodable = self._on_undecodable
        self.cache.inventory.on_refused = self._on_registration_refused
        self.identity = leader_identity(options.hostname)
        check_leader_options(leader_elect=options.leader_elect, name=options.leader_elect_resource_name,
                             namespace=options.leader_elect_resource_namespace, identity=self.identity)
        self.leadership = None     # StaticLeadership or LeaseLeadership, built in start()
        self.keeper: RegistrationKeeper | None = None
        self.requeue: RequeueNudger | None = None
        self._caches_synced = False
        self.allocation_metrics = AllocationMetrics(self.cache, legacy=options.legacy_metrics,
                                                    quotas=lambda: quota_samples(self.cache.quota))
        self.events: EventRecorder | None = None
        self.client: KubeClient | None = None
        self.service: SchedulerService | None = None
        self.informers: list[Informer] = []
        self._runners: list[web.AppRunner] = []
        self.url = ""           # the extender's verbs (--extender-bind, else --http_bind)
        self.cluster_url = ""   # --http_bind: /refit, the probes, /webhook (unless --webhook-bind-address)
        self.webhook_url = ""   # where /webhook is served: cluster_url unless --webhook-bind-address
        self.metrics_url = ""
        self.profiling_url = ""
        self._sync_task: asyncio.Task | None = None
        self._family_tasks: list[asyncio.Task] = []     # DeviceVendor.background, while serving
        self._upkeep_wake = asyncio.Event()             # set on winning leadership (k8s/family_upkeep.py)
        self.device_plugin = None  # set by the embedded harness when it simulates one
        # Admission quota pre-check: fit_quota(namespace, vendor_key, memory_mib, cores) -> bool,
        # answered by the ResourceQuota book the quota watch keeps.
        self.fit_quota = self.cache.quota.fits
        self.tls: ReloadingTLS | None = None

    @property
    def ready(self) -> bool:
        return self.cache.synced

    async def start(self) -> None:
        o = self.options
        log_budget(o.kube_qps, o.kube_burst, o.kube_budget_source)
        api_seconds = self.metrics.api_request_seconds
        self.client = KubeClient(self.configuration, qps=o.kube_qps, burst=o.kube_burst, timeout=o.kube_timeout,
                                 observe=lambda method, resource, s: api_seconds.labels(method, resource).observe(s))
        # Work off the critical path (registration upkeep, label follow-ups, requeue nudges,
        # stale-decision cleanups) draws on a bucket of its own at the same rate: a pod's lock and
        # Binding never wait behind it.
        background = self.client.with_budget(o.kube_qps, o.kube_burst)
        locker = NodeLocker(self.client, timeout_s=o.node_lock_timeout_s, hint=self.cache.lock_hint,
                            allocating=self._allocating, holder=self.cache.lock_holder_waiting)
        filterer = Filterer(self.cache, self.vendors, default_node_policy=o.node_scheduler_policy,
                            default_gpu_policy=o.gpu_scheduler_policy, on_stuck=self._on_stuck)
        # Events get their own --kube-qps/--kube-burst bucket so they never delay a patch or Binding
        # (hami_py/k8s/events.py: repeats merged, spam dropped, both counted).
        self.events = EventRecorder(self.client, component=o.scheduler_name, metrics=self.metrics,
                                    queue_size=o.event_queue_size, qps=o.kube_qps, burst=o.kube_burst,
                                    filtering_succeed=o.filtering_succeed_events,
                                    filtering_succeed_window_s=o.filtering_succeed_window_s,
                                    max_age_s=o.event_max_age_s)
        self.events.start()
        binder = Binder(client=self.client, cache=self.cache, vendors=self.vendors, locker=locker,
                        lock_retry_timeout_s=o.node_lock_retry_timeout_s, lock_wait_s=o.node_lock_wait_s,
                        on_result=self.events.on_bind, background_client=background, on_stuck=self._on_stuck)
        self.service = SchedulerService(cache=self.cache, vendors=self.vendors, client=self.client,
                                        binder=binder, filterer=filterer, sync_timeout_s=o.sync_timeout_s,
                                        events=self._on_filter, preemptor=self._preemptor(filterer),
                                        filter_mode=o.filter_mode, bind_answer_s=o.bind_answer_s,
                                        background_client=background, metrics=self.metrics)
        # Pods refused just before the books freed devices get kube-scheduler's retry (requeue.py).
        self.requeue = RequeueNudger(background, enabled=lambda: self.service.synced.is_set(),
                                     metrics=self.metrics)
        self.service.defrag_holds.on_waiting = self.requeue.refused   # a held pod retried once its victims go
        gangs = self.service.gangs   # a gang just planned wakes its parked members; a refused one waits as any
        gangs.on_planned, gangs.on_waiting, gangs.on_event = self._wake, self.requeue.refused, self.events.on_pod
        self.leadership = build_leadership(
            leader_elect=o.leader_elect, client=self.client, namespace=o.leader_elect_resource_namespace,
            name=o.leader_elect_resource_name, identity=self.identity, on_change=self._on_leadership)
        self.keeper = RegistrationKeeper(
            client=background, cache=self.cache, vendors=self.vendors, leadership=self.leadership,
            handshake_timeout_s=o.handshake_timeout_s, interval_s=o.registration_interval_s,
            pod_name=o.pod_name or os.environ.get("POD_NAME", ""),
            pod_namespace=o.pod_namespace or os.environ.get("POD_NAMESPACE", ""))
        selector = ",".join(f"{k}={v}" for k, v in o.node_label_selector.items()) or None
        self.informers = [
            Informer(client=self.client, path="/api/v1/nodes", label_selector=selector,
                     on_event=self._on_node_event, on_relist=self._node_relist()),
            Informer(client=self.client, path="/api/v1/pods", on_event=self._on_pod_event,
                     on_relist=self._pod_relist(), page_size=1000),
            Informer(client=self.client, path="/api/v1/resourcequotas", on_event=self._on_quota_event,
                     on_relist=lambda items, rv: self.cache.quota.replace(items)),
        ]
        podgroups = await podgroup_informer(self.client, gangs.book)   # None: no CRD, PodGroup gangs off
        if podgroups is not None:
            self.informers.append(podgroups)
        for informer in self.informers:
            informer.start()
        self.leadership.start()
        self._sync_task = asyncio.create_task(self._mark_synced())
        # The families' own upkeep (a pool's servers polled for busy cards), until stop().
        self._family_tasks = [asyncio.create_task(job) for vendor in self.vendors.values()
                              for job in vendor.background(self.cache)]
        # ... and what they need written through the API server, by the leader (remote GPUs' session stubs).
        self._family_tasks += [asyncio.create_task(job) for job in family_upkeep(
            vendors=self.vendors, cache=self.cache, client=background, leading=lambda: self.leadership.is_leader,
            namespace=o.pod_namespace or os.environ.get("POD_NAMESPACE", ""), wake=self._upkeep_wake)]

        # The webhook's UPDATE rule asks the API server who may write Nodes (SubjectAccessReviews,
        # kept a few seconds) on a bucket of its own: a burst of binds never holds its answer back.
        self.node_writers = NodeWriters(self.client.with_budget(o.kube_qps, o.kube_burst))
        webhook = webhook_route(
            settings=AdmissionSettings(scheduler_name=o.scheduler_name,
                                       force_overwrite_default_scheduler=o.force_overwrite_default_scheduler),
            vendors=self.vendors, fit_quota=lambda *request: self.fit_quota(*request),
            node_writers=self.node_writers, metrics=self.metrics, body_limit=o.body_limit)
        identity = (DevicePluginIdentity(o.device_plugin_namespace, o.device_plugin_service_account)
                    if o.device_plugin_namespace and o.device_plugin_service_account else None)
        refitter = identity and Refitter(cache=self.cache, vendors=self.vendors, filterer=filterer,
                                         client=self.client, pod_locks=self.service.pod_locks)
        refit = refit_route(refit=RefitEndpoint(refitter=refitter, client=self.client, identity=identity,
                                                serving=self.service.synced.is_set),
                            metrics=self.metrics, body_limit=o.body_limit)
        await self._start_listeners(webhook, refit)
        if o.metrics_bind_address:
            mhost, mport = split_host_port(o.metrics_bind_address, default_host="0.0.0.0")
            metrics_app = build_metrics_app(self.metrics, extra=self.allocation_metrics.chunks)
            self.metrics_url = await self._serve(metrics_app, mhost, mport, None)
        if o.profiling:
            phost, pport = split_host_port(o.profiling_bind_address, default_host="0.0.0.0")
            warn_unless_loopback("--profiling-bind-address", phost,
                                 "the profiling endpoints show the scheduler's internals to whoever reaches them")
            self.profiling_url = await self._serve(build_profiling_app(), phost, pport, None)
        log.info("hami-scheduler serving", url=self.url, cluster=self.cluster_url, webhook=self.webhook_url,
                 metrics=self.metrics_url, profiling=self.profiling_url)

    async def _start_listeners(self, webhook, refit) -> None:
        """HAMi's two layouts. With --extender-bind (after v2.10): the extender's verbs there, and
        /webhook, /refit and the probes on --http_bind. Without it (v2.10): all of them on
        --http_bind. Either way --webhook-bind-address (ours) moves /webhook to a listener of its
        own, and every listener but the metrics' serves TLS when a certificate is given (one
        pair, reloaded when its files change)."""
        o = self.options
        if o.cert_file and o.key_file:
            self.tls = ReloadingTLS(cert_file=o.cert_file, key_file=o.key_file,
                                    check_interval_s=o.cert_check_interval_s)
        context = self.tls.context if self.tls else None
        separate_webhook = bool(o.webhook_bind_address)
        cluster_routes = [refit] + ([] if separate_webhook else [webhook])
        host, port = split_host_port(o.http_bind, default_host="0.0.0.0")
        if o.extender_bind:
            ehost, eport = split_host_port(o.extender_bind, default_host="0.0.0.0")
            warn_unless_loopback("--extender-bind", ehost,
                                 "/filter and /bind change the cluster with the scheduler's credentials and "
                                 "authenticate nobody")
            extender = build_app(service=self.service, metrics=self.metrics, ready=lambda: self.ready,
                                 body_limit=o.body_limit)
            self.url = await self._serve(extender, ehost, eport, context)
            cluster = build_cluster_app(cluster_routes, ready=lambda: self.ready, body_limit=o.body_limit)
            self.cluster_url = await self._serve(cluster, host, port, context)
        else:
            app = build_app(service=self.service, metrics=self.metrics, ready=lambda: self.ready,
                            body_limit=o.body_limit, extra_routes=cluster_routes)
            self.url = self.cluster_url = await self._serve(app, host, port, context)
        self.webhook_url = self.cluster_url
        if separate_webhook:
            whost, wport = split_host_port(o.webhook_bind_address, default_host="0.0.0.0")
            webhook_app = build_cluster_app([webhook], ready=lambda: self.ready, body_limit=o.body_limit)
            self.webhook_url = await self._serve(webhook_app, whost, wport, context)

    def _preemptor(self, filterer: Filterer) -> Preemptor | None:
        if not self.options.device_preemption:
            return None
        return Preemptor(cache=self.cache, filterer=filterer, client=self.client, events=self.events.on_preempt,
                         hold_s=self.options.device_preemption_hold_s, metrics=self.metrics)

    async def _mark_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers), self.leadership.synced.wait())
        self._caches_synced = True
        # The initial lists built most of the objects this process will ever hold; moving them out
        # of the cyclic collector's sight keeps its full passes from stalling the event loop.
        if self.options.gc_freeze:
            gc.collect()
            gc.freeze()
        self.keeper.start()
        self._update_serving()
        log.info("usage cache synced", nodes=len(self.cache.nodes), pods=len(self.cache.pods),
                 leader=self.leadership.is_leader)

    def _update_serving(self) -> None:
        """/filter answers only while the caches are in and this replica leads (upstream's
        ``synced``); a follower's requests wait, and are served if it becomes leader in time."""
        if self._caches_synced and self.leadership.is_leader:
            self.service.synced.set()
        else:
            self.service.synced.clear()

    def _on_leadership(self, leading: bool) -> None:
        self.keeper.leadership_changed(leading)
        if leading:
            self._upkeep_wake.set()
        self._update_serving()
        if not leading and self.service is not None:
            # Our unbound decisions live only here (/filter writes nothing): the new leader cannot
            # charge them, so binding one later could hand its devices out twice.
            if self.service.preemptor is not None:
                self.service.preemptor.release_all()   # held room: the new leader knows nothing of it
            self.service.defrag_holds.release_all()   # the new leader takes them from the annotations
            self.service.gangs.release_all()          # the new leader plans the gangs again
            released = self.cache.release_unbound_reservations()
            if released:
                log.info("leadership lost: unbound reservations released", reservations=released)

    def _node_relist(self) -> PagedRelist:
        def page(nodes: list[dict]) -> None:
            self.cache.relist_nodes_page(nodes)
            for node in nodes:
                self.keeper.observe_node("ADDED", node)

        def finish(rv: int | None) -> None:
            self.cache.finish_node_relist(rv)
            self.keeper.replace_nodes([])  # drop what the cache no longer has

        return PagedRelist(begin=self.cache.begin_node_relist, page=page, finish=finish)

    def _pod_relist(self) -> PagedRelist:
        def begin() -> None:
            self.cache.begin_pod_relist()
            self.keeper.replace_pods([])
            self.service.gangs.begin_relist()

        def page(pods: list[dict]) -> None:
            self.cache.relist_pods_page(pods)
            for pod in pods:
                self.keeper.observe_pod("ADDED", pod)
                self.service.binder.labels.observe_pod("ADDED", pod)
                self.service.gangs.observe("ADDED", pod)

        def finish(rv: int | None) -> None:
            self.cache.finish_pod_relist(rv)
            self.service.gangs.finish_relist()

        return PagedRelist(begin=begin, page=page, finish=finish)

    def _on_node_event(self, kind: str, node: dict) -> None:
        self._node_events_counter.inc()
        if kind == "DELETED":
            self.cache.remove_node((node.get("metadata") or {}).get("name", ""))
        else:
            self.cache.upsert_node(node)
        self.keeper.observe_node(kind, node)

    def _on_quota_event(self, kind: str, quota: dict) -> None:
        self._quota_events_counter.inc()
        if kind == "DELETED":
            self.cache.quota.remove(quota)
        else:
            self.cache.quota.upsert(quota)

    def _on_stuck(self, stuck) -> None:
        """A warning Event on the node of a stuck lock (cache/stuck_locks.py); repeats raise its count."""
        if self.events is not None:
            self.events.on_node(stuck.node, WARNING, NODE_LOCK_STUCK, stuck.event_message())

    def _on_undecodable(self, pod: dict, error: str) -> None:
        """A warning Event on a bound pod whose device allocation annotations the books cannot
        read (its device plugin cannot either): told by the pod ledger, once per garbled text."""
        if self.events is not None:
            self.events.on_pod(pod, WARNING, ALLOCATION_DECODE_FAILED,
                               f"device allocation annotations cannot be decoded: {error}")

    def _on_registration_refused(self, node: str, why: str) -> None:
        """A warning Event on a node whose registration of a family the books refuse (garbled, or
        naming a device no decision can carry): told by the node inventory, once per reason."""
        if self.events is not None:
            self.events.on_node(node, WARNING, REGISTRATION_REFUSED,
                                f"device registration refused, its devices are not used: {why}")

    def _allocating(self, uid: str) -> bool:
        """The pod watch shows the pod, its device plugin not yet done with it."""
        usage = self.cache.pods.get(uid)
        return usage is not None and usage.state is not PodState.ALLOCATED

    def _on_filter(self, pod: dict, what: str, detail) -> None:
        self.events.on_filter(pod, what, detail)
        if what == "filter_failed":
            self.requeue.refused()

    def _wake(self, nodes: list[str]) -> None:
        """A gang was planned: one node annotation wakes its members kube-scheduler parked."""
        if nodes:
            self.requeue.wake(nodes[0])

    def _on_pod_event(self, kind: str, pod: dict) -> None:
        self._pod_events_counter.inc()
        uid = (pod.get("metadata") or {}).get("uid")
        charged = self.cache.pods.get(uid) if uid else None
        self.cache.on_pod_event(kind, pod)
        # After the books: a hold is charged next to the victims as the books have them now.
        self.service.defrag_holds.observe(kind, pod)
        self.service.gangs.observe(kind, pod)
        if charged is not None and charged.state.bound and uid not in self.cache.pods:
            self.requeue.freed(charged.node)     # a bound pod's devices released
        if kind == "DELETED" and uid:
            self.events.forget(uid)
        self.keeper.observe_pod(kind, pod)
        self.service.binder.labels.observe_pod(kind, pod)   # the vgpu-node label the Binding carried

    async def _serve(self, app: web.Application, host: str, port: int, ssl_context) -> str:
        # A handler whose caller hung up (a disconnect, kube-scheduler's httpTimeout) is
        # cancelled: a /filter still waiting then never reserves, patches or reports for a pod
        # kube-scheduler gave up on. A /bind, once begun, finishes all the same (service.py).
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
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
        await cancel_and_wait(self._sync_task)
        for task in self._family_tasks:
            await cancel_and_wait(task)
        self._family_tasks = []
        for informer in self.informers:
            await informer.stop()
        if self.keeper is not None:
            await self.keeper.stop()
        if self.leadership is not None:
            await self.leadership.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self.service is not None:
            await self.service.close()   # binds answered early, then label patches of binds just made
            await self.requeue.close()
        if self.events is not None:
            await self.events.stop()   # after the servers: no new events; before the client closes
        if self.client is not None:
            await self.client.close()

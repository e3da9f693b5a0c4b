"""Registration upkeep: the scheduler's half of the device plugins' handshake, and role labels.

A device plugin announces its devices in a node annotation, but an annotation outlives the
plugin that wrote it. HAMi's answer is a handshake on a second annotation: the scheduler stamps
``Requesting_<local time>``; a plugin that is alive answers ``Reported <time>`` when it next
registers; a stamp still unanswered after the timeout (60 s in upstream's code) while the kubelet
advertises none of the vendor's devices means the plugin is gone, so the node's devices stop being
offered and the handshake annotation is removed (upstream's ``NodeCleanUp``). For NVIDIA a fall
of the allocatable count from above zero to zero also means gone, at once.

The usage cache already reads registrations from the node watch and leaves a node whose stamp
expired out of /filter (``UsageCache.handshake_deadlines``); this module is what writes. It runs beside the
watch on the event loop and never on the /filter path:

* it looks at each node only when the node's watch event arrives, or when a stamp it is waiting
  on comes due, plus one sweep every ``interval_s`` (upstream's 15 s ticker) as a backstop;
* it writes only what the protocol needs: one stamp per plugin answer (a node whose stamp is
  still ``Requesting_`` is left alone), one cleanup per departure, and only on nodes that carry
  the vendor's registration (upstream stamps every node of the cluster, GPU or not);
* only the leader writes; followers keep the same judgement so a fail-over starts warm.

Deliberate fix of upstream's flapping (hami-scheduling.md §17 item 13): upstream cleans a gone
plugin up, then on its next pass finds the handshake missing, stamps it afresh and re-admits the
stale devices for another 60 s, over and over. Here a plugin judged gone stays gone (the node
is unusable, its handshake left absent) until it shows life: the kubelet advertises its devices
again, the handshake carries a plugin's answer, or the registration text changes.

The scheduler-role labels (``hami.io/scheduler-role``: ``leader``/``follower`` on the pods labelled
``app.kubernetes.io/component=hami-scheduler`` in ``$POD_NAMESPACE``) are kept here too, from the pod
watch the scheduler already runs: the chart's Service sends webhook traffic to the leader by them.
Without ``$POD_NAMESPACE`` (not running in a pod) no role label is written; upstream would then
label every hami-scheduler pod of every namespace a follower.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from hami_py.aio import cancel_and_wait
from hami_py.cache.usage import (
    REQUESTING_PREFIX, STAMP_FORMAT, UsageCache, is_requesting, parse_handshake_deadline,
)
from hami_py.devices.base import DeviceVendor
from hami_py.k8s.client import KubeApiError, KubeClient, node_path, pod_path
from hami_py.quantity import parse_quantity_ceil

log = structlog.get_logger(__name__)

ROLE_LABEL = "hami.io/scheduler-role"
ROLE_LEADER = "leader"
ROLE_FOLLOWER = "follower"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT_SCHEDULER = "hami-scheduler"

_UNSET = object()       # "we have not written over any value" (None is a real value: absent)


class Leadership(Protocol):
    is_leader: bool


def requesting_stamp(now: float | None = None) -> str:
    """``Requesting_<YYYY-MM-DD HH:MM:SS>`` in local time, as upstream writes it."""
    return REQUESTING_PREFIX + time.strftime(STAMP_FORMAT, time.localtime(now))


def is_plugin_answer(value: str | None) -> bool:
    """A handshake value only a live plugin writes (``Reported …``), not ours, not a farewell."""
    return value is not None and not is_requesting(value) and not value.startswith("Deleted")


def _count(raw: object) -> int:
    """An allocatable quantity as a whole number (Quantity.Value()); 0 when absent or garbled."""
    if isinstance(raw, str) and raw.isdigit():
        return int(raw)
    if raw is None:
        return 0
    return parse_quantity_ceil(raw) or 0


@dataclass(slots=True)
class VendorHandshake:
    """One vendor's handshake on one node, as last seen on the node object."""
    vendor: DeviceVendor
    count_resource: str
    follows_allocatable: bool            # NVIDIA: allocatable falling to 0 means gone at once
    value: str | None = None             # the handshake annotation
    allocatable: int = 0                 # status.allocatable[count resource]
    register_text: str | None = None     # the registration annotation
    deadline: float | None = None        # when a Requesting_ value expires (wall clock)
    gone: bool = False                   # plugin judged gone: unusable until it shows life
    written_over: object = _UNSET        # the value our last (pending or done) write replaced

    @property
    def registered(self) -> bool:
        return bool(self.register_text)


@dataclass
class KeeperStats:
    passes: int = 0
    requests: int = 0          # handshakes stamped Requesting_
    cleanups: int = 0          # handshakes removed from gone plugins
    role_patches: int = 0
    write_errors: int = 0


@dataclass(slots=True)
class _Write:
    node: str
    record: VendorHandshake
    value: str | None                    # new handshake value; None removes it (cleanup)
    replaced: str | None


@dataclass
class _RoleState:
    labels: dict[str, str | None] = field(default_factory=dict)   # scheduler pod -> role label
    written: dict[str, str] = field(default_factory=dict)         # pod -> role we last wrote


class RegistrationKeeper:
    """Keeps the handshake protocol and the role labels; feeds ``NodeEntry.plugin_gone``."""

    def __init__(self, *, client: KubeClient, cache: UsageCache, vendors: dict[str, DeviceVendor],
                 leadership: Leadership, handshake_timeout_s: float = 60.0, interval_s: float = 15.0,
                 pod_name: str = "", pod_namespace: str = ""):
        self.client = client
        self.cache = cache
        self.vendors = {k: v for k, v in vendors.items() if v.handshake_annotation}
        self.leadership = leadership
        self.handshake_timeout_s = handshake_timeout_s
        self.interval_s = interval_s
        self.pod_name = pod_name
        self.pod_namespace = pod_namespace
        self.nodes: dict[str, list[VendorHandshake]] = {}
        self.roles = _RoleState()
        self.stats = KeeperStats()
        self._dirty: set[str] = set()
        self._roles_dirty = True
        self._wake = asyncio.Event()
        self._next_due: float | None = None   # wall-clock time the earliest stamp expires
        self._task: asyncio.Task | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin passes; call once the node and pod lists are in (a pass on half a list would
        stamp or clean up on a partial view)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="registration keeper")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def leadership_changed(self, leading: bool) -> None:
        """A new leader sweeps everything at once (upstream's immediate pass on election)."""
        if leading:
            self._dirty.update(self.nodes)
            self._roles_dirty = True
            self._wake.set()

    # -- nodes (called from the node watch, after the cache has taken the event) -----------------

    def observe_node(self, kind: str, node: dict) -> None:
        name = (node.get("metadata") or {}).get("name") or ""
        if kind == "DELETED" or name not in self.cache.nodes:
            # Deleted, or outside --node-label-selector: not ours to keep.
            self.nodes.pop(name, None)
            self._dirty.discard(name)
            return
        records = self.nodes.get(name)
        if records is None:
            records = self.nodes[name] = [self._record(v) for v in self.vendors.values()]
        meta = node.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for record in records:
            self._update(name, record, annotations, allocatable)
        self._publish(name, records)
        if any(self._wants_write(r) for r in records):
            self._dirty.add(name)
            self._wake.set()
        for r in records:
            self._watch_deadline(r)

    def _watch_deadline(self, r: VendorHandshake) -> None:
        """A stamp that can expire (nothing allocatable) sets when the next pass is due."""
        deadline = r.deadline
        if deadline is None or r.gone or r.allocatable > 0 or not r.registered:
            return
        if self._next_due is None or deadline < self._next_due:
            self._next_due = deadline
            self._wake.set()   # sleep again with the nearer deadline

    def replace_nodes(self, nodes: list[dict]) -> None:
        """After a relist (the cache has already replaced its nodes)."""
        for name in [n for n in self.nodes if n not in self.cache.nodes]:
            del self.nodes[name]
        for node in nodes:
            self.observe_node("ADDED", node)

    def _record(self, vendor: DeviceVendor) -> VendorHandshake:
        return VendorHandshake(vendor=vendor, count_resource=vendor.count_resource_name,
                               follows_allocatable=vendor.health_follows_allocatable)

    def _update(self, name: str, r: VendorHandshake, annotations: dict, allocatable: dict) -> None:
        value = annotations.get(r.vendor.handshake_annotation)
        text = annotations.get(r.vendor.register_annotation)
        count = _count(allocatable.get(r.count_resource)) if r.count_resource else 0
        if r.gone:
            back = count > 0 or (value != r.value and is_plugin_answer(value)) \
                or (text != r.register_text and bool(text))
            if back:
                r.gone = False
                log.info("device plugin is back", node=name, vendor=r.vendor.vendor_key, allocatable=count)
        elif text and count == 0:
            if r.follows_allocatable and r.allocatable > 0:
                r.gone = True
                log.warning("device plugin gone: allocatable fell to 0", node=name, vendor=r.vendor.vendor_key)
            elif r.value is not None and value is None:
                # Someone (the leader, when we follow) cleaned the handshake up: it judged the
                # plugin gone, and a follower must not let the stale devices back in.
                r.gone = True
        if value != r.value:
            r.written_over = _UNSET
            r.deadline = parse_handshake_deadline(value, timeout_s=self.handshake_timeout_s)
        r.value, r.allocatable, r.register_text = value, count, text

    def _publish(self, name: str, records: list[VendorHandshake]) -> None:
        self.cache.set_plugin_gone(name, frozenset(r.vendor.vendor_key for r in records if r.gone and r.registered))

    def _wants_write(self, r: VendorHandshake) -> bool:
        if not r.registered or (r.written_over is not _UNSET and r.written_over == r.value):
            return False
        if r.gone:
            return r.value is not None
        return not is_requesting(r.value)

    # -- scheduler pods (called from the pod watch) ------------------------------------------------

    def observe_pod(self, kind: str, pod: dict) -> None:
        if not self.pod_namespace:
            return
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != self.pod_namespace:
            return
        name = meta.get("name") or ""
        labels = meta.get("labels") or {}
        if kind == "DELETED" or labels.get(COMPONENT_LABEL) != COMPONENT_SCHEDULER:
            self.roles.labels.pop(name, None)
            self.roles.written.pop(name, None)
            return
        role = labels.get(ROLE_LABEL)
        if self.roles.labels.get(name, _UNSET) != role:
            self.roles.written.pop(name, None)
            self.roles.labels[name] = role
            if role != self._desired_role(name):
                self._roles_dirty = True
                self._wake.set()

    def replace_pods(self, pods: list[dict]) -> None:
        self.roles = _RoleState()
        for pod in pods:
            self.observe_pod("ADDED", pod)

    def _desired_role(self, pod: str) -> str:
        return ROLE_LEADER if pod == self.pod_name else ROLE_FOLLOWER

    # -- passes ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        full = True
        last_sweep = time.monotonic()
        while True:
            if full:
                last_sweep = time.monotonic()
            await self.run_pass(full=full)
            try:
                # Not asyncio.wait_for: on Python 3.11 it returns a wake-up that lands in the same
                # turn as stop()'s cancel and swallows the cancel, and stop() then waits forever.
                async with asyncio.timeout(self._sleep_s()):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            # Events only ask for their own nodes; a due stamp or the interval sweeps everything.
            full = self._due() or time.monotonic() - last_sweep >= self.interval_s

    def _due(self) -> bool:
        return self._next_due is not None and time.time() >= self._next_due

    def _sleep_s(self) -> float:
        wait = self.interval_s
        if self._next_due is not None:
            wait = min(wait, max(self._next_due - time.time(), 0.0) + 0.01)
        return wait

    async def run_pass(self, *, full: bool = True) -> None:
        """Judge (every replica) then write (leader only). ``full`` looks at every node;
        otherwise only those whose events asked for it."""
        now = time.time()
        names = list(self.nodes) if full else list(self._dirty)
        self._dirty.clear()
        if full:
            self._next_due = None
        writes: list[_Write] = []
        for name in names:
            records = self.nodes.get(name)
            if records is None:
                continue
            gone_before = [r.gone for r in records]
            for r in records:
                write = self._assess(name, r, now)
                if write is not None:
                    writes.append(write)
            if gone_before != [r.gone for r in records]:
                self._publish(name, records)
        self.stats.passes += 1
        if not self.leadership.is_leader:
            return
        for write in writes:
            await self._write_handshake(write)
        if full or self._roles_dirty:
            # A failed role write is retried by the next sweep, not by every node event.
            self._roles_dirty = False
            await self._keep_roles()

    def _assess(self, name: str, r: VendorHandshake, now: float) -> _Write | None:
        if not r.registered:
            return None
        if not r.gone and is_requesting(r.value):
            deadline = r.deadline
            if deadline is None or r.allocatable > 0:
                return None
            if now < deadline:
                self._next_due = deadline if self._next_due is None else min(self._next_due, deadline)
                return None
            r.gone = True
            log.warning("device plugin gone: handshake unanswered", node=name, vendor=r.vendor.vendor_key,
                        handshake=r.value, timeout_s=self.handshake_timeout_s)
        if not self._wants_write(r):
            return None
        value = None if r.gone else requesting_stamp(now)
        return _Write(node=name, record=r, value=value, replaced=r.value)

    async def _write_handshake(self, write: _Write) -> None:
        r = write.record
        if not self.leadership.is_leader or r.value != write.replaced or not self._wants_write(r) \
                or r.gone != (write.value is None):
            return  # leadership lost, or the node changed while earlier writes were awaited
        r.written_over = write.replaced
        key = r.vendor.handshake_annotation
        try:
            await self.client.patch(node_path(write.node), {"metadata": {"annotations": {key: write.value}}})
        except KubeApiError as exc:
            if r.value == write.replaced:
                r.written_over = _UNSET   # try again on the next sweep
            self.stats.write_errors += 1
            log.warning("handshake write failed", node=write.node, annotation=key, error=str(exc))
            return
        if write.value is None:
            self.stats.cleanups += 1
            log.info("handshake removed from gone device plugin", node=write.node, annotation=key)
        else:
            self.stats.requests += 1
            log.debug("handshake requested", node=write.node, annotation=key, value=write.value)

    async def _keep_roles(self) -> None:
        if not self.pod_namespace:
            return
        for pod, role in list(self.roles.labels.items()):
            desired = self._desired_role(pod)
            if role == desired or self.roles.written.get(pod) == desired or not self.leadership.is_leader:
                continue
            self.roles.written[pod] = desired
            try:
                await self.client.patch(pod_path(self.pod_namespace, pod),
                                        {"metadata": {"labels": {ROLE_LABEL: desired}}})
            except KubeApiError as exc:
                self.roles.written.pop(pod, None)
                self.stats.write_errors += 1
                log.warning("scheduler role label write failed", pod=f"{self.pod_namespace}/{pod}",
                            role=desired, error=str(exc))
                continue
            self.stats.role_patches += 1
            log.info("scheduler role label set", pod=f"{self.pod_namespace}/{pod}", role=desired)

"""The /bind step: live reservation, node lock, bind-phase annotations, Binding, and a clean undo.

Upstream binds whatever decision the pod's annotations carry, and under concurrent load with bind
retries that hands a share out twice. Here a device pod is bound only onto the reservation this
process's /filter holds for it on that node (checked again once the node lock is held); without
one the answer sends kube-scheduler back to /filter. A node lock held by another pod's
allocation is queued for, not failed on.

Upstream leaks the pod's reservation on three of its failure paths; here every failure releases
the lock this bind took and rolls back the reservation. One failure is special: a Binding call
that timed out (or lost its connection) may have been applied anyway, so the pod is read back and
a bind that in fact happened is reported as a success, never undone.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from hami_py.cache.records import BIND_PHASE_ANNOTATION
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.k8s.client import KubeApiError, KubeClient, node_path, pod_path
from hami_py.k8s.nodelock import ExtraLock, NodeLocker, NodeLockError, go_duration
from hami_py.scheduling.verbs.bind_label import LabelFollower
from hami_py.scheduling.decision.filter import VGPU_NODE_LABEL
from hami_py.scheduling.decision.requests import parse_pod_requests

log = structlog.get_logger(__name__)

BIND_TIME_ANNOTATION = "hami.io/bind-time"
LOCK_RECHECK_S = 1.0     # a bind waiting for a node lock tries again at least this often
# A lock whose release failed on every attempt is released again in the background, this often.
RELEASE_RETRY_FIRST_S = 0.5
RELEASE_RETRY_MAX_S = 10.0


class BindError(Exception):
    """A bind that did not happen; ``reason`` in HAMi's outcome words (metrics.OUTCOME_REASONS):
    lookup (the pod, its node or its reservation not found), identity (another pod of that name),
    lock (the node lock), bind (the Binding, or a pod already bound elsewhere)."""

    def __init__(self, message: str, *, reason: str = "bind"):
        super().__init__(message)
        self.reason = reason


class BindOutcomeUnknown(BindError):
    """The Binding may have landed and the pod could not be read back: its reservation stays
    until the pod's own events tell (a bound pod that went uncharged could be oversubscribed)."""


@dataclass(slots=True)
class BindRequest:
    name: str
    namespace: str
    uid: str
    node: str


class Binder:
    def __init__(self, *, client: KubeClient, cache: UsageCache, vendors: dict[str, DeviceVendor],
                 locker: NodeLocker, lock_retry_timeout_s: float = 28.0, lock_wait_s: float = 10.0,
                 on_result=None, background_client: KubeClient | None = None, on_stuck=None):
        self.client = client
        self.cache = cache
        self.vendors = vendors
        self.locker = locker
        self.lock_retry_timeout_s = lock_retry_timeout_s
        self.lock_wait_s = lock_wait_s
        self.on_result = on_result
        self.on_stuck = on_stuck      # called with a StuckLock a bind gave up on (its node's Event)
        # The vgpu-node label, where the Binding's is dropped: after the bind's answer, so on the
        # background budget (the next pods' locks and Bindings never wait for it).
        self.labels = LabelFollower(client=background_client or client)
        self._releasing: set[asyncio.Task] = set()   # node locks whose release failed, tried again
        self._in_flight: set[tuple[str, str]] = set()  # (pod UID, node) of the binds under way

    async def bind(self, req: BindRequest, pod: dict | None = None) -> None:
        """Bind the pod or raise BindError with the message for the extender's ``Error``.
        ``req`` has been checked against the live pod (scheduling/verbs/identity.py), which
        ``pod`` is when that check had to read it.

        The common case, a device pod this process filtered, costs two requests: the node lock's
        compare-and-set and a Binding carrying the decision's annotations. Everything else (no
        reservation, a pod without devices) reads the pod first, unless ``pod`` is given."""
        reservation = self.cache.live_reservation(req.uid, req.node) if req.uid else None
        if reservation is not None and reservation.pod is not None and reservation.annotations is not None:
            if reservation.state.bound:
                # A repeated bind (kube-scheduler lost our answer and asked again): it happened.
                log.info("pod already bound to this node", pod=f"{req.namespace}/{req.name}", node=req.node)
                return
            await self._bind_reserved(req, reservation.pod, reservation)
            return
        if pod is None:
            try:
                pod = await self.client.get(pod_path(req.namespace, req.name))
            except KubeApiError as exc:
                if exc.not_found:
                    self._roll_back(req)
                    raise BindError(f'pod "{req.name}" not found', reason="lookup") from None
                raise BindError(f"get pod {req.namespace}/{req.name}: {exc}", reason="lookup") from None
        live_uid = (pod.get("metadata") or {}).get("uid")
        if live_uid not in (None, req.uid):
            # Re-created under the name since the identity check: the old pod's reservation goes.
            self._roll_back(req)
            raise BindError(f"pod {req.namespace}/{req.name} has UID {live_uid}, bind request carries UID {req.uid}",
                            reason="identity")
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to == req.node:
            # A repeated bind (kube-scheduler lost our answer and asked again): it happened, and
            # undoing anything now would un-charge a pod that runs on its devices.
            log.info("pod already bound to this node", pod=f"{req.namespace}/{req.name}", node=req.node)
            return
        if bound_to:
            message = f"pod {req.namespace}/{req.name} is already assigned to node {bound_to}"
            self.report(pod, req, message)
            raise BindError(message, reason="identity")
        if req.node not in self.cache.nodes:
            # The node watch does not know the node (gone, or too new to have been seen): ask.
            # The API server itself would bind a pod to a node that does not exist.
            await self._check_node_exists(req, pod)
        reservation = None
        if self.asks_for_devices(pod):
            # The invariant: a device pod is bound only onto the devices its live reservation
            # holds. Its annotations are no proof: a rolled-back decision stays on the pod, and
            # its capacity may have gone to another pod since.
            reservation = self.cache.live_reservation(req.uid, req.node)
            if reservation is None:
                message = f"pod {req.namespace}/{req.name} has no device reservation on node {req.node} (filter it again)"
                self.report(pod, req, message)
                raise BindError(message, reason="lookup")
        await self._bind_reserved(req, pod, reservation)

    async def _bind_reserved(self, req: BindRequest, pod: dict, reservation) -> None:
        """Lock (when the pod's families lock), then the Binding with the decision; undo on failure."""
        self._in_flight.add((req.uid, req.node))
        try:
            await self._lock_and_bind(req, pod, reservation)
        finally:
            self._in_flight.discard((req.uid, req.node))

    async def _lock_and_bind(self, req: BindRequest, pod: dict, reservation) -> None:
        locked = locking = False
        shared, extra = self._locks_for(pod)
        needs_lock = shared or bool(extra)
        try:
            if needs_lock:
                locking = True
                await self._lock(req, pod, extra, shared=shared)
                locked, locking = True, False
                if reservation is not None and (self.cache.live_reservation(req.uid, req.node) is not reservation
                                                or self._overcommitted(reservation)):
                    # The wait for the lock let the node's registration or the pod change under
                    # the reservation: it no longer holds what it was checked for. Or a pod this
                    # process did not place (another scheduler's, a former leader's bind that
                    # landed after we took over) was bound onto the same devices meanwhile: the
                    # node lock serialises binds, and the books show that pod by now.
                    raise BindError(f"pod {req.namespace}/{req.name} has no device reservation on node "
                                    f"{req.node} (filter it again)", reason="lookup")
            if reservation is not None:
                self.labels.expect(uid=req.uid, namespace=req.namespace, name=req.name, node=req.node)
            await self._create_binding(req, reservation.annotations if reservation is not None else None,
                                       labels={VGPU_NODE_LABEL: req.node} if reservation is not None else None)
        except (KubeApiError, NodeLockError, BindError) as exc:
            if not isinstance(exc, BindOutcomeUnknown):    # it may have landed: the watch will tell
                self.labels.forget(req.uid)
            # A lock write whose answer was lost may have landed: released like one that did
            # (only the exact value it wrote, only if it is there), or the node stays locked.
            if locked or (locking and isinstance(exc, NodeLockError) and exc.uncertain):
                await self._release(req, extra, shared=shared)
            if not isinstance(exc, BindOutcomeUnknown):
                self._roll_back(req)
            # Reading the node is the lock's first step: a 404 there is upstream's missing node.
            node_missing = locking and isinstance(exc, KubeApiError) and exc.not_found
            message = f"failed to get node {req.node}" if node_missing else str(exc)
            self.report(pod, req, message)
            if isinstance(exc, BindError) and not node_missing:
                raise
            reason = "lookup" if node_missing else "lock" if isinstance(exc, NodeLockError) else "bind"
            raise BindError(message, reason=reason) from None
        if reservation is not None:
            self.cache.mark_bound(reservation)
        self.report(pod, req, None)

    async def _release(self, req: BindRequest, extra: tuple[ExtraLock, ...], *, shared: bool) -> None:
        """Release the lock this bind took. When every attempt fails (the API server is down), a
        background task keeps trying: a lock left behind would stop every bind onto the node
        until it expires (5 minutes), for a pod that is not being allocated at all."""
        value = self.locker.written(req.node, req.uid) if shared else None
        if await self._release_once(req, extra, shared=shared):
            return
        task = asyncio.get_running_loop().create_task(
            self._release_until_done(req, extra, shared=shared, value=value))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_once(self, req: BindRequest, extra: tuple[ExtraLock, ...], *, shared: bool,
                            value: str | None = None) -> bool:
        if shared:
            return await self.locker.release(req.node, req.namespace, req.name, extra=extra, value=value)
        return await self.locker.release_own(req.node, extra)

    async def _release_until_done(self, req: BindRequest, extra: tuple[ExtraLock, ...], *, shared: bool,
                                  value: str | None) -> None:
        deadline = time.monotonic() + self.locker.timeout_s     # expired by then in any case
        delay = RELEASE_RETRY_FIRST_S
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            again = self.cache.pods.get(req.uid)
            if again is not None and again.node == req.node and again.state.bound:
                return      # bound there after all, by a later bind: the lock is its allocation's now
            if (req.uid, req.node) in self._in_flight:
                continue    # a bind of the pod onto the node holds the lock (re-entrant): not now
            if await self._release_once(req, extra, shared=shared, value=value):
                log.info("node lock released after the API server came back", node=req.node,
                         pod=f"{req.namespace}/{req.name}")
                return
            delay = min(delay * 2, RELEASE_RETRY_MAX_S)
        log.warning("node lock left to expire", node=req.node, pod=f"{req.namespace}/{req.name}")

    def asks_for_devices(self, pod: dict) -> bool:
        """Whether the pod requests any device the scheduler manages (a malformed request counts:
        such a pod was never given a reservation either)."""
        try:
            return parse_pod_requests(pod, self.vendors, self.cache.vendor_ids) is not None
        except RequestError:
            return True

    async def _check_node_exists(self, req: BindRequest, pod: dict) -> None:
        try:
            await self.client.get(node_path(req.node))
        except KubeApiError as exc:
            message = f"failed to get node {req.node}" if exc.not_found else f"get node {req.node}: {exc}"
            self._roll_back(req)
            self.report(pod, req, message)
            raise BindError(message, reason="lookup") from None

    def _roll_back(self, req: BindRequest) -> None:
        """Roll back the reservation under the request's UID, if it is the named pod's own."""
        self.cache.release_pod(req.uid, namespace=req.namespace, name=req.name)

    def report(self, pod: dict, req: BindRequest, error: str | None) -> None:
        """Tell ``on_result`` (the BindingSucceed/BindingFailed events) how the bind ended;
        ``error`` is None for a bind that happened. The hook only queues, it never blocks."""
        if self.on_result is not None:
            self.on_result(pod, req.node, error)

    def _overcommitted(self, reservation) -> bool:
        """Whether a device the reservation holds is charged beyond what it has (slots, memory,
        cores). The filter never chose such a device, so something else was charged since."""
        c = self.cache
        for j in set(reservation.resolved):
            if j >= 0 and (c.used[j] > c.count[j] or c.used_mem[j] > c.total_mem[j]
                           or (c.total_cores[j] > 0 and c.used_cores[j] > c.total_cores[j])):
                log.warning("devices charged beyond capacity since the filter", pod=f"{reservation.namespace}/"
                            f"{reservation.name}", node=reservation.node, device=c.device_ids[j])
                return True
        return False

    def _locks_for(self, pod: dict) -> tuple[bool, tuple[ExtraLock, ...]]:
        """Whether HAMi's node lock is taken (upstream locks only for pods given devices of a
        family that locks), and the families' own locks taken with it (or alone)."""
        usage = self.cache.pods.get((pod.get("metadata") or {}).get("uid", ""))
        if usage is None:
            usage = self.cache.pod_usage_from_object(pod)
        if usage is None:
            return False, ()
        families = [self.vendors[key] for key in dict.fromkeys(e.vendor for e in usage.entries) if key in self.vendors]
        extra = tuple(ExtraLock(v.extra_lock_annotation, v.extra_lock_expiry_s)
                      for v in families if v.extra_lock_annotation)
        return any(v.uses_node_lock for v in families), extra

    async def _lock(self, req: BindRequest, pod: dict, extra: tuple[ExtraLock, ...] = (), *,
                    shared: bool = True) -> None:
        """Take the node lock. Held by another pod (its allocation in progress: the device plugin
        releases the lock when it has allocated), wait for the node watch to show it change, for
        up to ``lock_wait_s`` (PodGroup members: ``lock_retry_timeout_s``, as upstream): a bind
        failed on contention costs the pod kube-scheduler's backoff, seconds more than the wait."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        group = labels.get("scheduling.x-k8s.io/pod-group") or \
            ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
        wait_s = self.lock_retry_timeout_s if group else self.lock_wait_s
        deadline = time.monotonic() + wait_s
        woken = False
        while True:
            try:
                if shared:
                    await self.locker.acquire(req.node, req.namespace, req.name, extra=extra, uid=req.uid)
                else:
                    await self.locker.acquire_own(req.node, extra)
                return
            except NodeLockError as exc:
                left = deadline - time.monotonic()
                if not exc.contention or wait_s <= 0:
                    raise
                stuck = self.cache.stuck_lock(req.node)
                if stuck is not None and stuck.holder != f"{req.namespace}/{req.name}":
                    # Its holder's allocation makes no progress: waiting would only hold this bind
                    # (and the pod's next filter) up. The pod's next filter goes elsewhere.
                    if self.on_stuck is not None:
                        self.on_stuck(stuck)
                    raise BindError(stuck.describe(), reason="lock") from None
                if left <= 0:
                    raise BindError(f"timed out after {go_duration(wait_s)} waiting for node "
                                    f"{req.node} to be unlocked: node lock contention", reason="lock") from None
            released = self.cache.wait_lock_release(req.node, front=woken)
            try:
                hint = self.cache.lock_hint(req.node)
                if hint is not None and not hint[0]:
                    continue            # released between the try and the queueing: try again now
                # The head of the queue also tries once a second, for what no node event shows
                # (the lock's owner pod deleted, the lock expiring); the others wait their turn.
                head = self.cache.first_lock_waiter(req.node, released)
                await asyncio.wait([released], timeout=min(left, LOCK_RECHECK_S) if head else left)
                woken = released.done() and not released.cancelled()
            finally:
                released.cancel()

    async def close(self) -> None:
        """At shutdown: a lock release still failing is left to expire; the label patches in
        flight are let finish (``LabelFollower.close``)."""
        for task in list(self._releasing):
            task.cancel()
        await self.labels.close()

    async def _create_binding(self, req: BindRequest, decision: dict[str, str] | None = None, *,
                              labels: dict[str, str] | None = None) -> None:
        # The API server copies a Binding's annotations onto the pod as it binds it, so the
        # decision and the bind-phase the device plugin waits for land in the same write as
        # spec.nodeName: one call instead of upstream's patch at filter, patch at bind, then
        # bind, and the device plugin never sees a bound pod without its devices. Its labels
        # too, since Kubernetes 1.35 (see bind_label.py).
        annotations = dict(decision or {})
        annotations.update({BIND_PHASE_ANNOTATION: "allocating", BIND_TIME_ANNOTATION: str(int(time.time()))})
        metadata = {"name": req.name, "namespace": req.namespace, "annotations": annotations}
        if labels:
            metadata["labels"] = labels
        if req.uid:
            metadata["uid"] = req.uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": req.node}}
        try:
            await self.client.post(pod_path(req.namespace, req.name) + "/binding", body)
        except KubeApiError as exc:
            if not exc.uncertain:
                raise
            # The Binding may have landed before the error: the pod itself is the truth.
            try:
                pod = await self.client.get(pod_path(req.namespace, req.name))
            except KubeApiError:
                raise BindOutcomeUnknown(str(exc)) from None
            if (pod.get("spec") or {}).get("nodeName") == req.node:
                log.info("binding confirmed after an uncertain error", pod=f"{req.namespace}/{req.name}",
                         node=req.node, error=str(exc))
                return
            raise

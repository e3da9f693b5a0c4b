"""NUMA refit (``POST /refit``): move a bound pod's pending allocation onto the devices kubelet allows.

The scheduler picks a container's devices without knowing the CPUs kubelet's Topology Manager will
give it. When the Topology Manager restricts the container to devices on another NUMA node, the
device plugin (HAMi after v2.10, ``requestNumaRefit``), for pods that opt in with
``hami.io/numa-alignment: best-effort|strict``, asks the scheduler to re-fit that container onto the
devices it may use. The scheduler:

1. checks the caller (``k8s/tokenreview.py``): the device plugin's ServiceAccount token, bound to a
   device plugin pod that runs on the target node;
2. checks the pod: the one it knows by UID, bound to that node, with that container's devices of
   that family still to be allocated (its entry of the family's to-allocate annotation is not
   blank: the device plugin has not consumed it);
3. re-fits that container alone, under the same books as /filter and /bind: the pod's charge minus
   that container is what the node holds for it meanwhile, the container's own request is fitted
   by the same kernel on that node with every device outside the allowed set refused, and the
   pod's new charge is computed from the annotations it will carry (``charge_of``, one set of
   books). Books are changed in one synchronous stretch: no other filter sees the devices free;
4. writes the container's new entry into the family's to-allocate and allocated annotations in
   one merge patch, preconditioned on the pod's UID and the resourceVersion it read. A patch that
   fails puts the old charge back: a refused refit changes nothing.

Every family whose allocation is the shared to-allocate/allocated pair (the device plugins that
report a NUMA node in their registration) is refitted the same way; partitioned devices (MIG and
its kind) are refused, as upstream refuses them.
"""
from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass
from typing import Mapping

import structlog

from hami_py.cache.records import PodUsage
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import AllocationDecodeError, DeviceVendor, PodDevices, RequestError
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.k8s.tokenreview import CallerRefused, DevicePluginIdentity, authenticate_device_plugin, bearer_token
from hami_py.kernel_codes import ROW_WIDTH
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.verbs.podlocks import PodBusy, PodLocks
from hami_py.scheduling.decision.policies import PolicyError
from hami_py.scheduling.decision.requests import PodRequest, parse_pod_requests

log = structlog.get_logger(__name__)

__all__ = ["RefitEndpoint", "RefitRefused", "RefitRequest", "Refitter", "bearer_token", "refit_failure"]

MAX_ALLOWED_DEVICES = 512
NOT_CONFIGURED = ("NUMA refit is not configured: start the scheduler with --device-plugin-namespace and "
                  "--device-plugin-service-account (the device plugin's ServiceAccount)")
_FIELDS = ("podUID", "podNamespace", "podName", "nodeName", "deviceType")


class RefitRefused(Exception):
    """The refit cannot be done; its message is the answer's ``failureReason``."""


@dataclass(frozen=True, slots=True)
class RefitRequest:
    pod_uid: str
    namespace: str
    name: str
    node: str
    container_index: int
    container_name: str
    device_type: str
    allowed: frozenset[str]

    @classmethod
    def parse(cls, body: object) -> "RefitRequest":
        """Upstream's NumaRefitRequest, every field checked; RefitRefused names what is wrong."""
        if not isinstance(body, dict):
            raise RefitRefused("refit request must be a JSON object")
        missing = [k for k in _FIELDS if not isinstance(body.get(k), str) or not body.get(k)]
        index = body.get("containerIndex")
        if missing or not isinstance(index, int) or isinstance(index, bool) or index < 0:
            missing += [] if isinstance(index, int) and not isinstance(index, bool) and index >= 0 \
                else ["containerIndex"]
            raise RefitRefused(f"incomplete refit request: {', '.join(missing)} missing or invalid")
        allowed = body.get("allowedDeviceUUIDs")
        if not isinstance(allowed, list) or not all(isinstance(u, str) and u for u in allowed):
            raise RefitRefused("allowedDeviceUUIDs must be a list of device UUIDs")
        if not allowed:
            raise RefitRefused("empty allowed device set")
        if len(allowed) > MAX_ALLOWED_DEVICES:
            raise RefitRefused(f"allowedDeviceUUIDs lists {len(allowed)} devices; at most {MAX_ALLOWED_DEVICES}")
        name = body.get("containerName") or ""
        if not isinstance(name, str):
            raise RefitRefused("containerName must be a string")
        return cls(body["podUID"], body["podNamespace"], body["podName"], body["nodeName"], index, name,
                   body["deviceType"], frozenset(allowed))


def refit_failure(reason: str) -> dict:
    return {"succeeded": False, "failureReason": reason}


class RefitEndpoint:
    """A /refit request from its bearer token and decoded body to (HTTP status, answer), in the
    order that tells an unauthenticated caller nothing about pods: configured and serving, the
    caller, the request, the refit. ``refitter`` and ``identity`` None: not configured."""

    def __init__(self, *, refitter: "Refitter | None", client: KubeClient | None,
                 identity: DevicePluginIdentity | None, serving):
        self.refitter, self.client, self.identity, self.serving = refitter, client, identity, serving

    async def answer(self, body: object, token: str) -> tuple[int, dict]:
        if self.refitter is None or self.identity is None or self.client is None:
            return 503, refit_failure(NOT_CONFIGURED)
        if not token:
            return 401, refit_failure("caller authentication failed: no bearer token")
        node = body.get("nodeName") if isinstance(body, dict) else None
        if not isinstance(node, str) or not node:
            return 400, refit_failure("incomplete refit request: nodeName missing or invalid")
        if not self.serving():
            return 503, refit_failure("scheduler cache is not synced, or this replica is not the leader")
        try:
            caller = await authenticate_device_plugin(self.client, token, identity=self.identity, node=node)
        except CallerRefused as refused:
            log.warning("refit refused: caller", status=refused.status, reason=str(refused))
            return refused.status, refit_failure(str(refused))
        try:
            request = RefitRequest.parse(body)
        except RefitRefused as exc:
            return 400, refit_failure(str(exc))
        try:
            devices = await self.refitter.refit(request)
        except RefitRefused as exc:
            log.info("refit refused", pod=f"{request.namespace}/{request.name}", caller=caller, reason=str(exc))
            return 200, refit_failure(str(exc))
        return 200, {"succeeded": True, "containerDevices": devices}


class Refitter:
    def __init__(self, *, cache: UsageCache, vendors: Mapping[str, DeviceVendor], filterer: Filterer,
                 client: KubeClient, pod_locks: PodLocks):
        self.cache = cache
        self.vendors = vendors
        self.filterer = filterer
        self.client = client
        self.pod_locks = pod_locks

    async def refit(self, req: RefitRequest) -> str:
        """The container's new devices, in its family's annotation encoding; RefitRefused else."""
        vendor = self.vendors.get(req.device_type)
        if vendor is None:
            raise RefitRefused(f"unknown device type {req.device_type!r}")
        keys = (vendor.to_allocate_annotation, vendor.allocated_annotation)
        if not all(keys):
            raise RefitRefused(f"{req.device_type} devices are not supported by the NUMA refit "
                               "(the family writes no to-allocate annotation)")
        try:
            async with self.pod_locks.try_hold(req.pod_uid, "refit"):
                return await self._refit(req, vendor, keys)
        except PodBusy as busy:
            raise RefitRefused(f"pod {req.namespace}/{req.name}: its {busy.holder} is still running") from None

    async def _refit(self, req: RefitRequest, vendor: DeviceVendor, keys: tuple[str, str]) -> str:
        key = f"{req.namespace}/{req.name}"
        usage = self.cache.pods.get(req.pod_uid)
        if usage is None:
            raise RefitRefused(f"pod {key} with uid {req.pod_uid} is not tracked by the scheduler")
        if (usage.namespace, usage.name) != (req.namespace, req.name):
            raise RefitRefused(f"pod uid {req.pod_uid} is {usage.namespace}/{usage.name}, which does not match {key}")
        if usage.node != req.node:
            raise RefitRefused(f"pod {key} is tracked on node {usage.node}, not {req.node}")
        try:
            pod = await self.client.get(pod_path(req.namespace, req.name))
        except KubeApiError as exc:
            raise RefitRefused(f"pod {key}: {exc}") from None
        meta = pod.get("metadata") or {}
        if meta.get("uid") != req.pod_uid:
            raise RefitRefused(f"pod {key} has uid {meta.get('uid')}, not {req.pod_uid}")
        if (pod.get("spec") or {}).get("nodeName") != req.node:
            raise RefitRefused(f"pod {key} is not bound to node {req.node}")
        annotations = dict(meta.get("annotations") or {})
        try:
            request = parse_pod_requests(pod, self.vendors, self.cache.vendor_ids)
        except RequestError as exc:
            raise RefitRefused(f"pod {key}: {exc}") from None
        if request is None:
            raise RefitRefused(f"pod {key} asks for no device this scheduler manages")
        containers = request.containers
        if req.container_index >= len(containers):
            raise RefitRefused(f"container index {req.container_index} is outside the pod's containers "
                               f"({len(containers)})")
        if req.container_name and containers[req.container_index] != req.container_name:
            raise RefitRefused(f"container {req.container_index} is {containers[req.container_index]!r}, "
                               f"not {req.container_name!r}")
        to_allocate = annotations.get(keys[0], "").split(";")
        if req.container_index >= len(to_allocate) or not to_allocate[req.container_index].strip():
            raise RefitRefused(f"pod {key} has no pending {req.device_type} allocation for container "
                               f"{req.container_index} (its device plugin has taken it already)")
        try:
            current = vendor.decode_allocation(annotations)
        except AllocationDecodeError as exc:
            raise RefitRefused(f"pod {key}: {exc}") from None
        if not current or req.container_index >= len(current) or not current[req.container_index]:
            raise RefitRefused(f"pod {key} has no recorded {req.device_type} allocation for container "
                               f"{req.container_index}")
        mine = current[req.container_index]
        if vendor.decode_partitions(annotations):
            raise RefitRefused(f"pod {key} holds MIG-like partitions, which the NUMA refit does not move")
        if all(d.uuid in req.allowed for d in mine):
            return to_allocate[req.container_index]      # already where kubelet wants it
        others = set(vendor.encode_allocation(current, node=req.node, pod_annotations=annotations)) - set(keys)
        if others:
            raise RefitRefused(f"{req.device_type} allocations are written in annotations the NUMA refit does not "
                               f"rewrite ({', '.join(sorted(others))})")
        sub = _only_container(request, req.container_index, vendor.vendor_key)
        if not sub:
            raise RefitRefused(f"container {req.container_index} of pod {key} asks for no {req.device_type} device")
        new, charged = self._swap(pod=pod, req=req, sub=sub, vendor=vendor, current=current, usage=usage)
        return await self._write(pod=pod, req=req, vendor=vendor, keys=keys, current=current, new=new,
                                 to_allocate=to_allocate, charged=charged, usage=usage)

    def _swap(self, *, pod: dict, req: RefitRequest, sub: PodRequest, vendor: DeviceVendor,
              current: PodDevices, usage: PodUsage) -> tuple[PodDevices, PodUsage]:
        """Re-fit the container on its node against the pod's charge without it: (the pod's devices
        with the container's new ones, the charge now in the books for them). Synchronous:
        nothing else runs meanwhile."""
        cache = self.cache
        without = [list(c) for c in current]
        without[req.container_index] = []
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        meanwhile = self._charge(usage, {**annotations, **vendor.encode_allocation(
            without, node=req.node, pod_annotations=annotations)}, sub)
        cache.remove_pod(usage.uid)
        cache.add_pod_usage(meanwhile)
        try:
            fit = self.filterer.evaluate(pod, [req.node], sub, only_devices=req.allowed)
        except PolicyError as exc:
            self._restore(meanwhile, usage)
            raise RefitRefused(str(exc)) from None
        if fit.best < 0:
            self._restore(meanwhile, usage)
            reason = fit.failed.get(req.node, "no allowed device fits")
            raise RefitRefused(f"no allowed device fits container {req.container_index}: {reason}")
        allocation, mig = self.filterer.allocation_of(sub, fit)
        if mig:
            self._restore(meanwhile, usage)
            raise RefitRefused("the refit found only MIG-like partitions, which it does not move")
        placed = allocation[vendor.vendor_key][req.container_index]
        new = [list(c) for c in current]
        new[req.container_index] = placed
        written = vendor.encode_allocation(new, node=req.node, pod_annotations=annotations)
        charged = self._charge(usage, {**annotations, **written}, sub)
        cache.remove_pod(meanwhile.uid)
        cache.add_pod_usage(charged)
        return new, charged

    async def _write(self, *, pod: dict, req: RefitRequest, vendor: DeviceVendor, keys: tuple[str, str],
                     current: PodDevices, new: PodDevices, to_allocate: list[str], charged: PodUsage,
                     usage: PodUsage) -> str:
        """One merge patch of the container's entries, preconditioned on the pod read; the old
        charge back in the books when it fails."""
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        written = vendor.encode_allocation(new, node=req.node, pod_annotations=annotations)
        entry = written[keys[0]].split(";")[req.container_index]
        pending = list(to_allocate)
        pending[req.container_index] = entry
        patch = {keys[0]: ";".join(pending), keys[1]: written[keys[1]]}
        try:
            await self.client.patch(pod_path(req.namespace, req.name), {"metadata": {
                "uid": req.pod_uid, "resourceVersion": meta.get("resourceVersion"), "annotations": patch}})
        except KubeApiError as exc:
            self._restore(charged, usage)
            raise RefitRefused(f"pod {req.namespace}/{req.name}: refit not written: {exc}") from None
        log.info("NUMA refit", pod=f"{req.namespace}/{req.name}", node=req.node, container=req.container_index,
                 old=[d.uuid for d in current[req.container_index]], new=[d.uuid for d in new[req.container_index]])
        return entry

    def _charge(self, usage: PodUsage, annotations: dict[str, str], request: PodRequest) -> PodUsage:
        entries, instances = self.cache.charge_of(annotations, request.shape)
        return dataclasses.replace(usage, entries=entries, mig=instances, resolved=[], fingerprint=None,
                                   marks=self.cache.marks_of(annotations))

    def _restore(self, current: PodUsage, old: PodUsage) -> None:
        """Put the old charge back, unless an event replaced ours meanwhile (then the books follow
        the pod as the API server has it)."""
        if self.cache.pods.get(current.uid) is current:
            self.cache.remove_pod(current.uid)
            self.cache.add_pod_usage(old)


def _only_container(request: PodRequest, position: int, vendor_key: str) -> PodRequest | None:
    """The pod's request rows of one container and one family (the rest is charged already)."""
    rows = array("i")
    row_vendor, row_container, total = [], [], 0
    for r, (key, container) in enumerate(zip(request.row_vendor, request.row_container)):
        if container == position and key == vendor_key:
            row = request.rows[r * ROW_WIDTH:(r + 1) * ROW_WIDTH]
            rows.extend(row)
            row_vendor.append(key)
            row_container.append(container)
            total += row[3]
    if not row_vendor:
        return None
    return PodRequest(rows, row_vendor, row_container, request.containers, total, request.per_container,
                      request.shape)

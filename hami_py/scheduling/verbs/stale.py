"""Clearing a scheduling decision that a pod still carries but no longer holds.

kube-scheduler filters only pods that are not bound, so a decision found on a pod being filtered
again is void. This scheduler's decisions reach a pod only with its Binding, so such a decision
was left by upstream's scheduler or an older hami-py (whose /filter patched the pod) whose bind
was rolled back or whose attempt kube-scheduler gave up on. When the new filter places the pod,
its Binding's annotations replace the old decision. When it finds no node, the old decision would stay on the pod: the
live books rightly do not charge it, but a restarted scheduler (and upstream's, which charges
every pod carrying ``hami.io/vgpu-node``) rebuilds usage from annotations, and would hold that
capacity for a pod that runs nowhere until the pod is placed or deleted. So that filter clears it.

The cleanup is one read and one write, and only for a pod that may carry a decision
(kube-scheduler's copy shows one, or the books charge it from its annotations); pods whose only
decisions were this scheduler's unbound reservations cost nothing. The write is a merge patch
that nulls the decision's annotations and label, preconditioned on the pod's UID and on the
resourceVersion just read: it lands only on the unbound pod that was
read, never on a pod bound or given a newer decision meanwhile (the API server answers 409). Filters
of one pod are serialised (scheduling/verbs/service.py), so no newer decision of ours is in flight
while it runs. A failed read or write is logged and changes nothing more: the caller has already
released the decision (``Filterer.decide`` releases a pod's earlier decision before deciding
again, so later events still carrying it do not charge it unless the pod is bound), and the
pod's next filter tries again.

HAMi's device plugin reads ``hami.io/vgpu-devices-to-allocate`` and ``hami.io/bind-phase`` only
of pods bound to its node with bind-phase ``allocating``; a cleared pod is unbound and carries no
bind-phase of ours (the Binding sets it, and only a Binding that landed does), so the device plugin
never sees one. A pod placed later gets a complete decision again with its Binding.
"""
from __future__ import annotations

from typing import Mapping

import structlog

from hami_py.cache.usage import VGPU_NODE_ANNOTATION, UsageCache
from hami_py.devices.base import DeviceVendor
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.scheduling.decision.filter import VGPU_NODE_LABEL, VGPU_TIME_ANNOTATION

log = structlog.get_logger(__name__)


def decision_keys(vendors: Mapping[str, DeviceVendor]) -> list[str]:
    """Every pod annotation a filter's decision writes."""
    keys = [VGPU_NODE_ANNOTATION, VGPU_TIME_ANNOTATION]
    for vendor in vendors.values():
        keys.extend(k for k in vendor.decision_annotations() if k not in keys)
    return list(dict.fromkeys(keys))


def may_carry_decision(cache: UsageCache, pod: dict, uid: str) -> bool:
    """Asked before the filter decides (which drops the pod's charge): could the pod, as the API
    server has it, carry a decision? Either kube-scheduler's copy shows one, or the books charge
    the pod from its annotations (a watch event showed one). A reservation of our own /filter, or
    one released since, was never written to the pod (decisions reach a pod with its Binding
    only, and a bound pod is not filtered): an unschedulable pod that kube-scheduler retries costs
    no request for it. Two dictionary lookups."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if VGPU_NODE_ANNOTATION in annotations:
        return True
    charge = cache.pods.get(uid)
    return charge is not None and charge.state.seen


async def clear_stale_decision(*, client: KubeClient, cache: UsageCache, vendors: Mapping[str, DeviceVendor],
                               namespace: str, name: str, uid: str) -> bool:
    """Remove the decision from the unbound pod ``namespace/name`` with UID ``uid``, which a
    filter has just found no node for. True when a patch removed one; never raises."""
    path = pod_path(namespace, name)
    key = f"{namespace}/{name}"
    try:
        pod = await client.get(path)
    except KubeApiError as exc:
        if not exc.not_found:   # gone: nothing to clear
            log.warning("stale decision not cleared: cannot read the pod; its next filter retries",
                        pod=key, error=str(exc))
        return False
    meta = pod.get("metadata") or {}
    if meta.get("uid") != uid or not meta.get("resourceVersion"):
        return False            # a successor under the same name: not this filter's pod
    if (pod.get("spec") or {}).get("nodeName"):
        # Bound after all (kube-scheduler filtered a stale copy, or a Binding whose outcome was
        # unknown landed): its decision is real. The filter dropped its charge; restore it.
        cache.on_pod_event("MODIFIED", pod)
        return False
    annotations = meta.get("annotations") or {}
    stale = [k for k in decision_keys(vendors) if k in annotations]
    if not stale:
        return False
    cache.forget_decision(pod)
    body: dict = {"metadata": {"uid": uid, "resourceVersion": meta["resourceVersion"],
                               "annotations": dict.fromkeys(stale)}}
    if VGPU_NODE_LABEL in (meta.get("labels") or {}):
        body["metadata"]["labels"] = {VGPU_NODE_LABEL: None}
    try:
        await client.patch(path, body)
    except KubeApiError as exc:
        log.warning("stale decision not cleared: pod patch failed; its next filter retries",
                    pod=key, node=annotations.get(VGPU_NODE_ANNOTATION), error=str(exc))
        return False
    log.info("stale decision cleared from a pod that fits nowhere", pod=key,
             node=annotations.get(VGPU_NODE_ANNOTATION))
    return True

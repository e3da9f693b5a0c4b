"""The ``hami.io/vgpu-node`` label of a bound pod, where the API server drops a Binding's labels.

HAMi's vGPU monitor selects pods by that label, and a Binding carries it (scheduling/verbs/bind.py): an
API server with PodTopologyLabelsAdmission (on by default since Kubernetes 1.35) copies a
Binding's labels onto the pod in the same write as ``spec.nodeName``, so the label costs no
request. An older one copies only the annotations. Asking the API server which it is would cost
a request and still say nothing of the others behind the same load balancer, so each bound pod is
checked on the pod watch instead: an event showing it bound without the label has it patched, off
the critical path (the bind has answered). No event within ``LABEL_CHECK_S`` (the watch down or
far behind) patches it anyway: a patch is harmless.
"""
from __future__ import annotations

import asyncio

import structlog

from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.scheduling.decision.filter import VGPU_NODE_LABEL

log = structlog.get_logger(__name__)

LABEL_ATTEMPTS = 3
LABEL_CHECK_S = 30.0


class LabelFollower:
    """Bound pods whose watch event has yet to show the label: ``expect`` before the Binding
    (the watch may deliver the bound pod before the Binding's answer), ``observe_pod`` on every
    pod event (one dict lookup when nothing is awaited), ``forget`` for a bind that failed."""

    def __init__(self, *, client: KubeClient, check_s: float = LABEL_CHECK_S):
        self.client = client
        self.check_s = check_s
        # uid -> ((namespace, name, node), the timer that patches the label if no event shows it)
        self._awaiting: dict[str, tuple[tuple[str, str, str], asyncio.TimerHandle]] = {}
        self._patches: set[asyncio.Task] = set()

    def expect(self, *, uid: str, namespace: str, name: str, node: str) -> None:
        if not uid:
            return
        self.forget(uid)
        timer = asyncio.get_running_loop().call_later(self.check_s, self._unseen, uid)
        self._awaiting[uid] = ((namespace, name, node), timer)

    def forget(self, uid: str) -> tuple[str, str, str] | None:
        entry = self._awaiting.pop(uid, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]

    def observe_pod(self, kind: str, pod: dict) -> None:
        if not self._awaiting:
            return
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        entry = self._awaiting.get(uid) if uid else None
        if entry is None:
            return
        if kind == "DELETED":
            self.forget(uid)
            return
        namespace, name, node = entry[0]
        if (pod.get("spec") or {}).get("nodeName") != node:
            return                      # an event from before the Binding
        self.forget(uid)
        if (meta.get("labels") or {}).get(VGPU_NODE_LABEL) != node:
            self._patch_later(uid, namespace, name, node)

    def _unseen(self, uid: str) -> None:
        target = self.forget(uid)
        if target is not None:
            self._patch_later(uid, *target)

    def _patch_later(self, uid: str, namespace: str, name: str, node: str) -> None:
        task = asyncio.get_running_loop().create_task(self._patch(uid=uid, namespace=namespace, name=name, node=node))
        self._patches.add(task)
        task.add_done_callback(self._patches.discard)

    async def _patch(self, *, uid: str, namespace: str, name: str, node: str) -> None:
        body = {"metadata": {"uid": uid, "labels": {VGPU_NODE_LABEL: node}}}
        for attempt in range(LABEL_ATTEMPTS):
            try:
                await self.client.patch(pod_path(namespace, name), body)
                return
            except KubeApiError as exc:
                if exc.not_found or exc.conflict or attempt == LABEL_ATTEMPTS - 1:
                    log.warning("node label not set on bound pod", pod=f"{namespace}/{name}", node=node,
                                error=str(exc))
                    return
            await asyncio.sleep(0.2 * (2 ** attempt))

    async def close(self) -> None:
        """Let the patches in flight finish (at shutdown); labels still unseen are not waited for
        (the next leader's books do not need them; the monitor reads them late)."""
        for uid in list(self._awaiting):
            self.forget(uid)
        if self._patches:
            await asyncio.wait(set(self._patches), timeout=5)

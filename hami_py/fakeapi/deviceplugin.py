"""The device plugin's half of the bind handshake, for clusters without real GPUs.

On a real node, HAMi's device plugin sees the bound pod (``hami.io/bind-phase: allocating``),
hands it the devices named in ``hami.io/vgpu-devices-to-allocate``, marks it ``success`` and
releases the node lock. Without it the first bind would hold the node lock for its whole
five-minute expiry. This stand-in does the same over the API, through a watch, as the plugin does;
the demo, the simulator, the benchmarks and the end-to-end tests run it beside the scheduler.
"""
from __future__ import annotations

import asyncio

import structlog

from hami_py.k8s.client import KubeApiError, KubeClient, node_path, pod_path
from hami_py.k8s.informer import Informer
from hami_py.k8s.nodelock import LOCK_ANNOTATION

log = structlog.get_logger(__name__)


class SimulatedDevicePlugin:
    def __init__(self, client: KubeClient):
        self.client = client
        self.allocated = 0
        self._done: set[str] = set()
        self.informer = Informer(client=client, path="/api/v1/pods", on_event=self._on_event,
                                 on_relist=lambda items, rv: [self._on_event("ADDED", p) for p in items])
        self._pending: set[asyncio.Task] = set()

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()
        for task in list(self._pending):
            task.cancel()

    def _on_event(self, kind: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = meta.get("uid", "")
        if kind == "DELETED" or not node or ann.get("hami.io/bind-phase") != "allocating" or uid in self._done:
            return
        self._done.add(uid)
        task = asyncio.create_task(self._allocate(meta.get("namespace", ""), meta.get("name", ""), node))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _allocate(self, namespace: str, name: str, node: str) -> None:
        try:
            await self.client.patch(pod_path(namespace, name),
                                    {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}})
            for _ in range(10):  # the node may change under us (a handshake stamp): read again
                current = await self.client.get(node_path(node))
                meta = current.get("metadata") or {}
                lock = (meta.get("annotations") or {}).get(LOCK_ANNOTATION, "")
                if not lock.endswith(f",{namespace},{name}"):
                    break
                try:
                    await self.client.patch(node_path(node), {"metadata": {
                        "annotations": {LOCK_ANNOTATION: None}, "resourceVersion": meta.get("resourceVersion")}})
                    break
                except KubeApiError as exc:
                    if not exc.conflict:
                        raise
            self.allocated += 1
        except KubeApiError as exc:
            log.warning("simulated device plugin could not finish allocation", pod=f"{namespace}/{name}",
                        error=str(exc))

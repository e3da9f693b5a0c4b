"""The device plugin's half of the bind handshake, for clusters without real GPUs.

On a real node, HAMi's device plugin sees the bound pod (``hami.io/bind-phase: allocating``),
hands it the devices named in ``hami.io/vgpu-devices-to-allocate``, creates the MIG instances
reserved in ``hami.io/vgpu-mig-allocations`` and writes their identity (``migUUID``,
``gpuInstanceID``, ``computeInstanceID``) back into that annotation, marks it ``success`` and
releases the node lock. Without it the first bind would hold the node lock for its whole
five-minute expiry. This stand-in does the same over the API, through a watch, as the plugin does;
the demo, the simulator, the benchmarks and the end-to-end tests run it beside the scheduler.
"""
from __future__ import annotations

import asyncio
import uuid

import aiohttp

import orjson
import structlog

from hami_py.devices.nvidia import MIG_ALLOCATIONS_ANNOTATION
from hami_py.k8s.client import KubeApiError, KubeClient, pod_path
from hami_py.k8s.informer import Informer
from hami_py.k8s.nodelock import ExtraLock, NodeLocker

log = structlog.get_logger(__name__)

# The families whose plugins hold a lock of their own, by the allocation annotation that names
# the pod theirs: the simulated plugin releases it once it has "allocated", as the real one does.
ALLOCATION_RETRY_S = 60.0     # how long an answer the API server did not take is sent again
_OWN_LOCKS = {"hami.io/cambricon-mlu-devices-allocated": ExtraLock("cambricon.com/dsmlu.lock", 120.0)}


def realise_mig_instances(text: str) -> str | None:
    """The MIG allocation annotation with every reserved instance given the identity the plugin
    would read back from NVML once it has created it: a MIG UUID, a GPU instance id (here the
    placement start, unique on its GPU while the instance lives) and compute instance 0. None
    when the text is not a list of instances: it is then left as it is."""
    try:
        items = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return None
    for item in items:
        place = item.get("placement") if isinstance(item.get("placement"), dict) else {}
        start, size = place.get("start"), place.get("size")
        key = f"{item.get('gpuUUID')}/{item.get('profile')}/{start}/{size}"
        if item.get("migUUID") and item.get("gpuInstanceID") is not None \
                and item.get("computeInstanceID") is not None:
            continue    # created earlier (a repeated allocation): keep its identity
        item["migUUID"] = f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, key)}"
        item["gpuInstanceID"] = start if isinstance(start, int) else 0
        item["computeInstanceID"] = 0
    return orjson.dumps(items).decode()


class SimulatedDevicePlugin:
    """``allocation_delay_s``: how long each allocation takes before the plugin marks it done and
    frees the node lock (a real plugin's device setup; 0 = at once)."""

    def __init__(self, client: KubeClient, *, allocation_delay_s: float = 0.0):
        self.client = client
        self.locker = NodeLocker(client)   # releases only the lock its pod holds, as the plugin does
        self.allocation_delay_s = allocation_delay_s
        self.allocated = 0
        self._done: set[str] = set()
        self.informer = Informer(client=client, path="/api/v1/pods", on_event=self._on_event,
                                 on_relist=lambda items, rv: [self._on_event("ADDED", p) for p in items])
        self._pending: set[asyncio.Task] = set()
        # Nodes whose plugin hangs (fault injection): their pods are never answered, so each keeps
        # the node lock its bind took, as with a real plugin stuck in device setup.
        self.hung_nodes: set[str] = set()

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)   # before the client closes

    def _on_event(self, kind: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = meta.get("uid", "")
        if kind == "DELETED" or not node or ann.get("hami.io/bind-phase") != "allocating" or uid in self._done \
                or node in self.hung_nodes:
            return
        self._done.add(uid)
        mig = ann.get(MIG_ALLOCATIONS_ANNOTATION)
        own = tuple(lock for key, lock in _OWN_LOCKS.items() if key in ann)
        task = asyncio.create_task(self._allocate(meta.get("namespace", ""), meta.get("name", ""), node,
                                                  realise_mig_instances(mig) if mig else None, own, uid=uid))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _allocate(self, namespace: str, name: str, node: str, mig: str | None,
                        own: tuple[ExtraLock, ...] = (), *, uid: str = "") -> None:
        if self.allocation_delay_s > 0:
            await asyncio.sleep(self.allocation_delay_s)   # the simulated device set-up
        # An answer the API server did not take (down, refusing) is sent again with a backoff, as a
        # plugin retries an allocation it could not report: the pod's events may not come again
        # (a watch resumed after an outage replays nothing), and the node lock would otherwise be
        # held until it expires.
        delay = 0.1
        deadline = asyncio.get_running_loop().time() + ALLOCATION_RETRY_S
        while True:
            try:
                await self._answer(namespace, name, node, mig, own)
                return
            except KubeApiError as exc:
                failure = exc
                if exc.status not in (0, 429) and exc.status < 500:
                    break          # gone (404) or refused outright: sending it again changes nothing
            except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
                failure = exc
            if asyncio.get_running_loop().time() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        self._done.discard(uid)        # a later event of the pod may still finish it
        log.warning("simulated device plugin could not finish allocation", pod=f"{namespace}/{name}",
                    error=str(failure) or type(failure).__name__)

    async def _answer(self, namespace: str, name: str, node: str, mig: str | None,
                      own: tuple[ExtraLock, ...]) -> None:
        # The real plugin writes the MIG identity just before it marks success; one patch here.
        annotations = {"hami.io/bind-phase": "success"}
        if mig is not None:
            annotations[MIG_ALLOCATIONS_ANNOTATION] = mig
        await self.client.patch(pod_path(namespace, name), {"metadata": {"annotations": annotations}})
        released = await self.locker.release(node, namespace, name)
        if own:
            # A family's plugin releases its own lock too (Cambricon's: cambricon.com/dsmlu.lock).
            released = await self.locker.release_own(node, own) and released
        if not released:
            log.warning("simulated device plugin could not release the node lock", pod=f"{namespace}/{name}",
                        node=node)
            return
        self.allocated += 1

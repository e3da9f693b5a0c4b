"""What the benchmark's cluster process writes on its own: churn pods, their event streams, and
the device plugins' heartbeats, through an API that counts those commits.

The scheduler's writes are what the benchmark measures (requests per pod, settling), so the
cluster's own commits are counted as they are made (``CountingApi``) and /stats can tell the two
apart. The churn pods are rendered from one template, so that producing them never limits the
event rates measured; the heartbeats give the scheduler the steady background a real cluster
does. bench/cluster.py serves these over its control port.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

import orjson

from bench.seed import place, realistic_pod
from hami_py.aio import cancel_and_wait
from hami_py.devices.base import ContainerDevice
from hami_py.fakeapi import ApiError, FakeApiServer
from hami_py.fakeapi.objects import gpu_uuid

TICK_S = 0.005            # the steady event stream commits a batch this often
TRANSIENT_BACKLOG = 200   # pods the steady stream keeps between their add, update and delete
CHURN_NAMESPACE = "churn"
PLUGIN_PERIOD_S = 30.0    # HAMi's device plugin re-registers (and answers the handshake) this often
HANDSHAKE_ANNOTATION = "hami.io/node-handshake"


class CountingApi:
    """The fake API server's in-process API, counting the commits made through it, so that
    /stats can tell the scheduler's writes (everything else) from the cluster's own."""

    def __init__(self, api: FakeApiServer):
        self.api = api
        self.commits = 0

    def _counted(self, write, *args, **kwargs):
        before = self.api.resource_version
        try:
            return write(*args, **kwargs)
        finally:
            self.commits += self.api.resource_version - before

    def create(self, *args, **kwargs) -> dict:
        return self._counted(self.api.create, *args, **kwargs)

    def update(self, *args, **kwargs) -> dict:
        return self._counted(self.api.update, *args, **kwargs)

    def patch(self, *args, **kwargs) -> dict:
        return self._counted(self.api.patch, *args, **kwargs)

    def delete(self, *args, **kwargs) -> dict:
        return self._counted(self.api.delete, *args, **kwargs)

    def get(self, *args, **kwargs) -> dict | None:
        return self.api.get(*args, **kwargs)

    @property
    def foreign_writes(self) -> int:
        return self.api.resource_version - self.commits


class PluginHeartbeats:
    """HAMi's device plugin re-registers every 30 s on every node and answers the scheduler's
    ``Requesting_`` handshake stamp with ``Reported <time>``. Without it every stamp would expire
    60 s after start-up, all at once, and a real cluster never sees that; with it the scheduler
    sees the steady background a real cluster gives it (N/30 node writes a second, and its own
    re-stamps). The nodes take their turns spread evenly over the period."""

    def __init__(self, api: CountingApi, *, nodes: list[str], period_s: float = PLUGIN_PERIOD_S,
                 handshakes: dict[str, str] | None = None):
        self.api = api
        self.nodes = nodes
        # Node -> the handshake annotation its plugin answers (HAMi's NVIDIA one unless named:
        # an Ascend node's plugin answers hami.io/node-handshake-<commonWord>, a Kunlun node's none).
        self.handshakes = handshakes or {}
        self.period_s = period_s
        self.task: asyncio.Task | None = None
        self.paused = False     # while counting the scheduler's requests per pod: no stamps to answer

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        start, done = time.monotonic(), 0
        while True:
            due = int(len(self.nodes) * (time.monotonic() - start) / self.period_s)
            stamp = "Reported " + time.strftime("%Y-%m-%d %H:%M:%S")
            for turn in range(done, done if self.paused else due):
                name = self.nodes[turn % len(self.nodes)]
                key = self.handshakes.get(name, HANDSHAKE_ANNOTATION)
                if not key:
                    continue
                try:
                    self.api.patch("nodes", name, {"metadata": {"annotations": {key: stamp}}})
                except ApiError:
                    pass   # a node deleted meanwhile: nothing to report for it
            done = due
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        await cancel_and_wait(self.task)


def handshake_key(node: dict) -> str:
    """The handshake annotation the node's device plugin answers ("" for none)."""
    keys = [k for k in (node["metadata"].get("annotations") or {}) if k.startswith("hami.io/node-handshake")]
    return keys[0] if keys else ""


class ChurnPods:
    """Short-lived placed pods (one GPU, 1 GiB each) for the burst and the steady stream.

    Each is rendered from one template by replacing its name, node and GPU: building a pod from
    scratch costs more than committing it, and the producer must not be what limits the rate."""

    _NAME, _NODE, _UUID = "churn-name-placeholder", "node-placeholder", "GPU-uuid-placeholder"

    def __init__(self, nodes: list[str]):
        if not nodes:
            raise ValueError("churn pods need at least one node")
        self.nodes = nodes
        pod = realistic_pod(self._NAME, namespace=CHURN_NAMESPACE, gpus=1, gpumem=1024, gpucores=None, app="churn")
        place(pod, node=self._NODE, devices=[ContainerDevice(self._UUID, "NVIDIA", 1024, 0)])
        self._added = orjson.dumps(pod)
        pod["metadata"]["labels"]["bench.hami.io/seen"] = "1"
        self._updated = orjson.dumps(pod)
        self._uuids: dict[tuple[int, int], bytes] = {}

    @staticmethod
    def name(serial: int) -> str:
        return f"churn-{serial:08d}"

    def _render(self, template: bytes, serial: int) -> dict:
        n = serial % len(self.nodes)
        node = self.nodes[n]
        uuid = self._uuids.get((n, serial % 8))
        if uuid is None:
            uuid = self._uuids[(n, serial % 8)] = gpu_uuid(node, serial % 8).encode()
        raw = (template.replace(self._NAME.encode(), self.name(serial).encode())
               .replace(self._NODE.encode(), node.encode()).replace(self._UUID.encode(), uuid))
        return orjson.loads(raw)

    def added(self, serial: int) -> dict:
        return self._render(self._added, serial)

    def updated(self, serial: int) -> dict:
        """The same pod with one more label (a MODIFIED event that changes no allocation)."""
        return self._render(self._updated, serial)


class EventStream:
    """Pod add → update → delete cycles on the given nodes, at a steady rate, in small batches."""

    def __init__(self, api: CountingApi, *, pods: ChurnPods, rate: float, seconds: float, first_serial: int):
        self.api = api
        self.pods = pods
        self.rate = rate
        self.seconds = seconds
        self.events = 0
        self.serial = first_serial
        self.t_start = 0.0
        self.t_end: float | None = None
        self.created: deque[int] = deque()
        self.updated: deque[int] = deque()
        self.task: asyncio.Task | None = None

    def _update(self, serial: int) -> None:
        self.api.update("pods", self.pods.updated(serial))
        self.updated.append(serial)

    def _delete(self, serial: int) -> None:
        self.api.delete("pods", self.pods.name(serial), namespace=CHURN_NAMESPACE)

    def step(self) -> None:
        """Commit one event: the oldest pending delete, else update, else a new pod."""
        if len(self.updated) > TRANSIENT_BACKLOG or (self.updated and not self.created):
            self._delete(self.updated.popleft())
        elif len(self.created) > TRANSIENT_BACKLOG:
            self._update(self.created.popleft())
        else:
            self.serial += 1
            self.api.create("pods", self.pods.added(self.serial))
            self.created.append(self.serial)
        self.events += 1

    def drain(self) -> None:
        """Update, then delete, what the stream still holds, as the stream would have."""
        while self.created:
            self._update(self.created.popleft())
            self.events += 1
        while self.updated:
            self._delete(self.updated.popleft())
            self.events += 1

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        self.t_start = time.monotonic()
        deadline = self.t_start + self.seconds
        while (now := time.monotonic()) < deadline:
            due = int(self.rate * (now - self.t_start)) - self.events
            for _ in range(max(due, 0)):
                self.step()
            await asyncio.sleep(TICK_S)
        self.drain()
        self.t_end = time.monotonic()

    def status(self) -> dict:
        return {"events": self.events, "t_start": self.t_start, "t_end": self.t_end,
                "running": self.t_end is None, "rate": self.rate}

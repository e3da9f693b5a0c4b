"""Remote GPUs ("lupine", HAMi #3004/#3013): a GPU-less pod given every card of one GPU server.

A lupine server node serves its GPUs over the network; a client pod runs on any other node and
reaches the server through ``LUPINE_SERVER``. The server node is labelled
``hami.io/lupine-server=<port>`` and its NVIDIA device plugin registers the served cards in the
usual ``hami.io/node-nvidia-register`` with mode ``remote`` (the NVIDIA family skips them). Here
they are devices of the server node in the books, ids ``<server>/<GPU-UUID>``, type
``RemoteGPU``, one task each, each carrying its server's endpoint (InternalIP:port).

Unlike every other family, the devices a pod gets are not its node's: the family is ``pooled``
(hami_py/devices/base.py). Its requests are no kernel rows; the filter's pool step asks
:meth:`RemoteGPUVendor.pool_choice` once per /filter (the fit in :mod:`.pool`), charges the chosen
cards to their server (:meth:`charge_node`), and refuses the pod on server nodes. There is no
handshake (the client node runs no device plugin; upstream's health is always good), no node lock
and no score. The decision writes ``hami.io/remote-gpu-devices-to-allocate`` /
``-allocated`` (the usual device list) and ``hami.io/lupine-endpoint`` (``host:port``), which
the webhook's ``LUPINE_SERVER`` reads through the downward API (:mod:`.injection`).
"""
from __future__ import annotations

import structlog

from hami_py.devices.base import (
    ContainerRequest, DeviceDecodeError, DeviceInfo, DeviceVendor, NodeView, PodDevices,
)
from hami_py.devices.codec import decode_json_devices, decode_legacy_devices, decode_pod_devices, encode_pod_devices
from hami_py.devices.nvidia import REGISTER_ANNOTATION as NVIDIA_REGISTER_ANNOTATION
from hami_py.devices.nvidia.vendor import REMOTE_MODE
from hami_py.devices.remotegpu.busy import BusyCards
from hami_py.devices.remotegpu.config import SERVER_LABEL, RemoteGPUConfig, server_port
from hami_py.devices.remotegpu.injection import ENDPOINT_ANNOTATION, inject
from hami_py.devices.remotegpu.pool import choose, servers_of
from hami_py.devices.template import MISSING, device_count, lookup, resource_lists, whole_number
from hami_py import reasons as R
from hami_py.quantity import INT32_MAX

log = structlog.get_logger(__name__)

VENDOR_KEY = "RemoteGPU"
HANDSHAKE_ANNOTATION = "hami.io/node-handshake-remote-gpu"   # upstream's name; it does no handshake
TO_ALLOCATE_ANNOTATION = "hami.io/remote-gpu-devices-to-allocate"
ALLOCATED_ANNOTATION = "hami.io/remote-gpu-devices-allocated"
MEMORY_PERCENT_UNSET = 101


def endpoint_of(ip: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class RemoteGPUVendor(DeviceVendor):
    """Upstream's ``RemoteGPU`` backend."""

    vendor_key = VENDOR_KEY
    to_allocate_annotation = TO_ALLOCATE_ANNOTATION
    allocated_annotation = ALLOCATED_ANNOTATION
    uses_node_lock = False          # no device plugin on the client node would ever release it
    pooled = True                   # off (no count name): set False per instance, see __init__

    def __init__(self, config: RemoteGPUConfig):
        self.config = config
        # Off (no count name, the chart's default): nothing pooled, no annotation claimed (the
        # books, the stale-decision cleanup and the webhook's owned keys never name the family).
        self.pooled = bool(config.resource_count_name)
        if not self.pooled:
            self.to_allocate_annotation, self.allocated_annotation = None, ""
        self.busy = BusyCards()
        # The server nodes: every node ever seen labelled hami.io/lupine-server, with its endpoint
        # ("" without an InternalIP). Where the pool is looked for on each /filter instead of among
        # every node of the cluster, and what makes the per-node refusal one set lookup. Only a
        # hint, never shrunk (one vendor may serve several books: the simulator's, the
        # defragmenter's; and it is not told of a node's removal): the books confirm it.
        self._servers: dict[str, str] = {}

    # -- resources -----------------------------------------------------------------------------

    def resource_names(self) -> list[str]:
        count, memory = self.config.resource_count_name, self.config.resource_memory_name
        return [name for name in (count, memory) if name] if count else []

    def request_resources(self) -> tuple[str, str, str, int]:
        return self.config.resource_count_name, self.config.resource_memory_name, "", 1

    def request_resource_names(self) -> frozenset[str]:
        """The count gates the request (none when the family is off), then the memory."""
        count, memory = self.config.resource_count_name, self.config.resource_memory_name
        return frozenset(name for name in (count, memory) if name) if count else frozenset()

    # -- inventory -----------------------------------------------------------------------------

    def registration_inputs(self, node: NodeView) -> object:
        if not self.config.resource_count_name or SERVER_LABEL not in node.labels:
            return None
        return node.annotations.get(NVIDIA_REGISTER_ANNOTATION), node.labels[SERVER_LABEL], node.internal_ip

    def registration_source(self) -> str:
        return f"{NVIDIA_REGISTER_ANNOTATION} (remote mode)"

    def parse_node_devices(self, node: NodeView) -> list[DeviceInfo]:
        """The cards a server node serves: its NVIDIA registration's ``remote``-mode entries, on a
        node labelled ``hami.io/lupine-server`` with an InternalIP; [] anywhere else."""
        if not self.config.resource_count_name or SERVER_LABEL not in node.labels:
            return []
        endpoint = (endpoint_of(node.internal_ip, server_port(node.labels[SERVER_LABEL], self.config.port))
                    if node.internal_ip else "")
        self._servers[node.name] = endpoint         # before the decode: a garbled one is a server too
        return self._served(node, endpoint)

    def _served(self, node: NodeView, endpoint: str) -> list[DeviceInfo]:
        text = node.annotations.get(NVIDIA_REGISTER_ANNOTATION)
        if text is None:
            return []
        if not endpoint:
            log.warning("lupine server node has no InternalIP; its GPUs are not offered", node=node.name)
            return []
        try:
            devices = decode_json_devices(text) if text.lstrip().startswith("[") else decode_legacy_devices(text)
        except DeviceDecodeError as err:
            raise DeviceDecodeError(f"{NVIDIA_REGISTER_ANNOTATION}: {err}") from None
        return [DeviceInfo(id=f"{node.name}/{d.id}", index=d.index, count=1, devmem=d.devmem, devcore=100,
                           type=VENDOR_KEY, numa=d.numa, mode=d.mode, health=d.health,
                           custom={"uuid": d.id, "endpoint": endpoint, "model": d.type})
                for d in devices if d.mode == REMOTE_MODE]

    # -- requests and admission ----------------------------------------------------------------

    def container_request(self, container: dict, *, pod_annotations: dict[str, str]) -> ContainerRequest | None:
        """A count (0..MaxInt32; 0 or none: no request) and an optional memory in MiB, a filter
        on the cards (0..MaxInt32). Raises RequestError naming the container and the value."""
        count_name = self.config.resource_count_name
        if not count_name:
            return None
        name = str(container.get("name") or "")
        limits, requests = resource_lists(container)
        raw = lookup(limits, requests, count_name)
        if raw is MISSING:
            return None
        nums = device_count(name, count_name, raw)
        if nums == 0:
            return None
        memory = 0
        raw_memory = lookup(limits, requests, self.config.resource_memory_name)
        if raw_memory is not MISSING:
            memory = whole_number(name, self.config.resource_memory_name, raw_memory, low=0, high=INT32_MAX,
                                  unit="MiB")
        return ContainerRequest(VENDOR_KEY, nums, memory, MEMORY_PERCENT_UNSET, 100)

    def mutate_admission(self, container: dict, pod: dict) -> bool:
        return inject(container, pod, count_resource=self.config.resource_count_name,
                      memory_resource=self.config.resource_memory_name, lib_image=self.config.lib_image)

    # -- the pool ------------------------------------------------------------------------------

    def charge_node(self, device_id: str, pod_node: str) -> str:
        server, sep, _ = device_id.partition("/")
        return server if sep and server else pod_node

    def pool_refusal(self, cache, node: str) -> str | None:
        # A server serves its cards to others and offers none to its own pods (upstream: nil).
        if node not in self._servers:
            return None                 # every client node: one set lookup
        entry = cache.nodes.get(node)
        return R.NODE_INSUFFICIENT_DEVICE_TEXT if entry is not None and SERVER_LABEL in entry.labels else None

    def servers(self, cache):
        return servers_of(cache, cache.vendor_ids[VENDOR_KEY], list(self._servers))

    def server_nodes(self, cache) -> dict[str, str]:
        """The server nodes the books know now, each with its endpoint ("" without an InternalIP):
        what the leader keeps a session stub on (hami_py/k8s/lupine_sessions.py)."""
        nodes = cache.nodes
        return {name: endpoint for name, endpoint in sorted(self._servers.items())
                if (entry := nodes.get(name)) is not None and SERVER_LABEL in entry.labels}

    def pool_choice(self, cache, asks: list[tuple[int, ContainerRequest]], containers: int,
                    pod_annotations: dict[str, str]) -> PodDevices | str:
        servers = self.servers(cache)
        answer, conflict = choose(cache, servers, asks, self.busy, VENDOR_KEY, containers)
        if conflict or not all(self.busy.polled(s.endpoint) for s in servers):
            self.busy.ask_early()
        if not isinstance(answer, str):
            endpoint = next((s.endpoint for s in servers
                             if any(d.uuid.startswith(s.name + "/") for c in answer for d in c)), "")
            for devices in answer:
                for device in devices:
                    device.custom = {"endpoint": endpoint}
        return answer

    def background(self, cache) -> list:
        if not self.config.resource_count_name or not self.config.read_server_metrics:
            return []
        return [self.busy.run(lambda: {s.endpoint for s in self.servers(cache)})]

    # -- allocation annotations ----------------------------------------------------------------

    def encode_allocation(self, pod_devices: PodDevices, *, node: str = "", partitions: list[dict] = (),
                          now: float = 0.0, pod_annotations: dict[str, str] | None = None) -> dict[str, str]:
        if not any(pod_devices):
            return {}
        text = encode_pod_devices(pod_devices)
        out = {TO_ALLOCATE_ANNOTATION: text, ALLOCATED_ANNOTATION: text}
        endpoint = next((str((d.custom or {}).get("endpoint") or "") for c in pod_devices for d in c), "")
        if endpoint:
            out[ENDPOINT_ANNOTATION] = endpoint
        return out

    def decision_annotations(self) -> tuple[str, ...]:
        return (TO_ALLOCATE_ANNOTATION, ALLOCATED_ANNOTATION, ENDPOINT_ANNOTATION) if self.pooled else ()

    def decode_allocation(self, annotations: dict[str, str]) -> PodDevices | None:
        text = annotations.get(ALLOCATED_ANNOTATION)
        return None if text is None else decode_pod_devices(text)

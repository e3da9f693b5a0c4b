"""Upstream HAMi's device and pod allocation gauges, rendered from the usage cache at scrape time.

Dashboards and alerts built for upstream select on these names and labels
(``hami-protocol.md`` §12): per device ``hami_gpu_*`` and ``hami_node_gpu_*``, per pod device
entry ``hami_vgpu_*``, per MIG instance the device plugin has created
``hami_node_gpu_mig_instance_info``, all with the constant label ``zone="vGPU"``, memory in bytes
(MiB × 1048576), core counts as each family reports them (``DeviceVendor.core_metrics``); with ``--legacy-metrics`` also the old
camel-case names.

Why not a prometheus-client Collector: at 5 000 nodes × 8 GPUs with 40 000 pods one scrape is
360 000 samples, 63 MB of text. As ``Metric`` objects formatted by ``generate_latest`` that took
~15 s on the development machine, all of it on the event loop that serves /filter. So the text is
written directly, and each node's (and pod's) lines are kept until its devices or usage change
(a pod's record is replaced, never edited, when its allocation changes): a steady-state scrape
fingerprints every node, checks every pod's identity and joins cached bytes, allocating almost
nothing. The cache is read in chunks with a yield to the event loop in between, so a scrape
delays a /filter by one chunk, not by the whole scrape; the text is then sent one metric family
at a time. Each node and each pod is rendered in one synchronous stretch and is thus
self-consistent; different nodes may be read a few milliseconds apart.

A pooled family's devices (remote GPUs, served over the network to pods on other nodes) are
left out of the per-node families, as upstream leaves them out (#3004: its pool is listed under
every client node, so per-node series would repeat each card), and reported per server instead:
``hami_remote_gpu_memory_limit_bytes`` (the card's memory), ``hami_remote_gpu_allocated`` (1 when
the card is given to a pod, cards are given whole) and ``hami_remote_gpu_overview`` (the memory
allocated, in bytes: the card's when given), labelled ``server``, ``endpoint``, ``device_uuid``
(the pool's id, ``<server>/<GPU-UUID>``, as in the pods' annotations), ``device_index``,
``device_type`` and ``zone``. Upstream's names and label names are from its change; what its
overview's value is was not found, so it follows ``hami_node_gpu_overview`` (docs/devices/remotegpu.md).

Quota gauges (``hami_resource_quota_used`` / ``_limit``) come from the ``quotas`` callable
(``quota_samples`` of the cache's QuotaBook); without one nothing is emitted for them.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Generator, Iterable, Iterator

from hami_py.cache.usage import NodeEntry, PodUsage, UsageCache
from hami_py.devices.base import MODE_MIG

MIB = 1048576
ZONE = "vGPU"
# Work between two yields to the event loop: about 10-50 ms each on a slow machine.
NODES_PER_CHUNK = 100           # nodes re-rendered
NODES_CHECKED_PER_CHUNK = 1000  # nodes checked
PODS_PER_CHUNK = 2000           # pods re-rendered
PODS_CHECKED_PER_CHUNK = 5000   # pods checked
PARTS_PER_WRITE = 500           # nodes (or pods) per chunk of text handed to the HTTP layer


@dataclass(slots=True, frozen=True)
class QuotaSample:
    """One namespace quota on one device resource, as the quota tracker will report it."""
    namespace: str
    quota_name: str
    used: int
    limit: int
    limit_set: bool


# (name, help) per family, in output order. Device families first, then legacy device families.
DEVICE_FAMILIES = (
    ("hami_gpu_memory_limit_bytes", "Memory of a GPU, in bytes."),
    ("hami_gpu_core_limit_ratio", "Compute of a GPU (100 = the whole device)."),
    ("hami_gpu_memory_allocated_bytes", "GPU memory allocated to pods, in bytes."),
    ("hami_gpu_shared_count", "Number of pod shares (containers) placed on a GPU."),
    ("hami_gpu_core_allocated_ratio", "GPU compute allocated to pods (100 = the whole device)."),
    ("hami_node_gpu_overview", "GPU memory allocated to pods, in bytes, with the device's limits as labels."),
    ("hami_node_gpu_memory_allocated_ratio", "Fraction of a GPU's memory allocated to pods."),
)
LEGACY_DEVICE_FAMILIES = (
    ("GPUDeviceMemoryLimit", "Memory of a GPU, in bytes (legacy name)."),
    ("GPUDeviceCoreLimit", "Compute of a GPU (legacy name)."),
    ("GPUDeviceMemoryAllocated", "GPU memory allocated to pods, in bytes (legacy name)."),
    ("GPUDeviceSharedNum", "Number of pod shares placed on a GPU (legacy name)."),
    ("GPUDeviceCoreAllocated", "GPU compute allocated to pods (legacy name)."),
    ("nodeGPUOverview", "GPU memory allocated to pods, in bytes (legacy name)."),
    ("nodeGPUMemoryPercentage", "Fraction of a GPU's memory allocated to pods (legacy name)."),
)
# The MIG instance family is per device upstream, but its lines come from the pods' MIG records
# (hami.io/vgpu-mig-allocations), so they are rendered and cached with each pod.
POD_FAMILIES = (
    ("hami_vgpu_memory_allocated_bytes", "GPU memory allocated to a pod on one device, in bytes."),
    ("hami_vgpu_core_allocated_ratio", "GPU compute allocated to a pod on one device."),
    ("hami_node_gpu_mig_instance_info",
     "A MIG instance the device plugin created on a GPU in mig mode (always 1): its identity and placement."),
)
LEGACY_POD_FAMILIES = (
    ("vGPUMemoryAllocated", "GPU memory allocated to a pod on one device, in bytes (legacy name)."),
    ("vGPUCoreAllocated", "GPU compute allocated to a pod on one device (legacy name)."),
    ("nodeGPUMigInstance",
     "A MIG instance created on a GPU (always 1; legacy name, migname is <profile>-<GPU instance id>)."),
)
REMOTE_GPU_FAMILIES = (
    ("hami_remote_gpu_memory_limit_bytes", "Memory of a remote GPU (a card a lupine server serves), in bytes."),
    ("hami_remote_gpu_allocated", "1 when a remote GPU is given to a pod (cards are given whole), else 0."),
    ("hami_remote_gpu_overview", "Remote GPU memory allocated to pods, in bytes (the whole card when given)."),
)
QUOTA_FAMILIES = (
    ("hami_resource_quota_used", "Device resource used in a namespace quota."),
    ("hami_resource_quota_limit", "Device resource limit of a namespace quota."),
)
LEGACY_QUOTA_FAMILIES = (
    ("QuotaUsed", "Device resource used in a namespace quota (legacy name)."),
)


def quota_samples(book) -> Iterator[QuotaSample]:
    """What upstream's quota cache reports, from the usage cache's QuotaBook: per namespace, one
    sample per device resource that is either limited by a ResourceQuota or used by a pod there
    (then with limit 0, not set), named by resource (``nvidia.com/gpumem``)."""
    names = {target: resource for resource, target in book.resources.items()}
    for ns in sorted(book.used.keys() | book.limits.keys()):
        used, limits = book.used.get(ns, {}), book.limits.get(ns, {})
        for key in sorted(used.keys() | limits.keys()):
            if key in names:
                yield QuotaSample(ns, names[key], used=used.get(key, 0), limit=limits.get(key, 0),
                                  limit_set=key in limits)


def escape(value: str) -> str:
    """A label value for the text exposition format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _header(name: str, help_text: str) -> bytes:
    return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode()


@dataclass(slots=True)
class _DeviceLabels:
    """Label strings of one device, kept while the node's registration is unchanged."""
    l4: str     # node, device_uuid, device_index, device_type
    l5: str     # ... + device_cores
    l6: str     # ... + device_cores, device_memory_limit
    g3: str     # legacy: nodeid, deviceuuid, deviceidx
    g4: str     # legacy: + devicetype
    g5: str     # legacy: + devicecores
    g6: str     # legacy: + devicecores, devicememorylimit
    remote: str = ""   # a pooled family's device: server, endpoint, device_uuid, device_index, device_type


@dataclass(slots=True)
class _NodeLines:
    devices: list            # the NodeEntry.devices list these lines were made from (identity)
    usage: bytes             # the node's used/used_mem/used_cores slices when they were made
    labels: list[_DeviceLabels]
    parts: tuple[bytes, ...]  # one chunk of lines per device family


@dataclass(slots=True)
class _PodLines:
    pod: PodUsage             # the record these lines were made from (identity)
    parts: tuple[bytes, ...]  # one chunk of lines per pod family


class AllocationMetrics:
    def __init__(self, cache: UsageCache, *, legacy: bool = False, zone: str = ZONE,
                 quotas: Callable[[], Iterable[QuotaSample]] | None = None):
        self.cache = cache
        self.legacy = legacy
        self.zone = escape(zone)
        self.quotas = quotas
        self.device_families = DEVICE_FAMILIES + (LEGACY_DEVICE_FAMILIES if legacy else ()) + REMOTE_GPU_FAMILIES
        self.pod_families = POD_FAMILIES + (LEGACY_POD_FAMILIES if legacy else ())
        self._nodes: dict[str, _NodeLines] = {}
        self._pods: dict[str, _PodLines] = {}
        self._lock = asyncio.Lock()
        self._vendor_of_id = list(cache.vendors.values())   # vendor id (device column) -> vendor

    # -- entry points --------------------------------------------------------------------------
    async def chunks(self) -> AsyncIterator[bytes]:
        """The exposition text, one metric family at a time. The cache is read in chunks with a
        yield to the event loop in between; the caller may await (send) between families."""
        async with self._lock:   # one reader of the cache at a time; sending needs no lock
            steps = self._collect()
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    node_parts, pod_parts = done.value
                    break
                await asyncio.sleep(0)
        for chunk in self._families(node_parts, pod_parts):
            yield chunk

    def render_now(self) -> bytes:
        """The whole text in one synchronous stretch (tests, benchmarks, tools)."""
        steps = self._collect()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return b"".join(self._families(*done.value))

    # -- reading the cache, as a generator that pauses between chunks --------------------------
    def _collect(self) -> Generator[None, None, tuple[list, list]]:
        # Names are listed up front and each record is looked up when its turn comes, so a node
        # or pod deleted (or replaced) while we were paused is skipped (or read anew).
        cache = self.cache
        node_parts: list[tuple[bytes, ...]] = []
        rendered = 0
        for i, name in enumerate(list(cache.nodes)):
            if i and i % NODES_CHECKED_PER_CHUNK == 0 or rendered >= NODES_PER_CHUNK:
                yield
                rendered = 0
            entry = cache.nodes.get(name)
            if entry is None:
                continue
            if entry.length == 0:
                if name in self._nodes:
                    self._drop_node(name)
                continue
            lines = self._nodes.get(name)
            if lines is None or not self._node_lines_current(lines, entry):
                lines = self._render_node(name, entry)
                rendered += 1
            node_parts.append(lines.parts)
        for name in self._nodes.keys() - cache.nodes.keys():
            self._drop_node(name)

        # Steady state is two lookups and an identity test per pod: a pod's lines change only
        # with its PodUsage record (replaced, never edited, when its allocation changes) or with
        # its node's registration (handled in _render_node).
        pod_parts: list[tuple[bytes, ...]] = []
        cached, pods = self._pods, cache.pods
        rendered = 0
        for i, uid in enumerate(list(pods)):
            if i and i % PODS_CHECKED_PER_CHUNK == 0 or rendered >= PODS_PER_CHUNK:
                yield
                rendered = 0
            pod = pods.get(uid)
            if pod is None:
                continue
            lines = cached.get(uid)
            if lines is None or lines.pod is not pod:
                lines = cached[uid] = _PodLines(pod, self._pod_parts(pod))
                rendered += 1
            pod_parts.append(lines.parts)
        for uid in cached.keys() - pods.keys():
            del cached[uid]
        return node_parts, pod_parts

    def _families(self, node_parts: list[tuple[bytes, ...]],
                  pod_parts: list[tuple[bytes, ...]]) -> Iterator[bytes]:
        yield from _family_chunks(self.device_families, node_parts)
        yield from _family_chunks(self.pod_families, pod_parts)
        if self.quotas is not None:
            yield from _family_chunks(QUOTA_FAMILIES + (LEGACY_QUOTA_FAMILIES if self.legacy else ()),
                                      [self._quota_parts()])

    # -- nodes ---------------------------------------------------------------------------------
    def _usage_key(self, entry: NodeEntry) -> bytes:
        cache = self.cache
        a, b = entry.offset, entry.offset + entry.length
        return cache.used[a:b].tobytes() + cache.used_mem[a:b].tobytes() + cache.used_cores[a:b].tobytes()

    def _node_lines_current(self, lines: _NodeLines, entry: NodeEntry) -> bool:
        return lines.devices is entry.devices and lines.usage == self._usage_key(entry)

    def _render_node(self, name: str, entry: NodeEntry) -> _NodeLines:
        cached = self._nodes.get(name)
        if cached is not None and cached.devices is entry.devices:
            labels = cached.labels
        else:
            labels = self._device_labels(name, entry)
            self._forget_pods_on(name)   # their core conversion reads this node's devices
        lines = _NodeLines(entry.devices, self._usage_key(entry), labels, self._device_parts(entry, labels))
        self._nodes[name] = lines
        return lines

    def _drop_node(self, name: str) -> None:
        del self._nodes[name]
        self._forget_pods_on(name)

    def _forget_pods_on(self, name: str) -> None:
        for uid in self.cache.node_pods.get(name, ()):
            self._pods.pop(uid, None)

    def _device_labels(self, name: str, entry: NodeEntry) -> list[_DeviceLabels]:
        cache, z, node = self.cache, self.zone, escape(name)
        out = []
        for k, dev in enumerate(entry.devices[:entry.length]):
            j = entry.offset + k
            uuid, idx, typ = escape(dev.id), str(dev.index), escape(dev.type)
            cores, mem = cache.total_cores[j], cache.total_mem[j]
            base = f'node="{node}",device_uuid="{uuid}",device_index="{idx}"'
            old = f'nodeid="{node}",deviceuuid="{uuid}",deviceidx="{idx}"'
            remote = ""
            if self._vendor_of_id[cache.vendor[j]].pooled:
                endpoint = escape(str((dev.custom or {}).get("endpoint") or ""))
                remote = (f'server="{node}",endpoint="{endpoint}",device_uuid="{uuid}",device_index="{idx}",'
                          f'device_type="{typ}",zone="{z}"')
            out.append(_DeviceLabels(
                l4=f'{base},device_type="{typ}",zone="{z}"',
                l5=f'{base},device_cores="{cores}",device_type="{typ}",zone="{z}"',
                l6=f'{base},device_cores="{cores}",device_memory_limit="{mem}",device_type="{typ}",zone="{z}"',
                g3=f'{old},zone="{z}"',
                g4=f'{old},devicetype="{typ}",zone="{z}"',
                g5=f'{old},devicecores="{cores}",devicetype="{typ}",zone="{z}"',
                g6=f'{old},devicecores="{cores}",devicememorylimit="{mem}",devicetype="{typ}",zone="{z}"',
                remote=remote,
            ))
        return out

    def _device_parts(self, entry: NodeEntry, labels: list[_DeviceLabels]) -> tuple[bytes, ...]:
        cache = self.cache
        cols: list[list[str]] = [[] for _ in self.device_families]
        (mem_limit, core_limit, mem_alloc, shared, core_alloc, overview, mem_ratio) = cols[:7]
        legacy = cols[7:-len(REMOTE_GPU_FAMILIES)]
        remote_limit, remote_allocated, remote_overview = cols[-len(REMOTE_GPU_FAMILIES):]
        for k, (dev, lab) in enumerate(zip(entry.devices, labels)):
            j = entry.offset + k
            total_mem, total_cores = cache.total_mem[j], cache.total_cores[j]
            used, used_mem, used_cores = cache.used[j], cache.used_mem[j], cache.used_cores[j]
            if lab.remote:      # a pooled family's card: per server, not per node (see the docstring)
                remote_limit.append(f"hami_remote_gpu_memory_limit_bytes{{{lab.remote}}} {total_mem * MIB}\n")
                remote_allocated.append(f"hami_remote_gpu_allocated{{{lab.remote}}} {1 if used > 0 else 0}\n")
                remote_overview.append(f"hami_remote_gpu_overview{{{lab.remote}}} {used_mem * MIB}\n")
                continue
            cores_limit, cores_alloc = self._vendor_of_id[cache.vendor[j]].core_metrics(total_cores, used_cores)
            limit_bytes, used_bytes = total_mem * MIB, used_mem * MIB
            mem_limit.append(f"hami_gpu_memory_limit_bytes{{{lab.l4}}} {limit_bytes}\n")
            core_limit.append(f"hami_gpu_core_limit_ratio{{{lab.l4}}} {cores_limit}\n")
            mem_alloc.append(f"hami_gpu_memory_allocated_bytes{{{lab.l5}}} {used_bytes}\n")
            shared.append(f"hami_gpu_shared_count{{{lab.l4}}} {used}\n")
            core_alloc.append(f"hami_gpu_core_allocated_ratio{{{lab.l4}}} {cores_alloc}\n")
            overview.append(f"hami_node_gpu_overview{{{lab.l6}}} {used_bytes}\n")
            if total_mem > 0:
                mem_ratio.append(f"hami_node_gpu_memory_allocated_ratio{{{lab.l4}}} {used_mem / total_mem!r}\n")
            if legacy:
                # Legacy core values stay raw (no vendor conversion), as upstream's do.
                (g_mem_limit, g_core_limit, g_mem_alloc, g_shared, g_core_alloc, g_overview, g_ratio) = legacy
                g_mem_limit.append(f"GPUDeviceMemoryLimit{{{lab.g4}}} {limit_bytes}\n")
                g_core_limit.append(f"GPUDeviceCoreLimit{{{lab.g4}}} {total_cores}\n")
                g_mem_alloc.append(f"GPUDeviceMemoryAllocated{{{lab.g5}}} {used_bytes}\n")
                g_shared.append(f"GPUDeviceSharedNum{{{lab.g4}}} {used}\n")
                g_core_alloc.append(f"GPUDeviceCoreAllocated{{{lab.g4}}} {used_cores}\n")
                g_overview.append(f"nodeGPUOverview{{{lab.g6}}} {used_bytes}\n")
                if total_mem > 0:
                    g_ratio.append(f"nodeGPUMemoryPercentage{{{lab.g3}}} {used_mem / total_mem!r}\n")
        return tuple("".join(col).encode() for col in cols)

    # -- pods ----------------------------------------------------------------------------------
    def _pod_parts(self, pod: PodUsage) -> tuple[bytes, ...]:
        cache, z = self.cache, self.zone
        node = cache.nodes.get(pod.node)
        cols: list[list[str]] = [[] for _ in self.pod_families]
        ns, node_name, name = escape(pod.namespace), escape(pod.node), escape(pod.name)
        for e in pod.entries:
            if not e.uuid:
                continue
            # One collapsed entry per device (init containers folded in), so container_index is 0.
            lab = f'namespace="{ns}",node="{node_name}",pod="{name}",container_index="0",device_uuid="{escape(e.uuid)}",zone="{z}"'
            mem_bytes = e.mem * MIB
            cores = e.cores
            j = node.uuid_to_slot.get(e.uuid, -1) if node is not None else -1
            if j >= 0 and 0 <= j - node.offset < len(node.devices):
                cores = self._vendor_of_id[cache.vendor[j]].core_metrics(cache.total_cores[j], e.cores)[1]
            cols[0].append(f"hami_vgpu_memory_allocated_bytes{{{lab}}} {mem_bytes}\n")
            cols[1].append(f"hami_vgpu_core_allocated_ratio{{{lab}}} {cores}\n")
            if self.legacy:
                glab = (f'podnamespace="{ns}",nodename="{node_name}",podname="{name}",containeridx="0",'
                        f'deviceuuid="{escape(e.uuid)}",zone="{z}"')
                cols[3].append(f"vGPUMemoryAllocated{{{glab}}} {mem_bytes}\n")
                cols[4].append(f"vGPUCoreAllocated{{{glab}}} {e.cores}\n")
        if pod.mig and node is not None:
            self._mig_lines(pod, node, node_name, cols)
        return tuple("".join(col).encode() for col in cols)

    def _mig_lines(self, pod: PodUsage, node: NodeEntry, node_name: str, cols: list[list[str]]) -> None:
        """One line per MIG instance whose identity the device plugin has written, on a GPU of the
        pod's node that is registered in mig mode (upstream's rule; other instances are not shown)."""
        z = self.zone
        for inst in pod.mig:
            if len(inst) == 2:
                continue        # reserved, not created yet
            gpu, mask, profile, mig_uuid, gi_id, ci_id = inst
            j = node.uuid_to_slot.get(gpu, -1)
            k = j - node.offset
            if j < 0 or not 0 <= k < len(node.devices) or node.devices[k].mode != MODE_MIG:
                continue
            start, size = (mask & -mask).bit_length() - 1, mask.bit_count()
            dev_uuid, dev_index, prof = escape(gpu), str(node.devices[k].index), escape(profile)
            cols[2].append(
                f'hami_node_gpu_mig_instance_info{{node="{node_name}",device_uuid="{dev_uuid}",'
                f'device_index="{dev_index}",mig_uuid="{escape(mig_uuid)}",profile="{prof}",'
                f'gpu_instance_id="{gi_id}",compute_instance_id="{ci_id}",placement_start="{start}",'
                f'placement_size="{size}",zone="{z}"}} 1\n')
            if self.legacy:
                cols[5].append(f'nodeGPUMigInstance{{nodeid="{node_name}",deviceuuid="{dev_uuid}",'
                               f'deviceidx="{dev_index}",migname="{prof}-{gi_id}",zone="{z}"}} 1\n')

    # -- quotas (hook for the ResourceQuota tracker) -------------------------------------------
    def _quota_parts(self) -> tuple[bytes, ...]:
        z = self.zone
        cols: list[list[str]] = [[], [], []]
        for q in self.quotas():
            ns, qn = escape(q.namespace), escape(q.quota_name)
            cols[0].append(f'hami_resource_quota_used{{namespace="{ns}",quota_name="{qn}",limit="{q.limit}",'
                           f'zone="{z}"}} {q.used}\n')
            if q.limit_set:
                cols[1].append(f'hami_resource_quota_limit{{namespace="{ns}",quota_name="{qn}",zone="{z}"}} {q.limit}\n')
            if self.legacy:
                cols[2].append(f'QuotaUsed{{quotanamespace="{ns}",quotaName="{qn}",limit="{q.limit}",'
                               f'zone="{z}"}} {q.used}\n')
        return tuple("".join(c).encode() for c in cols)


def _family_chunks(families, parts: list[tuple[bytes, ...]]) -> Iterator[bytes]:
    """Per family with samples: its HELP/TYPE header, then every node's (or pod's) lines of it,
    a slice of nodes (or pods) at a time so that no single write is megabytes long."""
    for f, (name, help_text) in enumerate(families):
        header = _header(name, help_text)
        for start in range(0, len(parts), PARTS_PER_WRITE):
            body = b"".join([p[f] for p in parts[start:start + PARTS_PER_WRITE]])
            if body:
                yield header + body if header else body
                header = b""

"""The benchmark cluster: GPU nodes as HAMi's device plugin registers them, and running pods
already placed on them through the scheduler's own annotations.

Why a layout of its own: the numbers only mean something if the scheduler's cache holds what a
real cluster would make it hold. So every node has 8 GPUs of a real model (H200, A100-80GB or
L40S, with their real memory), every placed pod carries ``hami.io/vgpu-node``, the allocation
annotation written by ``encode_pod_devices``, ``spec.nodeName`` and phase ``Running``, and pods
look like what a controller creates (labels, owner reference, resources, status) rather than a
bare name.

Fill level is held constant across pod counts on purpose: each placed pod gets a share of memory
and cores sized so that seeded usage is about half of each GPU whatever P is. The P sweep then
measures the cost of *having* more pods in the cache, not the cost of a fuller cluster.

Probe nodes are the last ``probe_nodes`` nodes: H200s whose 8 GPUs are each filled completely by
one "blocker" pod, so a probe pod fits there only once a blocker is gone. That makes "the
scheduler has applied this pod event" observable from outside, through /filter alone (see
``Sentinel`` in bench/context.py); the blockers count among the P pods.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from functools import lru_cache

from hami_py.config import DeviceConfig
from hami_py.devices.base import ContainerDevice, NodeView
from hami_py.devices.codec import encode_pod_devices
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.fakeapi.families import BY_KEY, MODELS
from hami_py.fakeapi.objects import H200, gpu_node, gpu_pod, gpu_uuid

A100_80 = {"type": "NVIDIA A100-SXM4-80GB", "devmem": 81920, "devcore": 100}
L40S = {"type": "NVIDIA L40S", "devmem": 46068, "devcore": 100}
# Half H200, a quarter each of the others: node i's model is MODEL_CYCLE[i % 4].
MODEL_CYCLE = (H200, A100_80, H200, L40S)
GPUS_PER_NODE = 8
SPLIT_COUNT = 10
NAMESPACES = tuple(f"team-{i:02d}" for i in range(20))
BENCH_NAMESPACE = "bench"
GPU_COUNT_CHOICES = (1, 1, 1, 1, 1, 1, 2, 2, 2, 4)   # mean 1.6 GPUs a pod
MEAN_GPUS = sum(GPU_COUNT_CHOICES) / len(GPU_COUNT_CHOICES)
TARGET_FILL = 0.5        # seeded memory per GPU, as a fraction of the GPU (on average)
TARGET_CORE_FILL = 0.4   # seeded cores per GPU, as a fraction of 100
MAX_PODS_PER_NODE = 64   # beyond this the 10 slots per GPU cannot hold every pod

# The mixed layout (``layout="mixed"``): every device family the scheduler has, on one cluster.
# One model of each non-NVIDIA family of the fake registrations (hami_py.fakeapi.families: the
# first one listed, as its device plugin registers it) takes an equal share of MIXED_OTHERS_SHARE
# of the nodes, in the table's order from node 0; the rest (probe nodes included) are NVIDIA as
# in the plain layout. Seeded pods: MIXED_PODS_PER_NODE on each family node (Ascend 16 GiB shares,
# spread over the NPUs; the others whole devices, no two on one device), the rest spread over the
# NVIDIA nodes. A pending pod of a family asks for what its model's first demo pod asks for.
MIXED_OTHERS_SHARE = 0.6
MIXED_PODS_PER_NODE = 4
ASCEND_PODS_PER_NODE = 8
LAYOUTS = ("nvidia", "mixed")


@lru_cache(maxsize=1)
def family_vendors() -> dict:
    """The scheduler's vendors with Ascend and Iluvatar switched on (as the bench starts it for mixed)."""
    return build_vendors(DeviceConfig.default(), FamilySwitches(enable_ascend=True, enable_iluvatar=True))


def _mixed_models() -> tuple[str, ...]:
    """One model key per non-NVIDIA family of the fake registrations (read at import: no vendor
    is built here, so nothing logs before the cluster process has set its logging up)."""
    chosen: dict[str, str] = {}
    vendors: set[str] = set()
    for model in MODELS:     # one a family, and one a vendor (Vastai's die mode is its cards' vendor)
        if model.family != "nvidia" and model.demo_limits and model.family not in chosen \
                and model.vendor_key not in vendors:
            chosen[model.family] = model.key
            vendors.add(model.vendor_key)
    return tuple(chosen.values())


MIXED_MODELS: tuple[str, ...] = _mixed_models()
# What a pending (or seeded) pod of each family asks for: one device, as an inference pod would.
FAMILY_LIMITS = {key: dict(BY_KEY[key].demo_limits[0][1]) for key in MIXED_MODELS}
FAMILY_VENDOR = {key: BY_KEY[key].vendor_key for key in MIXED_MODELS}


def mixed_unavailable() -> str | None:
    """Why the mixed layout cannot run (a family's module not landed yet), or None."""
    vendors = family_vendors()
    missing = [v for v in FAMILY_VENDOR.values() if v not in vendors]
    if missing:
        return f"the scheduler builds no vendor {', '.join(missing)} (its family module is still a placeholder)"
    return None


@dataclass(frozen=True)
class ClusterShape:
    """N nodes × 8 GPUs, P running pods (including the probe nodes' blockers)."""
    nodes: int
    pods: int
    probe_nodes: int = 0
    seed: int = 1
    layout: str = "nvidia"     # or "mixed" (MIXED_MODELS)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.nodes < 1:
            raise ValueError(f"a cluster needs at least one node, not {self.nodes}")
        if not 0 <= self.probe_nodes < self.nodes:
            raise ValueError(f"probe_nodes must be in [0, nodes), not {self.probe_nodes}")
        spread = self.pods - GPUS_PER_NODE * self.probe_nodes
        if spread < 0:
            raise ValueError(f"{self.pods} pods cannot fill {self.probe_nodes} probe nodes "
                             f"({GPUS_PER_NODE} blockers each)")
        regular = self.nodes - self.probe_nodes
        if spread > regular * MAX_PODS_PER_NODE:
            raise ValueError(f"{self.pods} pods on {self.nodes} nodes is more than "
                             f"{MAX_PODS_PER_NODE} a node; the GPUs' slots cannot hold them")


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def node_names(shape: ClusterShape) -> list[str]:
    return [node_name(i) for i in range(shape.nodes)]


def probe_node_names(shape: ClusterShape) -> list[str]:
    return [node_name(i) for i in range(shape.nodes - shape.probe_nodes, shape.nodes)]


def node_model(shape: ClusterShape, index: int) -> dict:
    if index >= shape.nodes - shape.probe_nodes:
        return H200
    return MODEL_CYCLE[index % len(MODEL_CYCLE)]


def family_ranges(shape: ClusterShape) -> list[tuple[str, int, int]]:
    """(family key, first node index, end) of the mixed layout's family nodes; [] otherwise."""
    if shape.layout != "mixed":
        return []
    out, start = [], 0
    share = MIXED_OTHERS_SHARE / len(MIXED_MODELS)
    for key in MIXED_MODELS:
        end = min(start + round(share * shape.nodes), shape.nodes - shape.probe_nodes)
        out.append((key, start, end))
        start = end
    return out


def mixed_layout_text(shape: ClusterShape) -> str:
    """``"400 NVIDIA, 86 ascend910b3, …"``: the nodes of each family in a mixed layout."""
    ranges = family_ranges(shape)
    nvidia = shape.nodes - sum(end - start for _, start, end in ranges)
    return ", ".join([f"{nvidia} NVIDIA"] + [f"{end - start} {key}" for key, start, end in ranges])


def node_family(shape: ClusterShape, index: int) -> str | None:
    """The family key of node ``index`` (None: NVIDIA)."""
    for key, start, end in family_ranges(shape):
        if start <= index < end:
            return key
    return None


def build_nodes(shape: ClusterShape) -> list[dict]:
    out = []
    for i in range(shape.nodes):
        family = node_family(shape, i)
        if family is None:
            out.append(gpu_node(node_name(i), gpus=GPUS_PER_NODE, model=node_model(shape, i), split=SPLIT_COUNT))
        else:
            out.append(BY_KEY[family].node(node_name(i), devices=GPUS_PER_NODE))
    return out


def family_pod(name: str, *, family: str, namespace: str, app: str = "inference") -> dict:
    """A controller-made pod asking for one device of ``family`` (FAMILY_LIMITS)."""
    pod = realistic_pod(name, namespace=namespace, gpus=1, gpumem=None, gpucores=None, app=app)
    container = pod["spec"]["containers"][0]
    limits = {k: v for k, v in container["resources"]["limits"].items() if not k.startswith("nvidia.com/")}
    container["resources"]["limits"] = {**limits, **FAMILY_LIMITS[family]}
    container["image"] = "registry.example.com/ai/inference:2026.1"
    pod["spec"]["tolerations"] = [{"key": next(iter(FAMILY_LIMITS[family])), "operator": "Exists",
                                   "effect": "NoSchedule"}]
    return pod


def place_family(pod: dict, *, node: str, family: str, devices: list[ContainerDevice]) -> dict:
    """``place`` for another family: its own allocation annotations, written by its vendor."""
    place(pod, node=node, devices=[])
    annotations = pod["metadata"]["annotations"]
    for key in ("hami.io/vgpu-devices-allocated", "hami.io/vgpu-devices-to-allocate"):
        annotations.pop(key, None)
    vendor = family_vendors()[FAMILY_VENDOR[family]]
    annotations.update(vendor.encode_allocation([devices], node=node, now=1767225600.0))
    return pod


def realistic_pod(name: str, *, namespace: str, gpus: int, gpumem: int | None, gpucores: int | None,
                  annotations: dict | None = None, app: str = "trainer") -> dict:
    """A pod as a Deployment/Job controller makes it: what the API server and watches carry."""
    pod = gpu_pod(name, namespace=namespace, gpus=gpus, gpumem=gpumem, gpucores=gpucores,
                  annotations=annotations)
    meta = pod["metadata"]
    meta["labels"] = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": namespace,
                      "pod-template-hash": "7d9f8c6b5d"}
    meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-7d9f8c6b5d",
                                "uid": "0b7e4c1e-9d3a-4f57-8a1c-3f1e2d4c5b6a", "controller": True,
                                "blockOwnerDeletion": True}]
    container = pod["spec"]["containers"][0]
    container["image"] = "nvcr.io/nvidia/pytorch:24.05-py3"
    container["command"] = ["python", "-m", "torch.distributed.run", "train.py"]
    container["env"] = [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"}]
    container["resources"]["requests"] = {"cpu": "8", "memory": "64Gi"}
    container["resources"]["limits"].update({"cpu": "16", "memory": "128Gi"})
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"},
                                 {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/"
                                  "serviceaccount", "readOnly": True}]
    spec = pod["spec"]
    spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                       {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {
                           "path": "token", "expirationSeconds": 3607}}]}}]
    spec["restartPolicy"] = "Always"
    spec["serviceAccountName"] = "default"
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def place(pod: dict, *, node: str, devices: list[ContainerDevice]) -> dict:
    """Mark ``pod`` as scheduled by HAMi onto ``node`` and running there."""
    text = encode_pod_devices([devices])
    pod["metadata"]["annotations"].update({
        "hami.io/vgpu-node": node, "hami.io/vgpu-time": "1767225600",
        "hami.io/vgpu-devices-allocated": text, "hami.io/vgpu-devices-to-allocate": ";",
        "hami.io/bind-phase": "success", "hami.io/bind-time": "1767225600"})
    pod["spec"]["nodeName"] = node
    pod["status"] = {
        "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.244.1.17", "startTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                       for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                               "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                               "state": {"running": {"startedAt": "2026-01-01T00:00:05Z"}}}],
    }
    return pod


def _pods_per_node(shape: ClusterShape) -> list[int]:
    regular = shape.nodes - shape.probe_nodes
    spread = shape.pods - GPUS_PER_NODE * shape.probe_nodes
    fixed = {}
    for key, start, end in family_ranges(shape):
        for i in range(start, end):
            wanted = ASCEND_PODS_PER_NODE if BY_KEY[key].family == "ascend" else MIXED_PODS_PER_NODE
            fixed[i] = min(wanted, max(spread - sum(fixed.values()), 0))
    spread -= sum(fixed.values())
    nvidia = regular - len(fixed)
    base, extra = divmod(spread, nvidia) if nvidia else (0, 0)
    out, k = [], 0
    for i in range(regular):
        if i in fixed:
            out.append(fixed[i])
        else:
            out.append(base + (1 if k < extra else 0))
            k += 1
    return out


# What a family's allocation carries beyond memory and cores, for the few whose annotations are
# built from it (AWS Neuron's AWS_NEURON_IDS from the device index): as its decision sets it for a
# whole device asked by count.
SEED_CUSTOM = {"inf2": lambda dev: {"index": dev.index, "coresPerDevice": 2, "countInLimits": True}}


def _placed_on_family_node(rng: random.Random, *, node: str, index: int, family: str, count: int) -> list[dict]:
    """``count`` one-device pods on a family node: Ascend shares of 16 GiB spread over the NPUs,
    the other families' whole devices picked at random (no two on one device)."""
    vendor = family_vendors()[FAMILY_VENDOR[family]]
    registered = vendor.parse_node_devices(NodeView.from_node(BY_KEY[family].node(node, devices=GPUS_PER_NODE)))
    shares = BY_KEY[family].family == "ascend"
    cards = None if shares else rng.sample(range(len(registered)), min(count, len(registered)))
    pods = []
    for j in range(count if shares else len(cards)):
        dev = registered[j % len(registered)] if shares else registered[cards[j]]
        given = ContainerDevice(dev.id, vendor.vendor_key, 16384 if shares else dev.devmem, 0 if shares else dev.devcore,
                                custom=SEED_CUSTOM[family](dev) if family in SEED_CUSTOM else {})
        namespace = NAMESPACES[(index + j) % len(NAMESPACES)]
        pod = family_pod(f"job-{index:05d}-{j:02d}", family=family, namespace=namespace, app="trainer")
        pods.append(place_family(pod, node=node, family=family, devices=[given]))
    return pods


def _placed_on_regular_node(rng: random.Random, *, node: str, index: int, model: dict, count: int) -> list[dict]:
    """``count`` pods on one node: each GPU keeps a free slot, memory and cores stay in bounds."""
    uuids = [gpu_uuid(node, g) for g in range(GPUS_PER_NODE)]
    slots = [0] * GPUS_PER_NODE
    mem = [0] * GPUS_PER_NODE
    cores = [0] * GPUS_PER_NODE
    devmem = model["devmem"]
    shares = max(count * MEAN_GPUS / GPUS_PER_NODE, 1.0)        # pods a GPU holds on average
    mem_share = TARGET_FILL * devmem / shares
    core_share = TARGET_CORE_FILL * 100 / shares
    pods = []
    for j in range(count):
        # Least used GPUs first; always leave one slot and a fifth of memory/cores free.
        order = sorted(range(GPUS_PER_NODE), key=lambda g: (slots[g], mem[g], g))
        want = rng.choice(GPU_COUNT_CHOICES)
        m = max(256, int(mem_share * rng.uniform(0.5, 1.5)) // 256 * 256)
        c = int(core_share * rng.uniform(0.0, 2.0))
        chosen = [g for g in order if slots[g] < SPLIT_COUNT - 1 and mem[g] + m <= 0.8 * devmem
                  and cores[g] + c <= 80][:want]
        if not chosen:  # too full for this share: the smallest pod still fits somewhere
            m, c = 0, 0
            chosen = [g for g in order if slots[g] < SPLIT_COUNT][:1]
        devices = []
        for g in chosen:
            slots[g] += 1
            mem[g] += m
            cores[g] += c
            devices.append(ContainerDevice(uuids[g], "NVIDIA", m, c))
        namespace = NAMESPACES[(index + j) % len(NAMESPACES)]
        pod = realistic_pod(f"job-{index:05d}-{j:02d}", namespace=namespace, gpus=len(chosen),
                            gpumem=m or None, gpucores=c or None)
        pods.append(place(pod, node=node, devices=devices))
    return pods


def blocker_pod(*, node: str, index: int, gpu: int) -> dict:
    """The pod that fills GPU ``gpu`` of probe node ``node`` (number ``index``) completely."""
    pod = realistic_pod(blocker_name(index, gpu), namespace=BENCH_NAMESPACE, gpus=1,
                        gpumem=H200["devmem"], gpucores=100, app="blocker")
    return place(pod, node=node, devices=[ContainerDevice(gpu_uuid(node, gpu), "NVIDIA", H200["devmem"], 100)])


def _blockers_on_probe_node(*, node: str, index: int) -> list[dict]:
    return [blocker_pod(node=node, index=index, gpu=g) for g in range(GPUS_PER_NODE)]


def blocker_name(node_index: int, gpu: int) -> str:
    return f"blocker-{node_index:05d}-{gpu}"


def build_placed_pods(shape: ClusterShape):
    """Yield the P running pods, node by node (a generator: 40 000 pods need not sit in memory)."""
    rng = random.Random(shape.seed)
    for i, count in enumerate(_pods_per_node(shape)):
        family = node_family(shape, i)
        if family is not None:
            yield from _placed_on_family_node(rng, node=node_name(i), index=i, family=family, count=count)
            continue
        yield from _placed_on_regular_node(rng, node=node_name(i), index=i, model=node_model(shape, i),
                                           count=count)
    for i in range(shape.nodes - shape.probe_nodes, shape.nodes):
        yield from _blockers_on_probe_node(node=node_name(i), index=i)


def pending_pod(name: str, *, gpus: int = 1, gpumem: int = 4096, gpucores: int = 10,
                annotations: dict | None = None, family: str | None = None) -> dict:
    """A pod waiting for kube-scheduler: what /filter is asked about (``family``: one device of
    that family instead of an NVIDIA share)."""
    if family is not None:
        pod = family_pod(name, family=family, namespace=BENCH_NAMESPACE)
        pod["metadata"]["annotations"].update(annotations or {})
        return pod
    return realistic_pod(name, namespace=BENCH_NAMESPACE, gpus=gpus, gpumem=gpumem, gpucores=gpucores,
                         annotations=annotations, app="inference")

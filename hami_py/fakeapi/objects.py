"""Realistic Kubernetes objects for the embedded cluster: GPU nodes as HAMi's device plugin
registers them, and pods asking for shares of them.

The defaults are a real NVIDIA H200 as a HAMi device plugin registers it with default settings
(see shared fixtures): type ``NVIDIA H200``, 143771 MiB, 100 cores, split count 10.
"""
from __future__ import annotations

import uuid as uuidlib

import orjson

H200 = {"type": "NVIDIA H200", "devmem": 143771, "devcore": 100}
A100_40 = {"type": "NVIDIA A100-SXM4-40GB", "devmem": 40960, "devcore": 100}
# More models as HAMi's NVIDIA device plugin registers them: the NVML product name, prefixed
# with "NVIDIA-" only when it does not already start with "NVIDIA"; memory as NVML reports it.
A100_80 = {"type": "NVIDIA A100-SXM4-80GB", "devmem": 81920, "devcore": 100}
H100_80 = {"type": "NVIDIA H100 80GB HBM3", "devmem": 81559, "devcore": 100}
L40S = {"type": "NVIDIA L40S", "devmem": 46068, "devcore": 100}
T4 = {"type": "NVIDIA-Tesla T4", "devmem": 15360, "devcore": 100}
V100_32 = {"type": "NVIDIA-Tesla V100-SXM2-32GB", "devmem": 32768, "devcore": 100}
GPU_MODELS = {"H200": H200, "A100-40GB": A100_40, "A100-80GB": A100_80, "H100-80GB": H100_80,
              "L40S": L40S, "T4": T4, "V100-32GB": V100_32}


def gpu_uuid(node: str, index: int) -> str:
    """Stable, realistic-looking GPU UUIDs (GPU-8-4-4-4-12 hex), derived from the node name."""
    u = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/gpu{index}")
    return f"GPU-{u}"


def registration(node: str, *, gpus: int = 8, model: dict = H200, split: int = 10,
                 numa_nodes: int = 2, health: bool = True, mode: str = "hami-core") -> list[dict]:
    per_numa = max(1, gpus // max(numa_nodes, 1))
    return [{"id": gpu_uuid(node, i), "index": i, "count": split, "devmem": model["devmem"],
             "devcore": model["devcore"], "type": model["type"], "numa": min(i // per_numa, numa_nodes - 1),
             "mode": mode, "health": health} for i in range(gpus)]


def gpu_node(name: str, *, gpus: int = 8, model: dict = H200, split: int = 10, numa_nodes: int = 2,
             labels: dict | None = None, annotations: dict | None = None, devices: list[dict] | None = None) -> dict:
    devices = devices if devices is not None else registration(name, gpus=gpus, model=model, split=split,
                                                               numa_nodes=numa_nodes)
    ann = {"hami.io/node-nvidia-register": orjson.dumps(devices).decode(),
           "hami.io/node-handshake": "Reported 2026-01-01 00:00:00"}
    ann.update(annotations or {})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpu": "on", **(labels or {})},
                     "annotations": ann},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus * split), "cpu": "64", "memory": "512Gi"},
                   "allocatable": {"nvidia.com/gpu": str(gpus * split), "cpu": "64", "memory": "512Gi"}},
    }


def gpu_pod(name: str, *, namespace: str = "default", gpus: int = 1, gpumem: int | None = None,
            gpumem_percentage: int | None = None, gpucores: int | None = None,
            annotations: dict | None = None, init_gpus: int = 0, scheduler_name: str = "hami-scheduler",
            extra_limits: dict | None = None) -> dict:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if gpumem is not None:
        limits["nvidia.com/gpumem"] = str(gpumem)
    if gpumem_percentage is not None:
        limits["nvidia.com/gpumem-percentage"] = str(gpumem_percentage)
    if gpucores is not None:
        limits["nvidia.com/gpucores"] = str(gpucores)
    limits.update(extra_limits or {})
    spec: dict = {"schedulerName": scheduler_name,
                  "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}]}
    if init_gpus:
        spec["initContainers"] = [{"name": "prepare", "image": "cuda:12",
                                   "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}

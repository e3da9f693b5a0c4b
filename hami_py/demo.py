"""``make run``: schedule a handful of GPU pods on an embedded cluster and show where they went.

No real cluster is needed. The embedded API server holds three GPU nodes registered the way
HAMi's NVIDIA device plugin registers them; the real scheduler watches it; this script then plays
kube-scheduler, sending each pod through /filter and /bind over HTTP, and prints the placements
and what is left on every GPU.
"""
from __future__ import annotations

import asyncio
import logging
import sys

from hami_py.embedded import embedded_cluster, embedded_options, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import A100_40, H200, gpu_node, gpu_pod
from hami_py.logs import configure_logging

DEMO_PODS = [
    # name, gpus, gpumem MiB, gpucores %, extra annotations
    ("llm-train", 4, None, 100, {}),
    ("llm-serve-a", 1, 40000, 30, {}),
    ("llm-serve-b", 1, 40000, 30, {}),
    ("notebook-1", 1, 8000, 10, {"hami.io/node-scheduler-policy": "spread"}),
    ("notebook-2", 1, 8000, 10, {"nvidia.com/use-gputype": "A100"}),
    ("batch-embed", 2, 20000, 25, {}),
    ("too-big", 1, 200000, 0, {}),
]


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


async def run_demo() -> int:
    async with embedded_cluster(options=embedded_options()) as (api, app):
        nodes = [gpu_node("gpu-node-1", gpus=8, model=H200), gpu_node("gpu-node-2", gpus=8, model=H200),
                 gpu_node("gpu-node-3", gpus=4, model=A100_40, numa_nodes=1)]
        for node in nodes:
            api.create("nodes", node)
        names = [n["metadata"]["name"] for n in nodes]
        await wait_for(lambda: all(n in app.cache.nodes for n in names), what="node registrations")
        extender = ExtenderClient(app.url)
        _out(f"embedded API server {api.url}, hami-scheduler {app.url}")
        _out(f"{len(nodes)} nodes: 2 x 8 NVIDIA H200 (143771 MiB), 1 x 4 NVIDIA A100-SXM4-40GB (40960 MiB)")
        _out()
        _out(f"{'POD':<14} {'ASKS':<28} {'NODE':<12} DEVICES")
        placed: list[str] = []
        try:
            for name, gpus, mem, cores, ann in DEMO_PODS:
                pod = api.create("pods", gpu_pod(name, gpus=gpus, gpumem=mem, gpucores=cores, annotations=ann))
                placement = await extender.schedule(pod, names)
                asks = f"{gpus} GPU" + (f" x {mem} MiB" if mem else " (whole)") + f", {cores}% cores"
                if placement.node:
                    # Like a real device plugin, the simulated one releases the node lock.
                    await wait_for(lambda: app.device_plugin.allocated >= len(placed) + 1, what="allocation")
                    placed.append(name)
                    stored = api.get("pods", name, namespace="default")
                    devices = stored["metadata"]["annotations"].get("hami.io/vgpu-devices-allocated", "")
                    shown = ", ".join(d.split(",")[0][:12] + "…" for d in devices.replace(";", ":").split(":") if d)
                    _out(f"{name:<14} {asks:<28} {placement.node:<12} {shown}")
                else:
                    reason = placement.error or "; ".join(f"{n}: {r}" for n, r in sorted((placement.failed or {}).items()))
                    _out(f"{name:<14} {asks:<28} {'(pending)':<12} {reason}")
        finally:
            await extender.close()
        _out()
        _out(f"{'NODE':<12} {'GPU':<4} {'TYPE':<24} {'SLOTS':>6} {'MEMORY MiB':>18} {'CORES':>7}")
        for node in names:
            for dev in app.cache.device_usage(node):
                _out(f"{node:<12} {dev['index']:<4} {dev['type']:<24} {dev['used']:>2}/{dev['count']:<3} "
                     f"{dev['usedmem']:>8}/{dev['totalmem']:<9} {dev['usedcores']:>3}/{dev['totalcore']:<3}")
    return 0


def main(argv: list[str] | None = None) -> int:
    configure_logging(json=False, level=logging.WARNING)
    return asyncio.run(run_demo())

"""Every fake device model, one table: the ``--family`` values of the kind demo, the models a cluster
file names, and what the simulator, the benchmarks and the tests pick nodes from.

What each family's plugin puts on such a node is built in :mod:`hami_py.fakeapi.family_nodes`.
NVIDIA stays in :mod:`hami_py.fakeapi.objects`; its models are listed here too (family ``nvidia``)
so that one table names every fake device.

    python -m hami_py.fakeapi.families --family ascend910b3 --node worker-1 [--devices 8]
        [--patch metadata|status]     the kubectl merge patch(es) making ``worker-1`` such a node
    python -m hami_py.fakeapi.families --list                   the known --family values
    python -m hami_py.fakeapi.families --family kunlun --demo-pods hami-demo
                                      demo pods asking for that family (name TAB JSON per line)
"""
from __future__ import annotations

import argparse
import sys

import orjson

from hami_py.fakeapi.family_nodes import (
    AMD_MI300X_MEMORY, KUNLUN_CARD_MEMORY, METAX_SGPU_MEMORY, DeviceModel, GiB, NvidiaModel, amd_parts,
    ascend_config, ascend_parts, awsneuron_parts, biren_parts, cambricon_parts, enflame_parts, hygon_parts,
    iluvatar_parts, kunlun_parts, kunlun_vxpu_parts, metax_gpu_parts, metax_sgpu_parts, mthreads_parts, nvidia_parts,
    remotegpu_parts, vastai_card_parts, vastai_die_parts)
from hami_py.fakeapi.objects import GPU_MODELS


def _ascend_model(cw: str, *, memory_gib: int, aliases: tuple[str, ...], demo_memory: int) -> DeviceModel:
    chip = ascend_config(cw)
    return DeviceModel(
        key=cw.lower(), family="ascend", model=cw, vendor_key=cw, devmem=int(chip["memoryAllocatable"]),
        description=f"Huawei {cw} NPU ({memory_gib} GiB), HAMi's Ascend device plugin", build=ascend_parts,
        aliases=aliases, settable=("splitCount", "memory", "unhealthy"),
        demo_limits=((f"{cw.lower()}-vnpu", {chip["resourceName"]: "1", chip["resourceMemoryName"]: str(demo_memory)}),
                     (f"{cw.lower()}-whole", {chip["resourceName"]: "1"})))


def _mthreads_biren_vastai_models() -> list[DeviceModel]:
    return [
        DeviceModel(key="mthreads", family="mthreads", model="S4000", vendor_key="Mthreads", devmem=48 * GiB,
                    description="Moore Threads MTT S4000 (48 GiB) sGPUs, Mthreads' device plugin (node capacity)",
                    build=mthreads_parts, aliases=("mtt-s4000", "mthreads-s4000"), settable=("memory",),
                    demo_limits=(("sgpu-quarter", {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                                                   "mthreads.com/sgpu-core": "4"}),
                                 ("sgpu-whole", {"mthreads.com/vgpu": "1"}))),
        # 160 units a card: a cluster with it lists 160 in the device config's mthreads.memoryPerCard.
        DeviceModel(key="mthreads-s5000", family="mthreads", model="S5000", vendor_key="Mthreads", devmem=80 * GiB,
                    description="Moore Threads MTT S5000 (80 GiB) sGPUs (mthreads.memoryPerCard lists 160)",
                    build=mthreads_parts, aliases=("mtt-s5000",), settable=("memory",), primary=False,
                    demo_limits=(("sgpu-s5000-quarter", {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "32",
                                                         "mthreads.com/sgpu-core": "4"}),)),
        DeviceModel(key="biren", family="biren", model="BR104", vendor_key="Biren", devmem=32 * GiB,
                    description="Biren BR104 (32 GiB) shared by slots, HAMi's Biren device plugin", build=biren_parts,
                    aliases=("biren-br104", "br104"), settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("biren-one", {"birentech.com/gpu": "1"}),)),
        DeviceModel(key="vastai", family="vastai", model="VA1", vendor_key="Vastai", devmem=16 * GiB,
                    description="Vastai VA1 whole cards, HAMi's Vastai device plugin", build=vastai_card_parts,
                    aliases=("vastai-va1", "va1"), settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("va-one", {"vastaitech.com/va": "1"}),)),
        DeviceModel(key="vastai-die", family="vastai-die", model="VA1", vendor_key="Vastai", devmem=8 * GiB,
                    description="Vastai VA1 in die mode (two dies a card, grouped by AIC)", build=vastai_die_parts,
                    aliases=("va1-die",), settable=("splitCount", "memory", "unhealthy"), primary=False,
                    demo_limits=(("va-two-dies", {"vastaitech.com/va": "2"}),)),
    ]


def _nvidia_models() -> list[DeviceModel]:
    out = [NvidiaModel(key="nvidia", family="nvidia", model="A10", vendor_key="NVIDIA", devmem=23028,
                       description="NVIDIA A10 (23028 MiB), HAMi's NVIDIA device plugin (the kind demo's default)",
                       build=nvidia_parts, devices=4, vendor_type="NVIDIA A10",
                       settable=("splitCount", "memory", "unhealthy"))]
    for short, spec in GPU_MODELS.items():
        out.append(NvidiaModel(key=f"nvidia-{short.lower()}", family="nvidia", model=short, vendor_key="NVIDIA",
                               devmem=spec["devmem"], description=f"{spec['type']} ({spec['devmem']} MiB)",
                               build=nvidia_parts, vendor_type=spec["type"],
                               settable=("splitCount", "memory", "unhealthy")))
    return out


def _remote_models() -> list[DeviceModel]:
    """Lupine servers of each NVIDIA model (family ``remotegpu``): every card served over the
    network, none left to the node itself. No demo pods: the family is off in the chart's default
    device config (hami-scheduler simulate turns it on for a cluster with servers)."""
    return [NvidiaModel(key=f"remotegpu-{short.lower()}", family="remotegpu", model=short, vendor_key="RemoteGPU",
                        devmem=spec["devmem"], description=f"a lupine server of {spec['type']} served remotely "
                        "(nvidia.com/remote-gpu; needs the device config's remotegpu section)",
                        build=remotegpu_parts, vendor_type=spec["type"], primary=False,
                        settable=("memory", "unhealthy"))
            for short, spec in GPU_MODELS.items()]


def _models() -> list[DeviceModel]:
    ascend_demo = {"Ascend910B3": 16384, "Ascend910B4": 8192, "Ascend310P": 3072, "Ascend910A": 8738,
                   "Ascend910B2": 8192, "Ascend910B4-1": 16384, "Ascend910C": 16384}
    ascend_gib = {"Ascend910A": 32, "Ascend910B2": 64, "Ascend910B3": 64, "Ascend910B4": 32, "Ascend910B4-1": 64,
                  "Ascend310P": 24, "Ascend910C": 64}
    aliases = {"Ascend910B3": ("910B3",), "Ascend910B4": ("910B4",), "Ascend310P": ("310P", "310P3"),
               "Ascend910A": ("910A",), "Ascend910B2": ("910B2",), "Ascend910B4-1": ("910B4-1",),
               "Ascend910C": ("910C",)}
    models: list[DeviceModel] = [
        _ascend_model(cw, memory_gib=ascend_gib[cw], aliases=aliases[cw], demo_memory=ascend_demo[cw])
        for cw in ("Ascend910B3", "Ascend910B4", "Ascend310P", "Ascend910A", "Ascend910B2", "Ascend910B4-1",
                   "Ascend910C")]
    models += [
        DeviceModel(key="mlu370", family="cambricon", model="MLU370", vendor_key="MLU", devmem=48 * GiB,
                    description="Cambricon MLU370-X8 (48 GiB), Cambricon's DSMLU device plugin (node capacity)",
                    build=cambricon_parts, aliases=("MLU370-X8",), settable=("memory",),
                    demo_limits=(("mlu-quarter", {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "48",
                                                  "cambricon.com/mlu.smlu.vcore": "25"}),
                                 ("mlu-whole", {"cambricon.com/vmlu": "1"}))),
        DeviceModel(key="z100", family="hygon", model="Z100", vendor_key="DCU", devmem=32 * GiB,
                    description="Hygon DCU Z100 (32 GiB), HAMi's DCU device plugin", build=hygon_parts,
                    aliases=("DCU", "hygon-z100"), settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("dcu-8g", {"hygon.com/dcunum": "1", "hygon.com/dcumem": "8192",
                                             "hygon.com/dcucores": "30"}),)),
        DeviceModel(key="k100", family="hygon", model="K100_AI", vendor_key="HCU", devmem=64 * GiB,
                    description="Hygon HCU K100_AI (64 GiB), Hygon's HCU device plugin (HAMi after v2.10)",
                    build=hygon_parts, aliases=("HCU", "hygon-k100", "K100"),
                    settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("hcu-8g", {"hygon.com/hcunum": "1", "hygon.com/hcumem": "8192",
                                             "hygon.com/hcucores": "30"}),)),
        DeviceModel(key="kunlun", family="kunlun", model="P800", vendor_key="kunlun", devmem=KUNLUN_CARD_MEMORY,
                    description="Kunlunxin P800 (96 GiB), whole XPUs (node capacity)", build=kunlun_parts,
                    aliases=("kunlun-p800", "p800"),
                    demo_limits=(("xpu-one", {"kunlunxin.com/xpu": "1"}), ("xpu-four", {"kunlunxin.com/xpu": "4"}))),
        DeviceModel(key="kunlun-vxpu", family="kunlun-vxpu", model="P800", vendor_key="XPU", devmem=KUNLUN_CARD_MEMORY,
                    description="Kunlunxin P800 shared as vXPUs (quarter, half, whole card)", build=kunlun_vxpu_parts,
                    aliases=("vxpu", "XPU", "P800-vXPU"), settable=("splitCount", "unhealthy"), primary=False,
                    demo_limits=(("vxpu-quarter", {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24576"}),)),
        DeviceModel(key="gcu", family="enflame", model="S60", vendor_key="GCU", devmem=100,
                    description="Enflame S60 GCU, whole cards (node capacity; the scheduler books 100 units a card)",
                    build=enflame_parts, aliases=("enflame-s60", "GCU", "s60"),
                    demo_limits=(("gcu-one", {"enflame.com/gcu": "1"}),)),
        DeviceModel(key="mr-v100", family="iluvatar", model="MR-V100", vendor_key="MR-V100", devmem=32 * GiB,
                    description="Iluvatar MR-V100 (32 GiB), Iluvatar's vGPU plugin (needs --enable-iluvatar)",
                    build=iluvatar_parts, aliases=("iluvatar", "MR-V100"),
                    settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("ix-quarter", {"iluvatar.ai/MR-V100-vgpu": "1", "iluvatar.ai/MR-V100.vMem": "32",
                                                 "iluvatar.ai/MR-V100.vCore": "25"}),)),
        DeviceModel(key="metax-gpu", family="metax", model="C500", vendor_key="Metax-GPU", devmem=65536,
                    description="Metax C500 GPU, whole cards (node capacity; topology losses/scores annotations)",
                    build=metax_gpu_parts, aliases=("metax", "Metax-GPU", "c500"),
                    demo_limits=(("metax-one", {"metax-tech.com/gpu": "1"}), ("metax-two", {"metax-tech.com/gpu": "2"}))),
        DeviceModel(key="metax-sgpu", family="metax-sgpu", model="C500", vendor_key="Metax-SGPU",
                    devmem=METAX_SGPU_MEMORY,
                    description="Metax C500 shared as sGPUs (metax-tech.com/node-gpu-devices, two MetaLink zones)",
                    build=metax_sgpu_parts, aliases=("Metax-SGPU", "sgpu", "C500-sGPU"),
                    settable=("splitCount", "memory", "unhealthy"), primary=False,
                    demo_limits=(("sgpu-8g", {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8",
                                              "metax-tech.com/vcore": "30"}),)),
    ]
    models += _mthreads_biren_vastai_models()
    models += [
        DeviceModel(key="inf2", family="awsneuron", model="inf2.48xlarge", vendor_key="AWSNeuron", devmem=0,
                    description="AWS Inferentia2 (inf2.48xlarge: 12 devices, 2 NeuronCores each; node capacity)",
                    build=awsneuron_parts, aliases=("inferentia2", "inf2-48xlarge"), devices=12,
                    demo_limits=(("neuron-core", {"aws.amazon.com/neuroncore": "1"}),
                                 ("neuron-two", {"aws.amazon.com/neuron": "2"}))),
        DeviceModel(key="trn1", family="awsneuron", model="trn1.32xlarge", vendor_key="AWSNeuron", devmem=0,
                    description="AWS Trainium (trn1.32xlarge: 16 devices, 2 NeuronCores each; node capacity)",
                    build=awsneuron_parts, aliases=("trainium", "trn1-32xlarge"), devices=16,
                    demo_limits=(("neuron-core", {"aws.amazon.com/neuroncore": "2"}),
                                 ("neuron-four", {"aws.amazon.com/neuron": "4"}))),
    ]
    models += [
        DeviceModel(key="mi300x", family="amd", model="AMD-MI300X", vendor_key="AMD", devmem=AMD_MI300X_MEMORY,
                    description="AMD Instinct MI300X (192 GiB, 304 compute units), HAMi's AMD device plugin",
                    build=amd_parts, aliases=("MI300X", "amd-mi300x"), settable=("splitCount", "memory", "unhealthy"),
                    demo_limits=(("amd-half", {"amd.com/gpu": "1", "amd.com/gpumem": "65536",
                                               "amd.com/gpucores": "50"}),)),
    ]
    return models + _nvidia_models() + _remote_models()


MODELS: list[DeviceModel] = _models()
BY_KEY: dict[str, DeviceModel] = {m.key: m for m in MODELS}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(m.family for m in MODELS))


def _fold(text: str) -> str:
    return text.strip().lower().replace("_", "-")


def find_device_model(name: str, family: str | None = None) -> DeviceModel | list[DeviceModel] | None:
    """The model a cluster file (or --family) names: by key, model name or alias, case-insensitively,
    within ``family`` when given. Several matches and no primary among them: the list of them."""
    wanted = _fold(name)
    fam = _fold(family) if family else None
    found = [m for m in MODELS
             if (fam is None or m.family == fam)
             and wanted in (_fold(m.key), _fold(m.model), *(_fold(a) for a in m.aliases))]
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    primary = [m for m in found if m.primary]
    return primary[0] if len(primary) == 1 else found


def demo_pods(model: DeviceModel, namespace: str) -> list[dict]:
    """Pods asking for this family's devices as a user would write them (no scheduler name: the
    webhook hands them to hami-scheduler)."""
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
             "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                      "resources": {"limits": dict(limits)}}]}}
            for name, limits in model.demo_limits]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hami_py.fakeapi.families",
                                description="A fake node registration for one device family (kubectl patch JSON).")
    p.add_argument("--family", help="what to fake: " + ", ".join(BY_KEY))
    p.add_argument("--node", help="node name (device ids are derived from it)")
    p.add_argument("--devices", type=int, default=None, help="devices on the node (default: the model's, 8 or 4)")
    p.add_argument("--patch", choices=("metadata", "status"), default=None,
                   help="print only this merge patch (default: both, as one object)")
    p.add_argument("--demo-pods", metavar="NAMESPACE", default=None,
                   help="print the family's demo pods instead, one 'name<TAB>json' a line")
    p.add_argument("--list", action="store_true", help="list the known --family values")
    args = p.parse_args(argv)
    if not args.list and not args.family:
        p.error("--family is required (or --list)")
    if args.family and args.family.lower() not in BY_KEY:
        p.error(f"unknown --family {args.family!r}; known: {', '.join(BY_KEY)}")
    if args.family and args.demo_pods is None and not args.node:
        p.error("--node is required")
    if args.devices is not None and not 1 <= args.devices <= 64:
        p.error("--devices must be between 1 and 64")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    out = sys.stdout
    if args.list:
        for m in MODELS:
            out.write(f"{m.key:<16} {m.family:<12} {m.description}\n")
        return 0
    model = BY_KEY[args.family.lower()]
    if args.demo_pods is not None:
        for pod in demo_pods(model, args.demo_pods):
            out.write(f"{pod['metadata']['name']}\t{orjson.dumps(pod).decode()}\n")
        return 0
    parts = model.parts(args.node, devices=args.devices)
    if args.patch == "metadata":
        body = parts.metadata_patch()
    elif args.patch == "status":
        body = parts.status_patch()
    else:
        body = {**parts.metadata_patch(), **parts.status_patch()}
    out.write(orjson.dumps(body).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

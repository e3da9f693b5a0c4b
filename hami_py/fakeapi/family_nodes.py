"""Nodes as the other device families' plugins register them: Ascend, Cambricon, Hygon, Iluvatar, Kunlun, Enflame.

Each family's device plugin announces its devices in its own way, and the scheduler reads
exactly that (see the shared reference's hami-vendors.md and each module under
``hami_py/devices/``). The builders here produce those Node parts for known models, so that the
simulator, the benchmarks, the kind demo and the tests all start from what a real node carries:

=================  ==========================================================================
Ascend (910A/B/C,  ``hami.io/node-register-<commonWord>``: a JSON list, one entry per NPU, as HAMi's
310P)              Ascend plugin writes it (Go's ``omitempty``: no ``index`` for NPU 0, no ``numa``);
                   ``count`` = memoryAllocatable / the smallest template, ``devmem`` =
                   memoryAllocatable, ``devcore`` = the chip's AI cores (in the config's soft
                   mode, hami-core or enpu: ``vnpuDeviceSplitCount`` and 100), ``custominfo.NetworkID``
                   on 910 chips (NPUs 0-3 on network 0, 4-7 on 1; all 0 on a 910C);
                   ``hami.io/node-handshake-<commonWord>`` ``Reported_<time>``; ``hami-vnpu-core``;
                   capacity ``huawei.com/<commonWord>``. Models and memory come from the chart's
                   device config (section ``vnpus``).
Cambricon MLU370   No annotation: capacity ``cambricon.com/mlu.smlu.vcore`` (100 a card) and
                   ``cambricon.com/mlu.smlu.vmemory`` (units of 256 MiB), plus ``cambricon.com/vmlu``.
Hygon DCU Z100     ``hami.io/node-dcu-register`` in the colon format (``id,count,devmem,devcore,type,
                   numa,health,index,mode:`` per card, 4 shares a card), ``hami.io/node-handshake-dcu``,
                   capacity ``hygon.com/dcunum`` (HAMi v2.10's DCU plugin).
Hygon HCU K100     The same under the HCU names (HAMi after v2.10's HCU plugin): ``hami.io/node-hcu-register``
                   (ids ``HCU-...``), ``hami.io/node-handshake-hcu``, capacity ``hygon.com/hcunum``.
Kunlun P800        Whole XPUs: capacity ``kunlunxin.com/xpu`` only.
Kunlun vXPU        ``hami.io/node-register-xpu`` JSON (type ``XPU``, 98304 MiB, 4 shares a card),
                   ``hami.io/node-handshake-xpu``, capacity ``kunlunxin.com/vxpu``.
Enflame GCU S60    Whole GCUs: capacity ``enflame.com/gcu`` only.
Iluvatar MR-V100   ``hami.io/node-MR-V100-register`` in the colon format (9 fields, 4 shares a card),
                   ``hami.io/node-handshake-MR-V100``, capacity ``iluvatar.ai/MR-V100-vgpu``.
AWS Neuron         No annotation: capacity ``aws.amazon.com/neuron`` (devices) and
(inf2, trn1)       ``aws.amazon.com/neuroncore`` (2 cores a device), and the instance-type label
                   ``node.kubernetes.io/instance-type`` (``inf2.48xlarge``, ``trn1.32xlarge``).
AMD MI300X         ``hami.io/node-amd-register``: a JSON list (type ``AMD-MI300X``, 196608 MiB,
                   ``devcore`` = 304 compute units, 4 shares a GPU), capacity ``amd.com/gpu``.
Remote GPU server  NVIDIA's ``hami.io/node-nvidia-register`` with every entry in mode ``remote``, the
(lupine)           label ``hami.io/lupine-server`` (empty: the default port) and an InternalIP.
=================  ==========================================================================


Resource names are read from the device config (the chart's default unless one is given), as the
plugins read theirs. Why a module of its own: these builders are what each plugin writes, family by
family; the catalogue of models that uses them, its lookup and its command line are in
:mod:`hami_py.fakeapi.families`.
"""
from __future__ import annotations

import uuid as uuidlib
import zlib
from dataclasses import dataclass, field
from typing import Callable

import orjson

from hami_py.config import DeviceConfig
from hami_py.fakeapi.objects import GPU_MODELS, gpu_node, registration

GiB = 1024
HANDSHAKE_REPORTED = "Reported 2026-01-01 00:00:00"
# HAMi's Ascend plugin stamps its answer as ``Reported_`` + Go's "2006.01.02 15:04:05".
ASCEND_HANDSHAKE_REPORTED = "Reported_2026.01.01 00:00:00"
ASCEND_VNPU_CORE_ANNOTATION = "hami-vnpu-core"
ASCEND_ENPU_ANNOTATION = "hami.io/enpu"


@dataclass
class NodeParts:
    """What a device plugin (and the kubelet, from what the plugin advertises) puts on a Node."""
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    internal_ip: str = ""         # the kubelet's InternalIP address, where a family reads it

    def metadata_patch(self) -> dict:
        """``kubectl patch node N --type=merge -p …``"""
        return {"metadata": {"labels": dict(self.labels), "annotations": dict(self.annotations)}}

    def status_patch(self) -> dict:
        """``kubectl patch node N --subresource=status --type=merge -p …``"""
        return {"status": {"capacity": dict(self.capacity), "allocatable": dict(self.capacity)}}


@dataclass(frozen=True)
class BuildOptions:
    devices: int
    split: int | None = None          # shares a device (the plugin's split count), where it registers one
    memory: int | None = None         # MiB a device, where the plugin registers it
    unhealthy: frozenset[int] = frozenset()
    config: DeviceConfig | None = None


@dataclass(frozen=True)
class DeviceModel:
    """One kind of fake node: a family's model as its plugin registers it."""
    key: str                  # "ascend910b3": the --family / FAKE_DEVICE value
    family: str               # "ascend", "cambricon", "hygon", "kunlun", "kunlun-vxpu", "enflame", "nvidia"
    model: str                # "Ascend910B3": the name a cluster file gives
    vendor_key: str           # the scheduler's vendor key (and the report's device column)
    devmem: int               # MiB a device, as the scheduler will see it
    description: str
    build: Callable[["DeviceModel", str, BuildOptions], NodeParts]
    aliases: tuple[str, ...] = ()
    devices: int = 8          # a node's devices by default
    # What a cluster file may set for this family (besides devices and labels).
    settable: tuple[str, ...] = ()
    demo_limits: tuple[tuple[str, dict[str, str]], ...] = ()
    primary: bool = True      # the model name's default family when several share it (P800)

    def parts(self, node: str, *, devices: int | None = None, split: int | None = None, memory: int | None = None,
              unhealthy: set[int] | frozenset[int] = frozenset(), config: DeviceConfig | None = None) -> NodeParts:
        options = BuildOptions(devices=self.devices if devices is None else devices, split=split, memory=memory,
                               unhealthy=frozenset(unhealthy), config=config)
        parts = self.build(self, node, options)
        parts.labels.setdefault("kubernetes.io/hostname", node)
        return parts

    def node(self, name: str, *, labels: dict | None = None, annotations: dict | None = None, **kwargs) -> dict:
        """A whole Node object (raw dict) carrying this model's registration."""
        parts = self.parts(name, **kwargs)
        return family_node(name, parts, labels=labels, annotations=annotations)


def family_node(name: str, parts: NodeParts, *, labels: dict | None = None, annotations: dict | None = None) -> dict:
    capacity = {"cpu": "64", "memory": "512Gi", **parts.capacity}
    status: dict = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    if parts.internal_ip:
        status["addresses"] = [{"type": "InternalIP", "address": parts.internal_ip}]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {**parts.labels, **(labels or {})},
                     "annotations": {**parts.annotations, **(annotations or {})}},
        "status": status,
    }


def device_uuid(node: str, family: str, index: int) -> str:
    """A stable id shaped like the family's own (hex, derived from the node name)."""
    return uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{family}{index}").hex


def _section(config: DeviceConfig | None, name: str):
    return (config or DeviceConfig.default()).sections.get(name)


def _go_json(entries: list[dict]) -> str:
    """As Go's encoding/json writes a struct with ``omitempty`` fields: zero values left out."""
    return orjson.dumps([{k: v for k, v in e.items() if v not in (0, "", False, None, {}, [])} for e in entries]).decode()


# -- Ascend -----------------------------------------------------------------------------------------

def ascend_config(common_word: str, config: DeviceConfig | None = None) -> dict:
    section = _section(config, "vnpus") or {}
    for entry in section.get("configs") or []:
        if isinstance(entry, dict) and entry.get("commonWord") == common_word:
            return entry
    raise KeyError(f"the device config has no vnpus entry for {common_word}")


def ascend_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    """The plugin in the config's default mode (``vnpus.hamiVnpuMode``): in template mode a vNPU
    slot per smallest template and the hardware's AI cores; in a soft mode (hami-core, ENPU)
    ``vnpus.vnpuDeviceSplitCount`` slots (HAMi #3203) and a core budget of 100; the split count
    set for the node (its ``vDeviceCount``) wins over either."""
    from hami_py.devices.ascend import parse_vnpus
    cw = model.vendor_key
    chip = ascend_config(cw, o.config)
    vnpus = parse_vnpus((o.config or DeviceConfig.default()).section("vnpus"))
    soft = vnpus.mode in ("hami-core", "enpu")
    devmem = o.memory if o.memory is not None else int(chip["memoryAllocatable"])
    templates = sorted(int(t["memory"]) for t in chip.get("templates") or [])
    count = o.split if o.split is not None else (
        vnpus.vnpu_device_split_count if soft else
        int(chip["memoryAllocatable"]) // templates[0] if templates else 1)
    devcore = 100 if soft else int(chip.get("aiCore") or 0)
    entries = []
    for i in range(o.devices):
        entry = {"id": device_uuid(node, cw, i), "index": i, "count": count, "devmem": devmem,
                 "devcore": devcore, "type": cw, "numa": 0, "health": i not in o.unhealthy}
        if cw.startswith("Ascend910"):
            entry["custominfo"] = {"NetworkID": 0 if cw == "Ascend910C" else (1 if i > 3 else 0)}
        entries.append(entry)
    resource = chip.get("resourceName") or f"huawei.com/{cw}"
    return NodeParts(annotations={f"hami.io/node-register-{cw}": _go_json(entries),
                                  f"hami.io/node-handshake-{cw}": ASCEND_HANDSHAKE_REPORTED,
                                  ASCEND_VNPU_CORE_ANNOTATION: "true" if vnpus.mode == "hami-core" else "false",
                                  **({ASCEND_ENPU_ANNOTATION: "true"} if vnpus.mode == "enpu" else {})},
                     labels={"accelerator": "huawei-Ascend910" if cw.startswith("Ascend910") else "huawei-Ascend310P"},
                     capacity={resource: str(o.devices)})


# -- Cambricon --------------------------------------------------------------------------------------

CAMBRICON_MEMORY_UNIT = 256      # MiB a unit of cambricon.com/mlu.smlu.vmemory


def cambricon_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "cambricon") or {}
    memory = o.memory if o.memory is not None else model.devmem
    return NodeParts(labels={"mlu": "on"}, capacity={
        section.get("resourceCountName", "cambricon.com/vmlu"): str(o.devices * 100),
        section.get("resourceCoreName", "cambricon.com/mlu.smlu.vcore"): str(o.devices * 100),
        section.get("resourceMemoryName", "cambricon.com/mlu.smlu.vmemory"): str(o.devices * (memory // CAMBRICON_MEMORY_UNIT)),
    })


# -- Hygon ------------------------------------------------------------------------------------------

def hygon_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    """A node of the Hygon plugin generation the model's vendor key names (``HCU`` or ``DCU``),
    its capacity under that generation's count name as the device config resolves it."""
    from hami_py.devices.hygon import DCU, HCU, HygonConfig
    generation = HCU if model.vendor_key == HCU.vendor_key else DCU
    names = HygonConfig.from_section((o.config or DeviceConfig.default()).section("hygon")).generation_names()
    word = generation.vendor_key.lower()
    count = o.split if o.split is not None else 4
    memory = o.memory if o.memory is not None else model.devmem
    text = "".join(f"{generation.vendor_key}-{device_uuid(node, word, i)[:24]},{count},{memory},100,{model.model},"
                   f"0,{'false' if i in o.unhealthy else 'true'},{i},hami-core:" for i in range(o.devices))
    return NodeParts(annotations={generation.register_annotation: text,
                                  generation.handshake_annotation: HANDSHAKE_REPORTED},
                     labels={word: "on"},
                     capacity={names[generation.vendor_key][0] or generation.default_names[0]: str(o.devices * count)})


# -- Kunlun -----------------------------------------------------------------------------------------

KUNLUN_CARD_MEMORY = 98304


def kunlun_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "kunlun") or {}
    return NodeParts(labels={"xpu": "on"},
                     capacity={section.get("resourceCountName", "kunlunxin.com/xpu"): str(o.devices)})


def kunlun_vxpu_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "kunlun") or {}
    count = o.split if o.split is not None else 4
    entries = [{"id": f"{node}-xpu-{i}", "index": i, "count": count, "devmem": KUNLUN_CARD_MEMORY, "devcore": 100,
                "type": "XPU", "numa": 1 if i >= o.devices // 2 else 0, "health": i not in o.unhealthy}
               for i in range(o.devices)]
    return NodeParts(annotations={"hami.io/node-register-xpu": _go_json(entries),
                                  "hami.io/node-handshake-xpu": HANDSHAKE_REPORTED},
                     labels={"xpu": "on"},
                     capacity={section.get("resourceVCountName", "kunlunxin.com/vxpu"): str(o.devices * count)})


# -- Enflame ----------------------------------------------------------------------------------------

def enflame_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "enflame") or {}
    return NodeParts(labels={"gcu": "on"}, capacity={section.get("resourceNameGCU", "enflame.com/gcu"): str(o.devices)})


# -- Mthreads, Biren, Vastai ------------------------------------------------------------------------
# Mthreads MTT S4000: no annotation; capacity ``mthreads.com/sgpu-core`` (16 a GPU) and
# ``mthreads.com/sgpu-memory`` (units of 512 MiB: 96 a 48 GiB GPU), plus ``mthreads.com/vgpu``.
# Biren BR104: ``hami.io/node-biren-register`` JSON (type ``Biren``, ``count`` shares a GPU),
# ``hami.io/node-handshake-biren``, capacity ``birentech.com/gpu``.
# Vastai VA1: ``hami.io/node-va-register`` JSON (type ``Vastai``), ``hami.io/node-handshake-va``,
# capacity ``vastaitech.com/va``; the die model registers each die (two a card) with
# ``custominfo`` ``{"DeviceStrategy": "die", "AIC": "<card>"}``.

MTHREADS_MEMORY_UNIT = 512
MTHREADS_CORES = 16


def mthreads_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "mthreads") or {}
    memory = o.memory if o.memory is not None else model.devmem
    return NodeParts(labels={"mthreads": "on"}, capacity={
        section.get("resourceCountName", "mthreads.com/vgpu"): str(o.devices),
        section.get("resourceCoreName", "mthreads.com/sgpu-core"): str(o.devices * MTHREADS_CORES),
        section.get("resourceMemoryName", "mthreads.com/sgpu-memory"): str(o.devices * (memory // MTHREADS_MEMORY_UNIT)),
    })


def biren_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "biren") or {}
    count = o.split if o.split is not None else 4
    memory = o.memory if o.memory is not None else model.devmem
    entries = [{"id": f"BR-{device_uuid(node, 'biren', i)[:24]}", "index": i, "count": count, "devmem": memory,
                "devcore": 100, "type": "Biren", "numa": 0, "health": i not in o.unhealthy}
               for i in range(o.devices)]
    return NodeParts(annotations={"hami.io/node-biren-register": _go_json(entries),
                                  "hami.io/node-handshake-biren": HANDSHAKE_REPORTED},
                     labels={"biren": "on"},
                     capacity={section.get("resourceCountName", "birentech.com/gpu"): str(o.devices * count)})


def _vastai(model: DeviceModel, node: str, o: BuildOptions, *, die: bool) -> NodeParts:
    section = _section(o.config, "vastai") or {}
    count = o.split if o.split is not None else 1
    memory = o.memory if o.memory is not None else model.devmem
    entries = []
    for i in range(o.devices):
        entry = {"id": f"VA-{device_uuid(node, 'vastai', i)[:24]}", "index": i, "count": count, "devmem": memory,
                 "devcore": 100, "type": "Vastai", "numa": 0, "health": i not in o.unhealthy}
        if die:
            entry["custominfo"] = {"DeviceStrategy": "die", "AIC": str(i // 2)}
        entries.append(entry)
    return NodeParts(annotations={"hami.io/node-va-register": _go_json(entries),
                                  "hami.io/node-handshake-va": HANDSHAKE_REPORTED},
                     labels={"vastai": "on"},
                     capacity={section.get("resourceCountName", "vastaitech.com/va"): str(o.devices * count)})


def vastai_card_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    return _vastai(model, node, o, die=False)


def vastai_die_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    return _vastai(model, node, o, die=True)


# -- Iluvatar ---------------------------------------------------------------------------------------

def _iluvatar_entry(common_word: str, config: DeviceConfig | None) -> dict:
    """The chip's entry of the device config's ``iluvatars`` list (the chart default's if none)."""
    for entry in _section(config, "iluvatars") or []:
        if entry.get("commonWord") == common_word:
            return entry
    raise KeyError(f"the device config has no iluvatars entry {common_word!r}")


def iluvatar_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    """Iluvatar's vGPU plugin: ``hami.io/node-<cw>-register`` in the colon format (9 fields: the
    card's index and mode too), its handshake, and the count resource in capacity."""
    entry = _iluvatar_entry(model.model, o.config)
    count = o.split if o.split is not None else 4
    memory = o.memory if o.memory is not None else model.devmem
    text = "".join(f"GPU-{device_uuid(node, 'ix', i)},{count},{memory},100,{model.model},0,"
                   f"{'false' if i in o.unhealthy else 'true'},{i},hami-core:" for i in range(o.devices))
    return NodeParts(annotations={f"hami.io/node-{model.model}-register": text,
                                  f"hami.io/node-handshake-{model.model}": HANDSHAKE_REPORTED},
                     labels={"iluvatar": "on"},
                     capacity={entry["resourceCountName"]: str(o.devices * count)})


# -- Metax ------------------------------------------------------------------------------------------

METAX_SGPU_MEMORY = 65536       # MiB of a C500 card


def metax_gpu_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    """Whole cards advertised as capacity, with the topology the plugin publishes: a pod of n
    cards loses more of the node's MetaLink the more cards it spans beyond a 4-card ring."""
    section = _section(o.config, "metax") or {}
    n = o.devices
    losses = {str(k): (0 if k in (1, 2, 4, 8) else 100 * (k % 4)) for k in range(1, n + 1)}
    scores = {str(k): 100 * k for k in range(1, n + 1)}
    return NodeParts(annotations={"metax-tech.com/gpu.topology.losses": orjson.dumps(losses).decode(),
                                  "metax-tech.com/gpu.topology.scores": orjson.dumps(scores).decode()},
                     labels={"metax-gpu": "on"},
                     capacity={section.get("resourceCountName", "metax-tech.com/gpu"): str(n)})


def metax_sgpu_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    """The sGPU plugin's JSON: two MetaLink zones of half the cards each, 16 shares a card."""
    section = _section(o.config, "metax") or {}
    count = o.split if o.split is not None else 16
    memory = o.memory if o.memory is not None else METAX_SGPU_MEMORY
    half = max(o.devices // 2, 1)
    entries = [{"uuid": f"GPU-{device_uuid(node, 'metax', i)[:8]}-{device_uuid(node, 'metax', i)[8:12]}",
                "bdf": f"0000:{0x0f + i * 0x10:02x}:00.0", "model": "MXC500", "totalDevCount": count,
                "totalCompute": 100, "totalVRam": memory, "availableDevCount": count, "availableCompute": 100,
                "availableVRam": memory, "numa": 0 if i < half else 1, "healthy": i not in o.unhealthy,
                "qosPolicy": "best-effort", "linkZone": 1 if i < half else 2}
               for i in range(o.devices)]
    return NodeParts(annotations={"metax-tech.com/node-gpu-devices": _go_json(entries)}, labels={"metax-sgpu": "on"},
                     capacity={section.get("resourceVCountName", "metax-tech.com/sgpu"): str(o.devices * count)})


# -- AWS Neuron -------------------------------------------------------------------------------------

NEURON_CORES_PER_DEVICE = 2


def awsneuron_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "awsneuron") or {}
    return NodeParts(labels={"node.kubernetes.io/instance-type": model.model, "neuron": "on"}, capacity={
        section.get("resourceCountName", "aws.amazon.com/neuron"): str(o.devices),
        section.get("resourceCoreName", "aws.amazon.com/neuroncore"): str(o.devices * NEURON_CORES_PER_DEVICE)})


# -- AMD ----------------------------------------------------------------------------------------------

AMD_MI300X_MEMORY = 192 * GiB
AMD_MI300X_CUS = 304


def amd_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    section = _section(o.config, "amd") or {}
    count = o.split if o.split is not None else 4
    memory = o.memory if o.memory is not None else model.devmem
    entries = [{"id": f"GPU-{device_uuid(node, 'amd', i)}", "index": i, "count": count, "devmem": memory,
                "devcore": AMD_MI300X_CUS, "type": model.model if model.model.startswith("AMD") else f"AMD-{model.model}",
                "numa": 1 if i >= o.devices // 2 else 0, "health": i not in o.unhealthy}
               for i in range(o.devices)]
    return NodeParts(annotations={"hami.io/node-amd-register": _go_json(entries)}, labels={"amd": "on"},
                     capacity={section.get("resourceCountName", "amd.com/gpu"): str(o.devices)})


# -- NVIDIA (objects.py's registration, in this table's shape) ---------------------------------------

def nvidia_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    nvidia = next((m for m in GPU_MODELS.values() if m["type"] == model.vendor_type), None) or {
        "type": model.vendor_type, "devmem": model.devmem, "devcore": 100}
    spec = dict(nvidia, devmem=o.memory if o.memory is not None else nvidia["devmem"])
    split = o.split if o.split is not None else 10
    devices = registration(node, gpus=o.devices, model=spec, split=split, numa_nodes=1)
    for dev in devices:
        dev["health"] = dev["index"] not in o.unhealthy
    built = gpu_node(node, gpus=o.devices, split=split, devices=devices)
    return NodeParts(annotations=built["metadata"]["annotations"], labels={"gpu": "on"},
                     capacity={"nvidia.com/gpu": built["status"]["capacity"]["nvidia.com/gpu"]})


# -- Remote GPUs (lupine servers) ------------------------------------------------------------------
# A lupine server: its NVIDIA plugin registers the served cards in ``hami.io/node-nvidia-register``
# with mode ``remote``; the node is labelled ``hami.io/lupine-server`` (empty: the default port) and
# has an InternalIP, which clients reach. A fake server's address is in 198.18.0.0/15 (RFC 2544,
# benchmarking: no real host answers there), derived from its name, so nothing is ever read from
# it: the scheduler's poll of the servers' /metrics finds no busy card.

REMOTE_SERVER_LABEL = "hami.io/lupine-server"


def fake_server_ip(node: str) -> str:
    n = zlib.crc32(node.encode()) % (1 << 17)
    return f"198.{18 + (n >> 16)}.{(n >> 8) & 0xFF}.{n & 0xFF}"


def remotegpu_parts(model: DeviceModel, node: str, o: BuildOptions) -> NodeParts:
    built = nvidia_parts(model, node, o)
    key = "hami.io/node-nvidia-register"
    devices = orjson.loads(built.annotations[key])
    for dev in devices:
        dev["mode"] = "remote"
    built.annotations[key] = orjson.dumps(devices).decode()
    return NodeParts(annotations=built.annotations, labels={REMOTE_SERVER_LABEL: ""}, capacity={},
                     internal_ip=fake_server_ip(node))


@dataclass(frozen=True)
class NvidiaModel(DeviceModel):
    vendor_type: str = ""

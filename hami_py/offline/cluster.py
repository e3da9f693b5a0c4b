"""The cluster file: which nodes exist and which devices each one registers.

Two forms are accepted.

* The simulator's own, for planning hardware that does not exist yet::

      nodes:
        - name: h200          # with count: h200-0 .. h200-3
          count: 4
          gpus: 8
          model: H200         # a known model, or any name with memory: 48Gi
          splitCount: 10      # pods per GPU (the device plugin's deviceSplitCount)
        - name: npu
          count: 2
          gpus: 8             # devices per node, whatever the family calls them
          model: Ascend910B3  # another family's model, registered as its plugin would
        - name: xpu-shared
          family: kunlun-vxpu # only needed when a model name is ambiguous (P800: whole by default)
          model: P800
          gpus: 8
        - name: odd-box
          devices:            # explicit registrations, HAMi's fields
            - {type: NVIDIA A100-SXM4-40GB, devmem: 40960, count: 4}
        - name: lupine        # remote-GPU servers: every card served over the network
          family: remotegpu
          model: A100-40GB
          gpus: 4
        - name: cpu           # GPU-less nodes: they host only pods asking for remote GPUs
          count: 8
          gpus: 0

  Families (``family:``): nvidia (the default), ascend, cambricon, hygon, kunlun, kunlun-vxpu,
  enflame, remotegpu, ...; their models and what each plugin registers are in
  :mod:`hami_py.fakeapi.families`. Remote-GPU servers need the device config's ``remotegpu``
  section, which the offline tools turn on for a cluster that has servers
  (:mod:`hami_py.offline.remote_gpus`); nodes without devices are kept only while it is on.

* Plain Kubernetes: ``kubectl get nodes -o yaml`` (a List, or Node documents) whose nodes carry
  HAMi's registration annotations, so a planner can snapshot a real cluster. Pods in the same
  file that are bound and hold a HAMi allocation (``kubectl get nodes,pods -A -o yaml``) are
  kept as the cluster's current usage, and its PodDisruptionBudgets are kept for whoever moves
  those pods. Nodes without a registration are dropped, unless a pooled family (remote GPUs) is
  on: then they are kept, as the nodes its pods run on.

Every registration is decoded here with the scheduler's own vendor code, so a node the scheduler
would reject is reported with its file and line before anything runs. Both offline tools read
clusters here: ``simulate`` plans on one, ``defrag`` loads a dump or a live cluster's listing.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from hami_py.cache.usage import VGPU_NODE_ANNOTATION
from hami_py.devices.base import AllocationDecodeError, DeviceDecodeError, DeviceInfo, DeviceVendor, NodeView
from hami_py.devices.nvidia import REGISTER_ANNOTATION as NVIDIA_REGISTER_ANNOTATION
from hami_py.fakeapi.families import FAMILIES, MODELS, find_device_model
from hami_py.fakeapi.family_nodes import DeviceModel
from hami_py.fakeapi.objects import GPU_MODELS, gpu_node, gpu_uuid, registration
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from hami_py.offline.remote_gpus import FAMILY as REMOTE_FAMILY
from hami_py.offline.source import (
    Where, check_keys, kubernetes_objects, kind_of, load_documents, optional, plain, read_int, read_list, read_map,
    read_mib, read_str, read_str_map, required,
)
from hami_py.scheduling.verbs.bind import BIND_PHASE_ANNOTATION

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GROUP_FIELDS = ("name", "count", "family", "gpus", "model", "memory", "cores", "splitCount", "numaNodes", "mode",
                 "unhealthy", "labels", "annotations", "devices")
# What only NVIDIA's registration carries; the other families' models say what they accept.
_NVIDIA_ONLY = ("cores", "numaNodes", "mode")
_DEVICE_FIELDS = ("id", "index", "count", "devmem", "devcore", "type", "model", "numa", "mode", "health")
_TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class Cluster:
    """Node objects ready to create, the devices they register, and pods already running."""
    path: str
    nodes: list[dict]
    devices: dict[str, list[DeviceInfo]]
    existing_pods: list[dict] = field(default_factory=list)
    # The dump's PodDisruptionBudgets (policy/v1 objects, as read): whoever moves the dump's pods
    # (the defragmenter, simulate --defrag-every) honours them.
    budgets: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]

    def describe(self) -> str:
        """``16 nodes, 128 GPUs: 128 x NVIDIA H200 (143771 MiB)``."""
        models: dict[tuple[str, int], int] = {}
        for devices in self.devices.values():
            for dev in devices:
                models[(dev.type, dev.devmem)] = models.get((dev.type, dev.devmem), 0) + 1
        total = sum(models.values())
        parts = ", ".join(f"{n} x {t} ({m} MiB)" for (t, m), n in sorted(models.items()))
        return f"{len(self.nodes)} nodes, {total} devices: {parts}"


def find_model(name: str) -> dict | None:
    """A known model by its short name (``H200``) or registered type (``NVIDIA H200``),
    case-insensitively, with or without the ``NVIDIA`` prefix."""
    wanted = _fold(name)
    for short, model in GPU_MODELS.items():
        if wanted in (_fold(short), _fold(model["type"])):
            return model
    return None


def _fold(text: str) -> str:
    text = text.strip().lower()
    for prefix in ("nvidia-", "nvidia "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text.replace("tesla ", "")


def registered_type(product: str) -> str:
    """The type string HAMi's NVIDIA plugin registers for an NVML product name."""
    return product if product.startswith("NVIDIA") else f"NVIDIA-{product}"


def load_cluster(path: str, *, vendors: dict[str, DeviceVendor],
                 documents: list[tuple[Any, Where]] | None = None) -> Cluster:
    """``path``'s cluster; ``documents``: its YAML documents when the caller has parsed them."""
    docs = documents if documents is not None else load_documents(path)
    first, where = docs[0]
    if isinstance(first, dict) and "nodes" in first and first.get("kind") in (None, "Cluster"):
        if len(docs) > 1:
            raise docs[1][1].error("a simulator cluster file holds one document (the nodes list)")
        return _load_simulator_form(first, where, vendors=vendors)
    if all(isinstance(doc, dict) and "kind" in doc for doc, _ in docs):
        return _load_kubernetes_form(docs, path, vendors=vendors)
    raise where.error('expected a cluster description with a "nodes" list, or Kubernetes Node objects '
                      "(kubectl get nodes -o yaml)")


# -- the simulator's form ------------------------------------------------------------------------

def _load_simulator_form(doc: dict, where: Where, *, vendors: dict[str, DeviceVendor]) -> Cluster:
    check_keys(where, doc, ("apiVersion", "kind", "name", "nodes"))
    groups_where = where.at(doc, "nodes")
    groups = read_list(groups_where, doc["nodes"])
    if not groups:
        raise groups_where.error("the cluster has no nodes")
    cluster = Cluster(path=where.path, nodes=[], devices={})
    pooled = _pooled(vendors)
    for i, raw in enumerate(groups):
        if not pooled and isinstance(raw, dict) and str(raw.get("family") or "").strip().lower() == REMOTE_FAMILY:
            raise groups_where.at(groups, i).at(raw, "family").error(
                "remote-GPU servers need the device config's remotegpu section with a resourceCountName")
    for i, raw in enumerate(groups):
        group_where = groups_where.at(groups, i)
        group = read_map(group_where, raw)
        deviceless = _deviceless(group)
        nodes = _node_group(group_where, group)
        if deviceless and not pooled:
            raise group_where.at(group, "gpus").error(
                "a node without devices hosts only pods asking for remote GPUs, and the remote-GPU family is off "
                "(no remotegpu server in the cluster, no remotegpu resources in the device config)")
        for node in nodes:
            if not _add_node(cluster, node, group_where, vendors=vendors, keep_deviceless=deviceless):
                raise group_where.error(
                    f'the scheduler finds no device on node "{node["metadata"]["name"]}": no vendor it runs '
                    "decodes this registration")
    return cluster


def _pooled(vendors: dict[str, DeviceVendor]) -> bool:
    """Whether a family whose devices serve pods on other nodes (remote GPUs) is on."""
    return any(v.pooled for v in vendors.values())


def _deviceless(group: dict) -> bool:
    gpus = group.get("gpus")
    return type(gpus) is int and gpus == 0


def _node_group(where: Where, group: dict) -> list[dict]:
    check_keys(where, group, _GROUP_FIELDS)
    name = required(where, group, "name", read_str)
    count = optional(where, group, "count", read_int, None, minimum=1, maximum=10000)
    labels = optional(where, group, "labels", read_str_map, {})
    annotations = optional(where, group, "annotations", read_str_map, {})
    names = [name] if count is None else [f"{name}-{i}" for i in range(count)]
    for node_name in names:
        if not _NODE_NAME.match(node_name) or len(node_name) > 253:
            raise where.at(group, "name").error(f'"{node_name}" is not a valid node name '
                                                "(lowercase letters, digits, '-' and '.')")
    if _deviceless(group):
        clash = [k for k in _GROUP_FIELDS if k not in ("name", "count", "gpus", "labels", "annotations")
                 and group.get(k) is not None]
        if clash:
            raise where.at(group, clash[0]).error(f'"{clash[0]}" does not apply to a node without devices (gpus: 0)')
        return [_plain_node(n, labels, annotations) for n in names]
    if group.get("devices") is not None:
        clash = [k for k in ("gpus", "model", "memory", "cores", "splitCount", "numaNodes", "mode", "unhealthy")
                 if group.get(k) is not None]
        if clash:
            raise where.at(group, clash[0]).error('give either "devices" (explicit registrations) '
                                                  f'or "{clash[0]}", not both')
        devices_where = where.at(group, "devices")
        entries = read_list(devices_where, group["devices"])
        if not entries:
            raise devices_where.error("expected at least one device")
        return [gpu_node(n, gpus=len(entries), labels=labels, annotations=annotations,
                         devices=[_explicit_device(devices_where, entries, k, n) for k in range(len(entries))])
                for n in names]
    gpus = required(where, group, "gpus", read_int, minimum=1, maximum=1024)
    family_model = _family_model(where, group)
    if family_model is not None:
        return _family_group(where, group, family_model, names=names, devices=gpus, labels=labels,
                             annotations=annotations)
    model = _group_model(where, group)
    split = optional(where, group, "splitCount", read_int, 10, minimum=1, maximum=1 << 20)
    numa = optional(where, group, "numaNodes", read_int, 1, minimum=1, maximum=gpus)
    mode = optional(where, group, "mode", read_str, "hami-core")
    unhealthy = _unhealthy(where, group, gpus)
    nodes = []
    for n in names:
        devices = registration(n, gpus=gpus, model=model, split=split, numa_nodes=numa, mode=mode)
        for dev in devices:
            dev["health"] = dev["index"] not in unhealthy
        nodes.append(gpu_node(n, gpus=gpus, split=split, labels=labels, annotations=annotations, devices=devices))
    return nodes


def _plain_node(name: str, labels: dict, annotations: dict) -> dict:
    """A node with no device of its own (a remote-GPU client)."""
    capacity = {"cpu": "64", "memory": "512Gi"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels},
                         "annotations": dict(annotations)},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}


def _known_models() -> str:
    others = ", ".join(dict.fromkeys(m.model for m in MODELS if m.family != "nvidia"))
    return f"{', '.join(GPU_MODELS)}; other families: {others}"


def _family_model(where: Where, group: dict) -> DeviceModel | None:
    """The non-NVIDIA model a group names, or None for an NVIDIA group (the default family)."""
    family = optional(where, group, "family", read_str)
    if family is not None and family.strip().lower() not in FAMILIES:
        raise where.at(group, "family").error(f'unknown family "{family}" (known: {", ".join(FAMILIES)})')
    family = family.strip().lower() if family is not None else None
    if family == "nvidia":
        return None
    name = required(where, group, "model", read_str)
    if family is None and (find_model(name) is not None or group.get("memory") is not None
                           and find_device_model(name) is None):
        return None      # NVIDIA's known models, or any other NVIDIA model given with its memory
    found = find_device_model(name, family)
    if isinstance(found, list):
        raise where.at(group, "model").error(
            f'model "{name}" is made by several families ({", ".join(m.family for m in found)}); say which with family:')
    if family is None and (found is None or found.family == "nvidia"):
        return None      # NVIDIA's path says what is unknown
    if found is None:
        known = ", ".join(dict.fromkeys(m.model for m in MODELS if m.family == family))
        raise where.at(group, "model").error(f'unknown model "{name}" in family {family} (known: {known})')
    return found


def _family_group(where: Where, group: dict, model: DeviceModel, *, names: list[str], devices: int,
                  labels: dict, annotations: dict) -> list[dict]:
    for key in (*_NVIDIA_ONLY, "splitCount", "memory", "unhealthy"):
        if group.get(key) is not None and (key in _NVIDIA_ONLY or key not in model.settable):
            raise where.at(group, key).error(f'"{key}" does not apply to {model.model} nodes ({model.family}: '
                                             f"{model.description})")
    split = optional(where, group, "splitCount", read_int, None, minimum=1, maximum=1 << 20)
    memory = optional(where, group, "memory", read_mib)
    unhealthy = _unhealthy(where, group, devices)
    return [model.node(n, devices=devices, split=split, memory=memory, unhealthy=unhealthy, labels=labels,
                       annotations=annotations) for n in names]


def _group_model(where: Where, group: dict) -> dict:
    name = required(where, group, "model", read_str)
    memory = optional(where, group, "memory", read_mib)
    cores = optional(where, group, "cores", read_int, None, minimum=1, maximum=100)
    known = find_model(name)
    if known is None and memory is None:
        raise where.at(group, "model").error(
            f'unknown GPU model "{name}" (known: {_known_models()}); '
            'for another NVIDIA model give its memory too, e.g. memory: 48Gi')
    model = dict(known) if known else {"type": registered_type(name.strip()), "devcore": 100}
    if memory is not None:
        model["devmem"] = memory
    if cores is not None:
        model["devcore"] = cores
    return model


def _unhealthy(where: Where, group: dict, gpus: int) -> set[int]:
    if group.get("unhealthy") is None:
        return set()
    list_where = where.at(group, "unhealthy")
    items = read_list(list_where, group["unhealthy"])
    return {read_int(list_where.at(items, i), v, minimum=0, maximum=gpus - 1) for i, v in enumerate(items)}


def _explicit_device(where: Where, entries: list, k: int, node: str) -> dict:
    entry_where = where.at(entries, k)
    entry = read_map(entry_where, entries[k])
    check_keys(entry_where, entry, _DEVICE_FIELDS)
    model = {}
    if entry.get("model") is not None:
        name = read_str(entry_where.at(entry, "model"), entry["model"])
        model = find_model(name) or {}
        if not model:
            raise entry_where.at(entry, "model").error(
                f'unknown GPU model "{name}" (known: {", ".join(GPU_MODELS)}); give type and devmem instead')
    dev_type = optional(entry_where, entry, "type", read_str, model.get("type"))
    devmem = optional(entry_where, entry, "devmem", read_mib, model.get("devmem"))
    if dev_type is None:
        raise entry_where.error('missing required field "type" (or "model")')
    if devmem is None:
        raise entry_where.error('missing required field "devmem" (or "model")')
    return {
        "id": optional(entry_where, entry, "id", read_str, gpu_uuid(node, k)),
        "index": optional(entry_where, entry, "index", read_int, k, minimum=0),
        "count": optional(entry_where, entry, "count", read_int, 10, minimum=1),
        "devmem": devmem,
        "devcore": optional(entry_where, entry, "devcore", read_int, model.get("devcore", 100), minimum=0),
        "type": dev_type,
        "numa": optional(entry_where, entry, "numa", read_int, 0, minimum=0),
        "mode": optional(entry_where, entry, "mode", read_str, "hami-core"),
        "health": _read_bool(entry_where, entry, "health", True),
    }


def _read_bool(where: Where, mapping: dict, key: str, default: bool) -> bool:
    value = mapping.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise where.at(mapping, key).error(f"expected true or false, got {kind_of(value)}")
    return value


def _add_node(cluster: Cluster, node: dict, where: Where, *, vendors: dict[str, DeviceVendor],
              annotation_where: dict[str, Where] | None = None, keep_deviceless: bool = False) -> bool:
    """Decode the node's registrations with the scheduler's vendors; add it if it has devices
    (or, with ``keep_deviceless``, whatever it has)."""
    name = node["metadata"]["name"]
    if name in cluster.devices:      # every node added is in both, at once
        raise where.error(f'node "{name}" is defined twice')
    devices: list[DeviceInfo] = []
    for vendor in vendors.values():
        try:
            devices.extend(vendor.parse_node_devices(NodeView.from_node(node)))
        except DeviceDecodeError as exc:
            at = (annotation_where or {}).get(vendor.register_annotation or "", where)
            raise at.error(f"the scheduler rejects this registration: {exc}") from None
    if not devices and not keep_deviceless:
        return False
    cluster.nodes.append(node)
    cluster.devices[name] = devices
    return True


# -- plain Kubernetes ----------------------------------------------------------------------------

def _load_kubernetes_form(docs: list[tuple[Any, Where]], path: str, *, vendors: dict[str, DeviceVendor]) -> Cluster:
    cluster = Cluster(path=path, nodes=[], devices={})
    objects = list(kubernetes_objects(docs))
    skipped_kinds: dict[str, int] = {}
    pods = []
    unregistered = []
    clients = 0
    pooled = _pooled(vendors)
    for obj, where in objects:
        kind = obj.get("kind")
        if kind == "Node":
            node, annotation_where = _snapshot_node(obj, where, vendors=vendors)
            if not _add_node(cluster, node, where, vendors=vendors, annotation_where=annotation_where):
                if not pooled:
                    unregistered.append(node["metadata"]["name"])
                    continue
                # With remote GPUs on, a node without devices is where their pods run.
                _add_node(cluster, node, where, vendors=vendors, keep_deviceless=True)
                clients += 1
        elif kind == "Pod":
            pods.append((obj, where))
        elif kind == "PodDisruptionBudget":
            cluster.budgets.append(plain(obj))
        else:
            skipped_kinds[str(kind)] = skipped_kinds.get(str(kind), 0) + 1
    if not any(cluster.devices.values()):
        raise Where(path).error("no node carries a HAMi device registration annotation "
                                f"(e.g. {NVIDIA_REGISTER_ANNOTATION}); nothing to schedule on")
    if unregistered:
        cluster.notes.append(f"ignored {len(unregistered)} node(s) without HAMi device registrations: "
                             + ", ".join(unregistered[:5]) + (" ..." if len(unregistered) > 5 else ""))
    if clients:
        cluster.notes.append(f"kept {clients} node(s) without devices: they may host remote-GPU pods")
    for kind, n in sorted(skipped_kinds.items()):
        cluster.notes.append(f"ignored {n} {kind} object(s)")
    _existing_pods(cluster, pods, vendors=vendors)
    if cluster.budgets:
        cluster.notes.append(f"{len(cluster.budgets)} PodDisruptionBudget(s), honoured when pods are moved")
    return cluster


def _snapshot_node(obj: dict, where: Where, *, vendors: dict[str, DeviceVendor]) -> tuple[dict, dict[str, Where]]:
    """A snapshotted Node as the embedded API server should hold it.

    The node lock is dropped (a bind in flight at snapshot time would otherwise block the node
    for five minutes) and a ``Requesting_`` handshake is marked reported: the stamp is old by the
    time anyone simulates, and would make the scheduler treat the device plugin as gone."""
    meta_where = where.at(obj, "metadata")
    meta = read_map(meta_where, obj.get("metadata"))
    name = required(meta_where, meta, "name", read_str)
    labels = optional(meta_where, meta, "labels", read_str_map, {})
    annotations = optional(meta_where, meta, "annotations", read_str_map, {})
    annotations_where = meta_where.at(meta, "annotations")
    positions = {k: annotations_where.at(meta.get("annotations") or {}, k) for k in annotations}
    annotations.pop(LOCK_ANNOTATION, None)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for vendor in vendors.values():
        key = vendor.handshake_annotation
        if key and annotations.get(key, "").startswith("Requesting"):
            annotations[key] = f"Reported {stamp}"
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {k: plain(status[k]) for k in ("capacity", "allocatable") if isinstance(status.get(k), dict)}}
    if isinstance(status.get("addresses"), list):
        node["status"]["addresses"] = plain(status["addresses"])     # a remote-GPU server's endpoint
    return node, positions


def _existing_pods(cluster: Cluster, pods: list[tuple[dict, Where]], *, vendors: dict[str, DeviceVendor]) -> None:
    """Bound, running pods holding a HAMi allocation on a listed node become current usage."""
    ignored = 0
    for obj, where in pods:
        meta_where = where.at(obj, "metadata")
        meta = read_map(meta_where, obj.get("metadata"))
        required(meta_where, meta, "name", read_str)
        annotations = optional(meta_where, meta, "annotations", read_str_map, {})
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        phase = (obj.get("status") or {}).get("phase") if isinstance(obj.get("status"), dict) else None
        node = spec.get("nodeName")
        if not node or node not in cluster.devices or phase in _TERMINAL_PHASES \
                or annotations.get(VGPU_NODE_ANNOTATION) != node:
            ignored += 1
            continue
        for vendor in vendors.values():
            try:
                vendor.decode_allocation(annotations)
            except AllocationDecodeError as exc:
                raise meta_where.at(meta, "annotations").error(
                    f"the scheduler rejects this allocation: {exc}") from None
        pod = plain(obj)
        for key in ("resourceVersion", "managedFields", "selfLink", "generation"):
            pod["metadata"].pop(key, None)
        if annotations.get(BIND_PHASE_ANNOTATION) == "allocating":
            # Caught mid-bind: count it as allocated, so the simulated device plugin does not
            # finish a bind the simulation never made.
            annotations[BIND_PHASE_ANNOTATION] = "success"
        pod["metadata"]["annotations"] = annotations
        cluster.existing_pods.append(orjson.loads(orjson.dumps(pod)))
    if cluster.existing_pods:
        cluster.notes.append(f"{len(cluster.existing_pods)} running pod(s) already hold devices")
    if ignored:
        cluster.notes.append(f"ignored {ignored} pod(s) that hold no HAMi allocation on a listed node")

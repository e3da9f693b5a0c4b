"""The workload file: which pods arrive, how many, in what order, and for how long they stay.

Two forms are accepted.

* The simulator's own::

      order: interleaved        # as-listed (default), interleaved, or shuffled (with seed)
      pods:
        - name: llm-serve
          replicas: 40
          gpus: 1
          gpumem: 20Gi          # or MiB as a number; gpumemPercentage: 50 instead
          gpucores: 30
          lifetime: 25          # deleted 25 arrivals after it was placed
        - name: npu-infer
          device: Ascend910B3   # another family's devices (vendor key or model): gpus, gpumem
          gpus: 1               # and gpucores become its count, memory and core resources
          gpumem: 16Gi
        - name: trainer
          replicas: 2
          template: {...}       # any Pod manifest, used as it is
        - name: train
          replicas: 4
          gpus: 1
          podGroup: {name: train, minMember: 4, scheduleTimeoutSeconds: 120}   # a gang: all or nothing

* Plain Kubernetes: Pod manifests (a List, or one per document), and Deployments, ReplicaSets,
  StatefulSets and Jobs, whose pod template is taken ``replicas`` (``parallelism``) times. A
  manifest copied from a live cluster loses its status, node and HAMi's scheduling annotations,
  so it is scheduled afresh. ``simulate.hami-py.io/lifetime`` on a manifest gives a lifetime.
  PodGroup objects (scheduler-plugins') are created as they are, before any pod arrives.

Gangs (docs/GANGS.md): an entry's ``podGroup`` labels its replicas
``scheduling.x-k8s.io/pod-group: <name>`` and makes the PodGroup object; ``minMember`` defaults
to every replica the workload makes for that group (entries naming the same group are one gang
and must agree on what they give). ``podGroup: <name>`` alone is the same with both defaults.
Kueue's pod-group labels are read as the scheduler reads them.

Time is counted in arrivals: each pod arriving is one step. Every pod is checked here with the
scheduler's own request parser and policy reader, so a malformed quantity or annotation is
reported with its file and line before anything runs.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from hami_py.config import DeviceConfig
from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.devices.nvidia import USE_TYPE_ANNOTATION, VENDOR_KEY as NVIDIA, nvidia_config
from hami_py.fakeapi.families import find_device_model
from hami_py.offline.source import (
    Where, check_keys, kind_of, kubernetes_objects, load_documents, optional, plain, read_int, read_list, read_map,
    read_mib, read_str, read_str_map, required,
)
from hami_py.scheduling.gangs.membership import (
    KUEUE, PODGROUP_API, PODGROUP_LABEL, GangSpecError, gang_of, kueue_spec, podgroup_key, podgroup_spec,
)
from hami_py.scheduling.verbs.bind import BIND_PHASE_ANNOTATION, BIND_TIME_ANNOTATION
from hami_py.scheduling.decision.filter import VGPU_NODE_LABEL
from hami_py.scheduling.decision.policies import (
    GPU_POLICY_ANNOTATION, NODE_POLICIES, NODE_POLICY_ANNOTATION, PolicyError, pod_policies,
)
from hami_py.scheduling.decision.requests import PodRequest, parse_pod_requests
from hami_py.scheduling.verbs.stale import decision_keys

LIFETIME_ANNOTATION = "simulate.hami-py.io/lifetime"
ORDERS = ("as-listed", "interleaved", "shuffled")
POLICIES = NODE_POLICIES      # binpack, spread, fragmentation-aware: node and GPU policies alike
_ENTRY_FIELDS = ("name", "namespace", "replicas", "lifetime", "device", "gpus", "gpumem", "gpumemPercentage",
                 "gpucores", "gpuType", "nodePolicy", "gpuPolicy", "annotations", "labels", "nodeSelector", "template",
                 "podGroup")
_PODGROUP_FIELDS = ("name", "minMember", "scheduleTimeoutSeconds")
# A label value (the members carry the name as one) that is also an object name.
_PODGROUP_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_SHORTHAND = ("device", "gpus", "gpumem", "gpumemPercentage", "gpucores", "gpuType", "nodePolicy", "gpuPolicy",
              "annotations", "labels", "nodeSelector")
_CONTROLLERS = ("Deployment", "ReplicaSet", "StatefulSet", "Job")
_MAX_PODS = 100_000


@dataclass
class Template:
    """One kind of pod: the manifest every replica is made from."""
    name: str
    namespace: str
    replicas: int
    lifetime: int | None
    pod: dict
    request: PodRequest
    where: Where
    gang: str = ""      # the gang its replicas belong to (``PodGroup ns/name``), "" for none

    @property
    def node_selector(self) -> dict[str, str]:
        return (self.pod.get("spec") or {}).get("nodeSelector") or {}


@dataclass(frozen=True)
class Arrival:
    """One pod arriving: which template, under which name."""
    step: int
    template: Template
    name: str

    @property
    def namespace(self) -> str:
        return self.template.namespace

    def manifest(self) -> dict:
        pod = orjson.loads(orjson.dumps(self.template.pod))
        pod["metadata"]["name"] = self.name
        pod["metadata"]["namespace"] = self.template.namespace
        return pod


@dataclass
class Workload:
    path: str
    templates: list[Template]
    order: str = "as-listed"
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    podgroups: list[dict] = field(default_factory=list)     # PodGroup objects, created before any pod
    gang_sizes: dict[str, int] = field(default_factory=dict)  # each gang (``PodGroup ns/name``): its minMember

    @property
    def total_pods(self) -> int:
        return sum(t.replicas for t in self.templates)

    def arrivals(self) -> list[Arrival]:
        """Every pod in arrival order; the order is fixed by the file (and the seed)."""
        named = [[(t, _replica_name(t, i)) for i in range(t.replicas)] for t in self.templates]
        if self.order == "interleaved":
            flat = [group[i] for i in range(max(len(g) for g in named)) for group in named if i < len(group)]
        else:
            flat = [pair for group in named for pair in group]
            if self.order == "shuffled":
                random.Random(self.seed).shuffle(flat)
        return [Arrival(step, t, name) for step, (t, name) in enumerate(flat)]


def _replica_name(template: Template, i: int) -> str:
    return template.name if template.replicas == 1 else f"{template.name}-{i}"


def load_workload(path: str, *, vendors: dict[str, DeviceVendor], device_config: DeviceConfig) -> Workload:
    docs = load_documents(path)
    first, where = docs[0]
    if isinstance(first, dict) and "pods" in first and first.get("kind") in (None, "Workload"):
        if len(docs) > 1:
            raise docs[1][1].error("a simulator workload file holds one document (the pods list)")
        workload = _load_simulator_form(first, where, vendors=vendors, device_config=device_config)
    elif all(isinstance(doc, dict) and "kind" in doc for doc, _ in docs):
        workload = _load_kubernetes_form(docs, path, vendors=vendors)
    else:
        raise where.error('expected a workload with a "pods" list, or Kubernetes Pod manifests')
    _check_unique_names(workload)
    _mark_gangs(workload)
    return workload


def _mark_gangs(workload: Workload) -> None:
    """Which templates make gang members, and each gang's minimum, as the scheduler will read them."""
    defined = {podgroup_key(obj): podgroup_spec(obj).min_member for obj in workload.podgroups}
    orphans: dict[str, int] = {}
    for template in workload.templates:
        key = gang_of(template.pod)
        if key is None:
            continue
        if key.kind == KUEUE:
            try:
                minimum = kueue_spec(template.pod).min_member
            except GangSpecError as exc:
                raise template.where.error(f'pod "{template.name}": {exc}') from None
        elif key in defined:
            minimum = defined[key]
        else:
            orphans[f"{key.namespace}/{key.name}"] = orphans.get(f"{key.namespace}/{key.name}", 0) + template.replicas
            continue
        if minimum > 1:         # 0 or 1 is no gang (the scheduler places such pods on their own)
            template.gang = str(key)
            workload.gang_sizes[str(key)] = minimum
    for name, pods in orphans.items():
        workload.notes.append(f"{pods} pod(s) labelled with PodGroup {name}, which the workload does not define: "
                              "scheduled on their own")


def _check_unique_names(workload: Workload) -> None:
    seen: dict[tuple[str, str], Template] = {}
    for template in workload.templates:
        for i in range(template.replicas):
            key = (template.namespace, _replica_name(template, i))
            if key in seen:
                raise template.where.error(f'pod "{key[0]}/{key[1]}" is also made by the pod at line '
                                           f"{seen[key].where.line}; names must be unique")
            seen[key] = template
    if not workload.templates:
        raise Where(workload.path).error("the workload has no GPU pods")
    if workload.total_pods > _MAX_PODS:
        raise Where(workload.path).error(
            f"{workload.total_pods} pods is more than the simulator's limit of {_MAX_PODS}")


# -- the simulator's form ------------------------------------------------------------------------

def _load_simulator_form(doc: dict, where: Where, *, vendors: dict[str, DeviceVendor],
                         device_config: DeviceConfig) -> Workload:
    check_keys(where, doc, ("apiVersion", "kind", "name", "order", "seed", "pods"))
    order = optional(where, doc, "order", read_str, "as-listed")
    if order not in ORDERS:
        raise where.at(doc, "order").error(f'must be one of {", ".join(ORDERS)}, got "{order}"')
    seed = optional(where, doc, "seed", read_int, 0)
    entries_where = where.at(doc, "pods")
    entries = read_list(entries_where, doc["pods"])
    templates = []
    groups: dict[tuple[str, str], list[tuple[Where, int | None, int | None, int]]] = {}
    for i, raw in enumerate(entries):
        entry_where = entries_where.at(entries, i)
        entry = read_map(entry_where, raw)
        template = _entry(entry_where, entry, vendors=vendors, device_config=device_config)
        group = _pod_group(entry_where, entry, template)
        if group is not None:
            groups.setdefault((template.namespace, group[0]), []).append((*group[1:], template.replicas))
        templates.append(template)
    podgroups = [_podgroup_object(namespace, name, given) for (namespace, name), given in groups.items()]
    return Workload(path=where.path, templates=templates, order=order, seed=seed, podgroups=podgroups)


def _pod_group(where: Where, entry: dict, template: Template) -> tuple[str, Where, int | None, int | None] | None:
    """An entry's ``podGroup`` (a name, or name, minMember and scheduleTimeoutSeconds); its
    replicas are labelled members. (name, where, minMember or None, timeout or None)."""
    raw = entry.get("podGroup")
    if raw is None:
        return None
    group_where = where.at(entry, "podGroup")
    if isinstance(raw, str):
        name, minimum, timeout, name_where = raw, None, None, group_where
    else:
        group = read_map(group_where, raw)
        check_keys(group_where, group, _PODGROUP_FIELDS)
        name = required(group_where, group, "name", read_str)
        name_where = group_where.at(group, "name")
        minimum = optional(group_where, group, "minMember", read_int, None, minimum=1, maximum=_MAX_PODS)
        timeout = optional(group_where, group, "scheduleTimeoutSeconds", read_int, None, minimum=0)
    if not _PODGROUP_NAME.match(name):
        raise name_where.error(f'"{name}" is not a PodGroup name (lower-case letters, digits, "-" and ".", '
                               "at most 63 characters, a letter or digit at each end)")
    labels = template.pod["metadata"].setdefault("labels", {})
    if labels.get(PODGROUP_LABEL, name) != name:
        raise group_where.error(f'the pod already carries {PODGROUP_LABEL}: "{labels[PODGROUP_LABEL]}"')
    labels[PODGROUP_LABEL] = name
    return name, group_where, minimum, timeout


def _podgroup_object(namespace: str, name: str, given: list[tuple[Where, int | None, int | None, int]]) -> dict:
    """The PodGroup of entries naming the same group: what they give must agree; minMember
    defaults to all their replicas."""
    spec: dict[str, int] = {}
    first: dict[str, Where] = {}
    for where, minimum, timeout, _ in given:
        for key, value in (("minMember", minimum), ("scheduleTimeoutSeconds", timeout)):
            if value is None:
                continue
            if key in spec and spec[key] != value:
                raise where.error(f'PodGroup "{name}" has {key} {spec[key]} at line {first[key].line}, '
                                  f"not {value}: entries of one group must agree")
            spec.setdefault(key, value)
            first.setdefault(key, where)
    spec.setdefault("minMember", sum(replicas for *_, replicas in given))
    return {"apiVersion": PODGROUP_API, "kind": "PodGroup", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def _entry(where: Where, entry: dict, *, vendors: dict[str, DeviceVendor], device_config: DeviceConfig) -> Template:
    check_keys(where, entry, _ENTRY_FIELDS)
    replicas = optional(where, entry, "replicas", read_int, 1, minimum=0, maximum=_MAX_PODS)
    lifetime = optional(where, entry, "lifetime", read_int, None, minimum=1)
    if entry.get("template") is not None:
        clash = [k for k in _SHORTHAND if entry.get(k) is not None]
        if clash:
            raise where.at(entry, clash[0]).error(
                f'give either "template" (a Pod manifest) or "{clash[0]}", not both')
        template_where = where.at(entry, "template")
        template = read_map(template_where, entry["template"])
        pod = _fresh_pod(template, template_where, vendors=vendors)
        name = optional(where, entry, "name", read_str, pod["metadata"].get("name"))
        if not name:
            raise where.error('missing required field "name" (or metadata.name in the template)')
        namespace = optional(where, entry, "namespace", read_str, pod["metadata"].get("namespace") or "default")
        return _template(template_where, pod, name=name, namespace=namespace, replicas=replicas,
                         lifetime=lifetime, vendors=vendors, allow_no_device=False)
    name = required(where, entry, "name", read_str)
    namespace = optional(where, entry, "namespace", read_str, "default")
    pod = _shorthand_pod(where, entry, device_config=device_config, vendors=vendors)
    return _template(where, pod, name=name, namespace=namespace, replicas=replicas, lifetime=lifetime,
                     vendors=vendors, allow_no_device=False)


def _device_vendor(where: Where, entry: dict, vendors: dict[str, DeviceVendor]) -> str:
    """The vendor key ``device:`` names (a vendor key or a known model, case-insensitively)."""
    name = optional(where, entry, "device", read_str)
    if name is None:
        return NVIDIA
    by_fold = {key.lower(): key for key in vendors}
    key = by_fold.get(name.strip().lower())
    if key is None:
        model = find_device_model(name)
        if model is not None and not isinstance(model, list):
            key = by_fold.get(model.vendor_key.lower())
    if key is None:
        raise where.at(entry, "device").error(
            f'"{name}" is none of the scheduler\'s device vendors ({", ".join(vendors)}) nor a known model of one')
    return key


def _family_limits(where: Where, entry: dict, vendor: DeviceVendor) -> dict[str, str]:
    """gpus, gpumem and gpucores as the family's own count, memory and core resources."""
    key = vendor.vendor_key
    for field_name in ("gpumemPercentage", "gpuType"):
        if entry.get(field_name) is not None:
            raise where.at(entry, field_name).error(f'"{field_name}" is NVIDIA\'s; {key} devices have no such request')
    count, memory, core, unit = vendor.request_resources()
    limits = {count: str(optional(where, entry, "gpus", read_int, 1, minimum=1))}
    mib = optional(where, entry, "gpumem", read_mib)
    if mib is not None:
        if not memory:
            raise where.at(entry, "gpumem").error(f"{key} devices are given whole: no memory request")
        if mib % unit:
            raise where.at(entry, "gpumem").error(f"{key} memory is asked in units of {unit} MiB; "
                                                  f"{mib} MiB is not a whole number of them")
        limits[memory] = str(mib // unit)
    cores = optional(where, entry, "gpucores", read_int, None, minimum=0, maximum=100)
    if cores is not None:
        if not core:
            raise where.at(entry, "gpucores").error(f"{key} devices take no core request")
        limits[core] = str(cores)
    return limits


def _shorthand_pod(where: Where, entry: dict, *, device_config: DeviceConfig,
                   vendors: dict[str, DeviceVendor]) -> dict:
    names = nvidia_config(device_config)
    vendor_key = _device_vendor(where, entry, vendors)
    image = "cuda:12"
    if vendor_key != NVIDIA:
        limits = _family_limits(where, entry, vendors[vendor_key])
        image = "registry.k8s.io/pause:3.10"
    else:
        limits = {names.resource_count_name: str(optional(where, entry, "gpus", read_int, 1, minimum=1))}
        memory = optional(where, entry, "gpumem", read_mib)
        if memory is not None:
            limits[names.resource_memory_name] = str(memory)
        percent = optional(where, entry, "gpumemPercentage", read_int, None, minimum=1, maximum=100)
        if percent is not None:
            limits[names.resource_memory_percentage_name] = str(percent)
        cores = optional(where, entry, "gpucores", read_int, None, minimum=0, maximum=100)
        if cores is not None:
            limits[names.resource_core_name] = str(cores)
    annotations = optional(where, entry, "annotations", read_str_map, {})
    gpu_type = optional(where, entry, "gpuType", read_str) if vendor_key == NVIDIA else None
    if gpu_type is not None:
        annotations[USE_TYPE_ANNOTATION] = gpu_type
    for key, annotation in (("nodePolicy", NODE_POLICY_ANNOTATION), ("gpuPolicy", GPU_POLICY_ANNOTATION)):
        policy = optional(where, entry, key, read_str)
        if policy is not None:
            if policy not in POLICIES:
                raise where.at(entry, key).error(f'must be one of {", ".join(POLICIES)}, got "{policy}"')
            annotations[annotation] = policy
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": image, "resources": {"limits": limits}}]}
    selector = optional(where, entry, "nodeSelector", read_str_map, None)
    if selector:
        spec["nodeSelector"] = selector
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "", "annotations": annotations,
                         "labels": optional(where, entry, "labels", read_str_map, {})},
            "spec": spec}


def _template(where: Where, pod: dict, *, name: str, namespace: str, replicas: int, lifetime: int | None,
              vendors: dict[str, DeviceVendor], allow_no_device: bool) -> Template | None:
    """Check the pod with the scheduler's own request parser and policy reader."""
    pod["metadata"]["name"] = name
    pod["metadata"]["namespace"] = namespace
    vendor_ids = {key: i for i, key in enumerate(vendors)}
    try:
        request = parse_pod_requests(pod, vendors, vendor_ids)
        pod_policies(pod["metadata"].get("annotations") or {}, default_node="binpack", default_gpu="spread")
    except (RequestError, PolicyError) as exc:
        raise where.error(f'pod "{name}": the scheduler rejects it: {exc}') from None
    if request is None:
        if allow_no_device:
            return None
        raise where.error(f'pod "{name}" asks for no device the scheduler manages (e.g. nvidia.com/gpu)')
    return Template(name=name, namespace=namespace, replicas=replicas, lifetime=lifetime, pod=pod,
                    request=request, where=where)


def _fresh_pod(obj: dict, where: Where, *, vendors: dict[str, DeviceVendor]) -> dict:
    """A manifest ready to be created: no status, no node, no earlier scheduling decision."""
    pod = plain(obj)
    meta = pod.get("metadata")
    if meta is None:
        meta = pod["metadata"] = {}
    if not isinstance(meta, dict):
        raise where.at(obj, "metadata").error(f"expected a mapping, got {kind_of(meta)}")
    meta_where = where.at(obj, "metadata")
    for key in ("labels", "annotations"):
        if meta.get(key) is not None:
            meta[key] = read_str_map(meta_where.at(obj["metadata"], key), obj["metadata"][key])
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "generation",
                "ownerReferences", "deletionTimestamp", "generateName"):
        meta.pop(key, None)
    # A pod copied from a live cluster carries an earlier decision: none of it may survive
    # (a MIG record left behind would be charged as slices taken).
    drop = {*decision_keys(vendors), BIND_PHASE_ANNOTATION, BIND_TIME_ANNOTATION}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in drop}
    if meta.get("labels"):
        meta["labels"].pop(VGPU_NODE_LABEL, None)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise where.at(obj, "spec").error(f"expected the pod spec (a mapping), got {kind_of(spec)}")
    spec.pop("nodeName", None)
    if spec.get("nodeSelector") is not None:
        spec["nodeSelector"] = read_str_map(where.at(obj, "spec").at(obj["spec"], "nodeSelector"),
                                            obj["spec"]["nodeSelector"])
    pod.pop("status", None)
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    return pod


def recreated_by_owner(pod: dict, *, vendors: dict[str, DeviceVendor]) -> dict:
    """What the controller owning a running pod creates once it is evicted: the same spec and
    owner, no node, no status, no earlier decision (hami_py/defrag/rules.py says which pods are
    moved at all: those an owner recreates)."""
    owners = (pod.get("metadata") or {}).get("ownerReferences")
    fresh = _fresh_pod(pod, Where("<the cluster's running pods>"), vendors=vendors)
    if owners:
        fresh["metadata"]["ownerReferences"] = plain(owners)
    return fresh


# -- plain Kubernetes ----------------------------------------------------------------------------

def _load_kubernetes_form(docs: list[tuple[Any, Where]], path: str, *, vendors: dict[str, DeviceVendor]) -> Workload:
    templates: list[Template] = []
    podgroups: list[dict] = []
    podgroup_wheres: list[Where] = []
    no_device = 0
    skipped: dict[str, int] = {}
    for obj, where in kubernetes_objects(docs):
        kind = obj["kind"]
        if kind == "PodGroup" and str(obj.get("apiVersion", "")).startswith("scheduling.x-k8s.io/"):
            podgroups.append(_podgroup_manifest(obj, where))
            podgroup_wheres.append(where)
            continue
        if kind == "Pod":
            pod_where, pod_obj, replicas = where, obj, 1
        elif kind in _CONTROLLERS:
            spec_where = where.at(obj, "spec")
            spec = read_map(spec_where, obj.get("spec"))
            key = "parallelism" if kind == "Job" else "replicas"
            replicas = optional(spec_where, spec, key, read_int, 1, minimum=0, maximum=_MAX_PODS)
            pod_where = spec_where.at(spec, "template")
            pod_obj = read_map(pod_where, spec.get("template"))
        else:
            skipped[kind] = skipped.get(kind, 0) + 1
            continue
        template = _kubernetes_template(obj, where, pod_obj, pod_where, replicas, vendors=vendors)
        if template is None:
            no_device += 1
        elif template.replicas:
            templates.append(template)
    notes = [f"ignored {n} {kind} object(s)" for kind, n in sorted(skipped.items())]
    if no_device:
        notes.append(f"ignored {no_device} pod(s) that ask for no managed device")
    _check_podgroups_unique(podgroups, podgroup_wheres)
    return Workload(path=path, templates=templates, notes=notes, podgroups=podgroups)


def _podgroup_manifest(obj: dict, where: Where) -> dict:
    """A PodGroup of the file, checked as the scheduler reads it and ready to be created."""
    meta_where = where.at(obj, "metadata")
    meta = read_map(meta_where, obj.get("metadata"))
    name = required(meta_where, meta, "name", read_str)
    namespace = optional(meta_where, meta, "namespace", read_str, "default")
    manifest = {"apiVersion": PODGROUP_API, "kind": "PodGroup", "metadata": {"name": name, "namespace": namespace},
                "spec": plain(obj.get("spec") or {})}
    try:
        podgroup_spec(manifest)
    except GangSpecError as exc:
        raise where.at(obj, "spec").error(f'PodGroup "{name}": {exc}') from None
    return manifest


def _check_podgroups_unique(podgroups: list[dict], wheres: list[Where]) -> None:
    seen: dict[tuple[str, str], Where] = {}
    for obj, where in zip(podgroups, wheres):
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in seen:
            raise where.error(f'PodGroup "{key[0]}/{key[1]}" is also defined at line {seen[key].line}')
        seen[key] = where


def _kubernetes_template(obj: dict, where: Where, pod_obj: dict, pod_where: Where, replicas: int, *,
                         vendors: dict[str, DeviceVendor]) -> Template | None:
    meta_where = where.at(obj, "metadata")
    meta = read_map(meta_where, obj.get("metadata"))
    name = required(meta_where, meta, "name", read_str)
    namespace = optional(meta_where, meta, "namespace", read_str, "default")
    pod = _fresh_pod(pod_obj, pod_where, vendors=vendors)
    lifetime = None
    template_meta = pod_obj.get("metadata") or {}
    for source, source_where in ((meta, meta_where), (template_meta, pod_where.at(pod_obj, "metadata"))):
        annotations = source.get("annotations") or {}
        if LIFETIME_ANNOTATION in annotations:
            lifetime = read_int(source_where.at(source, "annotations").at(annotations, LIFETIME_ANNOTATION),
                                annotations[LIFETIME_ANNOTATION], minimum=1)
    pod["metadata"]["annotations"].pop(LIFETIME_ANNOTATION, None)
    return _template(where, pod, name=name, namespace=namespace, replicas=replicas, lifetime=lifetime,
                     vendors=vendors, allow_no_device=True)

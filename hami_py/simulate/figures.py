"""The fragmentation figures of a scenario, read off the scheduler's books at the end of a run.

``fragmentation``: free memory on devices that would refuse the workload's typical request
(asked through the scheduler's own filter, nothing reserved). ``fragmentation_failures``:
pending pods whose memory the family's free memory would hold. Stranded memory (free memory on
devices out of slots or cores) is results.stranded_mib, sampled after every arrival by the
ScenarioRun (scenario_run.py).
"""
from __future__ import annotations

from hami_py.app import SchedulerApp
from hami_py.devices.base import ContainerRequest, DeviceVendor
from hami_py.devices.nvidia import USE_UUID_ANNOTATION, VENDOR_KEY as NVIDIA
from hami_py.devices.template import TemplateVendor
from hami_py.scheduling.decision.requests import parse_pod_requests
from hami_py.simulate.results import Fragmentation, gang_refusal
from hami_py.simulate.scenario_run import ScenarioRun
from hami_py.simulate.workload import Template, Workload


def pin_annotation(vendor_key: str, vendor: DeviceVendor) -> str | None:
    """The pod annotation that pins a one-device probe pod to one device (the fragmentation
    figure): NVIDIA's, or a generic-template family's first "use these ids" annotation."""
    if vendor_key == NVIDIA:
        return USE_UUID_ANNOTATION
    if isinstance(vendor, TemplateVendor) and vendor.spec.use_uuid:
        return vendor.spec.use_uuid[0]
    return None


def fragmentation_failures(run: ScenarioRun) -> int:
    """Pending pods whose device memory the cluster's free memory would hold: per family, the
    pod's memory request (per device x devices, a percentage of the family's largest device)
    is at most the free memory of that family's healthy devices."""
    if not run.pending:
        return 0
    cache = run.app.cache
    free: dict[int, int] = {}
    largest: dict[int, int] = {}
    for i, v in enumerate(cache.vendor):
        if v >= 0 and cache.health[i]:
            free[v] = free.get(v, 0) + max(cache.total_mem[i] - cache.used_mem[i], 0)
            largest[v] = max(largest.get(v, 0), cache.total_mem[i])
    failures = 0
    for outcome in run.pending:
        if outcome.gang and gang_refusal(outcome.gang, outcome.failed_nodes) is not None:
            continue    # it waits for its whole gang's room, not for memory to come together
        need: dict[int, int] = {}
        for per_vendor in run.arrivals[outcome.arrival].template.request.per_container:
            for key, req in per_vendor.items():
                v = cache.vendor_ids.get(key)
                if v is None:
                    continue
                each = req.memreq if req.memreq else largest.get(v, 0) * min(req.mempct, 100) // 100
                need[v] = need.get(v, 0) + each * req.nums
        if need and all(n <= free.get(v, 0) for v, n in need.items()):
            failures += 1
    return failures


def typical_request(workload: Workload) -> tuple[Template, int, str, ContainerRequest] | None:
    """The most common per-device request of the workload, weighted by how many devices ask for
    it (replicas x count); the first seen wins a tie. (template, container position, vendor, request)."""
    weights: dict[tuple, int] = {}
    first: dict[tuple, tuple] = {}
    for template in workload.templates:
        for position, per_vendor in enumerate(template.request.per_container):
            for vendor, req in per_vendor.items():
                key = (vendor, req.memreq, req.mempct, req.coresreq)
                weights[key] = weights.get(key, 0) + template.replicas * req.nums
                first.setdefault(key, (template, position, vendor, req))
    if not weights:
        return None
    order = list(first)
    best = max(order, key=lambda k: (weights[k], -order.index(k)))
    return first[best]


def describe_request(req: ContainerRequest, vendor: str) -> str:
    if req.memreq:
        memory = f"{req.memreq} MiB"
    elif req.mempct <= 100:
        memory = f"{req.mempct}% memory"
    else:
        memory = "default memory"
    return f"1 {vendor} device x {memory}, {req.coresreq}% cores"


def fragmentation(app: SchedulerApp, workload: Workload, node_names: list[str]) -> Fragmentation:
    """Free memory on healthy devices that the scheduler would refuse the typical request.

    Each device with free memory is asked, through the scheduler's own filter (without
    reserving anything), whether a one-device pod with the typical request, pinned to that device,
    fits. The free memory of every device that says no is stranded."""
    typical = typical_request(workload)
    if typical is None:
        return Fragmentation()
    template, position, vendor_key, req = typical
    vendor = app.vendors[vendor_key]
    pin = pin_annotation(vendor_key, vendor)
    result = Fragmentation(request=describe_request(req, vendor_key))
    probe = _probe_pod(template, position, count_resource=vendor.resource_names()[0])
    request = parse_pod_requests(probe, app.vendors, app.cache.vendor_ids)
    filterer = app.service.filterer
    cache = app.cache
    vendor_id = cache.vendor_ids[vendor_key]
    for node in node_names:
        entry = cache.nodes[node]
        for k, d in enumerate(cache.device_usage(node)):
            free = d["totalmem"] - d["usedmem"]
            if not d["health"] or free <= 0 or cache.vendor[entry.offset + k] != vendor_id:
                continue
            result.free_mib += free
            if pin is None:
                continue
            probe["metadata"]["annotations"] = {pin: d["id"]}
            decision = filterer.decide(probe, [node], request, reserve=False)
            if decision.node is None:
                result.stranded_mib += free
                result.stranded_gpus += 1
    if pin is None:
        result.request += " (not measured for this vendor)"
    return result


def _probe_pod(template: Template, position: int, *, count_resource: str) -> dict:
    spec = template.pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    container = dict(containers[position])
    resources = {k: dict(v) for k, v in (container.get("resources") or {}).items() if isinstance(v, dict)}
    for section in resources.values():
        if count_resource in section:
            section[count_resource] = "1"
    container["resources"] = resources
    return {"metadata": {"name": "fragmentation-probe", "namespace": "default", "uid": "", "annotations": {}},
            "spec": {"containers": [container]}}

"""Step 1 of a filter: what does this pod ask for?

Each container (init containers first, then app containers, the order the allocation annotations
use) is asked of every vendor; the answers become the kernel's flat request rows. A malformed
quantity is an error the user sees, not a silently dropped request (upstream drops it and the pod
is bound without devices, to fail later on the node).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

from hami_py.devices.base import ContainerRequest, DeviceVendor, RequestError
from hami_py.kernel_codes import ROW_WIDTH
from hami_py.podshape import PodShape, pod_shape

# Far beyond what any node offers (a few hundred device instances at most), and it bounds what a
# filter allocates for one pod: its output arrays and the kernel's scratch grow with the count.
MAX_DEVICES_PER_POD = 4096


@dataclass(slots=True)
class PodRequest:
    rows: array                                  # ROW_WIDTH int32 per (container, vendor) request
    row_vendor: list[str]                        # vendor key of each row
    row_container: list[int]                     # container position of each row
    containers: list[str]                        # container names, init first
    total_nums: int
    per_container: list[dict[str, ContainerRequest]]
    shape: PodShape                              # init containers (how many, which are sidecars)
    # Pooled families' asks (DeviceVendor.pooled), no kernel rows: vendor key → (container
    # position, request) in container order; the filter's pool step answers them.
    pooled: dict[str, list[tuple[int, ContainerRequest]]] | None = None

    @property
    def vendors(self) -> set[str]:
        return set(self.row_vendor)


def parse_pod_requests(pod: dict, vendors: dict[str, DeviceVendor],
                       vendor_ids: dict[str, int]) -> PodRequest | None:
    """The pod's device requests, or None when it asks for no managed device at all."""
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    init = spec.get("initContainers") or []
    app = spec.get("containers") or []
    if not isinstance(init, list) or not isinstance(app, list):
        raise RequestError("pod spec containers must be lists")
    rows = array("i")
    row_vendor: list[str] = []
    row_container: list[int] = []
    names: list[str] = []
    per_container: list[dict[str, ContainerRequest]] = []
    total = 0
    pooled: dict[str, list[tuple[int, ContainerRequest]]] = {}
    # A native sidecar's rows are app rows (it runs beside the app containers); the kernel lets
    # each ordinary init container's rows see the sidecars placed before it (hami_py/podshape.py).
    shape = pod_shape(pod)
    for position, container in enumerate([*init, *app]):
        if not isinstance(container, dict):
            raise RequestError(f"container #{position} is not an object")
        names.append(str(container.get("name", f"#{position}")))
        found: dict[str, ContainerRequest] = {}
        for key, vendor in vendors.items():
            req = vendor.container_request(container, pod_annotations=annotations)
            if req is None or req.nums <= 0:
                continue
            found[key] = req
            if vendor.pooled:
                pooled.setdefault(key, []).append((position, req))
                continue
            rows.extend((position, int(shape.is_init(position)), vendor_ids[key], req.nums,
                         req.memreq, req.mempct, req.coresreq))
            row_vendor.append(key)
            row_container.append(position)
            total += req.nums
        per_container.append(found)
    if not row_vendor and not pooled:
        return None
    if total > MAX_DEVICES_PER_POD:
        raise RequestError(f"asks for {total} devices in all; a pod may ask for at most {MAX_DEVICES_PER_POD}")
    assert len(rows) == ROW_WIDTH * len(row_vendor)
    return PodRequest(rows, row_vendor, row_container, names, total, per_container, shape, pooled or None)

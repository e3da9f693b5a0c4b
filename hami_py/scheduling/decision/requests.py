"""Step 1 of a filter: what does this pod ask for?

Each container (init containers first, then app containers, the order the allocation annotations
use) is asked of the vendors it may concern; the answers become the kernel's flat request rows. A
malformed quantity is an error the user sees, not a silently dropped request (upstream drops it
and the pod is bound without devices, to fail later on the node).

Asking every family (sixteen vendors with all of them on) about every container of every /filter
was some 40 % of parsing a one-container pod, while a container names the resources of one family
or two: each family declares the resource names that can make it answer
(``DeviceVendor.request_resource_names``), and a container is asked only of the families whose
names it carries, in vendor order, so the answers, and the first error when several families would
raise, are the ones asking every family gives (tests/test_requests_fastpath.py).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

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


class Askers:
    """Which families a container's resource names concern, for one vendors mapping."""

    __slots__ = ("size", "pairs", "always", "by_name")

    def __init__(self, vendors: dict[str, DeviceVendor]):
        self.size = len(vendors)
        self.pairs: tuple[tuple[str, DeviceVendor], ...] = tuple(vendors.items())
        always: list[int] = []
        by_name: dict[str, list[int]] = {}
        for position, (_, vendor) in enumerate(self.pairs):
            names = vendor.request_resource_names()
            if names is None:
                always.append(position)
                continue
            for name in names:
                by_name.setdefault(name, []).append(position)
        self.always = frozenset(always)
        self.by_name = {name: frozenset(positions) for name, positions in by_name.items()}

    def asked(self, container: dict) -> Sequence[tuple[str, DeviceVendor]]:
        """(key, vendor) of the families to ask about ``container``, in vendor order: every one
        when its resources are not the usual mappings (each family words its own error then)."""
        resources = container.get("resources")
        if resources is None:
            resources = {}
        elif type(resources) is not dict:
            return self.pairs
        limits = resources.get("limits")
        requests = resources.get("requests")
        if (limits is not None and type(limits) is not dict) or (requests is not None and type(requests) is not dict):
            return self.pairs
        by_name = self.by_name
        chosen = self.always
        for values in (limits, requests):
            if values:
                for name in values:
                    positions = by_name.get(name)
                    if positions is not None and not positions <= chosen:
                        chosen = chosen | positions
        if not chosen:
            return []
        pairs = self.pairs
        return [pairs[position] for position in sorted(chosen)]


# One Askers per vendors mapping, found by the mapping's identity (the scheduler's, a planning
# tool's, a test's: built once and never changed after). A few are kept, the oldest dropped first;
# an entry holds its mapping, so its id stays that mapping's while it is kept.
_BY_ID: dict[int, tuple[dict, Askers]] = {}
_KEPT = 8


def askers_of(vendors: dict[str, DeviceVendor]) -> Askers:
    known = _BY_ID.get(id(vendors))
    if known is not None and known[0] is vendors and known[1].size == len(vendors):
        return known[1]
    askers = Askers(vendors)
    _BY_ID.pop(id(vendors), None)
    if len(_BY_ID) >= _KEPT:
        _BY_ID.pop(next(iter(_BY_ID)))
    _BY_ID[id(vendors)] = (vendors, askers)
    return askers


def parse_pod_requests(pod: dict, vendors: dict[str, DeviceVendor],
                       vendor_ids: dict[str, int], *, prefilter: bool = True) -> PodRequest | None:
    """The pod's device requests, or None when it asks for no managed device at all.

    ``prefilter=False`` asks every family about every container (the same answer, slower)."""
    askers = askers_of(vendors) if prefilter else None
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
        for key, vendor in (askers.asked(container) if askers is not None else vendors.items()):
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

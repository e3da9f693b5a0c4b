"""Which devices a pod may not use: the reason code per device the kernel reads as its mask.

Most pods pick no device and most nodes cordon none, and those pay nothing here (an empty mask).
A pod's model and mode gates are judged once per device kind and spread over the devices at C
speed; cordon lists and UUID lists, device by device on the nodes concerned only. Each family
says what its gates are (``DeviceVendor.device_selector`` and ``gate_annotations``); this module
only applies them.
"""
from __future__ import annotations

from array import array

from hami_py import reasons as R
from hami_py.cache.usage import UsageCache
from hami_py.devices.base import DeviceSelector, DeviceVendor
from hami_py.scheduling.decision.requests import PodRequest


def _concerns(node_annotations: dict[str, str], gate_keys: set[str]) -> bool:
    """Whether a node's kept annotations can change the gates of a pod of these families."""
    return any(k in gate_keys or k.startswith("hami.io/device-") for k in node_annotations)


def device_mask(cache: UsageCache, vendors: dict[str, DeviceVendor], pod_annotations: dict[str, str],
                node_names: list[str], cand_idx: array, request: PodRequest) -> array:
    """Reason codes for devices this pod may not use; empty (free) when nothing restricts it.

    Only pods that pick or avoid devices, and nodes that cordon some, pay for this."""
    asked = [vendors[k] for k in request.vendors]
    # The pod's own gates are parsed once. Nodes whose annotations concern the pod's families
    # (a cordon list, a family's node switch) need gates of their own: built once per group
    # of nodes carrying the same annotations, since a family's plugin may write the same
    # switch on every node it runs on.
    pod_selectors = {cache.vendor_ids[v.vendor_key]: v.device_selector(pod_annotations, {}) for v in asked}
    gate_keys = {k for v in asked for k in v.gate_annotations}
    group_gates: dict[tuple, dict[int, DeviceSelector | None] | None] = {}   # None: restricts nothing
    for key, members in cache.annotation_groups.items():
        annotations = dict(key)
        if members and _concerns(annotations, gate_keys):
            gates = {cache.vendor_ids[v.vendor_key]: v.device_selector(pod_annotations, annotations)
                     for v in asked}
            group_gates[key] = None if all(sel is None for sel in gates.values()) else gates
    pod_wide = any(sel is not None for sel in pod_selectors.values())
    # Model and mode gates are judged kind by kind over all devices at once; what is left
    # (cordons, UUID lists) device by device on the nodes concerned.
    mask = kinds = kind_mask(cache, pod_selectors) if pod_wide else None
    nodes = cache.nodes
    if pod_wide and mask is None:
        marked = [n for c, n in enumerate(node_names) if cand_idx[c] >= 0]
    elif group_gates:
        # Nodes whose own gates differ from the pod-wide ones: every concerned node when a
        # pod-wide mask must be lifted or replaced there, else the restricting ones only.
        wanted = set().union(*(cache.annotation_groups[k] for k, g in group_gates.items()
                               if g is not None or kinds is not None))
        marked = [n for n in node_names if n in wanted] if wanted else []
    else:
        marked = []
    if mask is None:
        if not marked:
            return array("b")
        mask = array("b", bytes(len(cache.total_mem)))
    for name in marked:
        entry = nodes[name]
        key = entry.annotation_key
        if key in group_gates:
            selectors = group_gates[key]
            if selectors is None:
                # Nothing restricts the pod here: the node's slice is free of any pod-wide mark.
                if kinds is not None and entry.length:
                    mask[entry.offset:entry.offset + entry.length] = array("b", bytes(entry.length))
                continue
        else:
            selectors = pod_selectors
        for k, dev in enumerate(entry.devices):
            j = entry.offset + k
            vid = cache.vendor[j]
            if vid in selectors:
                sel = selectors[vid]
                # A node's own gates replace the pod-wide ones (its annotations may lift
                # what the pod-wide judgement, made without them, refused).
                mask[j] = sel(dev) if sel is not None else 0
    return mask


def kind_mask(cache: UsageCache, pod_selectors: dict[int, DeviceSelector | None]) -> array | None:
    """The mask of every device from the pod's model and mode gates, judged once per device
    kind and spread over the devices by one bytes.translate; None when a gate needs each
    device (UUID lists) or there are more kinds than a byte holds."""
    if len(cache.kind_ids) >= 256 or not all(
            sel is None or getattr(sel, "per_kind", False) for sel in pod_selectors.values()):
        return None
    table = bytearray(256)
    for kind, sample in enumerate(cache.kind_samples):
        if sample is not None and (sel := pod_selectors.get(sample[0])) is not None:
            table[kind] = sel(sample[1])
    mask = array("b")
    mask.frombytes(cache.kind.tobytes().translate(table))
    return mask


def only_allowed(cache: UsageCache, mask: array, node_names: list[str], allowed: frozenset[str]) -> array:
    """``mask`` with every device of these nodes outside ``allowed`` refused (CardUuidMismatch):
    a NUMA refit fits onto the devices kubelet's Topology Manager allows (scheduling/verbs/refit.py)."""
    if not len(mask):
        mask = array("b", bytes(len(cache.total_mem)))
    for name in node_names:
        entry = cache.nodes.get(name)
        if entry is None:
            continue
        for k, dev in enumerate(entry.devices):
            if dev.id not in allowed:
                mask[entry.offset + k] = R.CARD_UUID_MISMATCH
    return mask

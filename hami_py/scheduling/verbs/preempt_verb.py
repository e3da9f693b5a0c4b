"""``preemptVerb``: kube-scheduler's own preemption, checked against the devices.

kube-scheduler preempts for a pod when its own plugins find victims (CPU or memory pressure). It
then asks the extender with ``ExtenderPreemptionArgs``: per candidate node, the victims it chose,
as full pods (``NodeNameToVictims``, ``nodeCacheCapable: false``) or UIDs (``NodeNameToMetaVictims``).
Its victims free CPU and memory, not necessarily the devices the pod needs. So each node is kept
only when, with its victims gone, the pod fits its devices there, adding if needed the fewest of
that node's lower-priority device pods that make it fit (``VictimSearch.extend``, the same search
and kernel fit as the extender's own preemption). The answer is ``ExtenderPreemptionResult``:
``NodeNameToMetaVictims``, each node's victims (kube-scheduler's first, then ours) by UID, with
kube-scheduler's count of budget violations. Nodes where no set makes the pod fit are left out, and
kube-scheduler then picks among the others. It evicts; nothing is held or written here.
"""
from __future__ import annotations

from typing import Any

from hami_py.devices.base import DeviceVendor, RequestError
from hami_py.scheduling.eviction.victims import VictimSearch
from hami_py.scheduling.decision.requests import parse_pod_requests


class PreemptArgsError(ValueError):
    """ExtenderPreemptionArgs that cannot be read."""


def _lower(obj: Any) -> dict:
    return {k.lower(): v for k, v in obj.items()} if isinstance(obj, dict) else {}


def victims_by_node(args: dict) -> dict[str, tuple[list[str], int]]:
    """Per node, kube-scheduler's victims as UIDs and its NumPDBViolations, from either form."""
    a = _lower(args)
    out: dict[str, tuple[list[str], int]] = {}
    for field, uid_of in (("nodenametovictims", lambda p: _lower(_lower(p).get("metadata")).get("uid")),
                          ("nodenametometavictims", lambda p: _lower(p).get("uid"))):
        table = a.get(field)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise PreemptArgsError(f"extender preemption args {field} must be an object")
        for node, victims in table.items():
            v = _lower(victims)
            pods = v.get("pods") or []
            if not isinstance(pods, list):
                raise PreemptArgsError(f"extender preemption args {field}[{node}].Pods must be a list")
            uids = []
            for pod in pods:
                uid = uid_of(pod)
                if not isinstance(uid, str) or not uid:
                    raise PreemptArgsError(f"extender preemption args {field}[{node}]: a victim has no UID")
                uids.append(uid)
            violations = v.get("numpdbviolations") or 0
            out[node] = (uids, violations if type(violations) is int else 0)
    return out


def meta_victims(uids: list[str], violations: int) -> dict:
    return {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}


def process_preemption(args: Any, *, search: VictimSearch, vendors: dict[str, DeviceVendor],
                       vendor_ids: dict[str, int]) -> dict:
    """ExtenderPreemptionArgs → ExtenderPreemptionResult; PreemptArgsError or RequestError when
    the arguments cannot be read."""
    if not isinstance(args, dict):
        raise PreemptArgsError("extender preemption args must be a JSON object")
    pod = _lower(args).get("pod")
    if not isinstance(pod, dict):
        raise PreemptArgsError("extender preemption args missing pod")
    given = victims_by_node(args)
    request = parse_pod_requests(pod, vendors, vendor_ids)
    if request is None:   # no device of ours: kube-scheduler's victims stand
        return {"NodeNameToMetaVictims": {n: meta_victims(u, v) for n, (u, v) in given.items()}}
    kept = {}
    for node in sorted(given):
        uids, violations = given[node]
        choice = search.extend(pod, request, node, uids)
        if choice is not None:
            kept[node] = meta_victims(uids + [u for u in choice.uids if u not in uids], violations)
    return {"NodeNameToMetaVictims": kept}


__all__ = ["PreemptArgsError", "RequestError", "process_preemption", "victims_by_node"]

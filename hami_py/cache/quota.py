"""Namespace ResourceQuotas on device memory and cores, and what the namespace's pods use of them.

Upstream tracks only ``spec.hard`` keys ``limits.<memory or core resource>`` (the names each family's
``quota_resources()`` gives, e.g. ``limits.<vendor>/gpumem``) with exact integer values. Usage is
the sum of the namespace's pod allocations as the usage cache charges them (cores as the family
counts them against a quota, ``DeviceVendor.quota_cores``: a core mask counts its cores), updated
as the cache changes, so a filter reads the headroom in O(1). When several quotas in one namespace
limit the same resource, the smallest limit applies (Kubernetes enforces every quota; HAMi does
the same since #3094, and kept whichever it saw last before); adding, changing or deleting one
recomputes the namespace. A scoped quota (``spec.scopes``, or a ``scopeSelector`` with match
expressions) limits only the pods its scopes select, which this book does not tell apart: it is
skipped, as HAMi #3094 skips it. An explicit 0 is a limit (nothing of that resource fits), not
"no quota".
"""
from __future__ import annotations

from array import array
from typing import Iterable

from hami_py.devices.base import DeviceVendor
from hami_py.quantity import parse_exact_int

_LIMITS_PREFIX = "limits."
UNLIMITED = -(1 << 62)   # "no quota"; any other value, negative too, is the headroom


def scoped(spec: dict) -> bool:
    """A quota that limits only the pods its scopes select (BestEffort, Terminating, a
    PriorityClass, ...): ``spec.scopes`` non-empty, or a ``scopeSelector`` with match
    expressions (an empty selector selects every pod)."""
    return bool(spec.get("scopes")) or bool((spec.get("scopeSelector") or {}).get("matchExpressions"))


class QuotaBook:
    def __init__(self, vendors: dict[str, DeviceVendor], vendor_ids: dict[str, int]):
        self.vendor_ids = vendor_ids
        # resource name → (vendor key, "mem" | "cores")
        self.resources: dict[str, tuple[str, str]] = {}
        self.factors: dict[str, int] = {}
        # What a device's charged cores count against a quota (DeviceVendor.quota_cores), and the
        # families whose choosers check their quota themselves (the kernel is told no limit).
        self.core_counts = {key: vendor.quota_cores for key, vendor in vendors.items()}
        self.own_checks = {key for key, vendor in vendors.items() if vendor.quota_in_chooser}
        for key, vendor in vendors.items():
            mem_name, core_name, factor = vendor.quota_resources()
            if mem_name:
                self.resources[mem_name] = (key, "mem")
            if core_name:
                self.resources[core_name] = (key, "cores")
            self.factors[key] = max(int(factor or 1), 1)
        self.quotas: dict[str, dict[str, dict[str, int]]] = {}    # namespace → quota name → limits
        self.limits: dict[str, dict[tuple[str, str], int]] = {}   # namespace → (vendor, kind) → limit
        self.used: dict[str, dict[tuple[str, str], int]] = {}     # namespace → (vendor, kind) → used

    # ------------------------------------------------------------------ quota objects
    def upsert(self, quota: dict) -> None:
        meta = quota.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        spec = quota.get("spec") or {}
        hard = {} if scoped(spec) else spec.get("hard") or {}
        limits = {}
        for key, value in hard.items():
            if not key.startswith(_LIMITS_PREFIX) or key[len(_LIMITS_PREFIX):] not in self.resources:
                continue
            number = parse_exact_int(value)
            if number is not None:
                limits[key[len(_LIMITS_PREFIX):]] = number
        in_ns = self.quotas.get(ns, {})
        if in_ns.get(name) == (limits or None):
            return      # most quota events are status updates: nothing to recompute
        if limits:
            self.quotas.setdefault(ns, {})[name] = limits
        else:
            in_ns.pop(name, None)
        self._rebuild_limits(ns)

    def remove(self, quota: dict) -> None:
        meta = quota.get("metadata") or {}
        ns = meta.get("namespace", "")
        if self.quotas.get(ns, {}).pop(meta.get("name", ""), None) is not None:
            self._rebuild_limits(ns)

    def replace(self, quotas: Iterable[dict]) -> None:
        self.quotas.clear()
        self.limits.clear()
        for quota in quotas:
            self.upsert(quota)

    def _rebuild_limits(self, ns: str) -> None:
        """The namespace's limits: the smallest of its quotas' per resource (O(its quotas))."""
        merged: dict[tuple[str, str], int] = {}
        for limits in self.quotas.get(ns, {}).values():
            for resource, limit in limits.items():
                key = self.resources[resource]
                merged[key] = min(limit, merged.get(key, limit))
        if merged:
            self.limits[ns] = merged
        else:
            self.limits.pop(ns, None)
            self.quotas.pop(ns, None)

    # ------------------------------------------------------------------ usage
    def charge(self, namespace: str, entries, sign: int) -> None:
        used = self.used.setdefault(namespace, {})
        counts = self.core_counts
        for e in entries:
            count = counts.get(e.vendor)
            for kind, amount in (("mem", e.mem), ("cores", e.cores if count is None else count(e.cores))):
                key = (e.vendor, kind)
                used[key] = max(0, used.get(key, 0) + sign * amount)

    # ------------------------------------------------------------------ checks
    def _effective_limit(self, vendor: str, kind: str, limit: int) -> int:
        factor = self.factors.get(vendor, 1)
        return limit * factor if kind == "mem" and factor > 1 else limit

    def headroom(self, namespace: str) -> tuple[array, array]:
        """Per vendor id, memory and cores the namespace may still take (UNLIMITED if no quota, and
        for a family whose chooser checks its quota itself)."""
        n = len(self.vendor_ids)
        mem = array("q", [UNLIMITED] * n)
        cores = array("q", [UNLIMITED] * n)
        limits = self.limits.get(namespace)
        if limits:
            used = self.used.get(namespace, {})
            for (vendor, kind), limit in limits.items():
                if vendor in self.own_checks:
                    continue
                left = self._effective_limit(vendor, kind, limit) - used.get((vendor, kind), 0)
                target = mem if kind == "mem" else cores
                target[self.vendor_ids[vendor]] = left
        return mem, cores

    def fits(self, namespace: str, vendor: str, mem: int, cores: int) -> bool:
        """The admission-time check: would this much more stay within the namespace's quotas?"""
        limits = self.limits.get(namespace)
        if not limits:
            return True
        used = self.used.get(namespace, {})
        for kind, amount in (("mem", mem), ("cores", cores)):
            limit = limits.get((vendor, kind))
            if limit is not None and used.get((vendor, kind), 0) + amount > self._effective_limit(vendor, kind, limit):
                return False
        return True

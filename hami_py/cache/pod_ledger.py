"""The pod ledger: what each pod is charged, kept per pod UID from watch events and our own /filter.

Upstream HAMi rebuilds every node's usage from every pod on each /filter call. Here a pod's
allocation is decoded from its annotations once (a fingerprint of them skips the decode on the
many events that leave them alone), charged once under its UID (so a replayed event is harmless)
and subtracted exactly on delete, termination or rollback. The ledger keeps the records and the
rules about which event may change them (stale resourceVersions, rolled-back decisions, in-flight
reservations, relists); the device table holds the sums the kernel reads, the partition tables
the MIG slices, and the quota book the per-namespace totals. Nodes are read, never written: a
pod's devices are resolved to slots through the node inventory's entries.
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable, Iterable, Iterator, Mapping

import structlog

from hami_py.cache.device_table import DeviceTable
from hami_py.cache.live_pods import LivePods
from hami_py.cache.partitions import PartitionTables
from hami_py.cache.quota import QuotaBook
from hami_py.cache.pod_states import PodState, advance, observed
from hami_py.cache.records import NodeEntry, PodUsage, UsageEntry, allocation_finished
from hami_py.devices.base import AllocationDecodeError, DeviceVendor, PodDevices
from hami_py.podshape import PodShape, pod_shape

log = structlog.get_logger(__name__)

VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"
_TERMINAL_PHASES = ("Succeeded", "Failed")
DELETED_UIDS_KEPT = 16384      # pod UIDs remembered as deleted (a stale /filter of one is refused)


def collapse(pod_devices: PodDevices, vendor: str, shape: PodShape) -> list[UsageEntry]:
    """Per-device usage of one vendor's allocation, containers folded in as Kubernetes runs them.

    Ordinary init containers run one at a time, each beside the native sidecars started before
    it; sidecars then run beside the app containers (KEP-753, hami_py/podshape.py). So a device's
    charge is the larger of the peak over ordinary init containers (each plus the sidecars before
    it) and the sum over app containers and sidecars. Once every ordinary init container has
    succeeded only the app containers and sidecars count. Slots likewise: each device holds
    ``ContainerDevice.slots`` (1 unless a partition of several slices), at least 1.
    """
    peak: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}      # app containers and the sidecars started so far
    for position, container in enumerate(pod_devices):
        if shape.is_init(position):
            if shape.init_done:
                continue
            for dev in container:
                cur = peak.setdefault(dev.uuid, [0, 0, 0])
                side = app.get(dev.uuid, (0, 0, 0))
                cur[0] = max(cur[0], side[0] + dev.usedmem)
                cur[1] = max(cur[1], side[1] + dev.usedcores)
                cur[2] = max(cur[2], side[2] + dev.slots)
        else:
            for dev in container:
                cur = app.setdefault(dev.uuid, [0, 0, 0])
                cur[0] += dev.usedmem
                cur[1] += dev.usedcores
                cur[2] += dev.slots
    entries = []
    for uuid in sorted(peak.keys() | app.keys()):
        p = peak.get(uuid, (0, 0, 0))
        a = app.get(uuid, (0, 0, 0))
        entries.append(UsageEntry(vendor, uuid, max(p[0], a[0]), max(p[1], a[1]), max(p[2], a[2], 1)))
    return entries


def pod_key(pod: dict) -> str:
    """``namespace/name``, the namespace defaulted as the API server defaults it."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def pod_priority(pod: dict) -> int:
    """``spec.priority`` (resolved from the PriorityClass at admission), 0 when unset or garbled."""
    value = (pod.get("spec") or {}).get("priority")
    return value if type(value) is int else 0


def _started(pod: dict) -> float:
    """When the pod started running (``status.startTime``), else when it was created; 0 if neither
    parses (RFC 3339, UTC as the API server writes it)."""
    for stamp in ((pod.get("status") or {}).get("startTime"), (pod.get("metadata") or {}).get("creationTimestamp")):
        if isinstance(stamp, str):
            try:
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def _rv(obj: dict) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


# The charges a /bind may find as the pod's reservation: its /filter's decision, and the same
# decision once that bind's Binding is created (a repeated bind then answers at once).
_OURS_TO_BIND = frozenset((PodState.RESERVED, PodState.SHOWN, PodState.BOUND_UNSEEN))


class PodLedger:
    """Pods charged by UID, their nodes' members, and the decisions rolled back."""

    def __init__(self, vendors: dict[str, DeviceVendor], table: DeviceTable, partitions: PartitionTables,
                 quota: QuotaBook, nodes: Mapping[str, NodeEntry]):
        self.vendors = vendors
        self.table = table
        self.partitions = partitions
        self.quota = quota
        self.nodes = nodes          # the node inventory's entries (read only here)
        self.pods: dict[str, PodUsage] = {}
        self.node_pods: dict[str, set[str]] = {}
        # Families whose devices may sit on another node than the pod (DeviceVendor.pooled: a
        # GPU served over the network), and per such node the UIDs of the pods placed elsewhere
        # that are charged there: that node's recharge and removal reach them too.
        self._pooled = frozenset(k for k, v in vendors.items() if v.pooled)
        self.foreign_pods: dict[str, set[str]] = {}
        # Decisions rolled back (failed patch or bind) that the pod's annotations may still
        # carry: events repeating exactly that decision must not charge it again.
        self.released: dict[str, tuple[str, list[UsageEntry]]] = {}
        # UIDs of pods the watch showed deleted, most recent last (bounded): a /filter of a stale
        # copy of one (kube-scheduler's cache lags) must not reserve for a pod nothing will
        # ever release, since the filter no longer writes to the pod (which would refuse it).
        self.deleted: dict[str, None] = {}
        # Every pod the watch shows alive (charged or not), by UID: what /filter and /bind check a
        # request's pod against (cache/live_pods.py).
        self.live_pods = LivePods()
        # Told (the pod object, why) when a bound pod's allocation annotations cannot be decoded:
        # the app turns it into a warning Event on the pod (the books know no Kubernetes client).
        # Once per pod and garbled text: its later events carrying the same text say nothing new.
        self.on_undecodable: Callable[[dict, str], None] | None = None
        self._undecodable: dict[str, dict | None] = {}
        # Every annotation a pod's charge is decoded from.
        self._allocation_keys = [VGPU_NODE_ANNOTATION, *dict.fromkeys(
            k for v in vendors.values() for k in (v.allocated_annotation, *v.decision_annotations()) if k)]
        # Which vendors can read a charge from which annotation: a pod event asks only the
        # vendors whose keys the pod carries (a decode reads only its own keys, DeviceVendor).
        self._readers: dict[str, list[str]] = {}
        for key, vendor in vendors.items():
            for k in dict.fromkeys((vendor.allocated_annotation, *vendor.decision_annotations())):
                if k:
                    self._readers.setdefault(k, []).append(key)
        self._vendor_order = {key: i for i, key in enumerate(vendors)}
        # The pod annotations kept with a charge for the families' choosers (DeviceVendor.pod_marks).
        self._mark_keys = tuple(dict.fromkeys(k for v in vendors.values() for k in v.pod_marks))
        self._allocation_keys.extend(k for k in self._mark_keys if k not in self._allocation_keys)
        self._allocation_key_set = frozenset(self._allocation_keys)
        self.pods_synced = False
        self._relist_pods_seen: set[str] = set()

    # ------------------------------------------------------------------ queries
    def live_reservation(self, uid: str, node: str) -> PodUsage | None:
        """The decision this process's /filter reserved for pod ``uid`` on ``node``, if it still
        holds every device it names there; None otherwise (the bind must not happen)."""
        pod = self.pods.get(uid)
        if pod is None or pod.state not in _OURS_TO_BIND or pod.node != node or node not in self.nodes \
                or len(pod.resolved) != len(pod.entries) or -1 in pod.resolved:
            return None
        return pod

    def scheduled_node(self, uid: str) -> str | None:
        """The node this process's /filter placed the pod on, while that decision is unbound and
        still a /bind's to use (``PodState.bindable``); None otherwise."""
        pod = self.pods.get(uid)
        return pod.node if pod is not None and pod.state.bindable else None

    def bound_node(self, uid: str) -> str | None:
        """The node a charged pod is bound to, None when it is not bound (or not charged)."""
        pod = self.pods.get(uid)
        return pod.node if pod is not None and pod.state.bound else None

    def uid_of(self, namespace: str, name: str, node: str) -> str:
        """The UID of a pod charged to ``node`` under that name ("" when there is none)."""
        for uid in self.node_pods.get(node, ()):
            pod = self.pods[uid]
            if pod.name == name and pod.namespace == namespace:
                return uid
        return ""

    def marks_of(self, annotations: dict[str, str]) -> dict[str, str]:
        """The pod annotations kept with its charge (every family's ``pod_marks`` it carries)."""
        return {k: annotations[k] for k in self._mark_keys if k in annotations} if self._mark_keys else {}

    def device_marks(self, entry: NodeEntry) -> list[list[tuple[dict[str, str], UsageEntry]]]:
        """Per device of the node (its slice order), each pod charged to it: (its marks, its
        charge there)."""
        out: list[list[tuple[dict[str, str], UsageEntry]]] = [[] for _ in range(entry.length)]
        offset = entry.offset
        for uid in self.node_pods.get(entry.name, ()):
            pod = self.pods[uid]
            for e, j in zip(pod.entries, pod.resolved):
                if offset <= j < offset + entry.length:
                    out[j - offset].append((pod.marks, e))
        return out

    def pods_on_node(self, node: str, except_uid: str = "") -> Iterator[PodUsage]:
        for uid in self.node_pods.get(node, ()):
            if uid != except_uid:
                yield self.pods[uid]

    # ------------------------------------------------------------------ charging
    def _charge_nodes(self, pod: PodUsage) -> set[str]:
        """The nodes besides the pod's own whose devices it is charged (pooled families only)."""
        if not self._pooled:
            return set()
        vendors, pooled, own = self.vendors, self._pooled, pod.node
        return {n for e in pod.entries if e.vendor in pooled
                and (n := vendors[e.vendor].charge_node(e.uuid, own)) != own}

    def _resolve(self, pod: PodUsage) -> list[int]:
        if self._pooled and any(e.vendor in self._pooled for e in pod.entries):
            nodes, vendors, pooled, out = self.nodes, self.vendors, self._pooled, []
            for e in pod.entries:
                where = nodes.get(vendors[e.vendor].charge_node(e.uuid, pod.node) if e.vendor in pooled else pod.node)
                out.append(-1 if where is None else where.uuid_to_slot.get(e.uuid, -1))
            return out
        entry = self.nodes.get(pod.node)
        if entry is None:
            return []
        return [entry.uuid_to_slot.get(e.uuid, -1) for e in pod.entries]

    def _apply(self, pod: PodUsage, sign: int) -> None:
        self.table.charge(pod.entries, pod.resolved, sign)
        entry = self.nodes.get(pod.node)
        if entry is not None:
            self.partitions.charge(entry, pod, sign, self.pods_on_node)

    def _apply_on(self, pod: PodUsage, entry: NodeEntry, sign: int) -> None:
        """Charge only the pod's devices on ``entry``'s node (a pod whose devices span nodes)."""
        low, high = entry.offset, entry.offset + entry.length
        kept = [(e, j) for e, j in zip(pod.entries, pod.resolved) if low <= j < high]
        self.table.charge([e for e, _ in kept], [j for _, j in kept], sign)
        if entry.name == pod.node:
            self.partitions.charge(entry, pod, sign, self.pods_on_node)

    def recharge_node(self, entry: NodeEntry) -> None:
        """Rebuild one node's usage from the pods charged to it (after its inventory changed):
        the pods placed on it, and those placed elsewhere holding its devices (pooled families),
        each for its devices there only."""
        self.table.clear_usage(entry)
        self.partitions.reset_node(entry)
        foreign = self.foreign_pods.get(entry.name, ())
        for uid in self.node_pods.get(entry.name, ()):
            pod = self.pods[uid]
            pod.resolved = self._resolve(pod)
            if self._pooled and self._charge_nodes(pod):
                self._apply_on(pod, entry, +1)
            else:
                self._apply(pod, +1)
        for uid in foreign:
            pod = self.pods[uid]
            pod.resolved = self._resolve(pod)
            self._apply_on(pod, entry, +1)

    def resolve_all(self) -> None:
        """Every pod's slots again (after the device table moved them)."""
        for pod in self.pods.values():
            pod.resolved = self._resolve(pod)

    def unresolve_node(self, node: str) -> None:
        """The node is gone: its pods keep their records (their own events release them) but
        hold no slot."""
        for uid in self.node_pods.get(node, ()):
            pod = self.pods[uid]
            pod.resolved = self._unresolved(pod, node) if self._pooled else []
        for uid in self.foreign_pods.get(node, ()):
            pod = self.pods[uid]
            pod.resolved = self._unresolved(pod, node)

    def _unresolved(self, pod: PodUsage, node: str) -> list[int]:
        """The pod's slots with those on ``node`` (gone) dropped: [] for a pod charged on its own
        node alone, else -1 for each device charged there (the others stay charged)."""
        if not self._charge_nodes(pod) or len(pod.resolved) != len(pod.entries):
            return []
        vendors, pooled = self.vendors, self._pooled
        return [-1 if (vendors[e.vendor].charge_node(e.uuid, pod.node) if e.vendor in pooled else pod.node) == node
                else j for e, j in zip(pod.entries, pod.resolved)]

    def add_pod_usage(self, pod: PodUsage) -> None:
        """Charge a record in the state it carries (a new one in one of ``pod_states.ENTRIES``, or
        one a trial took out, back as it was); a record already charged under its UID is replaced."""
        if not pod.state.seen:
            self.released.pop(pod.uid, None)     # a decision of ours: any rolled-back one is void
        old = self.pods.get(pod.uid)
        if old is not None:
            self.remove_pod(old.uid)
        pod.resolved = self._resolve(pod)
        if pod.resolved and -1 in pod.resolved:
            log.warning("pod holds a device its node does not register", pod=f"{pod.namespace}/{pod.name}",
                        node=pod.node)
        self.pods[pod.uid] = pod
        self.node_pods.setdefault(pod.node, set()).add(pod.uid)
        for node in self._charge_nodes(pod):
            self.foreign_pods.setdefault(node, set()).add(pod.uid)
        self._apply(pod, +1)
        self.quota.charge(pod.namespace, pod.entries, +1)

    def mark_bound(self, pod: PodUsage) -> None:
        """Our /bind created the pod's Binding: its reservation is bound, not yet seen. One the
        watch has shown bound meanwhile (the Binding's event can beat its answer) stays so."""
        if not pod.state.bound:
            pod.state = advance(pod.state, PodState.BOUND_UNSEEN)

    def mark_held(self, pod: PodUsage) -> None:
        """A reservation just made becomes a hold (scheduling/eviction/holds.py): charged, never bound."""
        pod.state = advance(pod.state, PodState.HELD)

    def release_pod(self, uid: str, *, namespace: str | None = None, name: str | None = None) -> PodUsage | None:
        """Roll back a decision: free its usage and ignore events that still carry it. Given the
        name a request gave for the pod, a record under ``uid`` held for another pod is left alone
        (upstream's TakeAndDeletePod: a /bind naming one pod with another's UID must not free the
        other's devices, which could then be handed out twice)."""
        held = self.pods.get(uid)
        if held is not None and name is not None and (held.name, held.namespace) != (name, namespace):
            log.warning("refusing to release a reservation: the request names a different pod than its UID holds",
                        uid=uid, holds=f"{held.namespace}/{held.name}", named=f"{namespace}/{name}")
            return None
        pod = self.remove_pod(uid)
        if pod is not None:
            self.released[uid] = (pod.node, pod.entries)
        return pod

    def release_unbound_reservations(self) -> int:
        """Roll back every decision of this process's /filter that is not bound yet (at the end
        of its leadership): /filter writes nothing, so no other replica can see them, and the new
        leader may give their devices to other pods; a bind of one is sent back to /filter. How
        many were released."""
        unbound = [uid for uid, p in self.pods.items() if p.state is PodState.RESERVED]
        for uid in unbound:
            self.release_pod(uid)
        return len(unbound)

    def forget_decision(self, pod: dict) -> None:
        """The decision an unbound pod object carries holds nothing any more (the pod was filtered
        again and fits nowhere; scheduling/verbs/stale.py clears it from the pod): uncharge it and, as
        after release_pod, ignore events that still carry it unless the pod is bound. A reservation
        of our own made since (a preemption's hold) is not that decision, and stays."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        current = self.pods.get(uid)
        if current is not None and current.state.seen:
            self.remove_pod(uid)
        try:
            usage = self.pod_usage_from_object(pod)
        except AllocationDecodeError:
            return  # a garbled allocation was never charged
        if usage is not None:
            self.released[uid] = (usage.node, usage.entries)

    def remove_pod(self, uid: str) -> PodUsage | None:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return None
        self._apply(pod, -1)
        self.quota.charge(pod.namespace, pod.entries, -1)
        members = self.node_pods.get(pod.node)
        if members is not None:
            members.discard(uid)
            if not members:
                del self.node_pods[pod.node]
        for node in self._charge_nodes(pod):
            members = self.foreign_pods.get(node)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self.foreign_pods[node]
        return pod

    # ------------------------------------------------------------------ pod objects and events
    def _readers_of(self, annotations: dict[str, str]) -> list[str]:
        """The vendors (in vendor order) with an allocation key among these annotations."""
        readers = self._readers
        present = {v for k in readers.keys() & annotations.keys() for v in readers[k]}
        return sorted(present, key=self._vendor_order.__getitem__) if len(present) > 1 else list(present)

    def charge_of(self, annotations: dict[str, str], shape: PodShape) -> tuple[list[UsageEntry], list[tuple]]:
        """What a pod carrying these annotations is charged: its devices (per device, folded over
        its containers by ``shape``) and its partition instances.

        The one computation of a charge. A reservation of our /filter is charged by it from the
        annotations its Binding will write, a pod the watch shows and a restart's recount from
        the annotations the pod carries: the same function of the same text, so a pod costs the
        same in every state (docs/ARCHITECTURE.md, "one set of books"). Raises
        AllocationDecodeError for an allocation annotation a family cannot read."""
        entries: list[UsageEntry] = []
        mig: list[tuple] = []
        instance = self.partitions.instance
        for key in self._readers_of(annotations):
            vendor = self.vendors[key]
            try:
                devices = vendor.decode_allocation(annotations)
            except AllocationDecodeError as exc:
                # Which text: the family's keys the pod carries, for the log and the pod's Event.
                keys = [k for k in dict.fromkeys((vendor.allocated_annotation, *vendor.decision_annotations()))
                        if k in annotations]
                raise AllocationDecodeError(f"{', '.join(keys)}: {exc}") from None
            if devices:
                entries.extend(collapse(devices, key, shape))
            for uuid, start, size, runtime in vendor.decode_partitions(annotations):
                record = instance(uuid, start, size, runtime)
                if record is not None:
                    mig.append(record)
        return entries, mig

    def pod_usage_from_object(self, pod: dict, shape: PodShape | None = None) -> PodUsage | None:
        """The usage a pod object's annotations claim, or None when it claims none (``shape``:
        the pod's, when the caller has it already)."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node = annotations.get(VGPU_NODE_ANNOTATION)
        if not node:
            return None
        entries, mig = self.charge_of(annotations, pod_shape(pod) if shape is None else shape)
        return PodUsage(uid=meta.get("uid", ""), namespace=meta.get("namespace", ""),
                        name=meta.get("name", ""), node=node, entries=entries,
                        resource_version=_rv(pod), mig=mig, marks=self.marks_of(annotations),
                        priority=pod_priority(pod), started=_started(pod))

    def _gone(self, uid: str) -> None:
        """The pod is deleted (its DELETED event, or a relist without it): its charge goes, by UID
        alone (whatever the last object showed, annotations or none), and the UID is remembered."""
        self.remove_pod(uid)
        self.released.pop(uid, None)
        self.live_pods.forget(uid)
        self._undecodable.pop(uid, None)
        self.deleted[uid] = None
        if len(self.deleted) > DELETED_UIDS_KEPT:
            del self.deleted[next(iter(self.deleted))]

    def on_pod_event(self, event_type: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self._gone(uid)
            return
        if self.deleted:
            self.deleted.pop(uid, None)   # the UID lives (again, where a test re-creates it)
        self.live_pods.observe(uid, pod)
        current = self.pods.get(uid)
        rv = _rv(pod)
        if current is not None and current.resource_version is not None and rv is not None \
                and rv < current.resource_version:
            return  # older than what our own patch produced: a stale event in flight
        if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            self.remove_pod(uid)
            return
        fingerprint = self._fingerprint(pod, meta)
        if current is not None and fingerprint is not None and current.fingerprint == fingerprint:
            # Most pod events (status, labels, the bind-phase patch) leave the allocation alone.
            if rv is not None:
                current.resource_version = rv
            current.state = advance(current.state, observed(
                current.state, bound=fingerprint[2], allocated=allocation_finished(meta.get("annotations"))))
            return
        try:
            # The fingerprint holds the pod's shape already (it is computed once per event).
            usage = self.pod_usage_from_object(pod, None if fingerprint is None else fingerprint[1])
        except AllocationDecodeError as exc:
            self._report_undecodable(uid, pod, fingerprint, str(exc))
            return
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if usage is None:
            # No scheduler decision on this object. A reservation of our /filter not bound yet
            # stays (the filter writes nothing: its Binding carries the decision), unless the pod
            # shows itself bound without it (bound by someone else: it runs on no device of ours);
            # one the API server has seen and that is now gone is released.
            if current is not None and rv is not None and (
                    current.state.seen or (bound and not current.state.bound)):
                self.remove_pod(uid)
            return
        if current is not None and not current.state.seen \
                and (usage.node, usage.entries) != (current.node, current.entries) \
                and not (bound and not current.state.bound):
            # Our reservation is not bound yet, so any other decision an unbound object shows
            # predates it (left by an older scheduler, or a relist or a late event): keep the
            # newer reservation charged. A pod bound with another decision runs on that one.
            return
        if self.released.get(uid) == (usage.node, usage.entries) and not bound:
            # The annotations still show a decision we rolled back. A pod that is bound all the
            # same (a Binding that landed after we gave up on it) is always charged.
            return
        allocated = allocation_finished(meta.get("annotations"))
        if current is not None and (current.node, current.entries, current.mig, current.marks) \
                == (usage.node, usage.entries, usage.mig, usage.marks):
            # The object shows the very charge the record holds (our reservation, bound or not,
            # or an earlier event's): the record moves on, nothing is charged again.
            record = current
            record.resource_version = usage.resource_version or record.resource_version
            if usage.resource_version is not None:   # an object's: the pod's own priority and start
                record.priority, record.started = usage.priority, usage.started
            record.state = advance(record.state, observed(record.state, bound=bound, allocated=allocated))
        else:
            record = usage
            record.state = observed(None, bound=bound, allocated=allocated)
            self.add_pod_usage(record)
        record.fingerprint = fingerprint

    def _report_undecodable(self, uid: str, pod: dict, fingerprint: tuple | None, error: str) -> None:
        """A pod whose allocation annotations no family can read: logged, and a bound one (its
        device plugin reads the same text) reported upward once per garbled text."""
        meta = pod.get("metadata") or {}
        log.warning("pod allocation annotation rejected", pod=f"{meta.get('namespace')}/{meta.get('name')}",
                    error=error)
        if not (pod.get("spec") or {}).get("nodeName") or self.on_undecodable is None:
            return
        seen = fingerprint[0] if fingerprint is not None else None
        if uid in self._undecodable and self._undecodable[uid] == seen:
            return
        self._undecodable[uid] = seen
        if len(self._undecodable) > DELETED_UIDS_KEPT:
            del self._undecodable[next(iter(self._undecodable))]
        self.on_undecodable(pod, error)

    def _fingerprint(self, pod: dict, meta: dict) -> tuple | None:
        annotations = meta.get("annotations") or {}
        if VGPU_NODE_ANNOTATION not in annotations:
            return None
        # The pod's own keys among every family's (some fifty): the few it carries, not the fifty.
        return ({k: annotations[k] for k in annotations.keys() & self._allocation_key_set}, pod_shape(pod),
                bool((pod.get("spec") or {}).get("nodeName")))

    # ------------------------------------------------------------------ relists
    def replace_pods(self, pods: Iterable[dict], list_rv: int | None) -> None:
        """A fresh list: apply everything in it; pods missing from it were deleted meanwhile."""
        self.begin_pod_relist()
        self.relist_pods_page(pods)
        self.finish_pod_relist(list_rv)

    def begin_pod_relist(self) -> None:
        self._relist_pods_seen = set()

    def relist_pods_page(self, pods: Iterable[dict]) -> None:
        seen = self._relist_pods_seen
        for pod in pods:
            seen.add((pod.get("metadata") or {}).get("uid"))
            self.on_pod_event("ADDED", pod)

    def finish_pod_relist(self, list_rv: int | None) -> None:
        """Pods the list no longer has were deleted meanwhile. A reservation not yet seen back
        from the watch (no resourceVersion: our /filter's, not bound or its Binding not seen yet)
        is kept unless the list is newer than the pod object that filter decided for: the list
        may simply predate the pod, but one taken after it that lacks the pod proves it deleted
        (while the watch was down; a reservation never bound would otherwise leak)."""
        seen = self._relist_pods_seen
        for uid in self.live_pods.drop_missing(seen):
            # The watch had shown it alive, and a list taken since lacks it: deleted while the
            # watch was down (client-go's tombstone), whatever its record's state.
            self._gone(uid)
        for uid in [u for u in self.pods if u not in seen]:
            p = self.pods[uid]
            if not p.state.seen and (
                    list_rv is None or p.filtered_rv is None or p.filtered_rv > list_rv):
                continue
            if list_rv is not None and p.resource_version is not None and p.resource_version > list_rv:
                continue
            self.remove_pod(uid)
        self._relist_pods_seen = set()
        self.pods_synced = True

    # ------------------------------------------------------------------ checks
    def recount(self) -> dict[str, tuple[int, int, int]]:
        """Usage recomputed from scratch from the pod records (for invariant checks in tests)."""
        device_ids = self.table.device_ids
        totals: dict[str, list[int]] = {}
        for pod in self.pods.values():
            for e, j in zip(pod.entries, pod.resolved):
                if j >= 0:
                    t = totals.setdefault(device_ids[j], [0, 0, 0])
                    t[0] += e.slots
                    t[1] += e.mem
                    t[2] += e.cores
        return {k: tuple(v) for k, v in totals.items()}

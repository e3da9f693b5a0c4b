"""The /filter decision: candidates, device gates, one kernel call, choice, reservation.

``Filterer.decide`` is synchronous on purpose. It reads free capacity, picks devices and records
the reservation in the usage cache without an ``await`` in between, so two concurrent filters on
one event loop cannot both take the last share of a GPU. Nothing is written to the pod here nor
by the caller: the reservation keeps the decision's annotations, and the bind's Binding carries
them onto the pod with spec.nodeName.
"""
from __future__ import annotations

import time
from array import array
from itertools import compress, repeat

import structlog

from hami_py import _kernel
from hami_py.cache.stuck_locks import StuckLock
from hami_py.cache.usage import VGPU_NODE_ANNOTATION, PodState, PodUsage, UsageCache
from hami_py.devices.base import FLAG_CHARGE, FLAG_CHOOSE, ChoiceAsk, ContainerDevice, DeviceSelector, DeviceVendor, PodDevices
from hami_py import reasons as R
from hami_py.scheduling.kernel.fit_query import FitQuery
from hami_py.kernel_codes import POLICY_SPREAD
from hami_py.scheduling.decision.policies import Policies, pod_policies
from hami_py.scheduling.decision.requests import PodRequest

log = structlog.get_logger(__name__)

VGPU_TIME_ANNOTATION = "hami.io/vgpu-time"
VGPU_NODE_LABEL = "hami.io/vgpu-node"     # the decision's node, also as a label (upstream's)
# How many of the fitting nodes a decision keeps scores for (the FilteringSucceed event lists
# them). Upstream lists all; at thousands of nodes that message cost more than the decision.
LISTED_NODE_SCORES = 20


def _concerns(node_annotations: dict[str, str], gate_keys: set[str]) -> bool:
    """Whether a node's kept annotations can change the gates of a pod of these families."""
    return any(k in gate_keys or k.startswith("hami.io/device-") for k in node_annotations)


def _choice_ask(request: PodRequest, key: str, annotations: dict[str, str], policies: Policies,
                charger) -> ChoiceAsk:
    """What one family's chooser is told of the pod: its rows of the pod in row order, which of
    them are init containers', the policies' names, and the charger built for the same filter."""
    mine = [c for c, k in zip(request.row_container, request.row_vendor) if k == key]
    return ChoiceAsk(annotations, tuple(request.per_container[c][key] for c in mine),
                     tuple(request.shape.is_init(c) for c in mine), policies.node_name, policies.gpu_name, charger)


class FilterDecision:
    """The outcome of one filter: the winner (or None), why the others failed, the annotations to
    write, the reservation made, and for the FilteringSucceed event the number of nodes that fit
    and the best of them with their scores (best first, so the winner leads).

    It holds nothing sized by the candidate list beyond ``failed``: decisions wait in the event
    queue, and one that kept the request's node names and score arrays held ~0.4 MB at N=5000."""

    __slots__ = ("node", "failed", "annotations", "reservation", "allocation", "fit_count", "best")

    def __init__(self, node: str | None, failed: dict[str, str], annotations: dict[str, str] | None = None,
                 reservation: PodUsage | None = None, allocation: dict[str, PodDevices] | None = None,
                 fit_count: int = 0, best: list[tuple[str, float]] | None = None):
        self.node = node
        self.failed = failed
        self.annotations = annotations or {}
        self.reservation = reservation
        self.allocation = allocation or {}
        self.fit_count = fit_count
        self.best = best or []

    def keep_for_bind(self, pod: dict) -> None:
        """What the bind of this decision needs, kept with its reservation: the annotations its
        Binding carries, what it reads of the pod, and the version of the pod it decided for."""
        if self.reservation is not None:
            self.reservation.annotations = self.annotations
            self.reservation.pod = bind_view(pod)
            self.reservation.filtered_rv = pod_rv(pod)


def bind_view(pod: dict) -> dict:
    """What a bind reads of the pod it was filtered as: identity (with the version its events
    name) and labels for its events and its node lock (PodGroup members wait longer), nothing
    sized by the pod spec."""
    meta = pod.get("metadata") or {}
    view = {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "labels") if k in meta}}
    group = (pod.get("spec") or {}).get("schedulingGroup")
    if group is not None:
        view["spec"] = {"schedulingGroup": group}
    return view


def pod_rv(pod: dict) -> int | None:
    """The pod object's resourceVersion as a number (None when it has none)."""
    rv = (pod.get("metadata") or {}).get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else None


class Evaluation:
    """One kernel run over a candidate list (``Filterer.evaluate``): the inputs and outputs
    (``query``), the failing nodes' reasons, and the policy's winner position (-1: none fits)."""

    __slots__ = ("policies", "query", "cand_idx", "chargers", "best", "failed", "now", "pooled")

    def __init__(self, policies: Policies, query: FitQuery, cand_idx: array, chargers: list, best: int,
                 failed: dict[str, str], now: float, pooled: dict[str, PodDevices] | None = None):
        self.policies = policies
        self.query = query
        self.cand_idx = cand_idx
        self.chargers = chargers
        self.best = best
        self.failed = failed
        self.now = now
        self.pooled = pooled or {}      # the pool step's devices, per pooled family (any node's)

    def listed(self, node_names: list[str]) -> tuple[int, list[tuple[str, float]]]:
        """How many nodes fit, and the best of them with their scores (best first), for the
        FilteringSucceed event."""
        count, positions = _kernel.best_fit_nodes(self.query.out_status, self.query.out_score, LISTED_NODE_SCORES,
                                                  self.policies.node == POLICY_SPREAD)
        return count, [(node_names[c], self.query.out_score[c]) for c in positions]


class Filterer:
    def __init__(self, cache: UsageCache, vendors: dict[str, DeviceVendor], *,
                 default_node_policy: str = "binpack", default_gpu_policy: str = "spread",
                 kernel=None, on_stuck=None):
        self.cache = cache
        self.vendors = vendors
        self.default_node_policy = default_node_policy
        self.default_gpu_policy = default_gpu_policy
        self.kernel = kernel or _kernel.filter_nodes
        self.on_stuck = on_stuck          # called with a StuckLock the filter passed over (its node's Event)
        # The kernel's per-vendor rules, indexed by vendor id; choosers are made per filter, for
        # the FLAG_CHOOSE families the pod asks for (a list of None when it asks for none).
        self.vendor_flags = array("i", [vendors[key].kernel_flags if key in vendors else 0
                                        for key in cache.vendor_ids])
        self._choosing = {key: i for key, i in cache.vendor_ids.items() if self.vendor_flags[i] & FLAG_CHOOSE}
        self._charging = {key: i for key, i in cache.vendor_ids.items() if self.vendor_flags[i] & FLAG_CHARGE}
        self._no_choosers = [None] * len(cache.vendor_ids)

    def policies(self, pod: dict, vendors=None) -> Policies:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        asked = self.vendors.values() if vendors is None else [self.vendors[k] for k in vendors]
        return pod_policies(annotations, default_node=self.default_node_policy,
                            default_gpu=self.default_gpu_policy,
                            numa_bind=any(v.numa_bind(annotations) for v in asked),
                            pod=f"{meta.get('namespace')}/{meta.get('name')}")

    def decide(self, pod: dict, node_names: list[str], request: PodRequest, *,
               reserve: bool = True) -> FilterDecision:
        """Choose a node and devices; with ``reserve`` record the reservation under the pod UID."""
        cache = self.cache
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        namespace = meta.get("namespace") or "default"
        annotations = meta.get("annotations") or {}
        policies = self.policies(pod, request.vendors)  # may raise PolicyError: checked before anything changes
        if reserve and uid:
            # A pod being filtered again never competes with its own earlier decision, which is
            # void now (kube-scheduler filters unbound pods only): released, so that events still
            # carrying it do not charge it again if this filter places the pod nowhere. A new
            # reservation below clears that mark.
            cache.release_pod(uid)
        fit = self.evaluate(pod, node_names, request, policies)
        failed = fit.failed
        if fit.best < 0:
            return FilterDecision(None, failed)
        fit_count, best_scored = fit.listed(node_names)
        names = node_names
        if (stuck := cache.stuck_lock(node_names[fit.best])) is not None:
            fit, names = self._avoid_stuck(pod, node_names, request, policies, fit, stuck)
        best, query, cand_idx, chargers, now = fit.best, fit.query, fit.cand_idx, fit.chargers, fit.now

        winner = names[best]
        allocation, mig = self._allocation(request, query, cand_idx[best], chargers)
        allocation.update(fit.pooled)
        pod_annotations = {VGPU_NODE_ANNOTATION: winner, VGPU_TIME_ANNOTATION: str(int(now))}
        for key, devices in allocation.items():
            pod_annotations.update(self.vendors[key].encode_allocation(
                devices, node=winner, partitions=mig.get(key, []), now=now, pod_annotations=annotations))
        reservation = None
        if reserve:
            # One set of books: the reservation is charged from exactly the annotations the pod
            # will carry once its Binding lands, by the same function that charges the bound pod
            # and a restart's recount (never from the kernel's outputs, which a family's codec
            # may write differently).
            carried = {**annotations, **pod_annotations}
            entries, instances = cache.charge_of(carried, request.shape)
            reservation = PodUsage(uid=uid, namespace=namespace, name=meta.get("name", ""),
                                   node=winner, entries=entries, state=PodState.RESERVED, mig=instances,
                                   marks=cache.marks_of(carried))
            cache.add_pod_usage(reservation)
        return FilterDecision(winner, failed, pod_annotations, reservation, allocation, fit_count, best_scored)

    def _avoid_stuck(self, pod: dict, node_names: list[str], request: PodRequest, policies: Policies,
                     fit: Evaluation, stuck: StuckLock) -> tuple[Evaluation, list[str]]:
        """The policy's favourite fits only where a node lock is stuck (cache/stuck_locks.py): a
        bind there would fail at once. The pod goes to the best of the fitting nodes without one
        (a second kernel run over just those), else stays with the favourite (its bind then says
        why)."""
        cache = self.cache
        fitting = [name for c, name in enumerate(node_names)
                   if fit.query.out_status[c] == R.NODE_FIT and cache.stuck_lock(name) is None]
        if not fitting:
            return fit, node_names
        log.info("passing over a node whose node lock is stuck", pod=f"{(pod.get('metadata') or {}).get('namespace')}/"
                 f"{(pod.get('metadata') or {}).get('name')}", stuck=stuck.describe())
        if self.on_stuck is not None:
            self.on_stuck(stuck)
        again = self.evaluate(pod, fitting, request, policies)
        return (again, fitting) if again.best >= 0 else (fit, node_names)

    def evaluate(self, pod: dict, node_names: list[str], request: PodRequest,
                 policies: Policies | None = None, *, only_devices: frozenset[str] | None = None) -> Evaluation:
        """One kernel call over ``node_names``, nothing chosen nor reserved: every candidate's
        outcome and score (``query.out_status``, ``query.out_score``), the failing ones' reasons
        as upstream words them, and the policy's winner (-1 when nothing fits). ``decide`` and
        the all-nodes mode (scheduling/verbs/prioritize.py) both start here."""
        cache = self.cache
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        annotations = meta.get("annotations") or {}
        if policies is None:
            policies = self.policies(pod, request.vendors)  # may raise PolicyError
        now = time.time()
        index_of = cache.node_index_of
        cand_idx = array("i", map(index_of.get, node_names, repeat(-1)))   # C-speed over N names
        expired = set()
        if cache.handshake_deadlines:
            expired = {n for n, deadline in cache.handshake_deadlines.items() if deadline <= now}
            if expired:
                for c, name in enumerate(node_names):
                    if name in expired:
                        cand_idx[c] = -1  # its device plugin stopped answering: as upstream, gone
        pooled, pool_failed = self._pool_step(request, node_names, annotations)
        if pool_failed:
            for c, name in enumerate(node_names):
                if name in pool_failed:
                    cand_idx[c] = -1

        mask = self._device_mask(annotations, node_names, cand_idx, request)
        if only_devices is not None:
            mask = self._only(mask, node_names, only_devices)
        quota_mem, quota_cores = cache.quota.headroom(namespace)
        n = len(node_names)
        nr = R.N_DEVICE_REASONS
        mig_ok = all(self.vendors[k].allows_partitions(annotations) for k in request.vendors)
        prof_rank = self._partition_ranks(annotations, request) if mig_ok and cache.prof_names else None
        chargers = self._hooks(self._charging, request, lambda v: v.charger(cache, pod, request.row_container))
        choosers = self._hooks(self._choosing, request, lambda v: v.chooser(cache, _choice_ask(
            request, v.vendor_key, annotations, policies, chargers[cache.vendor_ids[v.vendor_key]])))
        query = FitQuery(cand_idx, request.rows, request.total_nums, mask=mask, node_policy=policies.node,
                         gpu_policy=policies.gpu, numa_bind=policies.numa_bind, mutex=policies.mutex,
                         weights=policies.weights, quota_mem=quota_mem, quota_cores=quota_cores,
                         topology=policies.topology, mig_ok=mig_ok, vendor_flags=self.vendor_flags,
                         choosers=choosers, chargers=chargers, prof_rank=prof_rank)
        if request.row_vendor:
            best = self.kernel(cache, query)
        else:
            best = self._pool_only(query, node_names, pool_failed, expired)
        out_status, out_reasons, out_total = query.out_status, query.out_reasons, query.out_total

        failed: dict[str, str] = {}
        texts: dict[tuple[bytes, int], str] = {}
        # A pod of one family is refused in that family's upstream words (DeviceVendor.upstream_refusal).
        reword = self.vendors[next(iter(request.vendors))].upstream_refusal if len(request.vendors) == 1 else None
        for c in compress(range(n), out_status):   # the failing ones only (NODE_FIT is 0)
            status = out_status[c]
            name = node_names[c]
            if status == R.NODE_UNREGISTERED:
                failed[name] = R.NODE_UNREGISTERED_TEXT
            elif status == R.NODE_INSUFFICIENT_DEVICE:
                failed[name] = R.NODE_INSUFFICIENT_DEVICE_TEXT
            else:
                # Failing nodes mostly fail alike ("8/8 CardTimeSlicingExhausted" on a full
                # cluster): format each distinct count vector once.
                key = (out_reasons[c * nr:(c + 1) * nr].tobytes(), out_total[c])
                if (text := texts.get(key)) is None:
                    counts = {r: out_reasons[c * nr + r] for r in range(nr) if out_reasons[c * nr + r]}
                    total = out_total[c]
                    if reword is not None:
                        counts, total = reword(counts, total)
                    text = texts[key] = R.gen_reason(counts, total)
                failed[name] = text
        if cache.refused_nodes and failed:
            self._name_refusals(failed, request)
        if pool_failed:
            failed.update((name, why) for name, why in pool_failed.items() if name in failed)
        return Evaluation(policies, query, cand_idx, chargers, best, failed, now, pooled)

    def _pool_step(self, request: PodRequest, node_names: list[str],
                   annotations: dict[str, str]) -> tuple[dict[str, PodDevices], dict[str, str]]:
        """The pool step, once per filter before the kernel: the pooled families' devices
        (DeviceVendor.pool_choice: node-independent, so not a kernel stage), and the candidate
        nodes failing because of them, with why: every one when a pool cannot serve the pod,
        else those that may not host it (a node serving the pool)."""
        if not request.pooled:
            return {}, {}
        chosen: dict[str, PodDevices] = {}
        for key, asks in request.pooled.items():
            answer = self.vendors[key].pool_choice(self.cache, asks, len(request.containers), annotations)
            if isinstance(answer, str):
                return {}, dict.fromkeys(node_names, answer)
            chosen[key] = answer
        failed: dict[str, str] = {}
        for name in node_names:
            for key in request.pooled:
                if (why := self.vendors[key].pool_refusal(self.cache, name)) is not None:
                    failed[name] = why
                    break
        return chosen, failed

    def _pool_only(self, query: FitQuery, node_names: list[str], pool_failed: dict[str, str],
                   expired: set[str]) -> int:
        """The kernel's outcome for a pod asking pooled families alone (no row to fit): every
        node the books know fits with score 0 (devices of its own or not), unless the pool step
        or a stale handshake refused it; the first fitting node wins (-1: none)."""
        nodes, best = self.cache.nodes, -1
        for c, name in enumerate(node_names):
            if name in nodes and name not in pool_failed and name not in expired:
                query.out_status[c] = R.NODE_FIT
                if best < 0:
                    best = c
            else:
                query.out_status[c] = R.NODE_UNREGISTERED
        return best

    def _name_refusals(self, failed: dict[str, str], request: PodRequest) -> None:
        """A failing node whose registration of a family the pod asks for was refused
        (NodeEntry.refused: garbled, or a device id no decision can carry) fails for that
        reason, not for the devices missing because of it."""
        nodes = self.cache.nodes
        for name in self.cache.refused_nodes.intersection(failed):
            refused = nodes[name].refused
            asked = request.vendors
            why = [text for key, text in refused.items() if key in asked]
            if why:
                failed[name] = f"registration refused: {'; '.join(why)}"

    def allocation_of(self, request: PodRequest,
                      fit: Evaluation) -> tuple[dict[str, PodDevices], dict[str, list[dict]]]:
        """The winner's devices of an evaluation (``fit.best`` >= 0), as ``decide`` reads them."""
        return self._allocation(request, fit.query, fit.cand_idx[fit.best], fit.chargers)

    def _only(self, mask: array, node_names: list[str], allowed: frozenset[str]) -> array:
        """``mask`` with every device of these nodes outside ``allowed`` refused (CardUuidMismatch):
        a NUMA refit fits onto the devices kubelet's Topology Manager allows (scheduling/verbs/refit.py)."""
        if not len(mask):
            mask = array("b", bytes(len(self.cache.total_mem)))
        for name in node_names:
            entry = self.cache.nodes.get(name)
            if entry is None:
                continue
            for k, dev in enumerate(entry.devices):
                if dev.id not in allowed:
                    mask[entry.offset + k] = R.CARD_UUID_MISMATCH
        return mask

    def _partition_ranks(self, annotations: dict[str, str], request: PodRequest) -> array | None:
        """The pod's order of partition profiles (DeviceVendor.partition_ranks): the first of
        its families that states one; None, smallest first, when none does."""
        names = self.cache.prof_names
        for key in request.vendors:
            ranks = self.vendors[key].partition_ranks(annotations, names)
            if ranks is not None:
                return ranks
        return None

    def _hooks(self, flagged: dict[str, int], request: PodRequest, make) -> list:
        """The kernel's per-vendor hook list (by vendor id): ``make(vendor)`` for the families of
        the request that have the flag, None elsewhere (the shared all-None list when none do)."""
        asked = [k for k in request.vendors if k in flagged] if flagged else ()
        if not asked:
            return self._no_choosers
        hooks = list(self._no_choosers)
        for key in asked:
            hooks[flagged[key]] = make(self.vendors[key])
        return hooks

    def _allocation(self, request: PodRequest, query: FitQuery, node_index: int,
                    chargers) -> tuple[dict[str, PodDevices], dict[str, list[dict]]]:
        """Per vendor, one device list per container (init first), aligned by container position:
        a container that asks nothing of a vendor keeps an empty slot in that vendor's list.
        Each device carries the slots the kernel charged it, and for a family with a charger what
        its ``settle`` makes of it (custom data, the annotations' input; a charge of its own).
        Also the MIG instances, per vendor, as upstream's ``hami.io/vgpu-mig-allocations`` lists them."""
        out_row, out_dev, out_mem, out_cores, out_prof, out_place, out_slots = (
            query.out_row, query.out_dev, query.out_mem, query.out_cores, query.out_prof, query.out_place,
            query.out_slots)
        n_containers = len(request.containers)
        allocation: dict[str, PodDevices] = {
            key: [[] for _ in range(n_containers)] for key in dict.fromkeys(request.row_vendor)}
        mig: dict[str, list[dict]] = {}
        cache = self.cache
        ids = cache.device_ids
        for i in range(request.total_nums):
            r = out_row[i]
            key = request.row_vendor[r]
            container = request.row_container[r]
            devices = allocation[key][container]
            if out_prof[i] >= 0:
                start, size = cache.place_spans[out_place[i]]
                mig.setdefault(key, []).append({
                    "containerIndex": container, "deviceIndex": len(devices), "gpuUUID": ids[out_dev[i]],
                    "profile": cache.prof_names[out_prof[i]], "placement": {"start": start, "size": size}})
            device = ContainerDevice(ids[out_dev[i]], key, out_mem[i], out_cores[i], out_slots[i])
            if chargers[vid := cache.vendor_ids[key]] is not None:
                chargers[vid].settle(node_index, out_dev[i] - cache.node_offset[node_index], container, device)
            devices.append(device)
        return allocation, mig

    def _device_mask(self, pod_annotations: dict[str, str], node_names: list[str], cand_idx: array,
                     request: PodRequest) -> array:
        """Reason codes for devices this pod may not use; empty (free) when nothing restricts it.

        Only pods that pick or avoid devices, and nodes that cordon some, pay for this."""
        cache = self.cache
        vendors = [self.vendors[k] for k in request.vendors]
        # The pod's own gates are parsed once. Nodes whose annotations concern the pod's families
        # (a cordon list, a family's node switch) need gates of their own: built once per group
        # of nodes carrying the same annotations, since a family's plugin may write the same
        # switch on every node it runs on.
        pod_selectors = {cache.vendor_ids[v.vendor_key]: v.device_selector(pod_annotations, {}) for v in vendors}
        gate_keys = {k for v in vendors for k in v.gate_annotations}
        group_gates: dict[tuple, dict[int, DeviceSelector | None] | None] = {}   # None: restricts nothing
        for key, members in cache.annotation_groups.items():
            annotations = dict(key)
            if members and _concerns(annotations, gate_keys):
                gates = {cache.vendor_ids[v.vendor_key]: v.device_selector(pod_annotations, annotations)
                         for v in vendors}
                group_gates[key] = None if all(sel is None for sel in gates.values()) else gates
        pod_wide = any(sel is not None for sel in pod_selectors.values())
        # Model and mode gates are judged kind by kind over all devices at once; what is left
        # (cordons, UUID lists) device by device on the nodes concerned.
        mask = kind_mask = self._kind_mask(pod_selectors) if pod_wide else None
        nodes = cache.nodes
        if pod_wide and mask is None:
            marked = [n for c, n in enumerate(node_names) if cand_idx[c] >= 0]
        elif group_gates:
            # Nodes whose own gates differ from the pod-wide ones: every concerned node when a
            # pod-wide mask must be lifted or replaced there, else the restricting ones only.
            wanted = set().union(*(cache.annotation_groups[k] for k, g in group_gates.items()
                                   if g is not None or kind_mask is not None))
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
                    if kind_mask is not None and entry.length:
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

    def _kind_mask(self, pod_selectors: dict[int, DeviceSelector | None]) -> array | None:
        """The mask of every device from the pod's model and mode gates, judged once per device
        kind and spread over the devices by one bytes.translate; None when a gate needs each
        device (UUID lists) or there are more kinds than a byte holds."""
        cache = self.cache
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

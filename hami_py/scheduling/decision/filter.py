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
from itertools import compress

import structlog

from hami_py import _kernel
from hami_py.cache.stuck_locks import StuckLock
from hami_py.cache.usage import VGPU_NODE_ANNOTATION, PodState, PodUsage, UsageCache
from hami_py.devices.base import FLAG_CHARGE, FLAG_CHOOSE, ChoiceAsk, ContainerDevice, DeviceVendor, PodDevices
from hami_py import reasons as R
from hami_py.scheduling.decision.device_mask import device_mask, only_allowed
from hami_py.scheduling.kernel.fit_query import FitQuery
from hami_py.kernel_codes import POLICY_SPREAD
from hami_py.scheduling.decision.policies import POLICY_ANNOTATIONS, Policies, pod_policies
from hami_py.scheduling.decision.requests import PodRequest

log = structlog.get_logger(__name__)

VGPU_TIME_ANNOTATION = "hami.io/vgpu-time"
VGPU_NODE_LABEL = "hami.io/vgpu-node"     # the decision's node, also as a label (upstream's)
# How many of the fitting nodes a decision keeps scores for (the FilteringSucceed event lists
# them). Upstream lists all; at thousands of nodes that message cost more than the decision.
LISTED_NODE_SCORES = 20


def _unregister(cand_idx: array, node_names: list[str], gone) -> array:
    """A copy of ``cand_idx`` with the nodes named in ``gone`` as unknown ones (-1)."""
    changed = cand_idx[:]
    for c, name in enumerate(node_names):
        if name in gone:
            changed[c] = -1
    return changed


def _choice_ask(request: PodRequest, key: str, annotations: dict[str, str], policies: Policies,
                charger) -> ChoiceAsk:
    """What one family's chooser is told of the pod: its rows of the pod in row order, which of
    them are init containers', the policies' names, and the charger built for the same filter."""
    mine = [c for c, k in zip(request.row_container, request.row_vendor) if k == key]
    return ChoiceAsk(annotations, tuple(request.per_container[c][key] for c in mine),
                     tuple(request.shape.is_init(c) for c in mine), policies.node_name, policies.gpu_name, charger)


class FilterDecision:
    """The outcome of one filter: the winner (or None), why the others failed, the annotations to
    write, the reservation made, and for the FilteringSucceed event the number of nodes that fit,
    the number of candidates, and the best of them with their scores (best first, so the winner
    leads). A placed pod's ``failed`` is empty unless its caller asked for the reasons: best mode
    answers with the winner alone.

    ``fit_count`` and ``best`` of a placed pod are read from its kernel run when first asked for
    (the event, written after the answer), and the run is let go then. Nothing else it holds is
    sized by the candidate list beyond ``failed``: decisions wait in the event queue, and one that
    kept the request's node names and score arrays held ~0.4 MB at N=5000."""

    __slots__ = ("node", "failed", "annotations", "reservation", "allocation", "_fit_count", "_best", "total",
                 "_listing")

    def __init__(self, node: str | None, failed: dict[str, str], annotations: dict[str, str] | None = None,
                 reservation: PodUsage | None = None, allocation: dict[str, PodDevices] | None = None,
                 fit_count: int = 0, best: list[tuple[str, float]] | None = None, total: int | None = None,
                 listing: Evaluation | None = None):
        self.node = node
        self.failed = failed
        self.annotations = annotations or {}
        self.reservation = reservation
        self.allocation = allocation or {}
        self._fit_count = fit_count
        self._best = best or []
        self.total = len(failed) + fit_count if total is None else total   # candidates judged
        self._listing = listing     # the kernel run fit_count and best are still to be read from

    @property
    def fit_count(self) -> int:
        self.read_listing()
        return self._fit_count

    @property
    def best(self) -> list[tuple[str, float]]:
        self.read_listing()
        return self._best

    def read_listing(self) -> None:
        """Read ``fit_count`` and ``best`` from the kernel run, and let the run go."""
        if self._listing is not None:
            self._fit_count, self._best = self._listing.listed()
            self._listing = None

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
    (``query``), the policy's winner position (-1: none fits), and the failing nodes' reasons,
    built from the outputs when first read (``failed``): a pod placed in best mode is answered
    with its node alone, so the reasons of thousands of nodes it did not take are never needed."""

    __slots__ = ("policies", "query", "cand_idx", "chargers", "best", "now", "pooled", "node_names",
                 "_reasons", "_failed")

    def __init__(self, policies: Policies, query: FitQuery, cand_idx: array, chargers: list, best: int,
                 now: float, pooled: dict[str, PodDevices] | None = None, *, node_names: list[str],
                 reasons=None):
        self.policies = policies
        self.query = query
        self.cand_idx = cand_idx
        self.chargers = chargers
        self.best = best
        self.now = now
        self.pooled = pooled or {}      # the pool step's devices, per pooled family (any node's)
        self.node_names = node_names
        self._reasons = reasons         # (evaluation) -> the failing nodes' reasons
        self._failed: dict[str, str] | None = None

    @property
    def failed(self) -> dict[str, str]:
        """Why each failing candidate fails, as upstream words it (built once, on first read)."""
        if self._failed is None:
            self._failed = self._reasons(self) if self._reasons is not None else {}
            self._reasons = None
        return self._failed

    def listed(self) -> tuple[int, list[tuple[str, float]]]:
        """How many nodes fit, and the best of them with their scores (best first), for the
        FilteringSucceed event."""
        count, positions = _kernel.best_fit_nodes(self.query.out_status, self.query.out_score, LISTED_NODE_SCORES,
                                                  self.policies.node == POLICY_SPREAD)
        return count, [(self.node_names[c], self.query.out_score[c]) for c in positions]


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
        self._default_policies: dict[tuple, Policies] = {}   # for pods stating none of their own

    def policies(self, pod: dict, vendors=None) -> Policies:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        asked = self.vendors.values() if vendors is None else [self.vendors[k] for k in vendors]
        numa_bind = any(v.numa_bind(annotations) for v in asked)
        if not annotations.keys() & POLICY_ANNOTATIONS:
            # Most pods state no policy of their own: the configured ones, worked out once.
            key = (self.default_node_policy, self.default_gpu_policy, numa_bind)
            defaults = self._default_policies.get(key)
            if defaults is None:
                defaults = self._default_policies[key] = pod_policies(
                    {}, default_node=self.default_node_policy, default_gpu=self.default_gpu_policy,
                    numa_bind=numa_bind)
            return defaults
        return pod_policies(annotations, default_node=self.default_node_policy,
                            default_gpu=self.default_gpu_policy, numa_bind=numa_bind,
                            pod=f"{meta.get('namespace')}/{meta.get('name')}")

    def decide(self, pod: dict, node_names: list[str], request: PodRequest, *,
               reserve: bool = True, report_failed: bool = False, defer_listing: bool = False) -> FilterDecision:
        """Choose a node and devices; with ``reserve`` record the reservation under the pod UID.
        A pod that fits nowhere gets every candidate's reason; a placed one only with
        ``report_failed`` (the Nodes path answers them beside its node). With ``defer_listing``
        the FilteringSucceed figures are read when first asked for (after the answer), and the
        decision holds the kernel run until then: for callers that drop it soon after."""
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
        if fit.best < 0:
            return FilterDecision(None, fit.failed)
        listing = fit
        failed = fit.failed if report_failed else {}
        if (stuck := cache.stuck_lock(node_names[fit.best])) is not None:
            fit = self._avoid_stuck(pod, node_names, request, policies, fit, stuck)
        best, query, cand_idx, chargers, now = fit.best, fit.query, fit.cand_idx, fit.chargers, fit.now

        winner = fit.node_names[best]
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
        decision = FilterDecision(winner, failed, pod_annotations, reservation, allocation, total=len(node_names),
                                  listing=listing)
        if not defer_listing:
            decision.read_listing()
        return decision

    def _avoid_stuck(self, pod: dict, node_names: list[str], request: PodRequest, policies: Policies,
                     fit: Evaluation, stuck: StuckLock) -> Evaluation:
        """The policy's favourite fits only where a node lock is stuck (cache/stuck_locks.py): a
        bind there would fail at once. The pod goes to the best of the fitting nodes without one
        (a second kernel run over just those), else stays with the favourite (its bind then says
        why)."""
        cache = self.cache
        fitting = [name for c, name in enumerate(node_names)
                   if fit.query.out_status[c] == R.NODE_FIT and cache.stuck_lock(name) is None]
        if not fitting:
            return fit
        log.info("passing over a node whose node lock is stuck", pod=f"{(pod.get('metadata') or {}).get('namespace')}/"
                 f"{(pod.get('metadata') or {}).get('name')}", stuck=stuck.describe())
        if self.on_stuck is not None:
            self.on_stuck(stuck)
        again = self.evaluate(pod, fitting, request, policies)
        return again if again.best >= 0 else fit

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
        cand_idx = cache.candidates.indices(node_names)   # shared: copied before any change
        expired = set()
        if cache.handshake_deadlines:
            expired = {n for n, deadline in cache.handshake_deadlines.items() if deadline <= now}
            if expired:
                cand_idx = _unregister(cand_idx, node_names, expired)   # its device plugin stopped answering: as upstream, gone
        pooled, pool_failed = self._pool_step(request, node_names, annotations)
        if pool_failed:
            cand_idx = _unregister(cand_idx, node_names, pool_failed)

        mask = device_mask(cache, self.vendors, annotations, node_names, cand_idx, request)
        if only_devices is not None:
            mask = only_allowed(cache, mask, node_names, only_devices)
        quota_mem, quota_cores = cache.quota.headroom(namespace)
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
        return Evaluation(policies, query, cand_idx, chargers, best, now, pooled, node_names=node_names,
                          reasons=lambda fit: self._failure_reasons(fit, request, pool_failed))

    def _failure_reasons(self, fit: Evaluation, request: PodRequest, pool_failed: dict[str, str]) -> dict[str, str]:
        """Each failing candidate's reason, as upstream words it, from the kernel's outputs."""
        query, node_names = fit.query, fit.node_names
        out_status, out_reasons, out_total = query.out_status, query.out_reasons, query.out_total
        nr = R.N_DEVICE_REASONS
        failed: dict[str, str] = {}
        texts: dict[tuple[bytes, int], str] = {}
        # A pod of one family is refused in that family's upstream words (DeviceVendor.upstream_refusal).
        reword = self.vendors[next(iter(request.vendors))].upstream_refusal if len(request.vendors) == 1 else None
        for c in compress(range(len(node_names)), out_status):   # the failing ones only (NODE_FIT is 0)
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
        if self.cache.refused_nodes and failed:
            self._name_refusals(failed, request)
        if pool_failed:
            failed.update((name, why) for name, why in pool_failed.items() if name in failed)
        return failed

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
        node the books know fits, unless the pool step or a stale handshake refused it, and the
        policy's favourite wins (-1: none fits).

        The pod uses no device of its node, so its score (the kernel's sense: the highest wins
        under binpack, the lowest under spread) puts the nodes with no device of their own first,
        keeping the device nodes for pods that need them, then follows the node policy over the
        pods the books hold on each node: binpack packs onto the fullest, spread onto the
        emptiest. A tie goes to the earlier candidate, as in the kernel. The device nodes' offset
        is one more than any fitting node's pod count, so /prioritize (all mode) still sees the
        counts within each group."""
        nodes, node_pods = self.cache.nodes, self.cache.node_pods
        status, score = query.out_status, query.out_score
        fitting: list[tuple[int, int, bool]] = []     # (candidate, pods on it, devices of its own)
        for c, name in enumerate(node_names):
            entry = nodes.get(name)
            if entry is not None and name not in pool_failed and name not in expired:
                status[c] = R.NODE_FIT
                fitting.append((c, len(node_pods.get(name, ())), entry.length > 0))
            else:
                status[c] = R.NODE_UNREGISTERED
        if not fitting:
            return -1
        spread = query.node_policy == POLICY_SPREAD
        offset = max(pods for _, pods, _ in fitting) + 1
        best, best_score = -1, 0.0
        for c, pods, own in fitting:
            # binpack: device-less nodes lifted above the rest; spread: device nodes pushed below.
            value = score[c] = float(pods + (offset if own == spread else 0))
            if best < 0 or (value < best_score if spread else value > best_score):
                best, best_score = c, value
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
        for i in range(query.out_count[0]):     # a charger may have sized a row smaller on this node
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

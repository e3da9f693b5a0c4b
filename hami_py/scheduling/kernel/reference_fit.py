"""The reference kernel's per-device stages: how one request row's devices are ordered, tried and picked.

``kernel_ref.filter_nodes`` fits a pod node by node and row by row; for each row it orders the
node's candidate devices (``order_devices``), walks them through upstream's gates
(``walk``, ``device_reason``, ``mig_plan``) and, where every fitting device is collected, lets
the vendor's chooser or the topology-aware pick keep ``nums`` of them. The names are those of
``cython_core/fit_kernel.pyx``'s helpers (``prefer``, ``mig_plan``, ``topology_pick``, ``choose``,
``charge``); the kernel inlines the walk and the gates in its own loop, which this module spells
out as functions. A module of its own only to keep kernel_ref.py short enough to read at once.
"""
from __future__ import annotations

from itertools import combinations, islice

from hami_py import reasons as R
from hami_py.cache.quota import UNLIMITED
from hami_py.kernel_codes import (
    CHAIN_BASE, FLAG_CHOOSE, FLAG_EQUAL_SHARE, FLAG_EXCLUSIVE, FLAG_SLOTS_FIRST, KEY_BINPACK, KEY_FRAG, KEY_SPREAD,
    MAX_MIG_INSTANCES, MAX_TOPOLOGY_COMBOS, MEMPCT_UNSET, MIG_SEARCH_BUDGET, ORDER_CHAIN, ORDER_MUTEX, POLICY_BINPACK,
)
# The fragmentation-aware policy's device cost (read by the KEY_FRAG sort key).
from hami_py.scheduling.kernel.frag import frag_device_cost, has_key

# Mask reason codes that upstream checks before the NUMA regrouping step, and the one after it.
_PRE_NUMA_MASK = (R.CARD_CORDONED, R.CARD_TYPE_MISMATCH)
# A profile the pod's preference does not name sorts after every named one.
_UNRANKED = 1 << 30


class Usage:
    """One node's usage per device (position k: the node's k-th device) as the pod's rows so far
    leave it: slots ``used``, memory ``mem``, ``cores`` and the MIG slices taken (``mig``)."""

    __slots__ = ("used", "mem", "cores", "mig")

    def __init__(self, used, mem, cores, mig):
        self.used, self.mem, self.cores, self.mig = used, mem, cores, mig

    def copy(self):
        return Usage(list(self.used), list(self.mem), list(self.cores), list(self.mig))


class PodCharge:
    """The pod's own usage so far on one node, per device: peak over init containers, sum over
    app containers (the quota check charges the pod as the cache will: max of the two)."""

    __slots__ = ("init_mem", "init_cores", "app_mem", "app_cores")

    def __init__(self, n):
        self.init_mem, self.init_cores, self.app_mem, self.app_cores = [0] * n, [0] * n, [0] * n, [0] * n


class Row:
    """One request row as the walk reads it: ``nums`` devices, each of ``memreq``/``mempct``
    memory, ``cores`` and ``slots`` (after the vendor's charger, FLAG_CHARGE, has said what one
    device of the row costs on this node), among ``cands`` (positions of the node's devices of
    the row's vendor), with the vendor's rules (``flags``) and quota headroom (``qm``, ``qc``)."""

    __slots__ = ("nums", "memreq", "mempct", "cores", "free_cores", "slots", "first_slots", "cands", "exclusive",
                 "equal_share", "collect_all", "qm", "qc")

    def __init__(self, nums, memreq, mempct, cores, slots, cands, flags, topology, qm, qc):
        self.nums, self.memreq, self.mempct, self.slots, self.cands, self.qm, self.qc = (
            nums, memreq, mempct, slots, cands, qm, qc)
        # A negative core request takes no cores and skips every core check.
        self.free_cores = cores < 0
        self.cores = 0 if self.free_cores else cores
        self.exclusive = flags & FLAG_EXCLUSIVE
        self.equal_share = flags & FLAG_EQUAL_SHARE
        # The slots the first gate asks free: one (is a slot left at all), or all of them for a
        # family that checks a partition's slices before its memory (FLAG_SLOTS_FIRST).
        self.first_slots = slots if flags & FLAG_SLOTS_FIRST else 1
        self.collect_all = topology or flags & FLAG_CHOOSE   # every fitting device, not the first nums


def device_score(total_mem, total_cores, count, used, used_mem, used_cores, mem, cores,
                 w_slot, w_core, w_mem):
    """Upstream's per-device score with the request placed: 10 × weighted utilisation."""
    if count == 0 or total_cores == 0 or total_mem == 0:
        return 0.0
    slot = (1 + used) / count
    core = (cores + used_cores) / total_cores
    memf = (mem + used_mem) / total_mem
    return 10.0 * (w_slot * slot + w_core * core + w_mem * memf)


def resolve_mem(memreq, mempct, total_mem):
    if memreq > 0:
        return memreq
    if mempct != MEMPCT_UNSET:
        return total_mem * mempct // 100
    return 0


# -- order ------------------------------------------------------------------------------------

def order_devices(table, q, off, row, usage):
    """The row's candidate devices (node positions) in the order they are tried: each scored
    with the request placed, then sorted by the device ordering's key (the kernel's ``prefer``)."""
    total_mem, total_cores, count, numa = table.total_mem, table.total_cores, table.count, table.numa
    frag_key = has_key(q.gpu_policy, KEY_FRAG)
    keyed = []
    for k in row.cands:
        j = off + k
        mem = resolve_mem(row.memreq, row.mempct, total_mem[j])
        sc = device_score(total_mem[j], total_cores[j], count[j], usage.used[k],
                          usage.mem[k], usage.cores[k], mem, row.cores, q.w_slot, q.w_core, q.w_mem)
        fc = (frag_device_cost(total_mem[j], total_cores[j], count[j], usage.used[k], usage.mem[k],
                               usage.cores[k], mem, row.cores, row.slots) if frag_key else 0.0)
        keyed.append((_preference_key(sc, numa[j], k, usage.used[k], q.gpu_policy, q.numa_bind, fc), k))
    keyed.sort()
    return [k for _, k in keyed]


def _preference_key(score, numa, pos, used, gpu_policy, numa_bind, frag=0.0):
    """Sort key: smallest key is tried first (upstream walks its sorted list from the end).
    ``frag`` is the device's frag_device_cost (only read by the KEY_FRAG key)."""
    if gpu_policy >= ORDER_CHAIN:
        key = []
        code = gpu_policy - ORDER_CHAIN
        while code:
            k = code % CHAIN_BASE
            code //= CHAIN_BASE
            key.append(-score if k == KEY_BINPACK else score if k == KEY_SPREAD else frag if k == KEY_FRAG
                       else -numa)
        return (*key, -pos)
    if gpu_policy == ORDER_MUTEX:
        return (used, -numa, -pos)
    if numa_bind:
        if gpu_policy == POLICY_BINPACK:
            return (numa, -score, -pos)
        return (-numa, score, -pos)
    if gpu_policy == POLICY_BINPACK:
        return (-score, -numa, -pos)
    return (score, -numa, -pos)


# -- walk -------------------------------------------------------------------------------------

def walk(table, q, off, row, usage, pod, order):
    """Try the devices in ``order``: ``(counts per reason, picks, devices still needed)``.

    A pick is ``(position, memory, MIG profile, placement)``. The walk stops at ``nums`` picks,
    or collects every fitting device when the row's family chooses (or the policy is
    topology-aware). Under NUMA binding a device on another NUMA node than the previous one
    starts the picking over there (``numa_group_done``). On a MIG GPU the row's instances are planned together when
    the walk reaches it (``mig_plan``: as many of the instances still needed as the GPU can hold
    at once, all ``nums`` when collecting); the GPU is then offered again for each instance of
    the plan, so one container may get several instances of it, each through the gates."""
    health, numa, mask, dev_mig = table.health, table.numa, q.mask, table.dev_mig
    has_mask = len(mask) > 0
    counts = [0] * R.N_DEVICE_REASONS
    picked = []   # (k, mem, profile, placement)
    plan, plan_k, plan_pos = [], -1, 0   # the MIG GPU being given its instances, and its plan
    need = row.nums
    prev_numa = -1
    i = -1
    revisit = False
    while True:
        if not revisit:
            i += 1
        revisit = False
        if i >= len(order):
            break
        k = order[i]
        j = off + k
        if not health[j]:
            counts[R.CARD_NOT_HEALTH] += 1
            continue
        m = mask[j] if has_mask else 0
        if m in _PRE_NUMA_MASK:
            counts[m] += 1
            continue
        if q.numa_bind and numa[j] != prev_numa:
            if numa_group_done(row, len(picked)):
                break
            counts[R.NUMA_NOT_FIT] += len(picked)
            picked = []
            plan_k = -1
            need = row.nums
            prev_numa = numa[j]
        if m != 0:
            counts[m] += 1
            continue
        mem = resolve_mem(row.memreq, row.mempct, table.total_mem[j])
        reason = device_reason(table, q, j, k, mem, row, usage, pod, picked)
        if reason != R.OK:
            counts[reason] += 1
            continue
        prof = place = -1
        if dev_mig[j]:
            if plan_k != k:   # first arrival: plan the instances still needed here together
                plan = mig_plan(table, j, usage.mig[k], mem, row.nums if row.collect_all else need, q.prof_rank)
                plan_k, plan_pos = k, 0
            if plan_pos == len(plan):
                counts[R.CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                continue
            prof, place = plan[plan_pos]
            plan_pos += 1
            revisit = True  # the plan's next instance, if any, goes to this container too
        picked.append((k, mem, prof, place))
        if not row.collect_all:
            need -= 1
            if need == 0:
                break
    return counts, picked, need


def numa_group_done(row, npicked):
    """Whether the walk, reaching another NUMA node with ``npicked`` devices picked on the one
    before, stops there and keeps them. Upstream's rule (hami-scheduling.md §10, step 4) counts
    the picks NumaNotFit and starts over on the new NUMA node: a walk that stops at ``nums``
    picks only ever leaves a NUMA node short of them. A walk that collects every fitting device
    (a chooser, topology-aware) would, by that rule, keep only the last NUMA node it walks and
    refuse a node whose earlier NUMA node holds the whole row (upstream's topology-aware walk
    does). Here it keeps the first NUMA node, in the walk's order (the policy's preferred one),
    that holds the row: all ``nums`` devices on one NUMA node, the binding's promise, and the
    node the non-collecting walk would have stopped in."""
    return row.collect_all and npicked >= row.nums


def device_reason(table, q, j, k, mem, row, usage, pod, picked):
    """Why device ``j`` (the node's ``k``-th) cannot take ``mem`` of the row beside ``picked``,
    upstream's checks in upstream's order; R.OK when it can."""
    count, total_mem, total_cores = table.count[j], table.total_mem[j], table.total_cores[j]
    used, used_mem, used_cores = usage.used[k], usage.mem[k], usage.cores[k]
    cores = row.cores
    # Upstream's first test is Count <= Used: is a slot left at all. A partition of several
    # slices (slots > 1) is checked for all of them after memory and cores, so that a
    # card too full for it is refused for its memory, as upstream v2.10 words it; a
    # FLAG_SLOTS_FIRST family (a partition family, HAMi #2877) asks all of them here instead.
    if count - used < row.first_slots:
        # A busy device of an exclusive family is refused for being busy, even when its
        # slots are gone too (a whole card has one): upstream's reason. Tested inside
        # the slot check so that rows of other families pay nothing for it (the
        # Cython kernel measured 2-4 % slower with the flag tested first).
        if row.exclusive and used > 0:
            return R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        return R.CARD_TIME_SLICING_EXHAUSTED
    if row.exclusive and used > 0:
        return R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if q.mutex and used > 0:
        return R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    qm, qc = row.qm, row.qc
    if qm != UNLIMITED or qc != UNLIMITED:
        tm, tc = _pod_total(row.cands, picked, k, mem, cores, pod)
        if (qm != UNLIMITED and tm > qm) or (qc != UNLIMITED and tc > qc):
            return R.RESOURCE_QUOTA_NOT_FIT
    if total_mem - used_mem < mem:
        return R.CARD_INSUFFICIENT_MEMORY
    if not row.free_cores and total_cores - used_cores < cores:
        return R.CARD_INSUFFICIENT_CORE
    if row.slots > 1 and count - used < row.slots:
        return R.CARD_TIME_SLICING_EXHAUSTED
    if row.equal_share and used > 0 and used_mem != used * mem:
        # Its tasks hold another size than this one asks.
        return R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE
    if total_cores == 100 and cores == 100 and used > 0:
        return R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if not row.free_cores and total_cores != 0 and used_cores == total_cores and cores == 0:
        return R.CARD_COMPUTE_UNITS_EXHAUSTED
    return R.OK


def _pod_total(cands, picked, k_extra, mem_extra, cores_extra, pod):
    """The pod's charge against vendor ``v``'s quota if it also took ``mem_extra`` on ``k_extra``:
    per device max(init peak, app sum), summed, with this row's picks counted in (an init row's
    on top of the sidecars' app sum so far)."""
    tm = tc = 0
    for k in cands:
        add_m = add_c = 0
        for pk, pm, _, _ in picked:
            if pk == k:
                add_m += pm
                add_c += cores_extra
        if k == k_extra:
            add_m += mem_extra
            add_c += cores_extra
        # An init row's picks sit beside the app sums so far (its sidecars), like an app row's.
        tm += max(pod.init_mem[k], pod.app_mem[k] + add_m)
        tc += max(pod.init_cores[k], pod.app_cores[k] + add_c)
    return tm, tc


def mig_plan(table, j, occupied, mem, want, prof_rank):
    """Up to ``want`` MIG instances of ``mem`` MiB each on device ``j`` beside ``occupied``, placed
    together: a list of (profile, placement) indexes, as many as one arrangement holds.

    The candidates are the free placements of every profile with enough memory: the pod's
    preferred profiles first (``prof_rank``, 1 = most preferred, per profile of the table; empty
    when the pod states none), then the rest smallest first (the table's order), each profile's
    placements in their try order. A depth-first search takes candidates in that order (each
    arrangement once: a later instance takes a later candidate), so its first path is the greedy
    one, instance by instance the first candidate still free; it backtracks only when that path
    holds fewer than ``want``, skips a branch that cannot beat the best arrangement found (free
    slices the remaining candidates cover, over their smallest size), and stops at the first
    arrangement of ``want`` instances or after MIG_SEARCH_BUDGET placements tried, keeping the
    best found so far: never fewer instances than the greedy path."""
    cands = []
    for p in _profile_order(table, j, prof_rank):
        if table.prof_mem[p] < mem:
            continue
        off = table.prof_place_off[p]
        for q in range(off, off + table.prof_place_len[p]):
            if not table.place_mask[q] & occupied:
                cands.append((p, q, table.place_mask[q]))
    want = min(want, MAX_MIG_INSTANCES)
    best = []
    chosen = []
    budget = [MIG_SEARCH_BUDGET]

    def search(start, occ):
        """True to stop: ``want`` reached or the budget spent."""
        nonlocal best
        if len(chosen) > len(best):
            best = list(chosen)
        if len(chosen) >= want:
            return True
        for i in range(start, len(cands)):
            if cands[i][2] & occ:
                continue
            if len(chosen) + _mig_bound(cands, i, occ) <= len(best):
                return False
            if budget[0] <= 0:
                return True
            budget[0] -= 1
            chosen.append(cands[i][:2])
            if search(i + 1, occ | cands[i][2]):
                return True
            chosen.pop()
        return False

    search(0, occupied)
    return best


def _profile_order(table, j, prof_rank):
    """Device ``j``'s profiles in try order: ranked (preferred) ones by rank, then the others,
    each group in the table's order (memory, then slices)."""
    first, last = table.mig_prof_off[j], table.mig_prof_off[j] + table.mig_prof_len[j]
    if not len(prof_rank):
        return range(first, last)
    rank = [prof_rank[p] if p < len(prof_rank) and prof_rank[p] > 0 else _UNRANKED for p in range(first, last)]
    return [first + i for _, i in sorted((r, i) for i, r in enumerate(rank))]


def _mig_bound(cands, i, occ):
    """How many more instances candidates ``i..`` could add beside ``occ``, at most: the free
    slices they cover over the smallest of them."""
    union, smallest = 0, MAX_MIG_INSTANCES + 1
    for _, _, m in cands[i:]:
        if not m & occ:
            union |= m
            smallest = min(smallest, m.bit_count())
    return union.bit_count() // smallest if union else 0


# -- among all that fit -----------------------------------------------------------------------

def topology_pick(picked, nums, pair_score, poff, n):
    """Upstream's topology-aware choice among all fitting devices: for one device, the one worst
    connected to the others (keeping good groups free); for several, the combination (in walk
    order) with the highest sum of pair scores. Ties go to the first found. Only the first
    MAX_TOPOLOGY_COMBOS combinations are weighed: a MIG node offers an instance per free slice,
    and C(56, 6) combinations would hold the event loop for seconds."""
    def score(a, b):
        return pair_score[poff + a * n + b] if poff >= 0 else 0

    if nums == 1:
        best, best_total = None, 0
        for entry in picked:
            total = sum(score(entry[0], other[0]) for other in picked if other[0] != entry[0])
            if best is None or total < best_total:
                best, best_total = entry, total
        return [best]
    best, best_total = None, 0
    for combo in islice(combinations(picked, nums), MAX_TOPOLOGY_COMBOS):
        total = sum(score(combo[i][0], combo[j][0]) for i in range(nums) for j in range(i + 1, nums))
        if best is None or total > best_total:
            best, best_total = list(combo), total
    return best


def choose(choosers, v, ni, picked, nums):
    """Ask vendor ``v``'s chooser for ``nums`` of the devices that fit one row on node ``ni``.

    Returns ``(picks, score delta)`` with the picks (entries of ``picked``) in the chooser's
    order, or the reason code it refused the node with. An answer outside the contract
    (``devices.base.Chooser``) is the family's bug, not the pod's: it raises ValueError."""
    chooser = choosers[v] if v < len(choosers) else None
    if chooser is None:
        raise ValueError(f"vendor id {v} has FLAG_CHOOSE but the query carries no chooser for it")
    positions = [entry[0] for entry in picked]
    answer = chooser(ni, positions, nums)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 < answer < R.N_DEVICE_REASONS:
            raise ValueError(f"chooser of vendor id {v} answered reason {answer}, not a device reason code")
        return answer
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ValueError(f"chooser of vendor id {v} answered {answer!r}, not (positions, score delta) or a reason")
    chosen, delta = answer
    by_position = {entry[0]: entry for entry in picked}
    chosen = list(chosen)
    if (len(chosen) != nums or len(set(chosen)) != nums
            or not all(type(p) is int and p in by_position for p in chosen)):
        raise ValueError(f"chooser of vendor id {v} chose {chosen!r}: not {nums} distinct positions of {positions}")
    return [by_position[p] for p in chosen], float(delta)


def charge(chargers, v, ni, r, nums):
    """Vendor ``v``'s charge of one device of row ``r`` (of ``nums`` devices) on node ``ni``:
    ``(memory MiB, cores, slots, devices)``, the devices ``nums`` unless the charger answered a
    4-tuple with ``1 <= devices <= nums`` (the row's count on that node), or the reason code it
    refused the node with. An answer outside the contract (``devices.base.Charger``) is the
    family's bug: it raises ValueError."""
    charger = chargers[v] if v < len(chargers) else None
    if charger is None:
        raise ValueError(f"vendor id {v} has FLAG_CHARGE but the query carries no charger for it")
    answer = charger(ni, r)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 < answer < R.N_DEVICE_REASONS:
            raise ValueError(f"charger of vendor id {v} answered reason {answer}, not a device reason code")
        return answer
    if (not isinstance(answer, tuple) or not 3 <= len(answer) <= 4 or not all(type(x) is int for x in answer)
            or not (0 <= answer[0] <= 2147483647 and 0 <= answer[1] <= 100 and 1 <= answer[2] <= 2147483647)
            or (len(answer) == 4 and not 1 <= answer[3] <= nums)):
        raise ValueError(f"charger of vendor id {v} answered {answer!r}, not (memory, cores, slots), "
                         f"(memory, cores, slots, devices <= {nums}) or a reason")
    return answer if len(answer) == 4 else (*answer, nums)

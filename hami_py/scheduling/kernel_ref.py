"""The fit-and-score rules in plain Python: the readable specification of the Cython kernel.

``cython_core/fit_kernel.pyx`` implements exactly this function over the same typed arrays, and
``tests/test_kernel.py`` has hypothesis compare the two on random clusters and requests. Change a
rule here first, then mirror it there.

Inputs are the usage cache's struct-of-arrays (one entry per registered device; a node owns the
contiguous slice ``[node_offset[n], node_offset[n] + node_len[n])``), read as attributes of a
table object, plus one filter's query (``hami_py.scheduling.fit_query.FitQuery``) holding the
policies and the pod's requests as flat rows of ``ROW_WIDTH`` int32 values:

    container, is_init, vendor, nums, memreq, mempct, coresreq

Rows are ordered by container, init containers first. The rules are upstream HAMi's generic
device fit (hami-scheduling.md §7, §8, §9, §10) with two deliberate fixes: candidates are matched
by vendor id, not by substring of the model name, and the per-device score includes the request
being placed (upstream's exact-type comparison makes that term vanish for its main family).
"""
from __future__ import annotations

from itertools import combinations, islice

from hami_py._kernel import CODES
from hami_py.cache.quota import UNLIMITED
# The fragmentation-aware policy's rules: its device cost and node score.
from hami_py.scheduling.kernel_frag import frag_device_cost, frag_node_score, has_key
from hami_py import reasons as R

# The numbers are the Cython kernel's (cython_core/kernel_codes.pxd), so the two cannot disagree.
ROW_WIDTH = CODES["ROW_WIDTH"]
ROW_CONTAINER, ROW_IS_INIT, ROW_VENDOR, ROW_NUMS, ROW_MEMREQ, ROW_MEMPCT, ROW_CORESREQ = (
    CODES[f"ROW_{name}"] for name in ("CONTAINER", "IS_INIT", "VENDOR", "NUMS", "MEMREQ", "MEMPCT", "CORESREQ"))

POLICY_BINPACK = CODES["POLICY_BINPACK"]
POLICY_SPREAD = CODES["POLICY_SPREAD"]
POLICY_FRAG = CODES["POLICY_FRAG"]      # fragmentation-aware: frag_node_score decides

# Device orderings (the query's ``gpu_policy``). Single policies are small numbers; a chain of up
# to three sort keys (``"numa,binpack"``) is CHAIN + k0 + B*k1 + B*B*k2 (B = CHAIN_BASE) with the
# keys below, 0 = end.
ORDER_BINPACK = CODES["ORDER_BINPACK"]
ORDER_SPREAD = CODES["ORDER_SPREAD"]
ORDER_MUTEX = CODES["ORDER_MUTEX"]
ORDER_CHAIN = CODES["ORDER_CHAIN"]
KEY_BINPACK, KEY_SPREAD, KEY_NUMA = CODES["KEY_BINPACK"], CODES["KEY_SPREAD"], CODES["KEY_NUMA"]
KEY_FRAG = CODES["KEY_FRAG"]            # fragmentation-aware: frag_device_cost, smallest first
CHAIN_BASE = CODES["CHAIN_BASE"]

MEMPCT_UNSET = CODES["MEMPCT_UNSET"]
MAX_TOPOLOGY_COMBOS = CODES["MAX_TOPOLOGY_COMBOS"]   # device combinations weighed for one topology-aware pick

# Per-vendor rules (query.vendor_flags, from DeviceVendor.kernel_flags).
FLAG_EXCLUSIVE = CODES["FLAG_EXCLUSIVE"]
FLAG_EQUAL_SHARE = CODES["FLAG_EQUAL_SHARE"]
FLAG_CHOOSE = CODES["FLAG_CHOOSE"]
FLAG_CHARGE = CODES["FLAG_CHARGE"]

# Mask reason codes that upstream checks before the NUMA regrouping step, and the one after it.
_PRE_NUMA_MASK = (R.CARD_CORDONED, R.CARD_TYPE_MISMATCH)


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


def filter_nodes(table, query):
    """Fit the pod on every candidate node, score, and choose.

    ``table`` is the device table (any object with the attributes in
    ``fit_query.TABLE_COLUMNS``: the usage cache), ``query`` a ``fit_query.FitQuery``: the inputs
    named below are its slots or the table's columns, and the outputs go to its ``out_*`` arrays.

    ``candidates`` holds node indexes; -1 stands for a name the cache does not know (reported as
    NODE_UNREGISTERED). ``quota_mem``/``quota_cores`` give, per vendor id, what the pod's namespace
    may still take (UNLIMITED = no quota); ``mutex`` refuses devices that already host a task.
    With ``topology`` (the ``topology-aware`` policy) every fitting device is collected and the
    best-connected set is kept, by the pair scores in ``pair_score`` (an n x n block per node at
    ``node_pair_offset[node]``, -1 when the node published none).

    Device families' rules, per vendor id in ``vendor_flags``: FLAG_EXCLUSIVE refuses a device
    that hosts a task (as ``mutex`` does, for that family's rows only, but before the slot count,
    so a busy whole card reads ExclusiveDeviceAllocateConflict, upstream's reason, rather than
    CardTimeSlicingExhausted); FLAG_EQUAL_SHARE refuses a shared device whose tasks do not all
    hold the memory this row asks (CARD_NOT_FOUND_CUSTOM_FILTER_RULE); FLAG_CHOOSE collects every
    device that fits the row (as ``topology`` does, NUMA regrouping included) and lets
    ``choosers[vendor]`` pick ``nums`` of them, adding its score delta to the node's score, or
    refuse the node with a reason of its own (counted once, on top of the walk's counts; see
    ``_choose``); FLAG_CHARGE asks ``chargers[vendor](node, row)`` once per row and node what one device
    of the row costs there, ``(memory MiB, cores, slots)``, which replace the row's memory and cores
    in every check, score and charge, and make the slot check ``count - used >= slots`` (a
    partition whose profile depends on the node's devices); a reason code instead refuses the node
    with that reason alone (see ``_charge``).

    MIG: a device with ``dev_mig`` set hands out MIG instances. Its profiles are
    ``[mig_prof_off[j], +mig_prof_len[j])`` in the profile table (sorted by memory, then slices), each
    with its placements in the order they are tried, as bit masks of the GPU's slices; ``mig_used``
    holds the slices taken. A request fits when some profile with enough memory has a free placement;
    the instance then counts the profile's memory and cores, and the same GPU is offered again so one
    container may get several instances of it. ``mig_ok`` is false when the pod's
    family's ``allows_partitions`` rules MIG out (then the device-count precheck is not relaxed).

    Per candidate position ``c``: ``out_status[c]`` (reasons.NODE_*), ``out_score[c]`` (with the
    choosers' score deltas), and for a device-level failure ``out_reasons[c * N_DEVICE_REASONS + r]``
    counts and ``out_total[c]`` (the number of candidate devices of the failing request). Returns
    the winning candidate position, or -1; the winner's devices are written to
    ``out_row/out_dev/out_mem/out_cores/out_slots`` (one entry per device given, in request order) and their
    number is ``sum(nums)``; ``out_prof``/``out_place`` name the MIG profile and placement of each
    (-1 for a shared, non-MIG device).
    """
    total_mem, total_cores, count, numa, health, vendor = (
        table.total_mem, table.total_cores, table.count, table.numa, table.health, table.vendor)
    used_mem, used_cores, used = table.used_mem, table.used_cores, table.used
    node_offset, node_len = table.node_offset, table.node_len
    pair_score, node_pair_offset = table.pair_score, table.node_pair_offset
    dev_mig, mig_used, mig_prof_off, mig_prof_len = table.dev_mig, table.mig_used, table.mig_prof_off, table.mig_prof_len
    prof_mem, prof_core, prof_place_off, prof_place_len, place_mask = (
        table.prof_mem, table.prof_core, table.prof_place_off, table.prof_place_len, table.place_mask)
    q = query
    candidates, rows, mask = q.candidates, q.rows, q.mask
    node_policy, gpu_policy, numa_bind, mutex = q.node_policy, q.gpu_policy, q.numa_bind, q.mutex
    w_slot, w_core, w_mem = q.w_slot, q.w_core, q.w_mem
    quota_mem, quota_cores, topology, mig_ok = q.quota_mem, q.quota_cores, q.topology, q.mig_ok
    vendor_flags, choosers, chargers = q.vendor_flags, q.choosers, q.chargers
    out_status, out_reasons, out_total, out_score = q.out_status, q.out_reasons, q.out_total, q.out_score
    out_row, out_dev, out_mem, out_cores, out_prof, out_place, out_slots = (
        q.out_row, q.out_dev, q.out_mem, q.out_cores, q.out_prof, q.out_place, q.out_slots)

    n_rows = len(rows) // ROW_WIDTH
    for r in range(n_rows):
        v = rows[r * ROW_WIDTH + ROW_VENDOR]
        if v < 0 or v >= len(vendor_flags) or v >= len(quota_mem) or v >= len(quota_cores):
            raise ValueError(f"request row {r} names vendor id {v}, beyond the query's per-vendor arrays")
    has_mask = len(mask) > 0
    frag_key = has_key(gpu_policy, KEY_FRAG)
    nr = R.N_DEVICE_REASONS
    best = -1
    best_score = 0.0
    for c, ni in enumerate(candidates):
        if ni < 0:
            out_status[c] = R.NODE_UNREGISTERED
            out_score[c] = 0.0
            continue
        off = node_offset[ni]
        n = node_len[ni]
        # Default node score: usage before this pod, over all of the node's devices.
        s_used = s_count = s_uc = s_tc = s_um = s_tm = 0
        for j in range(off, off + n):
            s_used += used[j]
            s_count += count[j]
            s_uc += used_cores[j]
            s_tc += total_cores[j]
            s_um += used_mem[j]
            s_tm += total_mem[j]
        if s_count == 0 or s_tc == 0 or s_tm == 0:
            node_score = 0.0
        else:
            node_score = 10.0 * (s_used / s_count + s_uc / s_tc + s_um / s_tm)
        out_score[c] = node_score
        delta_sum = 0.0

        app_used = [used[j] for j in range(off, off + n)]
        app_mem = [used_mem[j] for j in range(off, off + n)]
        app_cores = [used_cores[j] for j in range(off, off + n)]
        app_mig = [mig_used[j] for j in range(off, off + n)]
        chosen = []  # (row, device, mem, cores, profile, placement, slots)
        # The pod's own usage so far on this node, per device: peak over init containers, sum over
        # app containers (the quota check charges the pod as the cache will: max of the two).
        q_init_mem = [0] * n
        q_init_cores = [0] * n
        q_app_mem = [0] * n
        q_app_cores = [0] * n
        status = R.NODE_FIT
        current_container = -1
        for r in range(n_rows):
            base = r * ROW_WIDTH
            container = rows[base + ROW_CONTAINER]
            if rows[base + ROW_IS_INIT]:
                # Ordinary init containers run one after another, each beside the native sidecars
                # started before it (KEP-753; a sidecar's rows are app rows): each is checked
                # against the node as the app rows have left it so far (before any app
                # container, since init rows come first), in a copy shared by its own rows.
                if container != current_container:
                    s_used_l, s_mem_l, s_cores_l, s_mig_l = (
                        list(app_used), list(app_mem), list(app_cores), list(app_mig))
            else:
                s_used_l, s_mem_l, s_cores_l, s_mig_l = app_used, app_mem, app_cores, app_mig
            current_container = container
            v = rows[base + ROW_VENDOR]
            nums = rows[base + ROW_NUMS]
            memreq = rows[base + ROW_MEMREQ]
            mempct = rows[base + ROW_MEMPCT]
            cores = min(rows[base + ROW_CORESREQ], 100)
            cands = [k for k in range(n) if vendor[off + k] == v]
            if nums > len(cands) and not (mig_ok and any(dev_mig[off + k] for k in cands)):
                status = R.NODE_INSUFFICIENT_DEVICE
                break
            is_init = rows[base + ROW_IS_INIT]
            qm = quota_mem[v]
            qc = quota_cores[v]
            flags = vendor_flags[v]
            slots = 1
            if flags & FLAG_CHARGE:
                answer = _charge(chargers, v, ni, r)
                if isinstance(answer, int):   # no device of this node can hold the row: its reason
                    status = R.NODE_DEVICE_REASONS
                    out_reasons[c * nr + answer] = 1
                    out_total[c] = len(cands)
                    break
                memreq, cores, slots = answer
                mempct = 0
            # A negative core request takes no cores and skips every core check.
            free_cores = cores < 0
            if free_cores:
                cores = 0
            exclusive = flags & FLAG_EXCLUSIVE
            equal_share = flags & FLAG_EQUAL_SHARE
            choose = flags & FLAG_CHOOSE
            collect_all = topology or choose   # every fitting device, not the first nums
            keyed = []
            for k in cands:
                j = off + k
                mem = resolve_mem(memreq, mempct, total_mem[j])
                sc = device_score(total_mem[j], total_cores[j], count[j], s_used_l[k],
                                  s_mem_l[k], s_cores_l[k], mem, cores, w_slot, w_core, w_mem)
                fc = (frag_device_cost(total_mem[j], total_cores[j], count[j], s_used_l[k], s_mem_l[k],
                                       s_cores_l[k], mem, cores, slots) if frag_key else 0.0)
                keyed.append((_preference_key(sc, numa[j], k, s_used_l[k], gpu_policy, numa_bind, fc), k))
            keyed.sort()
            counts = [0] * nr
            picked = []   # (k, mem, profile, placement)
            pick_occ = [0] * n   # MIG slices taken by this row's own picks, per device
            need = nums
            prev_numa = -1
            walk = [k for _, k in keyed]
            i = -1
            revisit = False
            while True:
                if not revisit:
                    i += 1
                revisit = False
                if i >= len(walk):
                    break
                k = walk[i]
                j = off + k
                if not health[j]:
                    counts[R.CARD_NOT_HEALTH] += 1
                    continue
                m = mask[j] if has_mask else 0
                if m in _PRE_NUMA_MASK:
                    counts[m] += 1
                    continue
                if numa_bind and numa[j] != prev_numa:
                    if picked and not collect_all:
                        counts[R.NUMA_NOT_FIT] += len(picked)
                    picked = []
                    pick_occ = [0] * n
                    need = nums
                    prev_numa = numa[j]
                if m != 0:
                    counts[m] += 1
                    continue
                # Upstream's first test is Count <= Used: is a slot left at all. A partition of several
                # slices (slots > 1) is checked for all of them after memory and cores, so that a
                # card too full for it is refused for its memory, as upstream words it.
                if count[j] - s_used_l[k] < 1:
                    # A busy device of an exclusive family is refused for being busy, even when its
                    # slots are gone too (a whole card has one): upstream's reason. Tested inside
                    # the slot check so that rows of other families pay nothing for it (the
                    # Cython kernel measured 2-4 % slower with the flag tested first).
                    if exclusive and s_used_l[k] > 0:
                        counts[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                    else:
                        counts[R.CARD_TIME_SLICING_EXHAUSTED] += 1
                    continue
                if exclusive and s_used_l[k] > 0:
                    counts[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                    continue
                if mutex and s_used_l[k] > 0:
                    counts[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                    continue
                mem = resolve_mem(memreq, mempct, total_mem[j])
                if qm != UNLIMITED or qc != UNLIMITED:
                    tm, tc = _pod_total(cands, picked, k, mem, cores,
                                        q_init_mem, q_init_cores, q_app_mem, q_app_cores)
                    if (qm != UNLIMITED and tm > qm) or (qc != UNLIMITED and tc > qc):
                        counts[R.RESOURCE_QUOTA_NOT_FIT] += 1
                        continue
                if total_mem[j] - s_mem_l[k] < mem:
                    counts[R.CARD_INSUFFICIENT_MEMORY] += 1
                    continue
                if not free_cores and total_cores[j] - s_cores_l[k] < cores:
                    counts[R.CARD_INSUFFICIENT_CORE] += 1
                    continue
                if slots > 1 and count[j] - s_used_l[k] < slots:
                    counts[R.CARD_TIME_SLICING_EXHAUSTED] += 1
                    continue
                if equal_share and s_used_l[k] > 0 and s_mem_l[k] != s_used_l[k] * mem:
                    # Its tasks hold another size than this one asks.
                    counts[R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE] += 1
                    continue
                if total_cores[j] == 100 and cores == 100 and s_used_l[k] > 0:
                    counts[R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                    continue
                if not free_cores and total_cores[j] != 0 and s_cores_l[k] == total_cores[j] and cores == 0:
                    counts[R.CARD_COMPUTE_UNITS_EXHAUSTED] += 1
                    continue
                prof = place = -1
                if dev_mig[j]:
                    prof, place = _mig_select(j, s_mig_l[k] | pick_occ[k], mem, mig_prof_off, mig_prof_len,
                                              prof_mem, prof_place_off, prof_place_len, place_mask)
                    if prof < 0:
                        counts[R.CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                        continue
                    pick_occ[k] |= place_mask[place]
                    revisit = True  # a MIG GPU may give this container another instance
                picked.append((k, mem, prof, place))
                if not collect_all:
                    need -= 1
                    if need == 0:
                        break
            if collect_all and len(picked) >= nums:
                if choose:
                    answer = _choose(choosers, v, ni, picked, nums)
                    if isinstance(answer, int):   # the vendor refuses every subset: its reason
                        status = R.NODE_DEVICE_REASONS
                        for i in range(nr):
                            out_reasons[c * nr + i] = counts[i]
                        out_reasons[c * nr + answer] += 1
                        out_total[c] = len(cands)
                        break
                    picked, delta = answer
                    node_score += delta
                    delta_sum += delta
                    out_score[c] = node_score
                elif len(picked) > nums:
                    picked = _topology_pick(picked, nums, pair_score, node_pair_offset[ni], n)
                need = 0
            if need > 0:
                if picked:
                    counts[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(picked)
                status = R.NODE_DEVICE_REASONS
                for i in range(nr):
                    out_reasons[c * nr + i] = counts[i]
                out_total[c] = len(cands)
                break
            for k, mem, prof, place in picked:
                use_mem, use_cores = mem, cores
                if prof >= 0:  # a MIG instance is charged as its profile
                    use_mem, use_cores = prof_mem[prof], prof_core[prof]
                    s_mig_l[k] |= place_mask[place]
                s_used_l[k] += slots
                s_mem_l[k] += use_mem
                s_cores_l[k] += use_cores
                if is_init:     # beside the sidecars so far (the app sums, while init rows run)
                    q_init_mem[k] = max(q_init_mem[k], q_app_mem[k] + use_mem)
                    q_init_cores[k] = max(q_init_cores[k], q_app_cores[k] + use_cores)
                else:
                    q_app_mem[k] += use_mem
                    q_app_cores[k] += use_cores
                chosen.append((r, off + k, use_mem, use_cores, prof, place, slots))
        out_status[c] = status
        if status != R.NODE_FIT:
            continue
        if node_policy == POLICY_FRAG:   # the placement's cost to what comes next, choosers' deltas added
            node_score = frag_node_score(off, n, table, app_used, app_mem, app_cores) + delta_sum
            out_score[c] = node_score
        better = (best < 0 or (node_policy == POLICY_SPREAD and node_score < best_score)
                  or (node_policy != POLICY_SPREAD and node_score > best_score))
        if better:
            best = c
            best_score = node_score
            for i, (r, dev, mem, cores_, prof, place, slots_) in enumerate(chosen):
                out_row[i] = r
                out_dev[i] = dev
                out_slots[i] = slots_
                out_mem[i] = mem
                out_cores[i] = cores_
                out_prof[i] = prof
                out_place[i] = place
    return best


def _choose(choosers, v, ni, picked, nums):
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


def _charge(chargers, v, ni, r):
    """Vendor ``v``'s charge of one device of row ``r`` on node ``ni``: ``(memory MiB, cores, slots)``
    or the reason code it refused the node with. An answer outside the contract
    (``devices.base.Charger``) is the family's bug: it raises ValueError."""
    charger = chargers[v] if v < len(chargers) else None
    if charger is None:
        raise ValueError(f"vendor id {v} has FLAG_CHARGE but the query carries no charger for it")
    answer = charger(ni, r)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 < answer < R.N_DEVICE_REASONS:
            raise ValueError(f"charger of vendor id {v} answered reason {answer}, not a device reason code")
        return answer
    if (not isinstance(answer, tuple) or len(answer) != 3 or not all(type(x) is int for x in answer)
            or not (0 <= answer[0] <= 2147483647 and 0 <= answer[1] <= 100 and 1 <= answer[2] <= 2147483647)):
        raise ValueError(f"charger of vendor id {v} answered {answer!r}, not (memory, cores, slots) or a reason")
    return answer


def _pod_total(cands, picked, k_extra, mem_extra, cores_extra,
               q_init_mem, q_init_cores, q_app_mem, q_app_cores):
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
        tm += max(q_init_mem[k], q_app_mem[k] + add_m)
        tc += max(q_init_cores[k], q_app_cores[k] + add_c)
    return tm, tc


def _topology_pick(picked, nums, pair_score, poff, n):
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


def _mig_select(j, occupied, mem, mig_prof_off, mig_prof_len, prof_mem, prof_place_off, prof_place_len,
                place_mask):
    """Upstream's MIG choice: the smallest profile with enough memory that has a placement free of
    ``occupied`` (placements in their try order). (profile, placement) indexes, or (-1, -1)."""
    for p in range(mig_prof_off[j], mig_prof_off[j] + mig_prof_len[j]):
        if prof_mem[p] < mem:
            continue
        for q in range(prof_place_off[p], prof_place_off[p] + prof_place_len[p]):
            if not place_mask[q] & occupied:
                return p, q
    return -1, -1


def best_fit_nodes(status, score, k, spread):
    """``(fitting nodes, indexes of the k best of them, best first)``. Best: the highest score
    under binpack, the lowest under spread (as the kernel chooses its winner), and on equal scores
    the earlier candidate, so the winner is always the first listed."""
    fit = [c for c in range(len(status)) if status[c] == R.NODE_FIT]
    fit.sort(key=lambda c: (score[c] if spread else -score[c], c))
    return len(fit), fit[:max(k, 0)]

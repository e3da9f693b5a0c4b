"""The fit-and-score rules in plain Python: the readable specification of the Cython kernel.

``cython_core/fit_kernel.pyx`` implements exactly these rules over the same typed arrays, and
``tests/test_kernel.py`` has hypothesis compare the two on random clusters and requests. Change a
rule here first, then mirror it there.

Inputs are the usage cache's struct-of-arrays (one entry per registered device; a node owns the
contiguous slice ``[node_offset[n], node_offset[n] + node_len[n])``), read as attributes of a
table object, plus one filter's query (``hami_py.scheduling.kernel.fit_query.FitQuery``) holding the
policies and the pod's requests as flat rows of ``ROW_WIDTH`` int32 values:

    container, is_init, vendor, nums, memreq, mempct, coresreq

Rows are ordered by container, init containers first. The rules are upstream HAMi's generic
device fit (hami-scheduling.md §7, §8, §9, §10) with two deliberate fixes: candidates are matched
by vendor id, not by substring of the model name, and the per-device score includes the request
being placed (upstream's exact-type comparison made that term vanish for its main family until
HAMi #2870 compared the device's vendor). The request's memory is its MiB, else its percentage of
the device (``resolve_mem``; HAMi #3106 scores the same way).

The kernel runs them in one loop for speed; here they read stage by stage, in the kernel's order:
``filter_nodes`` (each candidate node, then the winner), ``_fit_node`` (the pod's rows on one
node, init containers beside the usage the app rows leave), ``_fit_row`` (one row: the vendor's
candidate devices and charge, then the pick), and the per-device stages of
``kernel_ref_fit`` (the devices' order, the walk through upstream's gates, MIG placement, the
topology-aware pick and the vendor's chooser).
"""
from __future__ import annotations

from hami_py import reasons as R
# The quota's "no limit" and every number of the kernel (as fit_kernel.pyx cimports
# kernel_codes.pxd): the reference's readers, the tests, find them here.
from hami_py.cache.quota import UNLIMITED  # noqa: F401
from hami_py.kernel_codes import *  # noqa: F403
from hami_py.kernel_codes import (
    FLAG_CHARGE, FLAG_CHOOSE, POLICY_FRAG, POLICY_SPREAD, ROW_CONTAINER, ROW_CORESREQ, ROW_IS_INIT, ROW_MEMPCT,
    ROW_MEMREQ, ROW_NUMS, ROW_VENDOR, ROW_WIDTH,
)
# The fragmentation-aware policy's node score.
from hami_py.scheduling.kernel.frag import frag_node_score
from hami_py.scheduling.kernel.reference_fit import (  # resolve_mem: the tests check the kernel's against it
    PodCharge, Row, Usage, charge, choose, order_devices, resolve_mem, topology_pick, walk,  # noqa: F401
)


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
    ``kernel_ref_fit.choose``); FLAG_CHARGE asks ``chargers[vendor](node, row)`` once per row and node what one device
    of the row costs there, ``(memory MiB, cores, slots)``, which replace the row's memory and cores
    in every check, score and charge, and make the slot check ``count - used >= slots`` (a
    partition whose profile depends on the node's devices), or ``(memory, cores, slots, nums)``
    with ``1 <= nums <=`` the row's count: the devices the row takes on that node (the walk, the
    chooser and the outputs then use that count; ``_fit_row`` says how it meets the too-few-devices
    check); a reason code instead refuses the node with that reason alone (see ``kernel_ref_fit.charge``). FLAG_SLOTS_FIRST moves that slot check
    to the first gate, before memory and cores (a partition family since HAMi #2877), so a device
    short of both slots and memory reads CardTimeSlicingExhausted.

    NUMA binding (``numa_bind``) keeps a row's devices on one NUMA node: the walk starts over on
    each NUMA node it reaches, and a collecting walk keeps the first NUMA node that holds the row
    (``kernel_ref_fit.numa_group_done``).

    MIG: a device with ``dev_mig`` set hands out MIG instances. Its profiles are
    ``[mig_prof_off[j], +mig_prof_len[j])`` in the profile table (sorted by memory, then slices), each
    with its placements in the order they are tried, as bit masks of the GPU's slices; ``mig_used``
    holds the slices taken. When the walk reaches a MIG GPU, the row's instances still needed there
    (all ``nums`` when every fitting device is collected) are planned together by a bounded search
    over the free placements of the profiles with enough memory (``kernel_ref_fit.mig_plan``:
    the pod's preferred profiles first, ``prof_rank``, then smallest first); the GPU is then
    offered again for each instance of the plan, so one container may get several instances of it,
    each charged as its profile's memory and cores. Instances the plan could not hold count
    CARD_MIG_TOPOLOGY_INFEASIBLE on that GPU. ``mig_ok`` is false when the pod's
    family's ``allows_partitions`` rules MIG out (then the device-count precheck is not relaxed).

    Per candidate position ``c``: ``out_status[c]`` (reasons.NODE_*), ``out_score[c]`` (with the
    choosers' score deltas), and for a device-level failure ``out_reasons[c * N_DEVICE_REASONS + r]``
    counts and ``out_total[c]`` (the number of candidate devices of the failing request). Returns
    the winning candidate position, or -1; the winner's devices are written to
    ``out_row/out_dev/out_mem/out_cores/out_slots`` (one entry per device given, in request order) and their
    number to ``out_count[0]`` (``sum(nums)``, each row's count as its charger sized it on that node); ``out_prof``/``out_place`` name the MIG profile and placement of each
    (-1 for a shared, non-MIG device).
    """
    q = query
    for r in range(len(q.rows) // ROW_WIDTH):
        v = q.rows[r * ROW_WIDTH + ROW_VENDOR]
        if v < 0 or v >= len(q.vendor_flags) or v >= len(q.quota_mem) or v >= len(q.quota_cores):
            raise ValueError(f"request row {r} names vendor id {v}, beyond the query's per-vendor arrays")
    node_policy = q.node_policy
    best = -1
    best_score = 0.0
    for c, ni in enumerate(q.candidates):
        if ni < 0:
            q.out_status[c] = R.NODE_UNREGISTERED
            q.out_score[c] = 0.0
            continue
        node = _Node(table, c, ni)
        q.out_score[c] = node.score
        status = _fit_node(table, q, node)
        q.out_status[c] = status
        if status != R.NODE_FIT:
            continue
        if node_policy == POLICY_FRAG:   # the placement's cost to what comes next, choosers' deltas added
            node.score = frag_node_score(node.off, node.n, table, node.app.used, node.app.mem,
                                         node.app.cores) + node.delta_sum
            q.out_score[c] = node.score
        better = (best < 0 or (node_policy == POLICY_SPREAD and node.score < best_score)
                  or (node_policy != POLICY_SPREAD and node.score > best_score))
        if better:
            best = c
            best_score = node.score
            for i, (r, dev, mem, cores, prof, place, slots) in enumerate(node.chosen):
                q.out_row[i] = r
                q.out_dev[i] = dev
                q.out_slots[i] = slots
                q.out_mem[i] = mem
                q.out_cores[i] = cores
                q.out_prof[i] = prof
                q.out_place[i] = place
            q.out_count[0] = len(node.chosen)
    return best


class _Node:
    """One candidate node while the pod's rows are fitted on it: its devices ``[off, off + n)``,
    the usage the pod's app rows leave (``app``), the pod's own charge there (``pod``), the
    devices given so far (``chosen``) and its score (choosers' deltas added as they come)."""

    __slots__ = ("c", "ni", "off", "n", "app", "pod", "chosen", "score", "delta_sum")

    def __init__(self, table, c, ni):
        off = table.node_offset[ni]
        n = table.node_len[ni]
        self.c, self.ni, self.off, self.n = c, ni, off, n
        self.app = Usage(*([column[j] for j in range(off, off + n)]
                           for column in (table.used, table.used_mem, table.used_cores, table.mig_used)))
        self.pod = PodCharge(n)
        self.chosen = []  # (row, device, mem, cores, profile, placement, slots)
        self.score = _node_score(table, off, n)
        self.delta_sum = 0.0


def _node_score(table, off, n):
    """The default node score: usage before this pod, over all of the node's devices."""
    used, count, used_cores, total_cores, used_mem, total_mem = (
        table.used, table.count, table.used_cores, table.total_cores, table.used_mem, table.total_mem)
    s_used = s_count = s_uc = s_tc = s_um = s_tm = 0
    for j in range(off, off + n):
        s_used += used[j]
        s_count += count[j]
        s_uc += used_cores[j]
        s_tc += total_cores[j]
        s_um += used_mem[j]
        s_tm += total_mem[j]
    if s_count == 0 or s_tc == 0 or s_tm == 0:
        return 0.0
    return 10.0 * (s_used / s_count + s_uc / s_tc + s_um / s_tm)


def _fit_node(table, q, node):
    """The pod's rows on one node, in order, each given its devices before the next is fitted:
    NODE_FIT with ``node.chosen`` filled, or the status of the first row refused."""
    rows = q.rows
    current_container = -1
    for r in range(len(rows) // ROW_WIDTH):
        base = r * ROW_WIDTH
        container = rows[base + ROW_CONTAINER]
        is_init = rows[base + ROW_IS_INIT]
        if is_init:
            # Ordinary init containers run one after another, each beside the native sidecars
            # started before it (KEP-753; a sidecar's rows are app rows): each is checked
            # against the node as the app rows have left it so far (before any app
            # container, since init rows come first), in a copy shared by its own rows.
            if container != current_container:
                usage = node.app.copy()
        else:
            usage = node.app
        current_container = container
        status, row, picks = _fit_row(table, q, node, r, usage)
        if status != R.NODE_FIT:
            return status
        _book(table, node, r, is_init, row, picks, usage)
    return R.NODE_FIT


def _fit_row(table, q, node, r, usage):
    """Row ``r`` on the node as ``usage`` leaves it: ``(status, Row, picks)``, the picks
    ``(position, memory, MIG profile, placement)``. A refusal has written its reasons to the
    query's outputs: too few devices of the vendor, the vendor's charger or chooser refusing
    the node (its reason, counted once on top of the walk's counts), or the walk's counts."""
    c, off, nr = node.c, node.off, R.N_DEVICE_REASONS
    rows = q.rows
    base = r * ROW_WIDTH
    v = rows[base + ROW_VENDOR]
    nums = rows[base + ROW_NUMS]
    memreq = rows[base + ROW_MEMREQ]
    mempct = rows[base + ROW_MEMPCT]
    cores = min(rows[base + ROW_CORESREQ], 100)
    cands = [k for k in range(node.n) if table.vendor[off + k] == v]
    flags = q.vendor_flags[v]
    # Too few devices of the vendor reads NODE_INSUFFICIENT_DEVICE, before anything else, as it
    # always has; a FLAG_CHARGE row's charger may say the row takes fewer devices on this node
    # (the 4-tuple), so on a node with some devices of the vendor it is asked first, and the node
    # goes on only when the charger answers a count the node has: a refusal or a count still too
    # large keeps NODE_INSUFFICIENT_DEVICE. A charger that never lowers the count (every 3-tuple
    # family) therefore reads exactly as before: too few devices first, then its refusal.
    too_few = nums > len(cands) and not (q.mig_ok and any(table.dev_mig[off + k] for k in cands))
    if too_few and not (flags & FLAG_CHARGE and cands):
        return R.NODE_INSUFFICIENT_DEVICE, None, None
    slots = 1
    if flags & FLAG_CHARGE:
        answer = charge(q.chargers, v, node.ni, r, nums)
        if too_few and (isinstance(answer, int) or answer[3] > len(cands)):
            return R.NODE_INSUFFICIENT_DEVICE, None, None
        if isinstance(answer, int):   # no device of this node can hold the row: its reason
            q.out_reasons[c * nr + answer] = 1
            q.out_total[c] = len(cands)
            return R.NODE_DEVICE_REASONS, None, None
        memreq, cores, slots, nums = answer
        mempct = 0
    row = Row(nums, memreq, mempct, cores, slots, cands, flags, q.topology, q.quota_mem[v], q.quota_cores[v])
    counts, picked, need = walk(table, q, off, row, usage, node.pod, order_devices(table, q, off, row, usage))
    if row.collect_all and len(picked) >= nums:
        if flags & FLAG_CHOOSE:
            answer = choose(q.choosers, v, node.ni, picked, nums)
            if isinstance(answer, int):   # the vendor refuses every subset: its reason
                counts[answer] += 1
                return _refuse(q, c, counts, len(cands)), None, None
            picked, delta = answer
            node.score += delta
            node.delta_sum += delta
            q.out_score[c] = node.score
        elif len(picked) > nums:
            picked = topology_pick(picked, nums, table.pair_score, table.node_pair_offset[node.ni], node.n)
        need = 0
    if need > 0:
        if picked:
            counts[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(picked)
        return _refuse(q, c, counts, len(cands)), None, None
    return R.NODE_FIT, row, picked


def _refuse(q, c, counts, total):
    """Candidate ``c`` refused for its devices: the walk's counts and the number of candidate devices."""
    nr = R.N_DEVICE_REASONS
    for i in range(nr):
        q.out_reasons[c * nr + i] = counts[i]
    q.out_total[c] = total
    return R.NODE_DEVICE_REASONS


def _book(table, node, r, is_init, row, picks, usage):
    """Give row ``r`` its picks: charge them to ``usage`` and to the pod's quota sums, and list
    them for the output (a MIG instance is charged as its profile)."""
    pod = node.pod
    for k, mem, prof, place in picks:
        use_mem, use_cores = mem, row.cores
        if prof >= 0:  # a MIG instance is charged as its profile
            use_mem, use_cores = table.prof_mem[prof], table.prof_core[prof]
            usage.mig[k] |= table.place_mask[place]
        usage.used[k] += row.slots
        usage.mem[k] += use_mem
        usage.cores[k] += use_cores
        if is_init:     # beside the sidecars so far (the app sums, while init rows run)
            pod.init_mem[k] = max(pod.init_mem[k], pod.app_mem[k] + use_mem)
            pod.init_cores[k] = max(pod.init_cores[k], pod.app_cores[k] + use_cores)
        else:
            pod.app_mem[k] += use_mem
            pod.app_cores[k] += use_cores
        node.chosen.append((r, node.off + k, use_mem, use_cores, prof, place, row.slots))


def best_fit_nodes(status, score, k, spread):
    """``(fitting nodes, indexes of the k best of them, best first)``. Best: the highest score
    under binpack, the lowest under spread (as the kernel chooses its winner), and on equal scores
    the earlier candidate, so the winner is always the first listed."""
    fit = [c for c in range(len(status)) if status[c] == R.NODE_FIT]
    fit.sort(key=lambda c: (score[c] if spread else -score[c], c))
    return len(fit), fit[:max(k, 0)]

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The /filter hot loop: fit every candidate node, score, choose, in one call.

This is a line-for-line translation of ``hami_py/scheduling/kernel/reference.py`` (read that for the
rules and their sources); hypothesis keeps the two equal. It walks the usage cache's typed arrays
directly, so a filter costs O(candidate nodes x devices) in C and nothing per running pod; only
the rows of a family with a chooser (FLAG_CHOOSE) or a charger (FLAG_CHARGE) call back into
Python, once per node (and row, for a charger).

Its numbers (reasons, row layout, policies, vendor flags) live in ``kernel_codes.pxd`` and reach
Python through ``CODES``, so no other file repeats them.
"""
from libc.stdlib cimport malloc, free
from libc.string cimport memset

from kernel_codes cimport *

# Every number of kernel_codes.pxd, for Python: hami_py.reasons and hami_py.kernel_codes
# read theirs from here (tests/test_kernel.py checks that this lists every name of the .pxd).
CODES = {
    "OK": OK, "CARD_NOT_HEALTH": CARD_NOT_HEALTH, "CARD_CORDONED": CARD_CORDONED,
    "CARD_TYPE_MISMATCH": CARD_TYPE_MISMATCH, "NUMA_NOT_FIT": NUMA_NOT_FIT,
    "CARD_UUID_MISMATCH": CARD_UUID_MISMATCH, "CARD_TIME_SLICING_EXHAUSTED": CARD_TIME_SLICING_EXHAUSTED,
    "EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT": EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    "RESOURCE_QUOTA_NOT_FIT": RESOURCE_QUOTA_NOT_FIT, "CARD_INSUFFICIENT_MEMORY": CARD_INSUFFICIENT_MEMORY,
    "CARD_INSUFFICIENT_CORE": CARD_INSUFFICIENT_CORE, "CARD_COMPUTE_UNITS_EXHAUSTED": CARD_COMPUTE_UNITS_EXHAUSTED,
    "CARD_MIG_TOPOLOGY_INFEASIBLE": CARD_MIG_TOPOLOGY_INFEASIBLE,
    "ALLOCATED_CARDS_INSUFFICIENT_REQUEST": ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    "CARD_NOT_FOUND_CUSTOM_FILTER_RULE": CARD_NOT_FOUND_CUSTOM_FILTER_RULE, "MODE_NOT_FIT": MODE_NOT_FIT,
    "CARD_QOS_POLICY_MISMATCH": CARD_QOS_POLICY_MISMATCH, "CARD_APP_CLASS_MISMATCH": CARD_APP_CLASS_MISMATCH,
    "N_DEVICE_REASONS": N_DEVICE_REASONS,
    "NODE_FIT": NODE_FIT, "NODE_DEVICE_REASONS": NODE_DEVICE_REASONS,
    "NODE_INSUFFICIENT_DEVICE": NODE_INSUFFICIENT_DEVICE, "NODE_UNREGISTERED": NODE_UNREGISTERED,
    "ROW_WIDTH": ROW_WIDTH, "ROW_CONTAINER": ROW_CONTAINER, "ROW_IS_INIT": ROW_IS_INIT,
    "ROW_VENDOR": ROW_VENDOR, "ROW_NUMS": ROW_NUMS, "ROW_MEMREQ": ROW_MEMREQ, "ROW_MEMPCT": ROW_MEMPCT,
    "ROW_CORESREQ": ROW_CORESREQ, "MEMPCT_UNSET": MEMPCT_UNSET,
    "POLICY_BINPACK": POLICY_BINPACK, "POLICY_SPREAD": POLICY_SPREAD, "POLICY_FRAG": POLICY_FRAG,
    "ORDER_BINPACK": ORDER_BINPACK, "ORDER_SPREAD": ORDER_SPREAD, "ORDER_MUTEX": ORDER_MUTEX,
    "ORDER_CHAIN": ORDER_CHAIN, "KEY_BINPACK": KEY_BINPACK, "KEY_SPREAD": KEY_SPREAD, "KEY_NUMA": KEY_NUMA,
    "KEY_FRAG": KEY_FRAG, "CHAIN_BASE": CHAIN_BASE,
    "MAX_TOPOLOGY_COMBOS": MAX_TOPOLOGY_COMBOS,
    "MIG_SEARCH_BUDGET": MIG_SEARCH_BUDGET, "MAX_MIG_INSTANCES": MAX_MIG_INSTANCES,
    "FLAG_EXCLUSIVE": FLAG_EXCLUSIVE, "FLAG_EQUAL_SHARE": FLAG_EQUAL_SHARE, "FLAG_CHOOSE": FLAG_CHOOSE,
    "FLAG_CHARGE": FLAG_CHARGE, "FLAG_SLOTS_FIRST": FLAG_SLOTS_FIRST,
}

# Per-device scratch columns (long long), each max_len long.
cdef enum:
    L_APP_USED = 0
    L_APP_MEM = 1
    L_APP_CORES = 2
    L_APP_MIG = 3
    L_INI_USED = 4
    L_INI_MEM = 5
    L_INI_CORES = 6
    L_INI_MIG = 7
    L_Q_INIT_MEM = 8
    L_Q_INIT_CORES = 9
    L_Q_APP_MEM = 10
    L_Q_APP_CORES = 11
    L_PICKED_MEM = 12
    L_COLS = 13

# "No quota" (hami_py.cache.quota.UNLIMITED); any other value, negative too, is the headroom.
cdef long long UNLIMITED = -(1LL << 62)
cdef int UNRANKED = 1 << 30     # reference_fit._UNRANKED
QUOTA_UNLIMITED = UNLIMITED   # checked against the cache's constant by tests/test_kernel.py


cdef inline long long resolve_mem(int memreq, int mempct, long long total_mem) noexcept nogil:
    if memreq > 0:
        return memreq
    if mempct != MEMPCT_UNSET:
        return total_mem * mempct // 100
    return 0


cdef inline double stranded_fraction(long long total_mem, long long total_cores, long long count, long long used,
                                    long long used_mem, long long used_cores) noexcept nogil:
    """kernel_frag.stranded_fraction."""
    cdef long long free
    if count == 0 or total_mem == 0:
        return 0.0
    free = total_mem - used_mem
    if free <= 0:
        return 0.0
    if count - used >= 1 and (total_cores == 0 or used_cores < total_cores):
        return 0.0
    return (<double> free) / total_mem


cdef inline double frag_device_cost(long long total_mem, long long total_cores, long long count, long long used,
                                   long long used_mem, long long used_cores, long long mem, long long cores,
                                   long long slots) noexcept nogil:
    """kernel_frag.frag_device_cost."""
    cdef double cost = 4.0 if used == 0 else 0.0
    cdef long long free
    if count == 0 or total_mem == 0:
        return cost
    free = total_mem - used_mem - mem
    if free < 0:
        free = 0
    return (cost + 2.0 * stranded_fraction(total_mem, total_cores, count, used + slots, used_mem + mem,
                                           used_cores + cores)
            + (<double> free) / total_mem)


cdef inline bint has_key(int gpu_policy, int key) noexcept nogil:
    """kernel_frag.has_key."""
    cdef int code
    if gpu_policy < ORDER_CHAIN:
        return False
    code = gpu_policy - ORDER_CHAIN
    while code:
        if code % CHAIN_BASE == key:
            return True
        code = code // CHAIN_BASE
    return False


cdef inline bint prefer(double sa, int na, int pa, long long ua, double fa, double sb, int nb, int pb, long long ub,
                        double fb, int gpu_policy, int numa_bind) noexcept nogil:
    """True when device a sorts strictly before device b (is tried first); f is the device's
    fragmentation cost (read by KEY_FRAG only)."""
    cdef int code, k
    if gpu_policy >= ORDER_CHAIN:
        code = gpu_policy - ORDER_CHAIN
        while code:
            k = code % CHAIN_BASE
            code = code // CHAIN_BASE
            if k == KEY_BINPACK:
                if sa != sb:
                    return sa > sb
            elif k == KEY_SPREAD:
                if sa != sb:
                    return sa < sb
            elif k == KEY_FRAG:
                if fa != fb:
                    return fa < fb
            else:
                if na != nb:
                    return na > nb
        return pa > pb
    if gpu_policy == ORDER_MUTEX:
        if ua != ub:
            return ua < ub
        if na != nb:
            return na > nb
        return pa > pb
    if numa_bind:
        if gpu_policy == POLICY_BINPACK:
            if na != nb:
                return na < nb
            if sa != sb:
                return sa > sb
            return pa > pb
        if na != nb:
            return na > nb
        if sa != sb:
            return sa < sb
        return pa > pb
    if gpu_policy == POLICY_BINPACK:
        if sa != sb:
            return sa > sb
        if na != nb:
            return na > nb
        return pa > pb
    if sa != sb:
        return sa < sb
    if na != nb:
        return na > nb
    return pa > pb


cdef inline int pair(const int[::1] pair_score, int poff, Py_ssize_t n, int a, int b) noexcept nogil:
    if poff < 0:
        return 0
    return pair_score[poff + a * n + b]


cdef inline int popcount64(long long x) noexcept nogil:
    cdef unsigned long long u = <unsigned long long> x
    cdef int c = 0
    while u:
        u &= u - 1
        c += 1
    return c


cdef inline int rank_key(const int[::1] prof_rank, int p) noexcept nogil:
    """reference_fit._profile_order's sort key: a named profile's rank, else after all of them."""
    if p < prof_rank.shape[0] and prof_rank[p] > 0:
        return prof_rank[p]
    return UNRANKED


cdef int mig_search(const long long *cmask, const int *csize, Py_ssize_t ncand, Py_ssize_t start, long long occ,
                    int depth, int want, int *chosen, int *best, int *best_len, int *budget) noexcept nogil:
    """reference_fit.mig_plan's search: 1 to stop (``want`` reached or the budget spent)."""
    cdef Py_ssize_t i, t
    cdef long long union_
    cdef int smallest, bound
    if depth > best_len[0]:
        for t in range(depth):
            best[t] = chosen[t]
        best_len[0] = depth
    if depth >= want:
        return 1
    for i in range(start, ncand):
        if cmask[i] & occ:
            continue
        # reference_fit._mig_bound: free slices the candidates from i cover, over their smallest size.
        union_ = 0
        smallest = MAX_MIG_INSTANCES + 1
        for t in range(i, ncand):
            if not (cmask[t] & occ):
                union_ |= cmask[t]
                if csize[t] < smallest:
                    smallest = csize[t]
        bound = popcount64(union_) // smallest if union_ else 0
        if depth + bound <= best_len[0]:
            return 0
        if budget[0] <= 0:
            return 1
        budget[0] -= 1
        chosen[depth] = <int> i
        if mig_search(cmask, csize, ncand, i + 1, occ | cmask[i], depth + 1, want, chosen, best, best_len, budget):
            return 1
    return 0


cdef int mig_plan(Py_ssize_t j, long long occupied, long long mem, int want,
                  const int[::1] mig_prof_off, const int[::1] mig_prof_len, const int[::1] prof_mem,
                  const int[::1] prof_place_off, const int[::1] prof_place_len, const long long[::1] place_mask,
                  const int[::1] prof_rank, int *mig_i, long long *cmask, int *plan_prof,
                  int *plan_place) noexcept nogil:
    """reference_fit.mig_plan: the plan's length, its instances in ``plan_prof``/``plan_place``.
    ``mig_i`` holds the int scratch (profile order, candidates, their sizes, the search's paths)
    and ``cmask`` the candidates' masks, sized by the filter for the profile table."""
    cdef Py_ssize_t first = mig_prof_off[j], nprof = mig_prof_len[j], a, b, q, ncand = 0
    cdef Py_ssize_t ntable = prof_mem.shape[0] + 1, nplace = place_mask.shape[0] + 1
    cdef int *porder = mig_i
    cdef int *cprof = porder + ntable
    cdef int *cplace = cprof + nplace
    cdef int *csize = cplace + nplace
    cdef int *chosen = csize + nplace
    cdef int *best = chosen + MAX_MIG_INSTANCES
    cdef int tmp, p, best_len = 0, budget = MIG_SEARCH_BUDGET
    for a in range(nprof):
        porder[a] = <int> (first + a)
    if prof_rank.shape[0] > 0:
        for a in range(1, nprof):   # insertion sort, stable: by rank, then the table's order
            tmp = porder[a]
            b = a - 1
            while b >= 0 and rank_key(prof_rank, tmp) < rank_key(prof_rank, porder[b]):
                porder[b + 1] = porder[b]
                b -= 1
            porder[b + 1] = tmp
    for a in range(nprof):
        p = porder[a]
        if prof_mem[p] < mem:
            continue
        for q in range(prof_place_off[p], prof_place_off[p] + prof_place_len[p]):
            if not (place_mask[q] & occupied):
                cprof[ncand] = p
                cplace[ncand] = <int> q
                cmask[ncand] = place_mask[q]
                csize[ncand] = popcount64(place_mask[q])
                ncand += 1
    if ncand == 0:
        return 0
    if want > MAX_MIG_INSTANCES:
        want = MAX_MIG_INSTANCES
    mig_search(cmask, csize, ncand, 0, occupied, 0, want, chosen, best, &best_len, &budget)
    for a in range(best_len):
        plan_prof[a] = cprof[best[a]]
        plan_place[a] = cplace[best[a]]
    return best_len


cdef Py_ssize_t topology_pick(int *picked, long long *picked_mem, int *picked_prof, int *picked_place,
                              Py_ssize_t npicked, int nums, const int[::1] pair_score, int poff,
                              Py_ssize_t n, int *combo, int *best_combo) noexcept nogil:
    """reference_fit.topology_pick: keep the best-connected ``nums`` of the picked devices, in place."""
    cdef Py_ssize_t i, j, best_i = 0, weighed = 0
    cdef long long total, best_total = 0
    cdef bint found = False
    if nums == 1:
        for i in range(npicked):
            total = 0
            for j in range(npicked):
                if picked[j] != picked[i]:
                    total += pair(pair_score, poff, n, picked[i], picked[j])
            if not found or total < best_total:
                found = True
                best_total = total
                best_i = i
        best_combo[0] = <int> best_i
    else:
        # Combinations of positions into picked[], in lexicographic order.
        for i in range(nums):
            combo[i] = <int> i
        while True:
            total = 0
            for i in range(nums):
                for j in range(i + 1, nums):
                    total += pair(pair_score, poff, n, picked[combo[i]], picked[combo[j]])
            if not found or total > best_total:
                found = True
                best_total = total
                for i in range(nums):
                    best_combo[i] = combo[i]
            weighed += 1
            if weighed == MAX_TOPOLOGY_COMBOS:
                break
            i = nums - 1
            while i >= 0 and combo[i] == npicked - nums + i:
                i -= 1
            if i < 0:
                break
            combo[i] += 1
            for j in range(i + 1, nums):
                combo[j] = combo[j - 1] + 1
    # best_combo is increasing, so compacting in place never overwrites an unread entry.
    for i in range(nums):
        picked[i] = picked[best_combo[i]]
        picked_mem[i] = picked_mem[best_combo[i]]
        picked_prof[i] = picked_prof[best_combo[i]]
        picked_place[i] = picked_place[best_combo[i]]
    return nums


cdef int run_chooser(object choosers, int v, Py_ssize_t ni, int nums, int *picked, long long *picked_mem,
                     int *picked_prof, int *picked_place, Py_ssize_t npicked, double *delta,
                     list errors) noexcept with gil:
    """reference_fit.choose: 0 with ``picked[:nums]`` rewritten to the chooser's picks (in its order)
    and ``delta`` set, or the reason code it refused the node with; -1 when it raised (a bad
    answer is a ValueError), the exception then in ``errors`` for filter_nodes to raise once its
    buffers are freed (a try/finally around the hot loop costs it a few per cent)."""
    try:
        return choose(choosers, v, ni, nums, picked, picked_mem, picked_prof, picked_place, npicked, delta)
    except BaseException as exc:
        errors.append(exc)
        return -1


cdef int choose(object choosers, int v, Py_ssize_t ni, int nums, int *picked, long long *picked_mem,
                int *picked_prof, int *picked_place, Py_ssize_t npicked, double *delta) except -1:
    cdef Py_ssize_t i, t
    chooser = choosers[v] if v < len(choosers) else None
    if chooser is None:
        raise ValueError(f"vendor id {v} has FLAG_CHOOSE but the query carries no chooser for it")
    positions = [picked[i] for i in range(npicked)]
    answer = chooser(ni, positions, nums)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 < answer < N_DEVICE_REASONS:
            raise ValueError(f"chooser of vendor id {v} answered reason {answer}, not a device reason code")
        return answer
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ValueError(f"chooser of vendor id {v} answered {answer!r}, not (positions, score delta) or a reason")
    chosen, py_delta = answer
    by_position = {picked[i]: i for i in range(npicked)}
    chosen = list(chosen)
    if (len(chosen) != nums or len(set(chosen)) != nums
            or not all(type(p) is int and p in by_position for p in chosen)):
        raise ValueError(f"chooser of vendor id {v} chose {chosen!r}: not {nums} distinct positions of {positions}")
    delta[0] = float(py_delta)
    entries = [(picked[i], picked_mem[i], picked_prof[i], picked_place[i]) for i in range(npicked)]
    for t in range(nums):
        picked[t], picked_mem[t], picked_prof[t], picked_place[t] = entries[by_position[chosen[t]]]
    return 0


cdef int run_charger(object chargers, int v, Py_ssize_t ni, Py_ssize_t r, int *memreq, int *cores, int *slots,
                     int *nums, list errors) noexcept with gil:
    """reference_fit.charge: 0 with ``memreq``/``cores``/``slots`` set to what one device of the row
    costs on node ``ni`` (row ``r``) and ``nums`` to the devices it takes there, or the reason code the
    charger refused the node with; -1 when it raised (the exception then in ``errors``, as run_chooser)."""
    try:
        return charge(chargers, v, ni, r, memreq, cores, slots, nums)
    except BaseException as exc:
        errors.append(exc)
        return -1


cdef int charge(object chargers, int v, Py_ssize_t ni, Py_ssize_t r, int *memreq, int *cores, int *slots,
                int *nums) except -1:
    charger = chargers[v] if v < len(chargers) else None
    if charger is None:
        raise ValueError(f"vendor id {v} has FLAG_CHARGE but the query carries no charger for it")
    answer = charger(ni, r)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 < answer < N_DEVICE_REASONS:
            raise ValueError(f"charger of vendor id {v} answered reason {answer}, not a device reason code")
        return answer
    if (not isinstance(answer, tuple) or not 3 <= len(answer) <= 4
            or not all(type(x) is int for x in answer)
            or not (0 <= answer[0] <= 2147483647 and 0 <= answer[1] <= 100 and 1 <= answer[2] <= 2147483647)
            or (len(answer) == 4 and not 1 <= answer[3] <= nums[0])):
        raise ValueError(f"charger of vendor id {v} answered {answer!r}, not (memory, cores, slots), "
                         f"(memory, cores, slots, devices <= {nums[0]}) or a reason")
    memreq[0] = answer[0]
    cores[0] = answer[1]
    slots[0] = answer[2]
    if len(answer) == 4:
        nums[0] = answer[3]
    return 0


cdef inline int slot_reason(long long count, long long used, int first_slots, bint exclusive,
                            bint mutex) noexcept nogil:
    """The walk's first device tests, before the quota: a slot left (``first_slots`` of them for a
    FLAG_SLOTS_FIRST family), the exclusive and mutex rules. 0 when the device passes them."""
    if count - used < first_slots:
        if exclusive and used > 0:
            return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        return CARD_TIME_SLICING_EXHAUSTED
    if exclusive and used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if mutex and used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    return 0


cdef inline int share_reason(long long count, long long total_mem, long long total_cores, long long used,
                             long long used_mem, long long used_cores, long long mem, int cores, int slots,
                             bint free_cores, bint equal_share) noexcept nogil:
    """The walk's device tests after the quota: memory, cores, a partition's slots, equal
    shares, a whole card, compute units. 0 when the device takes the share."""
    if total_mem - used_mem < mem:
        return CARD_INSUFFICIENT_MEMORY
    if not free_cores and total_cores - used_cores < cores:
        return CARD_INSUFFICIENT_CORE
    if slots > 1 and count - used < slots:
        return CARD_TIME_SLICING_EXHAUSTED
    if equal_share and used > 0 and used_mem != used * mem:
        return CARD_NOT_FOUND_CUSTOM_FILTER_RULE
    if total_cores == 100 and cores == 100 and used > 0:
        return EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if not free_cores and total_cores != 0 and used_cores == total_cores and cores == 0:
        return CARD_COMPUTE_UNITS_EXHAUSTED
    return 0


def filter_nodes(table, query):
    """reference.filter_nodes: ``table`` has the columns of fit_query.TABLE_COLUMNS, ``query``
    is a fit_query.FitQuery whose out_* arrays receive the answer; returns the winner or -1."""
    # Typed views of every input and output, taken once.
    cdef const int[::1] total_mem = table.total_mem
    cdef const int[::1] total_cores = table.total_cores
    cdef const int[::1] count = table.count
    cdef const int[::1] numa = table.numa
    cdef const signed char[::1] health = table.health
    cdef const int[::1] vendor = table.vendor
    cdef const long long[::1] used_mem = table.used_mem
    cdef const long long[::1] used_cores = table.used_cores
    cdef const long long[::1] used = table.used
    cdef const int[::1] node_offset = table.node_offset
    cdef const int[::1] node_len = table.node_len
    cdef const int[::1] pair_score = table.pair_score
    cdef const int[::1] node_pair_offset = table.node_pair_offset
    cdef const signed char[::1] dev_mig = table.dev_mig
    cdef const long long[::1] mig_used = table.mig_used
    cdef const int[::1] mig_prof_off = table.mig_prof_off
    cdef const int[::1] mig_prof_len = table.mig_prof_len
    cdef const int[::1] prof_mem = table.prof_mem
    cdef const int[::1] prof_core = table.prof_core
    cdef const int[::1] prof_place_off = table.prof_place_off
    cdef const int[::1] prof_place_len = table.prof_place_len
    cdef const long long[::1] place_mask = table.place_mask
    cdef const int[::1] candidates = query.candidates
    cdef const int[::1] rows = query.rows
    cdef const signed char[::1] mask = query.mask
    cdef int node_policy = query.node_policy
    cdef int gpu_policy = query.gpu_policy
    cdef int numa_bind = query.numa_bind
    cdef int mutex = query.mutex
    cdef double w_slot = query.w_slot
    cdef double w_core = query.w_core
    cdef double w_mem = query.w_mem
    cdef const long long[::1] quota_mem = query.quota_mem
    cdef const long long[::1] quota_cores = query.quota_cores
    cdef int topology = query.topology
    cdef int mig_ok = query.mig_ok
    cdef const int[::1] vendor_flags = query.vendor_flags
    cdef object choosers = query.choosers
    cdef object chargers = query.chargers
    cdef int[::1] out_status = query.out_status
    cdef int[::1] out_reasons = query.out_reasons
    cdef int[::1] out_total = query.out_total
    cdef double[::1] out_score = query.out_score
    cdef int[::1] out_row = query.out_row
    cdef int[::1] out_dev = query.out_dev
    cdef long long[::1] out_mem = query.out_mem
    cdef int[::1] out_cores = query.out_cores
    cdef int[::1] out_prof = query.out_prof
    cdef int[::1] out_place = query.out_place
    cdef int[::1] out_slots = query.out_slots
    cdef int[::1] out_count = query.out_count
    cdef const int[::1] prof_rank = query.prof_rank

    cdef Py_ssize_t n_rows = rows.shape[0] // ROW_WIDTH
    cdef Py_ssize_t n_cand = candidates.shape[0]
    cdef bint has_mask = mask.shape[0] > 0
    cdef Py_ssize_t max_len = 0, total_nums = 0
    cdef Py_ssize_t c, j, k, r, i, n, off, ni, base, ncands, npicked, nchosen, a, b, kk
    for c in range(n_cand):
        if candidates[c] >= 0 and node_len[candidates[c]] > max_len:
            max_len = node_len[candidates[c]]
    cdef int row_vendor
    cdef bint any_quota = False      # a row's vendor has a quota: the pod's charge is kept per node
    cdef bint has_mig_table = prof_mem.shape[0] > 0
    for r in range(n_rows):
        total_nums += rows[r * ROW_WIDTH + ROW_NUMS]
        # Per-vendor arrays are indexed by the rows' vendor ids unchecked below.
        row_vendor = rows[r * ROW_WIDTH + ROW_VENDOR]
        if (row_vendor < 0 or row_vendor >= vendor_flags.shape[0] or row_vendor >= quota_mem.shape[0]
                or row_vendor >= quota_cores.shape[0]):
            raise ValueError(f"request row {r} names vendor id {row_vendor}, beyond the query's per-vendor arrays")
        if quota_mem[row_vendor] != UNLIMITED or quota_cores[row_vendor] != UNLIMITED:
            any_quota = True
    if max_len == 0:
        max_len = 1
    # A MIG GPU can give one container several instances (at most one per slice, and a mask has
    # 64), so a row may pick more entries than the node has devices: size the pick buffers for it.
    cdef Py_ssize_t pick_cap = max_len * 65 + total_nums + 1
    cdef Py_ssize_t chosen_cap = total_nums if total_nums > 0 else 1
    # One block per element type; freed once at the end (and on the allocation-failure path).
    cdef long long *lscratch = <long long *> malloc((max_len * L_COLS + pick_cap) * sizeof(long long))
    cdef int *iscratch = <int *> malloc((max_len + 5 * pick_cap) * sizeof(int))
    cdef double *score = <double *> malloc(2 * max_len * sizeof(double))   # and fcost

    cdef int *ch_row = <int *> malloc(chosen_cap * 6 * sizeof(int))
    cdef long long *ch_mem = <long long *> malloc(chosen_cap * sizeof(long long))
    if lscratch == NULL or iscratch == NULL or score == NULL or ch_row == NULL or ch_mem == NULL:
        free(lscratch); free(iscratch); free(score); free(ch_row); free(ch_mem)
        raise MemoryError()
    cdef double *fcost = score + max_len
    cdef bint frag_key = has_key(gpu_policy, KEY_FRAG)
    # Whether the device order reads the per-device score (mutex and a chain of numa/frag keys do not).
    cdef bint score_key = (has_key(gpu_policy, KEY_BINPACK) or has_key(gpu_policy, KEY_SPREAD)
                           or (gpu_policy < ORDER_CHAIN and gpu_policy != ORDER_MUTEX))
    cdef double delta_sum, stranded_sum, fill, tmp_f
    cdef long long lost, before_w, after_w, f_mem, f_tm
    cdef Py_ssize_t e
    cdef long long *app_used = lscratch + L_APP_USED * max_len
    cdef long long *app_mem = lscratch + L_APP_MEM * max_len
    cdef long long *app_cores = lscratch + L_APP_CORES * max_len
    cdef long long *app_mig = lscratch + L_APP_MIG * max_len
    cdef long long *ini_used = lscratch + L_INI_USED * max_len
    cdef long long *ini_mem = lscratch + L_INI_MEM * max_len
    cdef long long *ini_cores = lscratch + L_INI_CORES * max_len
    cdef long long *ini_mig = lscratch + L_INI_MIG * max_len
    cdef long long *q_init_mem = lscratch + L_Q_INIT_MEM * max_len
    cdef long long *q_init_cores = lscratch + L_Q_INIT_CORES * max_len
    cdef long long *q_app_mem = lscratch + L_Q_APP_MEM * max_len
    cdef long long *q_app_cores = lscratch + L_Q_APP_CORES * max_len
    cdef long long *picked_mem = lscratch + L_PICKED_MEM * max_len   # pick_cap long (the tail)
    cdef int *cand = iscratch                                         # max_len
    cdef int *picked = iscratch + max_len                             # pick_cap each from here
    cdef int *picked_prof = picked + pick_cap
    cdef int *picked_place = picked_prof + pick_cap
    cdef int *combo = picked_place + pick_cap
    cdef int *best_combo = combo + pick_cap
    # MIG plans (mig_plan's scratch): only when the cluster has registered a MIG profile table.
    cdef int *mig_i = NULL
    cdef long long *mig_l = NULL
    cdef int *plan_prof = NULL
    cdef int *plan_place = NULL
    if prof_mem.shape[0] > 0:
        mig_i = <int *> malloc((prof_mem.shape[0] + 1 + 3 * (place_mask.shape[0] + 1) + 4 * MAX_MIG_INSTANCES)
                               * sizeof(int))
        mig_l = <long long *> malloc((place_mask.shape[0] + 1) * sizeof(long long))
        if mig_i == NULL or mig_l == NULL:
            free(lscratch); free(iscratch); free(score); free(ch_row); free(ch_mem); free(mig_i); free(mig_l)
            raise MemoryError()
        plan_prof = mig_i + prof_mem.shape[0] + 1 + 3 * (place_mask.shape[0] + 1) + 2 * MAX_MIG_INSTANCES
        plan_place = plan_prof + MAX_MIG_INSTANCES
    cdef int *ch_dev = ch_row + chosen_cap
    cdef int *ch_cores = ch_dev + chosen_cap
    cdef int *ch_prof = ch_cores + chosen_cap
    cdef int *ch_place = ch_prof + chosen_cap
    cdef int *ch_slots = ch_place + chosen_cap
    cdef int counts[N_DEVICE_REASONS]
    cdef long long *s_used
    cdef long long *s_mem
    cdef long long *s_cores
    cdef long long *s_mig
    cdef long long s_u, s_c, s_uc, s_tc, s_um, s_tm, mem, use_mem, use_cores
    cdef double node_score, best_score = 0.0, sc, tmp_s, delta
    cdef int best = -1, status, current_container, container, v, nums, memreq, mempct, cores
    cdef int need, prev_numa, m, tmp_k, is_init, prof, place, flags, refused, slots
    cdef int plan_len = 0, plan_pos = 0, first_slots
    cdef Py_ssize_t plan_k
    cdef long long qm, qc, tm, tc, add_m, add_c, tmp_u
    cdef bint mixed, first
    cdef bint better, any_mig, revisit, free_cores, exclusive, equal_share, choosing, collect_all, too_few
    cdef list errors = []
    # A pod that is one plain row (no chooser, charger, quota, NUMA binding, topology search or
    # fragmentation score): the shortcut above the walk applies (its comment says why).
    cdef bint quick = False
    cdef int q_v = 0, q_nums = 0, q_memreq = 0, q_mempct = 0, q_cores = 0, q_first_slots = 1
    cdef bint q_exclusive = False, q_equal_share = False, q_free_cores = False
    if n_rows == 1 and not any_quota and not numa_bind and not topology and node_policy != POLICY_FRAG:
        q_v = rows[ROW_VENDOR]
        flags = vendor_flags[q_v]
        if not (flags & (FLAG_CHOOSE | FLAG_CHARGE)):
            quick = True
            q_nums = rows[ROW_NUMS]
            q_memreq = rows[ROW_MEMREQ]
            q_mempct = rows[ROW_MEMPCT]
            q_cores = rows[ROW_CORESREQ]
            if q_cores > 100:
                q_cores = 100
            q_free_cores = q_cores < 0
            if q_free_cores:
                q_cores = 0
            q_exclusive = (flags & FLAG_EXCLUSIVE) != 0
            q_equal_share = (flags & FLAG_EQUAL_SHARE) != 0
            q_first_slots = 1   # slots is 1 without a charger
    with nogil:
        for c in range(n_cand):
            ni = candidates[c]
            if ni < 0:
                out_status[c] = NODE_UNREGISTERED
                out_score[c] = 0.0
                continue
            off = node_offset[ni]
            n = node_len[ni]
            s_u = 0; s_c = 0; s_uc = 0; s_tc = 0; s_um = 0; s_tm = 0
            ncands = 0
            npicked = 0
            any_mig = False
            # reference_fit's walk, for a pod that is one plain row (``quick``): each device's
            # verdict is its own (no quota, NUMA group, partition plan or earlier row links them),
            # so the node fits when enough devices pass, and a failing node's counts are the same
            # whatever the order. Devices are ordered and picked only where the node would become
            # the winner; elsewhere the outcome and the score are all there is to know. One pass
            # over the node: the score's sums, and for such a pod each device's verdict.
            if quick:
                memset(counts, 0, sizeof(counts))
            for k in range(n):
                j = off + k
                s_u += used[j]
                s_c += count[j]
                s_uc += used_cores[j]
                s_tc += total_cores[j]
                s_um += used_mem[j]
                s_tm += total_mem[j]
                if not quick or vendor[j] != q_v:
                    continue
                ncands += 1
                if dev_mig[j]:
                    any_mig = True
                if any_mig:
                    continue
                if not health[j]:
                    counts[CARD_NOT_HEALTH] += 1
                    continue
                m = mask[j] if has_mask else 0
                if m == 0:
                    m = slot_reason(count[j], used[j], q_first_slots, q_exclusive, mutex)
                if m == 0:
                    m = share_reason(count[j], total_mem[j], total_cores[j], used[j], used_mem[j], used_cores[j],
                                     resolve_mem(q_memreq, q_mempct, total_mem[j]), q_cores, 1, q_free_cores,
                                     q_equal_share)
                if m:
                    counts[m] += 1
                else:
                    npicked += 1
            if s_c == 0 or s_tc == 0 or s_tm == 0:
                node_score = 0.0
            else:
                node_score = 10.0 * (<double> s_u / s_c + <double> s_uc / s_tc + <double> s_um / s_tm)
            out_score[c] = node_score
            if quick and not any_mig:
                if q_nums > ncands:
                    out_status[c] = NODE_INSUFFICIENT_DEVICE
                    continue
                if npicked < q_nums:
                    if npicked > 0:
                        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += <int> npicked
                    out_status[c] = NODE_DEVICE_REASONS
                    for i in range(N_DEVICE_REASONS):
                        out_reasons[c * N_DEVICE_REASONS + i] = counts[i]
                    out_total[c] = <int> ncands
                    continue
                if best >= 0 and not (node_score < best_score if node_policy == POLICY_SPREAD
                                      else node_score > best_score):
                    out_status[c] = NODE_FIT
                    continue
            for k in range(n):      # the usage the pod's rows start from
                j = off + k
                app_used[k] = used[j]
                app_mem[k] = used_mem[j]
                app_cores[k] = used_cores[j]
            delta_sum = 0.0
            # Only a MIG plan reads the slices taken, and only a quota check the pod's own charge:
            # a filter with neither (the common one) leaves those columns alone.
            if has_mig_table:
                for k in range(n):
                    app_mig[k] = mig_used[off + k]
            if any_quota:
                for k in range(n):
                    q_init_mem[k] = 0
                    q_init_cores[k] = 0
                    q_app_mem[k] = 0
                    q_app_cores[k] = 0
            nchosen = 0
            status = NODE_FIT
            current_container = -1
            s_used = app_used; s_mem = app_mem; s_cores = app_cores; s_mig = app_mig
            for r in range(n_rows):
                base = r * ROW_WIDTH
                container = rows[base + ROW_CONTAINER]
                if rows[base + ROW_IS_INIT]:
                    # An ordinary init container runs alone, beside the pod's native sidecars
                    # started before it (KEP-753: rows of those are app rows, and come first):
                    # it sees the node as the app rows have left it so far.
                    if container != current_container:
                        for k in range(n):
                            ini_used[k] = app_used[k]
                            ini_mem[k] = app_mem[k]
                            ini_cores[k] = app_cores[k]
                        if has_mig_table:
                            for k in range(n):
                                ini_mig[k] = app_mig[k]
                    s_used = ini_used; s_mem = ini_mem; s_cores = ini_cores; s_mig = ini_mig
                else:
                    s_used = app_used; s_mem = app_mem; s_cores = app_cores; s_mig = app_mig
                current_container = container
                is_init = rows[base + ROW_IS_INIT]
                v = rows[base + ROW_VENDOR]
                qm = quota_mem[v]
                qc = quota_cores[v]
                nums = rows[base + ROW_NUMS]
                memreq = rows[base + ROW_MEMREQ]
                mempct = rows[base + ROW_MEMPCT]
                cores = rows[base + ROW_CORESREQ]
                if cores > 100:
                    cores = 100
                flags = vendor_flags[v]
                exclusive = (flags & FLAG_EXCLUSIVE) != 0
                equal_share = (flags & FLAG_EQUAL_SHARE) != 0
                choosing = (flags & FLAG_CHOOSE) != 0
                collect_all = topology or choosing   # every fitting device, not the first nums
                ncands = 0
                any_mig = False
                for k in range(n):
                    if vendor[off + k] == v:
                        cand[ncands] = <int> k
                        ncands += 1
                        if dev_mig[off + k]:
                            any_mig = True
                # Too few devices of the vendor: NODE_INSUFFICIENT_DEVICE, unless the row's charger
                # answers fewer devices on this node that it has (reference._fit_row: the rule).
                too_few = nums > ncands and not (mig_ok and any_mig)
                if too_few and not (flags & FLAG_CHARGE and ncands > 0):
                    status = NODE_INSUFFICIENT_DEVICE
                    break
                slots = 1
                if flags & FLAG_CHARGE:
                    # What one device of this row costs here (a partition's profile on this node),
                    # and how many devices the row takes here.
                    refused = run_charger(chargers, v, ni, r, &memreq, &cores, &slots, &nums, errors)
                    if refused < 0:
                        status = -1
                        break
                    if too_few and (refused or nums > ncands):
                        status = NODE_INSUFFICIENT_DEVICE
                        break
                    if refused:
                        status = NODE_DEVICE_REASONS
                        for i in range(N_DEVICE_REASONS):
                            out_reasons[c * N_DEVICE_REASONS + i] = 0
                        out_reasons[c * N_DEVICE_REASONS + refused] = 1
                        out_total[c] = <int> ncands
                        break
                    mempct = 0
                first_slots = slots if flags & FLAG_SLOTS_FIRST else 1
                # A negative core request takes no cores and skips every core check (a Metax
                # online sGPU task: its share is enforced on the device, not booked here).
                free_cores = cores < 0
                if free_cores:
                    cores = 0
                # The order's keys: the score with the request placed, the fragmentation cost. One
                # device needs no order, and an order without a score key never reads the score.
                for i in range(ncands if ncands > 1 else 0):
                    k = cand[i]
                    j = off + k
                    if not score_key or count[j] == 0 or total_cores[j] == 0 or total_mem[j] == 0:
                        score[i] = 0.0
                    else:
                        mem = resolve_mem(memreq, mempct, total_mem[j])
                        score[i] = 10.0 * (w_slot * ((<double> (1 + s_used[k])) / count[j])
                                           + w_core * ((<double> (cores + s_cores[k])) / total_cores[j])
                                           + w_mem * ((<double> (mem + s_mem[k])) / total_mem[j]))
                    if frag_key:
                        fcost[i] = frag_device_cost(total_mem[j], total_cores[j], count[j], s_used[k], s_mem[k],
                                                    s_cores[k], resolve_mem(memreq, mempct, total_mem[j]),
                                                    cores, slots)
                    else:
                        fcost[i] = 0.0
                # The walk's order is prefer()'s, a strict total order (the position breaks every
                # tie), so it is unique however it is reached. A collecting walk visits every
                # device: sort them all (insertion sort: nodes carry a handful of devices). Any
                # other walk usually stops after a device or two: it selects each position's
                # device as it gets there (below), n - 1 comparisons for a first device that fits.
                for i in range(1, ncands if collect_all else 0):
                    tmp_k = cand[i]
                    tmp_s = score[i]
                    tmp_f = fcost[i]
                    tmp_u = s_used[tmp_k]
                    k = i - 1
                    while k >= 0 and prefer(tmp_s, numa[off + tmp_k], tmp_k, tmp_u, tmp_f,
                                            score[k], numa[off + cand[k]], cand[k], s_used[cand[k]], fcost[k],
                                            gpu_policy, numa_bind):
                        cand[k + 1] = cand[k]
                        score[k + 1] = score[k]
                        fcost[k + 1] = fcost[k]
                        k -= 1
                    cand[k + 1] = tmp_k
                    score[k + 1] = tmp_s
                    fcost[k + 1] = tmp_f
                memset(counts, 0, sizeof(counts))
                plan_k = -1
                npicked = 0
                need = nums
                prev_numa = -1
                i = -1
                revisit = False
                while True:
                    if not revisit:
                        i += 1
                        if i >= ncands:
                            break
                        if not collect_all:
                            # Lazy selection: the most preferred of cand[i:] moves to position i.
                            e = i
                            for a in range(i + 1, ncands):
                                if prefer(score[a], numa[off + cand[a]], cand[a], s_used[cand[a]], fcost[a],
                                          score[e], numa[off + cand[e]], cand[e], s_used[cand[e]], fcost[e],
                                          gpu_policy, numa_bind):
                                    e = a
                            if e != i:
                                tmp_k = cand[i]; cand[i] = cand[e]; cand[e] = tmp_k
                                tmp_s = score[i]; score[i] = score[e]; score[e] = tmp_s
                                tmp_f = fcost[i]; fcost[i] = fcost[e]; fcost[e] = tmp_f
                    revisit = False
                    k = cand[i]
                    j = off + k
                    if not health[j]:
                        counts[CARD_NOT_HEALTH] += 1
                        continue
                    m = mask[j] if has_mask else 0
                    if m == CARD_CORDONED or m == CARD_TYPE_MISMATCH:
                        counts[m] += 1
                        continue
                    if numa_bind and numa[j] != prev_numa:
                        if collect_all and npicked >= nums:
                            break       # reference_fit.numa_group_done: the first NUMA node that holds the row
                        counts[NUMA_NOT_FIT] += <int> npicked
                        npicked = 0
                        plan_k = -1
                        need = nums
                        prev_numa = numa[j]
                    if m != 0:
                        counts[m] += 1
                        continue
                    # Upstream's first test is Count <= Used: is a slot left at all. A partition of several
                    # slices (slots > 1) is checked for all of them after memory and cores, so that a
                    # card too full for it is refused for its memory, as upstream v2.10 words it; a
                    # FLAG_SLOTS_FIRST family asks all of them here (first_slots).
                    m = slot_reason(count[j], s_used[k], first_slots, exclusive, mutex)
                    if m:
                        counts[m] += 1
                        continue
                    mem = resolve_mem(memreq, mempct, total_mem[j])
                    if qm != UNLIMITED or qc != UNLIMITED:
                        # The pod's charge if it also took this device: per device
                        # max(init peak, app sum) over this vendor's devices, picks included.
                        tm = 0
                        tc = 0
                        for a in range(ncands):
                            kk = cand[a]
                            add_m = 0
                            add_c = 0
                            for b in range(npicked):
                                if picked[b] == kk:
                                    add_m += picked_mem[b]
                                    add_c += cores
                            if kk == k:
                                add_m += mem
                                add_c += cores
                            # An init row's picks sit beside the sidecars' app sum so far.
                            tm += max(q_init_mem[kk], q_app_mem[kk] + add_m)
                            tc += max(q_init_cores[kk], q_app_cores[kk] + add_c)
                        if (qm != UNLIMITED and tm > qm) or (qc != UNLIMITED and tc > qc):
                            counts[RESOURCE_QUOTA_NOT_FIT] += 1
                            continue
                    m = share_reason(count[j], total_mem[j], total_cores[j], s_used[k], s_mem[k], s_cores[k], mem,
                                     cores, slots, free_cores, equal_share)
                    if m:
                        counts[m] += 1
                        continue
                    prof = -1
                    place = -1
                    if dev_mig[j]:
                        if plan_k != k:   # first arrival: plan the instances still needed here together
                            # (no profile table: no plan, and the slices taken were never copied)
                            plan_len = mig_plan(j, s_mig[k] if has_mig_table else 0, mem,
                                                nums if collect_all else need, mig_prof_off, mig_prof_len, prof_mem,
                                                prof_place_off, prof_place_len, place_mask, prof_rank, mig_i, mig_l,
                                                plan_prof, plan_place)
                            plan_k = k
                            plan_pos = 0
                        if plan_pos == plan_len:
                            counts[CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                            continue
                        prof = plan_prof[plan_pos]
                        place = plan_place[plan_pos]
                        plan_pos += 1
                        revisit = True
                    picked[npicked] = <int> k
                    picked_mem[npicked] = mem
                    picked_prof[npicked] = prof
                    picked_place[npicked] = place
                    npicked += 1
                    if not collect_all:
                        need -= 1
                        if need == 0:
                            break
                if collect_all and npicked >= nums:
                    if choosing:
                        refused = run_chooser(choosers, v, ni, nums, picked, picked_mem, picked_prof,
                                              picked_place, npicked, &delta, errors)
                        if refused < 0:   # the chooser raised: stop, and raise once freed
                            status = -1
                            break
                        if refused:   # the vendor refuses every subset: its reason
                            status = NODE_DEVICE_REASONS
                            for i in range(N_DEVICE_REASONS):
                                out_reasons[c * N_DEVICE_REASONS + i] = counts[i]
                            out_reasons[c * N_DEVICE_REASONS + refused] += 1
                            out_total[c] = <int> ncands
                            break
                        npicked = nums
                        node_score += delta
                        delta_sum += delta
                        out_score[c] = node_score
                    elif npicked > nums:
                        npicked = topology_pick(picked, picked_mem, picked_prof, picked_place, npicked,
                                                nums, pair_score, node_pair_offset[ni], n, combo,
                                                best_combo)
                    need = 0
                if need > 0:
                    if npicked > 0:
                        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += <int> npicked
                    status = NODE_DEVICE_REASONS
                    for i in range(N_DEVICE_REASONS):
                        out_reasons[c * N_DEVICE_REASONS + i] = counts[i]
                    out_total[c] = <int> ncands
                    break
                for i in range(npicked):
                    k = picked[i]
                    use_mem = picked_mem[i]
                    use_cores = cores
                    if picked_prof[i] >= 0:  # a MIG instance is charged as its profile
                        use_mem = prof_mem[picked_prof[i]]
                        use_cores = prof_core[picked_prof[i]]
                        s_mig[k] |= place_mask[picked_place[i]]
                    s_used[k] += slots
                    s_mem[k] += use_mem
                    s_cores[k] += use_cores
                    if not any_quota:
                        pass
                    elif is_init:     # beside the sidecars so far (the app sums, while init rows run)
                        q_init_mem[k] = max(q_init_mem[k], q_app_mem[k] + use_mem)
                        q_init_cores[k] = max(q_init_cores[k], q_app_cores[k] + use_cores)
                    else:
                        q_app_mem[k] += use_mem
                        q_app_cores[k] += use_cores
                    ch_row[nchosen] = <int> r
                    ch_dev[nchosen] = <int> (off + k)
                    ch_mem[nchosen] = use_mem
                    ch_cores[nchosen] = <int> use_cores
                    ch_prof[nchosen] = picked_prof[i]
                    ch_place[nchosen] = picked_place[i]
                    ch_slots[nchosen] = slots
                    nchosen += 1
            if status < 0:
                break
            out_status[c] = status
            if status != NODE_FIT:
                continue
            if node_policy == POLICY_FRAG:
                # kernel_frag.frag_node_score over the node before (the table) and after (app_*).
                lost = 0
                stranded_sum = 0.0
                f_mem = 0
                f_tm = 0
                before_w = 0
                after_w = 0
                mixed = False
                for k in range(n):      # one pass: memory, stranded memory, the whole devices of one family
                    j = off + k
                    f_mem += app_mem[k]
                    f_tm += total_mem[j]
                    stranded_sum += (stranded_fraction(total_mem[j], total_cores[j], count[j], app_used[k],
                                                       app_mem[k], app_cores[k])
                                     - stranded_fraction(total_mem[j], total_cores[j], count[j], used[j],
                                                         used_mem[j], used_cores[j]))
                    if vendor[j] != vendor[off]:
                        mixed = True
                    elif health[j]:
                        if used[j] == 0:
                            before_w += 1
                        if app_used[k] == 0:
                            after_w += 1
                lost = before_w * before_w - after_w * after_w
                if mixed:               # several families on the node: each one's own square
                    lost = 0
                    for k in range(n):
                        j = off + k
                        first = True       # the first device of its family on this node
                        for e in range(k):
                            if vendor[off + e] == vendor[j]:
                                first = False
                                break
                        if first:
                            before_w = 0
                            after_w = 0
                            for e in range(k, n):
                                if vendor[off + e] == vendor[j] and health[off + e]:
                                    if used[off + e] == 0:
                                        before_w += 1
                                    if app_used[e] == 0:
                                        after_w += 1
                            lost += before_w * before_w - after_w * after_w
                fill = (<double> f_mem) / f_tm if f_tm > 0 else 0.0
                node_score = fill / 10.0 - (2.0 * lost + stranded_sum) + delta_sum
                out_score[c] = node_score
            if best < 0:
                better = True
            elif node_policy == POLICY_SPREAD:
                better = node_score < best_score
            else:
                better = node_score > best_score
            if better:
                best = <int> c
                best_score = node_score
                for i in range(nchosen):
                    out_row[i] = ch_row[i]
                    out_dev[i] = ch_dev[i]
                    out_mem[i] = ch_mem[i]
                    out_cores[i] = ch_cores[i]
                    out_prof[i] = ch_prof[i]
                    out_place[i] = ch_place[i]
                    out_slots[i] = ch_slots[i]
                out_count[0] = <int> nchosen
    free(lscratch); free(iscratch); free(score); free(ch_row); free(ch_mem); free(mig_i); free(mig_l)
    if errors:
        raise errors[0]
    return best


def best_fit_nodes(const int[::1] status, const double[::1] score, Py_ssize_t k, bint spread):
    """``(fitting nodes, indexes of the k best of them, best first)``: best is the highest score
    (binpack) or the lowest (spread), the earlier candidate on a tie, as the kernel's own choice.
    Same as ``reference.best_fit_nodes``. An insertion-sorted buffer of k: O(n) for small k."""
    cdef Py_ssize_t n = status.shape[0], c, i, kept = 0, fit = 0
    cdef double s
    if k <= 0:
        for c in range(n):
            if status[c] == NODE_FIT:
                fit += 1
        return fit, []
    cdef Py_ssize_t *buf = <Py_ssize_t *> malloc(k * sizeof(Py_ssize_t))
    if buf == NULL:
        raise MemoryError()
    try:
        for c in range(n):
            if status[c] != NODE_FIT:
                continue
            fit += 1
            s = score[c]
            if kept == k:
                # Not better than the worst kept (an equal score loses: it came later).
                if (spread and s >= score[buf[k - 1]]) or (not spread and s <= score[buf[k - 1]]):
                    continue
                kept -= 1
            i = kept
            while i > 0 and ((spread and s < score[buf[i - 1]]) or (not spread and s > score[buf[i - 1]])):
                buf[i] = buf[i - 1]
                i -= 1
            buf[i] = c
            kept += 1
        return fit, [buf[i] for i in range(kept)]
    finally:
        free(buf)

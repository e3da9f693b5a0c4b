"""The Cython kernel must decide exactly what the plain-Python reference decides.

hypothesis builds random clusters (healthy and sick devices, partial usage, several vendors, NUMA
nodes), random pods (init and app containers, counts, memory, percentages, cores) and random
policies, and both implementations must agree on every output. The strategies lean towards roomy
nodes and modest pods so that a good share of examples (about 40 %; see the "placed" event with
``--hypothesis-show-statistics``) compare a real allocation rather than a refusal, while full, sick,
masked, MIG and over-quota devices stay in the mix; a second property places pods that always fit.
"""
from array import array

from hypothesis import event, given, settings, strategies as st

from hami_py import _kernel
from hami_py import reasons as R
from hami_py.scheduling import kernel_ref
from hami_py.scheduling.kernel_ref import (
    KEY_BINPACK, KEY_NUMA, KEY_SPREAD, ORDER_BINPACK, ORDER_CHAIN, ORDER_MUTEX, ORDER_SPREAD, ROW_WIDTH,
    UNLIMITED,
)


# name: (memory MiB, cores, slices, placement starts in try order, size)
MIG_CATALOG = {
    "1g.5gb": (4864, 14, 1, [6, 5, 4, 3, 2, 1, 0], 1),
    "2g.10gb": (9856, 28, 2, [0, 2, 4], 2),
    "3g.20gb": (19968, 42, 4, [4, 0], 4),
    "7g.40gb": (40192, 100, 8, [0], 8),
}


@st.composite
def clusters(draw):
    n_nodes = draw(st.sampled_from([2, 1, 3, 4, 5, 6]))
    cols = {k: [] for k in ("total_mem", "total_cores", "count", "numa", "health", "vendor",
                            "used_mem", "used_cores", "used")}
    node_offset, node_len = [], []
    for _ in range(n_nodes):
        n = draw(st.sampled_from([4, 0, 1, 2, 3, 4, 5, 6, 7, 8]))   # first: the simplest example hypothesis draws
        node_offset.append(len(cols["total_mem"]))
        node_len.append(n)
        # Most nodes have room, so that a good share of pods fit and the allocations get compared;
        # the others mix in (or hold only) devices in any state, the extremes included.
        mood = draw(st.sampled_from(["roomy", "roomy", "mixed", "mixed", "anything"]))
        for _ in range(n):
            if mood == "roomy" or (mood == "mixed" and draw(st.booleans())):
                # A roomy device: healthy, with slots, memory and cores left.
                tm = draw(st.sampled_from([16384, 40960, 81920, 143771]))
                tc = draw(st.sampled_from([100, 100, 200]))
                cnt = draw(st.sampled_from([4, 10]))
                health = 1
                used = draw(st.sampled_from([0, 0, 1, cnt // 2]))
                used_mem = draw(st.sampled_from([0, 0, tm // 4, tm // 2]))
                used_cores = draw(st.sampled_from([0, 0, tc // 4, tc // 2]))
            else:
                # Anything, the extremes included: no memory or cores, no slots, full, over-full, sick.
                tm = draw(st.sampled_from([0, 1024, 16384, 40960, 81920, 143771]))
                tc = draw(st.sampled_from([0, 50, 100, 100, 200]))
                cnt = draw(st.integers(0, 10))
                health = draw(st.sampled_from([1, 1, 0]))
                used = draw(st.sampled_from([0, cnt // 2, cnt, cnt + 1]) | st.integers(0, cnt + 1))
                used_mem = draw(st.sampled_from([0, tm // 2, tm]) | st.integers(0, tm))
                used_cores = draw(st.sampled_from([0, tc // 2, tc]) | st.integers(0, tc))
            cols["total_mem"].append(tm)
            cols["total_cores"].append(tc)
            cols["count"].append(cnt)
            cols["numa"].append(draw(st.sampled_from([0, 0, 0, 1, 2])))
            cols["health"].append(health)
            cols["vendor"].append(draw(st.sampled_from([0, 0, 1])))
            cols["used"].append(used)
            cols["used_mem"].append(used_mem)
            cols["used_cores"].append(used_cores)
    candidates = draw(st.permutations(range(n_nodes)).map(list)
                      | st.lists(st.integers(0, n_nodes - 1), min_size=1, max_size=n_nodes, unique=True))
    # Pair scores (NVLink topology): an n x n block per node, or none (-1).
    pair_score, node_pair_offset = [], []
    for n in node_len:
        if draw(st.booleans()):
            node_pair_offset.append(len(pair_score))
            pair_score += draw(st.lists(st.sampled_from([0, 10, 20, 100, 200, 600]), min_size=n * n, max_size=n * n))
        else:
            node_pair_offset.append(-1)
    cols["pair_score"] = pair_score
    cols["node_pair_offset"] = node_pair_offset
    # MIG: some devices hand out instances of an A100-like profile table.
    mig = {k: [] for k in ("dev_mig", "mig_used", "mig_prof_off", "mig_prof_len", "prof_mem", "prof_core",
                           "prof_place_off", "prof_place_len", "place_mask")}
    for _ in range(len(cols["total_mem"])):
        is_mig = draw(st.sampled_from([0, 0, 0, 0, 1]))
        mig["dev_mig"].append(is_mig)
        mig["mig_used"].append(draw(st.sampled_from([0, 0, 0b1, 0b11110000, 0b1111, 0xFF])) if is_mig else 0)
        mig["mig_prof_off"].append(len(mig["prof_mem"]))
        profiles = draw(st.lists(st.sampled_from(list(MIG_CATALOG)), unique=True, max_size=4)) if is_mig else []
        profiles.sort(key=lambda name: (MIG_CATALOG[name][0], MIG_CATALOG[name][2]))
        mig["mig_prof_len"].append(len(profiles))
        for name in profiles:
            mem, core, _, starts, size = MIG_CATALOG[name]
            mig["prof_mem"].append(mem)
            mig["prof_core"].append(core)
            mig["prof_place_off"].append(len(mig["place_mask"]))
            mig["prof_place_len"].append(len(starts))
            mig["place_mask"] += [((1 << size) - 1) << st_ for st_ in starts]
    cols.update(mig)
    if draw(st.booleans()):
        candidates.insert(draw(st.integers(0, len(candidates))), -1)  # a name the cache does not know
    return cols, node_offset, node_len, candidates


@st.composite
def pods(draw):
    n_init = draw(st.sampled_from([0, 0, 1, 2]))
    n_app = draw(st.sampled_from([1, 1, 2, 3]))
    # Most pods ask for modest shares; the others for anything (whole GPUs, more than a GPU has...).
    modest = draw(st.sampled_from([True, True, False]))
    if modest:
        nums, memreqs, mempcts, cores = [1, 1, 2], [0, 1000, 4096], [101, 101, 10], [0, 10, 30]
    else:
        nums, memreqs = [1, 2, 3, 4], [0, 1000, 4096, 20000, 90000]
        mempcts, cores = [101, 10, 50, 100], [0, 10, 30, 100, 150]
    rows = []
    for c in range(n_init + n_app):
        # The first app container always asks for a device (a pod that asks for nothing fits
        # anywhere without exercising the device fit); the others often ask for nothing.
        if c == n_init:
            vendors = draw(st.sampled_from([[0], [0], [0], [1], [0, 1]]))
        else:
            vendors = draw(st.sampled_from([[], [], [], [0], [1], [0, 1]]))
        for vendor in vendors:
            rows += [c, int(c < n_init), vendor, draw(st.sampled_from(nums)), draw(st.sampled_from(memreqs)),
                     draw(st.sampled_from(mempcts)), draw(st.sampled_from(cores))]
    return rows


def _limits(choices):
    """Per-vendor quota headroom: mostly none (UNLIMITED), sometimes tight for one or both vendors."""
    return st.sampled_from([UNLIMITED] * 3 + choices)


quota_headroom = st.one_of(
    st.just(([UNLIMITED] * 2, [UNLIMITED] * 2)),
    st.just(([UNLIMITED] * 2, [UNLIMITED] * 2)),
    st.tuples(st.lists(_limits([-1, 0, 5000, 50000, 200000]), min_size=2, max_size=2),
              st.lists(_limits([0, 50, 150]), min_size=2, max_size=2)),
)


def _outcome(best, out):
    """hypothesis.event label: how the pod came out (run with --hypothesis-show-statistics)."""
    if best >= 0:
        return "placed"
    status = out["status"]
    if R.NODE_DEVICE_REASONS in status:
        return "no fit: device reasons"
    if R.NODE_INSUFFICIENT_DEVICE in status:
        return "no fit: too few devices"
    return "no fit: no known node"


gpu_orders = st.sampled_from([ORDER_BINPACK, ORDER_SPREAD, ORDER_MUTEX,
                              ORDER_CHAIN + KEY_NUMA + 4 * KEY_BINPACK,
                              ORDER_CHAIN + KEY_SPREAD + 4 * KEY_NUMA,
                              ORDER_CHAIN + KEY_BINPACK + 4 * KEY_SPREAD + 16 * KEY_NUMA])


def _run(impl, cols, node_offset, node_len, candidates, rows, mask, policies, quotas, topology=0, mig_ok=1):
    n_cand = len(candidates)
    total_nums = sum(rows[i * ROW_WIDTH + 3] for i in range(len(rows) // ROW_WIDTH))
    out = {
        "status": array("i", [0] * n_cand),
        "reasons": array("i", [0] * (n_cand * R.N_DEVICE_REASONS)),
        "total": array("i", [0] * n_cand),
        "score": array("d", [0.0] * n_cand),
        "row": array("i", [0] * max(total_nums, 1)),
        "dev": array("i", [0] * max(total_nums, 1)),
        "mem": array("q", [0] * max(total_nums, 1)),
        "cores": array("i", [0] * max(total_nums, 1)),
        "prof": array("i", [0] * max(total_nums, 1)),
        "place": array("i", [0] * max(total_nums, 1)),
    }
    best = impl(
        array("i", cols["total_mem"]), array("i", cols["total_cores"]), array("i", cols["count"]),
        array("i", cols["numa"]), array("b", cols["health"]), array("i", cols["vendor"]),
        array("q", cols["used_mem"]), array("q", cols["used_cores"]), array("q", cols["used"]),
        array("i", node_offset), array("i", node_len), array("i", candidates),
        array("i", rows), array("b", mask), *policies,
        array("q", quotas[0]), array("q", quotas[1]),
        topology, array("i", cols.get("pair_score", [])), array("i", cols.get("node_pair_offset", [-1] * len(node_len))),
        mig_ok, array("b", cols["dev_mig"]), array("q", cols["mig_used"]), array("i", cols["mig_prof_off"]),
        array("i", cols["mig_prof_len"]), array("i", cols["prof_mem"]), array("i", cols["prof_core"]),
        array("i", cols["prof_place_off"]), array("i", cols["prof_place_len"]), array("q", cols["place_mask"]),
        out["status"], out["reasons"], out["total"], out["score"],
        out["row"], out["dev"], out["mem"], out["cores"], out["prof"], out["place"],
    )
    result = {k: list(v) for k, v in out.items()}
    if best < 0:  # the allocation buffers are only meaningful for a winner
        for k in ("row", "dev", "mem", "cores", "prof", "place"):
            result.pop(k)
    return best, result


@settings(max_examples=400, deadline=None)
@given(
    cluster=clusters(),
    rows=pods(),
    node_policy=st.sampled_from([0, 1]),
    gpu_policy=gpu_orders,
    numa_bind=st.sampled_from([0, 0, 1]),
    mutex=st.sampled_from([0, 0, 0, 1]),
    topology=st.sampled_from([0, 0, 1]),
    mig_ok=st.sampled_from([1, 1, 0]),
    quotas=quota_headroom,
    weights=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    mask_seed=st.none() | st.lists(st.sampled_from([0] * 15 + [R.CARD_CORDONED, R.CARD_TYPE_MISMATCH,
                                                               R.CARD_UUID_MISMATCH]), min_size=64, max_size=64),
)
def test_cython_kernel_matches_reference(cluster, rows, node_policy, gpu_policy, numa_bind, mutex, topology,
                                         mig_ok, quotas, weights, mask_seed):
    cols, node_offset, node_len, candidates = cluster
    n_dev = len(cols["total_mem"])
    mask = [] if mask_seed is None else mask_seed[:n_dev] + [0] * max(0, n_dev - 64)
    policies = (node_policy, gpu_policy, numa_bind, mutex, float(weights[0]), float(weights[1]), float(weights[2]))
    args = (cols, node_offset, node_len, candidates, rows, mask, policies, quotas, topology, mig_ok)
    best, out = _run(_kernel.filter_nodes, *args)
    event(_outcome(best, out))
    assert (best, out) == _run(kernel_ref.filter_nodes, *args)


@st.composite
def idle_clusters(draw):
    """Idle nodes (no MIG, nothing used) with at least 4 healthy devices of each vendor on one NUMA node."""
    n_nodes = draw(st.integers(1, 4))
    cols = {k: [] for k in ("total_mem", "total_cores", "count", "numa", "health", "vendor",
                            "used_mem", "used_cores", "used", "dev_mig", "mig_used", "mig_prof_off", "mig_prof_len")}
    node_offset, node_len, pair_score, node_pair_offset = [], [], [], []
    for _ in range(n_nodes):
        vendors = draw(st.permutations([0] * draw(st.integers(4, 6)) + [1] * draw(st.integers(4, 6))))
        numa = draw(st.integers(0, 1))
        node_offset.append(len(cols["total_mem"]))
        node_len.append(len(vendors))
        for v in vendors:
            for k, val in (("total_mem", draw(st.sampled_from([40960, 81920]))), ("total_cores", 100), ("count", 10),
                           ("numa", numa), ("health", 1), ("vendor", v), ("used_mem", 0), ("used_cores", 0),
                           ("used", 0), ("dev_mig", 0), ("mig_used", 0), ("mig_prof_off", 0), ("mig_prof_len", 0)):
                cols[k].append(val)
        if draw(st.booleans()):
            node_pair_offset.append(len(pair_score))
            pair_score += draw(st.lists(st.sampled_from([0, 10, 100, 600]), min_size=len(vendors) ** 2,
                                        max_size=len(vendors) ** 2))
        else:
            node_pair_offset.append(-1)
    cols.update(pair_score=pair_score, node_pair_offset=node_pair_offset, prof_mem=[], prof_core=[],
                prof_place_off=[], prof_place_len=[], place_mask=[])
    candidates = draw(st.permutations(range(n_nodes)).map(list))
    if draw(st.booleans()):
        candidates.insert(draw(st.integers(0, len(candidates))), -1)
    return cols, node_offset, node_len, candidates


@st.composite
def small_pods(draw):
    """Pods that fit an idle node of ``idle_clusters``: at most 4 devices a request, and the app
    containers together take at most 3 x 25 % of a device's memory and 90 of its cores."""
    n_init = draw(st.integers(0, 2))
    n_app = draw(st.integers(1, 3))
    rows = []
    for c in range(n_init + n_app):
        vendors = draw(st.lists(st.sampled_from([0, 1]), min_size=int(c == n_init), max_size=2, unique=True))
        for vendor in vendors:
            memreq = draw(st.sampled_from([0, 1000, 4096, 10000]))
            mempct = draw(st.sampled_from([101, 10, 25]))
            rows += [c, int(c < n_init), vendor, draw(st.integers(1, 4)), memreq, mempct,
                     draw(st.sampled_from([0, 10, 30]))]
    return rows


@settings(max_examples=200, deadline=None)
@given(cluster=idle_clusters(), rows=small_pods(), node_policy=st.sampled_from([0, 1]), gpu_policy=gpu_orders,
       numa_bind=st.sampled_from([0, 1]), topology=st.sampled_from([0, 1]), mig_ok=st.sampled_from([0, 1]),
       weights=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)))
def test_cython_kernel_places_a_fitting_pod_as_the_reference_does(cluster, rows, node_policy, gpu_policy, numa_bind,
                                                                   topology, mig_ok, weights):
    """Every pod here fits, so every example compares a real allocation, device by device."""
    cols, node_offset, node_len, candidates = cluster
    policies = (node_policy, gpu_policy, numa_bind, 0, float(weights[0]), float(weights[1]), float(weights[2]))
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    args = (cols, node_offset, node_len, candidates, rows, [], policies, unlimited, topology, mig_ok)
    best, out = _run(_kernel.filter_nodes, *args)
    assert (best, out) == _run(kernel_ref.filter_nodes, *args)
    assert best >= 0 and out["status"][best] == R.NODE_FIT
    node = candidates[best]
    n_rows = len(rows) // ROW_WIDTH
    assert out["row"] == [r for r in range(n_rows) for _ in range(rows[r * ROW_WIDTH + 3])]
    for i, r in enumerate(out["row"]):
        _, _, vendor, _, memreq, mempct, cores = rows[r * ROW_WIDTH:(r + 1) * ROW_WIDTH]
        dev = out["dev"][i]
        assert node_offset[node] <= dev < node_offset[node] + node_len[node]   # on the winning node
        assert cols["vendor"][dev] == vendor
        assert out["mem"][i] == kernel_ref.resolve_mem(memreq, mempct, cols["total_mem"][dev])
        assert out["cores"][i] == cores and out["prof"][i] == -1 and out["place"][i] == -1
    for r in range(n_rows):   # a request's devices are distinct
        devs = [d for d, rr in zip(out["dev"], out["row"]) if rr == r]
        assert len(set(devs)) == len(devs)


def _one_mig_gpu(mig_used=0):
    starts = MIG_CATALOG["1g.5gb"][3]
    return {"total_mem": [40960], "total_cores": [100], "count": [10], "numa": [0], "health": [1], "vendor": [0],
            "used_mem": [0], "used_cores": [0], "used": [0], "dev_mig": [1], "mig_used": [mig_used],
            "mig_prof_off": [0], "mig_prof_len": [2], "prof_mem": [4864, 9856], "prof_core": [14, 28],
            "prof_place_off": [0, 7], "prof_place_len": [7, 3],
            "place_mask": [1 << s for s in starts] + [0b11 << s for s in (0, 2, 4)]}


def test_one_container_gets_several_instances_of_one_mig_gpu():
    """Inventory: mig-multi-instance. Upstream offers a MIG GPU again after each instance."""
    cols = _one_mig_gpu()
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    args = (cols, [0], [1], [0], [0, 0, 0, 3, 0, 101, 0], [], (0, 1, 0, 0, 1.0, 1.0, 1.0), unlimited, 0, 1)
    best, out = _run(_kernel.filter_nodes, *args)
    assert (best, out) == _run(kernel_ref.filter_nodes, *args)
    assert out["dev"] == [0, 0, 0] and out["prof"] == [0, 0, 0]
    assert out["place"] == [0, 1, 2]            # 1g placements tried from the top slice down
    assert out["mem"] == [4864] * 3 and out["cores"] == [14] * 3   # charged as the profile


def test_mig_request_without_a_free_placement_is_infeasible():
    cols = _one_mig_gpu(mig_used=0b1111111)      # the seven 1g slices are taken
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    args = (cols, [0], [1], [0], [0, 0, 0, 1, 4000, 101, 0], [], (0, 1, 0, 0, 1.0, 1.0, 1.0), unlimited, 0, 1)
    best, out = _run(_kernel.filter_nodes, *args)
    assert (best, out) == _run(kernel_ref.filter_nodes, *args)
    assert best == -1 and out["reasons"][R.CARD_MIG_TOPOLOGY_INFEASIBLE] == 1


def test_more_instances_than_gpus_only_for_mig_requests():
    cols = _one_mig_gpu()
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    rows = [0, 0, 0, 2, 0, 101, 0]
    for mig_ok, fits in ((1, True), (0, False)):
        args = (cols, [0], [1], [0], rows, [], (0, 1, 0, 0, 1.0, 1.0, 1.0), unlimited, 0, mig_ok)
        best, out = _run(_kernel.filter_nodes, *args)
        assert (best, out) == _run(kernel_ref.filter_nodes, *args)
        assert (best == 0) == fits
        if not fits:
            assert out["status"] == [R.NODE_INSUFFICIENT_DEVICE]


@settings(max_examples=400, deadline=None)
@given(nodes=st.lists(st.tuples(st.sampled_from([R.NODE_FIT, R.NODE_FIT, R.NODE_DEVICE_REASONS, R.NODE_UNREGISTERED]),
                                st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.25, -3.0, 1e9])), max_size=60),
       k=st.integers(0, 25), spread=st.booleans())
def test_best_fit_nodes_matches_the_reference(nodes, k, spread):
    """The FilteringSucceed event lists the k best fitting nodes; ties (common: identical nodes
    score alike) go to the earlier candidate, as the kernel's choice of winner does."""
    status = array("i", [s for s, _ in nodes])
    score = array("d", [v for _, v in nodes])
    fit, best = _kernel.best_fit_nodes(status, score, k, spread)
    assert (fit, best) == kernel_ref.best_fit_nodes(status, score, k, spread)
    assert fit == sum(s == R.NODE_FIT for s, _ in nodes) and len(best) == min(k, fit)

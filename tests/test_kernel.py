"""The Cython kernel must decide exactly what the plain-Python reference decides.

hypothesis builds random clusters (healthy and sick devices, partial usage, several vendors, NUMA
nodes), random pods (init and app containers, counts, memory, percentages, cores) and random
policies, and both implementations must agree on every output. The strategies lean towards roomy
nodes and modest pods so that a good share of examples (about 40 %; see the "placed" event with
``--hypothesis-show-statistics``) compare a real allocation rather than a refusal, while full, sick,
masked, MIG and over-quota devices stay in the mix; a second property places pods that always fit.
Device families' rules (exclusive devices, equal shares, a chooser that picks or refuses) are
drawn per vendor, and the chooser's calls are compared too.

The kernel's numbers are written once, in cython_core/kernel_codes.pxd: a test here reads that
file and fails when the Python side or the built kernel disagrees with it.
"""
import ast
import re
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import event, given, settings, strategies as st

from hami_py import _kernel, kernel_codes
from hami_py import reasons as R
from hami_py.cache import quota
from hami_py.devices import base
from hami_py.scheduling.kernel import reference as kernel_ref
from hami_py.scheduling.kernel import reference_fit
from hami_py.scheduling.kernel.fit_query import TABLE_COLUMNS, FitQuery
from hami_py.scheduling.kernel.reference import (
    CHAIN_BASE as B, FLAG_CHARGE, FLAG_CHOOSE, FLAG_EQUAL_SHARE, FLAG_EXCLUSIVE, FLAG_SLOTS_FIRST, KEY_BINPACK,
    KEY_FRAG, KEY_NUMA, KEY_SPREAD, ORDER_BINPACK, ORDER_CHAIN, ORDER_MUTEX, ORDER_SPREAD, POLICY_BINPACK,
    POLICY_FRAG, POLICY_SPREAD, ROW_WIDTH, UNLIMITED,
)

KERNEL_CODES = Path(__file__).resolve().parent.parent / "cython_core" / "kernel_codes.pxd"


# name: (memory MiB, cores, slices, placement starts in try order, size)
MIG_CATALOG = {
    "1g.5gb": (4864, 14, 1, [6, 5, 4, 3, 2, 1, 0], 1),
    "2g.10gb": (9856, 28, 2, [0, 2, 4], 2),
    "3g.20gb": (19968, 42, 4, [4, 0], 4),
    "7g.40gb": (40192, 100, 8, [0], 8),
    # Not a real profile: overlapping placements, odd starts tried first, so that taking them in
    # order holds three instances where the even starts hold four (a joint plan's case).
    "2g.12gb": (12000, 28, 2, [1, 3, 5, 0, 2, 4, 6], 2),
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
    # The pod's order of profiles (mig-profile-preference): none, or a rank (0: not named) per profile.
    n_prof = len(mig["prof_mem"])
    mig["prof_rank"] = draw(st.just([]) | st.lists(st.sampled_from([0, 0, 1, 2, 3]), min_size=n_prof,
                                                     max_size=n_prof))
    cols.update(mig)
    if draw(st.booleans()):
        candidates.insert(draw(st.integers(0, len(candidates))), -1)  # a name the cache does not know
    return cols, node_offset, node_len, candidates


@st.composite
def pods(draw):
    n_init = draw(st.sampled_from([0, 0, 1, 2]))
    n_app = draw(st.sampled_from([1, 1, 2, 3]))
    # Most pods ask for modest shares; the others for anything (whole GPUs, more than a GPU has...).
    modest = draw(st.sampled_from([True, True, False, "mig"]))
    if modest == "mig":   # several MIG instances a container: the joint plans
        nums, memreqs, mempcts, cores = [2, 3, 4, 7], [0, 4000, 9000, 11000, 20000], [101], [0, 10]
    elif modest:
        nums, memreqs, mempcts, cores = [1, 1, 2], [0, 1000, 4096], [101, 101, 10], [0, 10, 30, -1]
    else:
        nums, memreqs = [1, 2, 3, 4], [0, 1000, 4096, 20000, 90000]
        mempcts, cores = [101, 10, 50, 100], [0, 10, 30, 100, 150, -1]   # -1: takes no cores, no core checks
    # Some init containers are native sidecars (KEP-753): their rows are app rows, placed among
    # the init containers, and the ordinary init containers after them see what they took.
    sidecars = {c for c in range(n_init) if draw(st.sampled_from([False, False, True]))}
    rows = []
    for c in range(n_init + n_app):
        # The first app container always asks for a device (a pod that asks for nothing fits
        # anywhere without exercising the device fit); the others often ask for nothing.
        if c == n_init:
            vendors = draw(st.sampled_from([[0], [0], [0], [1], [0, 1]]))
        else:
            vendors = draw(st.sampled_from([[], [], [], [0], [1], [0, 1]]))
        for vendor in vendors:
            rows += [c, int(c < n_init and c not in sidecars), vendor, draw(st.sampled_from(nums)),
                     draw(st.sampled_from(memreqs)),
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
                              ORDER_CHAIN + KEY_NUMA + B * KEY_BINPACK,
                              ORDER_CHAIN + KEY_SPREAD + B * KEY_NUMA,
                              ORDER_CHAIN + KEY_BINPACK + B * KEY_SPREAD + B * B * KEY_NUMA,
                              ORDER_CHAIN + KEY_FRAG,
                              ORDER_CHAIN + KEY_NUMA + B * KEY_FRAG,
                              ORDER_CHAIN + KEY_FRAG + B * KEY_SPREAD])
node_policies = st.sampled_from([POLICY_BINPACK, POLICY_SPREAD, POLICY_FRAG])


class RecordingChooser:
    """A deterministic chooser that logs its calls: it refuses with ``refusal`` when every
    offered position is odd, else takes the ``nums`` highest positions (highest first, so not
    in walk order) and adds a delta that depends on the node and the picks."""

    def __init__(self, refusal: int):
        self.refusal = refusal
        self.calls = []

    def __call__(self, node_index, positions, nums):
        self.calls.append((node_index, list(positions), nums))
        if all(p % 2 for p in positions):
            return self.refusal
        chosen = sorted(positions, reverse=True)[:nums]
        return chosen, 0.25 * node_index + 0.5 * sum(chosen)


class RecordingCharger:
    """A deterministic charger that logs its calls: it refuses nodes whose index is 2 mod 5 with
    ModeNotFit, and charges the others a memory, cores and slots that depend on the node; with
    most seeds it also sizes the row's device count by the node (the 4-tuple: 1 up to the row's
    count, often fewer), so nodes with fewer devices than the row asks may fit."""

    def __init__(self, seed: int, rows=()):
        self.seed = seed
        self.rows = rows
        self.calls = []

    def __call__(self, node_index, row):
        self.calls.append((node_index, row))
        if (node_index + row) % 5 == 2:
            return R.MODE_NOT_FIT
        key = node_index + self.seed + row
        charge = (key % 4) * 3000, (node_index * 7 + self.seed + row) % 101, 1 + key % 3
        if self.seed % 3 == 0:
            return charge
        nums = self.rows[row * ROW_WIDTH + 3]
        return (*charge, 1 + (node_index * 5 + self.seed + row) % nums)


def _run(impl, cols, node_offset, node_len, candidates, rows, mask, policies, quotas, topology=0, mig_ok=1,
         vendor_flags=(0, 0), refusals=(None, None), charges=(None, None)):
    """``impl`` on these inputs: (winner, outputs, chooser and charger calls per vendor)."""
    table = _table(cols, node_offset, node_len)
    choosers = [None if refusal is None else RecordingChooser(refusal) for refusal in refusals]
    chargers = [None if seed is None else RecordingCharger(seed, rows) for seed in charges]
    node_policy, gpu_policy, numa_bind, mutex, *weights = policies
    total_nums = sum(rows[i * ROW_WIDTH + 3] for i in range(len(rows) // ROW_WIDTH))
    query = FitQuery(array("i", candidates), array("i", rows), total_nums, mask=array("b", mask),
                     node_policy=node_policy, gpu_policy=gpu_policy, numa_bind=numa_bind, mutex=mutex,
                     weights=weights, quota_mem=array("q", quotas[0]), quota_cores=array("q", quotas[1]),
                     topology=topology, mig_ok=mig_ok, vendor_flags=array("i", vendor_flags), choosers=choosers,
                     chargers=chargers, prof_rank=array("i", cols.get("prof_rank", [])))
    best = impl(table, query)
    result = {name.removeprefix("out_"): values for name, values in query.outputs().items()}
    if best < 0:  # the allocation buffers are only meaningful for a winner
        for k in ("row", "dev", "mem", "cores", "prof", "place", "slots"):
            result.pop(k)
    else:   # only the entries given are the answer (a charger may have sized a row smaller)
        for k in ("row", "dev", "mem", "cores", "prof", "place", "slots"):
            result[k] = result[k][:result["count"][0]]
    calls = [None if chooser is None else chooser.calls for chooser in choosers]
    calls += [charger.calls for charger in chargers if charger is not None]
    return best, result, calls


def _table(cols, node_offset, node_len):
    """The device table the kernel reads, from plain lists (MIG and pair scores optional)."""
    n_dev = len(cols["total_mem"])
    table = SimpleNamespace(
        total_mem=array("i", cols["total_mem"]), total_cores=array("i", cols["total_cores"]),
        count=array("i", cols["count"]), numa=array("i", cols["numa"]), health=array("b", cols["health"]),
        vendor=array("i", cols["vendor"]), used_mem=array("q", cols["used_mem"]),
        used_cores=array("q", cols["used_cores"]), used=array("q", cols["used"]),
        node_offset=array("i", node_offset), node_len=array("i", node_len),
        pair_score=array("i", cols.get("pair_score", [])),
        node_pair_offset=array("i", cols.get("node_pair_offset", [-1] * len(node_len))),
        dev_mig=array("b", cols.get("dev_mig", [0] * n_dev)), mig_used=array("q", cols.get("mig_used", [0] * n_dev)),
        mig_prof_off=array("i", cols.get("mig_prof_off", [0] * n_dev)),
        mig_prof_len=array("i", cols.get("mig_prof_len", [0] * n_dev)),
        prof_mem=array("i", cols.get("prof_mem", [])), prof_core=array("i", cols.get("prof_core", [])),
        prof_place_off=array("i", cols.get("prof_place_off", [])),
        prof_place_len=array("i", cols.get("prof_place_len", [])), place_mask=array("q", cols.get("place_mask", [])))
    assert set(vars(table)) == set(TABLE_COLUMNS)
    return table


def _compare(*args, **kwargs):
    """Both implementations on the same inputs must agree on everything: (winner, outputs)."""
    best, out, calls = _run(_kernel.filter_nodes, *args, **kwargs)
    assert (best, out, calls) == _run(kernel_ref.filter_nodes, *args, **kwargs)
    return best, out


# Per-vendor rule flags: mostly none (the NVIDIA case), then each rule and their combinations.
vendor_flag_sets = st.sampled_from([0, 0, 0, FLAG_EXCLUSIVE, FLAG_EQUAL_SHARE, FLAG_CHOOSE, FLAG_CHOOSE,
                                    FLAG_EXCLUSIVE | FLAG_CHOOSE, FLAG_EQUAL_SHARE | FLAG_CHOOSE,
                                    FLAG_EXCLUSIVE | FLAG_EQUAL_SHARE, FLAG_CHARGE, FLAG_CHARGE | FLAG_CHOOSE,
                                    FLAG_CHARGE | FLAG_EXCLUSIVE, FLAG_CHARGE | FLAG_SLOTS_FIRST])
chooser_refusals = st.sampled_from([R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE, R.NUMA_NOT_FIT, R.CARD_NOT_HEALTH])


def _without_mig(cols, vendors):
    """Families with a chooser have no MIG (the kernel may assume it): clear it on their devices."""
    cols = {k: list(v) for k, v in cols.items()}
    for j, v in enumerate(cols["vendor"]):
        if v in vendors:
            cols["dev_mig"][j] = cols["mig_used"][j] = cols["mig_prof_len"][j] = 0
    return cols


@settings(max_examples=400, deadline=None)
@given(
    cluster=clusters(),
    rows=pods(),
    node_policy=node_policies,
    gpu_policy=gpu_orders,
    numa_bind=st.sampled_from([0, 0, 1]),
    mutex=st.sampled_from([0, 0, 0, 1]),
    topology=st.sampled_from([0, 0, 1]),
    mig_ok=st.sampled_from([1, 1, 0]),
    quotas=quota_headroom,
    weights=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    mask_seed=st.none() | st.lists(st.sampled_from([0] * 15 + [R.CARD_CORDONED, R.CARD_TYPE_MISMATCH,
                                                               R.CARD_UUID_MISMATCH]), min_size=64, max_size=64),
    vendor_flags=st.tuples(vendor_flag_sets, vendor_flag_sets),
    refusals=st.tuples(chooser_refusals, chooser_refusals),
    charge_seeds=st.tuples(st.integers(0, 11), st.integers(0, 11)),
)
def test_cython_kernel_matches_reference(cluster, rows, node_policy, gpu_policy, numa_bind, mutex, topology,
                                         mig_ok, quotas, weights, mask_seed, vendor_flags, refusals, charge_seeds):
    cols, node_offset, node_len, candidates = cluster
    n_dev = len(cols["total_mem"])
    mask = [] if mask_seed is None else mask_seed[:n_dev] + [0] * max(0, n_dev - 64)
    policies = (node_policy, gpu_policy, numa_bind, mutex, float(weights[0]), float(weights[1]), float(weights[2]))
    choosing = {v for v in (0, 1) if vendor_flags[v] & FLAG_CHOOSE}
    charging = {v for v in (0, 1) if vendor_flags[v] & FLAG_CHARGE}
    cols = _without_mig(cols, choosing | charging)
    refusals = tuple(refusals[v] if v in choosing else None for v in (0, 1))
    charges = tuple(charge_seeds[v] if v in charging else None for v in (0, 1))
    args = (cols, node_offset, node_len, candidates, rows, mask, policies, quotas, topology, mig_ok)
    kw = dict(vendor_flags=vendor_flags, refusals=refusals, charges=charges)
    best, out, calls = _run(_kernel.filter_nodes, *args, **kw)
    event(_outcome(best, out))
    if any(calls[:2]):
        event("a chooser was asked")
    if any(calls[2:]):
        event("a charger was asked")
    if best >= 0 and any(s > 1 for s in out["slots"]):
        event("a device took several slots")
    if best >= 0 and out["count"][0] < sum(rows[i * ROW_WIDTH + 3] for i in range(len(rows) // ROW_WIDTH)):
        event("a charger sized a row smaller on the winner")
    assert (best, out, calls) == _run(kernel_ref.filter_nodes, *args, **kw)


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
@given(cluster=idle_clusters(), rows=small_pods(), node_policy=node_policies, gpu_policy=gpu_orders,
       numa_bind=st.sampled_from([0, 1]), topology=st.sampled_from([0, 1]), mig_ok=st.sampled_from([0, 1]),
       weights=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)))
def test_cython_kernel_places_a_fitting_pod_as_the_reference_does(cluster, rows, node_policy, gpu_policy, numa_bind,
                                                                   topology, mig_ok, weights):
    """Every pod here fits, so every example compares a real allocation, device by device."""
    cols, node_offset, node_len, candidates = cluster
    policies = (node_policy, gpu_policy, numa_bind, 0, float(weights[0]), float(weights[1]), float(weights[2]))
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    args = (cols, node_offset, node_len, candidates, rows, [], policies, unlimited, topology, mig_ok)
    best, out = _compare(*args)
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
    best, out = _compare(*args)
    assert out["dev"] == [0, 0, 0] and out["prof"] == [0, 0, 0]
    assert out["place"] == [0, 1, 2]            # 1g placements tried from the top slice down
    assert out["mem"] == [4864] * 3 and out["cores"] == [14] * 3   # charged as the profile


def test_mig_request_without_a_free_placement_is_infeasible():
    cols = _one_mig_gpu(mig_used=0b1111111)      # the seven 1g slices are taken
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    args = (cols, [0], [1], [0], [0, 0, 0, 1, 4000, 101, 0], [], (0, 1, 0, 0, 1.0, 1.0, 1.0), unlimited, 0, 1)
    best, out = _compare(*args)
    assert best == -1 and out["reasons"][R.CARD_MIG_TOPOLOGY_INFEASIBLE] == 1


def test_more_instances_than_gpus_only_for_mig_requests():
    cols = _one_mig_gpu()
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    rows = [0, 0, 0, 2, 0, 101, 0]
    for mig_ok, fits in ((1, True), (0, False)):
        args = (cols, [0], [1], [0], rows, [], (0, 1, 0, 0, 1.0, 1.0, 1.0), unlimited, 0, mig_ok)
        best, out = _compare(*args)
        assert (best == 0) == fits
        if not fits:
            assert out["status"] == [R.NODE_INSUFFICIENT_DEVICE]


def _mig_table(profiles, mig_used=0):
    """One 80-GiB MIG GPU of the given profile table: (memory, cores, [(start, size), ...]) per
    profile, smallest first, placements in their try order."""
    cols = {"total_mem": [81920], "total_cores": [100], "count": [10], "numa": [0], "health": [1], "vendor": [0],
            "used_mem": [0], "used_cores": [0], "used": [0], "dev_mig": [1], "mig_used": [mig_used],
            "mig_prof_off": [0], "mig_prof_len": [len(profiles)], "prof_mem": [], "prof_core": [],
            "prof_place_off": [], "prof_place_len": [], "place_mask": []}
    for mem, cores, places in profiles:
        cols["prof_mem"].append(mem)
        cols["prof_core"].append(cores)
        cols["prof_place_off"].append(len(cols["place_mask"]))
        cols["prof_place_len"].append(len(places))
        cols["place_mask"] += [((1 << size) - 1) << start for start, size in places]
    return cols


def _mig_ask(cols, nums, memreq, topology=0):
    unlimited = ([UNLIMITED] * 2, [UNLIMITED] * 2)
    return _compare(cols, [0], [1], [0], [0, 0, 0, nums, memreq, 101, 0], [], (0, 1, 0, 0, 1.0, 1.0, 1.0),
                    unlimited, topology, 1)


@pytest.mark.parametrize("topology", [0, 1])
def test_a_containers_mig_instances_are_planned_together(topology):
    """Inventory: mig-joint-planning (HAMi #2855). The smallest profile's only placement straddles
    the card's halves: taking it for the first of two instances (instance by instance, as before)
    leaves no room for the second, while two half-card instances hold both. One instance still
    takes the smallest profile, as before."""
    cols = _mig_table([(10240, 14, [(3, 2)]), (40960, 42, [(4, 4), (0, 4)])])
    best, out = _mig_ask(cols, 2, 10000, topology)
    assert best == 0 and out["dev"] == [0, 0]
    assert out["prof"] == [1, 1] and out["place"] == [1, 2]          # both halves
    assert out["mem"] == [40960, 40960] and out["cores"] == [42, 42]  # charged as the profile
    best, out = _mig_ask(cols, 1, 10000, topology)
    assert best == 0 and out["prof"] == [0] and out["place"] == [0]
    best, out = _mig_ask(cols, 3, 10000, topology)                    # no arrangement holds three
    assert best == -1 and out["reasons"][R.CARD_MIG_TOPOLOGY_INFEASIBLE] == 1


def _tiling_table(m):
    """3m+1 slices: three-slice placements at every start, the ones a tiling needs (multiples of
    3) tried last, and one single-slice placement at the end: m + 1 instances fit only as that
    tiling, and a depth-first search takes ever more steps (about 2 ** m) to find it."""
    slices = 3 * m + 1
    starts = [s for s in range(slices - 2) if s % 3] + [s for s in range(slices - 2) if s % 3 == 0]
    return _mig_table([(10240, 14, [(s, 3) for s in starts]), (20480, 28, [(slices - 1, 1)])])


def test_a_mig_plan_beyond_the_search_budget_fails_closed(monkeypatch):
    """The search tries at most MIG_SEARCH_BUDGET placements (upstream's 4096) a GPU: within it
    a deep arrangement is found; beyond it the GPU gives only the instances of the best
    arrangement found so far, the others are refused (CardMigTopologyInfeasible) although a
    plan exists, and nothing unplanned is ever placed."""
    assert kernel_ref.MIG_SEARCH_BUDGET == 4096
    best, out = _mig_ask(_tiling_table(7), 8, 1000)                  # about 2048 steps: found
    assert best == 0 and len(out["place"]) == 8
    cols = _tiling_table(10)                                          # about 65536 steps
    best, out = _mig_ask(cols, 11, 1000)
    assert best == -1 and out["reasons"][R.CARD_MIG_TOPOLOGY_INFEASIBLE] == 1
    assert out["reasons"][R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] == 10   # the best found held ten
    # The refusal is the budget's: with a larger one the reference finds the tiling.
    monkeypatch.setattr(reference_fit, "MIG_SEARCH_BUDGET", 1 << 17)
    best, out, _ = _run(kernel_ref.filter_nodes, cols, [0], [1], [0], [0, 0, 0, 11, 1000, 101, 0], [],
                        (0, 1, 0, 0, 1.0, 1.0, 1.0), ([UNLIMITED] * 2, [UNLIMITED] * 2))
    assert best == 0 and sorted(cols["place_mask"][p] for p in out["place"]) == sorted(
        [0b111 << s for s in range(0, 30, 3)] + [1 << 30])


def test_preferred_mig_profiles_are_tried_first():
    """nvidia.com/mig-profile-preference (HAMi #3014) reaches the kernel as a rank per profile:
    ranked profiles are tried first, in rank order, then the others smallest first; a ranked
    profile without the memory asked is passed over; no ranks: smallest first, as before."""
    cols = _one_mig_gpu()       # 1g.5gb (profile 0), 2g.10gb (profile 1)
    for ranks, prof in (([], [0]), ([0, 1], [1]), ([2, 1], [1]), ([1, 2], [0]), ([1, 0], [0])):
        best, out = _mig_ask({**cols, "prof_rank": ranks}, 1, 4000)
        assert best == 0 and out["prof"] == prof, ranks
    best, out = _mig_ask({**cols, "prof_rank": [1, 0]}, 1, 9000)      # 1g.5gb has too little memory
    assert out["prof"] == [1]
    # Several instances: the preferred profile's placements first, then the others.
    best, out = _mig_ask({**cols, "prof_rank": [0, 1]}, 4, 4000)
    assert out["prof"] == [1, 1, 1, 0] and out["place"] == [7, 8, 9, 0]   # 2g at 0, 2, 4; then 1g at 6


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


# -- the numbers, written once ---------------------------------------------------------------

def _pxd_codes() -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"^\s+([A-Z][A-Z0-9_]*) = (-?\d+)", KERNEL_CODES.read_text(),
                                                             re.M)}


def test_every_shared_number_comes_from_kernel_codes_pxd():
    """reasons.py and kernel_codes.py take their numbers from the built kernel, which compiled
    them from kernel_codes.pxd (kernel_ref and the device base import them from there): a name
    missing from CODES, a kernel built before the .pxd changed, or a number typed back into a
    Python module fails here."""
    codes = _pxd_codes()
    assert len(codes) > 40 and _kernel.CODES == codes
    python_side = {**{n: getattr(R, n) for n in codes if hasattr(R, n)},
                   **{n: getattr(kernel_codes, n) for n in codes if hasattr(kernel_codes, n)},
                   **{n: getattr(kernel_ref, n) for n in codes if hasattr(kernel_ref, n)},
                   **{n: getattr(base, n) for n in codes if n.startswith("FLAG_")}}
    assert {n: codes[n] for n in python_side} == python_side
    assert set(python_side) == set(codes)   # each one has its Python name
    # Every device reason has upstream's string; the reason count bounds them.
    assert sorted(R.NAMES) == list(range(1, R.N_DEVICE_REASONS))
    assert _kernel.QUOTA_UNLIMITED == quota.UNLIMITED == UNLIMITED
    # One Python home per number: the reasons in reasons.py, the rest in kernel_codes.py.
    assert set(codes) == {n for n in codes if hasattr(R, n)} ^ set(kernel_codes.__all__)


def test_the_reference_is_read_by_tests_not_by_the_scheduler():
    """kernel_ref.py specifies the kernel; the scheduler takes the kernel's numbers from
    kernel_codes.py, so the reference can be reshaped without touching production code."""
    root = Path(__file__).resolve().parent.parent / "hami_py"
    importers = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if "hami_py.scheduling.kernel.reference" in names and path.name != "kernel_ref.py":
                importers.append(str(path.relative_to(root.parent)))
    assert importers == []


# -- device families' rules, one by one ------------------------------------------------------

def _plain_node(used, used_mem, total_mem=16384, count=4):
    """One node of devices of vendor 0, 100 cores each, with this usage per device."""
    n = len(used)
    return {"total_mem": [total_mem] * n, "total_cores": [100] * n, "count": [count] * n, "numa": [0] * n,
            "health": [1] * n, "vendor": [0] * n, "used_mem": list(used_mem), "used_cores": [0] * n,
            "used": list(used)}


def _one_row(nums=1, memreq=4000):
    return [0, 0, 0, nums, memreq, 101, 0]


_SPREAD = (0, ORDER_SPREAD, 0, 0, 1.0, 1.0, 1.0)
_UNLIMITED = ([UNLIMITED], [UNLIMITED])


def _fit(cols, rows, flags, refusal=None):
    n = len(cols["total_mem"])
    return _compare(cols, [0], [n], [0], rows, [], _SPREAD, _UNLIMITED, vendor_flags=(flags,),
                    refusals=(refusal,))


def _failure_text(out):
    nr = R.N_DEVICE_REASONS
    return R.gen_reason({r: out["reasons"][r] for r in range(nr) if out["reasons"][r]}, out["total"][0])


def test_exclusive_family_refuses_a_device_in_use():
    cols = _plain_node(used=[1], used_mem=[1000])
    best, out = _fit(cols, _one_row(), 0)
    assert best == 0                                             # shared by default
    best, out = _fit(cols, _one_row(), FLAG_EXCLUSIVE)
    assert best == -1 and _failure_text(out) == "1/1 ExclusiveDeviceAllocateConflict"
    best, out = _fit(_plain_node(used=[1, 0], used_mem=[1000, 0]), _one_row(), FLAG_EXCLUSIVE)
    assert best == 0 and out["dev"] == [1]                       # the idle one is taken


def test_a_busy_whole_card_of_an_exclusive_family_reads_exclusive_not_time_slicing():
    """A whole card has one slot: the family's reason comes before the slot count (upstream's)."""
    cols = _plain_node(used=[1], used_mem=[0], count=1)
    best, out = _fit(cols, _one_row(), FLAG_EXCLUSIVE)
    assert _failure_text(out) == "1/1 ExclusiveDeviceAllocateConflict"
    best, out = _fit(cols, _one_row(), 0)
    assert _failure_text(out) == "1/1 CardTimeSlicingExhausted"


def test_exclusive_family_gives_one_pod_one_device_per_container():
    """The pod's own first container makes the device busy for the second."""
    rows = _one_row() + [1, 0, 0, 1, 4000, 101, 0]
    best, out = _fit(_plain_node(used=[0], used_mem=[0]), rows, FLAG_EXCLUSIVE)
    assert best == -1 and _failure_text(out) == "1/1 ExclusiveDeviceAllocateConflict"


def test_equal_share_family_takes_only_tasks_of_the_size_it_hosts():
    cols = _plain_node(used=[2], used_mem=[8000])                # two tasks of 4000 MiB
    best, out = _fit(cols, _one_row(memreq=4000), FLAG_EQUAL_SHARE)
    assert best == 0 and out["mem"] == [4000]
    best, out = _fit(cols, _one_row(memreq=2000), FLAG_EQUAL_SHARE)
    assert best == -1 and _failure_text(out) == "1/1 CardNotFoundCustomFilterRule"
    best, out = _fit(cols, _one_row(memreq=2000), 0)
    assert best == 0                                             # any size without the rule
    best, out = _fit(_plain_node(used=[0], used_mem=[0]), _one_row(memreq=2000), FLAG_EQUAL_SHARE)
    assert best == 0                                             # an idle device takes any size


def test_equal_share_is_checked_after_memory():
    cols = _plain_node(used=[1], used_mem=[15000])
    best, out = _fit(cols, _one_row(memreq=4000), FLAG_EQUAL_SHARE)
    assert _failure_text(out) == "1/1 CardInsufficientMemory"


def _chooser_query(chooser, cols, nums):
    """Two identical nodes of ``cols``'s devices, a FLAG_CHOOSE family, one row of ``nums``."""
    n = len(cols["total_mem"])
    table = _table({k: v + v for k, v in cols.items()}, [0, n], [n, n])
    query = FitQuery(array("i", [0, 1]), array("i", _one_row(nums=nums)), nums, gpu_policy=ORDER_SPREAD,
                     quota_mem=array("q", [UNLIMITED]), quota_cores=array("q", [UNLIMITED]),
                     vendor_flags=array("i", [FLAG_CHOOSE]), choosers=[chooser])
    return table, query


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_chooser_picks_the_devices_and_moves_the_node_score(impl):
    """The chooser sees every fitting device (not just the first ``nums``), its picks are the
    allocation in its order, and its delta decides between two otherwise identical nodes."""
    cols = _plain_node(used=[0, 0, 0, 1], used_mem=[0, 0, 0, 20000], total_mem=16384)   # the last one is full
    seen = []

    def chooser(node_index, positions, nums):
        seen.append((node_index, sorted(positions), nums))
        return [2, 0], 5.0 if node_index == 1 else 0.0

    table, query = _chooser_query(chooser, cols, nums=2)
    best = impl(table, query)
    assert seen == [(0, [0, 1, 2], 2), (1, [0, 1, 2], 2)]
    assert best == 1                                  # binpack: the higher score, thanks to the delta
    assert query.out_score[1] - query.out_score[0] == 5.0
    assert list(query.out_dev) == [4 + 2, 4 + 0]      # node 1's slice starts at 4; the chooser's order
    assert list(query.out_mem) == [4000, 4000]


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_chooser_reason_is_reported_for_the_node(impl):
    cols = _plain_node(used=[0, 0, 1], used_mem=[0, 0, 20000])
    table, query = _chooser_query(lambda node_index, positions, nums: R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE, cols, 2)
    assert impl(table, query) == -1
    assert list(query.out_status) == [R.NODE_DEVICE_REASONS] * 2
    nr = R.N_DEVICE_REASONS
    counts = {r: query.out_reasons[r] for r in range(nr) if query.out_reasons[r]}
    # The walk's own refusal stays; the chooser's reason is counted once, over the family's devices.
    assert R.gen_reason(counts, query.out_total[0]) == "1/3 CardInsufficientMemory, 1/3 CardNotFoundCustomFilterRule"


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_chooser_is_not_asked_when_too_few_devices_fit(impl):
    cols = _plain_node(used=[0, 1], used_mem=[0, 20000])
    calls = []
    table, query = _chooser_query(lambda *args: calls.append(args), cols, 2)
    assert impl(table, query) == -1 and calls == []
    assert query.out_reasons[R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] == 1


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
@pytest.mark.parametrize("answer", [([0], 0.0), ([0, 0], 0.0), ([0, 3], 0.0), ([0, 1, 2], 0.0), [0, 1], 0, 99,
                                    "nope", ([0, "1"], 0.0)])
def test_a_chooser_breaking_its_contract_raises(impl, answer):
    cols = _plain_node(used=[0, 0, 0, 1], used_mem=[0, 0, 0, 20000])
    table, query = _chooser_query(lambda *args: answer, cols, 2)
    with pytest.raises(ValueError, match="chooser"):
        impl(table, query)


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_a_chooser_family_without_a_chooser_raises(impl):
    table, query = _chooser_query(None, _plain_node(used=[0, 0], used_mem=[0, 0]), 2)
    with pytest.raises(ValueError, match="no chooser"):
        impl(table, query)


# -- the rules as the filter applies them, for a family that sets them ---------------------------

def _family(flags, chooser=None):
    """A generic-template family with these kernel flags (and chooser), beside NVIDIA."""
    from hami_py.devices.template import TemplateSpec, TemplateVendor

    class Family(TemplateVendor):
        kernel_flags = flags

        def chooser(self, cache, pod_annotations):
            return chooser

    return Family(TemplateSpec(vendor_key="Example", count_resource="example.com/dev",
                               memory_resource="example.com/devmem", register_annotation="example.com/register",
                               to_allocate_annotation="example.com/devices-to-allocate",
                               allocated_annotation="example.com/devices-allocated"))


def _decide(family, devices, pod_mem, *, used=()):
    """Filterer.decide for a pod asking one device of ``pod_mem`` MiB, on node n1 holding ``devices``
    (``(memory, split count)`` each) after pods of ``used`` MiB each were placed on its first device."""
    import orjson

    from hami_py.cache.usage import UsageCache
    from hami_py.config import DeviceConfig
    from hami_py.devices.registry import build_vendors
    from hami_py.scheduling.decision.filter import Filterer
    from hami_py.scheduling.decision.requests import parse_pod_requests

    vendors = {**build_vendors(DeviceConfig.default()), family.vendor_key: family}
    cache = UsageCache(vendors)
    registration = [{"id": f"EX-{i}", "index": i, "count": count, "devmem": mem, "devcore": 100, "type": "Example",
                     "health": True} for i, (mem, count) in enumerate(devices)]
    cache.upsert_node({"metadata": {"name": "n1", "annotations": {
        "example.com/register": orjson.dumps(registration).decode()}}, "status": {}})

    def pod(name, mem):
        return {"metadata": {"name": name, "namespace": "default", "uid": name, "annotations": {}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {
                    "example.com/dev": "1", "example.com/devmem": str(mem)}}}]}}

    filterer = Filterer(cache, vendors)
    for i, mem in enumerate(used):   # reserved by earlier filters, on the first device (binpack)
        earlier = pod(f"earlier-{i}", mem)
        decision = filterer.decide(earlier, ["n1"], parse_pod_requests(earlier, vendors, cache.vendor_ids))
        assert decision.node == "n1"
    probe = pod("probe", pod_mem)
    return filterer.decide(probe, ["n1"], parse_pod_requests(probe, vendors, cache.vendor_ids), reserve=False)


def test_filter_refuses_a_busy_device_of_an_exclusive_family():
    decision = _decide(_family(FLAG_EXCLUSIVE), [(16384, 4)], 1000, used=[1000])
    assert decision.node is None and decision.failed == {"n1": "1/1 ExclusiveDeviceAllocateConflict"}
    assert _decide(_family(0), [(16384, 4)], 1000, used=[1000]).node == "n1"


def test_filter_keeps_equal_shares_on_an_equal_share_family():
    family = _family(FLAG_EQUAL_SHARE)
    assert _decide(family, [(16384, 4)], 4000, used=[4000, 4000]).node == "n1"
    decision = _decide(family, [(16384, 4)], 2000, used=[4000, 4000])
    assert decision.node is None and decision.failed == {"n1": "1/1 CardNotFoundCustomFilterRule"}


def test_filter_gives_the_devices_the_family_chooser_picks_and_reports_its_refusal():
    asked = []

    def chooser(node_index, positions, nums):
        asked.append(sorted(positions))
        return [max(positions)], 0.0

    decision = _decide(_family(FLAG_CHOOSE, chooser), [(16384, 4)] * 3, 1000)
    assert asked == [[0, 1, 2]]
    [[device]] = decision.allocation["Example"]
    assert device.uuid == "EX-2"
    refusing = _family(FLAG_CHOOSE, lambda node_index, positions, nums: R.CARD_NOT_FOUND_CUSTOM_FILTER_RULE)
    decision = _decide(refusing, [(16384, 4)] * 3, 1000)
    assert decision.node is None and decision.failed == {"n1": "1/3 CardNotFoundCustomFilterRule"}


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_a_row_of_a_vendor_beyond_the_per_vendor_arrays_raises(impl):
    """The kernel indexes quota and flags by the rows' vendor ids without bounds checks: it checks
    them once, up front."""
    table, query = _chooser_query(None, _plain_node(used=[0], used_mem=[0]), 1)
    query.vendor_flags = array("i")
    with pytest.raises(ValueError, match="vendor id 0"):
        impl(table, query)


def test_the_device_score_takes_the_memory_request_before_the_percentage():
    """HAMi #3106: a row with both a memory request and a percentage is scored (and charged) by
    the request; the percentage only when the request is 0. Device 0 is small and idle, device 1
    large with some memory used; binpack on memory alone prefers device 0 for 1500 MiB (0.75 of
    it against 0.0625) but device 1 for 50 % (0.5 against 0.525)."""
    cols = _plain_node(used=[0, 1], used_mem=[0, 1000])
    cols["total_mem"] = [2000, 40000]
    memory_only = (0, ORDER_BINPACK, 0, 0, 0.0, 0.0, 1.0)
    for memreq, mempct, device, mem in ((1500, 50, 0, 1500), (0, 50, 1, 20000)):
        best, out = _compare(cols, [0], [2], [0], [0, 0, 0, 1, memreq, mempct, 0], [], memory_only, _UNLIMITED,
                             vendor_flags=(0,))
        assert best == 0 and (out["dev"][0], out["mem"][0]) == (device, mem), (memreq, mempct)
    assert [kernel_ref.resolve_mem(r, p, 8000) for r, p in ((1000, 50), (0, 50), (0, 101), (0, 0))] == [1000, 4000, 0, 0]


# -- NUMA binding when every fitting device is collected ------------------------------------------

def _two_numa_nodes(fits_on_first):
    """Four devices of vendor 0, two per NUMA node; the walk (spread under NUMA binding) takes NUMA
    node 1 first. NUMA node 1 has ``fits_on_first`` idle devices (the others full), NUMA node 0
    one idle and one full: a row of two fits only on NUMA node 1, and only when both are idle."""
    cols = _plain_node(used=[0, 0, 0, 1], used_mem=[0, 0, 0, 16384])
    cols["numa"] = [1, 1, 0, 0]
    for k in range(fits_on_first, 2):
        cols["used"][k], cols["used_mem"][k] = 1, 16384
    return cols


_NUMA_SPREAD = (0, ORDER_SPREAD, 1, 0, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("topology, flags", [(0, 0), (1, 0), (0, FLAG_CHOOSE)],
                         ids=["first-nums", "topology-aware", "chooser"])
def test_numa_binding_keeps_the_first_numa_node_that_holds_the_row(topology, flags):
    """nvidia.com/numa-bind: all of a row's devices on one NUMA node. A walk that collects every
    fitting device (topology-aware, a family's chooser) used to start over on each NUMA node and
    keep only the last one's devices, refusing a node whose first NUMA node holds the row; it now
    keeps the first NUMA node that holds it, as the walk that stops at ``nums`` devices does."""
    best, out = _compare(_two_numa_nodes(2), [0], [4], [0], _one_row(nums=2), [], _NUMA_SPREAD, _UNLIMITED,
                         topology, vendor_flags=(flags,), refusals=(R.CARD_NOT_HEALTH if flags else None,))
    assert best == 0 and sorted(out["dev"]) == [0, 1]


@pytest.mark.parametrize("topology, flags", [(0, 0), (1, 0), (0, FLAG_CHOOSE)],
                         ids=["first-nums", "topology-aware", "chooser"])
def test_numa_binding_refusal_reads_alike_whether_or_not_the_walk_collects(topology, flags):
    """No NUMA node holds two: the first one's pick is NumaNotFit, the last one's too few."""
    best, out = _compare(_two_numa_nodes(1), [0], [4], [0], _one_row(nums=2), [], _NUMA_SPREAD, _UNLIMITED,
                         topology, vendor_flags=(flags,), refusals=(R.CARD_NOT_HEALTH if flags else None,))
    assert best == -1
    assert _failure_text(out) == "1/4 AllocatedCardsInsufficientRequest, 1/4 NumaNotFit, 2/4 CardInsufficientMemory"


# -- a partition's slices before its memory (FLAG_SLOTS_FIRST) -----------------------------------

@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_a_slots_first_family_refuses_a_card_without_the_slices_before_its_memory(impl):
    """HAMi #2877 (Enflame DRS): a card of 6 slices with 3 taken and too little memory left for a
    6-slice partition reads CardTimeSlicingExhausted for a FLAG_SLOTS_FIRST family, where the
    v2.10 order (slices after memory) reads CardInsufficientMemory. The row's own memory and
    slices are the charger's; a card with the slices and the memory takes it either way."""
    cols = _plain_node(used=[3, 0], used_mem=[20480, 0], total_mem=40960, count=6)

    def charger(node_index, row):
        return 40960, 100, 6       # a 6-slice partition of the whole card

    nr = R.N_DEVICE_REASONS
    for flags, reason in ((FLAG_CHARGE, R.CARD_INSUFFICIENT_MEMORY),
                          (FLAG_CHARGE | FLAG_SLOTS_FIRST, R.CARD_TIME_SLICING_EXHAUSTED)):
        query = FitQuery(array("i", [0]), array("i", _one_row()), 1, gpu_policy=ORDER_SPREAD,
                         quota_mem=array("q", [UNLIMITED]), quota_cores=array("q", [UNLIMITED]),
                         vendor_flags=array("i", [flags]), choosers=[None], chargers=[charger])
        assert impl(_table(cols, [0], [2]), query) == 0
        assert list(query.out_dev) == [1] and list(query.out_slots) == [6]
        query = FitQuery(array("i", [0]), array("i", _one_row()), 1, gpu_policy=ORDER_SPREAD,
                         quota_mem=array("q", [UNLIMITED]), quota_cores=array("q", [UNLIMITED]),
                         vendor_flags=array("i", [flags]), choosers=[None], chargers=[charger])
        assert impl(_table(_plain_node(used=[3], used_mem=[20480], total_mem=40960, count=6), [0], [1]), query) == -1
        assert {r: query.out_reasons[r] for r in range(nr) if query.out_reasons[r]} == {reason: 1}


# -- a charger sizing a row's device count by the node (the 4-tuple) ------------------------------

def _sized_query(nums, charger, flags=FLAG_CHARGE):
    return FitQuery(array("i", [0]), array("i", _one_row(nums=nums)), nums, gpu_policy=ORDER_SPREAD,
                    quota_mem=array("q", [UNLIMITED]), quota_cores=array("q", [UNLIMITED]),
                    vendor_flags=array("i", [flags]), choosers=[None], chargers=[charger])


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
def test_a_charger_may_size_a_row_smaller_on_a_node_and_the_kernel_gives_that_many(impl):
    """A row of 4 devices on a node of 2: the charger says 2 devices there, so the node fits with
    2 entries (out_count), where a charger keeping the count leaves NodeInsufficientDevice."""
    table = _table(_plain_node(used=[0, 0], used_mem=[0, 0]), [0], [2])
    query = _sized_query(4, lambda node_index, row: (1000, 10, 1, 2))
    assert impl(table, query) == 0
    assert list(query.out_count) == [2] and sorted(query.out_dev[:2]) == [0, 1]
    assert list(query.out_mem[:2]) == [1000, 1000] and list(query.out_cores[:2]) == [10, 10]
    query = _sized_query(4, lambda node_index, row: (1000, 10, 1, 1), FLAG_CHARGE | FLAG_CHOOSE)
    query.choosers = [lambda node_index, positions, nums: (positions[:nums], 0.0)]
    assert impl(table, query) == 0 and list(query.out_count) == [1]


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
@pytest.mark.parametrize("answer", [(1000, 10, 1), (1000, 10, 1, 3), R.MODE_NOT_FIT], ids=["kept", "still-too-many",
                                                                                          "refused"])
def test_too_few_devices_still_reads_node_insufficient_device_unless_the_charger_fits_the_node(impl, answer):
    """The rule of today for every charger that does not size the node's count to what it has:
    a refusal or a count the node still lacks reads NodeInsufficientDevice, not the charger's reason."""
    query = _sized_query(4, lambda node_index, row: answer)
    assert impl(_table(_plain_node(used=[0, 0], used_mem=[0, 0]), [0], [2]), query) == -1
    assert list(query.out_status) == [R.NODE_INSUFFICIENT_DEVICE]
    assert not any(query.out_reasons)


@pytest.mark.parametrize("impl", [_kernel.filter_nodes, kernel_ref.filter_nodes], ids=["cython", "reference"])
@pytest.mark.parametrize("answer", [(1000, 10, 1, 0), (1000, 10, 1, 3), (1000, 10, 1, 1, 1)])
def test_a_charger_answering_a_count_outside_one_to_the_rows_raises(impl, answer):
    query = _sized_query(2, lambda node_index, row: answer)
    with pytest.raises(ValueError, match="charger of vendor id 0"):
        impl(_table(_plain_node(used=[0, 0, 0], used_mem=[0, 0, 0]), [0], [3]), query)

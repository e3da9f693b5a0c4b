"""MIG: GPUs in MIG mode hand out instances of their profiles at free placements, recorded in
``hami.io/vgpu-mig-allocations`` and rebuilt from it after a restart."""
from __future__ import annotations

import orjson

from hami_py.embedded import running_scheduler
from hami_py.fakeapi.objects import H200, gpu_node, gpu_pod, registration
from tests.conftest import assert_books_balance, bind_placed, wait_until

# An H200's GPU-instance profiles (see the shared nvidia-h200 fixture), memory in MiB.
H200_MIG_PROFILES = [
    {"name": "1g.18gb", "memoryMB": 16384, "core": 14, "sliceCount": 1,
     "placements": [{"start": s, "size": 1} for s in range(7)]},
    {"name": "3g.71gb", "memoryMB": 69632, "core": 42, "sliceCount": 3,
     "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]},
    {"name": "7g.141gb", "memoryMB": 143360, "core": 100, "sliceCount": 7, "placements": [{"start": 0, "size": 8}]},
]


# Not a real card's table: the small profile's one placement straddles the halves, so the first
# of two instances must not take it (joint planning, HAMi #2855).
STRADDLING_PROFILES = [
    {"name": "2g.35gb", "memoryMB": 35840, "core": 28, "sliceCount": 2, "placements": [{"start": 3, "size": 2}]},
    {"name": "4g.71gb", "memoryMB": 69632, "core": 42, "sliceCount": 4,
     "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]},
]


def _mig_node(name="n1", profiles=H200_MIG_PROFILES):
    devices = registration(name, gpus=1, model=H200, mode="mig")
    devices[0]["migProfiles"] = profiles
    return gpu_node(name, devices=devices)


def _mig_allocations(api, pod):
    text = api.get("pods", pod, namespace="default")["metadata"]["annotations"].get("hami.io/vgpu-mig-allocations")
    return orjson.loads(text) if text else []


async def test_mig_instances_are_placed_recorded_and_rebuilt(api, app, extender):
    api.create("nodes", _mig_node())
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    small = api.create("pods", gpu_pod("small", gpumem=10000))
    await bind_placed(api, app, extender, small, await extender.filter(small, ["n1"]))
    [inst] = _mig_allocations(api, "small")
    assert inst["profile"] == "1g.18gb" and inst["placement"] == {"start": 6, "size": 1}
    assert (inst["containerIndex"], inst["deviceIndex"]) == (0, 0)
    ann = api.get("pods", "small", namespace="default")["metadata"]["annotations"]
    assert ann["hami.io/vgpu-devices-allocated"].split(",")[2] == "16384"  # charged as the profile
    big = api.create("pods", gpu_pod("big", gpumem=60000))
    await bind_placed(api, app, extender, big, await extender.filter(big, ["n1"]))
    [inst] = _mig_allocations(api, "big")
    assert inst["profile"] == "3g.71gb" and inst["placement"] == {"start": 0, "size": 4}
    whole = api.create("pods", gpu_pod("whole", gpumem=40000))
    assert (await extender.filter(whole, ["n1"]))["FailedNodes"] == {"n1": "1/1 CardMigTopologyInfeasible"}
    assert_books_balance(app)
    # A fresh scheduler rebuilds the taken slices from the annotations.
    async with running_scheduler(api, device_plugin=False) as second:
        await wait_until(lambda: "n1" in second.cache.nodes and len(second.cache.pods) == 2, "rebuilt")
        j = second.cache.nodes["n1"].offset
        assert second.cache.mig_used[j] == app.cache.mig_used[j] == (1 << 6) | 0b1111
    api.delete("pods", "big", namespace="default")
    await wait_until(lambda: app.cache.mig_used[app.cache.nodes["n1"].offset] == 1 << 6, "slices freed")


async def test_several_instances_for_one_container_and_vgpu_mode_gate(api, app, extender):
    api.create("nodes", _mig_node())
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    pod = api.create("pods", gpu_pod("two", gpus=2, gpumem=10000))
    await bind_placed(api, app, extender, pod, await extender.filter(pod, ["n1"]))
    insts = _mig_allocations(api, "two")
    assert [i["deviceIndex"] for i in insts] == [0, 1]
    assert [i["placement"]["start"] for i in insts] == [6, 5]
    # A pod that insists on hami-core sharing cannot use a MIG GPU.
    core = api.create("pods", gpu_pod("core", gpumem=1000, annotations={"nvidia.com/vgpu-mode": "hami-core"}))
    assert (await extender.filter(core, ["n1"]))["FailedNodes"] == {"n1": "1/1 CardTypeMismatch"}


async def test_a_containers_instances_are_planned_together_on_a_gpu(api, app, extender):
    """Inventory: mig-joint-planning. Two instances of 30000 MiB: the smallest profile that holds
    one sits across both halves of the card, and placing instance by instance (hami-py before
    HAMi #2855's joint planning) took it for the first and refused the pod
    (CardMigTopologyInfeasible); planned together they take one half each."""
    api.create("nodes", _mig_node(profiles=STRADDLING_PROFILES))
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    pod = api.create("pods", gpu_pod("pair", gpus=2, gpumem=30000))
    await bind_placed(api, app, extender, pod, await extender.filter(pod, ["n1"]))
    insts = _mig_allocations(api, "pair")
    assert [(i["profile"], i["placement"]["start"], i["deviceIndex"]) for i in insts] == [
        ("4g.71gb", 0, 0), ("4g.71gb", 4, 1)]
    assert app.cache.mig_used[app.cache.nodes["n1"].offset] == 0xFF
    one = api.create("pods", gpu_pod("one", gpumem=3000))      # memory left, but no slice
    assert (await extender.filter(one, ["n1"]))["FailedNodes"] == {"n1": "1/1 CardMigTopologyInfeasible"}
    assert_books_balance(app)


async def test_mig_profile_preference_orders_the_profiles_tried(api, app, extender):
    """nvidia.com/mig-profile-preference (HAMi #3014): the preferred profiles (name or slice key,
    in the order listed) are tried first, the others after them; without it, smallest first."""
    api.create("nodes", _mig_node())
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    placed = {}
    for name, preference in (("plain", None), ("pref", "7g.141gb, 3g"), ("taken", "3g")):
        annotations = {} if preference is None else {"nvidia.com/mig-profile-preference": preference}
        pod = api.create("pods", gpu_pod(name, gpumem=10000, annotations=annotations))
        await bind_placed(api, app, extender, pod, await extender.filter(pod, ["n1"]))
        [inst] = _mig_allocations(api, name)
        placed[name] = (inst["profile"], inst["placement"]["start"])
    assert placed == {
        "plain": ("1g.18gb", 6),     # smallest first, as without the annotation before
        "pref": ("3g.71gb", 0),      # 7g.141gb has no free placement beside it; 3g's free one is 0
        "taken": ("1g.18gb", 5),     # both 3g placements taken: the others, smallest first
    }
    assert_books_balance(app)


async def test_a_pod_on_a_mig_gpu_without_a_placement_record_withholds_the_gpu(api, app, extender):
    """Inventory: mig-fail-closed."""
    from hami_py.devices.codec import encode_pod_devices
    from hami_py.devices.base import ContainerDevice
    node = _mig_node()
    api.create("nodes", node)
    await wait_until(lambda: "n1" in app.cache.nodes, "MIG node registered")
    gpu = app.cache.device_usage("n1")[0]["id"]
    text = encode_pod_devices([[ContainerDevice(gpu, "NVIDIA", 16384, 14)]])
    stray = gpu_pod("stray", gpumem=10000, annotations={
        "hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": text})
    stray["spec"]["nodeName"] = "n1"
    api.create("pods", stray)
    await wait_until(lambda: not app.cache.device_usage("n1")[0]["health"], "GPU withheld")
    pod = api.create("pods", gpu_pod("p", gpumem=1000))
    assert (await extender.filter(pod, ["n1"]))["FailedNodes"] == {"n1": "1/1 CardNotHealth"}
    api.delete("pods", "stray", namespace="default")
    await wait_until(lambda: app.cache.device_usage("n1")[0]["health"], "GPU offered again")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]


class _CountingScores(list):
    """A pair-score table that counts how often the kernel reference reads it, and stops a
    search that reads more than ``limit`` entries (instead of running for hours)."""
    reads = 0
    limit = 0

    def __getitem__(self, index):
        type(self).reads += 1
        if self.reads > self.limit:
            raise AssertionError(f"more than {self.limit} pair scores read")
        return super().__getitem__(index)


def test_topology_aware_on_a_mig_node_weighs_a_bounded_number_of_combinations():
    """A MIG GPU offers an instance per free slice, so 8 MIG GPUs give ~56 candidate picks, and a
    topology-aware pod asking 6 would make C(56, 6) = 32 million combinations (seconds on the
    event loop per node; any user can set the annotation). Only MAX_TOPOLOGY_COMBOS are weighed,
    and the Cython kernel stops at the same one as the reference."""
    from types import SimpleNamespace
    from hami_py.cache.usage import UsageCache
    from hami_py.config import DeviceConfig
    from hami_py.devices.registry import build_vendors
    from hami_py.scheduling.kernel import reference as kernel_ref
    from hami_py.scheduling.decision.filter import Filterer
    from hami_py.scheduling.kernel.fit_query import TABLE_COLUMNS
    from hami_py.scheduling.decision.requests import parse_pod_requests
    from hami_py import _kernel

    vendors = build_vendors(DeviceConfig.default())
    cache = UsageCache(vendors)
    devices = registration("n1", gpus=8, model=H200, mode="mig")
    for d in devices:
        d["migProfiles"] = H200_MIG_PROFILES
    ids = [d["id"] for d in devices]
    scores = [{"uuid": a, "score": {b: 10 + i for i, b in enumerate(ids) if b != a}} for a in ids]
    cache.upsert_node(gpu_node("n1", devices=devices,
                               annotations={"hami.io/node-nvidia-score": orjson.dumps(scores).decode()}))
    pod = gpu_pod("topo", gpus=6, gpumem=10000, annotations={"hami.io/gpu-scheduler-policy": "topology-aware"})
    request = parse_pod_requests(pod, vendors, cache.vendor_ids)
    queries = []
    Filterer(cache, vendors, kernel=lambda table, query: queries.append(query) or -1).decide(
        pod, ["n1"], request, reserve=False)
    [query] = queries

    def run(kernel, pair_score):
        table = SimpleNamespace(**{name: getattr(cache, name) for name in TABLE_COLUMNS})
        table.pair_score = pair_score
        fresh = query.clone()
        return kernel(table, fresh), fresh.outputs()

    pairs = 6 * 5 // 2
    _CountingScores.reads, _CountingScores.limit = 0, kernel_ref.MAX_TOPOLOGY_COMBOS * pairs
    reference = run(kernel_ref.filter_nodes, _CountingScores(cache.pair_score))
    assert reference[0] == 0                                   # it fits, on six instances
    assert _CountingScores.reads == _CountingScores.limit      # the cap was reached: many more existed
    assert run(_kernel.filter_nodes, cache.pair_score) == reference

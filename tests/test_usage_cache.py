"""The usage cache's device columns and the filter's device mask, checked against plain rules.

A pod's model and mode gates (``use-gputype``, ``nouse-gputype``, ``vgpu-mode``) are judged once
per kind of device (vendor, model, mode) and spread over all devices with one bytes.translate;
cordons and UUID lists still go device by device. Whatever the path, every device must get the
reason the vendor's own selector gives it.
"""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import A100_80, H200, L40S, gpu_node, gpu_pod, registration
from hami_py.scheduling.decision.filter import Filterer
from hami_py.scheduling.decision.device_mask import device_mask, kind_mask
from hami_py.scheduling.kernel.fit_query import TABLE_COLUMNS
from hami_py.scheduling.decision.requests import parse_pod_requests

VENDORS = build_vendors(DeviceConfig.default())
MODELS = [H200, A100_80, L40S]


def _node(name: str, model: dict, mode: str, gpus: int, cordon: list[int]) -> dict:
    devices = registration(name, gpus=gpus, model=model, mode=mode)
    annotations = {"hami.io/device-cordon": ",".join(devices[i]["id"] for i in cordon)} if cordon else {}
    return gpu_node(name, devices=devices, annotations=annotations)


nodes_strategy = st.lists(
    st.tuples(st.sampled_from(range(len(MODELS))), st.sampled_from(["hami-core", "mig", "mps"]),
              st.integers(1, 4), st.lists(st.integers(0, 3), max_size=2, unique=True)),
    min_size=1, max_size=6)
gates_strategy = st.fixed_dictionaries({}, optional={
    "nvidia.com/use-gputype": st.sampled_from(["H200", "a100", "L40S,H200", "nothing", " "]),
    "nvidia.com/nouse-gputype": st.sampled_from(["H200", "A100", "l40s"]),
    "hami.io/vgpu-mode": st.sampled_from(["hami-core", "mig", "mps", "hami-core,mig"]),
    "nvidia.com/use-gpuuuid": st.sampled_from(["GPU-none"]),
})


@settings(max_examples=200, deadline=None)
@given(nodes=nodes_strategy, gates=gates_strategy)
def test_device_mask_gives_every_device_its_selectors_reason(nodes, gates):
    cache = UsageCache(VENDORS)
    names = []
    for i, (model, mode, gpus, cordon) in enumerate(nodes):
        name = f"n{i}"
        cache.upsert_node(_node(name, MODELS[model], mode, gpus, [c for c in cordon if c < gpus]))
        names.append(name)
    pod = gpu_pod("p", gpumem=1000, annotations=gates)
    request = parse_pod_requests(pod, VENDORS, cache.vendor_ids)
    cand_idx = [cache.node_index_of.get(n, -1) for n in names]
    mask = device_mask(cache, VENDORS, gates, names, cand_idx, request)
    vendor = VENDORS["NVIDIA"]
    for name in names:
        entry = cache.nodes[name]
        selector = vendor.device_selector(gates, entry.annotations)
        for k, dev in enumerate(entry.devices):
            want = selector(dev) if selector is not None else 0
            have = mask[entry.offset + k] if len(mask) else 0
            assert have == want, (name, dev.type, dev.mode, dev.id, gates, entry.annotations)


def test_a_model_gate_is_judged_once_per_kind_not_per_device():
    """600 nodes of 8 GPUs in three models: the gate is asked three times, not 4 800."""
    cache = UsageCache(VENDORS)
    for i in range(600):
        cache.upsert_node(_node(f"n{i}", MODELS[i % 3], "hami-core", 8, []))
    vendor = VENDORS["NVIDIA"]
    real = vendor.device_selector({"nvidia.com/use-gputype": "H200"}, {})
    asked = []

    def counting(dev):
        asked.append(dev.type)
        return real(dev)
    counting.per_kind = real.per_kind
    mask = kind_mask(cache, {cache.vendor_ids["NVIDIA"]: counting})
    assert sorted(asked) == sorted(m["type"] for m in MODELS)
    assert sum(1 for code in mask if code) == 400 * 8      # the A100 and L40S nodes' GPUs


def test_compaction_keeps_every_device_column_with_its_device():
    """Removed nodes leave dead slots; past a threshold the columns are compacted. Every live
    device must keep its own capacity, usage, kind and id, and the books still balance."""
    cache = UsageCache(VENDORS)
    for i in range(400):
        cache.upsert_node(_node(f"n{i}", MODELS[i % 3], "hami-core", 8, []))
    for i in range(0, 400, 3):      # a third go, then the rest change size: slices move
        cache.remove_node(f"n{i}")
    pod = gpu_pod("p", gpumem=2000, gpucores=20)
    pod["metadata"]["uid"] = "uid-p"
    survivors = [f"n{i}" for i in range(400) if i % 3]
    decision = Filterer(cache, VENDORS).decide(pod, survivors[200:], parse_pod_requests(pod, VENDORS, cache.vendor_ids))
    assert decision.node is not None            # charged on a node that keeps its size
    for name in survivors[:200]:
        i = int(name[1:])
        cache.upsert_node(_node(name, MODELS[i % 3], "hami-core", 4, []))
    assert cache.table.dead_slots < 1024                        # a compaction happened
    for name in survivors:
        entry = cache.nodes[name]
        model = MODELS[int(name[1:]) % 3]
        for k, dev in enumerate(entry.devices):
            j = entry.offset + k
            assert cache.device_ids[j] == dev.id and cache.node_offset[entry.index] == entry.offset
            assert (cache.total_mem[j], cache.vendor[j]) == (model["devmem"], cache.vendor_ids["NVIDIA"])
            vendor_id, sample = cache.kind_samples[cache.kind[j]]
            assert (vendor_id, sample.type, sample.mode) == (cache.vendor[j], dev.type, dev.mode)
    recount = cache.recount()
    for j, dev_id in enumerate(cache.device_ids):
        if dev_id and cache.vendor[j] >= 0:
            assert (cache.used[j], cache.used_mem[j], cache.used_cores[j]) == recount.get(dev_id, (0, 0, 0))
    assert sum(cache.used_mem) == 2000
    # The facade's columns (what /filter hands the kernel) are still the table's, compacted.
    assert set(TABLE_COLUMNS) <= set(cache.table.kernel_arrays())
    for name in cache.table.kernel_arrays():
        assert getattr(cache, name) is getattr(cache.table, name), name
    assert len(cache.total_mem) == len(cache.dev_mig) == len(cache.device_ids) == sum(
        e.length for e in cache.nodes.values()) + cache.table.dead_slots


def test_a_registration_naming_one_device_id_twice_is_refused():
    """Usage is charged by device id: with two devices under one id, a share placed on the second
    would be charged to the first (found by the registration fuzz)."""
    cache = UsageCache(VENDORS)
    devices = registration("twice", gpus=2)
    devices[1]["id"] = devices[0]["id"]
    cache.upsert_node(gpu_node("twice", devices=devices))
    cache.upsert_node(gpu_node("good", gpus=1))
    assert cache.nodes["twice"].decode_error == \
        f"hami.io/node-nvidia-register: device id {devices[0]['id']} is registered more than once"
    assert "twice" not in cache.node_index_of and "good" in cache.node_index_of

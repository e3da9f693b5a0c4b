"""GPU policies beyond binpack/spread: mutex, numa chains, NUMA binding, scoring weights."""
from __future__ import annotations

import orjson
from structlog.testing import capture_logs

from hami_py import cli

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.kernel_codes import (
    CHAIN_BASE, KEY_BINPACK, KEY_NUMA, KEY_SPREAD, ORDER_CHAIN, ORDER_MUTEX, POLICY_BINPACK, POLICY_SPREAD,
)
from hami_py.scheduling.decision.policies import (
    GPU_POLICY_ANNOTATION, NODE_POLICY_ANNOTATION, gpu_policy_code, pod_policies,
)
from tests.conftest import decision_annotations, wait_until


def _devices_of(api, app, name):
    text = decision_annotations(api, app, name)["hami.io/vgpu-devices-allocated"]
    return [d.uuid for c in decode_pod_devices(text) for d in c]


async def _node(api, app, **kw):
    devices = registration("n1", **kw)
    api.create("nodes", gpu_node("n1", devices=devices))
    await wait_until(lambda: "n1" in app.cache.nodes, "node registered")
    return devices


def test_policy_strings_map_to_upstream_orderings():
    assert gpu_policy_code("mutex") == ORDER_MUTEX
    assert gpu_policy_code("numa") == ORDER_CHAIN + KEY_NUMA
    assert gpu_policy_code("binpack,numa") == ORDER_CHAIN + KEY_BINPACK + CHAIN_BASE * KEY_NUMA
    assert gpu_policy_code("topology-aware,mutex") == ORDER_CHAIN + KEY_SPREAD  # no sort key: spread
    assert gpu_policy_code("binpack,spread,binpack", numa_bind=True) == \
        ORDER_CHAIN + KEY_NUMA + CHAIN_BASE * KEY_BINPACK + CHAIN_BASE ** 2 * KEY_SPREAD


async def test_mutex_policy_only_takes_idle_gpus(api, app, extender):
    await _node(api, app, gpus=2, numa_nodes=1)
    ann = {"hami.io/gpu-scheduler-policy": "mutex"}
    for name in ("a", "b"):
        pod = api.create("pods", gpu_pod(name, gpumem=1000, annotations=ann))
        assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert set(_devices_of(api, app, "a")) != set(_devices_of(api, app, "b"))
    pod = api.create("pods", gpu_pod("c", gpumem=1000, annotations={"hami.io/gpu-scheduler-policy": "binpack,mutex"}))
    assert (await extender.filter(pod, ["n1"]))["FailedNodes"] == {"n1": "2/2 ExclusiveDeviceAllocateConflict"}


async def test_numa_bind_keeps_a_multi_gpu_pod_on_one_numa_node(api, app, extender):
    devices = await _node(api, app, gpus=4, numa_nodes=2)  # GPUs 0,1 on NUMA 0; 2,3 on NUMA 1
    busy = api.create("pods", gpu_pod("busy", gpumem=1000, annotations={"nvidia.com/use-gpuuuid": devices[3]["id"]}))
    assert (await extender.filter(busy, ["n1"]))["NodeNames"] == ["n1"]
    pod = api.create("pods", gpu_pod("p", gpus=2, gpumem=1000, annotations={"nvidia.com/numa-bind": "true"}))
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    numa_of = {d["id"]: d["numa"] for d in devices}
    assert len({numa_of[u] for u in _devices_of(api, app, "p")}) == 1
    # Three GPUs never fit within one NUMA node of two.
    big = api.create("pods", gpu_pod("big", gpus=3, gpumem=1000, annotations={"nvidia.com/numa-bind": "true"}))
    result = await extender.filter(big, ["n1"])
    assert result["NodeNames"] is None and "NumaNotFit" in result["FailedNodes"]["n1"]


async def test_gpu_binpack_shares_the_busiest_gpu_and_spread_avoids_it(api, app, extender):
    await _node(api, app, gpus=3, numa_nodes=1)
    first = api.create("pods", gpu_pod("first", gpumem=50000))
    await extender.filter(first, ["n1"])
    busy = _devices_of(api, app, "first")[0]
    bp = api.create("pods", gpu_pod("bp", gpumem=1000, annotations={"hami.io/gpu-scheduler-policy": "binpack"}))
    await extender.filter(bp, ["n1"])
    assert _devices_of(api, app, "bp") == [busy]
    sp = api.create("pods", gpu_pod("sp", gpumem=1000, annotations={"hami.io/gpu-scheduler-policy": "spread"}))
    await extender.filter(sp, ["n1"])
    assert _devices_of(api, app, "sp") != [busy]


async def test_scoring_weights_change_which_gpu_binpack_prefers(api, app, extender):
    await _node(api, app, gpus=2, numa_nodes=1)
    # GPU A: many small tasks (slots busy); GPU B: one big task (memory busy).
    devs = app.cache.device_usage("n1")
    a, b = devs[0]["id"], devs[1]["id"]
    for i in range(3):
        p = api.create("pods", gpu_pod(f"small{i}", gpumem=100, annotations={"nvidia.com/use-gpuuuid": a}))
        await extender.filter(p, ["n1"])
    p = api.create("pods", gpu_pod("large", gpumem=100000, annotations={"nvidia.com/use-gpuuuid": b}))
    await extender.filter(p, ["n1"])
    by_slots = api.create("pods", gpu_pod("by-slots", gpumem=100, annotations={
        "hami.io/gpu-scheduler-policy": "binpack", "hami.io/device-scoring-weights": "slot=1,core=0,memory=0"}))
    await extender.filter(by_slots, ["n1"])
    assert _devices_of(api, app, "by-slots") == [a]
    by_mem = api.create("pods", gpu_pod("by-mem", gpumem=100, annotations={
        "hami.io/gpu-scheduler-policy": "binpack", "hami.io/device-scoring-weights": "slot=0,core=0,memory=1"}))
    await extender.filter(by_mem, ["n1"])
    assert _devices_of(api, app, "by-mem") == [b]


async def test_topology_aware_takes_the_best_connected_pair_and_a_loner_for_one(api, app, extender):
    devices = registration("n1", gpus=4, numa_nodes=1)
    ids = [d["id"] for d in devices]
    # GPUs 1 and 2 share many NVLinks; the rest are plain PCIe.
    link = {(1, 2): 600, (2, 1): 600}
    scores = [{"uuid": ids[a], "score": {ids[b]: link.get((a, b), 20) for b in range(4) if b != a}}
              for a in range(4)]
    node = gpu_node("n1", devices=devices, annotations={"hami.io/node-nvidia-score": orjson.dumps(scores).decode()})
    api.create("nodes", node)
    await wait_until(lambda: "n1" in app.cache.nodes, "node registered")
    ann = {"hami.io/gpu-scheduler-policy": "topology-aware"}
    pair = api.create("pods", gpu_pod("pair", gpus=2, gpumem=1000, annotations=ann))
    assert (await extender.filter(pair, ["n1"]))["NodeNames"] == ["n1"]
    assert set(_devices_of(api, app, "pair")) == {ids[1], ids[2]}
    api.delete("pods", "pair", namespace="default")
    await wait_until(lambda: not app.cache.pods, "pair released")
    one = api.create("pods", gpu_pod("one", gpus=1, gpumem=1000, annotations=ann))
    await extender.filter(one, ["n1"])
    assert _devices_of(api, app, "one")[0] in (ids[0], ids[3])  # keeps the NVLink pair free


def test_pair_score_blocks_never_overlap_when_a_node_grows_or_an_index_is_reused():
    """Each node's NVLink scores sit in a block of the cache's pair_score array. A node whose
    plugin reports more GPUs, or a new node given a removed node's index, once wrote its bigger
    block over the next node's: topology-aware placement there then followed another node's links."""
    def scored_node(name: str, gpus: int, score: int) -> dict:
        ids = [d["id"] for d in registration(name, gpus=gpus)]
        scores = [{"uuid": a, "score": {b: score for b in ids if b != a}} for a in ids]
        return gpu_node(name, devices=registration(name, gpus=gpus),
                        annotations={"hami.io/node-nvidia-score": orjson.dumps(scores).decode()})

    cache = UsageCache(build_vendors(DeviceConfig.default()))

    def block(name: str) -> list[int]:
        entry = cache.nodes[name]
        offset, n = cache.node_pair_offset[entry.index], entry.length
        return list(cache.pair_score[offset:offset + n * n])

    for name, score in (("a", 11), ("b", 22), ("c", 33)):
        cache.upsert_node(scored_node(name, 2, score))
    cache.upsert_node(scored_node("a", 3, 44))               # a's plugin now reports 3 GPUs
    assert block("a") == [0, 44, 44, 44, 0, 44, 44, 44, 0]
    assert block("b") == [0, 22, 22, 0] and block("c") == [0, 33, 33, 0]
    cache.remove_node("c")
    cache.upsert_node(scored_node("z", 3, 9))                # takes c's index
    assert block("z") == [0, 9, 9, 9, 0, 9, 9, 9, 0]
    assert block("a") == [0, 44, 44, 44, 0, 44, 44, 44, 0] and block("b") == [0, 22, 22, 0]


def test_padded_policies_are_trimmed_token_by_token():
    """HAMi #2854: ``" binpack "`` passed validation but was sorted as spread; it is binpack."""
    def policies(annotations, node="binpack", gpu="spread"):
        return pod_policies(annotations, default_node=node, default_gpu=gpu)
    assert policies({GPU_POLICY_ANNOTATION: " binpack "}).gpu == POLICY_BINPACK
    assert policies({GPU_POLICY_ANNOTATION: " binpack , numa "}).gpu == ORDER_CHAIN + KEY_BINPACK + CHAIN_BASE * KEY_NUMA
    assert policies({GPU_POLICY_ANNOTATION: " mutex"}).mutex
    assert policies({NODE_POLICY_ANNOTATION: " spread "}).node == POLICY_SPREAD
    padded = policies({}, node=" spread ", gpu=" binpack ")      # the flags' values, as given
    assert (padded.node, padded.gpu, padded.node_name, padded.gpu_name) == (POLICY_SPREAD, POLICY_BINPACK,
                                                                            "spread", "binpack")


def test_an_unknown_policy_annotation_is_ignored_with_a_warning_and_the_configured_policy_used():
    """HAMi #2769: the pod is scheduled with the configured policy, not refused; before, an
    unknown GPU policy silently meant spread and an unknown node policy binpack, whatever the
    flags said. A comma list is checked token by token."""
    with capture_logs() as logs:
        p = pod_policies({GPU_POLICY_ANNOTATION: "binpak", NODE_POLICY_ANNOTATION: "sprad"},
                         default_node="spread", default_gpu="binpack", pod="default/p")
        chain = pod_policies({GPU_POLICY_ANNOTATION: "numa,bogus"}, default_node="binpack", default_gpu="binpack")
    assert (p.node, p.gpu, p.node_name, p.gpu_name) == (POLICY_SPREAD, POLICY_BINPACK, "spread", "binpack")
    assert chain.gpu == POLICY_BINPACK
    warned = [(e["annotation"], e["value"], e["using"]) for e in logs if e["log_level"] == "warning"]
    assert warned == [(NODE_POLICY_ANNOTATION, "sprad", "spread"), (GPU_POLICY_ANNOTATION, "binpak", "binpack"),
                      (GPU_POLICY_ANNOTATION, "numa,bogus", "binpack")]
    assert next(e for e in logs if e["value"] == "binpak")["pod"] == "default/p"


async def test_a_pod_with_an_unknown_policy_annotation_is_placed_by_the_configured_policy(api, app, extender):
    """End to end: /filter places the pod (no error) where the configured GPU policy (spread,
    the default) puts it: on the idle GPU, not the busy one. A padded ``" binpack "`` then
    shares the busiest."""
    await _node(api, app, gpus=2, numa_nodes=1)
    first = api.create("pods", gpu_pod("first", gpumem=5000))
    await extender.filter(first, ["n1"])
    busy = _devices_of(api, app, "first")[0]
    odd = api.create("pods", gpu_pod("odd", gpumem=1000, annotations={GPU_POLICY_ANNOTATION: "bogus",
                                                                       NODE_POLICY_ANNOTATION: "bogus"}))
    result = await extender.filter(odd, ["n1"])
    assert result["NodeNames"] == ["n1"] and result["Error"] == ""
    assert _devices_of(api, app, "odd") != [busy]
    packed = api.create("pods", gpu_pod("packed", gpumem=1000, annotations={GPU_POLICY_ANNOTATION: " binpack "}))
    await extender.filter(packed, ["n1"])
    assert _devices_of(api, app, "packed") == [busy]


def test_padded_policy_flags_are_trimmed_at_start(monkeypatch):
    """``--gpu-scheduler-policy " binpack "`` is binpack (it used to pass the check and sort as
    spread); ``--node-scheduler-policy " spread "`` is accepted."""
    seen = {}

    async def serve(options, *args, **kwargs):
        seen["options"] = options
        return 0
    monkeypatch.setattr(cli, "serve", serve)
    monkeypatch.setattr(cli, "configure_logging", lambda **kwargs: None)
    assert cli.main(["--node-scheduler-policy", " spread ", "--gpu-scheduler-policy", " binpack , numa "]) == 0
    assert (seen["options"].node_scheduler_policy, seen["options"].gpu_scheduler_policy) == ("spread", "binpack,numa")

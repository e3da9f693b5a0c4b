"""``hami-scheduler simulate``: counts a planner can check by hand, pending reasons, lifetimes,
policy comparison, snapshot inputs, reports, and one-line errors for bad files.

Every scenario runs the real scheduler against the embedded API server (the simulator has no
placement rules of its own), so these tests also pin the simulator to the production path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.offline.cluster import load_cluster
from hami_py.offline.source import InputError
from hami_py.simulate import cli
from hami_py.simulate.progress import ProgressBar
from hami_py.simulate.results import summarize_failed
from hami_py.simulate.runner import Scenario, run_scenario
from hami_py.simulate.workload import load_workload

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _load(cluster_path: str, workload_path: str):
    config = DeviceConfig.default()
    vendors = build_vendors(config)
    return (load_cluster(cluster_path, vendors=vendors),
            load_workload(workload_path, vendors=vendors, device_config=config), config)


async def _simulate(tmp_path: Path, cluster_yaml: str, workload_yaml: str, *, node: str = "binpack",
                    gpu: str = "spread"):
    cluster, workload, config = _load(_write(tmp_path, "cluster.yaml", cluster_yaml),
                                      _write(tmp_path, "workload.yaml", workload_yaml))
    return await run_scenario(cluster=cluster, workload=workload, scenario=Scenario(node, gpu), device_config=config)


def _one_gpu_cluster(*, nodes: int = 1, gpus: int = 1, split: int = 10) -> str:
    count = f"\n    count: {nodes}" if nodes > 1 else ""
    return f"nodes:\n  - name: n{count}\n    gpus: {gpus}\n    model: A100-40GB\n    splitCount: {split}\n"


def _hand_count(*, nodes: int, gpus: int, split: int, memory: int, gpumem: int, gpucores: int, replicas: int) -> int:
    """How many one-GPU pods fit, counted by hand: per GPU the tightest of slots, memory, cores."""
    per_gpu = min(split, memory // gpumem, 100 // gpucores if gpucores else split)
    return min(replicas, nodes * gpus * per_gpu)


# -- counts known by hand ------------------------------------------------------------------------

@pytest.mark.parametrize("nodes, gpus, split, gpumem, gpucores, replicas, reason", [
    (1, 1, 10, 4096, 0, 10, None),                          # the example: exactly full
    (1, 1, 10, 4096, 0, 12, "1/1 CardTimeSlicingExhausted"),  # slots run out first
    (1, 1, 10, 5120, 0, 12, "1/1 CardInsufficientMemory"),    # memory runs out first: 8 fit
    (1, 1, 10, 1024, 30, 5, "1/1 CardInsufficientCore"),      # cores run out first: 3 fit
    (1, 2, 4, 4096, 10, 11, "2/2 CardTimeSlicingExhausted"),  # two GPUs, split 4: 8 fit
    (2, 1, 10, 10240, 0, 10, "1/1 CardInsufficientMemory"),   # two nodes, 4 each
])
async def test_placed_count_matches_a_hand_count(tmp_path, nodes, gpus, split, gpumem, gpucores, replicas, reason):
    workload = f"pods:\n  - name: p\n    replicas: {replicas}\n    gpumem: {gpumem}\n    gpucores: {gpucores}\n"
    result = await _simulate(tmp_path, _one_gpu_cluster(nodes=nodes, gpus=gpus, split=split), workload)
    expected = _hand_count(nodes=nodes, gpus=gpus, split=split, memory=40960, gpumem=gpumem, gpucores=gpucores,
                           replicas=replicas)
    summary = result.summary()
    assert (summary["placed"], summary["pending"]) == (expected, replicas - expected)
    # The books agree with the count: every placed pod holds exactly its share.
    assert summary["memory"]["usedMiB"] == expected * gpumem
    assert summary["slots"]["used"] == expected
    assert summary["cores"]["used"] == expected * gpucores
    pending = [p for p in result.pods if p.state == "pending"]
    names = [f"n-{i}" for i in range(nodes)] if nodes > 1 else ["n"]
    for pod in pending:
        assert pod.node is None and pod.devices == []
        assert pod.failed_nodes == {n: reason for n in names}
        assert pod.reason == f"0/{nodes} nodes are available: {nodes} node(s) {reason}"
    if reason is None:
        assert summary["memory"]["percent"] == 100.0 and summary["slots"]["percent"] == 100.0


async def test_pending_reasons_are_what_failed_nodes_says(tmp_path):
    cluster = ("nodes:\n  - name: n\n    count: 2\n    gpus: 2\n    model: A100-40GB\n"
               "    labels: {zone: earth}\n")
    workload = """pods:
  - {name: wrong-type, gpumem: 1024, gpuType: H200}
  - {name: too-many, gpus: 3, gpumem: 1024}
  - {name: too-big, gpumem: 50Gi}
  - {name: nowhere, gpumem: 1024, nodeSelector: {zone: mars}}
  - {name: fits, gpumem: 1024, nodeSelector: {zone: earth}}
"""
    result = await _simulate(tmp_path, cluster, workload)
    by_name = {p.name: p for p in result.pods}
    expected = {"wrong-type": "2/2 CardTypeMismatch", "too-many": "NodeInsufficientDevice",
                "too-big": "2/2 CardInsufficientMemory"}
    for name, reason in expected.items():
        pod = by_name[name]
        assert pod.failed_nodes == {"n-0": reason, "n-1": reason}, name
        assert pod.reason == f"0/2 nodes are available: 2 node(s) {reason}"
    assert by_name["nowhere"].reason == "0/2 nodes are available: 2 node(s) didn't match the pod's nodeSelector"
    assert by_name["fits"].node in ("n-0", "n-1") and by_name["fits"].reason == ""
    assert result.summary()["pending"] == 4


def test_failed_nodes_summary_groups_reasons_most_common_first():
    failed = {"a": "NodeInsufficientDevice", "b": "1/2 CardInsufficientMemory", "c": "1/2 CardInsufficientMemory"}
    assert summarize_failed(failed, 3) == ("0/3 nodes are available: 2 node(s) 1/2 CardInsufficientMemory; "
                                           "1 node(s) NodeInsufficientDevice")


async def test_lifetimes_free_capacity_and_pending_pods_get_another_try(tmp_path):
    # One 40 GiB GPU; 30 GiB pods. "first" lives 2 arrivals, so the first "later" pod waits for it.
    workload = """pods:
  - {name: first, gpumem: 30Gi, lifetime: 2}
  - {name: later, replicas: 2, gpumem: 30Gi}
"""
    result = await _simulate(tmp_path, _one_gpu_cluster(), workload)
    first, later0, later1 = result.pods
    assert (first.state, first.placed_at, first.completed_at) == ("completed", 0, 2)
    assert (later0.arrival, later0.state, later0.placed_at, later0.attempts) == (1, "running", 2, 2)
    assert later1.state == "pending" and "CardInsufficientMemory" in later1.reason
    summary = result.summary()
    assert (summary["placed"], summary["running"], summary["completed"], summary["pending"]) == (2, 1, 1, 1)
    assert summary["memory"]["usedMiB"] == 30720          # only later-0 still holds memory
    assert summary["peakMemoryPercent"] == 75.0


async def test_fragmentation_is_free_memory_the_typical_request_cannot_use(tmp_path):
    # Three 40 GiB GPUs, two 30 GiB pods spread over two of them: 10 GiB left on each is stranded,
    # the idle GPU's 40 GiB is not.
    workload = "pods:\n  - {name: p, replicas: 2, gpumem: 30Gi, gpucores: 10}\n  - {name: q, gpumem: 1Gi, replicas: 0}\n"
    result = await _simulate(tmp_path, _one_gpu_cluster(gpus=3), workload)
    frag = result.summary()["fragmentation"]
    assert frag["typicalRequest"] == "1 NVIDIA device x 30720 MiB, 10% cores"
    assert (frag["freeMiB"], frag["refusingTypicalMiB"], frag["refusingTypicalGpus"]) == (40960 + 2 * 10240, 2 * 10240, 2)
    assert frag["percent"] == 33.3


async def test_gpu_policy_changes_which_gpus_are_used(tmp_path):
    workload = "pods:\n  - {name: p, replicas: 3, gpumem: 10Gi, gpucores: 10}\n"
    packed = await _simulate(tmp_path, _one_gpu_cluster(gpus=4), workload, gpu="binpack")
    spread = await _simulate(tmp_path, _one_gpu_cluster(gpus=4), workload, gpu="spread")
    assert packed.summary()["gpusInUse"] == 1
    assert spread.summary()["gpusInUse"] == 3


def test_compare_policies_runs_every_pair_through_the_cli(tmp_path):
    cluster = _write(tmp_path, "c.yaml", _one_gpu_cluster(nodes=2, gpus=2))
    workload = _write(tmp_path, "w.yaml", "pods:\n  - {name: p, replicas: 3, gpumem: 10Gi, gpucores: 10}\n")
    proc = subprocess.run([sys.executable, "-m", "hami_py", "simulate", "--cluster", cluster, "--workload", workload,
                           "--compare-policies", "--output", "json", "--gpu-scheduler-policy", "binpack"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    pairs = {(s["nodePolicy"], s["gpuPolicy"]): s for s in report["comparison"]}
    frag = ("fragmentation-aware", "fragmentation-aware")
    assert list(pairs) == [("binpack", "binpack"), ("binpack", "spread"), ("spread", "binpack"), ("spread", "spread"),
                           frag]
    # Counted by hand: binpack fills one node, spread alternates; GPU binpack shares a GPU,
    # GPU spread takes an idle one; fragmentation-aware shares the GPU it broke first.
    assert {k: (s["nodesInUse"], s["gpusInUse"], s["placed"]) for k, s in pairs.items()} == {
        ("binpack", "binpack"): (1, 1, 3), ("binpack", "spread"): (1, 2, 3),
        ("spread", "binpack"): (2, 2, 3), ("spread", "spread"): (2, 3, 3), frag: (1, 1, 3)}
    # The chosen pair's full report is the same run as its comparison row (made in a worker).
    assert report["summary"] == pairs[("binpack", "binpack")]


# -- inputs ---------------------------------------------------------------------------------------

async def test_kubernetes_snapshot_and_manifests_are_accepted():
    cluster, workload, config = _load(str(EXAMPLES / "kubernetes" / "cluster.yaml"),
                                      str(EXAMPLES / "kubernetes" / "workload.yaml"))
    assert cluster.node_names == ["gpu-node-1", "gpu-node-2"]
    assert any("cpu-node-1" in note for note in cluster.notes)
    node1 = cluster.nodes[0]["metadata"]["annotations"]
    assert "hami.io/mutex.lock" not in node1 and node1["hami.io/node-handshake"].startswith("Reported ")
    assert [t.name for t in workload.templates] == ["notebook-alice", "embed", "eval", "big-train"]
    assert [t.replicas for t in workload.templates] == [1, 6, 2, 1]
    alice = workload.templates[0].pod
    assert "nodeName" not in alice["spec"] and "status" not in alice
    assert "hami.io/vgpu-node" not in alice["metadata"]["annotations"]
    assert workload.templates[2].lifetime == 2
    result = await run_scenario(cluster=cluster, workload=workload, scenario=Scenario("binpack", "spread"),
                                device_config=config)
    gpus = {(d.node, d.index): d for d in result.devices}
    # The two running pods of the snapshot still hold their GPUs: train-0 two whole A100s.
    assert gpus[("gpu-node-1", 0)].memory_used == gpus[("gpu-node-1", 1)].memory_used == 81920
    assert not gpus[("gpu-node-2", 1)].health
    states = {p.name: p for p in result.pods}
    assert states["notebook-alice"].state == "running"
    assert states["big-train"].state == "pending"
    assert states["big-train"].failed_nodes == {"gpu-node-1": "4/4 CardInsufficientMemory",
                                                "gpu-node-2": "NodeInsufficientDevice"}
    assert result.summary()["existingPods"] == 2


async def test_the_peak_and_the_pods_per_node_count_the_dumps_own_pods(tmp_path):
    """A cluster dump's running pods are usage from the start (issue 36): the peak was 0 % and
    their nodes showed no pods when the workload placed nothing."""
    workload = _write(tmp_path, "workload.yaml", "pods:\n  - name: nowhere\n    gpumem: 1Gi\n"
                                                 "    nodeSelector:\n      pool: none\n")
    cluster, workload, config = _load(str(EXAMPLES / "defrag/cluster.yaml"), workload)
    result = await run_scenario(cluster=cluster, workload=workload, scenario=Scenario("binpack", "spread"),
                                device_config=config)
    summary = result.summary()
    assert summary["placed"] == 0 and summary["existingPods"] == len(cluster.existing_pods) > 0
    assert summary["memory"]["percent"] > 0
    assert summary["peakMemoryPercent"] == summary["memory"]["percent"]
    expected: dict[str, int] = {}
    for pod in cluster.existing_pods:
        expected[pod["spec"]["nodeName"]] = expected.get(pod["spec"]["nodeName"], 0) + 1
    rows = {row["name"]: row["pods"] for row in result.node_rows()}
    assert rows == {node: expected.get(node, 0) for node in cluster.node_names}
    assert {n["name"]: n["pods"] for n in result.nodes_json()} == rows


def test_a_pod_copied_from_a_live_cluster_loses_its_whole_earlier_decision(tmp_path):
    """A MIG record left on a template would be charged as MIG slices taken by every replica."""
    decision = {
        "hami.io/vgpu-node": "gpu-node-9", "hami.io/vgpu-time": "1700000000",
        "hami.io/vgpu-devices-to-allocate": "GPU-x,NVIDIA,1000,0:;", "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1000,0:;",
        "hami.io/vgpu-mig-allocations": "[]", "hami.io/bind-phase": "success", "hami.io/bind-time": "1700000001",
    }
    workload = _write(tmp_path, "w.yaml", json.dumps({"pods": [{"name": "copy", "template": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "copy", "annotations": {**decision, "team": "a"},
                     "labels": {"hami.io/vgpu-node": "gpu-node-9", "app": "x"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}))
    _, loaded, _ = _load(_write(tmp_path, "c.yaml", _one_gpu_cluster()), workload)
    meta = loaded.templates[0].pod["metadata"]
    assert meta["annotations"] == {"team": "a"} and meta["labels"] == {"app": "x"}


def test_every_example_loads():
    for cluster_file, workload_file in [("small/cluster.yaml", "small/workload.yaml"),
                                        ("realistic/cluster.yaml", "realistic/workload.yaml"),
                                        ("kubernetes/cluster.yaml", "kubernetes/workload.yaml")]:
        cluster, workload, _ = _load(str(EXAMPLES / cluster_file), str(EXAMPLES / workload_file))
        assert cluster.nodes and workload.total_pods
    cluster, workload, _ = _load(str(EXAMPLES / "realistic/cluster.yaml"), str(EXAMPLES / "realistic/workload.yaml"))
    assert (len(cluster.nodes), sum(len(d) for d in cluster.devices.values())) == (16, 128)
    assert 200 <= workload.total_pods <= 400
    # remote GPUs: the CLIs turn the family on for a cluster with servers (hami_py/offline/remote_gpus.py)
    from hami_py.offline.remote_gpus import with_remote_gpus
    from hami_py.offline.source import load_documents
    remote_cluster = str(EXAMPLES / "remote-gpu/cluster.yaml")
    config, note = with_remote_gpus(load_documents(remote_cluster), DeviceConfig.default())
    vendors = build_vendors(config)
    cluster = load_cluster(remote_cluster, vendors=vendors)
    workload = load_workload(str(EXAMPLES / "remote-gpu/workload.yaml"), vendors=vendors, device_config=config)
    assert note and cluster.devices["cpu-0"] == [] and len(cluster.devices["lupine-big"]) == 4
    assert workload.total_pods == 5


def test_each_pod_device_shows_its_share_of_the_device_s_compute(capsys):
    """The pod table reads "N% cores" as a share of the device, whatever the family counts: AMD
    counts compute units (gpucores: 50 of a 304-CU MI300X is 152 CUs, once shown as "152%"), AWS
    Neuron a core mask (both cores of a device are mask 3, once "3%"), NVIDIA percent already."""
    args = ["--cluster", str(EXAMPLES / "all-families/cluster.yaml"),
            "--workload", str(EXAMPLES / "all-families/workload.yaml"), "--no-progress"]
    assert cli.main([*args, "--detail"]) == 0
    rows = {line.split()[0]: " ".join(line.split()[3:]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("default/")}
    assert rows["default/amd-infer-0"].endswith("65536 MiB 50% cores"), rows
    assert rows["default/neuron-infer-0"] == "AWSNeuron #0 0 MiB 100% cores, AWSNeuron #1 0 MiB 100% cores"
    assert rows["default/llm-serve-0"].endswith("20480 MiB 25% cores")
    assert cli.main([*args, "--output", "json"]) == 0
    pods = {p["name"]: p for p in json.loads(capsys.readouterr().out)["pods"]}
    assert [(d["cores"], d["coresPercent"]) for d in pods["amd-infer-0"]["devices"]] == [(152, 50.0)]


def test_workload_orders(tmp_path):
    text = "order: {order}\nseed: 7\npods:\n  - {{name: a, replicas: 3, gpumem: 1024}}\n  - {{name: b, replicas: 2, gpumem: 1024}}\n"
    cluster_path = _write(tmp_path, "c.yaml", _one_gpu_cluster())

    def names(order: str) -> list[str]:
        _, workload, _ = _load(cluster_path, _write(tmp_path, f"{order}.yaml", text.format(order=order)))
        return [a.name for a in workload.arrivals()]

    assert names("as-listed") == ["a-0", "a-1", "a-2", "b-0", "b-1"]
    assert names("interleaved") == ["a-0", "b-0", "a-1", "b-1", "a-2"]
    shuffled = names("shuffled")
    assert sorted(shuffled) == sorted(names("as-listed")) and shuffled == names("shuffled")


_GOOD_CLUSTER = "nodes:\n  - name: n\n    gpus: 1\n    model: H200\n"
_GOOD_WORKLOAD = "pods:\n  - name: p\n    gpumem: 1024\n"


@pytest.mark.parametrize("which, text, expected", [
    ("cluster", "nodes:\n  - name: n\n    gpus: eight\n    model: H200\n",
     'line 3: nodes[0].gpus: expected an integer, got string "eight"'),
    ("cluster", "nodes:\n  - name: n\n    gpu: 8\n    model: H200\n",
     'line 3: nodes[0].gpu: unknown field "gpu" (did you mean "gpus"?)'),
    ("cluster", "nodes:\n  - name: n\n    gpus: 8\n    model: B300\n",
     'line 4: nodes[0].model: unknown GPU model "B300" (known: H200, A100-40GB'),
    ("cluster", "nodes:\n  - name: n\n    gpus: 8\n   model: H200\n", "line 4"),
    ("cluster", "nodes:\n  - name: Node_1\n    gpus: 1\n    model: H200\n",
     'line 2: nodes[0].name: "Node_1" is not a valid node name'),
    ("cluster", "nodes:\n  - name: n\n    devices:\n      - {type: NVIDIA H200}\n",
     'line 4: nodes[0].devices[0]: missing required field "devmem"'),
    ("cluster", "kind: List\nitems:\n- kind: Node\n  metadata:\n    name: n1\n    annotations:\n"
                "      hami.io/node-nvidia-register: '[{\"id\": 5}]'\n",
     'line 7: items[0].metadata.annotations["hami.io/node-nvidia-register"]: the scheduler rejects this registration'),
    ("workload", "pods:\n  - name: p\n    gpumem: 20GB\n",
     'line 3: pods[0].gpumem: expected MiB as a whole number or with a unit (Mi, Gi, Ti), got string "20GB"'),
    ("workload", "pods:\n  - name: p\n    gpus: 1\n  - name: p\n    gpus: 1\n",
     'line 4: pods[1]: pod "default/p" is also made by the pod at line 2; names must be unique'),
    ("workload", "order: random\npods:\n  - name: p\n",
     'line 1: order: must be one of as-listed, interleaved, shuffled, got "random"'),
    ("workload", "kind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    resources:\n"
                 "      limits:\n        nvidia.com/gpu: \"1.5\"\n",
     'line 1: pod "p": the scheduler rejects it: invalid nvidia.com/gpu request in container c: '
     'device count 1.5 is not a plain integer'),
    ("workload", "pods:\n  - name: p\n    gpus: 1\n    nodePolicy: tightest\n",
     'line 4: pods[0].nodePolicy: must be one of binpack, spread, fragmentation-aware, got "tightest"'),
    ("workload", "pods:\n  - name: p\n    gpus: 1\n    annotations:\n"
                 "      hami.io/device-scoring-weights: slot=1\n",
     'line 2: pods[0]: pod "p": the scheduler rejects it: invalid hami.io/device-scoring-weights'),
])
def test_bad_files_are_one_line_naming_file_line_and_field(tmp_path, capsys, which, text, expected):
    cluster = _write(tmp_path, "cluster.yaml", text if which == "cluster" else _GOOD_CLUSTER)
    workload = _write(tmp_path, "workload.yaml", text if which == "workload" else _GOOD_WORKLOAD)
    code = cli.main(["--cluster", cluster, "--workload", workload])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    bad = cluster if which == "cluster" else workload
    assert err.startswith(f"hami-scheduler simulate: {bad}: ") and err.count("\n") == 1
    assert expected in err


def test_missing_file_and_bad_flags(tmp_path, capsys):
    assert cli.main(["--cluster", str(tmp_path / "nope.yaml"), "--workload", "x"]) == 2
    assert "nope.yaml: cannot read file" in capsys.readouterr().err
    assert cli.main(["--cluster", "a", "--workload", "b", "--gpu-scheduler-policy", "tight"]) == 2
    assert capsys.readouterr().err == ('hami-scheduler simulate: --gpu-scheduler-policy: unknown GPU policy "tight" '
                                       "(choose from binpack, spread, fragmentation-aware)\n")
    assert cli.main(["--cluster", "a", "--workload", "b", "--node-scheduler-policy", "numa"]) == 2
    assert capsys.readouterr().err == ('hami-scheduler simulate: --node-scheduler-policy: unknown node policy "numa" '
                                       "(choose from binpack, spread, fragmentation-aware)\n")


@pytest.mark.parametrize("args", [["--cluster", "a", "--workload", "b", "--compare"], ["--compare"],
                                  ["--cluster", "a", "--workload", "b", "--gpu-scheduler=binpack"]])
def test_a_shortened_flag_is_an_unknown_flag_not_an_abbreviation(capsys, args):
    """``--compare`` once ran as ``--compare-policies``; it is named as unknown, before the missing
    files (or flags) are."""
    assert cli.main(args) == 2
    unknown = next(a for a in args if a.startswith(("--compare", "--gpu-")))
    assert capsys.readouterr().err == f"hami-scheduler simulate: unrecognized arguments: {unknown}\n"
    assert cli.build_parser().allow_abbrev is False


def test_input_error_without_line():
    assert str(InputError("f.yaml", None, "", "the file holds no YAML document")) == \
        "f.yaml: the file holds no YAML document"


# -- reports --------------------------------------------------------------------------------------

def test_json_report_of_the_small_example(capsys):
    code = cli.main(["--cluster", str(EXAMPLES / "small/cluster.yaml"), "--workload",
                     str(EXAMPLES / "small/workload.yaml"), "--output", "json"])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    summary, pods = report["summary"], report["pods"]
    assert summary["placed"] + summary["pending"] == len(pods) == 11
    for key in ("memory", "cores", "slots"):
        assert 0 < summary[key]["percent"] <= 100
    placed = [p for p in pods if p["node"] is not None]
    pending = [p for p in pods if p["node"] is None]
    assert len(placed) == summary["placed"] and len(pending) == summary["pending"]
    for pod in placed:
        assert {"namespace", "name", "node", "devices"} <= set(pod) and pod["devices"]
        assert all(d["uuid"].startswith("GPU-") and d["memoryMiB"] > 0 for d in pod["devices"])
    for pod in pending:
        assert pod["reason"].startswith("0/3 nodes are available: ") and pod["devices"] == []
    # Per-GPU books add up to the summary.
    gpus = [g for n in report["nodes"] for g in n["gpus"]]
    assert sum(g["memory"]["usedMiB"] for g in gpus) == summary["memory"]["usedMiB"]
    assert sum(len(p["devices"]) for p in placed) == sum(g["slots"]["used"] for g in gpus)


def test_table_report_of_the_small_example(capsys):
    code = cli.main(["--cluster", str(EXAMPLES / "small/cluster.yaml"), "--workload",
                     str(EXAMPLES / "small/workload.yaml"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Pods        11: 10 placed, 1 pending" in out
    assert "PENDING (1)" in out and "trainer: 0/3 nodes are available" in out
    assert "a100-0" in out and "Fragmented" in out


async def test_progress_counts_each_pod_once_and_the_moves_apart():
    """With --defrag-every, a moved pod's replacement is bound again: that is a re-placement, not
    a new arrival or a new placement (issue 36)."""
    cluster, workload, config = _load(str(EXAMPLES / "small/cluster.yaml"), str(EXAMPLES / "small/workload.yaml"))
    calls = []
    result = await run_scenario(cluster=cluster, workload=workload, scenario=Scenario("binpack", "spread", 5),
                                device_config=config, progress=lambda *args: calls.append(args))
    summary = result.summary()
    assert result.moves > 0
    assert all(placed + pending <= done <= total for done, total, placed, pending, _ in calls)
    done, total, placed, pending, replaced = calls[-1]
    assert done == total == summary["pods"] == 11
    assert (placed, pending) == (summary["placed"], summary["pending"]) == (11, 0)
    assert replaced == result.moves == sum(p.moved for p in result.pods)


def test_progress_bar_draws_then_clears():
    stream = StringIO()
    bar = ProgressBar(stream=stream, enabled=True, width=10, min_interval_s=0)
    bar.start("binpack/spread")
    bar.update(3, 10, 2, 1)
    bar.update(10, 10, 9, 1, 4)
    bar.finish()
    text = stream.getvalue()
    assert "binpack/spread [###-------] 3/10 pods arrived, 2 placed, 1 pending" in text
    assert "[##########] 10/10 pods arrived, 9 placed, 4 re-placed after moves, 1 pending" in text
    assert text.endswith("\r")
    quiet = StringIO()
    ProgressBar(stream=quiet).update(1, 2, 1, 0)   # not a terminal: nothing drawn
    assert quiet.getvalue() == ""

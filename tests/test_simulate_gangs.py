"""``hami-scheduler simulate`` with gang workloads (issue 34): a ``podGroup`` entry makes its
replicas one gang, which the real scheduler places whole or not at all; the reports say which
gangs were placed and why the others wait.

As in tests/test_simulate.py, every run is the real scheduler against the embedded API server
(here serving scheduler-plugins' PodGroup CRD), so the figures are the production path's.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.simulate import cli
from hami_py.simulate.workload import load_workload

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "gangs"

SIX_GPUS = "nodes:\n  - name: n\n    count: 3\n    gpus: 2\n    model: A100-40GB\n"


def _gang(name: str, *, replicas: int = 4, extra: str = "") -> str:
    """An entry of one-GPU workers (a whole GPU each) forming the PodGroup ``name``."""
    return (f"  - name: {name}\n    replicas: {replicas}\n    gpus: 1\n    gpumemPercentage: 100\n"
            f"    podGroup: {{name: {name}, minMember: {replicas}}}\n{extra}")


TWO_GANGS = "pods:\n" + _gang("a") + _gang("b")


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(capsys, cluster: str, workload: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--cluster", cluster, "--workload", workload, "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, cluster: str, workload: str, *args: str) -> dict:
    code, out, err = _run(capsys, cluster, workload, "--output", "json", *args)
    assert code == 0, err
    return json.loads(out)


def _used_gpus(report: dict) -> set[str]:
    return {g["uuid"] for n in report["nodes"] for g in n["gpus"] if g["slots"]["used"]}


def test_two_gangs_on_six_gpus_one_placed_whole_the_other_waits_holding_nothing(tmp_path, capsys):
    cluster, workload = _write(tmp_path, "cluster.yaml", SIX_GPUS), _write(tmp_path, "workload.yaml", TWO_GANGS)
    report = _json(capsys, cluster, workload)
    pods = {p["name"]: p for p in report["pods"]}
    a = [pods[f"a-{i}"] for i in range(4)]
    b = [pods[f"b-{i}"] for i in range(4)]
    # The first gang is bound whole within the arrival of its fourth member, one GPU each.
    assert [(p["state"], p["placedAt"], p["gang"]) for p in a] == [("running", 3, "PodGroup default/a")] * 4
    assert len({d["uuid"] for p in a for d in p["devices"]}) == 4
    # The second holds nothing: only the first gang's four GPUs are in use, and each of its
    # members waits with the gang's answer.
    assert [(p["state"], p["devices"]) for p in b] == [("pending", [])] * 4
    assert _used_gpus(report) == {d["uuid"] for p in a for d in p["devices"]}
    assert {p["reason"] for p in b} == {"0/3 nodes are available: 3 node(s) PodGroup default/b: 2 of 4 members fit"}
    summary = report["summary"]
    assert summary["gpusInUse"] == 4 and summary["wholeDevicesFree"] == 2
    assert summary["gangs"] == {"placed": 1, "waiting": 1, "each": [
        {"gang": "PodGroup default/a", "minMember": 4, "members": 4, "placed": 4, "state": "placed"},
        {"gang": "PodGroup default/b", "minMember": 4, "members": 4, "placed": 0, "state": "waiting",
         "reason": "PodGroup default/b: 2 of 4 members fit"}]}
    # A waiting gang member is not a fragmentation failure: free memory would hold it alone,
    # but it waits for its gang's room.
    assert summary["fragmentationFailures"] == 0

    code, out, _ = _run(capsys, cluster, workload)
    assert code == 0
    assert ("Gangs       2: 1 placed whole, 1 waiting\n"
            "            waiting: PodGroup default/b: 2 of 4 members fit\n") in out

    html = tmp_path / "report.html"
    code, _, _ = _run(capsys, cluster, workload, "--output", "html", "--report-file", str(html))
    assert code == 0
    assert ("Gangs (<code>gangs</code>): 1 placed whole, 1 waiting: PodGroup default/b: 2 of 4 members fit."
            in html.read_text())


def test_an_incomplete_gang_says_how_many_members_exist(tmp_path, capsys):
    """A gang whose minMember is more than the workload makes never places any of its members."""
    workload = "pods:\n" + _gang("a", replicas=3).replace("minMember: 3", "minMember: 5")
    report = _json(capsys, _write(tmp_path, "cluster.yaml", SIX_GPUS), _write(tmp_path, "workload.yaml", workload))
    assert report["summary"]["gpusInUse"] == 0
    assert report["summary"]["gangs"]["each"][0]["reason"] == "PodGroup default/a: 3 of 5 members exist"


def test_with_lifetimes_the_waiting_gang_runs_whole_once_the_first_finishes(capsys):
    """The example: train-a (lifetime 5) is placed at arrival 3 and deleted at arrival 8;
    train-b, refused meanwhile, is placed whole at arrival 8, before the inference pod arrives."""
    report = _json(capsys, str(EXAMPLE / "cluster.yaml"), str(EXAMPLE / "workload.yaml"))
    pods = {p["name"]: p for p in report["pods"]}
    assert [(pods[f"train-a-{i}"]["placedAt"], pods[f"train-a-{i}"]["completedAt"]) for i in range(4)] == [(3, 8)] * 4
    assert [(pods[f"train-b-{i}"]["state"], pods[f"train-b-{i}"]["placedAt"]) for i in range(4)] == \
        [("running", 8)] * 4
    assert pods["inference"]["state"] == "running"
    summary = report["summary"]
    assert (summary["gangs"]["placed"], summary["gangs"]["waiting"]) == (2, 0)
    # Four whole GPUs for train-b and the inference pod on a fifth: train-a's are given back.
    assert summary["gpusInUse"] == 5


def test_compare_policies_reports_the_gangs_of_every_pair(tmp_path, capsys):
    cluster, workload = _write(tmp_path, "cluster.yaml", SIX_GPUS), _write(tmp_path, "workload.yaml", TWO_GANGS)
    report = _json(capsys, cluster, workload, "--compare-policies")
    assert len(report["comparison"]) == 5
    for summary in report["comparison"]:
        assert (summary["gangs"]["placed"], summary["gangs"]["waiting"], summary["gpusInUse"]) == (1, 1, 4), summary
    code, out, _ = _run(capsys, cluster, workload, "--compare-policies")
    assert code == 0
    header = next(line for line in out.splitlines() if line.strip().startswith("POLICIES"))
    assert header.rstrip().endswith("GANGS")
    rows = [line for line in out.splitlines() if line.strip().startswith(("binpack/", "spread/", "fragmentation"))]
    assert len(rows) == 5 and all(" 1/2" in row for row in rows)


def test_kubernetes_manifests_with_a_podgroup_make_a_gang(tmp_path, capsys):
    """PodGroup objects in a file of plain manifests are created as they are; a Job's pods
    labelled with it are its members."""
    workload = """apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: train}
spec: {minMember: 8}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  parallelism: 8
  template:
    metadata:
      labels: {scheduling.x-k8s.io/pod-group: train}
    spec:
      containers:
        - name: worker
          image: trainer
          resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 100}}
"""
    report = _json(capsys, _write(tmp_path, "cluster.yaml", SIX_GPUS), _write(tmp_path, "workload.yaml", workload))
    assert report["summary"]["gpusInUse"] == 0 and report["summary"]["pending"] == 8
    assert report["summary"]["gangs"]["each"][0]["reason"] == "PodGroup default/train: 6 of 8 members fit"


def test_entries_naming_one_group_are_one_gang(tmp_path):
    """A launcher and its workers: minMember defaults to every replica the workload makes for it."""
    text = ("pods:\n  - name: launcher\n    gpus: 1\n    podGroup: job\n"
            "  - name: worker\n    replicas: 3\n    gpus: 1\n    podGroup: job\n")
    config = DeviceConfig.default()
    workload = load_workload(_write(tmp_path, "w.yaml", text), vendors=build_vendors(config), device_config=config)
    assert workload.podgroups == [{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                   "metadata": {"name": "job", "namespace": "default"}, "spec": {"minMember": 4}}]
    assert workload.gang_sizes == {"PodGroup default/job": 4}
    assert all(t.pod["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "job"} for t in workload.templates)


@pytest.mark.parametrize("text, expected", [
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: {name: g, minMember: 0}\n",
     "line 4: pods[0].podGroup.minMember: must be at least 1, got 0"),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: {name: g, minMembers: 2}\n",
     'line 4: pods[0].podGroup.minMembers: unknown field "minMembers" (did you mean "minMember"?)'),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: {minMember: 2}\n",
     'line 4: pods[0].podGroup: missing required field "name"'),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: Train_A\n",
     'line 4: pods[0].podGroup: "Train_A" is not a PodGroup name'),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: {name: g, scheduleTimeoutSeconds: soon}\n",
     'line 4: pods[0].podGroup.scheduleTimeoutSeconds: expected an integer, got string "soon"'),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: {name: g, minMember: 2}\n"
     "  - name: q\n    gpus: 1\n    podGroup: {name: g, minMember: 3}\n",
     'line 7: pods[1].podGroup: PodGroup "g" has minMember 2 at line 4, not 3: entries of one group must agree'),
    ("pods:\n  - name: p\n    gpus: 1\n    podGroup: [g]\n",
     "line 4: pods[0].podGroup: expected a mapping"),
    ("kind: PodGroup\napiVersion: scheduling.x-k8s.io/v1alpha1\nmetadata: {name: g}\nspec: {minMember: two}\n---\n"
     "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    resources: {limits: {nvidia.com/gpu: 1}}\n",
     "line 4: spec: PodGroup \"g\": spec.minMember is 'two', not a whole number >= 0"),
])
def test_a_malformed_pod_group_is_a_one_line_error(tmp_path, capsys, text, expected):
    workload = _write(tmp_path, "workload.yaml", text)
    code, out, err = _run(capsys, _write(tmp_path, "cluster.yaml", SIX_GPUS), workload)
    assert code == 2 and out == ""
    assert err.startswith(f"hami-scheduler simulate: {workload}: ") and err.count("\n") == 1
    assert expected in err, err


def test_kueue_pod_groups_are_gangs_too(tmp_path, capsys):
    """Kueue's labels need no PodGroup object: the total-count annotation is the minimum."""
    def kueue(name: str) -> str:
        return (f"  - name: {name}\n    replicas: 4\n    gpus: 1\n    gpumemPercentage: 100\n"
                f"    labels: {{kueue.x-k8s.io/pod-group-name: {name}}}\n"
                f"    annotations: {{kueue.x-k8s.io/pod-group-total-count: '4'}}\n")
    workload = _write(tmp_path, "workload.yaml", "pods:\n" + kueue("k1") + kueue("k2"))
    report = _json(capsys, _write(tmp_path, "cluster.yaml", SIX_GPUS), workload)
    gangs = report["summary"]["gangs"]
    assert (gangs["placed"], gangs["waiting"], report["summary"]["gpusInUse"]) == (1, 1, 4)
    assert gangs["each"][1]["reason"] == "Kueue pod group default/k2: 2 of 4 members fit"

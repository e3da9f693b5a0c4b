"""What the fragmentation-aware policy and the defragmenter win, as ``simulate`` reports it on
``examples/churn`` (docs/FRAGMENTATION.md quotes these runs): the claims a capacity planner reads
there are checked here, through the command a planner runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHURN = REPO / "examples" / "churn"
FRAG = ("fragmentation-aware", "fragmentation-aware")


def _simulate(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "hami_py", "simulate", "--cluster", str(CHURN / "cluster.yaml"),
                           "--workload", str(CHURN / "workload.yaml"), "--output", "json", "--no-progress", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _keys(value) -> list[str]:
    """Every key of a JSON value, nested objects included."""
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in (key, *_keys(item))]
    if isinstance(value, list):
        return [k for item in value for k in _keys(item)]
    return []


def test_on_the_churn_example_fragmentation_aware_places_most_and_strands_least_of_the_best():
    report = _simulate("--compare-policies")
    pairs = {(s["nodePolicy"], s["gpuPolicy"]): s for s in report["comparison"]}
    frag = pairs.pop(FRAG)
    assert len(pairs) == 4
    assert frag["placed"] > max(s["placed"] for s in pairs.values()), {k: s["placed"] for k, s in pairs.items()}
    # The classic pair that packs best (most placed, then fewest GPUs in use) strands more.
    best = min(pairs.values(), key=lambda s: (-s["placed"], s["gpusInUse"], s["strandedMiBMean"]))
    assert frag["strandedMiBMean"] < best["strandedMiBMean"]
    assert frag["fragmentationFailures"] <= best["fragmentationFailures"]


def test_defrag_every_leaves_no_pending_pod_that_moves_could_place():
    report = _simulate("--node-scheduler-policy", "binpack", "--gpu-scheduler-policy", "binpack",
                       "--defrag-every", "25")
    summary = report["summary"]
    assert summary["defragEvery"] == 25 and summary["defragRuns"] > 0
    assert summary["moves"] > 0
    assert summary["pendingMovesCouldPlace"] == 0
    # Each figure under one name: stranded memory (at the end, mean over the arrivals) and the
    # free memory refusing the typical request were all "strandedMiB" once.
    keys = _keys(summary)
    assert "strandedMiB" not in keys and "meanStrandedMiB" not in keys
    for key in ("strandedMiBAtEnd", "strandedMiBMean", "refusingTypicalMiB", "refusingTypicalGpus"):
        assert keys.count(key) == 1, key
    # Every moved pod ran again (or waits, with a reason): nothing the moves touched is lost or
    # charged twice. One entry per workload pod (120 + 60 + 30 + 16 + 8 replicas), and the
    # scheduler's books hold exactly the devices of the pods the report says are running.
    pods = report["pods"]
    assert len({(p["namespace"], p["name"]) for p in pods}) == len(pods) == 234
    running = [p for p in pods if p["state"] == "running"]
    assert sum(d["memoryMiB"] for p in running for d in p["devices"]) == summary["memory"]["usedMiB"]
    assert sum(d["cores"] for p in running for d in p["devices"]) == summary["cores"]["used"]
    assert all(p["reason"] for p in pods if p["state"] == "pending")


def test_the_table_and_the_html_report_show_the_fragmentation_figures(tmp_path):
    small = REPO / "examples" / "small"
    base = [sys.executable, "-m", "hami_py", "simulate", "--cluster", str(small / "cluster.yaml"),
            "--workload", str(small / "workload.yaml"), "--no-progress", "--defrag-every", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    table = subprocess.run(base, capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert table.returncode == 0, table.stderr[-3000:]
    lines = {line.split()[0]: line for line in table.stdout.splitlines() if line.strip()}
    assert "MiB on GPUs out of slots or cores" in lines["Stranded"] and "whole GPUs free" in lines["Stranded"]
    assert "although free memory would hold them" in lines["Pending"]
    assert lines["Defrag"].startswith("Defrag      every 5 arrivals:") and "pods moved" in lines["Defrag"]
    page = tmp_path / "report.html"
    html = subprocess.run([*base, "--output", "html", "--report-file", str(page)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=env)
    assert html.returncode == 0, html.stderr[-3000:]
    text = page.read_text()
    for label in ("stranded MiB", "whole devices free", "pending, memory free", "pods moved"):
        assert label in text

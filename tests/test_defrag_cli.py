"""``hami-scheduler defrag`` end to end on examples/defrag: the real scheduler started over the
dump (in-repo API server), the plan printed as a user reads it.

The dump's optimum is known by hand (its header says why): two moves, serve-c and serve-d off
gpu-b, for team-a/train-0.
"""
from __future__ import annotations

import json
import os

from hami_py.cli import main as hami_main

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "defrag", "cluster.yaml")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = hami_main(["defrag", "--cluster", EXAMPLE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_plan_on_the_example_has_exactly_the_known_optimum(capsys):
    code, out, err = run(capsys, "--output", "json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["satisfied"] is True and plan["reason"] == "" and plan["exact"] is True
    assert sorted(m["pod"] for m in plan["moves"]) == ["team-b/serve-c", "team-b/serve-d"]
    assert all(m["node"] == "gpu-b" and m["to"] in ("gpu-a", "gpu-c") for m in plan["moves"])
    assert plan["makesRoomFor"] == ["team-a/train-0"]
    assert plan["placements"][0]["node"] == "gpu-b"


def test_free_two_whole_a100_on_one_node_frees_gpu_b_with_two_moves(capsys):
    code, out, err = run(capsys, "--free", "2", "--model", "A100", "--output", "json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["satisfied"] and len(plan["moves"]) == 2
    assert {d["node"] for d in plan["freedDevices"]} == {"gpu-b"} and len(plan["freedDevices"]) == 2


def test_an_unreachable_goal_exits_1_with_a_reason(capsys):
    code, out, _ = run(capsys, "--free", "3", "--output", "json")
    assert code == 1
    plan = json.loads(out)
    assert plan["satisfied"] is False and "no node has 3" in plan["reason"]
    code, out, _ = run(capsys, "--max-moves", "1", "--output", "json")
    assert code == 1
    plan = json.loads(out)
    assert not plan["satisfied"] and plan["moves"] == []
    assert "team-a/train-0" in plan["reason"] and "--max-moves" in plan["reason"]


def test_the_table_names_moves_and_the_pod_made_room_for(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    assert "satisfied, 2 moves" in out and "team-b/serve-c" in out and "team-a/train-0" in out


def test_bad_flags_and_files_are_one_line_and_exit_2(capsys, tmp_path):
    for args in (["--free", "0"], ["--model", "A100"], ["--output", "pdf"], ["--execute"],
                 ["--report-file", "x.html"], ["--node-scheduler-policy", "tightest"]):
        code, out, err = run(capsys, *args)
        assert code == 2, args
        assert out == "" and err.count("\n") == 1 and err.startswith("hami-scheduler defrag: "), (args, err)
    bad = tmp_path / "cluster.yaml"
    bad.write_text("apiVersion: v1\nkind: List\nitems:\n- kind: Node\n  metadata: 7\n")
    code = hami_main(["defrag", "--cluster", str(bad)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "cluster.yaml: line 5: items[0].metadata" in err, err
    code = hami_main(["defrag", "--cluster", str(tmp_path / "missing.yaml")])
    _, err = capsys.readouterr()
    assert code == 2 and "cannot read file" in err and err.count("\n") == 1


def test_an_unknown_policy_names_the_choices_and_a_shortened_flag_is_unknown(capsys):
    code, out, err = run(capsys, "--gpu-scheduler-policy", "tightest")
    assert (code, out) == (2, "")
    assert err == ('hami-scheduler defrag: --gpu-scheduler-policy: unknown GPU policy "tightest" (choose from '
                   "binpack, spread, fragmentation-aware, mutex, numa, topology-aware, or a comma list of them "
                   "such as numa,binpack)\n")
    code, _, err = run(capsys, "--gpu-scheduler-policy", "numa, binpak")
    assert code == 2 and 'unknown GPU policy "binpak" in "numa, binpak" (choose from binpack, spread' in err, err
    code, _, err = run(capsys, "--node-scheduler-policy", "numa")
    assert err == ('hami-scheduler defrag: --node-scheduler-policy: unknown node policy "numa" '
                   "(choose from binpack, spread, fragmentation-aware)\n")
    # A chain the scheduler takes is taken here too.
    assert run(capsys, "--gpu-scheduler-policy", "numa,binpack", "--output", "json")[0] == 0
    # No abbreviations: --max-move is not --max-moves, and is named before the missing --cluster.
    for args, unknown in ((["--cluster", EXAMPLE, "--max-move", "1"], "--max-move"),
                          (["--max-move=1"], "--max-move=1")):
        assert hami_main(["defrag", *args]) == 2
        assert capsys.readouterr().err == f"hami-scheduler defrag: unrecognized arguments: {unknown}\n"


def test_html_report_shows_each_touched_device_before_and_after(capsys, tmp_path):
    target = tmp_path / "plan.html"
    code, out, _ = run(capsys, "--output", "html", "--report-file", str(target))
    assert code == 0 and str(target) in out
    html = target.read_text()
    assert "Memory before" in html and "Memory after" in html
    plan = json.loads(run(capsys, "--output", "json")[1])
    touched = {"gpu-b"} | {m["to"] for m in plan["moves"]}
    for node in ("gpu-a", "gpu-b", "gpu-c"):
        assert (f"<h3>{node}</h3>" in html) == (node in touched), node
    gpu_b = html.split("<h3>gpu-b</h3>")[1].split("</table>")[0]
    # Before: 24000 MiB on each GPU, one slot; after: train-0 takes both GPUs whole.
    assert gpu_b.count("24000/40960 MiB") == 2 and gpu_b.count("40960/40960 MiB") == 2


async def test_a_live_cluster_is_listed_read_only_and_planned_like_its_dump(tmp_path):
    """The example's objects served by the in-repo API server, read through --kubeconfig's path
    (snapshot_live): the same pending pod, budget and plan as the dump, and nothing written."""
    from hami_py.config import DeviceConfig
    from hami_py.defrag.planner import Planner
    from hami_py.defrag.world import load_snapshot, open_world, snapshot_live
    from hami_py.devices.registry import build_vendors
    from hami_py.fakeapi import FakeApiServer, write_kubeconfig
    from hami_py.devices.registry import EVERY_FAMILY
    from hami_py.offline.source import kubernetes_objects, load_documents, plain

    vendors = build_vendors(DeviceConfig.default(), EVERY_FAMILY)
    api = FakeApiServer()
    await api.start()
    try:
        plural = {"Node": "nodes", "Pod": "pods", "PodDisruptionBudget": "poddisruptionbudgets"}
        for obj, _ in kubernetes_objects(load_documents(EXAMPLE)):
            api.create(plural[obj["kind"]], plain(obj))
        versions = {n: api.get("nodes", n)["metadata"]["resourceVersion"] for n in ("gpu-a", "gpu-b", "gpu-c")}
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url)
        live = await snapshot_live(kubeconfig=kubeconfig, context=None, vendors=vendors)
        dump = load_snapshot(EXAMPLE, vendors=vendors)
        assert [p["metadata"]["name"] for p in live.pending] == ["train-0"]
        assert [(b.key, b.allowed) for b in live.budgets] == [(b.key, b.allowed) for b in dump.budgets]
        async with open_world(live, device_config=DeviceConfig.default()) as world:
            plan = Planner(world).make_room(world.pending)
        assert plan.satisfied and sorted(m.pod for m in plan.moves) == ["team-b/serve-c", "team-b/serve-d"]
        assert {n: api.get("nodes", n)["metadata"]["resourceVersion"] for n in versions} == versions
        assert api.get("pods", "train-0", "team-a")["spec"].get("nodeName") is None
    finally:
        await api.stop()

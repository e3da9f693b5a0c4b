"""``defrag --execute`` against the real control plane: the real kube-apiserver's Eviction API and
PodDisruptionBudgets, the real kube-scheduler (v1.35) with hami-py as its extender, as deployed
(no --device-preemption: the defragmenter's holds are always on).

The executor (hami_py/defrag/execute.py) runs as an administrator would run the CLI, with a client
of its own. The plan is written by hand (the planner has its own tests): the point here is what
the cluster does with it. No kubelet runs: the test confirms terminating pods gone, as one would.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

import pytest

from hami_py.defrag.execute import execute_plan
from hami_py.defrag.plan import Move, Placement, Plan
from hami_py.embedded import wait_for
from hami_py.fakeapi.objects import gpu_uuid
from hami_py.scheduling.eviction.defrag_holds import HOLD_ANNOTATION
from tests.realk8s import budget_allowing_no_disruption, wait_books_balance, wait_for_value
from tests.test_real_k8s_kube_scheduler import (  # noqa: F401  (fixtures, found by name)
    T4, bound, extender_port, hami, priority_classes, real_options, registered, running_and_ready, scheduled_pod,
    sidecar, tls_files,
)

pytestmark = [pytest.mark.real_k8s, pytest.mark.real_kube_scheduler]
REPO = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def kubelet(kube, namespace: str):
    """The kubelets' part while it runs: a pod being deleted is confirmed gone."""
    async def confirm():
        while True:
            for pod in await kube.list("pods", namespace=namespace):
                if pod["metadata"].get("deletionTimestamp"):
                    await kube.delete("pods", pod["metadata"]["name"], namespace=namespace, grace=0)
            await asyncio.sleep(0.1)
    task = asyncio.create_task(confirm())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def move(pod: dict, node: str) -> Move:
    meta = pod["metadata"]
    return Move(meta["namespace"], meta["name"], meta["uid"], node, node)


def room_for(pod: dict, node: str, *victims: dict) -> Placement:
    meta = pod["metadata"]
    return Placement(meta["namespace"], meta["name"], meta["uid"], node, [v["metadata"]["uid"] for v in victims])


def allocated(pod: dict) -> str:
    annotations = pod["metadata"].get("annotations") or {}
    return " ".join(v for k, v in annotations.items() if k.endswith("devices-allocated"))


async def pending_with_failed_scheduling(kube, pod: dict) -> None:
    await wait_for_value(lambda: kube.events_for(pod), lambda ev: any(r == "FailedScheduling" for _, _, r, _ in ev),
                         what=f"FailedScheduling of {pod['metadata']['name']}", timeout=30)


async def test_execute_evicts_through_the_api_a_budget_replans_and_kube_scheduler_places_the_pod_on_the_freed_gpu(
        hami, real_kube, real_namespace, real_nodes, priority_classes):
    """One node, two T4s (10000 MiB): ``a`` and ``b`` (6000 MiB each) take one each, and a budget
    allows ``b`` no disruption. ``big`` (8000 MiB) fits nowhere; nor does ``thief`` (5000 MiB, of a
    higher priority, so kube-scheduler tries it first). The first plan moves ``b``: its eviction is
    refused (429), the plan is replanned to move ``a``, whose eviction goes through. kube-scheduler
    then places ``big`` on ``a``'s GPU, which the hold kept from the thief."""
    ns, app, label = real_namespace, hami, real_nodes.label
    (node,) = await real_nodes(1, gpus=2, model=T4)
    await registered(app, [node])
    victims = {}
    for name in ("a", "b"):
        manifest = scheduled_pod(name, ns, label, gpumem=6000)
        manifest["metadata"]["labels"] = {"app": name}
        await real_kube.create("pods", manifest)
        victims[name] = await bound(real_kube, ns, name)
        await running_and_ready(real_kube, ns, name)
    a_gpu = next(gpu_uuid(node, i) for i in range(2) if gpu_uuid(node, i) in allocated(victims["a"]))
    await budget_allowing_no_disruption(real_kube, ns, "keep-b", app="b")
    big = await real_kube.create("pods", scheduled_pod("big", ns, label, gpumem=8000))
    thief_manifest = scheduled_pod("thief", ns, label, gpumem=5000)
    thief_manifest["spec"]["priorityClassName"] = priority_classes["high"]
    thief = await real_kube.create("pods", thief_manifest)
    for pod in (big, thief):
        await pending_with_failed_scheduling(real_kube, pod)

    first = Plan(goal="room for 1 pending pod", satisfied=True, moves=[move(victims["b"], node)],
                 placements=[room_for(big, node, victims["b"])])
    second = Plan(goal="room for 1 pending pod", satisfied=True, moves=[move(victims["a"], node)],
                  placements=[room_for(big, node, victims["a"])])
    asked = []

    def replan(refused: set[str]) -> Plan:
        asked.append(refused)
        return second

    async with kubelet(real_kube, ns):
        done = await execute_plan(plan=first, client=real_kube.client, replan=replan, rate_per_s=10, wait_s=60)
        placed = await bound(real_kube, ns, "big", timeout=60)

    assert done.complete, done.as_json()
    assert asked == [{victims["b"]["metadata"]["uid"]}]
    assert done.refused.keys() == {f"{ns}/b"} and done.refused[f"{ns}/b"].startswith("429 "), done.refused
    assert done.evicted == [f"{ns}/a"] and done.plans == 2
    assert await real_kube.get("pods", "a", namespace=ns) is None
    b = await real_kube.get("pods", "b", namespace=ns)
    assert b["spec"]["nodeName"] == node and not b["metadata"].get("deletionTimestamp")

    assert placed["spec"]["nodeName"] == node
    assert a_gpu in allocated(placed), "big was not placed on the GPU a freed"
    assert HOLD_ANNOTATION in placed["metadata"]["annotations"]        # the executor's, left as written
    assert (await real_kube.get("pods", "thief", namespace=ns))["spec"].get("nodeName") is None
    events = await wait_for_value(lambda: real_kube.events_for(victims["a"]),
                                  lambda ev: any(r == "Defragmented" for _, _, r, _ in ev), what="Defragmented on a")
    ((source, type_, message),) = [(s, t, m) for s, t, r, m in events if r == "Defragmented"]
    assert (source, type_) == ("hami-defrag", "Normal")
    assert f"to make room for pod {ns}/big on node {node}" in message, message
    counted = app.metrics.registry.get_sample_value
    assert counted("hami_defrag_holds_total", {"outcome": "held"}) == 2            # one hold per plan
    assert counted("hami_defrag_holds_total", {"outcome": "placed"}) == 1
    await wait_for(lambda: not app.service.defrag_holds.holds, timeout=10, what="no hold left")
    await wait_books_balance(real_kube, app)


async def test_the_cli_plans_from_the_live_cluster_and_executes_end_to_end(
        hami, real_kube, real_namespace, real_nodes, control_plane, tmp_path):
    """``hami-scheduler defrag --kubeconfig --execute --output json``, the binary as an operator runs
    it. Two nodes of two T4s (10000 MiB): pods of a ReplicaSet take 6000 and 6000 MiB on node 1,
    3000 and 6000 on node 2. ``big`` (8000 MiB) fits nowhere. One move makes room (a pod whose
    replacement fits again elsewhere); the CLI plans it from the live cluster, evicts through the
    API, and the real kube-scheduler places ``big`` on the GPU the move freed."""
    ns, app, label = real_namespace, hami, real_nodes.label
    n1, n2 = await real_nodes(2, gpus=2, model=T4)
    await registered(app, [n1, n2])
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "serve", "uid": "5f0e0c7e-0000-4000-8000-000000000001",
             "controller": True}
    placed = {}
    for name, node, mem in (("a", n1, 6000), ("b", n1, 6000), ("x", n2, 3000), ("y", n2, 6000)):
        manifest = scheduled_pod(name, ns, label, gpumem=mem)
        manifest["metadata"]["ownerReferences"] = [owner]
        manifest["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
        await real_kube.create("pods", manifest)
        placed[name] = await bound(real_kube, ns, name)
        await running_and_ready(real_kube, ns, name)
    big = await real_kube.create("pods", scheduled_pod("big", ns, label, gpumem=8000))
    await pending_with_failed_scheduling(real_kube, big)

    async with kubelet(real_kube, ns):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hami_py", "defrag", "--kubeconfig", str(control_plane.admin_kubeconfig),
            "--namespace", ns, "--execute", "--eviction-rate", "20", "--output", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO))
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
        report = json.loads(out)
        bound_big = await bound(real_kube, ns, "big", timeout=60)

    assert report["satisfied"] and report["makesRoomFor"] == [f"{ns}/big"], report
    (moved,) = report["moves"]
    assert moved["pod"] in {f"{ns}/{p}" for p in placed} and moved["node"] in {n1, n2} and moved["to"] in {n1, n2}
    execution = report["execution"]
    assert execution["complete"] and execution["evicted"] == [moved["pod"]], execution
    assert execution["metrics"]['hami_defrag_evictions_total{result="evicted"}'] == 1.0
    gone = moved["pod"].split("/")[1]
    assert await real_kube.get("pods", gone, namespace=ns) is None
    (placement,) = report["placements"]
    assert bound_big["spec"]["nodeName"] == placement["node"] == moved["node"]
    freed = allocated(placed[gone]).split(",")[0]
    assert freed and freed in allocated(bound_big), "big was not placed on the GPU the move freed"

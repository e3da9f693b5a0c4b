"""``defrag --execute`` (hami_py/defrag/execute.py) against the in-repo API server, with the
scheduler's hold of the freed room (hami_py/scheduling/eviction/defrag_holds.py).

The executor runs with a client of its own, as the CLI does in another process; the scheduler
runs without --device-preemption (the defragmenter's holds are always on). Plans are written by
hand here: the planner has its own tests.
"""
from __future__ import annotations

import asyncio
import os
from datetime import datetime, timezone

import pytest

from hami_py.defrag.execute import execute_plan
from hami_py.defrag.plan import Move, Placement, Plan
from hami_py.fakeapi import write_kubeconfig
from hami_py.fakeapi.objects import T4, gpu_node, gpu_pod, gpu_uuid
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.scheduling.eviction.defrag_holds import HOLD_ANNOTATION, hold_annotation, parse_hold
from tests.conftest import (assert_books_balance, bind_placed, filtered, pod_events_applied, register_nodes,
                            wait_until)
from tests.test_preemption import running  # create, filter, bind, and play the kubelet


@pytest.fixture
async def executor_client(api, tmp_path):
    """The executor's own client (the CLI's, in reality another process)."""
    kubeconfig = write_kubeconfig(os.path.join(tmp_path, "kubeconfig"), api.url)
    client = KubeClient(await load_configuration(str(kubeconfig)), qps=0, burst=1000)
    try:
        yield client
    finally:
        await client.close()


class FakeTime:
    """The executor's clock and sleeper: a sleep moves the clock on at once (and is recorded)."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds
        await asyncio.sleep(0)


def pod(name: str, gpumem: int, *, labels: dict | None = None, grace: int | None = None) -> dict:
    made = gpu_pod(name, gpumem=gpumem)
    if labels:
        made["metadata"]["labels"] = labels
    if grace is not None:
        made["spec"]["terminationGracePeriodSeconds"] = grace
    return made


def move(stored: dict, node: str, to: str | None = None) -> Move:
    meta = stored["metadata"]
    return Move(meta["namespace"], meta["name"], meta["uid"], node, to)


def placement(stored: dict, node: str, *victims: dict) -> Placement:
    meta = stored["metadata"]
    return Placement(meta["namespace"], meta["name"], meta["uid"], node, [v["metadata"]["uid"] for v in victims])


def evictions(api) -> list[str]:
    return [path.rsplit("/", 2)[-2] for method, path, _ in api.requests if path.endswith("/eviction")]


def defragmented(api, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["message"]) for e in api.list("events", namespace="default")
            if e["involvedObject"]["name"] == name and e["reason"] == "Defragmented"]


def holds_counted(app, outcome: str) -> float:
    return app.metrics.registry.get_sample_value("hami_defrag_holds_total", {"outcome": outcome}) or 0


def allocated(stored: dict) -> str:
    annotations = stored["metadata"].get("annotations") or {}
    return " ".join(v for k, v in annotations.items() if k.endswith("devices-allocated"))


def no_replan(refused: set[str]):
    raise AssertionError(f"no replan expected (refused {refused})")


# ---------------------------------------------------------------------------------------------
# the whole path
# ---------------------------------------------------------------------------------------------

async def test_the_victim_is_evicted_its_room_held_and_the_pending_pod_placed_there(
        api, app, extender, executor_client):
    """n1 and n2 have one T4 (15360 MiB) each, 10000 MiB taken on both: a 12000 MiB pod fits
    nowhere. The plan moves ``batch`` off n1. Once it is evicted, a thief that would fit in its
    room is filtered first and gets nothing; the pending pod is placed on n1, on batch's GPU."""
    assert app.service.preemptor is None            # holds need no --device-preemption
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    batch = await running(api, app, extender, pod("batch", 10000), ["n1"])
    await running(api, app, extender, pod("other", 10000), ["n2"])
    big = api.create("pods", pod("big", 12000))
    assert (await filtered(app, extender, big, nodes))["NodeNames"] in (None, [])
    plan = Plan(goal="room for 1 pending pod", satisfied=True, moves=[move(batch, "n1", "n2")],
                placements=[placement(big, "n1", batch)])
    time = FakeTime()

    done = await execute_plan(plan=plan, client=executor_client, replan=no_replan, clock=time.clock,
                              sleep=time.sleep)

    assert done.complete and done.reason == ""
    assert done.evicted == ["default/batch"] and evictions(api) == ["batch"]
    assert api.get("pods", "batch") is None
    assert defragmented(api, "batch") == [("Normal", "Evicted from node n1 by hami-scheduler defrag to make room "
                                                     "for pod default/big on node n1; its replacement is expected on "
                                                     "node n2")]
    value = api.get("pods", "big")["metadata"]["annotations"][HOLD_ANNOTATION]
    wanted = parse_hold(value)
    assert (wanted.node, wanted.victims) == ("n1", (batch["metadata"]["uid"],))
    await wait_until(lambda: batch["metadata"]["uid"] not in app.cache.pods, "batch's delete event")
    assert big["metadata"]["uid"] in app.service.defrag_holds.holds

    thief = await filtered(app, extender, api.create("pods", pod("thief", 6000)), nodes)
    assert thief["NodeNames"] in (None, []), "the held room went to another pod"
    assert set(thief["FailedNodes"]) == {"n1", "n2"}

    placed = await filtered(app, extender, big, nodes)
    assert placed["NodeNames"] == ["n1"], placed
    stored = await bind_placed(api, app, extender, big, placed)
    assert stored["spec"]["nodeName"] == "n1"
    assert gpu_uuid("n1", 0) in allocated(stored)
    assert not app.service.defrag_holds.holds
    assert_books_balance(app)
    assert (holds_counted(app, "held"), holds_counted(app, "placed")) == (1, 1)
    sample = done.metrics.registry.get_sample_value
    assert sample("hami_defrag_evictions_total", {"result": "evicted"}) == 1
    assert sample("hami_defrag_plans_total") == 1
    assert done.as_json()["evicted"] == ["default/batch"]
    assert done.as_json()["holds"][0]["pod"] == "default/big"


async def test_nodes_one_at_a_time_and_the_pod_waits_while_a_victim_terminates(api, app, extender, executor_client):
    """Two moves on two nodes: the second node's pod is evicted only once the first node's has
    left (it terminates until its kubelet, the test, confirms). Meanwhile the pending pod's filter
    answers that it waits, and names the held node."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    slow = await running(api, app, extender, pod("slow", 10000, grace=30), ["n1"])
    quick = await running(api, app, extender, pod("quick", 10000), ["n2"])
    first = api.create("pods", pod("first", 12000))
    second = api.create("pods", pod("second", 12000))
    plan = Plan(goal="room for 2 pending pods", satisfied=True,
                moves=[move(slow, "n1"), move(quick, "n2")],
                placements=[placement(first, "n1", slow), placement(second, "n2", quick)])
    run = asyncio.create_task(execute_plan(plan=plan, client=executor_client, replan=no_replan,
                                           rate_per_s=1000, poll_s=0.01))
    try:
        await wait_until(lambda: (api.get("pods", "slow") or {}).get("metadata", {}).get("deletionTimestamp"),
                         "slow evicted (terminating)")
        terminating = api.get("pods", "slow")
        await pod_events_applied(app, terminating)
        waiting = await filtered(app, extender, first, nodes)
        assert waiting["FailedNodes"] == {"n1": "waiting for 1 pods moved by the defragmenter on node n1",
                                          "n2": "held for the defragmenter's plan on node n1"}
        assert evictions(api) == ["slow"], "a second node's pod was evicted before the first node's left"
        api.delete("pods", "slow")            # the kubelet's part: its containers stopped
        done = await asyncio.wait_for(run, timeout=20)
    finally:
        run.cancel()
    assert done.complete and evictions(api) == ["slow", "quick"]
    await wait_until(lambda: not {slow["metadata"]["uid"], quick["metadata"]["uid"]} & set(app.cache.pods),
                     "the victims' delete events")
    for manifest, node in ((first, "n1"), (second, "n2")):
        placed = await filtered(app, extender, manifest, nodes)
        assert placed["NodeNames"] == [node], placed
        await bind_placed(api, app, extender, manifest, placed)
    assert_books_balance(app)


async def test_evictions_are_paced_by_the_rate_limit(api, app, extender, executor_client):
    await register_nodes(api, app, gpu_node("n1", gpus=3, model=T4))
    victims = [await running(api, app, extender, pod(f"v{i}", 10000), ["n1"]) for i in range(3)]
    plan = Plan(goal="free 1 whole T4", satisfied=True, moves=[move(v, "n1") for v in victims])
    time = FakeTime()
    done = await execute_plan(plan=plan, client=executor_client, replan=no_replan, rate_per_s=2.0,
                              clock=time.clock, sleep=time.sleep)
    assert done.complete and len(done.evicted) == 3
    # Two evictions a second: the second and third each wait half a second after the one before.
    assert time.sleeps == [0.5, 0.5]
    assert defragmented(api, "v0") == [("Normal", "Evicted from node n1 by hami-scheduler defrag to free devices "
                                                  "on node n1 (free 1 whole T4)")]


# ---------------------------------------------------------------------------------------------
# PodDisruptionBudgets: a 429 replans
# ---------------------------------------------------------------------------------------------

def pdb(name: str, labels: dict, **spec) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, **spec}}


async def test_a_budget_refuses_the_eviction_the_plan_is_replanned_and_the_refused_pod_stays(
        api, app, extender, executor_client):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    guarded = await running(api, app, extender, pod("guarded", 10000, labels={"app": "guarded"}), ["n1"])
    free = await running(api, app, extender, pod("free", 10000), ["n2"])
    api.create("poddisruptionbudgets", pdb("guard", {"app": "guarded"}, maxUnavailable=0))
    big = api.create("pods", pod("big", 12000))
    first = Plan(goal="room for 1 pending pod", satisfied=True, moves=[move(guarded, "n1", "n2")],
                 placements=[placement(big, "n1", guarded)])
    asked: list[set[str]] = []
    hold_at_replan: list[str | None] = []

    def replan(refused: set[str]) -> Plan:
        asked.append(refused)
        hold_at_replan.append((api.get("pods", "big")["metadata"].get("annotations") or {}).get(HOLD_ANNOTATION))
        return Plan(goal="room for 1 pending pod", satisfied=True, moves=[move(free, "n2", "n1")],
                    placements=[placement(big, "n2", free)])

    time = FakeTime()
    done = await execute_plan(plan=first, client=executor_client, replan=replan, clock=time.clock, sleep=time.sleep)

    assert asked == [{guarded["metadata"]["uid"]}]
    assert hold_at_replan == [None], "the refused plan's hold was not removed before replanning"
    assert done.complete and done.plans == 2
    assert done.refused == {"default/guarded": "429 Cannot evict pod as it would violate the pod's disruption budget."}
    assert done.evicted == ["default/free"] and evictions(api) == ["guarded", "free"]
    assert api.get("pods", "guarded")["metadata"].get("deletionTimestamp") is None
    assert defragmented(api, "guarded") == []
    assert parse_hold(api.get("pods", "big")["metadata"]["annotations"][HOLD_ANNOTATION]).node == "n2"
    sample = done.metrics.registry.get_sample_value
    assert sample("hami_defrag_evictions_total", {"result": "refused"}) == 1
    assert sample("hami_defrag_plans_total") == 2
    await wait_until(lambda: free["metadata"]["uid"] not in app.cache.pods, "free's delete event")
    placed = await filtered(app, extender, big, nodes)
    assert placed["NodeNames"] == ["n2"], placed
    await bind_placed(api, app, extender, big, placed)
    assert_books_balance(app)


async def test_three_refused_plans_give_up_and_leave_no_hold(api, app, extender, executor_client):
    await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    guarded = await running(api, app, extender, pod("guarded", 10000, labels={"app": "g"}), ["n1"])
    api.create("poddisruptionbudgets", pdb("guard", {"app": "g"}, minAvailable=1))
    big = api.create("pods", pod("big", 12000))
    plan = Plan(goal="room", satisfied=True, moves=[move(guarded, "n1")], placements=[placement(big, "n1", guarded)])
    time = FakeTime()
    done = await execute_plan(plan=plan, client=executor_client, replan=lambda refused: plan,
                              clock=time.clock, sleep=time.sleep)
    assert not done.complete and done.plans == 3
    assert done.reason.startswith("gave up after 3 plans: eviction of default/guarded refused: 429")
    assert HOLD_ANNOTATION not in (api.get("pods", "big")["metadata"].get("annotations") or {})
    assert api.get("pods", "guarded") is not None and done.evicted == []
    stored = api.get("pods", "big")
    await pod_events_applied(app, stored)
    assert not app.service.defrag_holds.holds and big["metadata"]["uid"] not in app.cache.pods
    assert_books_balance(app)


# ---------------------------------------------------------------------------------------------
# the scheduler's side: bad or stale annotations
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["not json", '["n1"]', '{"node": "n1", "victims": "x", "until": "2099-01-01T00:00:00Z"}',
                                   '{"node": "n1", "victims": [], "until": "tomorrow"}'])
async def test_a_malformed_hold_is_ignored_and_the_pod_scheduled_as_usual(api, app, extender, value):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, pod("busy", 10000), ["n1"])
    pending = api.create("pods", pod("p", 4000))
    await pod_events_applied(app, api.patch("pods", "p", {"metadata": {"annotations": {HOLD_ANNOTATION: value}}}))
    assert not app.service.defrag_holds.holds
    assert holds_counted(app, "dropped") == 1
    placed = await filtered(app, extender, api.get("pods", "p"), nodes)
    assert placed["NodeNames"] in (["n1"], ["n2"]), placed     # decided by the policy, not a hold
    assert holds_counted(app, "held") == 0 and holds_counted(app, "dropped") == 1   # acted on once
    await bind_placed(api, app, extender, pending, placed)
    assert_books_balance(app)


async def test_an_expired_hold_is_ignored(api, app, extender):
    """The hold names n1 for a pod that fits n2 as it is: expired, it keeps nothing, and its
    /filter (which would take it, had the watch not) decides as usual."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    busy = await running(api, app, extender, pod("busy", 10000), ["n1"])
    expired = hold_annotation(node="n1", victims=[busy["metadata"]["uid"]], until=datetime(2020, 1, 1, tzinfo=timezone.utc))
    pending = api.create("pods", pod("p", 12000))
    pending["metadata"]["annotations"] = {HOLD_ANNOTATION: expired}   # kube-scheduler's copy carries it
    placed = await filtered(app, extender, pending, nodes)
    assert placed["NodeNames"] == ["n2"], placed
    assert holds_counted(app, "expired") == 1 and not app.service.defrag_holds.holds
    await bind_placed(api, app, extender, pending, placed)
    assert_books_balance(app)


async def test_a_hold_on_a_node_not_offered_is_dropped_and_a_deleted_pod_gives_its_room_back(
        api, app, extender, executor_client):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    batch = await running(api, app, extender, pod("batch", 10000), ["n1"])
    big = api.create("pods", pod("big", 12000))
    plan = Plan(goal="room", satisfied=True, moves=[move(batch, "n1")], placements=[placement(big, "n1", batch)])
    time = FakeTime()
    done = await execute_plan(plan=plan, client=executor_client, replan=no_replan,
                              clock=time.clock, sleep=time.sleep)
    assert done.complete
    await wait_until(lambda: batch["metadata"]["uid"] not in app.cache.pods and
                     big["metadata"]["uid"] in app.service.defrag_holds.holds, "the hold, batch gone")
    # kube-scheduler offers only n2 (n1 filtered out by a plugin): the hold is dropped.
    answer = await filtered(app, extender, big, ["n2"])
    assert answer["NodeNames"] == ["n2"] and not app.service.defrag_holds.holds
    assert holds_counted(app, "dropped") == 1
    # A second pod held on n1, then deleted: its room comes back.
    other = api.create("pods", pod("other", 12000))
    value = hold_annotation(node="n1", victims=[], until=datetime(2099, 1, 1, tzinfo=timezone.utc))
    await pod_events_applied(app, api.patch("pods", "other", {"metadata": {"annotations": {HOLD_ANNOTATION: value}}}))
    assert other["metadata"]["uid"] in app.service.defrag_holds.holds
    thief = api.create("pods", pod("thief", 12000))
    assert (await filtered(app, extender, thief, ["n1"]))["NodeNames"] in (None, [])
    api.delete("pods", "other")
    await wait_until(lambda: other["metadata"]["uid"] not in app.cache.pods, "other's delete event")
    assert not app.service.defrag_holds.holds
    assert (await filtered(app, extender, thief, ["n1"]))["NodeNames"] == ["n1"]

"""Gangs: a distributed job's device members are placed all together or not at all (issue 34).

The real scheduler against the in-repo API server (serving scheduler-plugins' PodGroup CRD unless
a test says otherwise); the test plays kube-scheduler, which filters one pod at a time.
"""
from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.requeue import REQUEUE_ANNOTATION
from hami_py.scheduling.gangs.membership import (
    KUEUE, KUEUE_GROUP_LABEL, KUEUE_TOTAL_ANNOTATION, PODGROUP, PODGROUP_LABEL, GangKey,
)
from tests.conftest import assert_books_balance, pod_events_applied, register_nodes, wait_until


@pytest.fixture
async def api():
    server = FakeApiServer(podgroups=True)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def podgroup(name: str, min_member: int, *, timeout_s: int | None = None, namespace: str = "default") -> dict:
    spec = {"minMember": min_member}
    if timeout_s is not None:
        spec["scheduleTimeoutSeconds"] = timeout_s
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def member(name: str, group: str, *, label: str = PODGROUP_LABEL, annotations: dict | None = None) -> dict:
    """A pod asking for one whole GPU, member of ``group``."""
    pod = gpu_pod(name, gpus=1, gpumem_percentage=100, annotations=annotations)
    pod["metadata"]["labels"] = {label: group}
    return pod


async def create_group(api, app, name: str, min_member: int, **kw) -> None:
    api.create("podgroups", podgroup(name, min_member, **kw))
    await wait_until(lambda: GangKey(PODGROUP, "default", name) in app.service.gangs.book.specs,
                     f"PodGroup {name} watched")


async def create_members(api, app, names: list[str], group: str, **kw) -> dict[str, dict]:
    pods = {}
    for name in names:
        pods[name] = api.create("pods", member(name, group, **kw))
    await pod_events_applied(app, pods[names[-1]])
    return pods


def used_gpus(app, nodes: list[str]) -> int:
    return sum(1 for n in nodes for d in app.cache.device_usage(n) if d["usedmem"] > 0)


def reserved_uids(app, pods) -> set[str]:
    return {p["metadata"]["uid"] for p in pods if p["metadata"]["uid"] in app.cache.pods}


def gang_count(app, outcome: str) -> float:
    return app.metrics.registry.get_sample_value("hami_gangs_total", {"outcome": outcome}) or 0.0


async def six_gpus(api, app) -> list[str]:
    return await register_nodes(api, app, *(gpu_node(f"n{i}", gpus=2) for i in (1, 2, 3)))


async def bind_all(api, app, extender, pods: list[dict]) -> None:
    for pod in pods:
        node = app.cache.pods[pod["metadata"]["uid"]].node
        assert await extender.bind(pod, node) == {"Error": ""}
    for pod in pods:
        await wait_until(lambda p=pod: api.get("pods", p["metadata"]["name"])["spec"].get("nodeName"),
                         f"{pod['metadata']['name']} bound")
        await pod_events_applied(app, api.get("pods", pod["metadata"]["name"]))


async def test_an_incomplete_gang_holds_nothing_and_its_last_member_places_all(api, app, extender):
    nodes = await six_gpus(api, app)
    await create_group(api, app, "train", 4)
    pods = await create_members(api, app, ["w0", "w1", "w2"], "train")
    for pod in pods.values():
        result = await extender.filter(pod, nodes)
        assert result["NodeNames"] is None
        assert result["FailedNodes"] == dict.fromkeys(nodes, "PodGroup default/train: 3 of 4 members exist")
    assert used_gpus(app, nodes) == 0 and not reserved_uids(app, pods.values())
    assert app.metrics.registry.get_sample_value("hami_gangs_waiting") == 1

    pods |= await create_members(api, app, ["w3"], "train")
    first = await extender.filter(pods["w3"], nodes)
    # One filter reserved all four, each on its own GPU.
    assert len(reserved_uids(app, pods.values())) == 4 and used_gpus(app, nodes) == 4
    assert first["NodeNames"] == [app.cache.pods[pods["w3"]["metadata"]["uid"]].node]
    assert gang_count(app, "planned") == 1 and app.metrics.registry.get_sample_value("hami_gangs_waiting") == 0
    # The members kube-scheduler parked are woken at once: a node annotation is a cluster event.
    await wait_until(lambda: any(REQUEUE_ANNOTATION in (api.get("nodes", n)["metadata"].get("annotations") or {})
                                 for n in nodes), "the requeue nudge written")
    for name in ("w0", "w1", "w2"):
        planned = app.cache.pods[pods[name]["metadata"]["uid"]].node
        assert (await extender.filter(pods[name], nodes))["NodeNames"] == [planned]
    assert used_gpus(app, nodes) == 4
    await bind_all(api, app, extender, list(pods.values()))
    await wait_until(lambda: gang_count(app, "placed") == 1, "the gang counted placed")
    assert not app.service.gangs.plans
    assert_books_balance(app)
    await wait_until(lambda: {"GangWaiting", "GangPlanned"} <= {e["reason"] for e in api.list("events")},
                     "the gang's Events written")


async def test_two_gangs_on_six_gpus_one_whole_the_other_nothing_then_the_other(api, app, extender):
    nodes = await six_gpus(api, app)
    await create_group(api, app, "a", 4)
    await create_group(api, app, "b", 4)
    a = await create_members(api, app, [f"a{i}" for i in range(4)], "a")
    b = await create_members(api, app, [f"b{i}" for i in range(4)], "b")
    answers = {}
    for i in range(4):   # kube-scheduler's queue interleaves the two jobs
        for pods, prefix in ((a, "a"), (b, "b")):
            answers[f"{prefix}{i}"] = await extender.filter(pods[f"{prefix}{i}"], nodes)
    assert all(answers[f"a{i}"]["NodeNames"] for i in range(4))
    for i in range(4):
        assert answers[f"b{i}"]["NodeNames"] is None
        assert set(answers[f"b{i}"]["FailedNodes"].values()) == {"PodGroup default/b: 2 of 4 members fit"}
    assert len(reserved_uids(app, a.values())) == 4 and not reserved_uids(app, b.values())
    await bind_all(api, app, extender, list(a.values()))
    assert not reserved_uids(app, b.values()) and used_gpus(app, nodes) == 4

    # The first job ends: the second is placed whole.
    for name in a:
        api.delete("pods", name)
    await wait_until(lambda: used_gpus(app, nodes) == 0, "the first gang's devices freed")
    first = await extender.filter(b["b2"], nodes)
    assert first["NodeNames"] and len(reserved_uids(app, b.values())) == 4
    for name in ("b0", "b1", "b3"):
        assert (await extender.filter(b[name], nodes))["NodeNames"]
    await bind_all(api, app, extender, list(b.values()))
    assert used_gpus(app, nodes) == 4
    assert_books_balance(app)


async def test_a_plan_not_bound_within_the_timeout_is_given_back(api, app, extender):
    nodes = await six_gpus(api, app)
    await create_group(api, app, "slow", 3, timeout_s=1)
    pods = await create_members(api, app, ["s0", "s1", "s2"], "slow")
    assert (await extender.filter(pods["s0"], nodes))["NodeNames"]
    assert len(reserved_uids(app, pods.values())) == 3
    await wait_until(lambda: not reserved_uids(app, pods.values()), "the plan given back")
    assert used_gpus(app, nodes) == 0 and gang_count(app, "timed_out") == 1
    await wait_until(lambda: "GangTimedOut" in {e["reason"] for e in api.list("events")},
                     "the GangTimedOut Event written")
    # The next member's filter plans the gang again.
    assert (await extender.filter(pods["s1"], nodes))["NodeNames"]
    assert len(reserved_uids(app, pods.values())) == 3


async def test_a_planned_member_refused_its_node_by_kube_scheduler_replans_the_gang(api, app, extender):
    nodes = await six_gpus(api, app)
    await create_group(api, app, "g", 2)
    pods = await create_members(api, app, ["g0", "g1"], "g")
    assert (await extender.filter(pods["g0"], nodes))["NodeNames"]
    planned = app.cache.pods[pods["g1"]["metadata"]["uid"]].node
    # kube-scheduler's own filters ruled out g1's planned node (a taint, its CPU): the gang is
    # planned again around what g1 may use, g1 first.
    offered = [n for n in nodes if n != planned]
    result = await extender.filter(pods["g1"], offered)
    assert result["NodeNames"] and result["NodeNames"][0] in offered
    assert len(reserved_uids(app, pods.values())) == 2 and used_gpus(app, nodes) == 2
    assert gang_count(app, "given_back") == 1 and gang_count(app, "planned") == 2


async def test_a_restart_keeps_the_bound_members_and_plans_the_rest(api):
    options = embedded_options()
    async with running_scheduler(api, options=options) as app:
        client = ExtenderClient(app.url)
        try:
            nodes = await six_gpus(api, app)
            await create_group(api, app, "r", 4)
            pods = await create_members(api, app, [f"r{i}" for i in range(4)], "r")
            assert (await client.filter(pods["r0"], nodes))["NodeNames"]
            assert (await client.filter(pods["r1"], nodes))["NodeNames"]
            await bind_all(api, app, client, [pods["r0"], pods["r1"]])
        finally:
            await client.close()
    async with running_scheduler(api, options=options) as app:
        client = ExtenderClient(app.url)
        try:
            await wait_until(lambda: used_gpus(app, nodes) == 2, "the bound members charged")
            await wait_until(lambda: GangKey(PODGROUP, "default", "r") in app.service.gangs.book.specs, "PodGroup")
            result = await client.filter(pods["r3"], nodes)
            assert result["NodeNames"] and used_gpus(app, nodes) == 4
            assert (await client.filter(pods["r2"], nodes))["NodeNames"]
            await bind_all(api, app, client, [pods["r2"], pods["r3"]])
            assert all(api.get("pods", f"r{i}")["spec"].get("nodeName") for i in range(4))
            assert_books_balance(app)
        finally:
            await client.close()


async def test_kueue_pod_groups_need_no_crd():
    api = FakeApiServer()      # scheduler-plugins' CRD not installed
    await api.start()
    try:
        async with running_scheduler(api) as app:
            extender = ExtenderClient(app.url)
            try:
                assert not app.service.gangs.book.podgroups_on
                nodes = await six_gpus(api, app)
                kueue = {"label": KUEUE_GROUP_LABEL, "annotations": {KUEUE_TOTAL_ANNOTATION: "3"}}
                pods = await create_members(api, app, ["k0", "k1"], "job", **kueue)
                result = await extender.filter(pods["k0"], nodes)
                assert set(result["FailedNodes"].values()) == {f"{KUEUE} default/job: 2 of 3 members exist"}
                pods |= await create_members(api, app, ["k2"], "job", **kueue)
                assert (await extender.filter(pods["k1"], nodes))["NodeNames"]
                assert len(reserved_uids(app, pods.values())) == 3
                # Kueue holds a job's pods back by a scheduling gate until it admits the job: a
                # gated member is no member kube-scheduler could place yet.
                gated = member("q1", "queued", label=KUEUE_GROUP_LABEL, annotations={KUEUE_TOTAL_ANNOTATION: "2"})
                gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
                api.create("pods", gated)
                queued = await create_members(api, app, ["q0"], "queued", **{**kueue, "annotations": {
                    KUEUE_TOTAL_ANNOTATION: "2"}})
                result = await extender.filter(queued["q0"], nodes)
                assert set(result["FailedNodes"].values()) == {f"{KUEUE} default/queued: 1 of 2 members exist"}
                bad = await create_members(api, app, ["x0"], "other", label=KUEUE_GROUP_LABEL,
                                           annotations={KUEUE_TOTAL_ANNOTATION: "many"})
                result = await extender.filter(bad["x0"], nodes)
                assert set(result["FailedNodes"].values()) == {
                    f"{KUEUE} default/other: annotation {KUEUE_TOTAL_ANNOTATION} is 'many', not a whole number >= 1"}
            finally:
                await extender.close()
    finally:
        await api.stop()


async def test_without_the_crd_podgroup_gangs_are_off_and_said_so_once():
    server = FakeApiServer()      # scheduler-plugins' CRD not installed
    await server.start()
    try:
        with capture_logs() as logs:
            async with running_scheduler(server) as app:
                client = ExtenderClient(app.url)
                try:
                    nodes = await six_gpus(server, app)
                    pods = await create_members(server, app, ["o0", "o1"], "absent")
                    # Scheduled one by one, as before gangs.
                    assert (await client.filter(pods["o0"], nodes))["NodeNames"]
                    assert used_gpus(app, nodes) == 1
                finally:
                    await client.close()
        off = [e for e in logs if e["event"].startswith("PodGroup gangs off")]
        assert len(off) == 1 and "not installed" in off[0]["reason"]
    finally:
        await server.stop()


async def test_preemption_and_the_defragmenter_never_move_one_member(api, app, extender):
    from hami_py.defrag.rules import BudgetBook, why_not_movable
    pod = member("m0", "train")
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "controller": True}]
    assert why_not_movable(pod, priority=0, priority_limit=10, budgets=BudgetBook([])) == \
        "it belongs to gang default/train"
    nodes = await six_gpus(api, app)
    await create_group(api, app, "train", 2)
    await create_group(api, app, "solo", 1)       # a gang of one: scheduled on its own, spared nothing
    created = await create_members(api, app, ["m0", "m1"], "train")
    created.update(await create_members(api, app, ["s0"], "solo"))
    for name in ("m0", "m1", "s0"):
        assert (await extender.filter(created[name], nodes))["NodeNames"]
    await bind_all(api, app, extender, list(created.values()))
    from hami_py.scheduling.eviction.victims import VictimSearch
    search = VictimSearch(app.cache, app.service.filterer, spared=app.service.gangs.book.is_member)
    unspared = VictimSearch(app.cache, app.service.filterer)
    on = {name: app.cache.pods[created[name]["metadata"]["uid"]].node for name in created}
    candidates = {p.name for node in set(on.values()) for p in search.candidates(node, priority=1000)}
    everyone = {p.name for node in set(on.values()) for p in unspared.candidates(node, priority=1000)}
    assert everyone == {"m0", "m1", "s0"}
    # The gang's members are never victims; a label naming a gang of one is no shield.
    assert candidates == {"s0"}


async def test_in_the_loop_mode_a_planned_member_is_offered_its_planned_node_alone(api):
    async with running_scheduler(api, options=embedded_options(filter_mode="all")) as app:
        client = ExtenderClient(app.url)
        try:
            nodes = await six_gpus(api, app)
            await create_group(api, app, "loop", 2)
            pods = await create_members(api, app, ["l0", "l1"], "loop")
            first = await client.filter(pods["l0"], nodes)
            planned = app.cache.pods[pods["l1"]["metadata"]["uid"]].node
            # Not every fitting node (the mode's usual answer): the plan's, so kube-scheduler's
            # /prioritize cannot move a member off its gang's plan.
            assert first["NodeNames"] == [app.cache.pods[pods["l0"]["metadata"]["uid"]].node]
            assert (await client.filter(pods["l1"], nodes))["NodeNames"] == [planned]
            await bind_all(api, app, client, list(pods.values()))
            assert used_gpus(app, nodes) == 2
            assert_books_balance(app)
        finally:
            await client.close()


async def test_a_member_bound_before_the_watch_shows_it_is_never_planned_again(api, app, extender):
    """Our Binding landed, the pod watch has not shown it: a re-plan counts the member as bound and
    leaves its charge alone (deciding for it again would free a bound pod's devices)."""
    from hami_py.cache.pod_states import PodState
    from tests.reliability_helpers import books_mismatch
    nodes = await six_gpus(api, app)
    await create_group(api, app, "lag", 3)
    pods = await create_members(api, app, ["m0", "m1", "m2"], "lag")
    uid0, uid1 = pods["m0"]["metadata"]["uid"], pods["m1"]["metadata"]["uid"]
    assert (await extender.filter(pods["m0"], nodes))["NodeNames"]
    node0, planned1 = app.cache.pods[uid0].node, app.cache.pods[uid1].node
    api.pace_watches("pods", rate=0)        # the pod watch falls behind
    try:
        assert await extender.bind(pods["m0"], node0) == {"Error": ""}
        assert app.cache.pods[uid0].state is PodState.BOUND_UNSEEN
        # kube-scheduler no longer offers m1 its planned node: the gang is planned again.
        result = await extender.filter(pods["m1"], [n for n in nodes if n != planned1])
        assert result["NodeNames"] and result["NodeNames"][0] != planned1
        assert app.cache.pods[uid0].node == node0 and app.cache.pods[uid0].state is PodState.BOUND_UNSEEN
        assert used_gpus(app, nodes) == 3
    finally:
        api.pace_watches("pods", rate=None)
    await wait_until(lambda: not books_mismatch(api, app), "the books to match the API server")
    assert_books_balance(app)


async def test_plans_go_with_leadership(api, app, extender):
    nodes = await six_gpus(api, app)
    await create_group(api, app, "lead", 2)
    pods = await create_members(api, app, ["d0", "d1"], "lead")
    assert (await extender.filter(pods["d0"], nodes))["NodeNames"]
    app._on_leadership(False)      # what the Lease watch calls when another replica takes over
    try:
        assert not app.service.gangs.plans and not reserved_uids(app, pods.values())
        assert used_gpus(app, nodes) == 0 and gang_count(app, "given_back") == 1
    finally:
        app._on_leadership(True)
    # Leading again, the next member's /filter plans the gang afresh.
    assert (await extender.filter(pods["d1"], nodes))["NodeNames"]
    assert len(reserved_uids(app, pods.values())) == 2

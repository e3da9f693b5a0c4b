"""Device preemption by the extender (--device-preemption), against the in-repo API server.

A pod with a priority that fits nowhere evicts, through the Eviction API, the fewest lower-priority
device pods of one node that make room, holds that room, and is placed there by its next /filter.
Each rule of scheduling/eviction/victims.py and scheduling/eviction/preempting.py has a test here; the search's
minimality is a hypothesis property in tests/test_preemption_property.py.
"""
from __future__ import annotations

import pytest

from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import T4, gpu_node, gpu_pod
from tests.conftest import (assert_books_balance, bind_placed, filtered, pod_events_applied, register_nodes,
                            wait_until)

T4_MEM = T4["devmem"]   # 15360 MiB


@pytest.fixture
def scheduler_options():
    return embedded_options(device_preemption=True)


def prio_pod(name: str, gpumem: int, priority: int, *, gpus: int = 1, policy: str | None = None,
             started: str | None = None, labels: dict | None = None, grace: int | None = None, **kw) -> dict:
    pod = gpu_pod(name, gpus=gpus, gpumem=gpumem, **kw)
    pod["spec"]["priority"] = priority
    if policy is not None:
        pod["spec"]["preemptionPolicy"] = policy
    if started is not None:
        pod["status"]["startTime"] = started
    if labels:
        pod["metadata"]["labels"] = labels
    if grace is not None:
        pod["spec"]["terminationGracePeriodSeconds"] = grace
    return pod


async def running(api, app, extender, pod: dict, nodes: list[str]) -> dict:
    """Create, filter and bind a pod (the filter must place it): the stored, bound pod."""
    created = api.create("pods", pod)
    result = await filtered(app, extender, created, nodes)
    assert result["NodeNames"], result
    await bind_placed(api, app, extender, created, result)
    # Its kubelet's part: the pod runs and is Ready (what a disruption budget counts).
    stored = api.patch("pods", pod["metadata"]["name"], {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        namespace=pod["metadata"].get("namespace") or "default")
    await pod_events_applied(app, stored)
    return stored


def exists(api, name: str) -> bool:
    return api.get("pods", name) is not None


def evictions(api) -> list[str]:
    return [path.rsplit("/", 2)[-2] for method, path, _ in api.requests if path.endswith("/eviction")]


async def wait_gone(app, *pods: dict) -> None:
    uids = [p["metadata"]["uid"] for p in pods]
    await wait_until(lambda: not any(u in app.cache.pods for u in uids), "the victims' delete events")


# ---------------------------------------------------------------------------------------------
# the whole path
# ---------------------------------------------------------------------------------------------

async def test_a_high_priority_pod_evicts_the_batch_pod_then_lands_on_its_node(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    batch = await running(api, app, extender, prio_pod("batch", 15000, 10), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))

    result = await filtered(app, extender, urgent, nodes)
    assert result["NodeNames"] in (None, [])
    assert result["FailedNodes"] == {"n1": "preempting 1 pods on node n1"}
    assert not exists(api, "batch")
    assert evictions(api) == ["batch"]
    assert api.get("pods", "urgent")["status"]["nominatedNodeName"] == "n1"
    await wait_gone(app, batch)

    placed = await filtered(app, extender, urgent, nodes)
    assert placed["NodeNames"] == ["n1"], placed
    stored = await bind_placed(api, app, extender, urgent, placed)
    assert stored["spec"]["nodeName"] == "n1"
    assert_books_balance(app)
    assert not app.service.preemptor.holds
    sample = app.metrics.registry.get_sample_value
    assert sample("hami_device_preemptions_total", {"outcome": "preempting"}) == 1
    assert sample("hami_device_preemption_evictions_total", {"result": "evicted"}) == 1


async def test_preempted_events_on_each_victim_and_on_the_preemptor(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("a", 7000, 1), nodes)
    await running(api, app, extender, prio_pod("b", 7000, 2), nodes)
    urgent = api.create("pods", prio_pod("urgent", 15000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"] == {"n1": "preempting 2 pods on node n1"}

    def preempted(name: str) -> list[str]:
        return [e["message"] for e in api.list("events", namespace="default")
                if e["involvedObject"]["name"] == name and e["reason"] == "Preempted"]

    await wait_until(lambda: preempted("a") and preempted("b") and preempted("urgent"), "Preempted events")
    uid = urgent["metadata"]["uid"]
    assert preempted("a") == [f"Preempted by pod {uid} on node n1"]
    assert preempted("b") == [f"Preempted by pod {uid} on node n1"]
    assert preempted("urgent") == ["preempting 2 pods on node n1: default/a, default/b"]


# ---------------------------------------------------------------------------------------------
# which victims
# ---------------------------------------------------------------------------------------------

async def test_fewest_victims_first_and_a_lower_pod_that_would_not_help_stays(api, app, extender):
    """n1: a (priority 1) and b (priority 1) share the GPU with 7000 MiB each; n2: c (priority 5)
    holds 15000. A 15000 MiB pod needs either both of n1 or c alone: c goes, though of a higher
    priority, and neither a nor b (each alone frees too little) is touched."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("a", 7000, 1), ["n1"])
    await running(api, app, extender, prio_pod("b", 7000, 1), ["n1"])
    await running(api, app, extender, prio_pod("c", 15000, 5), ["n2"])
    urgent = api.create("pods", prio_pod("urgent", 15000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"]["n2"] == "preempting 1 pods on node n2"
    assert evictions(api) == ["c"]
    assert exists(api, "a") and exists(api, "b")


async def test_among_equal_counts_the_lowest_priority_goes(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("low", 15000, 3), ["n2"])
    await running(api, app, extender, prio_pod("higher", 15000, 7), ["n1"])
    urgent = api.create("pods", prio_pod("urgent", 12000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"]["n2"] == "preempting 1 pods on node n2"
    assert evictions(api) == ["low"]


async def test_among_equal_priorities_the_least_running_time_is_lost(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("old", 15000, 3, started="2026-01-01T00:00:00Z"), ["n1"])
    await running(api, app, extender, prio_pod("new", 15000, 3, started="2026-06-01T00:00:00Z"), ["n2"])
    urgent = api.create("pods", prio_pod("urgent", 12000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"]["n2"] == "preempting 1 pods on node n2"
    assert evictions(api) == ["new"]


async def test_equal_or_higher_priority_is_never_evicted(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("same", 8000, 100), nodes)
    await running(api, app, extender, prio_pod("above", 7000, 200), nodes)
    urgent = api.create("pods", prio_pod("urgent", 12000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert "preempting" not in result["FailedNodes"]["n1"], result
    assert evictions(api) == []
    assert not app.service.preemptor.holds


async def test_only_the_chosen_node_loses_pods(api, app, extender):
    """Room needs one node: two half-free nodes do not add up, and nothing on the other node goes."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("a", 8000, 1), ["n1"])
    await running(api, app, extender, prio_pod("b", 9000, 2), ["n2"])
    urgent = api.create("pods", prio_pod("urgent", 14000, 100))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"]["n1"] == "preempting 1 pods on node n1"
    assert evictions(api) == ["a"] and exists(api, "b")


async def test_no_preemption_without_priority_or_with_policy_never(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, -5), nodes)
    for pod in (prio_pod("zero", 10000, 0), prio_pod("never", 10000, 1000, policy="Never")):
        result = await filtered(app, extender, api.create("pods", pod), nodes)
        assert "preempting" not in result["FailedNodes"]["n1"]
    assert evictions(api) == [] and exists(api, "batch")


async def test_a_pod_that_cannot_fit_even_on_an_empty_node_preempts_nothing(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, 1), nodes)
    result = await filtered(app, extender, api.create("pods", prio_pod("huge", 2 * T4_MEM, 1000)), nodes)
    assert "preempting" not in result["FailedNodes"]["n1"]
    assert evictions(api) == []


async def test_exclusive_cores_and_slots_count(api, app, extender):
    """A whole-GPU pod (gpucores 100) needs an idle GPU: a small pod on it must go, though memory
    would fit; on a split-1 GPU the one slot is the limit."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("small", 1000, 1), nodes)
    result = await filtered(app, extender, api.create("pods", prio_pod("whole", 4000, 100, gpucores=100)), nodes)
    assert result["FailedNodes"]["n1"] == "preempting 1 pods on node n1"
    assert evictions(api) == ["small"]


# ---------------------------------------------------------------------------------------------
# the hold
# ---------------------------------------------------------------------------------------------

async def test_the_freed_room_is_held_for_the_preemptor(api, app, extender):
    """The victim is gone at once (no grace period), and a pod that would fit in its room is
    filtered before the preemptor comes back: it gets nothing; the preemptor gets the node."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    batch = await running(api, app, extender, prio_pod("batch", 15000, 1), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    assert (await filtered(app, extender, urgent, nodes))["FailedNodes"]["n1"].startswith("preempting 1 pods")
    await wait_gone(app, batch)
    thief = api.create("pods", prio_pod("thief", 10000, 0))
    stolen = await filtered(app, extender, thief, nodes)
    assert stolen["NodeNames"] in (None, []), stolen
    placed = await filtered(app, extender, urgent, nodes)
    assert placed["NodeNames"] == ["n1"]
    await bind_placed(api, app, extender, urgent, placed)
    assert_books_balance(app)


async def test_while_victims_terminate_the_preemptor_waits_and_nothing_more_is_evicted(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    batch = await running(api, app, extender, prio_pod("batch", 15000, 1, grace=30), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    assert (await filtered(app, extender, urgent, nodes))["FailedNodes"]["n1"] == "preempting 1 pods on node n1"
    terminating = api.get("pods", "batch")
    assert terminating["metadata"]["deletionTimestamp"]
    await pod_events_applied(app, terminating)
    again = await filtered(app, extender, urgent, nodes)
    assert again["FailedNodes"] == {"n1": "preempting 1 pods on node n1: waiting for 1 to leave"}
    assert evictions(api) == ["batch"]
    thief = await filtered(app, extender, api.create("pods", prio_pod("thief", 300, 0)), nodes)
    assert thief["NodeNames"] in (None, []), "the held room went to another pod"
    api.delete("pods", "batch")          # the kubelet's part: the containers have stopped
    await wait_gone(app, batch)
    placed = await filtered(app, extender, urgent, nodes)
    assert placed["NodeNames"] == ["n1"]
    await bind_placed(api, app, extender, urgent, placed)
    assert_books_balance(app)


async def test_a_bind_of_a_held_pod_is_sent_back_to_filter(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, 1, grace=30), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    await filtered(app, extender, urgent, nodes)
    answer = await extender.bind(urgent, "n1")
    assert "has no device reservation on node n1" in answer["Error"]


async def test_a_preemptor_deleted_while_holding_gives_the_room_back(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    batch = await running(api, app, extender, prio_pod("batch", 15000, 1), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    await filtered(app, extender, urgent, nodes)
    await wait_gone(app, batch)
    api.delete("pods", "urgent")
    await wait_until(lambda: urgent["metadata"]["uid"] not in app.cache.pods, "the preemptor's delete event")
    other = api.create("pods", prio_pod("other", 10000, 0))
    assert (await filtered(app, extender, other, nodes))["NodeNames"] == ["n1"]


@pytest.mark.parametrize("scheduler_options", [embedded_options(device_preemption=True,
                                                                device_preemption_hold_s=0.2)])
async def test_a_hold_expires(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, 1), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    await filtered(app, extender, urgent, nodes)
    await wait_until(lambda: urgent["metadata"]["uid"] not in app.cache.pods, "the hold's expiry")
    assert not app.service.preemptor.holds
    other = api.create("pods", prio_pod("other", 10000, 0))
    assert (await filtered(app, extender, other, nodes))["NodeNames"] == ["n1"]


# ---------------------------------------------------------------------------------------------
# PodDisruptionBudgets and refused evictions
# ---------------------------------------------------------------------------------------------

def pdb(name: str, labels: dict, **spec) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, **spec}}


async def test_a_budget_that_allows_no_disruption_blocks_the_eviction(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, 1, labels={"app": "batch"}), nodes)
    api.create("poddisruptionbudgets", pdb("keep-batch", {"app": "batch"}, minAvailable=1))
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    first = await filtered(app, extender, urgent, nodes)
    assert first["FailedNodes"]["n1"] == "preempting 1 pods on node n1"   # answered before the eviction
    gave_up = ("preemption gave up on node n1: eviction of default/batch refused: 429 Cannot evict pod as it "
               "would violate the pod's disruption budget.")
    await wait_until(lambda: [(e["type"], e["message"]) for e in api.list("events", namespace="default")
                              if e["involvedObject"]["name"] == "urgent" and e["reason"] == "PreemptionFailed"]
                     == [("Warning", gave_up)], "a PreemptionFailed warning on the pod")
    # Its next filter says why, and tries no eviction again while the refusal is remembered.
    again = await filtered(app, extender, urgent, nodes)
    reason = again["FailedNodes"]["n1"]
    assert reason.endswith("preemption gave up: eviction of default/batch refused: 429 Cannot evict pod as it "
                           "would violate the pod's disruption budget."), reason
    assert evictions(api) == ["batch"]
    assert exists(api, "batch")
    assert "nominatedNodeName" not in api.get("pods", "urgent")["status"]
    assert not app.service.preemptor.holds and urgent["metadata"]["uid"] not in app.cache.pods
    assert_books_balance(app)
    sample = app.metrics.registry.get_sample_value
    assert sample("hami_device_preemptions_total", {"outcome": "gave_up"}) == 1
    assert sample("hami_device_preemption_evictions_total", {"result": "refused"}) == 1


async def test_a_refused_eviction_chooses_again_without_that_pod(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("guarded", 15000, 1, labels={"app": "guarded"}), ["n1"])
    await running(api, app, extender, prio_pod("free", 15000, 5), ["n2"])
    api.create("poddisruptionbudgets", pdb("guard", {"app": "guarded"}, maxUnavailable=0))
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"]["n1"] == "preempting 1 pods on node n1"   # the first choice, refused after
    assert evictions(api) == ["guarded", "free"]
    assert exists(api, "guarded") and not exists(api, "free")
    assert api.get("pods", "urgent")["status"]["nominatedNodeName"] == "n2"


async def test_a_budget_with_room_lets_the_eviction_through(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4), gpu_node("n2", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("w1", 15000, 1, labels={"app": "w"}), ["n1"])
    await running(api, app, extender, prio_pod("w2", 15000, 1, labels={"app": "w"}), ["n2"])
    api.create("poddisruptionbudgets", pdb("half", {"app": "w"}, minAvailable="50%"))
    result = await filtered(app, extender, api.create("pods", prio_pod("urgent", 10000, 1000)), nodes)
    assert "preempting 1 pods" in " ".join(result["FailedNodes"].values())
    assert len(evictions(api)) == 1


# ---------------------------------------------------------------------------------------------
# the in-repo API server's eviction subresource itself
# ---------------------------------------------------------------------------------------------

async def test_fake_eviction_api_rules(api, app):
    client = app.client
    from hami_py.k8s.client import KubeApiError

    def body(name, uid=None):
        b = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}}
        if uid:
            b["deleteOptions"] = {"preconditions": {"uid": uid}}
        return b

    up = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    a = api.create("pods", {**prio_pod("a", 1, 0, labels={"app": "x"}), "status": up})
    api.create("pods", {**prio_pod("b", 1, 0, labels={"app": "x"}), "status": up})
    api.create("pods", prio_pod("pending", 1, 0, labels={"app": "x"}))
    api.create("poddisruptionbudgets", pdb("one", {"app": "x"}, minAvailable=1))
    with pytest.raises(KubeApiError) as info:
        await client.post("/api/v1/namespaces/default/pods/a/eviction", body("a", uid="wrong"))
    assert info.value.status == 409
    with pytest.raises(KubeApiError) as info:
        await client.post("/api/v1/namespaces/default/pods/a/eviction", body("other"))
    assert info.value.status == 400
    await client.post("/api/v1/namespaces/default/pods/a/eviction", body("a", uid=a["metadata"]["uid"]))
    assert not exists(api, "a")
    # one of two gone: the one left is the minimum
    with pytest.raises(KubeApiError) as info:
        await client.post("/api/v1/namespaces/default/pods/b/eviction", body("b"))
    assert info.value.status == 429
    await client.post("/api/v1/namespaces/default/pods/pending/eviction", body("pending"))   # no budget applies
    assert not exists(api, "pending")
    with pytest.raises(KubeApiError) as info:
        await client.post("/api/v1/namespaces/default/pods/gone/eviction", body("gone"))
    assert info.value.status == 404
    api.create("poddisruptionbudgets", pdb("two", {"app": "x"}, minAvailable=0))
    with pytest.raises(KubeApiError) as info:
        await client.post("/api/v1/namespaces/default/pods/b/eviction", body("b"))
    assert info.value.status == 500 and "more than one PodDisruptionBudget" in info.value.message


# ---------------------------------------------------------------------------------------------
# preemptVerb
# ---------------------------------------------------------------------------------------------

async def test_preempt_verb_keeps_nodes_where_the_devices_fit_adding_device_victims(api, app, extender):
    """n1: kube-scheduler's victim is a CPU pod (not ours), the GPU is full of low: low is added.
    n2: its victim is the GPU pod itself: kept as is. n3: the GPU holds a pod of higher priority:
    left out. Both argument forms."""
    await register_nodes(api, app, *(gpu_node(n, gpus=1, model=T4) for n in ("n1", "n2", "n3")))
    low = await running(api, app, extender, prio_pod("low", 15000, 1), ["n1"])
    mid = await running(api, app, extender, prio_pod("mid", 15000, 2), ["n2"])
    await running(api, app, extender, prio_pod("top", 15000, 5000), ["n3"])
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    cpu_uid = "cpu-pod-uid"
    meta = {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": cpu_uid}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": mid["metadata"]["uid"]}], "NumPDBViolations": 1},
        "n3": {"Pods": [{"UID": cpu_uid}], "NumPDBViolations": 0}}}
    status, result = await extender.post("preempt", {"Pod": urgent, "NodeNameToVictims": None, **meta})
    assert status == 200
    assert result == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": cpu_uid}, {"UID": low["metadata"]["uid"]}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": mid["metadata"]["uid"]}], "NumPDBViolations": 1}}}
    full = {"NodeNameToVictims": {"n2": {"Pods": [mid], "NumPDBViolations": 0},
                                  "n3": {"Pods": [{"metadata": {"uid": cpu_uid}}], "NumPDBViolations": 0}}}
    status, result = await extender.post("preempt", {"Pod": urgent, **full})
    assert (status, result) == (200, {"NodeNameToMetaVictims": {
        "n2": {"Pods": [{"UID": mid["metadata"]["uid"]}], "NumPDBViolations": 0}}})
    assert evictions(api) == [] and not app.service.preemptor.holds   # the verb evicts nothing
    assert_books_balance(app)


async def test_preempt_verb_passes_non_device_pods_and_refuses_garbage(api, app, extender):
    await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    plain = {"metadata": {"name": "web", "namespace": "default", "uid": "u"},
             "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
    args = {"Pod": plain, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v"}], "NumPDBViolations": 2}}}
    assert await extender.post("preempt", args) == (200, {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "v"}], "NumPDBViolations": 2}}})
    status, result = await extender.post("preempt", {"Pod": plain, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}})
    assert status == 500 and "a victim has no UID" in result["Error"]
    status, result = await extender.post("preempt", {"NodeNameToMetaVictims": {}})
    assert status == 500 and result["Error"] == "extender preemption args missing pod"


# ---------------------------------------------------------------------------------------------
# the kind demo's manifests (manifests/examples/preemption/, hack/kind/preemption-demo.sh)
# ---------------------------------------------------------------------------------------------

async def test_the_demo_manifests_tell_their_story(api, app, extender):
    """On a worker as the demo fakes it (4 A10s), the batch pod takes every GPU, and the urgent pod
    preempts it and lands; priorities resolved from the demo's PriorityClasses as admission does."""
    import yaml
    from pathlib import Path
    from hami_py.fakeapi.objects import registration
    folder = Path(__file__).resolve().parent.parent / "manifests" / "examples" / "preemption"
    classes = {d["metadata"]["name"]: d["value"] for d in yaml.safe_load_all((folder / "priority-classes.yaml").read_text())}

    def load(name: str) -> dict:
        pod = yaml.safe_load((folder / name).read_text())
        pod["spec"]["priority"] = classes[pod["spec"]["priorityClassName"]]
        pod.setdefault("status", {})
        return pod

    a10 = {"type": "NVIDIA A10", "devmem": 23028, "devcore": 100}
    nodes = await register_nodes(api, app, gpu_node("hami-py-worker", devices=registration(
        "hami-py-worker", gpus=4, model=a10)))
    batch = load("batch.yaml")
    assert batch["metadata"]["namespace"] == "hami-demo"
    await running(api, app, extender, batch, nodes)
    urgent = api.create("pods", load("urgent.yaml"))
    result = await filtered(app, extender, urgent, nodes)
    assert result["FailedNodes"] == {"hami-py-worker": "preempting 1 pods on node hami-py-worker"}
    assert api.get("pods", "batch-trainer", namespace="hami-demo")["metadata"]["deletionTimestamp"]
    api.delete("pods", "batch-trainer", namespace="hami-demo")   # its kubelet, after the 5 s grace period
    await wait_until(lambda: not any(p.name == "batch-trainer" for p in app.cache.pods.values()), "batch gone")
    placed = await filtered(app, extender, urgent, nodes)
    assert placed["NodeNames"] == ["hami-py-worker"]


async def test_the_filter_answers_before_the_evictions_and_they_run_to_their_end(api, app, extender):
    """kube-scheduler's scheduling cycle waits for /filter: a slow Eviction API holds up neither
    this answer nor the pod's next filter (which says the preemption runs); the preemption
    finishes after the answer (victim evicted, pod nominated) and a later filter places the pod."""
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    batch = await running(api, app, extender, prio_pod("batch", 15000, 1), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    hung = api.faults.add(method="POST", path=r"/eviction$", hang=True)
    first = await extender.filter(urgent, nodes)
    assert first["FailedNodes"] == {"n1": "preempting 1 pods on node n1"}
    assert exists(api, "batch")                        # its eviction is still waiting
    busy = await extender.filter(urgent, nodes)
    assert busy["Error"] == "pod default/urgent: its preemption is still running (kube-scheduler retries the pod)"
    await wait_until(lambda: hung.hits == 1, "the eviction hung in the API server")
    api.faults.release()
    await wait_until(lambda: (api.get("pods", "urgent")["status"].get("nominatedNodeName") == "n1"),
                     "the preemption finished after its answer")
    assert not exists(api, "batch")
    await wait_gone(app, batch)
    placed = await filtered(app, extender, urgent, nodes)
    assert placed["NodeNames"] == ["n1"]


async def test_mig_slices_count(api, app, extender):
    """An H200 in MIG mode: small (1g at slice 6, priority 1) and big (3g at slices 0-3, priority 2).
    A 3g pod fits at 4-7 once small goes, or at 0-3 once big goes: one victim either way, and the
    lower priority goes; it lands at 4-7. A 7g pod needs both."""
    from tests.test_mig import _mig_allocations, _mig_node
    nodes = await register_nodes(api, app, _mig_node())
    small = await running(api, app, extender, prio_pod("small", 10000, 1), nodes)
    await running(api, app, extender, prio_pod("big", 60000, 2), nodes)
    whole = api.create("pods", prio_pod("whole", 140000, 100, policy="Never"))
    assert "preempting" not in (await filtered(app, extender, whole, nodes))["FailedNodes"]["n1"]
    urgent = api.create("pods", prio_pod("urgent", 60000, 100))
    assert (await filtered(app, extender, urgent, nodes))["FailedNodes"] == {"n1": "preempting 1 pods on node n1"}
    assert evictions(api) == ["small"]
    await wait_gone(app, small)
    placed = await filtered(app, extender, urgent, nodes)
    await bind_placed(api, app, extender, urgent, placed)
    [inst] = _mig_allocations(api, "urgent")
    assert inst["profile"] == "3g.71gb" and inst["placement"] == {"start": 4, "size": 4}
    assert_books_balance(app)
    bigger = api.create("pods", prio_pod("bigger", 140000, 1000))
    assert (await filtered(app, extender, bigger, nodes))["FailedNodes"] == {"n1": "preempting 2 pods on node n1"}
    assert sorted(evictions(api)) == ["big", "small", "urgent"]


async def test_another_family_with_a_chooser_preempts_the_same_way(api, app, extender):
    """Kunlun P800 whole cards (the family's topology chooser picks the cards): two 4-card pods
    fill the board; a 4-card pod of a higher priority evicts the lower of them, an 8-card one both."""
    from tests.conftest import device_pod
    from hami_py.fakeapi.families import find_device_model
    from hami_py.fakeapi.family_nodes import family_node
    kunlun = find_device_model("P800")
    nodes = await register_nodes(api, app, family_node("k1", kunlun.parts("k1")))

    def xpu(name: str, cards: int, priority: int) -> dict:
        pod = device_pod(name, {"kunlunxin.com/xpu": str(cards)})
        pod["spec"]["priority"] = priority
        return pod

    low = await running(api, app, extender, xpu("low", 4, 1), nodes)
    await running(api, app, extender, xpu("higher", 4, 2), nodes)
    urgent = api.create("pods", xpu("urgent", 4, 100))
    assert (await filtered(app, extender, urgent, nodes))["FailedNodes"] == {"k1": "preempting 1 pods on node k1"}
    assert evictions(api) == ["low"]
    await wait_gone(app, low)
    placed = await filtered(app, extender, urgent, nodes)
    await bind_placed(api, app, extender, urgent, placed)
    assert_books_balance(app)
    board = api.create("pods", xpu("board", 8, 1000))
    assert (await filtered(app, extender, board, nodes))["FailedNodes"] == {"k1": "preempting 2 pods on node k1"}


async def test_holds_go_with_leadership(api, app, extender):
    nodes = await register_nodes(api, app, gpu_node("n1", gpus=1, model=T4))
    await running(api, app, extender, prio_pod("batch", 15000, 1, grace=30), nodes)
    urgent = api.create("pods", prio_pod("urgent", 10000, 1000))
    await filtered(app, extender, urgent, nodes)
    assert urgent["metadata"]["uid"] in app.service.preemptor.holds
    app._on_leadership(False)      # what the Lease watch calls when another replica takes over
    try:
        assert not app.service.preemptor.holds and urgent["metadata"]["uid"] not in app.cache.pods
    finally:
        app._on_leadership(True)

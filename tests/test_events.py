"""Kubernetes Events on the pod: what ``kubectl describe pod`` shows after /filter and /bind.

Reasons, types and message text are upstream HAMi's, letter for letter, because users and tools
grep for them. The events are written in the background: a full event queue or a hung API
server never holds up /filter. A bound pod gets one Event from us (BindingSucceed): its
FilteringSucceed is written only when no successful bind follows (``--filtering-succeed-events``).
"""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi import write_kubeconfig
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.event_correlator import AGGREGATE_PREFIX, SPAM_BURST
from hami_py.k8s.events import (BINDING_SUCCEED, FILTERING_FAILED, NORMAL, WARNING, EventRecorder,
                                filtering_failed_messages, filtering_succeeded_message, reason_types, rfc3339)
from hami_py.metrics import Metrics
from tests.conftest import UNBOUND_WINDOW_S, Gate, register_nodes, wait_until

T4 = {"type": "NVIDIA T4", "devmem": 10000, "devcore": 100}   # round numbers for readable scores


def _events(api, pod_name, namespace="default"):
    return [e for e in api.list("events", namespace=namespace)
            if e["involvedObject"]["name"] == pod_name]


def _seen(api, pod_name):
    return [(e["type"], e["reason"], e["message"]) for e in _events(api, pod_name)]


def _in_order(api, pod_name):
    """The pod's events' reasons in the order they were created."""
    events = sorted(_events(api, pod_name), key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["reason"] for e in events]


UNBOUND_SOON = embedded_options(filtering_succeed_window_s=UNBOUND_WINDOW_S)
ALWAYS = embedded_options(filtering_succeed_events="always")


async def _wait_events(api, pod_name, expected):
    await wait_until(lambda: set(expected) <= set(_seen(api, pod_name)),
                     f"events {expected} on {pod_name}; have {_seen(api, pod_name)}")


async def _busy_and_idle(api, app, extender):
    """Two one-GPU nodes; "busy" holds a pod with half of the memory and cores (score 11.00)."""
    names = await register_nodes(api, app, gpu_node("busy", devices=registration("busy", gpus=1, model=T4)),
                                 gpu_node("idle", devices=registration("idle", gpus=1, model=T4)))
    seed = api.create("pods", gpu_pod("seed", gpumem=5000, gpucores=50))
    assert (await extender.filter(seed, ["busy"]))["NodeNames"] == ["busy"]
    return names


async def test_a_bound_pod_gets_one_event_from_us_binding_succeed(api, app, extender):
    """kube-scheduler writes one Scheduled event a pod; we write one BindingSucceed (upstream's
    text): the filter's FilteringSucceed is dropped once the bind succeeds, and counted."""
    names = await _busy_and_idle(api, app, extender)
    pod = api.create("pods", gpu_pod("p", gpumem=1000, gpucores=10))
    assert (await extender.filter(pod, names + ["ghost"]))["NodeNames"] == ["busy"]
    assert pod["metadata"]["uid"] in app.events.parked      # waiting for the bind, not written
    assert (await extender.bind(pod, "busy"))["Error"] == ""
    await _wait_events(api, "p", [("Normal", "BindingSucceed", "Successfully binding node [busy] to default/p")])
    assert pod["metadata"]["uid"] not in app.events.parked  # nothing left to write later
    assert _seen(api, "p") == [("Normal", "BindingSucceed", "Successfully binding node [busy] to default/p")]
    assert _sample(app, "hami_events_merged_total", how="filter_into_bind") == 1
    # One Event POST in all: "seed", filtered and not bound, still waits for its bind.
    assert len(_writes(api, "POST")) == 1


@pytest.mark.parametrize("scheduler_options", [ALWAYS])
async def test_always_writes_upstreams_two_events_listing_every_fitting_node_with_its_score(api, app, extender):
    names = await _busy_and_idle(api, app, extender)
    pod = api.create("pods", gpu_pod("p", gpumem=1000, gpucores=10))
    result = await extender.filter(pod, names + ["ghost"])
    assert result["NodeNames"] == ["busy"]
    filtered = api.get("pods", "p", namespace="default")     # the filter wrote nothing
    assert filtered["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    await _wait_events(api, "p", [   # at once, before any bind
        ("Normal", "FilteringSucceed", "find fit node(busy), 1 nodes not fit, 2 nodes fit(idle:0.00,busy:11.00)")])
    assert (await extender.bind(pod, "busy"))["Error"] == ""
    await _wait_events(api, "p", [("Normal", "BindingSucceed", "Successfully binding node [busy] to default/p")])
    assert _in_order(api, "p") == ["FilteringSucceed", "BindingSucceed"]
    assert app.events.parked is None
    assert _sample(app, "hami_events_merged_total", how="filter_into_bind") == 0
    # Each event names the pod at the version the scheduler acted on: the one kube-scheduler sent
    # to /filter, which /bind binds (it reads no other).
    for reason, version in (("FilteringSucceed", pod), ("BindingSucceed", pod)):
        involved = next(e for e in _events(api, "p") if e["reason"] == reason)["involvedObject"]
        assert involved == {"kind": "Pod", "namespace": "default", "name": "p", "uid": pod["metadata"]["uid"],
                            "apiVersion": "v1", "resourceVersion": version["metadata"]["resourceVersion"]}, reason
    event = next(e for e in _events(api, "p") if e["reason"] == "BindingSucceed")
    assert event["source"] == {"component": "hami-scheduler"}
    assert event["reportingComponent"] == "hami-scheduler"
    assert event["count"] == 1
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["firstTimestamp"].endswith("Z") and "T" in event["firstTimestamp"]
    assert event["metadata"]["name"].startswith("p.")


@pytest.mark.parametrize("scheduler_options", [UNBOUND_SOON])
async def test_spread_policy_lists_scores_descending_with_the_winner_last(api, app, extender):
    names = await _busy_and_idle(api, app, extender)
    pod = api.create("pods", gpu_pod("s", gpumem=1000, gpucores=10,
                                     annotations={"hami.io/node-scheduler-policy": "spread"}))
    assert (await extender.filter(pod, names))["NodeNames"] == ["idle"]
    await _wait_events(api, "s", [
        ("Normal", "FilteringSucceed", "find fit node(idle), 0 nodes not fit, 2 nodes fit(busy:11.00,idle:0.00)")])


async def test_no_fit_records_one_event_per_reason_then_the_summary(api, app, extender):
    sick = registration("sick", gpus=2, model=T4)
    sick[1]["health"] = False
    names = await register_nodes(api, app, gpu_node("small1", devices=registration("small1", gpus=1, model=T4)),
                                 gpu_node("small2", devices=registration("small2", gpus=1, model=T4)),
                                 gpu_node("sick", devices=sick))
    pod = api.create("pods", gpu_pod("big", gpumem=20000))
    result = await extender.filter(pod, names + ["ghost"])
    assert result["FailedNodes"]["sick"] == "1/2 CardInsufficientMemory, 1/2 CardNotHealth"
    await _wait_events(api, "big", [
        ("Warning", "FilteringFailed", "3 nodes CardInsufficientMemory(sick,small1,small2)"),
        ("Warning", "FilteringFailed", "1 nodes CardNotHealth(sick)"),
        ("Warning", "FilteringFailed", "no available node, 4 nodes do not meet"),
    ])
    # "node unregistered" is not a "<n>/<m> <Reason>" token: no per-reason event for ghost.
    assert len(_events(api, "big")) == 3


@pytest.mark.parametrize("scheduler_options", [UNBOUND_SOON])
async def test_internal_filter_errors_are_filtering_failed_events(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    bad = api.create("pods", gpu_pod("weights", gpumem=1000,
                                     annotations={"hami.io/device-scoring-weights": "slot=1"}))
    error = (await extender.filter(bad, names))["Error"]
    assert "hami.io/device-scoring-weights" in error
    await _wait_events(api, "weights", [("Warning", "FilteringFailed", error)])
    # The filter writes nothing to the pod, so a pod the API server refuses to patch is no error:
    # its FilteringSucceed comes as for any other.
    api.faults.add(method="PATCH", path=r"/pods/unpatched$", status=500, times=None)
    pod = api.create("pods", gpu_pod("unpatched", gpumem=1000))
    assert (await extender.filter(pod, names)) == {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None,
                                                   "FailedAndUnresolvableNodes": None, "Error": ""}
    await _wait_events(api, "unpatched", [("Normal", "FilteringSucceed",
                                           "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)")])
    assert [e["reason"] for e in _events(api, "unpatched")] == ["FilteringSucceed"]


async def test_bind_failures_are_binding_failed_events(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=2), gpu_node("vanished", gpus=1))
    lost = api.create("pods", gpu_pod("lost", gpumem=1000))
    assert (await extender.filter(lost, ["vanished"]))["NodeNames"] == ["vanished"]
    api.delete("nodes", "vanished")                 # the node goes away between filter and bind
    await wait_until(lambda: "vanished" not in app.cache.nodes, "node deletion seen")
    assert (await extender.bind(lost, "vanished"))["Error"]
    names.remove("vanished")
    refused = api.create("pods", gpu_pod("refused", gpumem=1000))
    assert (await extender.filter(refused, names))["NodeNames"] == ["n1"]
    api.faults.add(method="POST", path=r"/pods/refused/binding$", status=403)
    error = (await extender.bind(refused, "n1"))["Error"]
    assert error
    await _wait_events(api, "lost", [("Warning", "BindingFailed", "failed to get node vanished")])
    await _wait_events(api, "refused", [("Warning", "BindingFailed", error)])
    # A failed bind writes the filter's FilteringSucceed first (it was waiting for the bind),
    # stamped with the filter's time: describe reads filter, then bind.
    assert ("Normal", "FilteringSucceed", "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)") in \
        _seen(api, "refused")
    for name in ("lost", "refused"):
        assert _in_order(api, name) == ["FilteringSucceed", "BindingFailed"], name
        first, then = sorted(_events(api, name), key=lambda e: int(e["metadata"]["resourceVersion"]))
        assert first["firstTimestamp"] <= then["firstTimestamp"]
    assert _sample(app, "hami_events_merged_total", how="filter_into_bind") == 0


async def test_a_filtered_pod_never_bound_gets_its_filtering_succeed_after_the_window(api):
    """A pod kube-scheduler holds in Permit, or a bind that never comes: once the window passes
    the sweeper writes the FilteringSucceed, stamped with the filter's time, not the write's."""
    window = 1.5      # more than a second: the write's second differs from the filter's
    async with running_scheduler(api, options=embedded_options(filtering_succeed_window_s=window)) as app:
        names = await register_nodes(api, app, gpu_node("n1", gpus=1))
        client = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("waiting", gpumem=1000))
            before = datetime.now(timezone.utc)
            assert (await client.filter(pod, names))["NodeNames"] == ["n1"]
            after = datetime.now(timezone.utc)
            assert _events(api, "waiting") == []          # parked, not written
            await wait_until(lambda: _events(api, "waiting"), "the FilteringSucceed after the window")
            written = datetime.now(timezone.utc)
        finally:
            await client.close()
        assert (written - before).total_seconds() >= window
        (event,) = _events(api, "waiting")
        assert (event["reason"], event["message"]) == (
            "FilteringSucceed", "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)")
        assert rfc3339(before) <= event["firstTimestamp"] <= rfc3339(after) < rfc3339(written)
        assert event["firstTimestamp"] == event["lastTimestamp"]
        assert len(app.events.parked) == 0


async def test_a_pod_deleted_before_its_bind_drops_its_parked_filtering_succeed(api):
    """Nobody reads an Event about a pod that is gone: deleting a filtered, unbound pod drops
    its parked FilteringSucceed (counted as dropped, pod_deleted) instead of writing it later."""
    async with running_scheduler(api, options=embedded_options(filtering_succeed_window_s=0.2)) as app:
        names = await register_nodes(api, app, gpu_node("n1", gpus=1))
        client = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("gone", gpumem=1000))
            assert (await client.filter(pod, names))["NodeNames"] == ["n1"]
            assert pod["metadata"]["uid"] in app.events.parked
            api.delete("pods", "gone", namespace="default")
            await wait_until(lambda: pod["metadata"]["uid"] not in app.events.parked, "the parked event dropped")
            # A filter of another pod parks and, past the window, writes: the sweep has run since.
            other = api.create("pods", gpu_pod("other", gpumem=1000))
            assert (await client.filter(other, names))["NodeNames"] == ["n1"]
            await wait_until(lambda: _events(api, "other"), "the other pod's FilteringSucceed")
        finally:
            await client.close()
        assert _events(api, "gone") == []
        assert _sample(app, "hami_events_dropped_total", cause="pod_deleted") == 1


async def test_a_new_filter_of_the_pod_writes_the_previous_decisions_event(api):
    async with running_scheduler(api, options=embedded_options()) as app:   # the default window, 10 s
        names = await register_nodes(api, app, gpu_node("n1", gpus=1), gpu_node("n2", gpus=1))
        client = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("again", gpumem=1000))
            assert (await client.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
            assert _events(api, "again") == []
            assert (await client.filter(pod, names))["NodeNames"]
            await _wait_events(api, "again", [("Normal", "FilteringSucceed",
                                               "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)")])
            assert len(_events(api, "again")) == 1        # the second decision waits for its bind
            assert pod["metadata"]["uid"] in app.events.parked
        finally:
            await client.close()


async def test_scheduler_name_is_the_event_source(api):
    options = embedded_options(scheduler_name="gpu-sched", filtering_succeed_window_s=UNBOUND_WINDOW_S)
    async with running_scheduler(api, options=options) as app:
        names = await register_nodes(api, app, gpu_node("n1", gpus=1))
        client = ExtenderClient(app.url)
        try:
            pod = api.create("pods", gpu_pod("named", gpumem=1000))
            assert (await client.filter(pod, names))["NodeNames"] == ["n1"]
        finally:
            await client.close()
        await wait_until(lambda: _events(api, "named"), "event written")
        event = _events(api, "named")[0]
        assert event["source"] == {"component": "gpu-sched"}
        assert event["reportingComponent"] == "gpu-sched"


@pytest.mark.parametrize("scheduler_options", [UNBOUND_SOON])
async def test_pods_without_device_requests_get_no_events(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    cpu = api.create("pods", {"metadata": {"name": "cpu", "namespace": "default"},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert (await extender.filter(cpu, names))["NodeNames"] == names
    marker = api.create("pods", gpu_pod("marker", gpumem=1000))
    await extender.filter(marker, names)
    await wait_until(lambda: _events(api, "marker"), "a later event written")
    assert _events(api, "cpu") == []


def _sample(app, name, **labels):
    return app.metrics.registry.get_sample_value(name, labels) or 0


async def test_a_full_event_queue_never_blocks_filter(api):
    options = embedded_options(event_queue_size=2, filtering_succeed_window_s=UNBOUND_WINDOW_S)
    async with running_scheduler(api, options=options) as app:
        extender = ExtenderClient(app.url)
        try:
            await _full_queue_scenario(api, app, extender)
        finally:
            await extender.close()


async def _full_queue_scenario(api, app, extender):
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    api.faults.add(method="POST", path=r"/events$", hang=True, times=None)   # the event sink hangs
    pods = [api.create("pods", gpu_pod(f"q{i}", gpumem=200000)) for i in range(12)]
    results = await asyncio.wait_for(asyncio.gather(*(extender.filter(p, names) for p in pods)), 30)
    assert all(r["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"} for r in results)
    # A queue of 2, plus at most one job held by each of the two (stuck) writers: the rest dropped.
    dropped = _sample(app, "hami_events_dropped_total", cause="queue_full")
    assert 12 - 2 - 2 <= dropped <= 12 - 2
    api.faults.clear()                            # the sink recovers: what was queued is written
    await wait_until(lambda: _sample(app, "hami_events_written_total") >= 2 * 2, "queued events written")
    ok = api.create("pods", gpu_pod("after", gpumem=1000))
    assert (await extender.filter(ok, names))["NodeNames"] == ["n1"]
    await _wait_events(api, "after", [
        ("Normal", "FilteringSucceed", "find fit node(n1), 0 nodes not fit, 1 nodes fit(n1:0.00)")])


# -- message formatting, exactly as upstream's ------------------------------------------------
def test_reason_types_only_count_fraction_tokens():
    assert reason_types("1/4 CardInsufficientMemory, 3/4 CardTypeMismatch") == {
        "CardInsufficientMemory", "CardTypeMismatch"}
    assert reason_types("NodeInsufficientDevice") == set()
    assert reason_types("node unregistered") == set()
    assert reason_types('Device with UUID "x" not found on node n after Fit') == set()


def test_failure_and_success_messages():
    failed = {"b": "1/1 CardNotHealth", "a": "2/2 CardNotHealth", "c": "node unregistered"}
    assert filtering_failed_messages(failed=failed, total_nodes=3) == [
        "2 nodes CardNotHealth(a,b)", "no available node, 3 nodes do not meet"]
    assert filtering_succeeded_message(node="y", best=[("y", 2.5), ("x", 1.005)], fit=2, total_nodes=5) == \
        "find fit node(y), 3 nodes not fit, 2 nodes fit(x:1.00,y:2.50)"


def _decide_over(nodes: list[dict], pod: dict, *, default_node: str = "binpack"):
    from hami_py.cache.usage import UsageCache
    from hami_py.devices.registry import build_vendors
    from hami_py.scheduling.decision.filter import Filterer
    from hami_py.scheduling.decision.requests import parse_pod_requests
    from hami_py.config import DeviceConfig
    vendors = build_vendors(DeviceConfig.default())
    cache = UsageCache(vendors)
    for node in nodes:
        cache.upsert_node(node)
    names = [n["metadata"]["name"] for n in nodes]
    request = parse_pod_requests(pod, vendors, cache.vendor_ids)
    return Filterer(cache, vendors, default_node_policy=default_node).decide(pod, names, request, reserve=False)


def test_success_message_lists_the_best_nodes_only_at_scale():
    """At thousands of nodes only the LISTED_NODE_SCORES best are listed (winner last), after a
    count of those left out; identical nodes tie, and the winner is listed whatever the tie."""
    from hami_py.scheduling.decision.filter import LISTED_NODE_SCORES
    idle = [gpu_node(f"idle-{i:03d}", devices=registration(f"idle-{i:03d}", gpus=1, model=T4)) for i in range(60)]
    full = [gpu_node(f"full-{i}", devices=registration(f"full-{i}", gpus=1, model={**T4, "devmem": 500}))
            for i in range(3)]
    pod = gpu_pod("p", gpumem=1000, gpucores=10)
    for policy in ("binpack", "spread"):
        decision = _decide_over(full + idle, pod, default_node=policy)
        assert decision.node == "idle-000"   # all tie: the first candidate wins
        message = filtering_succeeded_message(node=decision.node, best=decision.best, fit=decision.fit_count,
                                              total_nodes=decision.total)
        assert message.startswith(f"find fit node(idle-000), 3 nodes not fit, 60 nodes fit(…{60 - LISTED_NODE_SCORES} more,")
        assert message.endswith(",idle-000:0.00)") and message.count(":") == LISTED_NODE_SCORES



# -- client-go's correlator: repeats merged, similar events combined, spam filtered ---------------
@pytest.fixture
async def make_recorder(api, tmp_path):
    """EventRecorders (started) writing to ``api``; each stopped at the end of the test."""
    kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url)
    client = KubeClient(await load_configuration(kubeconfig), qps=0, burst=1)
    made = []

    def make(**options) -> EventRecorder:
        events = EventRecorder(client, component="hami-scheduler", metrics=Metrics(), qps=0, workers=2, **options)
        events.start()
        made.append(events)
        return events
    try:
        yield make
    finally:
        for events in made:
            await events.stop()
        await client.close()


@pytest.fixture
async def recorder(make_recorder):
    return make_recorder()


def _pod(name):
    return {"metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}", "resourceVersion": "7"}}


def _event(type_, reason, message):
    return lambda: [(type_, reason, message)]


def _writes(api, method):
    return [r for r in api.requests if r[0] == method and "/events" in r[1]]


def _counter(recorder, name, **labels):
    return recorder.metrics.registry.get_sample_value(name, labels) or 0


async def test_identical_events_raise_the_count_of_one_event(api, recorder):
    pod = _pod("again")
    for n in range(1, 4):   # each written before the next: a POST, then PATCHes of its count
        recorder.record(pod, _event(WARNING, FILTERING_FAILED, "no available node, 2 nodes do not meet"))
        await wait_until(lambda: [e["count"] for e in _events(api, "again")] == [n], f"count {n}")
    event = _events(api, "again")[0]
    assert event["message"] == "no available node, 2 nodes do not meet"
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    assert (len(_writes(api, "POST")), len(_writes(api, "PATCH"))) == (1, 2)
    assert _counter(recorder, "hami_events_merged_total", how="repeat") == 2
    # A different message is a different Event.
    recorder.record(pod, _event(WARNING, FILTERING_FAILED, "no available node, 3 nodes do not meet"))
    await wait_until(lambda: len(_events(api, "again")) == 2, "a second event")


async def test_repeats_waiting_for_the_budget_fold_into_one_write(api, recorder):
    gate = recorder.bucket = Gate()
    pod = _pod("burst")
    for _ in range(50):
        recorder.record(pod, _event(WARNING, FILTERING_FAILED, "no available node, 2 nodes do not meet"))
    await wait_until(lambda: recorder.queue.qsize() == 0 and gate.waiting == 1, "the writers blocked on the budget")
    assert _writes(api, "POST") == []
    gate.open.set()
    await wait_until(lambda: [e["count"] for e in _events(api, "burst")] == [50], "one event counting 50")
    assert len(_writes(api, "POST")) + len(_writes(api, "PATCH")) == 1
    assert _counter(recorder, "hami_events_merged_total", how="pending") == 49


async def test_similar_events_are_combined_after_ten_messages(api, recorder):
    pod = _pod("similar")
    for i in range(12):
        recorder.record(pod, _event(WARNING, FILTERING_FAILED, f"no available node, {i} nodes do not meet"))
    combined = AGGREGATE_PREFIX + "no available node, 11 nodes do not meet"
    await wait_until(lambda: any(e["message"] == combined for e in _events(api, "similar")), "the combined event")
    messages = sorted(e["message"] for e in _events(api, "similar"))
    assert len(messages) == 10      # nine on their own, then one for the rest
    assert next(e for e in _events(api, "similar") if e["message"] == combined)["count"] == 3
    assert _counter(recorder, "hami_events_merged_total", how="similar") == 3


async def test_a_pod_past_its_spam_burst_has_its_events_dropped_and_counted(api, recorder):
    noisy, quiet = _pod("noisy"), _pod("quiet")
    for i in range(SPAM_BURST + 5):   # different reasons: nothing to merge, every one a write
        recorder.record(noisy, _event(NORMAL, f"Reason{i}", "m"))
    recorder.record(quiet, _event(NORMAL, BINDING_SUCCEED, "m"))
    await wait_until(lambda: recorder.queue.qsize() == 0 and _counter(recorder, "hami_events_written_total")
                     == SPAM_BURST + 1, "the allowed events written")
    await recorder.stop()
    assert len(_events(api, "noisy")) == SPAM_BURST
    assert len(_events(api, "quiet")) == 1         # one pod's spam never silences another's
    assert _counter(recorder, "hami_events_dropped_total", cause="spam") == 5


async def test_a_repeat_of_an_expired_event_creates_it_again(api, recorder):
    pod = _pod("expired")
    recorder.record(pod, _event(NORMAL, BINDING_SUCCEED, "m"))
    await wait_until(lambda: len(_events(api, "expired")) == 1, "the event")
    api.delete("events", _events(api, "expired")[0]["metadata"]["name"], namespace="default")
    recorder.record(pod, _event(NORMAL, BINDING_SUCCEED, "m"))
    await wait_until(lambda: len(_events(api, "expired")) == 1, "the event again")
    assert _events(api, "expired")[0]["count"] == 2


async def test_a_burst_of_events_never_holds_up_a_pod_patch_lock_or_binding(api):
    """Events starved of their budget for good, their queue overflowing: /filter and /bind still
    place every pod, on a --kube-qps budget events never draw from."""
    options = embedded_options(kube_qps=0.001, kube_burst=200, event_queue_size=500)
    async with running_scheduler(api, options=options) as app:
        extender = ExtenderClient(app.url)
        try:
            names = await register_nodes(api, app, gpu_node("n1", gpus=4), gpu_node("n2", gpus=4))
            for i in range(1000):      # a flood of FilteringFailed explanations for 1 000 pods
                app.events.record(_pod(f"flood-{i}"), _event(WARNING, FILTERING_FAILED, "no available node"))
            await wait_until(lambda: app.events.bucket.tokens < 1, "the events' budget spent")
            assert _sample(app, "hami_events_dropped_total", cause="queue_full") > 0
            # The last token taken is not yet the last POST arrived: wait for the burst's 200.
            await wait_until(lambda: len(_writes(api, "POST")) >= 200, "the burst's events written")
            posts_before = len(_writes(api, "POST"))
            pods = [api.create("pods", gpu_pod(f"w{i}", gpumem=1000)) for i in range(6)]
            for pod in pods:
                node = (await extender.filter(pod, names))["NodeNames"][0]
                assert (await extender.bind(pod, node))["Error"] == ""
            assert all(api.get("pods", p["metadata"]["name"], namespace="default")["spec"].get("nodeName")
                       for p in pods)
            # ... and not one of their own events went out: the events' budget was spent.
            assert len(_writes(api, "POST")) == posts_before
            assert app.client.bucket.tokens >= 1
        finally:
            await extender.close()


# -- a FilteringSucceed parked until the pod's bind ------------------------------------------------
def _decision(node="n1"):
    """What the filter hands on_filter: the few fields the FilteringSucceed message reads."""
    return SimpleNamespace(node=node, best=[(node, 0.0)], fit_count=1, total=1)


def _fit_message(node="n1"):
    return f"find fit node({node}), 0 nodes not fit, 1 nodes fit({node}:0.00)"


async def test_shutdown_writes_every_parked_filtering_succeed(api, recorder):
    for name in ("a", "b", "c"):
        recorder.on_filter(_pod(name), "filter_succeeded", _decision())
    assert len(recorder.parked) == 3 and _writes(api, "POST") == []
    await recorder.stop()
    for name in ("a", "b", "c"):
        assert _seen(api, name) == [(NORMAL, "FilteringSucceed", _fit_message())], name
    assert len(recorder.parked) == 0
    recorder.on_filter(_pod("late"), "filter_succeeded", _decision())   # stopped: nothing more taken
    assert len(recorder.parked) == 0


async def test_the_parked_set_is_bounded_and_its_oldest_is_written_not_lost(api, make_recorder):
    recorder = make_recorder(queue_size=3)
    for i in range(5):
        recorder.on_filter(_pod(f"p{i}"), "filter_succeeded", _decision())
    await wait_until(lambda: _events(api, "p0") and _events(api, "p1"), "the two oldest written")
    assert len(recorder.parked) == 3
    assert [bool(_events(api, f"p{i}")) for i in range(5)] == [True, True, False, False, False]
    assert _counter(recorder, "hami_events_dropped_total", cause="queue_full") == 0


async def test_a_successful_bind_folds_the_parked_event_and_counts_it(api, recorder):
    pod = _pod("folded")
    recorder.on_filter(pod, "filter_succeeded", _decision())
    recorder.on_bind(pod, "n1", None)
    await wait_until(lambda: _events(api, "folded"), "the bind's event")
    assert _seen(api, "folded") == [(NORMAL, BINDING_SUCCEED, "Successfully binding node [n1] to default/folded")]
    assert _counter(recorder, "hami_events_merged_total", how="filter_into_bind") == 1
    recorder.on_bind(_pod("unfiltered"), "n1", None)          # nothing parked: nothing folded
    await wait_until(lambda: _events(api, "unfiltered"), "the other bind's event")
    assert _counter(recorder, "hami_events_merged_total", how="filter_into_bind") == 1
    await recorder.stop()
    assert len(_events(api, "folded")) == 1                   # and nothing written at shutdown


async def test_any_other_event_of_the_pod_writes_the_parked_one_first(api, recorder):
    """A failed bind, a failed re-filter, a preemption: each is written after the filter's
    success, by one writer, so they land in that order."""
    for name, later in (("bind-failed", lambda pod: recorder.on_bind(pod, "n1", "node lock contention")),
                        ("refiltered", lambda pod: recorder.on_filter(pod, "filter_error", "bad weights")),
                        ("preempted", lambda pod: recorder.on_preempt(pod, "Preempted", "by someone"))):
        pod = _pod(name)
        recorder.on_filter(pod, "filter_succeeded", _decision())
        later(pod)
        await wait_until(lambda name=name: len(_events(api, name)) == 2, f"{name}'s two events")
        assert _in_order(api, name)[0] == "FilteringSucceed", name
    assert len(recorder.parked) == 0


async def test_a_pod_without_a_uid_is_never_parked(api, recorder):
    pod = {"metadata": {"namespace": "default", "name": "anonymous"}}
    recorder.on_filter(pod, "filter_succeeded", _decision())
    assert len(recorder.parked) == 0
    await wait_until(lambda: _events(api, "anonymous"), "the FilteringSucceed at once")


async def test_always_and_a_zero_window_park_nothing(api, make_recorder):
    for name, options in (("always", {"filtering_succeed": "always"}), ("zero", {"filtering_succeed_window_s": 0})):
        recorder = make_recorder(**options)
        assert recorder.parked is None
        recorder.on_filter(_pod(name), "filter_succeeded", _decision())
        await wait_until(lambda name=name: _events(api, name), f"{name}: the FilteringSucceed at once")
    with pytest.raises(ValueError, match="filtering_succeed"):
        make_recorder(filtering_succeed="sometimes")



def test_the_parking_lot_hands_back_what_is_due_oldest_first():
    from hami_py.k8s.event_parking import ParkingLot
    now = [0.0]
    lot = ParkingLot(window_s=10, limit=3, clock=lambda: now[0])
    assert lot.park("a", "a1") == []
    now[0] = 1
    assert lot.park("b", "b1") == []
    assert lot.park("a", "a2") == ["a1"]          # filtered again: the old decision is due
    now[0] = 2
    assert lot.park("c", "c1") == []
    assert lot.park("d", "d1") == ["b1"]          # over the limit: the oldest
    now[0] = 11
    assert lot.expired() == ["a2"]                # parked at 1: its window ends at 11
    assert lot.take("c") == "c1" and lot.take("c") is None
    assert lot.drain() == ["d1"] and len(lot) == 0


async def test_events_that_waited_too_long_are_merged_or_dropped_so_a_fresh_one_is_written_at_once(api, make_recorder):
    """Behind a backlog (a burst on a slow budget), an event that waited in the queue past its
    bound is not written: merged into its pod's later event when there is one, else dropped, both
    counted; the fresh events are written as soon as the budget allows, not after the backlog."""
    now = [1000.0]
    recorder = make_recorder(max_age_s=10.0, clock=lambda: now[0])
    gate = recorder.bucket = Gate()
    for name in ("first", "second"):             # taken by the two writers, which then wait
        recorder.record(_pod(name), _event(WARNING, FILTERING_FAILED, "old"))
    await wait_until(lambda: gate.waiting == 2 and recorder.queue.qsize() == 0, "both writers waiting")
    recorder.record(_pod("a"), _event(WARNING, FILTERING_FAILED, "no available node (old)"))
    for i in range(5):
        recorder.record(_pod(f"backlog{i}"), _event(WARNING, FILTERING_FAILED, "old"))
    now[0] += 11.0                                # the backlog is now past its bound
    recorder.record(_pod("a"), _event(NORMAL, BINDING_SUCCEED, "bound (fresh)"))
    recorder.record(_pod("fresh"), _event(NORMAL, BINDING_SUCCEED, "bound (fresh)"))
    gate.open.set()
    await wait_until(lambda: recorder.queue.qsize() == 0 and _counter(recorder, "hami_events_written_total") == 4,
                     "the writers' two and the two fresh events written")
    assert [e["message"] for e in _events(api, "a")] == ["bound (fresh)"]
    assert len(_events(api, "fresh")) == 1 and len(_events(api, "first")) == 1
    assert all(_events(api, f"backlog{i}") == [] for i in range(5))
    assert _counter(recorder, "hami_events_merged_total", how="superseded") == 1
    assert _counter(recorder, "hami_events_dropped_total", cause="stale") == 5

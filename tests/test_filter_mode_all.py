"""--filter-mode=all: /filter answers every fitting node and writes nothing, /prioritize scores
them on kube-scheduler's 0..10 scale with our node policy, /bind fits the pod again on the node
kube-scheduler chose and reserves it there under the same race-free rules (and answers an Error
naming the node and the reason when it no longer fits).

Against the in-repo API server; the end-to-end run with the real kube-scheduler is in
tests/test_real_k8s_kube_scheduler.py (``test_all_mode_*``).
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hami_py.cache.pod_states import PodState
from hami_py.cli import build_parser, main, options_from_args
from hami_py.embedded import embedded_options
from hami_py.fakeapi.objects import gpu_node, gpu_pod, gpu_uuid, registration
from hami_py.k8s.events import FILTERING_SUCCEED
from hami_py.scheduling.decision.filter import LISTED_NODE_SCORES
from hami_py.scheduling.decision.policies import NODE_POLICY_ANNOTATION
from hami_py.scheduling.verbs.prioritize import MAX_EXTENDER_PRIORITY
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import UNBOUND_WINDOW_S, assert_books_balance, keeper_passes, register_nodes, wait_until
from tests.reliability_helpers import oversubscribed, wait_books_balance

A10 = {"type": "NVIDIA A10", "devmem": 24000, "devcore": 100}
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@pytest.fixture
def scheduler_options():
    return embedded_options(filter_mode="all")


async def one_gpu_nodes(api, app, *names: str) -> list[str]:
    return await register_nodes(api, app, *(gpu_node(n, devices=registration(n, gpus=1, model=A10)) for n in names))


def mem_pod(name: str, mem: int, annotations: dict | None = None) -> dict:
    return gpu_pod(name, gpus=1, gpumem=mem, annotations=annotations)


async def filtered(api, extender, pod: dict, names: list[str]) -> tuple[dict, dict]:
    created = api.create("pods", pod)
    return created, await extender.filter(created, names)


async def bound_on(api, app, extender, pod: dict, node: str, names: list[str]) -> dict:
    """Create, filter (all mode) and bind ``pod`` on ``node``, as kube-scheduler would after
    choosing it; wait until the pod watch shows the Binding."""
    created, result = await filtered(api, extender, pod, names)
    assert node in (result["NodeNames"] or []), result
    assert (await extender.bind(created, node)) == {"Error": ""}
    uid = created["metadata"]["uid"]
    await wait_until(lambda: (r := app.cache.pods.get(uid)) is not None and r.resource_version is not None,
                     f"{pod['metadata']['name']}'s Binding seen by the watch")
    return api.get("pods", pod["metadata"]["name"], namespace="default")


def writes_since(api, mark: int) -> list[tuple[str, str, str]]:
    return [r for r in list(api.requests)[mark:] if r[0] in WRITES]


def scores(result: list[dict]) -> dict[str, int]:
    return {h["Host"]: h["Score"] for h in result}


def events_of(api, pod: str) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in api.list("events", namespace="default")
            if e["involvedObject"]["name"] == pod]


# -- /filter ---------------------------------------------------------------------------------------

async def test_filter_answers_every_node_where_the_pod_fits(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2", "n3", "n4")
    await bound_on(api, app, extender, mem_pod("big", 20000), "n2", names)
    _, result = await filtered(api, extender, mem_pod("p", 8000), ["n4", "n3", "n2", "n1", "ghost"])
    assert result["Error"] == ""
    assert result["NodeNames"] == ["n4", "n3", "n1"]    # kube-scheduler's order, n2 full, ghost unknown


@pytest.mark.parametrize("scheduler_options", [embedded_options(filter_mode="all", registration_interval_s=0.3,
                                                                 filtering_succeed_window_s=UNBOUND_WINDOW_S)])
async def test_filter_makes_no_reservation_and_writes_nothing(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    await keeper_passes(app, 1)         # the new nodes' handshake stamps are written before the count
    pod = api.create("pods", mem_pod("p", 8000))
    mark = len(api.requests)
    result = await extender.filter(pod, names)
    assert result["NodeNames"] == ["n1", "n2"]
    await wait_until(lambda: any(r == FILTERING_SUCCEED for r, _ in events_of(api, "p")), "FilteringSucceed")
    # The only request the filter caused is its event (the pod is never bound: written after the
    # window): no pod read, patch or Binding, no node lock.
    assert [(m, p) for m, p, _ in list(api.requests)[mark:]] == [("POST", "/api/v1/namespaces/default/events")]
    assert all(LOCK_ANNOTATION not in (api.get("nodes", n)["metadata"].get("annotations") or {}) for n in names)
    assert pod["metadata"]["uid"] not in app.cache.pods
    assert all(d["usedmem"] == 0 for n in names for d in app.cache.device_usage(n))
    assert not (api.get("pods", "p", namespace="default")["metadata"].get("annotations") or {}).keys() & {
        "hami.io/vgpu-node", "hami.io/vgpu-devices-allocated"}


async def test_filter_that_fits_nowhere_answers_the_reasons(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    _, result = await filtered(api, extender, mem_pod("huge", 30000), names)
    assert result["NodeNames"] is None
    assert set(result["FailedNodes"]) == {"n1", "n2"}
    assert "CardInsufficientMemory" in result["FailedNodes"]["n1"]


@pytest.mark.parametrize("scheduler_options", [embedded_options(filter_mode="all",
                                                                 filtering_succeed_window_s=UNBOUND_WINDOW_S)])
async def test_the_filtering_succeed_message_stays_bounded(api, app, extender):
    count = LISTED_NODE_SCORES + 30
    names = await one_gpu_nodes(api, app, *(f"n{i:03}" for i in range(count)))
    _, result = await filtered(api, extender, mem_pod("p", 1000), names)
    assert len(result["NodeNames"]) == count
    await wait_until(lambda: any(r == FILTERING_SUCCEED for r, _ in events_of(api, "p")), "FilteringSucceed")
    message = next(m for r, m in events_of(api, "p") if r == FILTERING_SUCCEED)
    assert f"{count} nodes fit(…30 more," in message
    assert message.count(":") == LISTED_NODE_SCORES


# -- /prioritize -----------------------------------------------------------------------------------

async def used_nodes(api, app, extender) -> list[str]:
    """n0 empty, n1 a quarter used, n2 half, n3 three quarters (memory), n4 full."""
    names = await one_gpu_nodes(api, app, "n0", "n1", "n2", "n3", "n4")
    for i, mem in ((1, 6000), (2, 12000), (3, 18000), (4, 24000)):
        await bound_on(api, app, extender, mem_pod(f"fill{i}", mem), f"n{i}", names)
    return names


async def test_prioritize_binpack_ranks_the_fullest_fitting_node_first(api, app, extender):
    names = await used_nodes(api, app, extender)
    pod = api.create("pods", mem_pod("p", 4000))
    result = await extender.prioritize(pod, names + ["ghost"])
    assert [h["Host"] for h in result] == names + ["ghost"]    # the request's order, every node
    got = scores(result)
    assert got["n3"] == MAX_EXTENDER_PRIORITY and got["n0"] == 1
    assert got["n3"] > got["n2"] > got["n1"] > got["n0"]
    assert got["n4"] == 0 and got["ghost"] == 0                # no longer fits / unknown: below every fit
    assert all(isinstance(s, int) and 0 <= s <= MAX_EXTENDER_PRIORITY for s in got.values())
    # What /filter's own policy would pick is what prioritize ranks first.
    assert (await extender.filter(pod, names))["NodeNames"] == ["n0", "n1", "n2", "n3"]
    assert app.cache.pods.get(pod["metadata"]["uid"]) is None   # nor does prioritize reserve


async def test_prioritize_spread_ranks_the_emptiest_node_first_and_the_pod_may_ask_for_it(api, app, extender):
    names = await used_nodes(api, app, extender)
    pod = api.create("pods", mem_pod("p", 4000, annotations={NODE_POLICY_ANNOTATION: "spread"}))
    got = scores(await extender.prioritize(pod, names))
    assert got["n0"] == MAX_EXTENDER_PRIORITY and got["n3"] == 1
    assert got["n0"] > got["n1"] > got["n2"] > got["n3"]
    assert got["n4"] == 0


@pytest.mark.parametrize("scheduler_options", [embedded_options(filter_mode="all", node_scheduler_policy="spread")])
async def test_prioritize_follows_the_default_node_policy(api, app, extender):
    names = await used_nodes(api, app, extender)
    pod = api.create("pods", mem_pod("p", 4000))
    got = scores(await extender.prioritize(pod, names))
    assert got["n0"] == MAX_EXTENDER_PRIORITY and got["n3"] == 1


async def test_prioritize_gives_equal_nodes_the_same_top_score(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2", "n3")
    pod = api.create("pods", mem_pod("p", 4000))
    assert scores(await extender.prioritize(pod, names)) == {n: MAX_EXTENDER_PRIORITY for n in names}


async def test_prioritize_right_after_the_pods_filter_reuses_its_fit(api, app, extender):
    """kube-scheduler's /prioritize follows the pod's /filter in the same scheduling cycle, with
    the nodes the filter let through: no second kernel run, the same scores a fresh fit gives.
    Other nodes, another pod or a fit older than LAST_FIT_S are fitted again."""
    from hami_py.scheduling.verbs import prioritize as module
    names = await used_nodes(api, app, extender)
    filterer = app.service.filterer
    runs = []
    kernel = filterer.kernel
    filterer.kernel = lambda table, query: runs.append(len(query.candidates)) or kernel(table, query)
    pod, result = await filtered(api, extender, mem_pod("p", 4000), names)
    assert runs == [5] and result["NodeNames"] == ["n0", "n1", "n2", "n3"]
    reused = await extender.prioritize(pod, result["NodeNames"])
    assert runs == [5]                                             # the filter's fit
    fresh = module.host_priorities(result["NodeNames"], filterer.evaluate(
        pod, result["NodeNames"], parse_pod_requests(pod, app.vendors, app.cache.vendor_ids))).as_list()
    assert reused == fresh and scores(reused)["n3"] == MAX_EXTENDER_PRIORITY
    runs.clear()
    await extender.prioritize(pod, ["n0", "n1"])                   # not the filter's answer
    assert runs == [2]
    other = api.create("pods", mem_pod("other", 4000))
    await extender.prioritize(other, result["NodeNames"])          # not the filtered pod
    assert runs == [2, 4]
    uid, when, *rest = app.service.all_nodes._last
    app.service.all_nodes._last = (uid, when - module.LAST_FIT_S, *rest)
    await extender.prioritize(pod, result["NodeNames"])            # too old
    assert runs == [2, 4, 4]

async def test_prioritize_of_a_pod_without_devices_scores_nothing(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    pod = {"metadata": {"name": "plain", "namespace": "default", "uid": "u-plain"},
           "spec": {"containers": [{"name": "c"}]}}
    assert await extender.prioritize(pod, names) == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]


async def prometheus_value(app, name: str, labels: str) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(app.metrics_url + "/metrics") as r:
            text = await r.text()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("body", [
    b"not json",
    b"",
    b'["a list"]',
    b'{"NodeNames": ["n1"]}',
    b'{"Pod": "a string", "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": '
    b'[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "NodeNames": "n1"}',
    b'{"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": '
    b'[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "Nodes": {"items": []}}',
    b'{"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": '
    b'[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "x"}}}]}}, "NodeNames": ["n1"]}',
    b'{"Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u", "annotations": '
    b'{"hami.io/device-scoring-weights": "slot=x"}}, "spec": {"containers": '
    b'[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, "NodeNames": ["n1"]}',
], ids=["not-json", "empty", "not-object", "no-pod", "pod-not-object", "names-not-list", "nodes-only",
        "bad-quantity", "bad-weights"])
async def test_a_malformed_prioritize_is_answered_with_no_scores_and_http_200(api, app, extender, body):
    await one_gpu_nodes(api, app, "n1")
    before = await prometheus_value(app, "hami_extender_request_errors_total", 'verb="prioritize"')
    status, result = await extender.post("prioritize", body)
    assert (status, result) == (200, [])
    assert await prometheus_value(app, "hami_extender_request_errors_total", 'verb="prioritize"') == before + 1


@pytest.mark.parametrize("scheduler_options", [embedded_options()])
async def test_prioritize_in_best_mode_gives_no_scores(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    pod = api.create("pods", mem_pod("p", 4000))
    assert await extender.prioritize(pod, names) == []
    assert (await extender.filter(pod, names + ["n2"]))["NodeNames"] == ["n1"]   # best: one node


# -- /bind -----------------------------------------------------------------------------------------

async def test_bind_fits_again_on_the_chosen_node_and_binds_it_there(api, app, extender):
    names = await used_nodes(api, app, extender)
    pod, result = await filtered(api, extender, mem_pod("p", 4000), names)
    assert "n0" in result["NodeNames"]
    mark = len(api.requests)
    # Binpack prefers n3; kube-scheduler chose n0 (its own plugins won): the pod goes to n0.
    assert await extender.bind(pod, "n0") == {"Error": ""}
    stored = api.get("pods", "p", namespace="default")
    assert stored["spec"]["nodeName"] == "n0"
    annotations = stored["metadata"]["annotations"]
    assert annotations["hami.io/vgpu-node"] == "n0"
    assert annotations["hami.io/bind-phase"] == "allocating"
    assert gpu_uuid("n0", 0) in annotations["hami.io/vgpu-devices-allocated"]
    # The pod remembered from its filter: no read of it, only the node lock and the Binding.
    requested = [(m, p) for m, p, _ in list(api.requests)[mark:]]
    assert ("GET", "/api/v1/namespaces/default/pods/p") not in requested
    assert ("POST", "/api/v1/namespaces/default/pods/p/binding") in requested
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n0")) == 4000


async def test_bind_of_a_pod_not_remembered_reads_it_first(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    pod, result = await filtered(api, extender, mem_pod("p", 4000), names)
    app.service.all_nodes.forget(pod["metadata"]["uid"])      # as after a restart between the two
    mark = len(api.requests)
    assert await extender.bind(pod, "n2") == {"Error": ""}
    assert ("GET", "/api/v1/namespaces/default/pods/p") in [(m, p) for m, p, _ in list(api.requests)[mark:]]
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "n2"
    await wait_books_balance(api, app)


async def test_two_pods_racing_for_the_last_room_one_binds_one_gets_an_error(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    a, ra = await filtered(api, extender, mem_pod("a", 16000), names)
    b, rb = await filtered(api, extender, mem_pod("b", 16000), names)
    assert ra["NodeNames"] == rb["NodeNames"] == ["n1"]      # no reservation: both see the room
    answers = await asyncio.gather(extender.bind(a, "n1"), extender.bind(b, "n1"))
    errors = sorted(r["Error"] for r in answers)
    assert errors[0] == ""
    loser = "a" if answers[0]["Error"] else "b"
    assert errors[1].startswith(f"pod default/{loser} no longer fits on node n1: ")
    assert "CardInsufficientMemory" in errors[1] and errors[1].endswith("(filter it again)")
    winner = "b" if loser == "a" else "a"
    assert api.get("pods", winner, namespace="default")["spec"]["nodeName"] == "n1"
    assert not api.get("pods", loser, namespace="default")["spec"].get("nodeName")
    await wait_books_balance(api, app)
    assert oversubscribed(api, app) == []
    assert_books_balance(app)
    loser_uid = (a if loser == "a" else b)["metadata"]["uid"]
    assert loser_uid not in app.cache.pods                    # nothing held for the loser
    await wait_until(lambda: ("BindingFailed", errors[1]) in events_of(api, loser), "BindingFailed event")
    # kube-scheduler's retry: the loser's next filter finds no room left.
    retry = await extender.filter(api.get("pods", loser, namespace="default"), names)
    assert retry["NodeNames"] is None and "n1" in retry["FailedNodes"]


async def test_many_binds_racing_never_oversubscribe(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    pods = []
    for i in range(8):
        pod, result = await filtered(api, extender, mem_pod(f"p{i}", 10000), names)
        assert result["NodeNames"] == names
        pods.append(pod)
    answers = await asyncio.gather(*(extender.bind(p, "n1" if i % 2 else "n2") for i, p in enumerate(pods)))
    assert sum(1 for r in answers if r["Error"] == "") == 4      # two 10 GB pods per 24 GB card
    await wait_books_balance(api, app)
    assert oversubscribed(api, app) == []


async def test_a_crowd_of_binds_on_random_nodes_fills_them_exactly(api, app, extender):
    """40 pods of 6 to 16 GB filtered together (none reserves), then all bound at once on nodes
    picked at random among those each filter answered: whatever the order, no device is charged
    beyond its memory, every refusal names the node and its reason, and the books balance."""
    import random
    rng = random.Random(14)
    names = await register_nodes(api, app, *(gpu_node(n, devices=registration(n, gpus=2, model=A10))
                                             for n in ("n1", "n2", "n3", "n4")))
    pods = []
    for i in range(40):
        pod, result = await filtered(api, extender, mem_pod(f"p{i}", rng.choice((6000, 8000, 12000, 16000))), names)
        assert result["NodeNames"] == names
        pods.append((pod, rng.choice(result["NodeNames"])))
    answers = await asyncio.gather(*(extender.bind(pod, node) for pod, node in pods))
    refused = [(pod, node, a["Error"]) for (pod, node), a in zip(pods, answers) if a["Error"]]
    assert 0 < len(refused) < len(pods)      # 420 GB asked of 192 GB: many lose their race
    for pod, node, error in refused:
        assert error.startswith(f"pod default/{pod['metadata']['name']} no longer fits on node {node}: "), error
    await wait_books_balance(api, app)
    assert oversubscribed(api, app) == []
    bound = {pod["metadata"]["name"]: node for (pod, node), a in zip(pods, answers) if not a["Error"]}
    for name, node in bound.items():
        assert api.get("pods", name, namespace="default")["spec"]["nodeName"] == node
    charged = sum(d["usedmem"] for n in names for d in app.cache.device_usage(n))
    assert charged == sum(int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"])
                          for p, _ in pods if p["metadata"]["name"] in bound)


async def test_a_node_that_no_longer_fits_is_an_error_and_holds_nothing(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    late, result = await filtered(api, extender, mem_pod("late", 16000), names)
    assert result["NodeNames"] == names
    await bound_on(api, app, extender, mem_pod("first", 16000), "n1", names)   # takes n1's room meanwhile
    answer = await extender.bind(late, "n1")
    assert answer["Error"].startswith("pod default/late no longer fits on node n1: ")
    assert late["metadata"]["uid"] not in app.cache.pods
    assert not api.get("pods", "late", namespace="default")["spec"].get("nodeName")
    # The retry kube-scheduler makes: filter again, bind where there is room.
    retry = await extender.filter(api.get("pods", "late", namespace="default"), names)
    assert retry["NodeNames"] == ["n2"]
    assert await extender.bind(late, "n2") == {"Error": ""}
    await wait_books_balance(api, app)


async def test_a_node_gone_since_the_filter_is_an_error(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    pod, _ = await filtered(api, extender, mem_pod("p", 4000), names)
    api.delete("nodes", "n1")
    await wait_until(lambda: "n1" not in app.cache.nodes, "n1 gone from the cache")
    answer = await extender.bind(pod, "n1")
    assert answer == {"Error": "pod default/p no longer fits on node n1: node unregistered (filter it again)"}
    assert pod["metadata"]["uid"] not in app.cache.pods


async def test_a_repeated_bind_is_answered_without_binding_twice(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    pod = await bound_on(api, app, extender, mem_pod("p", 16000), "n1", names)
    assert await extender.bind(pod, "n1") == {"Error": ""}      # kube-scheduler lost our answer
    await wait_books_balance(api, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage("n1")) == 16000


async def test_a_pod_without_devices_is_bound_as_in_best_mode(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    plain = api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": "plain", "namespace": "default"},
                                "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert (await extender.filter(plain, names))["NodeNames"] == names
    assert await extender.bind(plain, "n1") == {"Error": ""}
    assert api.get("pods", "plain", namespace="default")["spec"]["nodeName"] == "n1"


async def test_a_replica_that_does_not_serve_never_reserves_at_bind(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    pod, result = await filtered(api, extender, mem_pod("p", 4000), names)
    app.service.synced.clear()          # as when leadership is lost (app.py _update_serving)
    answer = await extender.bind(pod, "n1")
    assert answer["Error"] == ("pod default/p: this scheduler is not serving (not the leader, or its cache is "
                               "not synced yet); filter it again")
    assert pod["metadata"]["uid"] not in app.cache.pods
    assert not api.get("pods", "p", namespace="default")["spec"].get("nodeName")

# -- the flag --------------------------------------------------------------------------------------

def test_the_flag_defaults_to_best_and_takes_all():
    assert options_from_args(build_parser().parse_args([])).filter_mode == "best"
    assert options_from_args(build_parser().parse_args(["--filter-mode=all"])).filter_mode == "all"


def test_an_unknown_filter_mode_is_refused_at_start(capsys):
    assert main(["--filter-mode=some"]) == 2
    assert "--filter-mode" in capsys.readouterr().err


# -- the property: all mode agrees with best mode -------------------------------------------------

import orjson  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from hami_py.cache.usage import UsageCache  # noqa: E402
from hami_py.config import DeviceConfig  # noqa: E402
from hami_py.devices.registry import build_vendors  # noqa: E402
from hami_py.scheduling.decision.filter import Filterer  # noqa: E402
from hami_py.scheduling.verbs.prioritize import AllNodes  # noqa: E402
from hami_py.scheduling.decision.requests import parse_pod_requests  # noqa: E402

VENDORS = build_vendors(DeviceConfig.default())


@settings(max_examples=150, deadline=None)
@given(gpus=st.lists(st.integers(1, 3), min_size=1, max_size=6),
       fillers=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 24)), max_size=10),
       mem=st.integers(1, 24), policy=st.sampled_from(["binpack", "spread"]))
def test_all_mode_answers_every_node_best_mode_would_fit_alone_and_ranks_its_choice_first(gpus, fillers, mem, policy):
    """For random clusters and usage: /filter in all mode answers exactly the nodes where the pod
    fits on its own, /prioritize gives each of them 1..10 and the others 0, best mode's winner
    scores 10, and a better raw score never gets a lower priority."""
    cache = UsageCache(VENDORS)
    names = [f"n{i}" for i in range(len(gpus))]
    for name, count in zip(names, gpus):
        cache.upsert_node(gpu_node(name, devices=registration(name, gpus=count, model=A10)))
    filterer = Filterer(cache, VENDORS, default_node_policy=policy)
    for k, (node, gb) in enumerate(fillers):
        filler = mem_pod(f"f{k}", gb * 1000)
        filler["metadata"]["uid"] = f"f{k}"
        filterer.decide(filler, [names[node % len(names)]], parse_pod_requests(filler, VENDORS, cache.vendor_ids))
    pod = mem_pod("p", mem * 1000)
    pod["metadata"]["uid"] = "p"
    request = parse_pod_requests(pod, VENDORS, cache.vendor_ids)
    all_nodes = AllNodes(cache=cache, vendors=VENDORS, filterer=filterer, binder=None, client=None)

    alone = [n for n in names if filterer.decide(pod, [n], request, reserve=False).node == n]
    fitting, failed = all_nodes.filter(pod, names, request)
    assert (fitting or []) == alone
    assert set(failed) == set(names) - set(alone)
    assert "p" not in cache.pods                                  # nothing reserved

    priorities, error = all_nodes.prioritize({"Pod": pod, "NodeNames": names}, synced=True)
    assert error is None
    assert orjson.loads(priorities.to_json()) == priorities.as_list()
    scores = priorities.as_list()
    got = {h["Host"]: h["Score"] for h in scores}
    assert [h["Host"] for h in scores] == names
    assert all((1 <= got[n] <= MAX_EXTENDER_PRIORITY) if n in alone else got[n] == 0 for n in names)
    winner = filterer.decide(pod, names, request, reserve=False).node
    assert (winner is None) == (not alone)
    if winner is not None:
        assert got[winner] == MAX_EXTENDER_PRIORITY
        fit = filterer.evaluate(pod, names, request)
        raw = {n: fit.query.out_score[c] for c, n in enumerate(names)}
        sign = -1 if policy == "spread" else 1
        for a in alone:
            for b in alone:
                if sign * raw[a] > sign * raw[b]:
                    assert got[a] >= got[b], (a, b, raw, got)


# -- every family ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler_options", [embedded_options(filter_mode="all", enable_ascend=True,
                                                                enable_iluvatar=True)])
async def test_every_familys_pod_is_fitted_again_and_bound_where_kube_scheduler_chose(api, app, extender):
    """Nothing in all mode is a family's: for one model of every family, a pod asking what the
    model's demo pod asks is answered both of its family's nodes (and none of the others'), is
    bound on the second one, the one kube-scheduler chose here, and carries exactly the decision
    best mode's own fit on that node alone makes (the families' choosers and chargers included;
    times aside)."""
    from hami_py.fakeapi.families import MODELS
    from tests.conftest import device_pod
    models = {}
    for model in MODELS:
        if model.demo_limits and model.vendor_key not in {m.vendor_key for m in models.values()}:
            models[model.key] = model
    nodes = [m.node(f"{key}-{i}") for key, m in models.items() for i in (0, 1)]
    names = await register_nodes(api, app, *nodes)
    for key, model in models.items():
        pod = api.create("pods", device_pod(f"{key}-pod", dict(model.demo_limits[0][1])))
        result = await extender.filter(pod, names)
        assert result["Error"] == "" and result["NodeNames"] == [f"{key}-0", f"{key}-1"], (key, result)
        request = parse_pod_requests(pod, app.vendors, app.cache.vendor_ids)
        expected = app.service.filterer.decide(pod, [f"{key}-1"], request, reserve=False).annotations
        assert await extender.bind(pod, f"{key}-1") == {"Error": ""}, key
        stored = api.get("pods", f"{key}-pod", namespace="default")
        assert stored["spec"]["nodeName"] == f"{key}-1"
        got = stored["metadata"]["annotations"]
        timeless = [k for k in expected if not k.lower().endswith(("-time", "_time"))]   # stamps of the moment
        assert {k: got.get(k) for k in timeless} == {k: expected[k] for k in timeless}, key
    await wait_books_balance(api, app)


# -- hostile input -------------------------------------------------------------------------------

def test_all_mode_filter_and_prioritize_answer_any_request_and_never_reserve():
    """Hypothesis's mutated ExtenderArgs and random bodies (tests/test_fuzz.py's strategies) at
    /filter and /prioritize in all mode: /filter answers a result naming only nodes it was given,
    /prioritize HTTP 200 with a list of given nodes scored 0..10 (or []), the server keeps
    serving, and nothing is ever reserved."""
    import orjson
    from hypothesis import given as hgiven
    from tests.reliability_helpers import LoopCluster
    from tests.test_fuzz import FILTER_FIELDS, FUZZ, NODES, _json_bytes, base_pod, extender_args, json_value

    async def post(cluster, verb: str, body: bytes):
        async with cluster.extender.session.post(f"{cluster.app.url}/{verb}", data=body,
                                                 headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.read()

    with LoopCluster(options=embedded_options(filter_mode="all")) as cluster:
        for name in NODES:
            cluster.api.create("nodes", gpu_node(name, gpus=2))
        cluster.api.create("pods", base_pod())
        cluster.run(wait_until(lambda: all(n in cluster.app.cache.nodes for n in NODES), "nodes"))

        @FUZZ
        @hgiven(body=st.one_of(extender_args().map(_json_bytes), json_value.map(_json_bytes),
                               st.binary(max_size=200)),
                verb=st.sampled_from(["filter", "prioritize"]))
        def check(body, verb):
            status, raw = cluster.run(post(cluster, verb, body))
            assert status == 200, raw[:300]
            answer = orjson.loads(raw)
            try:
                args = orjson.loads(body)
            except orjson.JSONDecodeError:
                args = None
            given_names = next((v for k, v in args.items() if k.lower() == "nodenames"), None) \
                if isinstance(args, dict) else None
            if verb == "filter":
                assert set(answer) == FILTER_FIELDS and isinstance(answer["Error"], str), answer
                if answer["NodeNames"]:
                    assert all(n in given_names for n in answer["NodeNames"]), (answer, args)
            else:
                assert isinstance(answer, list), answer
                for entry in answer:
                    assert set(entry) == {"Host", "Score"} and entry["Host"] in given_names, (entry, args)
                    assert isinstance(entry["Score"], int) and 0 <= entry["Score"] <= MAX_EXTENDER_PRIORITY
            assert not [p for p in cluster.app.cache.pods.values() if p.state in (PodState.RESERVED, PodState.HELD)], "reserved"

        check()

        async def health():
            async with cluster.extender.session.get(f"{cluster.app.url}/healthz") as r:
                return r.status
        assert cluster.run(health()) == 200


@pytest.mark.parametrize("names", [[], ["n1"], ["a", "b.c", "d-e_f", ""], ['q"uote', "back\\slash", "ü"],
                                   [f"gpu-node-{i:05}" for i in range(300)]])
def test_the_priority_list_is_written_as_json_would_write_it(names):
    from hami_py.scheduling.verbs.prioritize import HostPriorities
    import orjson
    values = [i % (MAX_EXTENDER_PRIORITY + 1) for i in range(len(names))]
    priorities = HostPriorities(names, values)
    assert priorities.to_json() == orjson.dumps(priorities.as_list())
    assert orjson.loads(priorities.to_json()) == [{"Host": n, "Score": v} for n, v in zip(names, values)]


# -- with --device-preemption ----------------------------------------------------------------------

@pytest.mark.parametrize("scheduler_options", [embedded_options(filter_mode="all", device_preemption=True)])
async def test_all_mode_preempts_holds_the_room_then_answers_the_held_node(api, app, extender):
    """A high-priority pod that fits nowhere in all mode preempts as in best mode; while its
    victim leaves, a low-priority pod cannot take the room; then its filter answers the held node
    alone (the reservation is there: the bind uses it, no second fit) and it is bound there."""
    from tests.test_preemption import prio_pod, running, wait_gone
    names = await one_gpu_nodes(api, app, "n1", "n2")
    batch = [await running(api, app, extender, prio_pod(f"batch{i}", 20000, 10), [n]) for i, n in enumerate(names)]
    urgent = api.create("pods", prio_pod("urgent", 16000, 1000))
    result = await extender.filter(urgent, names)
    assert result["NodeNames"] in (None, []), result
    [(node, reason)] = [(n, r) for n, r in result["FailedNodes"].items() if r.startswith("preempting")]
    assert reason == f"preempting 1 pods on node {node}"
    victim = next(p for p in batch if p["spec"]["nodeName"] == node)
    await wait_gone(app, victim)
    sneaky = api.create("pods", prio_pod("sneaky", 16000, 0))
    assert (await extender.filter(sneaky, names))["NodeNames"] in (None, [])     # the room is held
    placed = await extender.filter(urgent, names)
    assert placed["NodeNames"] == [node], placed
    assert await extender.bind(urgent, node) == {"Error": ""}
    assert api.get("pods", "urgent", namespace="default")["spec"]["nodeName"] == node
    await wait_books_balance(api, app)
    assert not app.service.preemptor.holds

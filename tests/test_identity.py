"""Who and what a /filter or /bind is about (HAMi v2.11, issue 32): the live pod a request names.

A request is checked against the pod the API server has (the pod watch's, read on a miss) before
anything is reserved, bound or released: a filter of a pod that does not exist would keep a
reservation nothing releases, and a bind naming one pod with another's UID would act on (and on
failure release) the other pod's devices, which could then be handed out twice. The pod watch
releases a pod's devices on its delete or termination whatever its annotations say, and warns on
a bound pod whose allocation cannot be decoded. Driven over HTTP against the in-repo API server.
"""
from __future__ import annotations

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import build_vendors
from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from hami_py.k8s.events import ALLOCATION_DECODE_FAILED
from hami_py.k8s.nodelock import LOCK_ANNOTATION
from tests.conftest import pod_events_applied, register_nodes, wait_until
from tests.reliability_helpers import finish_allocation, wait_books_balance
from tests.test_faults import hold_watches
from tests.test_metrics import labels, scrape, series

ONE_GPU = {"type": "NVIDIA A10", "devmem": 24000, "devcore": 100}
POD_PATH = "/api/v1/namespaces/default/pods/"


async def one_gpu_nodes(api, app, *names: str) -> list[str]:
    return await register_nodes(api, app, *(gpu_node(n, devices=registration(n, gpus=1, model=ONE_GPU))
                                            for n in names))


async def created(api, app, name: str, gpumem: int = 10000) -> dict:
    """A pod the API server has and the scheduler's pod watch has shown."""
    pod = api.create("pods", gpu_pod(name, gpumem=gpumem))
    await pod_events_applied(app, pod)
    return pod


def used_mem(app, node: str) -> int:
    return sum(d["usedmem"] for d in app.cache.device_usage(node))


def reads_of(api, name: str, since: int) -> int:
    return sum(1 for m, p, _ in list(api.requests)[since:] if m == "GET" and p == POD_PATH + name)


def uid_of(pod: dict) -> str:
    return pod["metadata"]["uid"]


def forged(pod: dict, **meta) -> dict:
    """kube-scheduler's copy of ``pod`` with its metadata changed (a stale or hand-made body)."""
    return {**pod, "metadata": {**pod["metadata"], **meta}}


async def bind_args(extender, name: str, uid: str | None, node: str) -> dict:
    args = {"PodName": name, "PodNamespace": "default", "Node": node}
    if uid is not None:
        args["PodUID"] = uid
    _, result = await extender.post("bind", args)
    return result


async def identity_failures(app, phase: str) -> float:
    failures = series(await scrape(app), "hami_scheduler_allocation_failures_total")
    return sum(v for k, v in failures.items() if dict(k)["phase"] == phase and dict(k)["failure_reason"] == "identity")


def node_locked(api, node: str) -> bool:
    return LOCK_ANNOTATION in (api.get("nodes", node)["metadata"].get("annotations") or {})


# -------------------------------------------------------------------------------------- /filter

async def test_a_filter_of_a_pod_the_api_server_does_not_have_reserves_nothing(api, app, extender):
    """A hand-made pod, and a deleted one the watch's bounded memory of deletes has let go: the
    watch shows neither, so the filter decides without a read (kube-scheduler waits for its
    answer) and the read after the answer finds the pod missing: the reservation is released
    before any bind of it can run (the bind waits for that read under the pod's lock)."""
    names = await one_gpu_nodes(api, app, "n1")
    ghost = forged(gpu_pod("ghost", gpumem=10000), uid="made-up-uid", resourceVersion="1")
    assert (await extender.filter(ghost, names))["NodeNames"] == names
    assert await extender.bind(ghost, "n1") == {"Error": 'pod "ghost" not found'}
    assert "made-up-uid" not in app.cache.pods and used_mem(app, "n1") == 0
    gone = await created(api, app, "gone")
    api.delete("pods", "gone", namespace="default")
    await wait_until(lambda: uid_of(gone) in app.cache.deleted, "the delete seen")
    assert (await extender.filter(gone, names))["Error"] == f"pod default/gone with uid {uid_of(gone)} was deleted"
    app.cache.deleted.clear()            # as after DELETED_UIDS_KEPT later deletes
    assert (await extender.filter(gone, names))["NodeNames"] == names
    await wait_until(lambda: not app.cache.pods and used_mem(app, "n1") == 0, "the reservation released")
    await wait_books_balance(api, app)


async def test_a_filter_without_uid_or_with_another_uid_or_of_an_assigned_pod_is_refused(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1", "n2")
    pod = await created(api, app, "p")
    assert (await extender.filter(forged(pod, uid=""), names))["Error"] == \
        "filter request for pod default/p carries no UID"
    assert (await extender.filter(forged(pod, uid="stale-uid"), names))["Error"] == \
        f"pod default/p has UID {uid_of(pod)}, filter request carries UID stale-uid"
    # Assigned by someone else (another scheduler): kube-scheduler's copy does not show it yet.
    other = api.create("pods", {**gpu_pod("other", gpumem=1000), "spec": {
        **gpu_pod("other")["spec"], "nodeName": "n2"}})
    await pod_events_applied(app, other)
    stale_copy = {**other, "spec": {k: v for k, v in other["spec"].items() if k != "nodeName"}}
    assert (await extender.filter(stale_copy, names))["Error"] == "pod default/other is already assigned to node n2"
    assert not app.cache.pods and used_mem(app, "n1") == used_mem(app, "n2") == 0
    assert await identity_failures(app, "filter") == 3
    # The pod itself, as it is, is filtered as ever.
    assert (await extender.filter(pod, names))["NodeNames"]


async def test_a_filter_naming_one_pod_with_anothers_uid_releases_nothing_of_the_other(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    a = await created(api, app, "a")
    await created(api, app, "b")
    assert (await extender.filter(a, ["n1"]))["NodeNames"] == ["n1"]
    held = app.cache.pods[uid_of(a)]
    # A filter of b carrying a's UID: before, it released a's reservation to decide anew.
    result = await extender.filter(forged(gpu_pod("b", gpumem=20000), uid=uid_of(a)), ["n1"])
    assert result["Error"].startswith("pod default/b has UID ") and result["Error"].endswith(
        f"filter request carries UID {uid_of(a)}")
    assert app.cache.pods[uid_of(a)] is held and used_mem(app, "n1") == 10000
    assert await extender.bind(a, "n1") == {"Error": ""}


async def test_the_common_filter_reads_no_pod_and_a_miss_of_the_watch_reads_it_once(api, app, extender):
    names = await one_gpu_nodes(api, app, "n1")
    pod = await created(api, app, "p")
    mark = len(api.requests)
    assert (await extender.filter(pod, names))["NodeNames"] == names
    assert reads_of(api, "p", mark) == 0
    late = await created(api, app, "late")
    app.cache.live_pods.forget(uid_of(late))     # kube-scheduler's watch ahead of ours
    mark = len(api.requests)
    assert (await extender.filter(late, names))["NodeNames"] == names
    # Read once, after the answer; the pod is the live one, so its reservation stays and binds.
    await wait_until(lambda: reads_of(api, "late", mark) == 1, "the read after the answer")
    assert await extender.bind(late, "n1") == {"Error": ""}
    assert reads_of(api, "late", mark) == 2      # the bind (which may await) reads on its own miss
    await wait_books_balance(api, app)


# ---------------------------------------------------------------------------------------- /bind

async def test_a_bind_without_uid_is_refused_and_keeps_the_reservation(api, app, extender):
    await one_gpu_nodes(api, app, "n1")
    pod = await created(api, app, "p")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert await bind_args(extender, "p", None, "n1") == {"Error": "bind request for pod default/p carries no UID"}
    assert used_mem(app, "n1") == 10000 and not node_locked(api, "n1")
    assert api.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    assert await identity_failures(app, "bind") == 1
    assert await extender.bind(pod, "n1") == {"Error": ""}


async def test_a_bind_naming_one_pod_with_anothers_uid_leaves_the_others_reservation(api, app, extender):
    """Before: the bind found a's reservation under a's UID, posted a Binding for b (refused by
    its UID precondition) and released a's devices on the failure, or read b, saw the other UID
    and released a's devices; a's next bind then met devices another pod could have been given."""
    await one_gpu_nodes(api, app, "n1", "n2")
    a = await created(api, app, "a")
    b = await created(api, app, "b")
    assert (await extender.filter(a, ["n1"]))["NodeNames"] == ["n1"]
    assert (await extender.filter(b, ["n2"]))["NodeNames"] == ["n2"]
    assert await bind_args(extender, "b", uid_of(a), "n1") == {
        "Error": f"pod default/b has UID {uid_of(b)}, bind request carries UID {uid_of(a)}"}
    # A pod of that name that does not exist: nothing is released under a's UID either.
    assert await bind_args(extender, "ghost", uid_of(a), "n1") == {"Error": 'pod "ghost" not found'}
    assert used_mem(app, "n1") == 10000 and used_mem(app, "n2") == 10000
    assert not node_locked(api, "n1") and uid_of(a) not in app.cache.released
    assert await identity_failures(app, "bind") == 1
    rollbacks = series(await scrape(app), "hami_scheduler_bind_rollbacks_total")
    assert not any(rollbacks.values())
    for pod, node in ((a, "n1"), (b, "n2")):
        assert await extender.bind(pod, node) == {"Error": ""}
        finish_allocation(api, pod["metadata"]["name"], node)
    await wait_books_balance(api, app)


async def test_a_bind_to_another_node_than_the_filter_chose_is_refused(api, app, extender):
    await one_gpu_nodes(api, app, "n1", "n2")
    pod = await created(api, app, "p")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert await extender.bind(pod, "n2") == {
        "Error": "pod default/p was scheduled to node n1, bind request names node n2"}
    assert used_mem(app, "n1") == 10000 and used_mem(app, "n2") == 0
    assert not node_locked(api, "n2") and api.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    assert await identity_failures(app, "bind") == 1
    assert await extender.bind(pod, "n1") == {"Error": ""}
    # Bound: a bind to another node is about a pod assigned elsewhere.
    assert await extender.bind(pod, "n2") == {"Error": "pod default/p is already assigned to node n1"}
    assert await identity_failures(app, "bind") == 2


# ------------------------------------------------------------------------------------ the pod watch

async def test_a_terminated_pod_whose_annotations_are_gone_releases_its_devices(api, app, extender):
    """HAMi #2959: the termination is seen before anything is read from the annotations."""
    await one_gpu_nodes(api, app, "n1")
    pod = await created(api, app, "p")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert await extender.bind(pod, "n1") == {"Error": ""}
    finish_allocation(api, "p", "n1")
    await wait_until(lambda: uid_of(pod) in app.cache.pods and app.cache.pods[uid_of(pod)].state.value == "allocated",
                     "the pod allocated")
    stored = api.get("pods", "p", namespace="default")
    ended = api.update("pods", {**stored, "metadata": {**stored["metadata"], "annotations": {}},
                                "status": {"phase": "Succeeded"}})
    await pod_events_applied(app, ended)
    assert uid_of(pod) not in app.cache.pods and used_mem(app, "n1") == 0
    await wait_books_balance(api, app)


def test_a_deleted_event_releases_by_uid_whatever_its_object_carries():
    """HAMi #2968: the delete needs no hami.io/vgpu-node on the object it carries."""
    vendors = build_vendors(DeviceConfig.default())
    cache = UsageCache(vendors)
    cache.upsert_node(gpu_node("n1", devices=registration("n1", gpus=1, model=ONE_GPU)))
    uuid = registration("n1", gpus=1, model=ONE_GPU)[0]["id"]
    text = f"{uuid},NVIDIA,10000,0:;"
    pod = gpu_pod("p", gpumem=10000, annotations={"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": text,
                                                  "hami.io/vgpu-devices-to-allocate": text})
    pod["metadata"].update(uid="u1", resourceVersion="5")
    pod["spec"]["nodeName"] = "n1"
    cache.on_pod_event("ADDED", pod)
    assert cache.pods["u1"].entries[0].mem == 10000 and "u1" in cache.live_pods
    bare = {"metadata": {"uid": "u1", "name": "p", "namespace": "default", "resourceVersion": "6"}}
    cache.on_pod_event("DELETED", bare)
    assert "u1" not in cache.pods and "u1" in cache.deleted and "u1" not in cache.live_pods
    assert cache.device_usage("n1")[0]["usedmem"] == 0


async def test_a_pod_deleted_while_the_watch_was_down_is_released_and_remembered(api, app, extender):
    """client-go hands such a delete over as a tombstone; here the relist is the tombstone: a pod
    the watch had shown alive that a later list lacks is deleted, its reservation released and its
    UID remembered, so kube-scheduler's stale copy of it is refused without a read."""
    await one_gpu_nodes(api, app, "n1")
    pod = await created(api, app, "p")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    await hold_watches(api)
    api.delete("pods", "p", namespace="default")
    api.compact()                    # the informers' resourceVersions are gone: 410, relist
    api.faults.clear()
    await wait_until(lambda: uid_of(pod) in app.cache.deleted, "the relist to drop the pod")
    assert uid_of(pod) not in app.cache.pods and used_mem(app, "n1") == 0
    mark = len(api.requests)
    assert (await extender.filter(pod, ["n1"]))["Error"] == f"pod default/p with uid {uid_of(pod)} was deleted"
    assert reads_of(api, "p", mark) == 0
    await wait_books_balance(api, app)


async def test_a_terminating_pod_first_seen_bound_is_charged(api, app):
    """HAMi #2812: a terminating pod (deletionTimestamp set) the books have not seen yet, as after
    a restart, still runs on its devices until it is gone: it is charged, not dropped."""
    await one_gpu_nodes(api, app, "n1")
    uuid = app.cache.device_usage("n1")[0]["id"]
    text = f"{uuid},NVIDIA,10000,0:;"
    pod = gpu_pod("p", gpumem=10000, annotations={
        "hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": text, "hami.io/vgpu-devices-to-allocate": text,
        "hami.io/bind-phase": "success"})
    pod["spec"]["nodeName"] = "n1"
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    stored = api.create("pods", pod)
    await pod_events_applied(app, stored)
    assert used_mem(app, "n1") == 10000
    api.delete("pods", "p", namespace="default")
    await wait_until(lambda: used_mem(app, "n1") == 0, "the delete to release it")


async def test_a_bound_pod_whose_allocation_cannot_be_decoded_gets_one_warning(api, app):
    """HAMi #2959: the device plugin reads the same text, so the pod's owner is told why: once per
    garbled text, and only for a bound pod (an unbound one runs nowhere)."""
    await one_gpu_nodes(api, app, "n1")
    told = []
    report = app.cache.ledger.on_undecodable
    app.cache.ledger.on_undecodable = lambda pod, error: (told.append(pod["metadata"]["name"]), report(pod, error))
    garbled = {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,lots,0:;"}
    unbound = api.create("pods", gpu_pod("unbound", annotations=garbled))
    bound = api.create("pods", {**gpu_pod("bound", annotations=garbled),
                                "spec": {**gpu_pod("bound")["spec"], "nodeName": "n1"}})
    await pod_events_applied(app, bound)
    again = api.patch("pods", "bound", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                      namespace="default")
    await pod_events_applied(app, again)
    assert told == ["bound"] and unbound
    message = ("device allocation annotations cannot be decoded: hami.io/vgpu-devices-allocated: invalid memory "
               'field: container 0 device "GPU-x,NVIDIA,lots,0": "lots" is not a 32-bit integer')

    def warnings() -> list[tuple[str, str, str]]:
        return [(e["type"], e["reason"], e["message"]) for e in api.list("events", namespace="default")
                if e["involvedObject"]["name"] == "bound"]
    await wait_until(lambda: warnings(), "the warning Event")
    assert warnings() == [("Warning", ALLOCATION_DECODE_FAILED, message)]
    assert not app.cache.pods and used_mem(app, "n1") == 0


# -------------------------------------------------------------------------------------- metrics

async def test_a_refusal_about_a_missing_pod_is_counted_as_a_lookup_failure(api, app, extender):
    """The outcome counters keep HAMi's fixed reason set: a refusal about a missing pod is a
    lookup failure (one about another pod's UID, an identity failure: the tests above)."""
    await one_gpu_nodes(api, app, "n1")
    ghost = forged(gpu_pod("ghost", gpumem=1000), uid="u-ghost")
    assert (await extender.filter(ghost, ["n1"]))["NodeNames"] == ["n1"]     # confirmed after the answer
    await wait_until(lambda: "u-ghost" not in app.cache.pods, "the reservation released")
    failures = series(await scrape(app), "hami_scheduler_allocation_failures_total")
    assert failures == {labels(phase="filter", device_type="NVIDIA", failure_reason="lookup"): 1.0}

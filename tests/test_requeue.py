"""The requeue nudge (hami_py/k8s/requeue.py): a release of devices soon after a refusal writes
``hami.io/requeue-time`` on the node, so kube-scheduler retries the pods it parked on our word;
otherwise nothing is written. (The race itself, with the real kube-scheduler:
tests/test_real_k8s_kube_scheduler.py::test_a_pod_refused_on_books_a_delete_behind_is_retried_once_the_books_catch_up.)"""
from __future__ import annotations

import os
import tempfile

from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.fakeapi.server import write_kubeconfig
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.requeue import REQUEUE_ANNOTATION, RequeueNudger
from tests.conftest import bind_placed, place, register_nodes, wait_until

def nudges(app) -> float:
    return app.metrics.registry.get_sample_value("hami_requeue_nudges_total") or 0


def stamp(api, node: str = "n1") -> str | None:
    return (api.get("nodes", node)["metadata"].get("annotations") or {}).get(REQUEUE_ANNOTATION)


async def fill(api, app, extender) -> dict:
    """n1's one GPU taken by a bound pod ``a`` (all its cores); the stored pod."""
    names = await register_nodes(api, app, gpu_node("n1", gpus=1))
    pod, result = await place(api, extender, gpu_pod("a", gpumem=1000, gpucores=100), names)
    return await bind_placed(api, app, extender, pod, result)


async def test_a_release_right_after_a_refusal_writes_the_requeue_annotation(api, app, extender):
    await fill(api, app, extender)
    refused = api.create("pods", gpu_pod("c", gpumem=1000, gpucores=100))
    assert not (await extender.filter(refused, ["n1"]))["NodeNames"]
    api.delete("pods", "a", namespace="default")
    await wait_until(lambda: stamp(api) is not None, "the requeue annotation on n1")
    assert nudges(app) == 1
    assert stamp(api).endswith("Z")


async def test_a_release_with_no_refusal_before_it_writes_nothing(api, app, extender):
    a = await fill(api, app, extender)
    api.delete("pods", "a", namespace="default")
    await wait_until(lambda: a["metadata"]["uid"] not in app.cache.pods, "the delete in the books")
    assert stamp(api) is None and nudges(app) == 0


async def test_one_write_per_refusal_and_at_most_one_a_second_for_the_cluster(api):
    """One write wakes every pod kube-scheduler parked, so releases write again only after a new
    refusal, no sooner than the interval (a release inside it is written when it ends), never
    for a refusal older than the window, and never from a follower."""
    api.create("nodes", gpu_node("n1", gpus=1))
    api.create("nodes", gpu_node("n2", gpus=1))
    with tempfile.TemporaryDirectory() as tmp:
        config = await load_configuration(write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url))
    client = KubeClient(config, qps=0, burst=100)
    now = [100.0]
    leading = [True]
    nudger = RequeueNudger(client, window_s=5, min_interval_s=1, clock=lambda: now[0], enabled=lambda: leading[0])

    def writes() -> list:
        return [r for r in api.requests if r[0] == "PATCH" and "/nodes/" in r[1]]
    try:
        nudger.freed("n1")                       # no refusal yet
        nudger.refused()
        for node in ("n1", "n2", "n1"):
            nudger.freed(node)                   # one write for all three
        await wait_until(lambda: stamp(api, "n1") is not None, "the first nudge")
        nudger.freed("n2")                       # no refusal since that write
        now[0] += 0.5
        nudger.refused()
        nudger.freed("n2")                       # inside the interval: written when it ends
        nudger.freed("n1")                       # ...and only once
        await wait_until(lambda: stamp(api, "n2") is not None, "the second nudge, at the interval's end")
        now[0] += 0.6
        nudger.refused()
        now[0] += 5.1
        nudger.freed("n1")                       # that refusal is older than the window
        leading[0] = False
        nudger.refused()
        now[0] += 2
        nudger.freed("n1")                       # a follower never writes
        await nudger.close()
        assert [r[1].rsplit("/", 1)[1] for r in writes()] == ["n1", "n2"]
    finally:
        await client.close()


async def test_a_gang_planned_wakes_the_parked_at_most_once_an_interval(api):
    """``wake`` (a gang just planned, scheduling/gangs/): a write at once, with no refusal needed,
    shared with ``freed``'s interval; never from a follower."""
    api.create("nodes", gpu_node("n1", gpus=1))
    api.create("nodes", gpu_node("n2", gpus=1))
    with tempfile.TemporaryDirectory() as tmp:
        config = await load_configuration(write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url))
    client = KubeClient(config, qps=0, burst=100)
    now = [100.0]
    leading = [True]
    nudger = RequeueNudger(client, window_s=5, min_interval_s=1, clock=lambda: now[0], enabled=lambda: leading[0])

    def writes() -> list:
        return [r[1].rsplit("/", 1)[1] for r in api.requests if r[0] == "PATCH" and "/nodes/" in r[1]]
    try:
        nudger.wake("n1")                        # no refusal before it: written all the same
        nudger.wake("n2")                        # inside the interval: written when it ends
        nudger.wake("n1")                        # ...and only once
        await wait_until(lambda: stamp(api, "n2") is not None, "the second wake, at the interval's end")
        leading[0] = False
        now[0] += 2
        nudger.wake("n1")                        # a follower never writes
        await nudger.close()
        assert writes() == ["n1", "n2"]
    finally:
        await client.close()

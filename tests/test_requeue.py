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


async def test_nudges_are_bounded_per_node(api):
    """Within the interval a node gets one write, however many releases; none when not leading."""
    api.create("nodes", gpu_node("n1", gpus=1))
    with tempfile.TemporaryDirectory() as tmp:
        config = await load_configuration(write_kubeconfig(os.path.join(tmp, "kubeconfig"), api.url))
    client = KubeClient(config, qps=0, burst=100)
    now = [100.0]
    leading = [True]
    nudger = RequeueNudger(client, window_s=5, min_interval_s=1, clock=lambda: now[0], enabled=lambda: leading[0])
    try:
        nudger.freed("n1")                       # no refusal yet
        nudger.refused()
        for _ in range(3):
            nudger.freed("n1")
        await wait_until(lambda: stamp(api) is not None, "the first nudge")
        first = stamp(api)
        now[0] += 0.5
        nudger.freed("n1")                       # within the interval
        now[0] += 5.1
        nudger.freed("n1")                       # the refusal is too old now
        leading[0] = False
        nudger.refused()
        now[0] += 2
        nudger.freed("n1")                       # a follower never writes
        await nudger.close()
        writes = [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/nodes/n1")]
        assert len(writes) == 1 and stamp(api) == first
    finally:
        await client.close()

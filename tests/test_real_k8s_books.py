"""One set of books against the real kube-apiserver (issue 23, deliverable 3).

tests/test_upstream_rows.py asks these questions of an in-process model; here every step is the
real thing. hami-scheduler runs as its ServiceAccount against the session's etcd + kube-apiserver
(tests/realk8s.py); the test plays kube-scheduler (/filter, /bind over HTTP), the real API server
copies each Binding's annotations and labels onto its pod, the device plugin stand-in
(hami_py/fakeapi/deviceplugin.py) patches bind-phase ``success`` and releases the node lock, and a
restart is a new scheduler app rebuilding its books from the API server's objects.

One probe pod (created, never bound) is filtered again after each step. A re-filter of the same
pod first releases its own previous reservation, so each answer reflects the first pods' charge
alone; the first pods are reserved (or bound) before the probe's first filter, so the probe's
reservation never stands in their way. Its answer must be upstream's, and the same, in all four
states: the first pods reserved, bound, allocated, and after a restart. After every state the
books must balance with an independent recount from the API server's pod annotations
(``wait_books_balance``).
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from hami_py.cache.pod_states import PodState
from hami_py.embedded import embedded_options, wait_for
from hami_py.fakeapi.deviceplugin import SimulatedDevicePlugin
from hami_py.fakeapi.families import BY_KEY
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.nodelock import NodeLocker
from tests.realk8s import dns_name, real_scheduler, unique, wait_books_balance
from tests.test_family_ascend import npu_node

pytestmark = pytest.mark.real_k8s

# Every family of the cases on (Ascend is gated behind upstream's switch).
OPTIONS = embedded_options(scheduler_name="hami-scheduler", enable_ascend=True, node_lock_wait_s=5.0)
STATES = ("reserved", "bound", "allocated", "after a restart")


@dataclass(frozen=True)
class Case:
    id: str
    family: str                     # the family as assertion messages name it
    node: object                    # name -> Node object as the family's plugin registers it
    first: tuple[dict, ...]         # the first pods' limits
    probe: dict                     # the probe's limits
    refused: str | None = None      # upstream's reason for the node; None: the probe fits


def _model(key: str, devices: int):
    return lambda name: BY_KEY[key].node(name, devices=devices)


AMD = {"amd.com/gpu": "1", "amd.com/gpumem": "1000", "amd.com/gpucores": "50"}
MTHREADS = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "16", "mthreads.com/sgpu-core": "8"}
METAX = {"metax-tech.com/gpu": "1"}
ASCEND = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "16384"}
VXPU = {"kunlunxin.com/vxpu": "1", "kunlunxin.com/vxpu-memory": "24576"}

CASES = [
    Case("amd-mi300x", "AMD MI300X", _model("mi300x", 1), (AMD,), AMD),
    Case("mthreads", "Moore Threads", _model("mthreads", 1), (MTHREADS,), MTHREADS),
    Case("metax-gpu-room-left", "Metax GPU (3 cards)", _model("metax-gpu", 3), (METAX, METAX), METAX),
    Case("metax-gpu-all-taken", "Metax GPU (2 cards)", _model("metax-gpu", 2), (METAX, METAX), METAX,
         refused="2/2 CardTimeSlicingExhausted"),
    Case("ascend-910b3", "Ascend 910B3", lambda name: npu_node(name, {"Ascend910B3": 1}), (ASCEND, ASCEND),
         {**ASCEND, "huawei.com/Ascend910B3-memory": "32768"}),
    Case("kunlun-vxpu", "Kunlun vXPU", _model("kunlun-vxpu", 1), (VXPU,),
         {**VXPU, "kunlunxin.com/vxpu-memory": "49152"}, refused="1/1 NumaNotFit"),
]


def _pod(name: str, namespace: str, limits: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": dict(limits)}}]}}


def _answer(result: dict) -> tuple:
    """A /filter answer as (node names, failed nodes, error), empty parts normalised."""
    return (result.get("NodeNames") or None, result.get("FailedNodes") or {}, result.get("Error") or "")


async def _seen(app, pods: list[dict], what: str, *, allocated: bool = False) -> None:
    """Wait until the scheduler's pod watch has applied these pod objects (their resourceVersion)
    to its books: bound (the reservation confirmed), and with ``allocated`` the plugin's answer."""
    def caught_up() -> bool:
        for pod in pods:
            rec = app.cache.pods.get(pod["metadata"]["uid"])
            if rec is None or rec.resource_version is None \
                    or rec.resource_version < int(pod["metadata"]["resourceVersion"]):
                return False
            if rec.state not in ((PodState.ALLOCATED,) if allocated else (PodState.BOUND, PodState.ALLOCATED)):
                return False
        return True
    await wait_for(caught_up, timeout=20, interval=0.02, what=what)


async def _registered(app, node: str, family: str, state: str) -> None:
    await wait_for(lambda: node in app.cache.node_index_of, timeout=20,
                   what=f"{family}, {state}: node {node} in the scheduler's cache")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_a_probe_gets_upstreams_answer_reserved_bound_allocated_and_after_a_restart(
        case, control_plane, real_kube, real_namespace, request):
    ns, family = real_namespace, case.family
    node = unique(dns_name(case.id, 30))
    node_object = case.node(node)
    node_object["metadata"]["labels"]["hami-test"] = dns_name(request.node.name, 60)
    for key in ("capacity", "allocatable"):
        node_object["status"][key]["pods"] = "110"          # as a kubelet reports it
    await real_kube.create("nodes", node_object)
    expected = ([node], {}, "") if case.refused is None else (None, {node: case.refused}, "")
    answers: dict[str, tuple] = {}
    admin = KubeClient(await load_configuration(str(control_plane.admin_kubeconfig)), qps=0, burst=1000)
    try:
        first = [await real_kube.create("pods", _pod(f"first-{i}", ns, limits))
                 for i, limits in enumerate(case.first)]
        probe = await real_kube.create("pods", _pod("probe", ns, case.probe))

        async def balanced(app, when: str) -> None:
            try:
                await wait_books_balance(real_kube, app)
            except AssertionError as exc:
                raise AssertionError(f"{family}, {when}: {exc}") from None

        async def ask(extender: ExtenderClient, app, state: str) -> None:
            # The books before the probe (its reservation of the previous state still held, if
            # it fitted), its answer (that reservation released first), and the books after it.
            await balanced(app, f"{state}, before the probe")
            answers[state] = _answer(await extender.filter(probe, [node]))
            assert answers[state] == expected, (
                f"{family}, {state}: the probe {case.probe} got {answers[state]}, upstream answers {expected} "
                f"(answers so far: {answers})")
            await balanced(app, f"{state}, after the probe")

        async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None,
                                  options=OPTIONS) as app:
            extender = ExtenderClient(app.url)
            try:
                await _registered(app, node, family, "reserved")
                # (1) The first pods' /filter: reserved, nothing written.
                for pod in first:
                    result = _answer(await extender.filter(pod, [node]))
                    assert result == ([node], {}, ""), (
                        f"{family}, reserved: first pod {pod['metadata']['name']} {case.first} got {result}")
                await ask(extender, app, "reserved")

                # (2) Their /bind: the real API server copies the Binding's annotations and labels
                # onto each pod. A node holds one allocation in flight at a time, so between two
                # binds the previous pod's node lock is released as its device plugin would
                # (the pod's bind-phase stays ``allocating``: its plugin has not answered).
                locker = NodeLocker(admin)
                for i, pod in enumerate(first):
                    name = pod["metadata"]["name"]
                    if i:
                        previous = first[i - 1]["metadata"]["name"]
                        assert await locker.release(node, ns, previous), f"{family}, bound: lock of {previous}"
                        await wait_for(lambda: not (app.cache.lock_hint(node) or ("held",))[0], timeout=20,
                                       what=f"{family}, bound: the lock release seen through the node watch")
                    assert await extender.bind(pod, node) == {"Error": ""}, f"{family}, bound: bind of {name}"
                bound = [await real_kube.get("pods", p["metadata"]["name"], namespace=ns) for p in first]
                for pod in bound:
                    meta = pod["metadata"]
                    assert pod["spec"].get("nodeName") == node, f"{family}, bound: {meta['name']} not bound"
                    assert meta["annotations"].get("hami.io/bind-phase") == "allocating", (
                        f"{family}, bound: {meta['name']} {meta['annotations']}")
                    assert meta["annotations"].get("hami.io/vgpu-node") == node, (
                        f"{family}, bound: the Binding's annotations not on {meta['name']}: {meta['annotations']}")
                await _seen(app, bound, f"{family}, bound: the bound pods through the scheduler's pod watch")
                await ask(extender, app, "bound")

                # (3) The device plugin's answer: bind-phase success on each pod, the lock released.
                plugin = SimulatedDevicePlugin(admin)
                plugin.start()
                try:
                    await wait_for(lambda: plugin.allocated == len(first), timeout=20,
                                   what=f"{family}, allocated: the stand-in's allocations")
                finally:
                    await plugin.stop()
                allocated = [await real_kube.get("pods", p["metadata"]["name"], namespace=ns) for p in first]
                for pod in allocated:
                    assert pod["metadata"]["annotations"].get("hami.io/bind-phase") == "success", (
                        f"{family}, allocated: {pod['metadata']['name']} {pod['metadata']['annotations']}")
                await _seen(app, allocated, f"{family}, allocated: the plugin's answers through the pod watch",
                            allocated=True)
                await wait_for(lambda: not (app.cache.lock_hint(node) or ("held",))[0], timeout=20,
                               what=f"{family}, allocated: the node lock released")
                await ask(extender, app, "allocated")
            finally:
                await extender.close()

        # (4) A restart: a new scheduler, its books rebuilt from the API server's objects alone.
        async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=None,
                                  options=OPTIONS) as app:
            extender = ExtenderClient(app.url)
            try:
                await _registered(app, node, family, "after a restart")
                await _seen(app, allocated, f"{family}, after a restart: the first pods in the rebuilt books",
                            allocated=True)
                await ask(extender, app, "after a restart")
            finally:
                await extender.close()
        assert list(answers) == list(STATES)
    finally:
        await admin.close()
        for pod in await real_kube.list("pods", namespace=ns):
            await real_kube.delete("pods", pod["metadata"]["name"], namespace=ns)
        await real_kube.delete("nodes", node, grace=None)

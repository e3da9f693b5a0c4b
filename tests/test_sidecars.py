"""Native sidecars (KEP-753): an init container with ``restartPolicy: Always`` runs beside the app
containers for the pod's whole life, and its devices are counted as Kubernetes counts its requests.

A pod's effective request is the larger of (each ordinary init container plus the sidecars started
before it) and (all app containers plus all sidecars). The fit, the books in every state (reserved,
bound, allocated, after a restart), the release once the ordinary init containers have finished,
and the namespace quota all follow that rule.
"""
from __future__ import annotations

import pytest

from hami_py.fakeapi.objects import gpu_node
from hami_py.podshape import PodShape, pod_shape
from tests.books_model import World, books_pod

GPU_MEM = 16000      # one GPU of 16 000 MiB
NODE = gpu_node("n1", gpus=1, model={"type": "NVIDIA A16", "devmem": GPU_MEM, "devcore": 100})


def _c(name: str, mem: int, *, sidecar: bool = False) -> dict:
    container = {"name": name, "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


def _probe(mem: int) -> dict:
    return books_pod(f"probe-{mem}", [_c("main", mem)])


def _used(world: World) -> int:
    return world.cache.device_usage("n1")[0]["usedmem"]


def _states(world: World, uid: str):
    """The pod through the four states whose books must agree: reserved, bound, allocated, after
    a restart (yields the state's name)."""
    assert world.filter(uid) == "n1"
    yield "reserved"
    world.bind(uid)
    yield "bound"
    world.allocated(uid)
    yield "allocated"
    world.restart()
    yield "after a restart"


def test_the_issues_example_a_sidecar_and_an_app_container_book_their_sum_in_every_state():
    world = World([NODE])
    pod = world.create(books_pod("p", [_c("main", 6000)], init=[_c("proxy", 6000, sidecar=True)]))
    for state in _states(world, pod["metadata"]["uid"]):
        assert _used(world) == 12000, state
        assert world.probe(_probe(4001))[0] is None, state
        assert world.probe(_probe(4000))[0] == "n1", state


def test_an_init_container_runs_beside_the_sidecars_started_before_it():
    world = World([NODE])
    # 6 000 (sidecar) + 8 000 (init) = 14 000 while the init container runs; 7 000 afterwards.
    pod = world.create(books_pod("p", [_c("main", 1000)],
                                 init=[_c("proxy", 6000, sidecar=True), _c("setup", 8000)]))
    uid = pod["metadata"]["uid"]
    for state in _states(world, uid):
        assert _used(world) == 14000, state
        assert world.probe(_probe(2001))[0] is None and world.probe(_probe(2000))[0] == "n1", state
    world.init_finished(uid)
    assert _used(world) == 7000       # the init container's share goes, the sidecar's stays
    assert world.probe(_probe(9000))[0] == "n1" and world.probe(_probe(9001))[0] is None
    world.restart()
    assert _used(world) == 7000


def test_a_sidecar_started_after_an_init_container_does_not_run_beside_it():
    world = World([NODE])
    pod = world.create(books_pod("p", [_c("main", 1000)],
                                 init=[_c("setup", 8000), _c("proxy", 6000, sidecar=True)]))
    assert world.filter(pod["metadata"]["uid"]) == "n1"
    assert _used(world) == 8000       # max(8 000, 6 000 + 1 000)


def test_an_init_container_that_cannot_run_beside_its_sidecars_does_not_fit():
    world = World([NODE])
    pod = world.create(books_pod("p", [_c("main", 1000)],
                                 init=[_c("proxy", 6000, sidecar=True), _c("setup", 12000)]))
    assert world.filter(pod["metadata"]["uid"]) is None    # 6 000 + 12 000 > 16 000
    assert _used(world) == 0
    # The same containers without the sidecar's restartPolicy: it ends before "setup" starts.
    plain = world.create(books_pod("q", [_c("main", 1000)], init=[_c("proxy", 6000), _c("setup", 12000)]))
    assert world.filter(plain["metadata"]["uid"]) == "n1"
    assert _used(world) == 12000


def test_the_namespace_quota_counts_sidecars_as_kubernetes_does():
    world = World([NODE])
    world.cache.quota.upsert({"metadata": {"name": "gpu", "namespace": "default"},
                              "spec": {"hard": {"limits.nvidia.com/gpumem": "13000"}}})
    fits = world.create(books_pod("ok", [_c("main", 6000)], init=[_c("proxy", 6000, sidecar=True)]))
    assert world.filter(fits["metadata"]["uid"]) == "n1"                   # 12 000 of 13 000
    world.delete(fits["metadata"]["uid"])
    over = world.create(books_pod("over", [_c("main", 1000)],
                                  init=[_c("proxy", 6000, sidecar=True), _c("setup", 8000)]))
    node, failed = world.probe(over)
    assert node is None and "ResourceQuotaNotFit" in failed["n1"]         # 14 000 > 13 000


@pytest.mark.parametrize("spec, shape", [
    ({}, PodShape(0, frozenset(), False)),
    ({"initContainers": [{"name": "a"}, {"name": "b", "restartPolicy": "Always"}]},
     PodShape(2, frozenset({1}), False)),
    ({"initContainers": [{"name": "b", "restartPolicy": "Always"}]}, PodShape(1, frozenset({0}), False)),
])
def test_the_pod_shape_names_the_sidecars(spec, shape):
    assert pod_shape({"spec": spec}) == shape


def test_init_done_waits_for_the_ordinary_init_containers_only():
    spec = {"initContainers": [{"name": "a"}, {"name": "s", "restartPolicy": "Always"}]}
    running = {"name": "s", "state": {"running": {}}}
    done = {"name": "a", "state": {"terminated": {"exitCode": 0}}}
    failed = {"name": "a", "state": {"terminated": {"exitCode": 1}}}
    assert pod_shape({"spec": spec, "status": {"initContainerStatuses": [done, running]}}).init_done
    assert not pod_shape({"spec": spec, "status": {"initContainerStatuses": [failed, running]}}).init_done
    assert not pod_shape({"spec": spec, "status": {"initContainerStatuses": [running]}}).init_done


def test_the_webhooks_quota_precheck_counts_sidecars_as_kubernetes_does():
    from hami_py.scheduling.admission.rules import quota_fits
    from tests.books_model import VENDORS

    asked: list[tuple[str, int, int]] = []

    def fit_quota(namespace, vendor, memory, cores):
        asked.append((vendor, memory, cores))
        return True

    def total(pod):
        asked.clear()
        assert quota_fits(pod, namespace="default", vendors=VENDORS, fit_quota=fit_quota)
        return [(v, m) for v, m, _ in asked]

    assert total(books_pod("a", [_c("main", 6000)], init=[_c("proxy", 6000, sidecar=True)])) == [("NVIDIA", 12000)]
    assert total(books_pod("b", [_c("main", 1000)], init=[_c("proxy", 6000, sidecar=True), _c("setup", 8000)])) \
        == [("NVIDIA", 14000)]
    assert total(books_pod("c", [_c("main", 1000)], init=[_c("setup", 8000), _c("proxy", 6000, sidecar=True)])) \
        == [("NVIDIA", 8000)]
    assert total(books_pod("d", [_c("main", 1000)], init=[_c("setup", 8000), _c("more", 6000)])) == [("NVIDIA", 8000)]

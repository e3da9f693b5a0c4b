"""The real kube-scheduler with overlays/kube-scheduler-in-the-loop: --filter-mode=all + /prioritize.

kube-scheduler runs with the overlay's KubeSchedulerConfiguration (the base's with
``prioritizeVerb``), changed only as tests/realk8s.py ``sidecar_config`` changes the base's for a
loopback machine; hami-py with the overlay's Deployment arguments (``--filter-mode=all``). The
Lease is the base's: this module runs after tests/test_real_k8s_kube_scheduler.py, whose sidecar
was killed holding it, so the sidecar here waits for it to expire.

What a user relies on: kube-scheduler's own preferences now count for device pods (a preferred
node affinity wins over our binpack, which upstream's single-node /filter would have overruled),
our policy still decides where kube-scheduler has no preference, a pod that fits nowhere is
Pending with our reason, and pods racing for the last room never oversubscribe it.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from hami_py.cli import build_parser, options_from_args
from hami_py.embedded import wait_for
from hami_py.scheduling.decision.requests import parse_pod_requests
from tests.realk8s import KubeSchedulerProcess, free_port, sidecar_args, sidecar_config, wait_books_balance, wait_for_value
from tests.test_manifests_in_the_loop import hami_args, scheduler_config
from tests.test_real_k8s_kube_scheduler import (  # noqa: F401 - priority_classes, tls_files are fixtures
    DEVICE_CONFIG, T4, a_budget_blocks_the_eviction, annotations, bound, equal_priority_preempts_nothing,
    evicts_exactly_the_pods_that_make_room_and_keeps_it, priority_classes, registered, requests_of, scheduled_pod,
    tls_files, wait_for_log,
)

pytestmark = [pytest.mark.real_k8s, pytest.mark.real_kube_scheduler]


@pytest.fixture(scope="module")
def loop_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def loop_sidecar(control_plane, kube_scheduler_binary, loop_port, tmp_path_factory):
    kubeconfig = control_plane.sa_kubeconfig
    config = sidecar_config(extender_url=f"https://127.0.0.1:{loop_port}", kubeconfig=kubeconfig,
                            config=copy.deepcopy(scheduler_config()))
    assert (config["extenders"][0]["prioritizeVerb"], config["extenders"][0]["preemptVerb"]) == ("prioritize", "preempt")
    scheduler = KubeSchedulerProcess(kube_scheduler_binary, tmp_path_factory.mktemp("kube-scheduler-loop"),
                                     config, sidecar_args(kubeconfig=kubeconfig))
    scheduler.start()
    try:
        # An earlier module's sidecar may have been killed holding the Lease: it expires in 15 s.
        wait_for_log(scheduler, '"Successfully acquired lease" lock="hami-system/hami-scheduler"', timeout=60)
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture
async def loop_hami(loop_sidecar, control_plane, tls_files, loop_port):
    from hami_py.config import parse_device_config
    from tests.realk8s import real_scheduler
    cert_file, key_file = tls_files
    options = options_from_args(build_parser().parse_args(hami_args()))
    assert options.filter_mode == "all" and options.device_preemption
    options = replace(options, http_bind="127.0.0.1:0", extender_bind=f"127.0.0.1:{loop_port}",
                      metrics_bind_address="127.0.0.1:0", cert_file=cert_file, key_file=key_file,
                      device_config_file="", kube_qps=0, kube_burst=1000, gc_freeze=False)
    device_config = parse_device_config(DEVICE_CONFIG["data"]["device-config.yaml"])
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=control_plane.admin_kubeconfig,
                              options=options, device_config=device_config) as app:
        await wait_for(lambda: app.leadership.is_leader, timeout=30, what="hami-py to follow its sidecar's Lease")
        yield app


def on_node(pod: dict, node: str) -> dict:
    pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    return pod


async def used_and_empty(app, real_kube, ns, real_nodes) -> tuple[str, str]:
    """Two one-GPU nodes; the first with a 4 GB pod on it (binpack's favourite), the second empty
    and labelled ``preferred=yes``."""
    (used,) = await real_nodes(1, gpus=1, model=T4)
    (empty,) = await real_nodes(1, gpus=1, model=T4, labels={"preferred": "yes"})
    await registered(app, [used, empty])
    await real_kube.create("pods", on_node(scheduled_pod("filler", ns, real_nodes.label, gpumem=4000), used))
    assert (await bound(real_kube, ns, "filler"))["spec"]["nodeName"] == used
    await wait_books_balance(real_kube, app)
    return used, empty


def best_mode_choice(app, pod: dict, nodes: list[str]) -> str | None:
    """The node --filter-mode=best's /filter would answer alone (nothing reserved)."""
    request = parse_pod_requests(pod, app.vendors, app.cache.vendor_ids)
    return app.service.filterer.decide(pod, nodes, request, reserve=False).node


async def test_all_mode_a_preferred_node_affinity_wins_over_binpack(loop_hami, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, loop_hami
    used, empty = await used_and_empty(app, real_kube, ns, real_nodes)
    pod = scheduled_pod("prefers", ns, real_nodes.label, gpumem=2000)
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [{"key": "preferred", "operator": "In",
                                                             "values": ["yes"]}]}}]}}
    # The control: best mode answers binpack's node alone, and kube-scheduler could only take it.
    assert best_mode_choice(app, {**pod, "metadata": {**pod["metadata"], "uid": "control"}}, [used, empty]) == used
    prioritized = requests_of(app, "prioritize")
    await real_kube.create("pods", pod)
    stored = await bound(real_kube, ns, "prefers")
    assert stored["spec"]["nodeName"] == empty
    assert annotations(stored)["hami.io/vgpu-node"] == empty       # our bind fitted it there and bound it
    await wait_for(lambda: requests_of(app, "prioritize") > prioritized, timeout=10, what="a prioritize counted")
    await wait_books_balance(real_kube, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage(empty)) == 2000


async def test_all_mode_binpack_decides_where_kube_scheduler_has_no_preference(
        loop_hami, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, loop_hami
    used, empty = await used_and_empty(app, real_kube, ns, real_nodes)
    await real_kube.create("pods", scheduled_pod("packs", ns, real_nodes.label, gpumem=2000))
    assert (await bound(real_kube, ns, "packs"))["spec"]["nodeName"] == used
    await wait_books_balance(real_kube, app)


async def test_all_mode_a_pod_that_fits_nowhere_is_pending_with_our_reason(
        loop_hami, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, loop_hami
    nodes = await real_nodes(2, gpus=1, model=T4)
    await registered(app, nodes)
    waiting = await real_kube.create("pods", scheduled_pod("huge", ns, real_nodes.label, gpumem=12000))
    events = await wait_for_value(lambda: real_kube.events_for(waiting),
                                  lambda ev: any(r == "FailedScheduling" for _, _, r, _ in ev),
                                  what="kube-scheduler's FailedScheduling")
    message = next(m for _, _, r, m in events if r == "FailedScheduling")
    assert message.startswith("0/2 nodes are available: 2 1/1 CardInsufficientMemory."), message
    assert (await real_kube.get("pods", "huge", namespace=ns))["spec"].get("nodeName") is None


async def test_all_mode_pods_racing_for_the_last_room_never_oversubscribe_it(
        loop_hami, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, loop_hami
    (node,) = await real_nodes(1, gpus=1, model=T4)
    await registered(app, [node])
    for name in ("a", "b"):
        await real_kube.create("pods", scheduled_pod(name, ns, real_nodes.label, gpumem=6000))

    async def outcome():
        pods = {n: await real_kube.get("pods", n, namespace=ns) for n in ("a", "b")}
        placed = [n for n, p in pods.items() if p["spec"].get("nodeName")]
        if len(placed) != 1:
            return None
        loser = "b" if placed == ["a"] else "a"
        events = await real_kube.events_for(pods[loser])
        return (placed[0], loser) if any(r == "FailedScheduling" for _, _, r, _ in events) else None

    winner, loser = await wait_for_value(outcome, lambda v: v is not None, timeout=60,
                                         what="one pod bound, the other refused")
    assert (await real_kube.get("pods", winner, namespace=ns))["spec"]["nodeName"] == node
    await wait_books_balance(real_kube, app)
    assert sum(d["usedmem"] for d in app.cache.device_usage(node)) == 6000
    assert (await real_kube.get("pods", loser, namespace=ns))["spec"].get("nodeName") is None



# -- device preemption, with the overlay's all + prioritize + preempt ----------------------------

async def test_all_mode_a_high_priority_gpu_pod_evicts_exactly_the_pods_that_make_room_and_keeps_it(
        loop_hami, control_plane, real_kube, real_namespace, real_nodes, priority_classes):
    await evicts_exactly_the_pods_that_make_room_and_keeps_it(loop_hami, control_plane, real_kube, real_namespace,
                                                              real_nodes, priority_classes)


async def test_all_mode_a_pod_of_equal_priority_preempts_nothing(
        loop_hami, real_kube, real_namespace, real_nodes, priority_classes):
    await equal_priority_preempts_nothing(loop_hami, real_kube, real_namespace, real_nodes, priority_classes)


async def test_all_mode_a_budget_that_allows_no_disruption_blocks_the_eviction(
        loop_hami, real_kube, real_namespace, real_nodes, priority_classes):
    await a_budget_blocks_the_eviction(loop_hami, real_kube, real_namespace, real_nodes, priority_classes)

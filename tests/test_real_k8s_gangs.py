"""Gangs under the real kube-scheduler (v1.35) with hami-py as its extender, both as deployed.

scheduler-plugins' PodGroup CRD is installed (tests/fixtures/podgroup-crd.yaml, a minimal one),
kube-scheduler runs as manifests/deployment.yaml runs the sidecar (as in
tests/test_real_k8s_kube_scheduler.py; its Lease is the same, so the sidecar here may wait for a
killed one's to expire), and nothing else: no coscheduling plugin, no outside event. What a user
relies on: an incomplete gang holds no device and is placed within seconds once its last member
comes; of two gangs that fit only one at a time, one runs whole and the other holds nothing, and
runs whole once the first is gone.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from hami_py.embedded import wait_for
from hami_py.scheduling.gangs.membership import PODGROUP, PODGROUP_LABEL, GangKey
from tests.realk8s import (
    KubeSchedulerProcess, free_port, poll_until, sidecar_args, sidecar_config, wait_books_balance, wait_for_value,
)
from tests.test_real_k8s_kube_scheduler import (  # noqa: F401 - tls_files is a fixture
    DEPLOYED_OPTIONS, DEVICE_CONFIG, T4, bound, registered, scheduled_pod, tls_files, wait_for_log,
)

pytestmark = [pytest.mark.real_k8s, pytest.mark.real_kube_scheduler]

CRD = yaml.safe_load((Path(__file__).parent / "fixtures" / "podgroup-crd.yaml").read_text())
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1"


@pytest.fixture(scope="module")
def podgroup_crd(control_plane):
    status, answer = control_plane.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    assert status in (201, 409), answer
    poll_until(lambda: control_plane.call("GET", f"{PODGROUPS}/podgroups", raw=True)[0] == 200, timeout=30,
               what="the PodGroup CRD served")


@pytest.fixture(scope="module")
def gang_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gang_sidecar(control_plane, kube_scheduler_binary, gang_port, tmp_path_factory):
    kubeconfig = control_plane.sa_kubeconfig
    scheduler = KubeSchedulerProcess(kube_scheduler_binary, tmp_path_factory.mktemp("kube-scheduler-gangs"),
                                     sidecar_config(extender_url=f"https://127.0.0.1:{gang_port}", kubeconfig=kubeconfig),
                                     sidecar_args(kubeconfig=kubeconfig))
    scheduler.start()
    try:
        # An earlier module's sidecar may have been killed holding the Lease: it expires in 15 s.
        wait_for_log(scheduler, '"Successfully acquired lease" lock="hami-system/hami-scheduler"', timeout=60)
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture
async def hami(podgroup_crd, gang_sidecar, control_plane, tls_files, gang_port):
    from hami_py.config import parse_device_config
    from tests.realk8s import real_scheduler
    cert_file, key_file = tls_files
    options = replace(DEPLOYED_OPTIONS, http_bind="127.0.0.1:0", extender_bind=f"127.0.0.1:{gang_port}",
                      metrics_bind_address="127.0.0.1:0", cert_file=cert_file, key_file=key_file,
                      device_config_file="", kube_qps=0, kube_burst=1000, gc_freeze=False)
    device_config = parse_device_config(DEVICE_CONFIG["data"]["device-config.yaml"])
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=control_plane.admin_kubeconfig,
                              options=options, device_config=device_config) as app:
        await wait_for(lambda: app.leadership.is_leader, timeout=30, what="hami-py to follow its sidecar's Lease")
        assert app.service.gangs.book.podgroups_on
        yield app


async def create_group(control_plane, app, ns: str, name: str, min_member: int) -> None:
    control_plane.must("POST", f"{PODGROUPS}/namespaces/{ns}/podgroups", {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns}, "spec": {"minMember": min_member}})
    await wait_for(lambda: GangKey(PODGROUP, ns, name) in app.service.gangs.book.specs, timeout=20,
                   what=f"PodGroup {name} in hami-py's books")


def whole_gpu_member(name: str, ns: str, label: str, group: str) -> dict:
    pod = scheduled_pod(name, ns, label, gpus=1, gpumem_percentage=100)
    pod["metadata"]["labels"] = {PODGROUP_LABEL: group}
    return pod


async def failed_scheduling_with(kube, ns: str, name: str, text: str) -> str:
    pod = await kube.get("pods", name, namespace=ns)
    events = await wait_for_value(lambda: kube.events_for(pod),
                                  lambda ev: any(r == "FailedScheduling" and text in m for _, _, r, m in ev),
                                  timeout=30, what=f"FailedScheduling of {name} saying {text!r}")
    return next(m for _, _, r, m in events if r == "FailedScheduling" and text in m)


def reserved(app, pods: list[dict]) -> list[str]:
    return [p["metadata"]["name"] for p in pods if p["metadata"]["uid"] in app.cache.pods]


async def node_of(kube, ns: str, name: str) -> str | None:
    pod = await kube.get("pods", name, namespace=ns)
    return pod["spec"].get("nodeName") if pod else None


async def test_an_incomplete_gang_holds_nothing_and_is_placed_when_its_last_member_comes(
        hami, control_plane, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, hami
    nodes = await real_nodes(2, gpus=2, model=T4)
    await registered(app, nodes)
    await create_group(control_plane, app, ns, "job", 3)
    early = [await real_kube.create("pods", whole_gpu_member(f"w{i}", ns, real_nodes.label, "job")) for i in (0, 1)]
    for pod in early:
        message = await failed_scheduling_with(real_kube, ns, pod["metadata"]["name"],
                                               f"PodGroup {ns}/job: 2 of 3 members exist")
        assert message.startswith("0/2 nodes are available"), message
    assert not reserved(app, early) and not any(d["usedmem"] for n in nodes for d in app.cache.device_usage(n))
    # The last member comes: its /filter plans all three and wakes the two kube-scheduler parked
    # (kube-scheduler's flush of unschedulable pods is five minutes away).
    await real_kube.create("pods", whole_gpu_member("w2", ns, real_nodes.label, "job"))
    for name in ("w0", "w1", "w2"):
        assert (await bound(real_kube, ns, name, timeout=60))["spec"]["nodeName"] in nodes
    # The wake-up was written (hami.io/requeue-time on a node of the plan); kube-scheduler v1.35
    # also retries refused pods on the new pod's own event, so this run cannot tell which came first.
    assert app.metrics.registry.get_sample_value("hami_requeue_nudges_total") >= 1
    await wait_books_balance(real_kube, app)


async def test_two_gangs_on_six_gpus_one_runs_whole_the_other_holds_nothing_then_runs_whole(
        hami, control_plane, real_kube, real_namespace, real_nodes):
    ns, app = real_namespace, hami
    nodes = await real_nodes(3, gpus=2, model=T4)
    await registered(app, nodes)
    for group in ("a", "b"):
        await create_group(control_plane, app, ns, group, 4)
    pods = {}
    for i in range(4):   # created interleaved: kube-scheduler's queue mixes the two jobs
        for group in ("a", "b"):
            pods[f"{group}{i}"] = await real_kube.create(
                "pods", whole_gpu_member(f"{group}{i}", ns, real_nodes.label, group))

    async def bound_members(group: str) -> int:
        return sum([await node_of(real_kube, ns, f"{group}{i}") is not None for i in range(4)])

    async def counts() -> tuple[int, int]:
        return await bound_members("a"), await bound_members("b")

    done = await wait_for_value(counts, lambda c: 4 in c, timeout=60, what="one gang bound whole")
    winner, loser = ("a", "b") if done[0] == 4 else ("b", "a")
    assert done == ((4, 0) if winner == "a" else (0, 4)), done
    losers = [pods[f"{loser}{i}"] for i in range(4)]
    await failed_scheduling_with(real_kube, ns, f"{loser}0", f"PodGroup {ns}/{loser}: 2 of 4 members fit")
    assert not reserved(app, losers), "the waiting gang holds devices"
    assert await bound_members(loser) == 0
    await wait_books_balance(real_kube, app)

    for i in range(4):
        await real_kube.delete("pods", f"{winner}{i}", namespace=ns)
    for pod in losers:
        assert (await bound(real_kube, ns, pod["metadata"]["name"], timeout=60))["spec"]["nodeName"] in nodes
    await wait_books_balance(real_kube, app)

"""``preemptVerb: preempt`` with the real kube-scheduler (v1.35): kube-scheduler's own preemption,
for CPU, made to free the GPU too.

The sidecar runs manifests/scheduler-config.yaml's configuration plus ``preemptVerb: preempt``
(what the kube-scheduler-in-the-loop overlay turns on); hami-py runs as deployed (its own
--device-preemption off, so every eviction here is kube-scheduler's). One T4 node whose CPU is
taken by a low-priority CPU pod and whose GPU by a low-priority GPU pod: a high-priority pod that
needs both fails kube-scheduler's own CPU filter, so kube-scheduler preempts. Its dry run frees
CPU with the CPU pod alone (the GPU pod is reprieved: its resources are ignored by the scheduler);
the extender's answer adds the GPU pod, and kube-scheduler deletes both. No kubelet: the test
confirms the terminating pods gone.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from hami_py.embedded import wait_for
from hami_py.fakeapi.objects import gpu_pod
from tests.realk8s import KubeSchedulerProcess, poll_until, sidecar_args, sidecar_config, wait_for_value
from tests.test_real_k8s_kube_scheduler import (  # noqa: F401  (fixtures, found by name)
    DEVICE_CONFIG, T4, bound, extender_port, priority_classes, real_options, registered, requests_of, tls_files,
)

pytestmark = [pytest.mark.real_k8s, pytest.mark.real_kube_scheduler]


@pytest.fixture(scope="module")
def preempting_sidecar(control_plane, kube_scheduler_binary, extender_port, tmp_path_factory):
    kubeconfig = control_plane.sa_kubeconfig
    config = sidecar_config(extender_url=f"https://127.0.0.1:{extender_port}", kubeconfig=kubeconfig)
    config["extenders"][0]["preemptVerb"] = "preempt"
    scheduler = KubeSchedulerProcess(kube_scheduler_binary, tmp_path_factory.mktemp("kube-scheduler"), config,
                                     sidecar_args(kubeconfig=kubeconfig))
    scheduler.start()
    try:
        poll_until(lambda: '"Successfully acquired lease"' in scheduler.log_text(), timeout=60,
                   what="the sidecar's lease", process=scheduler.process)
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture
async def hami(preempting_sidecar, control_plane, real_options):
    from hami_py.config import parse_device_config
    from tests.realk8s import real_scheduler
    async with real_scheduler(kubeconfig=control_plane.sa_kubeconfig, plugin_kubeconfig=control_plane.admin_kubeconfig,
                              options=replace(real_options, device_preemption=False),
                              device_config=parse_device_config(DEVICE_CONFIG["data"]["device-config.yaml"])) as app:
        yield app


def pod_for(name: str, ns: str, label: str, priority_class: str, *, cpu: str, gpumem: int | None = None) -> dict:
    if gpumem is None:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
               "spec": {"schedulerName": "hami-scheduler",
                        "containers": [{"name": "main", "image": "pause", "resources": {}}]}}
    else:
        pod = gpu_pod(name, namespace=ns, gpumem=gpumem)
    pod["spec"]["nodeSelector"] = {"hami-test": label}
    pod["spec"]["priorityClassName"] = priority_class
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return pod


async def test_kube_schedulers_cpu_victims_get_the_gpu_pod_added(hami, real_kube, real_namespace, real_nodes,
                                                                   priority_classes):
    ns, app, low, high = real_namespace, hami, priority_classes["low"], priority_classes["high"]
    (node,) = await real_nodes(1, gpus=1, model=T4)         # 64 CPUs, one 10000 MiB T4
    await registered(app, [node])
    label = real_nodes.label
    await real_kube.create("pods", pod_for("cpu-hog", ns, label, low, cpu="63"))
    await real_kube.create("pods", pod_for("gpu-batch", ns, label, low, cpu="100m", gpumem=9000))
    for name in ("cpu-hog", "gpu-batch"):
        assert (await bound(real_kube, ns, name))["spec"]["nodeName"] == node
    preempts = requests_of(app, "preempt")
    await real_kube.create("pods", pod_for("urgent", ns, label, high, cpu="2", gpumem=5000))

    for name in ("cpu-hog", "gpu-batch"):
        await wait_for_value(lambda n=name: real_kube.get("pods", n, namespace=ns),
                             lambda p: p is None or p["metadata"].get("deletionTimestamp"),
                             what=f"{name} preempted by kube-scheduler", timeout=60)
    assert requests_of(app, "preempt") > preempts, "kube-scheduler never asked /preempt"
    for name in ("cpu-hog", "gpu-batch"):                  # the kubelet confirms
        await real_kube.delete("pods", name, namespace=ns, grace=0)
    assert (await bound(real_kube, ns, "urgent", timeout=60))["spec"]["nodeName"] == node


async def test_a_gpu_held_by_a_higher_priority_pod_is_no_candidate(hami, real_kube, real_namespace, real_nodes,
                                                                    priority_classes):
    """The GPU pod outranks the preemptor: kube-scheduler's CPU victim alone would free no GPU, and
    no lower pod can be added, so the node is left out of the answer and nothing is evicted."""
    ns, app, low, high = real_namespace, hami, priority_classes["low"], priority_classes["high"]
    (node,) = await real_nodes(1, gpus=1, model=T4)
    await registered(app, [node])
    label = real_nodes.label
    await real_kube.create("pods", pod_for("cpu-hog", ns, label, low, cpu="63"))
    await real_kube.create("pods", pod_for("gpu-top", ns, label, high, cpu="100m", gpumem=9000))
    for name in ("cpu-hog", "gpu-top"):
        assert (await bound(real_kube, ns, name))["spec"]["nodeName"] == node
    preempts = requests_of(app, "preempt")
    urgent = await real_kube.create("pods", pod_for("urgent", ns, label, high, cpu="2", gpumem=5000))
    await wait_for(lambda: requests_of(app, "preempt") > preempts, timeout=30, what="kube-scheduler's /preempt")
    # kube-scheduler reports the cycle once its preemption has given up (after our answer).
    await wait_for_value(lambda: real_kube.events_for(urgent),
                         lambda ev: any(r == "FailedScheduling" and "no candidate node for preemption" in m
                                        for _, _, r, m in ev),
                         what="the failed preemption reported (no candidate node)", timeout=30)
    for name in ("cpu-hog", "gpu-top"):
        stored = await real_kube.get("pods", name, namespace=ns)
        assert stored is not None and not stored["metadata"].get("deletionTimestamp"), name

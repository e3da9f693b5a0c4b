"""Leadership end to end: two scheduler replicas against one API server, following the Lease
their kube-scheduler sidecars hold.

Only the leader writes registration upkeep (handshakes, role labels) and answers /filter; a
follower's /filter waits and is served once the Lease names it.
"""
from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import aiohttp
import pytest

from hami_py.app import SchedulerApp
from hami_py.cli import main as cli_main
from hami_py.config import DeviceConfig
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from hami_py.k8s.leader import holds_lease
from hami_py.k8s.registration import COMPONENT_LABEL, ROLE_LABEL, is_requesting
from tests.conftest import HANDSHAKE, handshake_of, keeper_passes

NAMESPACE = "hami-system"
LEASE = "hami-scheduler"


def _lease(holder: str, *, duration: int = 3600) -> dict:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NAMESPACE},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 0}}


def _scheduler_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {COMPONENT_LABEL: "hami-scheduler"}},
            "spec": {"containers": [{"name": "extender", "image": "hami"}]}, "status": {"phase": "Running"}}


def _options(host: str):
    return embedded_options(leader_elect=True, leader_elect_resource_name=LEASE,
                            leader_elect_resource_namespace=NAMESPACE, hostname=host,
                            pod_name=f"hami-{host}", pod_namespace=NAMESPACE, registration_interval_s=0.05)


def _role(api, pod: str) -> str | None:
    return api.get("pods", pod, namespace=NAMESPACE)["metadata"]["labels"].get(ROLE_LABEL)


def _answer(api, text: str) -> None:
    api.patch("nodes", "n1", {"metadata": {"annotations": {HANDSHAKE: f"Reported {text}"}}})


def _parked(app) -> int:
    """How many /filter requests wait in the replica for it to lead (the waiters of the event
    SchedulerService.filter awaits; asyncio keeps them in ``Event._waiters``)."""
    return len(app.service.synced._waiters)


async def _status(url: str, path: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url + path) as response:
        return response.status


async def test_only_the_leader_keeps_registration_and_serves_filter_until_fail_over(api):
    api.create("leases", _lease("a_5f0c3a4e-0c6b-4e8e-9a51-0d7f3c9b2a10"))
    api.create("pods", _scheduler_pod("hami-a"))
    api.create("pods", _scheduler_pod("hami-b"))
    api.create("nodes", gpu_node("n1", gpus=2))
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(running_scheduler(api, options=_options("a")))
        b = await stack.enter_async_context(running_scheduler(api, options=_options("b"), device_plugin=False))
        ext_a = ExtenderClient(a.url)
        ext_b = ExtenderClient(b.url)
        stack.push_async_callback(ext_a.close)
        stack.push_async_callback(ext_b.close)
        await wait_for(lambda: a.leadership.is_leader and b.leadership.synced.is_set(), what="the Lease read")
        assert not b.leadership.is_leader

        # The leader stamps the handshake and labels the scheduler pods; the follower writes nothing.
        await wait_for(lambda: is_requesting(handshake_of(api)), what="handshake stamped by the leader")
        await wait_for(lambda: (_role(api, "hami-a"), _role(api, "hami-b")) == ("leader", "follower"),
                       what="role labels")
        await wait_for(lambda: a.keeper.stats.requests == 1, what="the leader's write done")
        _answer(api, "by plugin 1")
        await wait_for(lambda: a.keeper.stats.requests == 2 and is_requesting(handshake_of(api)),
                       what="handshake stamped again")
        await wait_for(lambda: b.keeper.nodes["n1"][0].value == handshake_of(api), what="follower saw it")
        await keeper_passes(b, 2)
        assert b.keeper.stats.requests == 0
        assert b.keeper.stats.role_patches == 0

        # The follower's /filter waits; it is ready all the same (upstream's /readyz is always 200).
        waiting = asyncio.create_task(ext_b.filter(api.create("pods", gpu_pod("p-b", gpumem=1000)), ["n1"]))
        await wait_for(lambda: _parked(b) == 1, what="b to receive its /filter")
        p_a = api.create("pods", gpu_pod("p-a", gpumem=1000))
        served = await ext_a.filter(p_a, ["n1"])
        assert served["NodeNames"] == ["n1"]
        assert await _status(b.url, "/readyz") == 200 and await _status(b.url, "/healthz") == 200
        assert not waiting.done() and _parked(b) == 1

        # Fail-over: the sidecar on b takes the Lease.
        api.update("leases", {**api.get("leases", LEASE, namespace=NAMESPACE),
                              "spec": _lease("b_0b8e1f3c-7d2a-4f6e-8c5b-9a3d2e1f0c4b")["spec"]})
        result = await asyncio.wait_for(waiting, 20)
        assert result["NodeNames"] == ["n1"], result
        assert b.leadership.is_leader and not a.leadership.is_leader
        assert not a.service.synced.is_set()
        # a's decision for p-a was never written (the Binding would carry it), so b cannot see it:
        # a released it with its leadership, and a bind of it is sent back to /filter.
        assert p_a["metadata"]["uid"] not in a.cache.pods
        assert (await ext_a.bind(p_a, "n1")) == {
            "Error": "pod default/p-a has no device reservation on node n1 (filter it again)"}
        assert api.get("pods", "p-a", namespace="default")["spec"].get("nodeName") is None
        await wait_for(lambda: (_role(api, "hami-a"), _role(api, "hami-b")) == ("follower", "leader"),
                       what="role labels after fail-over")
        a_requests = a.keeper.stats.requests
        _answer(api, "by plugin 2")
        await wait_for(lambda: b.keeper.stats.requests == 1 and is_requesting(handshake_of(api)),
                       what="handshake stamped by the new leader")
        await keeper_passes(a, 2)
        assert a.keeper.stats.requests == a_requests

        # The old leader's /filter now waits in turn.
        a_waiting = asyncio.create_task(ext_a.filter(api.create("pods", gpu_pod("p-a2", gpumem=1000)), ["n1"]))
        await wait_for(lambda: _parked(a) == 1, what="a to receive its /filter")
        assert (await ext_b.filter(api.create("pods", gpu_pod("p-b2", gpumem=1000)), ["n1"]))["NodeNames"] == ["n1"]
        assert not a_waiting.done() and _parked(a) == 1

        # A Lease that stops being renewed ends leadership without any event...
        lease = api.get("leases", LEASE, namespace=NAMESPACE)
        lease["spec"]["leaseDurationSeconds"] = 1
        api.update("leases", lease)
        await wait_for(lambda: not b.leadership.is_leader, what="b's lease to run out")
        assert not b.service.synced.is_set()
        # ...and a deleted one too, after a takes over again.
        api.update("leases", {**api.get("leases", LEASE, namespace=NAMESPACE),
                              "spec": _lease("a_5f0c3a4e-0c6b-4e8e-9a51-0d7f3c9b2a10")["spec"]})
        assert (await asyncio.wait_for(a_waiting, 20))["NodeNames"] == ["n1"]
        api.delete("leases", LEASE, namespace=NAMESPACE)
        await wait_for(lambda: not a.leadership.is_leader, what="a to notice the lease is gone")
        assert not a.service.synced.is_set()


def test_holder_must_be_this_host_not_a_longer_name():
    assert holds_lease("sched-1_5f0c3a4e", "sched-1")
    assert holds_lease("sched-1", "sched-1")
    assert not holds_lease("sched-10_5f0c3a4e", "sched-1")    # upstream's bare prefix check says yes
    assert not holds_lease(None, "sched-1")
    assert not holds_lease("sched-1_x", "")


async def test_without_leader_election_the_replica_always_leads(api):
    api.create("leases", _lease("someone-else_1"))
    async with running_scheduler(api, options=embedded_options(hostname="a")) as app:
        assert app.leadership.is_leader
        await wait_for(app.service.synced.is_set, what="/filter to serve")


def test_leader_election_without_a_lease_name_is_refused(capsys):
    with pytest.raises(ValueError, match="--leader-elect-resource-name"):
        SchedulerApp(embedded_options(leader_elect=True, leader_elect_resource_namespace=NAMESPACE),
                     device_config=DeviceConfig.default(), configuration=None)
    assert cli_main(["--leader-elect", "--leader-elect-resource-name", LEASE]) == 2
    assert "--leader-elect-resource-namespace" in capsys.readouterr().err


async def test_the_lease_watch_sees_its_own_lease_only(api):
    """kube-system holds many Leases (each API server renews its identity lease every 10 s): the
    scheduler watches its one Lease by name, so the others never reach it."""
    api.create("leases", _lease("a_5f0c3a4e-0c6b-4e8e-9a51-0d7f3c9b2a10"))
    async with running_scheduler(api, options=_options("a"), device_plugin=False) as app:
        await wait_for(lambda: app.leadership.is_leader, what="leadership")
        stats = app.leadership.informer.stats
        seen = stats.events
        other = api.create("leases", {**_lease("someone-else"), "metadata": {"name": "apiserver-x", "namespace": NAMESPACE}})
        for i in range(5):
            other["spec"]["renewTime"] = f"2026-01-01T00:00:0{i}.000000Z"
            other = api.update("leases", other)
        ours = api.get("leases", LEASE, namespace=NAMESPACE)
        ours["spec"]["renewTime"] = "2026-01-01T00:00:09.000000Z"
        api.update("leases", ours)                      # after the others: seen means they were passed
        await wait_for(lambda: stats.events > seen, what="our Lease's update")
        assert stats.events == seen + 1

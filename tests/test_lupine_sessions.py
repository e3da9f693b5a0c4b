"""Session stubs (HAMi #3013): one relay pod on each remote-GPU server, kept by the leader.

A user reaching the fleet by hand port-forwards to a stub, so one must be waiting on every server
before anybody asks, follow the server's endpoint, and go when the server does. The servers are
those the scheduler's node watch knows (the family's server set over the books, fed the API
server's nodes as the informer feeds them); the reconciler lists and writes the stubs over HTTP
against the in-repo API server through the scheduler's own client, and lists no node.
"""
from __future__ import annotations

import asyncio

import pytest

from hami_py.cache.usage import UsageCache
from hami_py.config import DeviceConfig
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import write_kubeconfig
from hami_py.k8s.client import KubeClient, load_configuration
from hami_py.k8s.lupine_sessions import (
    ENDPOINT_ENV, SESSION_LABEL, keep_session_stubs, reconcile_session_stubs, stub_name,
)

NAMESPACE = "hami-system"
IMAGE = "alpine/socat:1.8"


def _config(**section) -> DeviceConfig:
    config = DeviceConfig.default()
    config.sections["remotegpu"] = {"resourceCountName": "nvidia.com/remote-gpu", **section}
    return config


class Books:
    """The leader's view of the servers: books fed the API server's nodes by a relist, as the
    node informer feeds them, and the family's server set over them."""

    def __init__(self, api, **section):
        self.api = api
        self.vendor = (vendors := build_vendors(_config(**section), FamilySwitches()))["RemoteGPU"]
        self.cache = UsageCache(vendors)

    def servers(self) -> dict[str, str]:
        self.cache.replace_nodes(self.api.list("nodes"))
        return self.vendor.server_nodes(self.cache)


@pytest.fixture
async def client(api, tmp_path):
    kube = KubeClient(await load_configuration(str(write_kubeconfig(tmp_path / "kubeconfig", api.url))), qps=0)
    try:
        yield kube
    finally:
        await kube.close()


def _node(name: str, ip: str | None, port: str | None = "") -> dict:
    labels = {} if port is None else {"hami.io/lupine-server": port}
    addresses = [{"type": "Hostname", "address": name}] + ([{"type": "InternalIP", "address": ip}] if ip else [])
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"addresses": addresses}}


def _stubs(api, namespace: str = NAMESPACE) -> dict[str, dict]:
    """node -> stub pod, for every pod carrying the session label."""
    found = {}
    for pod in api.list("pods", namespace=namespace):
        if SESSION_LABEL in (pod["metadata"].get("labels") or {}):
            found[pod["metadata"]["labels"][SESSION_LABEL]] = pod
    return found


def _endpoint(stub: dict) -> str:
    return next(v["value"] for v in stub["spec"]["containers"][0]["env"] if v["name"] == ENDPOINT_ENV)


@pytest.fixture
def books(api):
    return Books(api)


async def _pass(client, books: Books, *, image: str = IMAGE):
    return await reconcile_session_stubs(client=client, namespace=NAMESPACE, image=image, servers=books.servers())


async def test_each_server_gets_one_stub_on_its_own_node_relaying_its_port(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))                 # empty label: the default port
    api.create("nodes", _node("gpu-b", "10.0.0.6", "24000"))
    api.create("nodes", _node("gpu-c", "10.0.0.7", "99999"))        # out of range: the default port
    api.create("nodes", _node("gpu-v6", "fd00::7", "24001"))
    api.create("nodes", _node("no-ip", None))                       # no InternalIP: nowhere to relay to
    api.create("nodes", _node("client-1", "10.0.1.1", None))        # not a server
    done = await _pass(client, books)
    stubs = _stubs(api)
    assert sorted(stubs) == ["gpu-a", "gpu-b", "gpu-c", "gpu-v6"]
    assert sorted(done.created) == sorted(stub_name(n) for n in stubs) and not done.deleted
    assert {n: _endpoint(s) for n, s in stubs.items()} == {
        "gpu-a": "10.0.0.5:14833", "gpu-b": "10.0.0.6:24000", "gpu-c": "10.0.0.7:14833", "gpu-v6": "[fd00::7]:24001"}
    b = stubs["gpu-b"]
    assert b["metadata"]["name"] == "lupine-session-gpu-b"
    assert b["spec"]["nodeName"] == "gpu-b"
    assert b["spec"]["tolerations"] == [{"operator": "Exists"}]
    relay = b["spec"]["containers"][0]
    assert relay["image"] == IMAGE
    assert relay["ports"][0]["containerPort"] == 24000
    assert relay["command"] == ["socat", "TCP-LISTEN:24000,fork,reuseaddr", f"TCP:$({ENDPOINT_ENV})"]
    assert b["metadata"]["labels"]["hami.io/webhook"] == "ignore"


async def test_a_second_pass_changes_nothing(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    api.create("nodes", _node("gpu-b", "10.0.0.6", "24000"))
    await _pass(client, books)
    uids = {n: s["metadata"]["uid"] for n, s in _stubs(api).items()}
    writes = len([r for r in api.requests if r[0] in ("POST", "DELETE")])
    done = await _pass(client, books)
    assert (done.created, done.deleted, done.failed) == ([], [], [])
    assert {n: s["metadata"]["uid"] for n, s in _stubs(api).items()} == uids
    assert len([r for r in api.requests if r[0] in ("POST", "DELETE")]) == writes


async def test_a_stub_goes_with_its_servers_label_and_follows_a_new_port(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    api.create("nodes", _node("gpu-b", "10.0.0.6"))
    await _pass(client, books)
    kept = _stubs(api)["gpu-b"]["metadata"]["uid"]
    api.patch("nodes", "gpu-a", {"metadata": {"labels": {"hami.io/lupine-server": None}}})
    done = await _pass(client, books)
    assert done.deleted == ["lupine-session-gpu-a"] and not done.created
    assert sorted(_stubs(api)) == ["gpu-b"] and _stubs(api)["gpu-b"]["metadata"]["uid"] == kept
    # A stub pointed at a port the server no longer answers on is replaced, not left.
    api.patch("nodes", "gpu-b", {"metadata": {"labels": {"hami.io/lupine-server": "24000"}}})
    await _pass(client, books)
    stub = _stubs(api)["gpu-b"]
    assert _endpoint(stub) == "10.0.0.6:24000" and stub["metadata"]["uid"] != kept
    api.delete("nodes", "gpu-b")
    await _pass(client, books)
    assert _stubs(api) == {}


async def test_stale_finished_and_foreign_pods(api, client, books):
    """A stub of a server that never came back, an evicted stub and one of an old image are
    replaced or removed; pods without the label, or in another namespace, are not ours."""
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    api.create("nodes", _node("gpu-b", "10.0.0.6"))
    await _pass(client, books, image="alpine/socat:1.7")
    api.create("pods", {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "lupine-session-gone", "namespace": NAMESPACE,
                                     "labels": {SESSION_LABEL: "gone"}},
                        "spec": {"nodeName": "gone", "containers": [{"name": "relay", "image": IMAGE}]}})
    api.patch("pods", "lupine-session-gpu-a", {"status": {"phase": "Failed", "reason": "Evicted"}}, namespace=NAMESPACE)
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lupine-session-gpu-a", "namespace": "default",
                                                             "labels": {SESSION_LABEL: "gpu-a"}},
             "spec": {"containers": [{"name": "x", "image": "y"}]}}
    api.create("pods", other)
    api.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper", "namespace": NAMESPACE},
                        "spec": {"containers": [{"name": "x", "image": "y"}]}})
    done = await _pass(client, books)
    assert sorted(done.deleted) == ["lupine-session-gone", "lupine-session-gpu-a", "lupine-session-gpu-b"]
    # Deleted at once by this API server, so each is created afresh in the same pass.
    assert sorted(done.created) == ["lupine-session-gpu-a", "lupine-session-gpu-b"]
    stubs = _stubs(api)
    assert sorted(stubs) == ["gpu-a", "gpu-b"]
    assert {s["spec"]["containers"][0]["image"] for s in stubs.values()} == {IMAGE}
    assert {s["status"]["phase"] for s in stubs.values()} == {"Pending"}
    assert api.get("pods", "helper", namespace=NAMESPACE)
    assert api.get("pods", "lupine-session-gpu-a", namespace="default")


async def test_no_full_view_leaves_every_stub_alone(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    await _pass(client, books)
    # The stubs cannot be listed: nothing is created or deleted.
    api.faults.add(method="GET", path=rf"^/api/v1/namespaces/{NAMESPACE}/pods$")
    api.create("nodes", _node("gpu-b", "10.0.0.6"))
    done = await _pass(client, books)
    assert done.skipped and (done.created, done.deleted) == ([], [])
    api.faults.clear()
    # The node watch has not listed the nodes yet (its books would say "no server"): the same.
    done = await reconcile_session_stubs(client=client, namespace=NAMESPACE, image=IMAGE, servers=None)
    assert done.skipped and (done.created, done.deleted) == ([], [])
    assert sorted(_stubs(api)) == ["gpu-a"]


async def test_no_node_is_listed_for_the_stubs(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    servers = books.servers()
    before = len(api.requests)
    await reconcile_session_stubs(client=client, namespace=NAMESPACE, image=IMAGE, servers=servers)
    assert sorted(_stubs(api)) == ["gpu-a"]
    assert not [r for r in list(api.requests)[before:] if "/nodes" in r[1]]


def test_endpoints_and_names_hold_for_any_node_name(api):
    long = "gpu-" + "x" * 300 + ".example.com"
    assert len(stub_name(long)) <= 253 and stub_name(long) != stub_name(long[:-1])
    api.create("nodes", _node("plus", "10.0.0.5", "+80"))
    api.create("nodes", _node("eighty", "10.0.0.6", "80"))
    api.create("nodes", _node("junk", "10.0.0.7", "junk"))
    assert Books(api, defaultPort=9000).servers() == {
        "plus": "10.0.0.5:9000", "eighty": "10.0.0.6:80", "junk": "10.0.0.7:9000"}


async def test_a_long_node_name_still_gets_a_valid_stub(api, client, books):
    name = "gpu-" + "a" * 100
    api.create("nodes", _node(name, "10.0.0.5"))
    done = await _pass(client, books)
    assert done.created == [stub_name(name)] and not done.failed
    stub = api.get("pods", stub_name(name), namespace=NAMESPACE)
    assert stub["spec"]["nodeName"] == name and len(stub["metadata"]["labels"][SESSION_LABEL]) <= 63
    assert not (await _pass(client, books)).created


# -- the leader's loop --------------------------------------------------------------------------

async def test_no_image_no_stubs(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    async with asyncio.timeout(5):      # returns at once: nothing to run
        await keep_session_stubs(client=client, namespace=NAMESPACE, image="", leading=lambda: True,
                                 servers=books.servers)
    assert _stubs(api) == {} and not [r for r in api.requests if r[0] == "POST"]


async def test_only_the_leader_keeps_stubs(api, client, books):
    api.create("nodes", _node("gpu-a", "10.0.0.5"))
    state = {"leading": False, "asked": 0}

    def leading() -> bool:
        state["asked"] += 1
        return state["leading"]

    wake = asyncio.Event()
    task = asyncio.create_task(keep_session_stubs(client=client, namespace=NAMESPACE, image=IMAGE, leading=leading,
                                                  servers=books.servers,
                                                  interval_s=3600, wake=wake))
    try:
        for _ in range(3):              # a follower's passes, each woken by hand: no stub
            asked = state["asked"]
            wake.set()
            await wait_for(lambda: state["asked"] > asked, what="a follower's pass")
        assert _stubs(api) == {}
        state["leading"] = True
        wake.set()                      # what the lead wires to winning leadership
        await wait_for(lambda: "gpu-a" in _stubs(api), what="the leader's stub")
        api.create("nodes", _node("gpu-b", "10.0.0.6"))
        state["leading"] = False
        asked = state["asked"]
        wake.set()
        await wait_for(lambda: state["asked"] > asked, what="a pass after leadership was lost")
        asked = state["asked"]
        wake.set()
        await wait_for(lambda: state["asked"] > asked, what="another pass")
        assert sorted(_stubs(api)) == ["gpu-a"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_scheduler_keeps_a_stub_on_each_server_its_node_watch_knows(api):
    """The app wires it: with a session image, the leader (no election here: this replica) keeps a
    stub on each server once its node watch has listed the nodes, without listing nodes for it."""
    api.create("nodes", _node("gpu-a", "10.0.0.5", "24000"))
    api.create("nodes", _node("client-1", "10.0.1.1", None))
    async with running_scheduler(api, options=embedded_options(pod_namespace=NAMESPACE),
                                 device_config=_config(sessionImage=IMAGE)):
        await wait_for(lambda: "gpu-a" in _stubs(api), what="the server's stub")
        assert _endpoint(_stubs(api)["gpu-a"]) == "10.0.0.5:24000" and sorted(_stubs(api)) == ["gpu-a"]

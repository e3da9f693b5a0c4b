"""Remote GPUs ("lupine", HAMi #3004/#3013/#3164/#3166): a GPU-less pod asking for
``nvidia.com/remote-gpu`` gets every card of one whole GPU server elsewhere in the cluster.

Registration (the server's NVIDIA entries in ``remote`` mode, which NVIDIA skips), the whole-server
fit and the smallest-server choice, one server per pod, a busy server never handed out (busy in
the books, or per the server's own ``/metrics``, served here by a real local HTTP server), the
decision's annotations and endpoint, bind, release on delete and a restart's recount, end to end
against the in-repo API server.
"""
from __future__ import annotations

import contextlib
import time

import orjson
import pytest
from aiohttp import web

from hami_py.config import DeviceConfig
from hami_py.devices.base import ContainerRequest, DeviceDecodeError, NodeView, RequestError
from hami_py.devices.codec import decode_pod_devices
from hami_py.devices.nvidia import NvidiaVendor, nvidia_config
from hami_py.devices.registry import FamilySwitches, build_vendors
from hami_py.devices.remotegpu import RemoteGPUConfig, RemoteGPUVendor, build_family
from hami_py.devices.remotegpu.busy import EARLIEST_AGAIN_S, parse_busy
from hami_py.devices.remotegpu.config import server_port
from hami_py.embedded import running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from tests.conftest import assert_books_balance, container, pod_events_applied, wait_until

COUNT = "nvidia.com/remote-gpu"
MEMORY = "nvidia.com/remote-gpu-memory"
NVIDIA_REGISTER = "hami.io/node-nvidia-register"
SERVER_LABEL = "hami.io/lupine-server"
TO_ALLOCATE = "hami.io/remote-gpu-devices-to-allocate"
ALLOCATED = "hami.io/remote-gpu-devices-allocated"
ENDPOINT = "hami.io/lupine-endpoint"
SECTION = {"resourceCountName": COUNT, "resourceMemoryName": MEMORY, "defaultPort": 14833}


def device_config(**overrides) -> DeviceConfig:
    config = DeviceConfig.default()
    config.sections["remotegpu"] = {**SECTION, **overrides}
    return config


def vendor(**overrides) -> RemoteGPUVendor:
    return build_family(device_config(**overrides), FamilySwitches())[0]


def card(uuid: str, mem: int = 40960, mode: str = "remote", index: int = 0, health: bool = True) -> dict:
    return {"id": uuid, "index": index, "count": 10, "devmem": mem, "devcore": 100, "type": "NVIDIA-A100",
            "numa": 0, "mode": mode, "health": health}


def server_node(name: str, ip: str, cards: list[dict], *, port: str = "") -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, SERVER_LABEL: port},
                         "annotations": {NVIDIA_REGISTER: orjson.dumps(cards).decode(),
                                         "hami.io/node-handshake": "Reported 2026-01-01 00:00:00"}},
            "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}],
                       "capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}}}


def client_node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}],
                       "capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def remote_pod(name: str, *containers: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler", "containers": list(containers)}, "status": {"phase": "Pending"}}


def asks(count: int, memory: int | None = None, name: str = "main") -> dict:
    limits = {COUNT: str(count)}
    if memory is not None:
        limits[MEMORY] = str(memory)
    return container(limits, name=name, image="pytorch:2")


def view(node: dict) -> NodeView:
    return NodeView.from_node(node)


# -- registration ------------------------------------------------------------------------------

def test_remote_entries_are_the_families_and_nvidia_skips_them():
    node = server_node("gpu-a", "10.0.0.5", [card("GPU-1", index=0), card("GPU-2", 81920, index=1),
                                             card("GPU-3", mode="hami-core", index=2)], port="24000")
    remote = vendor().parse_node_devices(view(node))
    assert [(d.id, d.count, d.devmem, d.devcore, d.type, d.custom["endpoint"]) for d in remote] == [
        ("gpu-a/GPU-1", 1, 40960, 100, "RemoteGPU", "10.0.0.5:24000"),
        ("gpu-a/GPU-2", 1, 81920, 100, "RemoteGPU", "10.0.0.5:24000")]
    nvidia = NvidiaVendor(nvidia_config(DeviceConfig.default()))
    assert [d.id for d in nvidia.parse_node_devices(view(node))] == ["GPU-3"]
    # every card remote: the node has no NVIDIA GPU of its own, and no error
    only_remote = server_node("gpu-b", "10.0.0.6", [card("GPU-9")])
    assert nvidia.parse_node_devices(view(only_remote)) == []


@pytest.mark.parametrize("label,port", [("", 14833), ("abc", 14833), ("0", 14833), ("70000", 14833),
                                        ("24000", 24000), (" 8080 ", 8080)])
def test_server_port_from_the_label_else_the_default(label, port):
    assert server_port(label, 14833) == port
    node = server_node("s", "10.0.0.5", [card("GPU-1")], port=label)
    [device] = vendor().parse_node_devices(view(node))
    assert device.custom["endpoint"] == f"10.0.0.5:{port}"


def test_default_port_out_of_range_is_upstreams_14833():
    assert RemoteGPUConfig(default_port=70000).port == 14833
    assert RemoteGPUConfig(default_port=9000).port == 9000
    [device] = vendor(defaultPort=9000).parse_node_devices(view(server_node("s", "10.0.0.5", [card("G")])))
    assert device.custom["endpoint"] == "10.0.0.5:9000"


def test_nodes_that_serve_nothing():
    v = vendor()
    unlabelled = server_node("n", "10.0.0.5", [card("GPU-1")])
    del unlabelled["metadata"]["labels"][SERVER_LABEL]
    assert v.parse_node_devices(view(unlabelled)) == []
    no_ip = server_node("n", "10.0.0.5", [card("GPU-1")])
    no_ip["status"]["addresses"] = [{"type": "Hostname", "address": "n"}]
    assert v.parse_node_devices(view(no_ip)) == []          # upstream skips a server without InternalIP
    assert vendor(resourceCountName="").parse_node_devices(view(server_node("n", "1.2.3.4", [card("G")]))) == []
    garbled = server_node("n", "10.0.0.5", [])
    garbled["metadata"]["annotations"][NVIDIA_REGISTER] = "[{"
    with pytest.raises(DeviceDecodeError, match=NVIDIA_REGISTER):
        v.parse_node_devices(view(garbled))


def test_every_server_node_is_refused_as_a_client_and_only_while_it_is_one():
    """Upstream's lupine node offers no device at all: a labelled node hosts no remote-GPU pod
    whether it serves cards, serves none yet or has no address; a node that loses the label, or
    leaves, is no server any more (also for the leader's session stubs)."""
    from hami_py.cache.usage import UsageCache
    vendors = build_vendors(device_config(), FamilySwitches())
    remote, cache = vendors["RemoteGPU"], UsageCache(vendors)
    serving = server_node("gpu-a", "10.0.0.5", [card("GPU-A0")])
    no_ip = server_node("no-ip", "10.0.0.7", [card("GPU-C0")])
    no_ip["status"]["addresses"] = []
    for node in (serving, server_node("bare", "10.0.0.6", [], port="24000"), no_ip, client_node("cpu-1")):
        cache.upsert_node(node)
    refused = {n: remote.pool_refusal(cache, n) for n in ("gpu-a", "bare", "no-ip", "cpu-1", "unknown")}
    assert refused == {"gpu-a": "NodeInsufficientDevice", "bare": "NodeInsufficientDevice",
                       "no-ip": "NodeInsufficientDevice", "cpu-1": None, "unknown": None}
    assert remote.server_nodes(cache) == {"bare": "10.0.0.6:24000", "gpu-a": "10.0.0.5:14833", "no-ip": ""}
    del serving["metadata"]["labels"][SERVER_LABEL]
    cache.upsert_node(serving)
    cache.remove_node("bare")
    assert remote.pool_refusal(cache, "gpu-a") is None and remote.pool_refusal(cache, "bare") is None
    assert remote.server_nodes(cache) == {"no-ip": ""}


def test_family_is_off_without_a_count_name():
    off = build_vendors(DeviceConfig.default())["RemoteGPU"]
    assert off.resource_names() == [] and off.pooled is False and off.background(None) == []
    assert off.container_request(asks(1), pod_annotations={}) is None
    assert off.decision_annotations() == () and off.allocated_annotation == ""


def test_the_endpoint_is_a_scheduler_owned_annotation_when_on():
    """A user who may update pods must not point a client at another server (the webhook's
    UPDATE rule and the stale-decision cleanup read the family's decision keys)."""
    from hami_py.scheduling.admission.owned_annotations import scheduler_owned_annotations
    owned = scheduler_owned_annotations(build_vendors(device_config(), FamilySwitches()))
    assert {ENDPOINT, ALLOCATED, TO_ALLOCATE} <= owned
    assert ENDPOINT not in scheduler_owned_annotations(build_vendors(DeviceConfig.default(), FamilySwitches()))


# -- requests ----------------------------------------------------------------------------------

def test_request_is_a_count_and_a_memory_filter():
    v = vendor()
    assert v.container_request(asks(2, 30000), pod_annotations={}) == ContainerRequest("RemoteGPU", 2, 30000, 101, 100)
    assert v.container_request(asks(0), pod_annotations={}) is None
    assert v.resource_names() == [COUNT, MEMORY] and v.uses_node_lock is False
    with pytest.raises(RequestError, match=f'container "main": {MEMORY} "-5" is out of range'):
        v.container_request(asks(1, -5), pod_annotations={})
    with pytest.raises(RequestError, match="device count 1.5 is not a plain integer"):
        v.container_request(container({COUNT: "1.5"}), pod_annotations={})


def test_busy_cards_are_read_from_the_client_memory_series():
    text = ('# TYPE lupine_client_device_memory_used_bytes gauge\n'
            'lupine_host_gpu_memory_total_bytes{device_uuid="GPU-7",device_index="0"} 85520809984\n'
            'lupine_client_device_memory_used_bytes{client_id="10.0.0.9:pod-a:1",client_name="py\\"3",'
            'device_uuid="GPU-1",device_index="0"} 83886080\n'
            'lupine_client_device_utilization_percent{device_uuid="GPU-9"} 12\n')
    assert parse_busy(text) == {"GPU-1"}


def test_the_webhooks_injection_is_the_familys_admission():
    v = vendor(libImage="hami:test")
    ctr = asks(1, 2000)
    pod = {"spec": {"containers": [ctr]}}
    assert v.mutate_admission(ctr, pod) is True
    env = {e["name"]: e for e in ctr["env"]}
    assert env["LUPINE_SERVER"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{ENDPOINT}']"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"]["value"] == "2000m"
    assert pod["spec"]["initContainers"][0]["name"] == "hami-remote-gpu-lib"
    other = container({"nvidia.com/gpu": "1"})
    assert v.mutate_admission(other, pod) is False and "env" not in other


async def test_a_server_that_stops_answering_keeps_its_busy_cards():
    import aiohttp
    from hami_py.devices.remotegpu.busy import BusyCards
    answer = {"status": 200}

    async def metrics(_request):
        return web.Response(status=answer["status"],
                            text='lupine_client_device_memory_used_bytes{device_uuid="GPU-1"} 1\n')

    server_app = web.Application()
    server_app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(server_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    endpoint = f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    busy = BusyCards()
    try:
        async with aiohttp.ClientSession() as session:
            await busy.poll(session, [endpoint])
            assert busy.busy(endpoint, "GPU-1") and not busy.busy(endpoint, "GPU-2")
            answer["status"] = 500
            await busy.poll(session, [endpoint])
            assert busy.busy(endpoint, "GPU-1")          # upstream: on error the previous set
            await busy.poll(session, ["127.0.0.1:1"])   # nothing listens; the old server left the pool
            assert not busy.polled(endpoint) and busy.polled("127.0.0.1:1")
            assert not busy.busy("127.0.0.1:1", "GPU-1")
    finally:
        await runner.cleanup()


# -- end to end --------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def scheduler(api, config: DeviceConfig | None = None):
    async with running_scheduler(api, device_config=config or device_config()) as app:
        extender = ExtenderClient(app.url)
        try:
            yield app, extender
        finally:
            await extender.close()


async def cluster(api, app, *nodes: dict) -> list[str]:
    for node in nodes:
        api.create("nodes", node)
    names = [n["metadata"]["name"] for n in nodes]
    await wait_until(lambda: all(n in app.cache.nodes for n in names), f"nodes {names} known")
    servers = [n["metadata"]["name"] for n in nodes if SERVER_LABEL in n["metadata"]["labels"]]
    await wait_until(lambda: all(s in app.cache.node_index_of for s in servers), "servers' cards registered")
    return names


def fleet() -> list[dict]:
    # gpu-a: two cards; gpu-b: one card (the smallest server); cpu-1, cpu-2: clients
    return [server_node("gpu-a", "127.0.0.2", [card("GPU-A0", index=0), card("GPU-A1", index=1)]),
            server_node("gpu-b", "127.0.0.3", [card("GPU-B0", 81920)]),
            client_node("cpu-1"), client_node("cpu-2")]


def usage(app, node: str) -> dict:
    return {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in app.cache.device_usage(node)}


async def filter_pod(api, extender, pod: dict, names: list[str]) -> tuple[dict, dict]:
    created = api.create("pods", pod)
    return created, await extender.filter(created, names)


def reservation(app, pod: dict) -> dict:
    return app.cache.pods[pod["metadata"]["uid"]].annotations


async def test_smallest_whole_server_then_the_next_then_none(api):
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        p1, result = await filter_pod(api, extender, remote_pod("p1", asks(1)), names)
        # any non-server node hosts the pod; a server node offers none
        assert result["NodeNames"] == ["cpu-1"], result
        _, refused = await filter_pod(api, extender, remote_pod("on-a-server", asks(1)), ["gpu-a", "gpu-b"])
        assert refused["FailedNodes"] == {"gpu-a": "NodeInsufficientDevice", "gpu-b": "NodeInsufficientDevice"}
        ann = reservation(app, p1)
        assert ann[ALLOCATED] == ann[TO_ALLOCATE] == "gpu-b/GPU-B0,RemoteGPU,81920,100:;"
        assert ann[ENDPOINT] == "127.0.0.3:14833"
        assert usage(app, "gpu-b") == {"gpu-b/GPU-B0": (1, 81920, 100)}

        # gpu-b is taken: the next pod gets every card of gpu-a, though it asks for one
        p2, result = await filter_pod(api, extender, remote_pod("p2", asks(1)), names)
        assert result["NodeNames"] == ["cpu-1"]
        assert decode_pod_devices(reservation(app, p2)[ALLOCATED]) == decode_pod_devices(
            "gpu-a/GPU-A0,RemoteGPU,40960,100:gpu-a/GPU-A1,RemoteGPU,40960,100:;")
        assert reservation(app, p2)[ENDPOINT] == "127.0.0.2:14833"

        # nothing left: every node fails with why
        _, result = await filter_pod(api, extender, remote_pod("p3", asks(1)), names)
        assert not result["NodeNames"]
        assert set(result["FailedNodes"].values()) == {"3/3 ExclusiveDeviceAllocateConflict"}
        assert_books_balance(app)


async def test_a_request_bigger_than_any_server_and_the_memory_filter(api):
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        _, result = await filter_pod(api, extender, remote_pod("three", asks(3)), names)
        assert not result["NodeNames"]        # three cards in the fleet, but on two servers
        assert result["FailedNodes"]["cpu-1"] == "2/3 NodeInsufficientDevice"
        # 60000 MiB: only gpu-b's card is big enough, so gpu-b though gpu-a has more cards
        big, result = await filter_pod(api, extender, remote_pod("big", asks(1, 60000)), names)
        assert result["NodeNames"] == ["cpu-1"]
        assert reservation(app, big)[ALLOCATED] == "gpu-b/GPU-B0,RemoteGPU,81920,100:;"
        _, result = await filter_pod(api, extender, remote_pod("huge", asks(1, 90000)), names)
        assert result["FailedNodes"]["cpu-2"] == "1/3 ExclusiveDeviceAllocateConflict, 2/3 CardInsufficientMemory"


async def test_every_container_on_one_server_that_satisfies_them_all(api):
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        # the first container alone would fit gpu-b (smallest); the second needs two cards:
        # both go to gpu-a, whatever the order of the containers
        pod, result = await filter_pod(api, extender, remote_pod("two", asks(1, name="a"), asks(2, name="b")), names)
        assert result["NodeNames"] == ["cpu-1"], result
        both = "gpu-a/GPU-A0,RemoteGPU,40960,100:gpu-a/GPU-A1,RemoteGPU,40960,100:"
        assert reservation(app, pod)[ALLOCATED] == f"{both};{both};"
        # each container is charged the cards whole (upstream sums them): gpu-a is taken twice over
        assert usage(app, "gpu-a")["gpu-a/GPU-A0"] == (2, 81920, 200)
        assert usage(app, "gpu-b") == {"gpu-b/GPU-B0": (0, 0, 0)}


async def test_bind_release_on_delete_and_restart_recount(api):
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        p1, result = await filter_pod(api, extender, remote_pod("p1", asks(1)), names)
        assert (await extender.bind(p1, "cpu-1")) == {"Error": ""}
        stored = api.get("pods", "p1", namespace="default")
        assert stored["spec"]["nodeName"] == "cpu-1"
        ann = stored["metadata"]["annotations"]
        assert (ann[ALLOCATED], ann[ENDPOINT], ann["hami.io/vgpu-node"]) == \
            ("gpu-b/GPU-B0,RemoteGPU,81920,100:;", "127.0.0.3:14833", "cpu-1")
        assert "hami.io/mutex.lock" not in (api.get("nodes", "cpu-1")["metadata"].get("annotations") or {})
        await pod_events_applied(app, stored)
        assert usage(app, "gpu-b") == {"gpu-b/GPU-B0": (1, 81920, 100)}
        assert app.cache.pods[stored["metadata"]["uid"]].state.bound
        assert_books_balance(app)

    # a new scheduler recounts the bound pod from its annotations: gpu-b stays taken
    async with scheduler(api) as (app, extender):
        assert usage(app, "gpu-b") == {"gpu-b/GPU-B0": (1, 81920, 100)}
        assert_books_balance(app)
        p2, result = await filter_pod(api, extender, remote_pod("p2", asks(1)), names)
        assert reservation(app, p2)[ENDPOINT] == "127.0.0.2:14833"
        # the bound pod goes: its server is free again
        api.delete("pods", "p1", namespace="default")
        await wait_until(lambda: usage(app, "gpu-b") == {"gpu-b/GPU-B0": (0, 0, 0)}, "p1's server released")
        p3, result = await filter_pod(api, extender, remote_pod("p3", asks(1)), names)
        assert reservation(app, p3)[ENDPOINT] == "127.0.0.3:14833"
        assert_books_balance(app)


async def test_server_node_changes_reach_the_pods_charged_there(api):
    """The books stay right when the server node (not the pod's node) changes or goes."""
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        p1, _ = await filter_pod(api, extender, remote_pod("p1", asks(1)), names)
        # the server's registration changes (a second card appears): its pods are charged again
        grown = server_node("gpu-b", "127.0.0.3", [card("GPU-B0", 81920), card("GPU-B1", 81920, index=1)])
        api.patch("nodes", "gpu-b", {"metadata": {"annotations": grown["metadata"]["annotations"]}})
        await wait_until(lambda: len(usage(app, "gpu-b")) == 2, "gpu-b's second card")
        assert usage(app, "gpu-b")["gpu-b/GPU-B0"] == (1, 81920, 100)
        assert_books_balance(app)
        # the client node goes: the pod keeps its server's card charged until its own events
        api.delete("nodes", "cpu-1")
        await wait_until(lambda: "cpu-1" not in app.cache.nodes, "cpu-1 gone")
        assert usage(app, "gpu-b")["gpu-b/GPU-B0"] == (1, 81920, 100)
        assert_books_balance(app)
        api.delete("pods", "p1", namespace="default")
        await wait_until(lambda: p1["metadata"]["uid"] not in app.cache.pods, "p1 gone")
        assert usage(app, "gpu-b")["gpu-b/GPU-B0"] == (0, 0, 0)
        assert_books_balance(app)


async def test_a_card_busy_per_the_servers_metrics_is_not_handed_out(api):
    busy_text = ('lupine_client_device_memory_used_bytes{client_id="c1",device_uuid="GPU-B0",'
                 'device_index="0"} 83886080\n')

    async def metrics(_request):
        return web.Response(text=busy_text)

    server_app = web.Application()
    server_app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(server_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with scheduler(api) as (app, extender):
            nodes = fleet()
            nodes[1] = server_node("gpu-b", "127.0.0.1", [card("GPU-B0", 81920)], port=str(port))
            names = await cluster(api, app, *nodes)
            remote = app.vendors["RemoteGPU"]
            endpoint = f"127.0.0.1:{port}"
            remote.busy.ask_early()
            await wait_until(lambda: remote.busy.busy(endpoint, "GPU-B0"), "gpu-b's metrics read")
            # gpu-b is the smallest server, but a client the books do not know uses its card
            pod, result = await filter_pod(api, extender, remote_pod("p", asks(1)), names)
            assert result["NodeNames"] == ["cpu-1"]
            assert reservation(app, pod)[ENDPOINT] == "127.0.0.2:14833"
            _, result = await filter_pod(api, extender, remote_pod("q", asks(1)), names)
            assert result["FailedNodes"]["cpu-1"] == "3/3 ExclusiveDeviceAllocateConflict"
            # the server's client leaves: the card is handed out again (the next poll)
            busy_text = "lupine_client_device_memory_used_bytes_other 1\n"
            # q's conflict asked for a poll a moment ago: a second second has passed for the
            # rate limit (its clock, not a wait), so this ask wakes the poller at once rather
            # than the 5 s interval doing it.
            remote.busy.clock = lambda: time.monotonic() + EARLIEST_AGAIN_S
            remote.busy.ask_early()
            await wait_until(lambda: not remote.busy.busy(endpoint, "GPU-B0"), "gpu-b free per its metrics")
            r, result = await filter_pod(api, extender, remote_pod("r", asks(1)), names)
            assert reservation(app, r)[ENDPOINT] == endpoint
    finally:
        await runner.cleanup()


async def test_a_remote_and_nvidia_pod_takes_its_gpu_on_the_client_and_the_server_whole(api):
    from hami_py.fakeapi.objects import gpu_node
    async with scheduler(api) as (app, extender):
        gpu = gpu_node("local", gpus=1)
        names = await cluster(api, app, *fleet(), gpu)
        both = asks(1)
        both["resources"]["limits"]["nvidia.com/gpu"] = "1"
        pod, result = await filter_pod(api, extender, remote_pod("mixed", both), names)
        assert result["NodeNames"] == ["local"], result      # the only node with a local GPU
        ann = reservation(app, pod)
        assert ann[ENDPOINT] == "127.0.0.3:14833" and ann["hami.io/vgpu-devices-allocated"]
        assert_books_balance(app)


def _big_fleet() -> list[dict]:
    # Four one-card servers, so four remote pods can be placed; a GPU node listed first.
    from hami_py.fakeapi.objects import gpu_node
    servers = [server_node(f"gpu-{k}", f"127.0.0.{10 + k}", [card(f"GPU-{k}")]) for k in range(4)]
    return [gpu_node("local", gpus=1), *servers, client_node("cpu-1"), client_node("cpu-2")]


def _with_policy(pod: dict, policy: str) -> dict:
    pod["metadata"]["annotations"] = {"hami.io/node-scheduler-policy": policy}
    return pod


async def test_a_remote_only_pod_goes_to_a_node_without_devices_by_the_node_policy(api):
    """The pod uses none of its node's devices: a GPU node is kept for the pods that need its
    GPUs, and the node policy decides between the device-less nodes by the pods already there."""
    async with scheduler(api) as (app, extender):
        names = await cluster(api, app, *_big_fleet())
        assert names[0] == "local"          # kube-scheduler's order would have put the pod there
        placed = []
        for k in range(2):                  # binpack (the default): onto the fullest client
            _, result = await filter_pod(api, extender, remote_pod(f"bin-{k}", asks(1)), names)
            placed += result["NodeNames"]
        assert placed == ["cpu-1", "cpu-1"]
        _, result = await filter_pod(api, extender, _with_policy(remote_pod("spread", asks(1)), "spread"), names)
        assert result["NodeNames"] == ["cpu-2"]                   # spread: onto the emptiest
        # No device-less candidate left: a node with devices of its own hosts it after all.
        _, result = await filter_pod(api, extender, remote_pod("last", asks(1)), ["local", "gpu-0"])
        assert result["NodeNames"] == ["local"], result
        assert_books_balance(app)


@contextlib.asynccontextmanager
async def all_mode_scheduler(api):
    """A scheduler in --filter-mode=all with the family on, and an extender client to it."""
    from hami_py.embedded import embedded_options
    async with running_scheduler(api, options=embedded_options(filter_mode="all"),
                                 device_config=device_config()) as app:
        extender = ExtenderClient(app.url)
        try:
            yield app, extender
        finally:
            await extender.close()


async def test_filter_mode_all_ranks_device_less_nodes_first(api):
    async with all_mode_scheduler(api) as (app, extender):
        names = await cluster(api, app, *_big_fleet())
        pod, result = await filter_pod(api, extender, remote_pod("p", asks(1)), names)
        assert sorted(result["NodeNames"]) == ["cpu-1", "cpu-2", "local"], result
        scores = {h["Host"]: h["Score"] for h in await extender.prioritize(pod, result["NodeNames"])}
        assert scores["cpu-1"] == scores["cpu-2"] > scores["local"], scores


async def test_filter_mode_all_lists_every_client_and_the_bind_takes_the_server(api):
    async with all_mode_scheduler(api) as (app, extender):
        names = await cluster(api, app, *fleet())
        pod, result = await filter_pod(api, extender, remote_pod("p", asks(1)), names)
        assert sorted(result["NodeNames"]) == ["cpu-1", "cpu-2"], result
        assert (await extender.bind(pod, "cpu-2")) == {"Error": ""}
        stored = api.get("pods", "p", namespace="default")
        ann = stored["metadata"]["annotations"]
        assert (stored["spec"]["nodeName"], ann[ALLOCATED], ann[ENDPOINT]) == \
            ("cpu-2", "gpu-b/GPU-B0,RemoteGPU,81920,100:;", "127.0.0.3:14833")
        await pod_events_applied(app, stored)
        assert usage(app, "gpu-b") == {"gpu-b/GPU-B0": (1, 81920, 100)}
        assert_books_balance(app)


def test_the_books_follow_the_server_node_away_and_back():
    """A bound remote pod's charge is on its server: the server's removal leaves nothing charged
    on a dead slot, its return charges the pod again, and the pod's deletion frees it."""
    from hami_py.cache.usage import UsageCache
    vendors = build_vendors(device_config(), FamilySwitches())
    cache = UsageCache(vendors)
    server = server_node("gpu-a", "10.0.0.5", [card("GPU-A0", index=0), card("GPU-A1", index=1)])
    cache.upsert_node(server)
    cache.upsert_node(client_node("cpu-1"))
    text = "gpu-a/GPU-A0,RemoteGPU,40960,100:gpu-a/GPU-A1,RemoteGPU,40960,100:;"
    pod = remote_pod("p", asks(1))
    pod["metadata"].update(uid="uid-p", resourceVersion="5", annotations={
        "hami.io/vgpu-node": "cpu-1", ALLOCATED: text, TO_ALLOCATE: text, ENDPOINT: "10.0.0.5:14833"})
    pod["spec"]["nodeName"] = "cpu-1"
    cache.on_pod_event("ADDED", pod)
    charged = {"gpu-a/GPU-A0": (1, 40960, 100), "gpu-a/GPU-A1": (1, 40960, 100)}
    assert {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in cache.device_usage("gpu-a")} == charged
    assert cache.recount() == charged
    cache.remove_node("gpu-a")
    assert cache.recount() == {} and cache.pods["uid-p"].resolved == [-1, -1]
    cache.upsert_node(server)
    assert {d["id"]: (d["used"], d["usedmem"], d["usedcores"]) for d in cache.device_usage("gpu-a")} == charged
    cache.remove_node("cpu-1")          # the client goes: the server keeps the pod's charge
    assert cache.recount() == charged
    cache.on_pod_event("DELETED", pod)
    assert cache.recount() == {}
    assert all(d["used"] == 0 for d in cache.device_usage("gpu-a"))

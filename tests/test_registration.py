"""Registration upkeep end to end: the handshake the scheduler keeps with device plugins, gone
plugins, cordoned and unhealthy GPUs, and --node-label-selector.

The scheduler runs against the embedded API server; the test plays the device plugin (and the
kubelet) by writing node annotations and status the way they do.
"""
from __future__ import annotations

import asyncio
import time

from hami_py.devices.codec import decode_pod_devices
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod, gpu_uuid, registration
from hami_py.k8s.registration import STAMP_FORMAT, is_requesting
from tests.conftest import HANDSHAKE, decision_annotations, handshake_of, keeper_passes

CORDON = "hami.io/device-cordon"
UNREGISTERED = "node unregistered"


def _node(name: str, *, allocatable: str = "80", handshake: str | None = "Reported 2026-01-01 00:00:00",
          **kw) -> dict:
    node = gpu_node(name, **kw)
    node["status"]["allocatable"]["nvidia.com/gpu"] = allocatable
    if handshake is None:
        del node["metadata"]["annotations"][HANDSHAKE]
    else:
        node["metadata"]["annotations"][HANDSHAKE] = handshake
    return node


def _node_patches(api, node: str) -> int:
    return sum(1 for method, path, _ in api.requests if method == "PATCH" and path == f"/api/v1/nodes/{node}")


def _reported() -> str:
    """What a device plugin answers (upstream's docs show Go's time.Time String())."""
    return f"Reported {time.strftime('%Y-%m-%d %H:%M:%S')} +0000 UTC"


async def _filter(extender, api, pod_name: str, nodes: list[str], **pod_kw) -> dict:
    pod = api.create("pods", gpu_pod(pod_name, **pod_kw))
    return await extender.filter(pod, nodes)


async def test_scheduler_requests_a_handshake_once_per_plugin_answer(api):
    api.create("nodes", _node("reported"))
    api.create("nodes", _node("fresh", handshake=None))
    cpu = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only", "labels": {"gpu": "on"}},
           "status": {"allocatable": {"cpu": "8"}}}
    api.create("nodes", cpu)
    async with running_scheduler(api, options=embedded_options(registration_interval_s=0.05)) as app:
        await wait_for(lambda: all(is_requesting(handshake_of(api, n)) for n in ("reported", "fresh")),
                       what="both GPU nodes stamped Requesting_")
        for node in ("reported", "fresh"):
            prefix, _, stamp = handshake_of(api, node).partition("_")
            assert prefix == "Requesting"
            time.strptime(stamp, STAMP_FORMAT)   # upstream's layout, local time
        # Nothing more to say until a plugin answers: sweeps do not re-stamp.
        await keeper_passes(app, 3)
        assert _node_patches(api, "reported") == 1 and _node_patches(api, "fresh") == 1
        # A node without a registration is none of the handshake's business (upstream stamps it).
        assert HANDSHAKE not in (api.get("nodes", "cpu-only")["metadata"].get("annotations") or {})
        assert _node_patches(api, "cpu-only") == 0

        # The plugin answers; the scheduler asks again, once.
        api.patch("nodes", "reported", {"metadata": {"annotations": {HANDSHAKE: _reported()}}})
        await wait_for(lambda: is_requesting(handshake_of(api, "reported")), what="handshake requested again")
        await keeper_passes(app, 3)
        assert _node_patches(api, "reported") == 2
        assert app.keeper.stats.requests == 3


async def test_silent_plugin_is_dropped_after_the_timeout_and_stays_dropped(api):
    """Three nodes stamped at the same moment: one plugin answers, one is silent with nothing
    allocatable (gone), one is silent but the kubelet still advertises its GPUs (current NVIDIA
    plugins never answer: allocatable is their sign of life)."""
    api.create("nodes", _node("answering", allocatable="0"))
    api.create("nodes", _node("silent", allocatable="0"))
    api.create("nodes", _node("advertised", allocatable="80"))
    options = embedded_options(handshake_timeout_s=3, registration_interval_s=0.1)
    async with running_scheduler(api, options=options) as app:
        extender = ExtenderClient(app.url)
        stop = asyncio.Event()

        async def plugin_answers(node: str) -> None:
            # A device plugin re-registers on its own period (30 s against upstream's 60 s
            # timeout; here 0.3 s against 3 s) and answers a pending request when it does.
            while not stop.is_set():
                if is_requesting(handshake_of(api, node)):
                    api.patch("nodes", node, {"metadata": {"annotations": {HANDSHAKE: _reported()}}})
                try:
                    await asyncio.wait_for(stop.wait(), 0.3)
                except asyncio.TimeoutError:
                    pass

        plugin = asyncio.create_task(plugin_answers("answering"))
        try:
            await wait_for(lambda: handshake_of(api, "silent") is None, timeout=20,
                           what="the silent plugin's handshake cleaned up")
            result = await _filter(extender, api, "p1", ["answering", "silent", "advertised"])
            assert result["NodeNames"] and result["NodeNames"][0] in ("answering", "advertised")
            for node in ("answering", "advertised"):
                result = await _filter(extender, api, f"p-{node}", [node])
                assert result["NodeNames"] == [node], result
            result = await _filter(extender, api, "p-silent", ["silent"])
            assert result["FailedNodes"] == {"silent": UNREGISTERED}
            await wait_for(lambda: app.keeper.stats.cleanups == 1, what="the cleanup write done")
            assert _node_patches(api, "advertised") == 1          # stamped once, never cleaned up
            assert is_requesting(handshake_of(api, "advertised"))
            assert _node_patches(api, "answering") >= 3           # asked, answered, asked again

            # Upstream flaps here: it re-stamps the missing handshake and re-admits the stale
            # devices for another timeout. A gone plugin stays gone until it shows life.
            requests = app.keeper.stats.requests
            silent_patches = _node_patches(api, "silent")
            await keeper_passes(app, 5)
            assert handshake_of(api, "silent") is None
            assert _node_patches(api, "silent") == silent_patches
            result = await _filter(extender, api, "p2", ["silent"])
            assert result["FailedNodes"] == {"silent": UNREGISTERED}

            # It answers again: back in, and asked again.
            api.patch("nodes", "silent", {"metadata": {"annotations": {HANDSHAKE: _reported()}}})
            await wait_for(lambda: is_requesting(handshake_of(api, "silent")), what="the returning plugin asked")
            assert app.keeper.stats.requests > requests
            result = await _filter(extender, api, "p3", ["silent"])
            assert result["NodeNames"] == ["silent"], result
        finally:
            stop.set()
            await plugin
            await extender.close()


async def test_allocatable_falling_to_zero_drops_an_nvidia_node_at_once(api):
    api.create("nodes", _node("n1"))
    async with running_scheduler(api, options=embedded_options(registration_interval_s=0.05)) as app:
        extender = ExtenderClient(app.url)
        try:
            await wait_for(lambda: is_requesting(handshake_of(api, "n1")), what="n1 stamped")
            api.patch("nodes", "n1", {"status": {"allocatable": {"nvidia.com/gpu": "0"}}})
            await wait_for(lambda: app.cache.nodes["n1"].plugin_gone, what="n1 judged gone")
            result = await _filter(extender, api, "p1", ["n1"])
            assert result["FailedNodes"] == {"n1": UNREGISTERED}
            await wait_for(lambda: handshake_of(api, "n1") is None, what="n1's handshake cleaned up")
            await keeper_passes(app, 3)
            assert handshake_of(api, "n1") is None and app.cache.nodes["n1"].plugin_gone

            # The kubelet advertises the GPUs again (plugin restarted): usable, and asked again.
            api.patch("nodes", "n1", {"status": {"allocatable": {"nvidia.com/gpu": "80"}}})
            await wait_for(lambda: is_requesting(handshake_of(api, "n1")), what="n1 asked again")
            result = await _filter(extender, api, "p2", ["n1"])
            assert result["NodeNames"] == ["n1"], result
        finally:
            await extender.close()


async def test_cordoned_gpus_are_skipped(api, app, extender):
    api.create("nodes", _node("n1", gpus=2))
    await wait_for(lambda: "n1" in app.cache.node_index_of, what="n1 registered")
    gpu0, gpu1 = gpu_uuid("n1", 0), gpu_uuid("n1", 1)
    api.patch("nodes", "n1", {"metadata": {"annotations": {CORDON: f" {gpu0} ,{gpu1},"}}})
    await wait_for(lambda: app.cache.nodes["n1"].annotations.get(CORDON), what="cordon seen")
    result = await _filter(extender, api, "p1", ["n1"])
    assert result["FailedNodes"] == {"n1": "2/2 CardCordoned"}

    api.patch("nodes", "n1", {"metadata": {"annotations": {CORDON: gpu0}}})
    await wait_for(lambda: app.cache.nodes["n1"].annotations.get(CORDON) == gpu0, what="cordon narrowed")
    result = await _filter(extender, api, "p2", ["n1"], gpumem=1000)
    assert result["NodeNames"] == ["n1"]
    allocated = decision_annotations(api, app, "p2")
    assert decode_pod_devices(allocated["hami.io/vgpu-devices-to-allocate"])[0][0].uuid == gpu1
    result = await _filter(extender, api, "p3", ["n1"], gpus=2, gpumem=1000)
    assert result["FailedNodes"] == {"n1": "1/2 AllocatedCardsInsufficientRequest, 1/2 CardCordoned"}

    api.patch("nodes", "n1", {"metadata": {"annotations": {CORDON: None}}})
    await wait_for(lambda: CORDON not in app.cache.nodes["n1"].annotations, what="cordon lifted")
    result = await _filter(extender, api, "p4", ["n1"], gpus=2, gpumem=1000)
    assert result["NodeNames"] == ["n1"]


async def test_unhealthy_gpus_are_not_offered(api, app, extender):
    devices = registration("n1", gpus=2)
    devices[0]["health"] = False
    api.create("nodes", _node("n1", devices=devices))
    sick = registration("n2", gpus=1)
    del sick[0]["health"]                      # omitted means false, as upstream decodes it
    api.create("nodes", _node("n2", devices=sick))
    await wait_for(lambda: {"n1", "n2"} <= set(app.cache.node_index_of), what="nodes registered")
    result = await _filter(extender, api, "p1", ["n2"])
    assert result["FailedNodes"] == {"n2": "1/1 CardNotHealth"}
    result = await _filter(extender, api, "p2", ["n1", "n2"], gpumem=1000)
    assert result["NodeNames"] == ["n1"]
    allocated = decision_annotations(api, app, "p2")
    assert decode_pod_devices(allocated["hami.io/vgpu-devices-to-allocate"])[0][0].uuid == gpu_uuid("n1", 1)
    result = await _filter(extender, api, "p3", ["n1"], gpus=2, gpumem=1000)
    assert result["FailedNodes"] == {"n1": "1/2 AllocatedCardsInsufficientRequest, 1/2 CardNotHealth"}


async def test_node_label_selector_limits_registration_and_upkeep(api):
    api.create("nodes", _node("in", labels={"pool": "gpu"}))
    api.create("nodes", _node("out"))
    options = embedded_options(node_label_selector={"pool": "gpu"}, registration_interval_s=0.05)
    async with running_scheduler(api, options=options) as app:
        extender = ExtenderClient(app.url)
        try:
            await wait_for(lambda: is_requesting(handshake_of(api, "in")), what="selected node stamped")
            result = await _filter(extender, api, "p1", ["out"])
            assert result["FailedNodes"] == {"out": UNREGISTERED}
            result = await _filter(extender, api, "p1b", ["in", "out"])
            assert result["NodeNames"] == ["in"]
            await keeper_passes(app, 3)
            assert _node_patches(api, "out") == 0

            api.patch("nodes", "out", {"metadata": {"labels": {"pool": "gpu"}}})
            await wait_for(lambda: is_requesting(handshake_of(api, "out")), what="newly selected node stamped")
            api.patch("nodes", "in", {"metadata": {"labels": {"pool": None}}})
            await wait_for(lambda: "in" not in app.cache.nodes, what="deselected node dropped")
            result = await _filter(extender, api, "p2", ["in"])
            assert result["FailedNodes"] == {"in": UNREGISTERED}
            result = await _filter(extender, api, "p2b", ["in", "out"])
            assert result["NodeNames"] == ["out"]
        finally:
            await extender.close()


async def test_a_failed_handshake_write_is_retried_by_the_next_sweep(api):
    api.create("nodes", _node("n1"))
    fault = api.faults.add(method="PATCH", path="^/api/v1/nodes/n1$", status=500, times=2)
    async with running_scheduler(api, options=embedded_options(registration_interval_s=0.05)) as app:
        await wait_for(lambda: is_requesting(handshake_of(api, "n1")), what="handshake written after the faults")
        assert fault.hits == 2
        await wait_for(lambda: app.keeper.stats.requests == 1, what="the successful write counted")
        assert app.keeper.stats.write_errors == 2

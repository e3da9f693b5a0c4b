"""Feature-inventory rows of node registration and of the usage cache built from pods.

The device plugin registers a node's GPUs in ``hami.io/node-nvidia-register``; pods scheduled
earlier (by this process, a previous one, or another replica) are known only by their
``hami.io/vgpu-node`` and ``hami.io/vgpu-devices-allocated`` annotations. Each test names its
inventory row (docs/FEATURES.md) in a docstring line.
"""
from __future__ import annotations

import orjson

from hami_py.fakeapi.objects import gpu_node, gpu_pod, registration
from tests.conftest import decision_annotations, place, pod_events_applied, register_nodes as register, wait_until
from tests.test_inventory_filter import A100_MIB, ALLOCATED, a100, reference_node

REGISTER = "hami.io/node-nvidia-register"


def _reregister(api, devices) -> None:
    api.patch("nodes", "n1", {"metadata": {"annotations": {
        REGISTER: devices if isinstance(devices, str) else orjson.dumps(devices).decode()}}})


def _scheduled_elsewhere(name: str, allocated: str, *, node: str = "n1", **status) -> dict:
    """A running pod placed by an earlier scheduler process: only its annotations say so."""
    pod = gpu_pod(name, gpumem=A100_MIB)
    pod["metadata"]["annotations"] = {"hami.io/vgpu-node": node, ALLOCATED: allocated,
                                      "hami.io/vgpu-devices-to-allocate": allocated,
                                      "hami.io/bind-phase": "success"}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", **status}
    return pod


async def _seen(api, app, name: str) -> None:
    """Wait until the cache has applied the pod's latest version."""
    stored = api.get("pods", name, namespace="default")
    uid, rv = stored["metadata"]["uid"], int(stored["metadata"]["resourceVersion"])
    await wait_until(lambda: uid in app.cache.pods and (app.cache.pods[uid].resource_version or 0) >= rv,
                     f"pod {name} at resourceVersion {rv} in the cache")


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------

async def test_a_changed_registration_is_used_by_the_next_filter(api, app, extender):
    """Inventory: reg-loop-15s

    Upstream re-reads registrations every 15 s; we apply the node's watch event at once."""
    names = await register(api, app, reference_node())
    _, result = await place(api, extender, gpu_pod("big", gpumem=12000), names)
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
    _reregister(api, [a100(devmem=16384)])
    await wait_until(lambda: app.cache.device_usage("n1")[0]["totalmem"] == 16384, "new memory size")
    _, result = await place(api, extender, gpu_pod("big-again", gpumem=12000), names)
    assert result["NodeNames"] == ["n1"], result


async def test_a_vendor_reporting_no_devices_unregisters_the_node(api, app, extender):
    """Inventory: reg-zero-devices"""
    names = await register(api, app, reference_node())
    _reregister(api, "[]")
    await wait_until(lambda: "n1" not in app.cache.node_index_of, "devices dropped")
    _, result = await place(api, extender, gpu_pod("p", gpumem=1000), names)
    assert result["FailedNodes"] == {"n1": "node unregistered"}


async def test_registration_keys_match_whatever_their_case(api, app, extender):
    """Inventory: reg-case-insensitive-json"""
    device = {"ID": "GPU-0", "Index": 0, "Count": 10, "Devmem": A100_MIB, "Devcore": 100,
              "Type": "NVIDIA-A100", "Numa": 0, "Health": True, "Mode": "hami-core"}
    names = await register(api, app, reference_node("n1", device))
    _, result = await place(api, extender, gpu_pod("p", gpumem=A100_MIB, gpucores=100), names)
    assert result["NodeNames"] == ["n1"], result
    assert decision_annotations(api, app, "p")[ALLOCATED] == \
        f"GPU-0,NVIDIA,{A100_MIB},100:;"


# ---------------------------------------------------------------------------------------------
# usage from existing pods
# ---------------------------------------------------------------------------------------------

async def test_pods_placed_before_this_process_started_count(api, app, extender):
    """Inventory: cache-pod-add"""
    names = await register(api, app, reference_node())
    api.create("pods", _scheduled_elsewhere("old", f"GPU-0,NVIDIA,{A100_MIB},100:;"))
    await _seen(api, app, "old")
    _, result = await place(api, extender, gpu_pod("new", gpumem=1000), names)
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}


async def test_a_terminating_pod_keeps_its_devices_until_it_is_gone(api, app, extender):
    """Inventory: cache-terminating"""
    names = await register(api, app, reference_node())
    api.create("pods", _scheduled_elsewhere("leaving", f"GPU-0,NVIDIA,{A100_MIB},100:;"))
    api.patch("pods", "leaving", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                                               "deletionGracePeriodSeconds": 30}}, namespace="default")
    await _seen(api, app, "leaving")
    _, result = await place(api, extender, gpu_pod("new", gpumem=1000), names)
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
    api.delete("pods", "leaving", namespace="default")
    await wait_until(lambda: app.cache.device_usage("n1")[0]["usedmem"] == 0, "deleted pod released")
    _, result = await place(api, extender, gpu_pod("after", gpumem=1000), names)
    assert result["NodeNames"] == ["n1"], result


async def test_an_undecodable_allocation_is_not_charged(api, app, extender):
    """Inventory: cache-bad-annotation"""
    names = await register(api, app, reference_node())
    garbled = api.create("pods", _scheduled_elsewhere("garbled", "GPU-0,NVIDIA:;"))
    await pod_events_applied(app, garbled)
    assert garbled["metadata"]["uid"] not in app.cache.pods
    assert app.cache.device_usage("n1")[0]["usedmem"] == 0
    _, result = await place(api, extender, gpu_pod("whole", gpumem=A100_MIB), names)
    assert result["NodeNames"] == ["n1"], result


def _registration_refused_events(api, node: str) -> list[dict]:
    return [e for e in api.list("events", namespace="default")
            if e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"] == node
            and e["reason"] == "RegistrationRefused"]


async def test_a_device_id_no_decision_can_carry_refuses_the_registration_and_scheduling_goes_elsewhere(
        api, app, extender):
    """Inventory: reg-device-id-separator

    A decision names its devices in a list split on ``,``, ``:`` and ``;``: a device registered
    as ``GPU-a,b`` could be chosen and never written (before, every /filter whose policy chose
    that node answered an internal error, whatever else fitted). The node's registration of the
    family is refused as it is decoded: a warning Event on the node says why, /filter's
    FailedNodes names the id for that node, and the pod lands on another node. A corrected
    registration is used at once."""
    bad_devices = registration("bad", gpus=2)
    bad_devices[0]["id"] = "GPU-a,b"
    api.create("nodes", gpu_node("bad", devices=bad_devices))     # first: binpack's tie goes to it
    await register(api, app, gpu_node("good", gpus=1))
    await wait_until(lambda: "bad" in app.cache.nodes and app.cache.nodes["bad"].decode_error, "bad node decoded")
    _, result = await place(api, extender, gpu_pod("p", gpumem=1000), ["bad", "good"])
    assert (result["NodeNames"], result["Error"]) == (["good"], ""), result
    # A pod that fits nowhere (two GPUs; the good node has one) hears why of each node.
    _, result = await place(api, extender, gpu_pod("two", gpus=2, gpumem=1000), ["bad", "good"])
    assert (result["NodeNames"], result["Error"]) == (None, ""), result
    assert result["FailedNodes"] == {
        "bad": f'registration refused: {REGISTER}: device id "GPU-a,b" contains a separator '
               "(',', ':' or ';'), which no pod's allocation annotation can carry",
        "good": "NodeInsufficientDevice"}
    await wait_until(lambda: _registration_refused_events(api, "bad"), "the node's RegistrationRefused event")
    event = _registration_refused_events(api, "bad")[0]
    assert event["type"] == "Warning" and '"GPU-a,b"' in event["message"], event
    bad_devices[0]["id"] = "GPU-a-b"
    api.patch("nodes", "bad", {"metadata": {"annotations": {REGISTER: orjson.dumps(bad_devices).decode()}}})
    await wait_until(lambda: "bad" in app.cache.node_index_of and not app.cache.refused_nodes, "registration accepted")
    _, result = await place(api, extender, gpu_pod("q", gpumem=1000), ["bad"])
    assert result["NodeNames"] == ["bad"], result
    assert len(_registration_refused_events(api, "bad")) == 1

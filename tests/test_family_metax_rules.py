"""Metax sGPU placement rules end to end: app class and QoS compatibility derived from the pods
a card hosts, the online and link-zone preferences, and the policy-neutral node score."""
from __future__ import annotations

import orjson

from hami_py.devices.codec import decode_pod_devices
from tests.conftest import assert_books_balance, bind_placed, decision_annotations, device_pod, place, register_nodes
from tests.test_family_metax import sgpu_node

CLASS = "metax-tech.com/sgpu-app-class"
QOS = "metax-tech.com/sgpu-qos-policy"
USE = "metax-tech.com/use-gpuuuid"


def zoned_cards(*zones: int, prefix: str = "GPU") -> str:
    return orjson.dumps([{"uuid": f"{prefix}-{i}", "totalDevCount": 16, "totalCompute": 100, "totalVRam": 65536,
                          "healthy": True, "qosPolicy": "best-effort", "linkZone": z}
                         for i, z in enumerate(zones)]).decode()


def share(name: str, cores: str = "30", **annotations) -> dict:
    return device_pod(name, {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4", "metax-tech.com/vcore": cores},
                      annotations=annotations)


async def placed_on(api, app, extender, pod, names, bind=True) -> list[str] | None:
    """The cards the pod got (bound when ``bind``), or None when it fits nowhere."""
    stored, result = await place(api, extender, pod, names)
    if not result["NodeNames"]:
        return None
    if bind:
        stored = await bind_placed(api, app, extender, stored, result)
        ann = stored["metadata"]["annotations"]
    else:
        ann = decision_annotations(api, app, pod["metadata"]["name"])
    return [d.uuid for c in decode_pod_devices(ann["hami.io/metax-sgpu-devices-allocated"]) for d in c]


async def test_a_shared_card_takes_only_pods_of_the_qos_its_tasks_have(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(1, 1)))
    assert await placed_on(api, app, extender, share("fixed", **{QOS: "fixed-share", USE: "GPU-0"}), names) == ["GPU-0"]
    # best-effort cannot join GPU-0 (its task is fixed-share, whatever the card reported)
    assert await placed_on(api, app, extender, share("be", **{QOS: "best-effort", USE: "GPU-0"}), names) is None
    _, result = await place(api, extender, share("be2", **{QOS: "best-effort", USE: "GPU-0"}), names)
    # Upstream's word for it (GPU-1 is not among the pod's USE list: its UUID gate refuses it).
    assert "CardQosPolicyMismatch" in result["FailedNodes"]["s1"], result
    assert await placed_on(api, app, extender, share("be3", **{QOS: "best-effort"}), names) == ["GPU-1"]
    assert await placed_on(api, app, extender, share("fixed2", **{QOS: "fixed-share", USE: "GPU-0"}), names) == ["GPU-0"]
    # A whole-card request is not held to a QoS (it fails on cores here, not on QoS).
    _, result = await place(api, extender, share("whole", cores="100", **{QOS: "burst-share", USE: "GPU-0"}), names)
    assert "CardQosPolicyMismatch" not in result["FailedNodes"]["s1"], result
    # The card's QoS goes with its tasks: once they are gone, any QoS may come.
    for name in ("fixed", "fixed2"):
        api.delete("pods", name, namespace="default")
    from tests.conftest import wait_until
    await wait_until(lambda: app.cache.device_usage("s1")[0]["used"] == 0, "GPU-0 free")
    assert await placed_on(api, app, extender, share("be4", **{QOS: "best-effort", USE: "GPU-0"}), names) == ["GPU-0"]
    assert_books_balance(app)


async def test_app_classes_share_cards_only_as_upstream_allows(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(0, 0)))
    assert await placed_on(api, app, extender, share("off", **{CLASS: "offline", QOS: "best-effort", USE: "GPU-0"}),
                           names) == ["GPU-0"]
    # an unclassed pod never joins a card of classed tasks, and a classed one never an unclassed card
    assert await placed_on(api, app, extender, share("plain", **{QOS: "best-effort"}), names) == ["GPU-1"]
    assert await placed_on(api, app, extender, share("off2", **{CLASS: "offline", QOS: "best-effort"}),
                           names) == ["GPU-0"]
    # online joins offline tasks; then offline may not come where online runs
    assert await placed_on(api, app, extender, share("on", **{CLASS: "online"}), names) == ["GPU-0"]
    assert await placed_on(api, app, extender, share("off3", **{CLASS: "offline", QOS: "best-effort"}), names) is None
    on = decode_pod_devices(decision_annotations(api, app, "on")["hami.io/metax-sgpu-devices-allocated"])
    assert on[0][0].usedcores == 0                                     # online pods take no cores
    assert_books_balance(app)


async def test_online_pods_prefer_idle_cards_then_fewer_online_tasks(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(0, 0, 0)))
    assert await placed_on(api, app, extender, share("off", **{CLASS: "offline", QOS: "best-effort", USE: "GPU-0"}),
                           names) == ["GPU-0"]
    assert await placed_on(api, app, extender, share("plain", **{QOS: "best-effort", USE: "GPU-2"}),
                           names) == ["GPU-2"]
    # GPU-0 hosts only offline tasks (last), GPU-2 plain ones (refused): the idle GPU-1
    assert await placed_on(api, app, extender, share("on1", **{CLASS: "online"}), names) == ["GPU-1"]
    # GPU-1 has one online task, GPU-0 only offline ones: GPU-1 still comes first
    assert await placed_on(api, app, extender, share("on2", **{CLASS: "online"}), names) == ["GPU-1"]
    assert_books_balance(app)


async def test_an_online_pod_joins_a_card_whose_cores_are_all_taken(api, app, extender):
    """Upstream's sGPU fit checks no cores for an online pod (its share is enforced on the card):
    two offline tasks hold all of GPU-0's cores, and an online pod still lands there, charged no
    cores; a pod that is not online is refused there for its cores."""
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(0, 0)))
    for name in ("off1", "off2"):
        assert await placed_on(api, app, extender, share(name, cores="50", **{CLASS: "offline", QOS: "best-effort",
                                                                            USE: "GPU-0"}), names) == ["GPU-0"]
    _, refused = await place(api, extender, share("off3", cores="10", **{CLASS: "offline", QOS: "best-effort",
                                                                       USE: "GPU-0"}), names)
    assert not refused["NodeNames"] and "CardInsufficientCore" in refused["FailedNodes"]["s1"], refused
    assert await placed_on(api, app, extender, share("on", **{CLASS: "online", USE: "GPU-0"}), names) == ["GPU-0"]
    card = app.cache.device_usage("s1")[0]
    assert card["used"] == 3 and card["usedcores"] == 100
    assert_books_balance(app)


async def test_an_online_pod_of_two_containers_may_share_its_card(api, app, extender):
    """Upstream counts the pod's first container as an unclassed task and refuses the second on
    the same card; here the pod's own containers carry its class (docs/COMPATIBILITY.md)."""
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(0)))
    pod = share("pair", **{CLASS: "online"})
    pod["spec"]["containers"].append({"name": "b", "image": "x", "resources": {"limits": {
        "metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4"}}})
    assert await placed_on(api, app, extender, pod, names) == ["GPU-0", "GPU-0"]
    assert app.cache.device_usage("s1")[0]["used"] == 2
    assert_books_balance(app)


async def test_whole_card_pods_are_packed_into_the_smallest_link_zone(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("s1", zoned_cards(1, 1, 1, 2, 2, 2, 0)))
    assert await placed_on(api, app, extender, share("busy", **{QOS: "best-effort", USE: "GPU-3"}), names) == ["GPU-3"]
    # free whole cards: zone 1 has three, zone 2 two, GPU-6 no zone: two cards come from zone 2
    got = await placed_on(api, app, extender, device_pod("two", {"metax-tech.com/sgpu": "2"}), names)
    assert sorted(got) == ["GPU-4", "GPU-5"], got
    # three: zone 1 holds them all
    got = await placed_on(api, app, extender, device_pod("three", {"metax-tech.com/sgpu": "3"}), names)
    assert sorted(got) == ["GPU-0", "GPU-1", "GPU-2"], got
    assert_books_balance(app)


def test_link_zone_packing_differs_from_the_policy_order():
    """The test above would pass by chance if the policy's order gave zone 2 first: it does not."""
    from hami_py.devices.metax.sgpu import prefer_link_zones
    zones = {0: 1, 1: 1, 2: 1, 4: 2, 5: 2, 6: 0}
    assert prefer_link_zones([0, 1, 2, 4, 5, 6], zones, 2) == [4, 5]
    assert prefer_link_zones([6, 0, 4, 1, 2, 5], zones, 2) == [4, 5]


async def test_the_node_score_prefers_linked_cards_under_either_policy(api, app, extender):
    linked = sgpu_node("linked", zoned_cards(1, 1, prefix="L"))
    apart = sgpu_node("apart", zoned_cards(1, 2, prefix="A"))
    names = await register_nodes(api, app, apart, linked)
    for policy in ("binpack", "spread"):
        pod = device_pod(f"two-{policy}", {"metax-tech.com/sgpu": "2"},
                         annotations={"metax-tech.com/sgpu-topology-aware": "true",
                                      "hami.io/node-scheduler-policy": policy})
        _, result = await place(api, extender, pod, names)
        assert result["NodeNames"] == ["linked"], (policy, result)
        app.cache.release_pod(app.cache.uid_of("default", f"two-{policy}", "linked"))


async def test_the_node_score_sends_online_pods_away_from_offline_only_cards(api, app, extender):
    names = await register_nodes(api, app, sgpu_node("off", zoned_cards(0, prefix="F")),
                                 sgpu_node("on", zoned_cards(0, prefix="N")))
    assert await placed_on(api, app, extender, share("o1", **{CLASS: "offline", QOS: "best-effort"}), ["off"]) == ["F-0"]
    assert await placed_on(api, app, extender, share("o2", **{CLASS: "online"}), ["on"]) == ["N-0"]
    # −100 per offline task on a card of only offline tasks, −20 per online task
    assert await placed_on(api, app, extender, share("o3", **{CLASS: "online"}), names) == ["N-0"]


async def test_a_restarted_scheduler_knows_each_cards_qos_and_class_from_its_pods(api):
    """Upstream's expected-QoS map lives in the process; here a card's QoS and class come back
    with the pods' charges."""
    from hami_py.embedded import running_scheduler
    from hami_py.fakeapi.kubescheduler import ExtenderClient
    from tests.conftest import wait_until
    api.create("nodes", sgpu_node("s1", zoned_cards(0, 0)))
    async with running_scheduler(api) as first:
        await wait_until(lambda: "s1" in first.cache.node_index_of, "s1 registered")
        client = ExtenderClient(first.url)
        try:
            for pod in (share("fixed", **{QOS: "fixed-share", USE: "GPU-0"}),
                        share("off", **{CLASS: "offline", QOS: "best-effort", USE: "GPU-1"})):
                stored, result = await place(api, client, pod, ["s1"])
                assert result["NodeNames"] == ["s1"], result
                await bind_placed(api, first, client, stored, result)
        finally:
            await client.close()
    async with running_scheduler(api) as second:
        await wait_until(lambda: [d["used"] for d in second.cache.device_usage("s1")] == [1, 1], "both pods charged")
        client = ExtenderClient(second.url)
        try:
            # best-effort fits neither card: GPU-0 is fixed-share, GPU-1 hosts a classed task
            _, result = await place(api, client, share("be", **{QOS: "best-effort"}), ["s1"])
            assert result["NodeNames"] is None, result
            _, result = await place(api, client, share("fixed2", **{QOS: "fixed-share"}), ["s1"])
            assert result["NodeNames"] == ["s1"], result
            _, result = await place(api, client, share("off2", **{CLASS: "offline", QOS: "best-effort"}), ["s1"])
            assert result["NodeNames"] == ["s1"], result
        finally:
            await client.close()
        assert_books_balance(second)

"""Stuck node locks: a lock held long after the bind by a pod whose allocation makes no progress
(its device plugin hangs) is avoided, not waited on. /filter places the next pod on another node
that fits, a bind onto the stuck node fails at once naming the holder, /metrics shows it; once the
plugin answers, the node is an ordinary one again."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hami_py.cache.records import NodeEntry
from hami_py.cache.stuck_locks import stuck_lock
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_node, gpu_pod
from tests.conftest import pod_events_applied, wait_until
from tests.test_metrics import labels, scrape, series

LOCK = "hami.io/mutex.lock"


def _node_events(api, node: str) -> list[dict]:
    return [e for e in api.list("events", namespace="default")
            if e["involvedObject"].get("kind") == "Node" and e["involvedObject"]["name"] == node
            and e["reason"] == "NodeLockStuck"]


def _stamp(seconds_ago: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("value, allocating, expected", [
    (None, True, None),
    ("{t},default,p", True, "default/p"),
    ("{t},default,p", False, None),                 # the plugin has finished: a lock release that failed
    ("{t}", True, None),                            # a legacy value names no holder
    ("garbled", True, None),
])
def test_a_lock_is_stuck_when_held_past_the_bound_by_an_unfinished_allocation(value, allocating, expected):
    entry = NodeEntry(name="n1", index=0, lock_value=value and value.format(t=_stamp(60)))
    found = stuck_lock(entry, allocating=lambda ns, name, node: allocating, after_s=30)
    assert (found.holder if found else None) == expected
    fresh = NodeEntry(name="n1", index=0, lock_value=f"{_stamp(1)},default,p")
    assert stuck_lock(fresh, allocating=lambda *a: True, after_s=30) is None


async def test_a_stuck_node_is_passed_over_and_a_bind_onto_it_fails_at_once(api):
    for name in ("n1", "n2"):
        api.create("nodes", gpu_node(name, gpus=1))
    # No device plugin: the holder's allocation never finishes, as with a hung plugin.
    async with running_scheduler(api, options=embedded_options(node_lock_stuck_after_s=30.0),
                                 device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            await wait_until(lambda: {"n1", "n2"} <= set(app.cache.node_index_of), "nodes registered")
            holder = api.create("pods", gpu_pod("holder", gpumem=1000))
            assert (await extender.filter(holder, ["n1"]))["NodeNames"] == ["n1"]
            assert (await extender.bind(holder, "n1")) == {"Error": ""}
            # The lock was taken a minute ago and the plugin never answered.
            api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK: f"{_stamp(60)},default,holder"}}})
            await wait_until(lambda: app.cache.stuck_lock("n1") is not None, "the lock judged stuck")
            stuck = app.cache.stuck_lock("n1")
            assert (stuck.holder, round(stuck.held_s) >= 60) == ("default/holder", True)
            # binpack prefers n1 (it is in use), but its lock is stuck: n2.
            nxt = api.create("pods", gpu_pod("next", gpumem=1000))
            assert (await extender.filter(nxt, ["n1", "n2"]))["NodeNames"] == ["n2"]
            # Only n1 fits a pod filtered onto it alone: its bind fails at once, naming the holder.
            only = api.create("pods", gpu_pod("only", gpumem=1000))
            assert (await extender.filter(only, ["n1"]))["NodeNames"] == ["n1"]
            answer = await extender.bind(only, "n1")
            assert answer["Error"].startswith("node n1 is locked by pod default/holder, whose allocation has made "
                                              "no progress for ") and answer["Error"].endswith("node lock stuck")
            assert series(await scrape(app), "hami_node_lock_stuck").keys() == {labels(node="n1", holder="default/holder")}
            # A warning on the node, once: the filter's and the bind's reports raise its count.
            await wait_until(lambda: _node_events(api, "n1"), "the node's NodeLockStuck event")
            [event] = _node_events(api, "n1")
            assert (event["type"], event["involvedObject"]["kind"]) == ("Warning", "Node")
            assert event["message"].startswith("node lock held by pod default/holder, whose allocation makes no progress")
            # The plugin answers at last and releases the lock: n1 is an ordinary node again.
            done = api.patch("pods", "holder", {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}},
                             namespace="default")
            await pod_events_applied(app, done)
            assert app.cache.stuck_lock("n1") is None
            assert series(await scrape(app), "hami_node_lock_stuck") == {}
        finally:
            await extender.close()

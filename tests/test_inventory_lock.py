"""Feature-inventory rows of the node lock taken by /bind (``hami.io/mutex.lock``).

The lock value is ``<RFC3339Nano time>,<namespace>,<pod>``; the device plugin releases it after
allocating. These tests run without the simulated device plugin, so a lock stays exactly as the
bind left it. Each test names its inventory row (docs/FEATURES.md) in a docstring line.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from hami_py.cli import build_parser, options_from_args
from hami_py.embedded import embedded_options, running_scheduler
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.fakeapi.objects import gpu_pod
from hami_py.cache.records import parse_lock
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value, rfc3339_nano
from tests.conftest import wait_until
from tests.test_inventory_filter import reference_node, register, used_mem

CONTENTION = "node n1 has been locked within 5m0s: node lock contention"


@pytest.fixture
def scheduler_options():
    """Upstream's rule, where these rows come from: a held lock fails the bind at once
    (``--node-lock-wait 0``; hami-py's default waits, tests/test_podgroup.py)."""
    return embedded_options(node_lock_wait_s=0)


@pytest.fixture
async def app(api, scheduler_options):
    """The scheduler without the simulated device plugin: nobody releases a lock behind our back."""
    async with running_scheduler(api, options=scheduler_options, device_plugin=False) as running:
        yield running


def _ago(**delta) -> datetime:
    return datetime.now(timezone.utc) - timedelta(**delta)


def _set_lock(api, value: str) -> None:
    api.patch("nodes", "n1", {"metadata": {"annotations": {LOCK_ANNOTATION: value}}})


def _lock(api) -> str | None:
    return (api.get("nodes", "n1")["metadata"].get("annotations") or {}).get(LOCK_ANNOTATION)


async def _filtered(api, extender, name: str, **labels) -> dict:
    """A pod created, filtered onto n1 (so it holds a reservation), ready to bind."""
    pod = gpu_pod(name, gpumem=1000)
    if labels:
        pod["metadata"]["labels"] = labels
    created = api.create("pods", pod)
    assert (await extender.filter(created, ["n1"]))["NodeNames"] == ["n1"]
    return created


async def test_lock_older_than_the_timeout_is_taken_over_even_from_a_live_pod(api, app, extender):
    """Inventory: lock-expiry"""
    await register(api, app, reference_node())
    api.create("pods", gpu_pod("holder"))                   # the owner still exists
    _set_lock(api, lock_value("default", "holder", now=_ago(minutes=6)))
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,p")


async def test_a_lock_the_pod_already_holds_does_not_block_it(api, app, extender):
    """Inventory: lock-reentrant

    Upstream's case is a pod asking two vendors, which locks the node once per vendor; with the
    NVIDIA vendor alone the same rule shows as a bind retried after its lock was taken."""
    await register(api, app, reference_node())
    pod = await _filtered(api, extender, "p")
    _set_lock(api, lock_value("default", "p"))
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,p")
    assert api.get("pods", "p", namespace="default")["spec"]["nodeName"] == "n1"


async def test_timestamp_only_lock_blocks_while_fresh_and_is_taken_over_when_stale(api, app, extender):
    """Inventory: lock-legacy"""
    await register(api, app, reference_node())
    _set_lock(api, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    first = await _filtered(api, extender, "first")
    assert await extender.bind(first, "n1") == {"Error": CONTENTION}
    _set_lock(api, _ago(minutes=6).strftime("%Y-%m-%dT%H:%M:%SZ"))
    second = await _filtered(api, extender, "second")
    assert await extender.bind(second, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,second")


async def test_two_part_lock_is_an_error_not_contention(api):
    """Inventory: lock-malformed

    A PodGroup member retries contention for --node-lock-retry-timeout; a malformed lock is not
    contention, so even a member gets the error at once, and its reservation is released."""
    async with running_scheduler(api, options=embedded_options(node_lock_retry_timeout_s=30),
                                 device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            await register(api, app, reference_node())
            _set_lock(api, "a,b")
            pod = await _filtered(api, extender, "member", **{"scheduling.x-k8s.io/pod-group": "g"})
            result = await extender.bind(pod, "n1")
            assert "malformed lock annotation: expected 3 parts, got 2 from a,b" in result["Error"], result
            assert "contention" not in result["Error"]
            assert used_mem(app) == 0
            assert _lock(api) == "a,b"
        finally:
            await extender.close()


async def test_lock_expiry_comes_from_the_flag_not_the_environment(api, monkeypatch):
    """Inventory: lock-env-ignored

    The chart sets ``HAMI_NODELOCK_EXPIRE``; upstream's --node-lock-timeout (default 5m)
    overrides it. We do not read the variable at all: the flag is the only setting."""
    monkeypatch.setenv("HAMI_NODELOCK_EXPIRE", "1m")
    defaults = options_from_args(build_parser().parse_args([]))
    assert defaults.node_lock_timeout_s == 300
    async with running_scheduler(api, options=embedded_options(node_lock_timeout_s=defaults.node_lock_timeout_s,
                                                               node_lock_wait_s=0), device_plugin=False) as app:
        extender = ExtenderClient(app.url)
        try:
            await register(api, app, reference_node())
            api.create("pods", gpu_pod("holder"))
            _set_lock(api, lock_value("default", "holder", now=_ago(minutes=2)))
            pod = await _filtered(api, extender, "p")
            assert await extender.bind(pod, "n1") == {"Error": CONTENTION}
        finally:
            await extender.close()


async def test_a_bind_without_a_pod_uid_is_refused_before_any_lock(api, app, extender):
    """ExtenderBindingArgs may come without PodUID (it is optional in the type). HAMi v2.11
    refuses such a bind (who it is about cannot be checked): no lock is taken, nothing is bound,
    and the reservation stays for the pod's own bind (tests/test_identity.py)."""
    await register(api, app, reference_node())
    pod = await _filtered(api, extender, "p")
    assert used_mem(app) == 1000
    _, result = await extender.post("bind", {"PodName": "p", "PodNamespace": "default", "Node": "n1"})
    assert result["Error"] == "bind request for pod default/p carries no UID"
    assert used_mem(app) == 1000 and _lock(api) is None
    assert await extender.bind(pod, "n1") == {"Error": ""}


async def test_a_second_bind_onto_a_node_this_process_just_locked_knows_the_contention_without_a_read(api, app, extender):
    """Two binds in a row onto one node, the device plugin not done with the first: the node
    watch shows the lock this process wrote for a pod the pod watch shows alive, so the second
    bind knows the contention from its books and reads neither the node nor the owner pod."""
    await register(api, app, reference_node())
    first = await _filtered(api, extender, "first")
    assert await extender.bind(first, "n1") == {"Error": ""}
    held = _lock(api)
    await wait_until(lambda: app.cache.lock_hint("n1")[0] == held, "the lock seen by the node watch")
    reads = len([r for r in api.requests if r[0] == "GET"])
    second = await _filtered(api, extender, "second")
    assert await extender.bind(second, "n1") == {"Error": CONTENTION}
    assert [r for r in list(api.requests)[reads:] if r[0] == "GET"] == []
    assert _lock(api) == held and used_mem(app) == 1000   # the second's reservation rolled back


async def test_a_lock_whose_owner_this_process_has_seen_deleted_is_read_and_taken_over(api, app, extender):
    """The shortcut holds only while the owner lives: once the pod watch shows the first pod
    gone, the next bind reads the lock, finds its owner gone, and takes it over."""
    await register(api, app, reference_node())
    first = await _filtered(api, extender, "first")
    assert await extender.bind(first, "n1") == {"Error": ""}
    api.delete("pods", "first", namespace="default")
    await wait_until(lambda: first["metadata"]["uid"] not in app.cache.pods, "the delete seen")
    second = await _filtered(api, extender, "second")
    assert await extender.bind(second, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,second")


async def test_a_fresh_lock_whose_owner_the_device_plugin_has_finished_with_is_taken_over(api, app, extender):
    """The device plugin allocated the owner (bind-phase success) but could not release the lock
    (the API server was down then): the lock guards nothing, so a bind takes it over at once
    instead of failing on contention until it expires. Upstream waits the 5 minutes. One whose
    owner is still allocating blocks as before."""
    await register(api, app, reference_node())
    done = gpu_pod("done")
    done["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    api.create("pods", done)
    busy = gpu_pod("busy")
    busy["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    api.create("pods", busy)
    _set_lock(api, lock_value("default", "busy"))
    blocked = await _filtered(api, extender, "blocked")
    assert await extender.bind(blocked, "n1") == {"Error": CONTENTION}
    _set_lock(api, lock_value("default", "done"))
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,p")


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _allocating_pod(name: str, *, created: datetime, phase: str = "Pending") -> dict:
    pod = gpu_pod(name)
    pod["metadata"]["creationTimestamp"] = _stamp(created)
    pod["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    pod["status"] = {"phase": phase}
    return pod


def _pod_reads(api, name: str, since: int) -> list:
    return [r for r in list(api.requests)[since:] if r[0] == "GET" and r[1].endswith(f"/pods/{name}")]


async def test_an_expired_lock_is_not_handed_over_while_its_owner_still_waits_to_be_allocated(api, app, extender):
    """Inventory: lock-expiry-awaiting-allocation (HAMi #3127)

    The device plugin learns whom it allocates for from the lock: handing an expired lock to
    another pod while its owner is still Pending with bind-phase ``allocating`` would give the
    owner that pod's devices. Once the owner's allocation is done, the lock is taken over."""
    await register(api, app, reference_node())
    api.create("pods", _allocating_pod("holder", created=_ago(minutes=10)))
    _set_lock(api, lock_value("default", "holder", now=_ago(minutes=6)))
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {
        "Error": "node n1 lock expired while default/holder still waits to be allocated"}
    assert _lock(api).endswith(",default,holder") and used_mem(app) == 0
    api.patch("pods", "holder", {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, namespace="default")
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,p")


@pytest.mark.parametrize("case", ["created after the lock", "running", "gone"])
async def test_an_expired_lock_is_taken_over_from_an_owner_that_no_longer_waits(api, app, extender, case):
    """Inventory: lock-expiry-awaiting-allocation

    A pod of the owner's name created after the lock was taken is another pod (the lock's owner
    was deleted and its name reused); a Running owner was allocated; a deleted one waits for
    nothing."""
    await register(api, app, reference_node())
    if case == "created after the lock":
        api.create("pods", _allocating_pod("holder", created=_ago(minutes=1)))
    elif case == "running":
        api.create("pods", _allocating_pod("holder", created=_ago(minutes=10), phase="Running"))
    _set_lock(api, lock_value("default", "holder", now=_ago(minutes=6)))
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _lock(api).endswith(",default,p")


async def test_the_books_answer_for_an_expired_locks_owner_they_know(api, app, extender):
    """Inventory: lock-expiry-awaiting-allocation

    The owner bound by this scheduler, its device plugin silent (bind-phase still
    ``allocating``), created before the lock: the books know it still waits, so the lock is
    refused without reading the pod. Once the watch shows its allocation done, the books say so
    and the lock is taken over, again without a read of the owner."""
    await register(api, app, reference_node())
    holder = gpu_pod("holder", gpumem=1000)
    holder["metadata"]["creationTimestamp"] = _stamp(_ago(minutes=10))
    holder = api.create("pods", holder)
    assert (await extender.filter(holder, ["n1"]))["NodeNames"] == ["n1"]
    assert await extender.bind(holder, "n1") == {"Error": ""}
    uid = holder["metadata"]["uid"]
    await wait_until(lambda: app.cache.pods[uid].state.value == "bound", "the bind seen by the watch")
    _set_lock(api, lock_value("default", "holder", now=_ago(minutes=6)))
    await wait_until(lambda: (app.cache.lock_hint("n1") or ("",))[0] == _lock(api), "the old lock seen")
    since = len(api.requests)
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {
        "Error": "node n1 lock expired while default/holder still waits to be allocated"}
    assert _pod_reads(api, "holder", since) == []
    api.patch("pods", "holder", {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, namespace="default")
    await wait_until(lambda: app.cache.pods[uid].state.value == "allocated", "the allocation seen")
    since = len(api.requests)
    assert (await extender.filter(pod, ["n1"]))["NodeNames"] == ["n1"]
    assert await extender.bind(pod, "n1") == {"Error": ""}
    assert _pod_reads(api, "holder", since) == []
    assert _lock(api).endswith(",default,p")


async def test_the_lock_time_is_written_as_rfc3339_nano_and_rfc3339_still_reads(api, app, extender):
    """Inventory: lock-time-format (HAMi #3127)

    Go's RFC3339Nano: nanoseconds, trailing zeros trimmed, no fraction on a whole second. A lock
    written as RFC3339 (older schedulers) or with a nanosecond fraction reads alike."""
    assert rfc3339_nano(ns=1_791_547_200_123_456_789) == "2026-10-09T12:00:00.123456789Z"
    assert rfc3339_nano(ns=1_791_547_200_120_000_000) == "2026-10-09T12:00:00.12Z"
    assert rfc3339_nano(ns=1_791_547_200_000_000_000) == "2026-10-09T12:00:00Z"
    assert rfc3339_nano(datetime(2026, 10, 9, 12, 0, 0, 500, tzinfo=timezone.utc)) == "2026-10-09T12:00:00.0005Z"
    nano, _, _ = parse_lock("2026-10-09T12:00:00.123456789Z,default,p")
    plain, ns, name = parse_lock("2026-10-09T12:00:00Z,default,p")
    assert (nano - plain).total_seconds() == pytest.approx(0.123456) and (ns, name) == ("default", "p")
    await register(api, app, reference_node())
    pod = await _filtered(api, extender, "p")
    assert await extender.bind(pod, "n1") == {"Error": ""}
    stamp = _lock(api).split(",")[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z", stamp), stamp
    assert abs((datetime.now(timezone.utc) - parse_lock(_lock(api))[0]).total_seconds()) < 60

"""Checks and harnesses shared by the fault, concurrency, fuzz and soak tests.

Why a recount from the API server: ``tests/conftest.py::assert_books_balance`` compares the usage
cache with the cache's own pod records. After a fault that is not enough: a missed delete, a
replayed event or a leaked reservation leaves the cache agreeing with itself and disagreeing with
the cluster. What the cluster says is what the device plugins act on and what a restarted
scheduler rebuilds from, so these helpers read every node and pod back from the fake API server,
decode the annotations without the cache, and require the cache's per-device arrays to equal that
recount, with no device charged beyond its capacity.

One legitimate difference: /filter writes nothing, so a reservation it made reaches the pod only
with its Binding. Such a reservation (not seen back from the watch yet) is counted from the cache's
record instead of the annotations, but only for a pod that the API server has, with the same UID,
not bound elsewhere and not terminated: a reservation for any other pod is a leak, and fails the
check. Compare only when no extender request is in flight.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

from hami_py.cache.usage import VGPU_NODE_ANNOTATION, PodState, collapse
from hami_py.podshape import pod_shape
from hami_py.devices.base import AllocationDecodeError, DeviceDecodeError, NodeView
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient, Placement
from tests.conftest import assert_books_balance

TERMINAL_PHASES = ("Succeeded", "Failed")
Usage = tuple[int, int, int]   # (slots, memory MiB, cores %) on one device


def registered_devices(api, app) -> dict[str, dict[str, dict]]:
    """node -> device UUID -> capacity, decoded from the nodes' registrations as the API has them."""
    selector = app.cache.node_selector
    nodes: dict[str, dict[str, dict]] = {}
    for node in api.list("nodes"):
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        devices: dict[str, dict] = {}
        for vendor in app.vendors.values():
            try:
                found = vendor.parse_node_devices(NodeView.from_node(node))
            except DeviceDecodeError:
                continue   # a garbled registration registers nothing for that vendor
            for dev in found:
                devices.setdefault(dev.id, {"count": dev.count, "devmem": dev.devmem, "devcore": dev.devcore})
        nodes[meta["name"]] = devices
    return nodes


def pending_reservations(api, app) -> dict[str, object]:
    """UID -> the cache's record, for every reservation of the scheduler's own /filter that the
    watch has not shown back yet (the decision travels with the Binding), whose pod the API
    server has with that UID, unbound or bound to the reservation's node, and not terminated."""
    pods = {(p.get("metadata") or {}).get("uid"): p for p in api.list("pods")}
    out = {}
    for uid, rec in app.cache.pods.items():
        if rec.state not in (PodState.RESERVED, PodState.BOUND_UNSEEN):
            continue
        pod = pods.get(uid)
        if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        if (pod.get("spec") or {}).get("nodeName") not in (None, rec.node):
            continue
        out[uid] = rec
    return out


def usage_from_annotations(api, app, *, bound_only: bool = False, only: set[str] | None = None,
                           reservations: dict | None = None) -> dict[str, dict[str, Usage]]:
    """node -> device UUID -> usage, summed over every live pod's allocation annotation.

    A pod counts when it carries ``hami.io/vgpu-node`` and is not Succeeded/Failed (and with
    ``bound_only``, when it is bound to that node: what runs on the devices; with ``only``, when
    its name is in that set); its devices
    are collapsed over its containers (init containers folded in) as the scheduler charges them.
    Only devices the named node registers can be charged, so only those are summed.
    ``reservations`` (pending_reservations): pods whose reservation is counted from the record,
    in place of whatever their annotations say."""
    registered = registered_devices(api, app)
    totals: dict[str, dict[str, list[int]]] = {name: {} for name in registered}
    reservations = reservations or {}
    for pod in api.list("pods"):
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if (rec := reservations.get(meta.get("uid"))) is not None:
            if rec.node in registered and (only is None or meta.get("name") in only):
                for entry in rec.entries:
                    if entry.uuid in registered[rec.node]:
                        t = totals[rec.node].setdefault(entry.uuid, [0, 0, 0])
                        t[0] += entry.slots
                        t[1] += entry.mem
                        t[2] += entry.cores
            continue
        node = annotations.get(VGPU_NODE_ANNOTATION)
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES or node not in registered:
            continue
        if bound_only and (pod.get("spec") or {}).get("nodeName") != node:
            continue
        if only is not None and meta.get("name") not in only:
            continue
        shape = pod_shape(pod)
        try:
            entries = [entry for key, vendor in app.vendors.items()
                       for entry in collapse(vendor.decode_allocation(annotations) or [], key, shape)]
        except AllocationDecodeError:
            continue   # a garbled allocation charges nothing
        for entry in entries:
            if entry.uuid not in registered[node]:
                continue
            t = totals[node].setdefault(entry.uuid, [0, 0, 0])
            t[0] += entry.slots
            t[1] += entry.mem
            t[2] += entry.cores
    return {node: {uuid: tuple(v) for uuid, v in devs.items()} for node, devs in totals.items()}


def cache_usage(app) -> dict[str, dict[str, Usage]]:
    """node -> device UUID -> usage as the cache's arrays hold it."""
    out: dict[str, dict[str, Usage]] = {}
    for node in app.cache.nodes:
        devs: dict[str, list[int]] = {}
        for d in app.cache.device_usage(node):
            t = devs.setdefault(d["id"], [0, 0, 0])
            t[0] += d["used"]
            t[1] += d["usedmem"]
            t[2] += d["usedcores"]
        out[node] = {uuid: tuple(v) for uuid, v in devs.items()}
    return out


def books_mismatch(api, app, *, only: set[str] | None = None) -> list[str]:
    """Every difference between the cache and the recount from annotations ([] when they agree);
    ``only``: the pods whose annotations should be charged (all when None)."""
    expected = usage_from_annotations(api, app, only=only, reservations=pending_reservations(api, app))
    actual = cache_usage(app)
    problems = []
    if set(expected) != set(actual):
        problems.append(f"nodes: API has {sorted(expected)}, cache has {sorted(actual)}")
    for node in sorted(set(expected) & set(actual)):
        for uuid in sorted(set(expected[node]) | set(actual[node])):
            want = expected[node].get(uuid, (0, 0, 0))
            have = actual[node].get(uuid, (0, 0, 0))
            if want != have:
                problems.append(f"{node}/{uuid}: annotations say {want}, cache says {have}")
    return problems


def explain_mismatch(api, app) -> str:
    """The cache's pod records next to what the API server has for the same pods."""
    by_uid = {p["metadata"]["uid"]: p for p in api.list("pods")}
    lines = ["cache records (uid name node rv reserved entries) vs the API's pod:"]
    for uid, rec in app.cache.pods.items():
        pod = by_uid.get(uid)
        shown = "GONE" if pod is None else (
            f"rv={pod['metadata'].get('resourceVersion')} phase={pod['status'].get('phase')} "
            f"node={pod['spec'].get('nodeName')} "
            f"ann={ {k: v for k, v in (pod['metadata'].get('annotations') or {}).items() if k.startswith('hami.io/vgpu')} }")
        entries = [(e.uuid[-6:], e.mem, e.cores, e.slots) for e in rec.entries]
        lines.append(f"  {uid[:8]} {rec.name} {rec.node} {rec.resource_version} {rec.state.value} {entries} | {shown}")
    lines.append(f"released: { {uid[:8]: node for uid, (node, _) in app.cache.released.items()} }")
    return "\n".join(lines)


def oversubscribed(api, app, *, bound_only: bool = False) -> list[str]:
    """Devices charged beyond their capacity, by the cluster's annotations or by the cache
    (``bound_only``: by the annotations of bound pods only, and not by the cache)."""
    capacity = registered_devices(api, app)
    problems = []
    sources = [("annotations", usage_from_annotations(api, app, bound_only=bound_only))]
    if not bound_only:
        sources.append(("cache", cache_usage(app)))
    for source, usage in sources:
        for node, devs in usage.items():
            for uuid, (slots, mem, cores) in devs.items():
                cap = capacity.get(node, {}).get(uuid)
                if cap is None:
                    continue
                # (A garbled registration may claim a negative capacity: holding nothing of it is fine.)
                if (slots > 0 and slots > cap["count"]) or (mem > 0 and mem > cap["devmem"]) \
                        or (cores > 0 and cores > max(cap["devcore"], 100)):
                    problems.append(f"{source}: {node}/{uuid} holds {(slots, mem, cores)} of "
                                    f"{(cap['count'], cap['devmem'], cap['devcore'])}")
    return problems


async def wait_books_balance(api, app, *, timeout: float = 10.0, check_capacity: bool = True) -> None:
    """Wait (with a deadline) until the cache equals the recount from annotations, then require
    that nothing is oversubscribed and that the cache agrees with its own pod records."""
    deadline = time.monotonic() + timeout
    while problems := books_mismatch(api, app):
        if time.monotonic() > deadline:
            raise AssertionError("usage books do not balance after %.0fs:\n  %s\n%s" % (
                timeout, "\n  ".join(problems), explain_mismatch(api, app)))
        await asyncio.sleep(0.01)
    if check_capacity:
        over = oversubscribed(api, app)
        assert not over, "oversubscribed:\n  " + "\n  ".join(over)
        assert_books_balance(app)
    else:
        assert_cache_agrees_with_its_records(app)


def assert_cache_agrees_with_its_records(app) -> None:
    """``assert_books_balance`` without the capacity check (for a registration that shrank)."""
    cache = app.cache
    recount = cache.recount()
    for j, dev_id in enumerate(cache.device_ids):
        if dev_id and cache.vendor[j] >= 0:
            assert (cache.used[j], cache.used_mem[j], cache.used_cores[j]) == recount.get(dev_id, (0, 0, 0)), dev_id


async def schedule_with_retries(extender: ExtenderClient, api, pod: dict, node_names: list[str], *,
                                attempts: int = 20) -> Placement:
    """What kube-scheduler does with a pod: filter then bind, again after an error, until the pod
    is placed or is plainly unschedulable (no node fits, no error). Like kube-scheduler, it
    looks at the pod before each retry: a pod that is bound after all (a bind whose answer was
    lost) or gone is not scheduled again."""
    meta = pod["metadata"]
    last = Placement(None, None, "")
    for attempt in range(attempts):
        if attempt:
            stored = api.get("pods", meta["name"], namespace=meta["namespace"])
            if stored is None or stored["metadata"]["uid"] != meta["uid"]:
                return last
            if stored["spec"].get("nodeName"):
                return Placement(stored["spec"]["nodeName"], None, "")
            await asyncio.sleep(0.01)   # kube-scheduler's backoff, shortened
        last = await extender.schedule(pod, node_names)
        if last.node is not None or not last.error:
            return last
    return last


def finish_allocation(api, name: str, node: str, *, namespace: str = "default") -> None:
    """Do the device plugin's half of a bind in-process, where it cannot fail: mark the pod
    allocated and release the node lock it holds."""
    api.patch("pods", name, {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, namespace=namespace)
    lock = (api.get("nodes", node) or {}).get("metadata", {}).get("annotations", {}).get("hami.io/mutex.lock", "")
    if lock.endswith(f",{namespace},{name}"):
        api.patch("nodes", node, {"metadata": {"annotations": {"hami.io/mutex.lock": None}}})


async def wait_lock_free(api, node: str, *, timeout: float = 10.0) -> None:
    """Wait until no pod holds the node's bind lock (the simulated device plugin releases it)."""
    await wait_for(lambda: "hami.io/mutex.lock" not in (api.get("nodes", node) or {}).get("metadata", {})
                   .get("annotations", {}), timeout=timeout, what=f"node {node} lock released")


class LoopCluster:
    """A fake API server, a scheduler with a simulated device plugin and an extender client, on a
    private event loop, so synchronous hypothesis tests (stateful machines, ``@given``) can drive
    a real cluster over HTTP with ``cluster.run(coroutine)``."""

    def __init__(self, *, options=None, history_limit: int = 10000, device_plugin: bool = True,
                 podgroups: bool = False):
        self.options = options or embedded_options()
        self.podgroups = podgroups     # the API server serves scheduler-plugins' PodGroup CRD
        self.history_limit = history_limit
        self.device_plugin = device_plugin
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stack: AsyncExitStack | None = None
        self._app_stack: AsyncExitStack | None = None
        self.api: FakeApiServer | None = None
        self.app = None
        self.extender: ExtenderClient | None = None

    def run(self, coro, *, timeout: float = 120.0):
        """Run ``coro`` on the cluster's loop; a hang fails the test instead of stalling the suite."""
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def __enter__(self) -> "LoopCluster":
        self.loop = asyncio.new_event_loop()
        try:
            self.run(self._start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        self._stack = AsyncExitStack()
        self.api = FakeApiServer(history_limit=self.history_limit, podgroups=self.podgroups)
        await self.api.start()
        self._stack.push_async_callback(self.api.stop)
        self._stack.push_async_callback(self._stop_scheduler)
        await self._start_scheduler()

    async def _start_scheduler(self) -> None:
        self._app_stack = AsyncExitStack()
        self.app = await self._app_stack.enter_async_context(
            running_scheduler(self.api, options=self.options, device_plugin=self.device_plugin))
        self.extender = ExtenderClient(self.app.url)
        self._app_stack.push_async_callback(self.extender.close)

    async def _stop_scheduler(self) -> None:
        if self._app_stack is not None:
            await self._app_stack.aclose()
            self._app_stack = None

    async def restart_scheduler(self) -> None:
        """Stop the scheduler and start a new one on the same API server (a new process would
        rebuild its books the same way: from the lists)."""
        await self._stop_scheduler()
        await self._start_scheduler()

    def __exit__(self, *exc) -> None:
        try:
            if self._stack is not None:
                self.run(self._stack.aclose())
            # Server-side handlers of connections the tests cut may still be parked: end them.
            self.loop.run_until_complete(_cancel_leftovers())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


async def _cancel_leftovers() -> None:
    current = asyncio.current_task()
    leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)

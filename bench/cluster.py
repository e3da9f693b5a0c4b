"""The benchmark's cluster process: the in-repo fake API server plus a small control port.

Why a process of its own: the scheduler under test runs in its own process, and the load
generator (bench/__main__.py) in a third, so neither the API server's work (seeding 40 000 pods,
rendering watch events) nor the load generator's shares an event loop or the GIL with the
scheduler. Everything the benchmark does *to the cluster* happens here, in-process and
synchronously (``api.create`` and friends), through the control port:

    POST /seed      {nodes, pods, probe_nodes, seed, layout}   seed before the scheduler starts
    POST /pending   {prefix, count, gpus, gpumem, gpucores, annotations, families}  create pods to
                    schedule (``families``: pod i asks for families[i % len], null = NVIDIA)
    POST /allocate  {namespace, name, node}             the device plugin's half of a bind
    POST /delete    {namespace, name}                   delete a pod; answers when it was committed
    POST /blocker   {node_index, gpu}                   re-create a probe node's blocker pod
    POST /cleanup   {namespace, names}                  delete many pods (between measurements)
    POST /burst     {pods, nodes, then_delete}          add+update+delete ``pods`` pods in one go
    POST /load      {rate, seconds, nodes}              start a steady stream of pod events
    GET  /load                                          how far that stream got
    GET  /stats                                         resourceVersion, writes by others, open watches

Once seeded it also plays every node's device plugin heartbeat (``PluginHeartbeats``); what it
writes on its own (heartbeats, churn pods) is bench/churn.py, counted apart from the scheduler's.

Times in answers are ``time.monotonic()``: CLOCK_MONOTONIC is one clock for every process on the
machine, so the load generator can subtract them from its own readings.

    python -m bench.cluster        prints {"api": URL, "control": URL} on one line, then serves
                                   until SIGTERM, SIGINT or its standard input closes
"""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import threading
import time

import orjson
from aiohttp import web

from bench.churn import CHURN_NAMESPACE, ChurnPods, CountingApi, EventStream, PluginHeartbeats, handshake_key
from bench.seed import (
    BENCH_NAMESPACE, FAMILY_LIMITS, ClusterShape, blocker_pod, build_nodes, build_placed_pods, node_name, pending_pod, place,
    realistic_pod,
)
from hami_py.devices.base import ContainerDevice
from hami_py.fakeapi import ApiError, FakeApiServer
from hami_py.fakeapi.objects import gpu_uuid
from hami_py.k8s.client import api_resource
from hami_py.k8s.nodelock import LOCK_ANNOTATION, lock_value
from hami_py.k8s.requeue import REQUEUE_ANNOTATION
from hami_py.logs import configure_logging

HISTORY_LIMIT = 50_000    # watch history kept: a watch re-opened mid-burst resumes instead of relisting


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=orjson.dumps({"error": message}).decode(), content_type="application/json")


async def _args(request: web.Request) -> dict:
    body = await request.read()
    try:
        args = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise _bad_request(f"control request body is not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise _bad_request("control request body must be a JSON object")
    return args


def _int_arg(args: dict, name: str, *, default: int | None = None, low: int = 0) -> int:
    value = args.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _bad_request(f"{name} must be an integer ≥ {low}, not {value!r}")
    return value


class ClusterControl:
    def __init__(self, api: FakeApiServer):
        self.api = CountingApi(api)
        self.stream: EventStream | None = None
        self.heartbeats: PluginHeartbeats | None = None
        self.serial = 0          # churn pod names, shared by bursts and streams
        self.replay: dict | None = None

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/seed", self.seed), web.post("/pending", self.pending),
                web.post("/allocate", self.allocate), web.post("/delete", self.delete),
                web.post("/blocker", self.blocker), web.post("/hang-lock", self.hang_lock),
                web.post("/cleanup", self.cleanup), web.post("/burst", self.burst),
                web.post("/load", self.start_load), web.get("/load", self.load_status),
                web.post("/replay", self.start_replay), web.get("/replay", self.replay_status),
                web.get("/stats", self.stats), web.post("/heartbeats", self.set_heartbeats),
                web.post("/requests/reset", self.reset_requests), web.get("/requests", self.request_counts),
                web.post("/faults", self.set_faults)]

    async def set_faults(self, request: web.Request) -> web.Response:
        """``{"delay": s, "methods": [...]}``: delay every request of those methods (the writes)
        by ``s`` seconds before it is served; ``{"clear": true}``: none any more."""
        args = await _args(request)
        faults = self.api.api.faults
        if args.get("clear"):
            faults.clear()
        else:
            try:
                delay = float(args["delay"])
                methods = [str(m).upper() for m in args["methods"]]
            except (KeyError, TypeError, ValueError):
                raise _bad_request("faults need delay (seconds) and methods, or clear") from None
            for method in methods:
                faults.add(method=method, delay=delay, times=None)
        return _json({"ok": True})

    async def set_heartbeats(self, request: web.Request) -> web.Response:
        if self.heartbeats is not None:
            self.heartbeats.paused = bool((await _args(request)).get("paused"))
        return _json({"ok": True})

    async def reset_requests(self, _: web.Request) -> web.Response:
        self.api.api.requests.clear()
        self._reset_rv = self.api.api._store.rv
        return _json({"ok": True})

    async def request_counts(self, _: web.Request) -> web.Response:
        """The API requests served over HTTP since the reset (the scheduler's: the cluster's own
        writes are in-process), by method and resource; watches apart. The node patches that are
        upkeep, not a pod's (handshake stamps the registration keeper owed from before the
        heartbeats were paused, requeue writes), are told from the commits and counted apart."""
        counts: dict[str, int] = {}
        for method, path, query in self.api.api.requests:
            watch = "watch=true" in query or "watch=1" in query
            key = f"{'WATCH' if watch else method} {api_resource(path)}"
            counts[key] = counts.get(key, 0) + 1
        for kind, n in self._upkeep_commits().items():
            if n:
                counts["PATCH nodes"] = counts.get("PATCH nodes", 0) - n
                counts[f"PATCH nodes ({kind})"] = n
        return _json(counts)

    def _upkeep_commits(self) -> dict[str, int]:
        found = {"handshake stamps": 0, "requeue writes": 0}
        for entry in self.api.api._store.history["nodes"]:
            if entry.rv <= getattr(self, "_reset_rv", 0) or entry.type != "MODIFIED" or entry.prev is None:
                continue
            new = entry.obj["metadata"].get("annotations") or {}
            old = entry.prev["metadata"].get("annotations") or {}
            changed = {k for k in new.keys() | old.keys() if new.get(k) != old.get(k)}
            if changed and all(k.startswith("hami.io/node-handshake") and str(new.get(k, "")).startswith("Requesting_")
                               for k in changed):
                found["handshake stamps"] += 1
            elif changed == {REQUEUE_ANNOTATION}:
                found["requeue writes"] += 1
        return found

    async def seed(self, request: web.Request) -> web.Response:
        args = await _args(request)
        try:
            shape = ClusterShape(nodes=_int_arg(args, "nodes", low=1), pods=_int_arg(args, "pods"),
                                 probe_nodes=_int_arg(args, "probe_nodes", default=0),
                                 seed=_int_arg(args, "seed", default=1), layout=args.get("layout", "nvidia"))
        except ValueError as exc:
            raise _bad_request(str(exc)) from None
        t0 = time.monotonic()
        nodes = build_nodes(shape)
        for node in nodes:
            self.api.create("nodes", node)
        pods = 0
        for pod in build_placed_pods(shape):
            self.api.create("pods", pod)
            pods += 1
        if self.heartbeats is None:
            self.heartbeats = PluginHeartbeats(self.api, nodes=[n["metadata"]["name"] for n in nodes],
                                               handshakes={n["metadata"]["name"]: handshake_key(n) for n in nodes})
            self.heartbeats.start()
        return _json({"nodes": shape.nodes, "pods": pods, "seconds": time.monotonic() - t0,
                      "resource_version": self.api.api.resource_version})

    async def pending(self, request: web.Request) -> web.Response:
        args = await _args(request)
        prefix = args.get("prefix")
        if not isinstance(prefix, str) or not prefix:
            raise _bad_request("prefix must be a non-empty string")
        annotations = args.get("annotations") or {}
        if not isinstance(annotations, dict):
            raise _bad_request("annotations must be an object")
        count = _int_arg(args, "count", low=1)
        families = args.get("families") or [None]
        if not isinstance(families, list) or any(f is not None and f not in FAMILY_LIMITS for f in families):
            raise _bad_request(f"families must be a list of null (NVIDIA) or {', '.join(FAMILY_LIMITS)}")
        created = []
        for i in range(count):
            pod = pending_pod(f"{prefix}-{i:06d}", gpus=_int_arg(args, "gpus", default=1, low=1),
                              gpumem=_int_arg(args, "gpumem", default=4096),
                              gpucores=_int_arg(args, "gpucores", default=10), annotations=annotations,
                              family=families[i % len(families)])
            created.append(self.api.create("pods", pod))
        return _json(created)

    async def allocate(self, request: web.Request) -> web.Response:
        """What HAMi's device plugin does once the pod is bound: mark it allocated, free the lock."""
        args = await _args(request)
        namespace, name, node = args.get("namespace"), args.get("name"), args.get("node")
        try:
            self.api.patch("pods", name, {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}},
                           namespace=namespace)
            current = self.api.get("nodes", node) or {}
            meta = current.get("metadata") or {}
            if (meta.get("annotations") or {}).get(LOCK_ANNOTATION, "").endswith(f",{namespace},{name}"):
                self.api.patch("nodes", node, {"metadata": {"annotations": {LOCK_ANNOTATION: None},
                                                            "resourceVersion": meta.get("resourceVersion")}})
        except ApiError as exc:
            return _json({"error": exc.message}, status=exc.code)
        return _json({"ok": True})

    async def delete(self, request: web.Request) -> web.Response:
        args = await _args(request)
        try:
            self.api.delete("pods", args.get("name", ""), namespace=args.get("namespace"))
        except ApiError as exc:
            return _json({"error": exc.message}, status=exc.code)
        return _json({"t": time.monotonic()})

    async def blocker(self, request: web.Request) -> web.Response:
        """(Re-)create the pod that fills GPU ``gpu`` of probe node ``node_index``."""
        args = await _args(request)
        node_index, gpu = _int_arg(args, "node_index"), _int_arg(args, "gpu")
        pod = blocker_pod(node=node_name(node_index), index=node_index, gpu=gpu)
        try:
            created = self.api.create("pods", pod)
        except ApiError as exc:
            return _json({"error": exc.message}, status=exc.code)
        return _json({"t": time.monotonic(), "name": created["metadata"]["name"]})

    async def hang_lock(self, request: web.Request) -> web.Response:
        """A device plugin that hangs on node ``node_index``: a pod bound there whose allocation
        never finishes (bind-phase ``allocating``) holds the node's lock, taken now. With
        ``{"release": true}`` the plugin recovers: the node's lock (whoever holds it) and the pod go."""
        args = await _args(request)
        node = node_name(_int_arg(args, "node_index"))
        name = f"hung-{node}"
        try:
            if args.get("release"):
                self.api.patch("nodes", node, {"metadata": {"annotations": {LOCK_ANNOTATION: None}}})
                if self.api.get("pods", name, namespace=BENCH_NAMESPACE) is not None:
                    self.api.delete("pods", name, namespace=BENCH_NAMESPACE)
                return _json({"ok": True})
            pod = place(realistic_pod(name, namespace=BENCH_NAMESPACE, gpus=1, gpumem=1024, gpucores=1),
                        node=node, devices=[ContainerDevice(gpu_uuid(node, 0), "NVIDIA", 1024, 1)])
            pod["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
            self.api.create("pods", pod)
            self.api.patch("nodes", node, {"metadata": {"annotations": {
                LOCK_ANNOTATION: lock_value(BENCH_NAMESPACE, name)}}})
        except ApiError as exc:
            return _json({"error": exc.message}, status=exc.code)
        return _json({"node": node, "holder": f"{BENCH_NAMESPACE}/{name}"})

    async def cleanup(self, request: web.Request) -> web.Response:
        """Delete the named pods (those already gone are skipped): resets capacity between runs."""
        args = await _args(request)
        names, namespace = args.get("names"), args.get("namespace")
        if not isinstance(names, list) or not isinstance(namespace, str):
            raise _bad_request("cleanup needs namespace (string) and names (list)")
        deleted = 0
        for name in names:
            try:
                self.api.delete("pods", name, namespace=namespace)
                deleted += 1
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return _json({"deleted": deleted})

    async def burst(self, request: web.Request) -> web.Response:
        """``pods`` pods added, then each updated, then each deleted: 3 × pods events committed in
        one synchronous stretch, so nothing reaches the watchers until all of them are queued."""
        args = await _args(request)
        count = _int_arg(args, "pods", low=1)
        nodes = args.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise _bad_request("nodes must be a non-empty list of node names")
        churn = ChurnPods(nodes)
        first = self.serial
        self.serial += count
        added = [churn.added(first + i) for i in range(count)]
        updated = [churn.updated(first + i) for i in range(count)]
        then_delete = args.get("then_delete")
        t_start = time.monotonic()
        for pod in added:
            self.api.create("pods", pod)
        for pod in updated:
            self.api.update("pods", pod)
        for i in range(count):
            self.api.delete("pods", churn.name(first + i), namespace=CHURN_NAMESPACE)
        if isinstance(then_delete, dict):   # a sentinel: seen applied means the burst was applied
            self.api.delete("pods", then_delete.get("name", ""), namespace=then_delete.get("namespace"))
        return _json({"events": 3 * count, "t_start": t_start, "t_end": time.monotonic()})

    async def start_load(self, request: web.Request) -> web.Response:
        args = await _args(request)
        nodes = args.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise _bad_request("nodes must be a non-empty list of node names")
        rate, seconds = args.get("rate"), args.get("seconds")
        if not isinstance(rate, (int, float)) or rate <= 0 or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise _bad_request("rate and seconds must be positive numbers")
        if self.stream is not None and self.stream.t_end is None:
            raise _bad_request("an event stream is already running")
        self.stream = EventStream(self.api, pods=ChurnPods(nodes), rate=float(rate), seconds=float(seconds),
                                  first_serial=self.serial)
        self.serial += 10_000_000   # more than any stream creates: the next one starts clear of it
        self.stream.start()
        return _json({"started": True})

    async def start_replay(self, request: web.Request) -> web.Response:
        """``{rate, seconds, nodes, sentinels}``: the steady stream's events (add, update, delete
        cycles), ``rate × seconds`` of them with a sentinel delete spread evenly among them, all
        committed while the scheduler's pod watch is held, then released at ``rate`` lines a
        second. This process cannot commit 20 000 events a second live (about 85 µs each); this
        measures the scheduler receiving them at that rate. Answers once the release has begun."""
        args = await _args(request)
        nodes, sentinels = args.get("nodes"), args.get("sentinels")
        rate, seconds = args.get("rate"), args.get("seconds")
        if not isinstance(nodes, list) or not nodes or not isinstance(sentinels, list):
            raise _bad_request("nodes must be a non-empty list of node names, sentinels a list")
        if not isinstance(rate, (int, float)) or rate <= 0 or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise _bad_request("rate and seconds must be positive numbers")
        fake = self.api.api
        watchers = fake.pace_watches("pods", rate=0)
        if len(watchers) != 1:
            fake.pace_watches("pods", rate=None)
            raise _bad_request(f"expected exactly one pod watch (the scheduler's), found {len(watchers)}")
        [watcher] = watchers
        stream = EventStream(self.api, pods=ChurnPods(nodes), rate=float(rate), seconds=float(seconds),
                             first_serial=self.serial)
        self.serial += 10_000_000
        total = int(rate * seconds)
        every = max(1, total // (len(sentinels) + 1))
        positions = []
        t_commit = time.monotonic()
        already = len(watcher.pending)
        for i in range(total):
            stream.step()
            if (i + 1) % every == 0 and len(positions) < len(sentinels):
                blocker = sentinels[len(positions)]
                self.api.delete("pods", blocker.get("name", ""), namespace=blocker.get("namespace"))
                positions.append(len(watcher.pending))      # its line's position in the release
            if i % 2000 == 0:
                await asyncio.sleep(0)                      # the control port and node watches go on
        stream.drain()
        queued = len(watcher.pending)
        t_commit = time.monotonic() - t_commit
        fake.pace_watches("pods", rate=float(rate))
        self.replay = {"watcher": watcher, "positions": positions, "queued": queued, "already": already,
                       "rate": float(rate), "commit_s": t_commit}
        return _json({"queued": queued, "sentinels": len(positions), "commit_s": t_commit, "t0": watcher.t0})

    async def replay_status(self, _: web.Request) -> web.Response:
        """How far the release got; once done, when each sentinel's line was written."""
        replay = self.replay
        if replay is None:
            raise _bad_request("no replay has run")
        watcher = replay["watcher"]
        done = watcher.sent >= replay["queued"] or watcher.cut
        out = {"sent": watcher.sent, "queued": replay["queued"], "done": done, "cut": watcher.cut,
               "t0": watcher.t0, "commit_s": replay["commit_s"], "rate": replay["rate"]}
        if done:
            marks = watcher.marks
            out["t_end"] = marks[-1][1] if marks else watcher.t0
            # A line at position p went out in the first write whose running count reached p.
            out["sentinel_written"] = [next((t for count, t in marks if count >= p), None)
                                       for p in replay["positions"]]
            self.api.api.pace_watches("pods", rate=None)
        return _json(out)

    async def load_status(self, _: web.Request) -> web.Response:
        if self.stream is None:
            return _json({"events": 0, "running": False, "t_start": None, "t_end": None})
        return _json(self.stream.status())

    async def stats(self, _: web.Request) -> web.Response:
        return _json({"resource_version": self.api.api.resource_version, "foreign_writes": self.api.foreign_writes,
                      "open_watches": self.api.api.open_watches})


def _stop_when_stdin_closes(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """The parent holds our stdin: when it dies, however it dies, we go too."""
    def watch() -> None:
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)
    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def serve() -> None:
    api = FakeApiServer(history_limit=HISTORY_LIMIT)
    api_url = await api.start()
    control = ClusterControl(api)
    app = web.Application(client_max_size=16 << 20)
    app.add_routes(control.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    control_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _stop_when_stdin_closes(loop, stop)
    sys.stdout.write(orjson.dumps({"api": api_url, "control": control_url}).decode() + "\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        if control.heartbeats is not None:
            await control.heartbeats.stop()
        await runner.cleanup()
        await api.stop()


def main() -> None:
    # This process only holds JSON trees, which reference counting frees. With the cyclic
    # collector on it keeps rescanning 40 000 seeded pods and every commit costs two to three
    # times as much: the stand-in API server would then limit the event rates we measure.
    gc.disable()
    configure_logging(json=True, level=logging.WARNING)
    asyncio.run(serve())


if __name__ == "__main__":
    main()

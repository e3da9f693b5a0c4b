"""The filter+bind throughput row of ``make bench`` (kube-scheduler's pattern) against a real
kube-apiserver instead of the in-repo stand-in.

    python -m bench.realk8s                 N=1000 nodes, P=8000 running pods, 500 pods scheduled
    python -m bench.realk8s --nodes 100 --pods 800 --schedule-pods 200 --no-docs

The same cluster as the stand-in's scenario (bench/seed.py: nodes as HAMi's device plugin
registers them, running pods placed through the scheduler's annotations), the same pods to
schedule (1 GPU, 4 GiB, 10 % cores, the ``spread`` node policy), the same load generator
(bench/load.py ``run_schedule`` with ``async_binds``: one /filter at a time, each /bind in the
background, up to 16 in flight, as kube-scheduler drives an extender), and hami-scheduler started
the same way (``python -m hami_py --kube-qps 0 --kube-burst 1000``), but:

* the API server is kube-apiserver v1.36 on etcd 3.6 (tests/realk8s.py: the binaries from
  ``$KUBEBUILDER_ASSETS`` or ../shared/k8s), with RBAC and its audit log of the scheduler's
  account on, and the scheduler runs as the ``hami-scheduler`` ServiceAccount (manifests/rbac.yaml);
* the cluster is seeded through the API (the API server resets a created pod's status, so the
  running pods are bound but Pending: the scheduler charges them the same);
* the device plugin's half of each bind (bind-phase ``success``, the node lock released by
  compare-and-set) is done over the API by this process, as admin, in the background, where the
  stand-in's cluster process did it in-process.

It prints the row, writes bench/results-real-k8s.json, and (unless ``--no-docs``) rewrites the
block between its markers in docs/BENCHMARKS.md, beside the stand-in's row from bench/results.json.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from bench.load import run_schedule, summarize_ms
from bench.procs import REPO_ROOT, SchedulerProcess, process_cpu_seconds
from bench.seed import BENCH_NAMESPACE, NAMESPACES, ClusterShape, build_nodes, build_placed_pods, pending_pod
from hami_py.k8s.client import KubeClient, load_configuration, pod_path
from hami_py.k8s.nodelock import NodeLocker

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results-real-k8s.json"
DOCS = REPO_ROOT / "docs" / "BENCHMARKS.md"
BEGIN = "<!-- bench-real-k8s:begin (written by `python -m bench.realk8s`; edit outside these markers) -->"
END = "<!-- bench-real-k8s:end -->"
SEED_IN_FLIGHT = 32


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class ApiDevicePlugin:
    """The device plugin's half of a bind over the API, with bench/load.py's ``cluster.call``
    signature (``POST /allocate {namespace, name, node}``)."""

    def __init__(self, client: KubeClient):
        self.client = client
        self.locker = NodeLocker(client)
        self.allocated = 0

    async def call(self, method: str, path: str, body: dict) -> dict:
        assert (method, path) == ("POST", "/allocate"), (method, path)
        ns, name, node = body["namespace"], body["name"], body["node"]
        await self.client.patch(pod_path(ns, name), {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}})
        if not await self.locker.release(node, ns, name):
            raise RuntimeError(f"node {node}: the lock of {ns}/{name} could not be released")
        self.allocated += 1
        return {}


async def _bounded(coros, limit: int) -> list:
    slots = asyncio.Semaphore(limit)

    async def one(coro):
        async with slots:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))


async def seed(client: KubeClient, plane, shape: ClusterShape) -> dict:
    """Nodes and running pods through the API; seconds and counts."""
    for namespace in (*NAMESPACES, BENCH_NAMESPACE):
        plane.ensure_namespace(namespace)
    t0 = time.monotonic()
    await _bounded((client.post("/api/v1/nodes", node) for node in build_nodes(shape)), SEED_IN_FLIGHT)
    nodes_s = time.monotonic() - t0
    t0 = time.monotonic()
    count = 0

    async def create(pod: dict) -> None:
        nonlocal count
        await client.post(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
        count += 1

    await _bounded((create(p) for p in build_placed_pods(shape)), SEED_IN_FLIGHT)
    return {"nodes": shape.nodes, "pods": count, "nodes_s": nodes_s, "pods_s": time.monotonic() - t0}


@dataclass
class Result:
    row: dict
    seeded: dict
    ready_s: float
    settled_s: float


NODE_PATCHES = 'hami_kube_api_request_duration_seconds_count{method="PATCH",resource="nodes"}'


async def settle(scheduler: SchedulerProcess, session: aiohttp.ClientSession, *, nodes: int,
                 quiet_s: float = 0.5, timeout: float = 120.0) -> float:
    """Once synced, the scheduler stamps ``Requesting_`` on every registered node (the handshake),
    a node patch each: measure after those, when its node patches have stopped for ``quiet_s``
    (as ``make bench`` does); seconds that took."""
    t0 = time.monotonic()
    last, since = -1.0, t0
    while True:
        scheduler.check_alive()
        count = (await scheduler.metrics(session)).get(NODE_PATCHES, 0.0)
        now = time.monotonic()
        if count != last:
            last, since = count, now
        elif count >= nodes and now - since >= quiet_s:
            return since - t0
        if now - t0 > timeout:
            raise RuntimeError(f"hami-scheduler still patching nodes after {timeout}s ({count} of {nodes})")
        await asyncio.sleep(0.05)


async def measure(plane, shape: ClusterShape, *, schedule_pods: int, workdir: Path, time_limit_s: float = 120.0,
                  say=_say) -> Result:
    """Seed ``plane`` (started and prepared), start the scheduler as its ServiceAccount, schedule
    ``schedule_pods`` pods kube-scheduler's way; the row (the stand-in's fields)."""
    admin = KubeClient(await load_configuration(str(plane.admin_kubeconfig)), qps=0, burst=1000)
    scheduler = SchedulerProcess(kubeconfig=plane.sa_kubeconfig, log_path=workdir / "hami-scheduler.log")
    try:
        say(f"seeding {shape.nodes} nodes and {shape.pods} running pods through kube-apiserver")
        seeded = await seed(admin, plane, shape)
        say(f"  nodes {seeded['nodes_s']:.1f} s, pods {seeded['pods_s']:.1f} s")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            scheduler.start()
            ready_s = await scheduler.wait_ready(session, timeout=300)
            say(f"hami-scheduler ready in {ready_s:.2f} s (pid {scheduler.pid})")
            settled_s = await settle(scheduler, session, nodes=shape.nodes)
            say(f"  its handshake stamps on every node done {settled_s:.2f} s later")
            names = [n["metadata"]["name"] for n in build_nodes(shape)]
            names_raw = orjson.dumps(names)
            pods = await _bounded((admin.post(f"/api/v1/namespaces/{BENCH_NAMESPACE}/pods", pending_pod(
                f"real-ks-{i:06d}", annotations={"hami.io/node-scheduler-policy": "spread"}))
                for i in range(schedule_pods)), SEED_IN_FLIGHT)
            plugin = ApiDevicePlugin(admin)
            others = {"apiserver": plane.apiserver.pid, "etcd": plane.etcd.pid, "load generator": os.getpid()}
            before = await scheduler.metrics(session)
            cpu0 = process_cpu_seconds(scheduler.pid)
            others0 = {k: process_cpu_seconds(pid) for k, pid in others.items()}
            run = await run_schedule(session, scheduler.url, plugin, pods, names_raw, concurrency=1,
                                     time_limit_s=time_limit_s, async_binds=True)
            cpu_s = process_cpu_seconds(scheduler.pid) - cpu0
            others_s = {k: process_cpu_seconds(pid) - others0[k] for k, pid in others.items()}
            after = await scheduler.metrics(session)
            scheduler.check_alive()
        row = {"nodes": shape.nodes, "pods": shape.pods, "concurrency": 1, "mode": "kube-scheduler",
               "pods_per_s": run.bound / run.wall_s if run.wall_s else 0.0, "bound": run.bound,
               "attempted": run.attempted, "filter": summarize_ms(run.filter_latencies),
               "bind": summarize_ms(run.bind_latencies),
               "server_cpu_ms_per_pod": 1000 * cpu_s / run.bound if run.bound else float("nan"),
               "outcomes": dict(run.outcomes), "errors": dict(run.errors), "allocated": plugin.allocated,
               "api_mean_ms": _api_means(before, after),
               "cpu_ms_per_pod": {k: 1000 * v / run.bound if run.bound else float("nan") for k, v in others_s.items()}}
        return Result(row=row, seeded=seeded, ready_s=ready_s, settled_s=settled_s)
    finally:
        await scheduler.stop()
        await admin.close()


API_CALLS = (("PATCH", "pods"), ("PATCH", "nodes"), ("POST", "pods/binding"), ("GET", "pods"), ("GET", "nodes"))


def _api_means(before: dict, after: dict) -> dict[str, float]:
    """The scheduler's own mean wait per API call (``hami_kube_api_request_duration_seconds``)."""
    out = {}
    for method, resource in API_CALLS:
        key = f'{{method="{method}",resource="{resource}"}}'
        n = after.get(f"hami_kube_api_request_duration_seconds_count{key}", 0) - \
            before.get(f"hami_kube_api_request_duration_seconds_count{key}", 0)
        total = after.get(f"hami_kube_api_request_duration_seconds_sum{key}", 0) - \
            before.get(f"hami_kube_api_request_duration_seconds_sum{key}", 0)
        if n:
            out[f"{method} {resource}"] = 1000 * total / n
    return out


def _stand_in_row(nodes: int, pods: int) -> dict | None:
    try:
        results = orjson.loads((BENCH_DIR / "results.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    for cluster in results.get("clusters", []):
        if (cluster.get("nodes"), cluster.get("pods")) != (nodes, pods):
            continue
        for row in cluster.get("schedule") or []:
            if row.get("mode") == "kube-scheduler":
                return row
    return None


def _table_row(label: str, row: dict) -> str:
    return (f"| {label} | {row['pods_per_s']:.1f} | {row['bound']}/{row['attempted']} | {row['filter']['p99']:.2f} "
            f"| {row['bind']['p99']:.2f} | {row['server_cpu_ms_per_pod']:.2f} |")


def render(result: Result, *, commit: str, versions: str) -> str:
    row = result.row
    stand_in = _stand_in_row(row["nodes"], row["pods"])
    lines = [
        f"N = {row['nodes']:,} nodes × 8 GPUs, P = {row['pods']:,} running pods, "
        f"{row['attempted']} pods scheduled as kube-scheduler drives an extender (one /filter at a time, "
        "each /bind in the background); commit " + commit + ", " + versions + ".",
        "",
        "| API server | pods/s | bound | filter p99 ms | bind p99 ms | server CPU ms/pod |",
        "|---|---|---|---|---|---|",
    ]
    if stand_in is not None:
        lines.append(_table_row("in-repo stand-in (`make bench`, bench/results.json)", stand_in))
    lines.append(_table_row("kube-apiserver v1.36 + etcd 3.6 (`python -m bench.realk8s`)", row))
    errors = row.get("errors") or {}
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{n} × {text}" for text, n in errors.items())]
    if row.get("api_mean_ms"):
        lines += ["", "The scheduler's mean wait on kube-apiserver per call during the run (its "
                  "`hami_kube_api_request_duration_seconds`): " + ", ".join(
                      f"{call} {ms:.1f} ms" for call, ms in row["api_mean_ms"].items()) + ". CPU per pod bound: "
                  + ", ".join(f"{name} {ms:.1f} ms" for name, ms in row["cpu_ms_per_pod"].items())
                  + f", hami-scheduler {row['server_cpu_ms_per_pod']:.1f} ms (2 cores shared by all of them)."]
    lines += ["", f"Seeding through the API: {result.seeded['nodes']:,} nodes in {result.seeded['nodes_s']:.1f} s, "
              f"{result.seeded['pods']:,} pods in {result.seeded['pods_s']:.1f} s; hami-scheduler ready in "
              f"{result.ready_s:.2f} s, its handshake stamps on every node done {result.settled_s:.2f} s later "
              "(the run starts after them)."]
    return "\n".join(lines)


def write_docs(block: str) -> None:
    text = DOCS.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = f"{head}{BEGIN}\n{block}\n{END}{tail}"
    else:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{block}\n{END}\n"
    DOCS.write_text(text)


def _commit() -> str:
    import subprocess
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


async def main_async(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.realk8s import CONTROL_PLANE, BinariesMissing, ControlPlane, find_binaries
    try:
        binaries = find_binaries(CONTROL_PLANE)
    except BinariesMissing as exc:
        _say(str(exc))
        return 2
    shape = ClusterShape(nodes=args.nodes, pods=args.pods)
    with tempfile.TemporaryDirectory(prefix="bench-real-k8s-") as tmp:
        workdir = Path(tmp)
        plane = ControlPlane(workdir / "control-plane", binaries)
        plane.start()
        try:
            plane.prepare()
            result = await measure(plane, shape, schedule_pods=args.schedule_pods, workdir=workdir)
        finally:
            plane.stop()
    row = result.row
    print(f"real kube-apiserver, N={row['nodes']} P={row['pods']}: {row['pods_per_s']:.1f} pods/s, "
          f"bound {row['bound']}/{row['attempted']}, filter p99 {row['filter']['p99']:.2f} ms, "
          f"bind p99 {row['bind']['p99']:.2f} ms, server CPU {row['server_cpu_ms_per_pod']:.2f} ms/pod")
    versions = "kube-apiserver v1.36.2, etcd 3.6.13, " + f"{os.cpu_count()} cores"
    commit = _commit()
    RESULTS.write_bytes(orjson.dumps({"commit": commit, "versions": versions, "row": row, "seeded": result.seeded,
                                      "ready_s": result.ready_s, "settled_s": result.settled_s}, option=orjson.OPT_INDENT_2))
    if not args.no_docs:
        write_docs(render(result, commit=commit, versions=versions))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.realk8s", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--pods", type=int, default=8000)
    p.add_argument("--schedule-pods", type=int, default=500)
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/BENCHMARKS.md")
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

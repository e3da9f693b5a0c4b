"""One scenario: the production scheduler on an embedded cluster, fed the workload pod by pod.

Nothing here decides a placement. The nodes (and any pods already running) are created in the
embedded API server before the scheduler starts, so its first list sees them; then a
``ScenarioRun`` (scenario_run.py) plays the arrivals as kube-scheduler would, and the figures are
read off the scheduler's books at the end. Several scenarios share nothing, so they run in
parallel processes when there is more than one CPU.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from hami_py.app import SchedulerApp
from hami_py.config import DeviceConfig
from hami_py.devices.registry import EVERY_FAMILY
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.offline.cluster import Cluster
from hami_py.scheduling.gangs.membership import podgroup_key
from hami_py.simulate import defragment as defragmenting
from hami_py.simulate.figures import fragmentation, fragmentation_failures
from hami_py.simulate.results import DeviceState, ScenarioResult
from hami_py.simulate.scenario_run import WAIT_S, ProgressFn, ScenarioRun
from hami_py.simulate.workload import Workload


@dataclass(frozen=True)
class Scenario:
    node_policy: str
    gpu_policy: str
    defrag_every: int = 0       # run the defragmenter every this many arrivals (0: never)

    @property
    def label(self) -> str:
        return f"{self.node_policy}/{self.gpu_policy}"


class ScenarioProgress:
    """Where each scenario is, for one progress bar over all of them."""

    def __init__(self, *, scenarios: int, total: int, on_change: ProgressFn | None):
        self.done = [0] * scenarios
        self.placed = [0] * scenarios
        self.pending = [0] * scenarios
        self.replaced = [0] * scenarios
        self.total = total * scenarios
        self.on_change = on_change

    def update(self, index: int, done: int, placed: int, pending: int, replaced: int = 0) -> None:
        self.done[index], self.placed[index], self.pending[index] = done, placed, pending
        self.replaced[index] = replaced
        if self.on_change is not None:
            self.on_change(sum(self.done), self.total, sum(self.placed), sum(self.pending), sum(self.replaced))


def run_scenarios(*, cluster: Cluster, workload: Workload, scenarios: list[Scenario], device_config: DeviceConfig,
                  progress: ProgressFn | None = None) -> list[ScenarioResult]:
    """Every scenario, each on its own embedded cluster; in parallel processes when there are
    several and more than one CPU (the scenarios share nothing, and one scenario is one event
    loop, so processes are the only way to use a second core). Results come in scenario order."""
    asked = len(scenarios)
    # A run with moves is measured against the same run without them (ScenarioResult.baseline):
    # moving pods can cost later arrivals their room, and the report must say so when it does.
    baselines = [Scenario(s.node_policy, s.gpu_policy) for s in scenarios if s.defrag_every]
    scenarios = scenarios + [b for b in dict.fromkeys(baselines) if b not in scenarios]
    results = _run_all(cluster=cluster, workload=workload, scenarios=scenarios, device_config=device_config,
                       progress=progress)
    by_scenario = dict(zip(scenarios, results))
    for scenario, result in zip(scenarios[:asked], results):
        if scenario.defrag_every:
            result.baseline = by_scenario[Scenario(scenario.node_policy, scenario.gpu_policy)]
    return results[:asked]


def _run_all(*, cluster: Cluster, workload: Workload, scenarios: list[Scenario], device_config: DeviceConfig,
             progress: ProgressFn | None) -> list[ScenarioResult]:
    tracker = ScenarioProgress(scenarios=len(scenarios), total=workload.total_pods, on_change=progress)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(len(scenarios), cpus)
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return asyncio.run(_run_serially(cluster=cluster, workload=workload, scenarios=scenarios,
                                         device_config=device_config, tracker=tracker))
    context = multiprocessing.get_context("fork")
    updates = context.Queue()
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init,
                             initargs=(updates,)) as pool:
        futures = [pool.submit(_worker_run, i, cluster, workload, scenario, device_config)
                   for i, scenario in enumerate(scenarios)]
        while not all(f.done() for f in futures):
            try:
                tracker.update(*updates.get(timeout=0.1))
            except queue.Empty:
                pass
        return [f.result() for f in futures]


async def _run_serially(*, cluster: Cluster, workload: Workload, scenarios: list[Scenario],
                        device_config: DeviceConfig, tracker: ScenarioProgress) -> list[ScenarioResult]:
    results = []
    for i, scenario in enumerate(scenarios):
        def report(done: int, total: int, placed: int, pending: int, replaced: int, index: int = i) -> None:
            tracker.update(index, done, placed, pending, replaced)
        results.append(await run_scenario(cluster=cluster, workload=workload, scenario=scenario,
                                          device_config=device_config, progress=report))
    return results


_updates = None


def _worker_init(updates) -> None:
    global _updates
    _updates = updates


def _worker_run(index: int, cluster: Cluster, workload: Workload, scenario: Scenario,
                device_config: DeviceConfig) -> ScenarioResult:
    last = [0.0]

    def report(done: int, total: int, placed: int, pending: int, replaced: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 0.1:
            last[0] = now
            _updates.put((index, done, placed, pending, replaced))

    return asyncio.run(run_scenario(cluster=cluster, workload=workload, scenario=scenario,
                                    device_config=device_config, progress=report))


async def run_scenario(*, cluster: Cluster, workload: Workload, scenario: Scenario, device_config: DeviceConfig,
                       progress: ProgressFn | None = None) -> ScenarioResult:
    """Run the workload on a fresh embedded cluster under the scenario's default policies."""
    started = time.perf_counter()
    # Serving scheduler-plugins' PodGroup CRD only when the workload makes gangs of it: the
    # scheduler then watches PodGroups, as it would on such a cluster.
    api = FakeApiServer(podgroups=bool(workload.podgroups))
    await api.start()
    try:
        for node in cluster.nodes:
            api.create("nodes", node)
        for podgroup in workload.podgroups:
            api.create("podgroups", podgroup)
        existing = [api.create("pods", pod) for pod in cluster.existing_pods]
        existing_uids = [pod["metadata"]["uid"] for pod in existing]
        options = embedded_options(node_scheduler_policy=scenario.node_policy,
                                   gpu_scheduler_policy=scenario.gpu_policy, metrics_bind_address="",
                                   enable_ascend=EVERY_FAMILY.enable_ascend,
                                   enable_iluvatar=EVERY_FAMILY.enable_iluvatar)
        async with running_scheduler(api, options=options, device_config=device_config) as app:
            await wait_for(lambda: all(n in app.cache.nodes for n in cluster.node_names), timeout=WAIT_S,
                           what="the scheduler to register every node")
            # The dump's own pods are usage from the start: the peak and the per-node pod counts
            # include them.
            await wait_for(lambda: all(uid in app.cache.pods for uid in existing_uids), timeout=WAIT_S,
                           what="the scheduler to book the pods already running")
            # Each gang's PodGroup is known before its first member arrives.
            specs = app.service.gangs.book.specs
            await wait_for(lambda: all(podgroup_key(g) in specs for g in workload.podgroups), timeout=WAIT_S,
                           what="the scheduler to watch the workload's PodGroups")
            run = ScenarioRun(api=api, app=app, cluster=cluster, progress=progress,
                              defragment=defragmenting.defragment, defrag_every=scenario.defrag_every,
                              cluster_pods=existing)
            try:
                await run.play(workload)
                pending_movable = defragmenting.pending_movable(run)
            finally:
                await run.close()
            result = ScenarioResult(node_policy=scenario.node_policy, gpu_policy=scenario.gpu_policy,
                                    pods=run.outcomes, devices=device_states(app, cluster.node_names),
                                    fragmentation=fragmentation(app, workload, cluster.node_names),
                                    peak_memory_percent=run.peak_memory_percent,
                                    mean_stranded_mib=run.mean_stranded_mib, timeline=run.timeline,
                                    fragmentation_failures=fragmentation_failures(run),
                                    pending_movable=pending_movable, moves=run.moves,
                                    defrag_runs=run.defrag_runs, defrag_every=scenario.defrag_every,
                                    existing_pods=len(cluster.existing_pods),
                                    existing_on=existing_pods_per_node(run), gang_sizes=dict(workload.gang_sizes))
    finally:
        await api.stop()
    result.elapsed_s = time.perf_counter() - started
    return result


def existing_pods_per_node(run: ScenarioRun) -> dict[str, int]:
    """How many of the dump's own pods each node holds at the end: where they started, or, for
    those the defragmenter moved, where their replacements run."""
    out: dict[str, int] = {}
    moved = {(o.namespace, o.name) for o in run.moved_existing}     # a replacement keeps its name
    for pod in run.cluster_pods:
        meta = pod["metadata"]
        if (meta.get("namespace") or "default", meta["name"]) in moved:
            continue
        node = pod["spec"]["nodeName"]
        out[node] = out.get(node, 0) + 1
    for outcome in run.moved_existing:
        if outcome.node is not None:
            out[outcome.node] = out.get(outcome.node, 0) + 1
    return out


def device_states(app: SchedulerApp, node_names: list[str]) -> list[DeviceState]:
    """Every device as the scheduler's usage cache books it now."""
    cache = app.cache
    keys = {i: key for key, i in cache.vendor_ids.items()}
    out = []
    for node in node_names:
        offset = cache.nodes[node].offset
        for k, d in enumerate(cache.device_usage(node)):
            out.append(DeviceState(node=node, index=d["index"], uuid=d["id"], type=d["type"], health=d["health"],
                                   vendor=keys.get(cache.vendor[offset + k], ""),
                                   slots=d["count"], slots_used=d["used"], memory=d["totalmem"],
                                   memory_used=d["usedmem"], cores=d["totalcore"], cores_used=d["usedcores"]))
    return out

"""One scenario: the production scheduler on an embedded cluster, fed the workload pod by pod.

Nothing here decides a placement. The nodes (and any pods already running) are created in the
embedded API server before the scheduler starts, so its first list sees them; then each arriving
pod is created, sent through /filter and /bind over HTTP exactly as kube-scheduler sends it, and
finished by the simulated device plugin, which releases the node lock as HAMi's plugin does.

Time is counted in arrivals. A pod with a lifetime is deleted that many arrivals after it was
placed; the runner waits until the scheduler's cache has seen the delete, then gives the pending
pods another try (oldest first, as kube-scheduler's queue would after a pod is deleted) before
the next pod arrives. A bind waits for the previous pod's allocation: the node lock is held from
/bind until the device plugin has allocated, and kube-scheduler would retry on contention; the
wait gives the same outcome without the retries.
"""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import compress
from typing import Callable

import aiohttp

from hami_py.app import SchedulerApp
from hami_py.config import DeviceConfig
from hami_py.devices.registry import EVERY_FAMILY
from hami_py.embedded import embedded_options, running_scheduler, wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.simulate import defragment as defragmenting
from hami_py.simulate.cluster import Cluster
from hami_py.simulate.figures import fragmentation, fragmentation_failures
from hami_py.simulate.results import (
    DeviceState, PodOutcome, ScenarioResult, percent, stranded_mib, summarize_failed,
)
from hami_py.simulate.workload import Arrival, Workload


# Generous: a scheduler that answers nothing for this long is broken, not slow.
_WAIT_S = 60.0

ProgressFn = Callable[[int, int, int, int], None]   # (arrived, total, placed, pending)

class SimulationError(RuntimeError):
    """The scheduler (or the embedded cluster) failed in a way no pod outcome can describe."""


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
        self.total = total * scenarios
        self.on_change = on_change

    def update(self, index: int, done: int, placed: int, pending: int) -> None:
        self.done[index], self.placed[index], self.pending[index] = done, placed, pending
        if self.on_change is not None:
            self.on_change(sum(self.done), self.total, sum(self.placed), sum(self.pending))


def run_scenarios(*, cluster: Cluster, workload: Workload, scenarios: list[Scenario], device_config: DeviceConfig,
                  progress: ProgressFn | None = None) -> list[ScenarioResult]:
    """Every scenario, each on its own embedded cluster; in parallel processes when there are
    several and more than one CPU (the scenarios share nothing, and one scenario is one event
    loop, so processes are the only way to use a second core). Results come in scenario order."""
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
        def report(done: int, total: int, placed: int, pending: int, index: int = i) -> None:
            tracker.update(index, done, placed, pending)
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

    def report(done: int, total: int, placed: int, pending: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 0.1:
            last[0] = now
            _updates.put((index, done, placed, pending))

    return asyncio.run(run_scenario(cluster=cluster, workload=workload, scenario=scenario,
                                    device_config=device_config, progress=report))


async def run_scenario(*, cluster: Cluster, workload: Workload, scenario: Scenario, device_config: DeviceConfig,
                       progress: ProgressFn | None = None) -> ScenarioResult:
    """Run the workload on a fresh embedded cluster under the scenario's default policies."""
    started = time.perf_counter()
    api = FakeApiServer()
    await api.start()
    try:
        for node in cluster.nodes:
            api.create("nodes", node)
        for pod in cluster.existing_pods:
            api.create("pods", pod)
        options = embedded_options(node_scheduler_policy=scenario.node_policy,
                                   gpu_scheduler_policy=scenario.gpu_policy, metrics_bind_address="",
                                   enable_ascend=EVERY_FAMILY.enable_ascend,
                                   enable_iluvatar=EVERY_FAMILY.enable_iluvatar)
        async with running_scheduler(api, options=options, device_config=device_config) as app:
            await wait_for(lambda: all(n in app.cache.nodes for n in cluster.node_names), timeout=_WAIT_S,
                           what="the scheduler to register every node")
            run = _Run(api=api, app=app, cluster=cluster, progress=progress, defrag_every=scenario.defrag_every)
            try:
                await run.play(workload)
                pending_movable = defragmenting.pending_movable(run)
            finally:
                await run.close()
            result = ScenarioResult(node_policy=scenario.node_policy, gpu_policy=scenario.gpu_policy,
                                    pods=run.outcomes, devices=device_states(app, cluster.node_names),
                                    fragmentation=fragmentation(app, workload, cluster.node_names),
                                    peak_memory_percent=run.peak_memory_percent,
                                    mean_stranded_mib=run.mean_stranded_mib,
                                    fragmentation_failures=fragmentation_failures(run),
                                    pending_movable=pending_movable, moves=run.moves,
                                    defrag_runs=run.defrag_runs, defrag_every=scenario.defrag_every,
                                    existing_pods=len(cluster.existing_pods))
    finally:
        await api.stop()
    result.elapsed_s = time.perf_counter() - started
    return result


class _Run:
    """The kube-scheduler side of one scenario: arrivals, retries, lifetimes."""

    def __init__(self, *, api: FakeApiServer, app: SchedulerApp, cluster: Cluster, progress: ProgressFn | None,
                 defrag_every: int = 0):
        self.api = api
        self.app = app
        self.progress = progress
        self.extender = ExtenderClient(app.url)
        self.nodes = cluster.node_names
        self.labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in cluster.nodes}
        self.outcomes: list[PodOutcome] = []
        self.pending: list[PodOutcome] = []
        self.expiries: dict[int, list[PodOutcome]] = {}
        self.binds = 0
        self._counted: list[bool] | None = None    # devices that count towards peak usage
        self.peak_memory_percent = 0.0
        self.defrag_every = defrag_every
        self.step = 0
        self.moves = 0
        self.defrag_runs = 0
        self.arrivals: list[Arrival] = []     # in order: an outcome's arrival step is its index
        self._remaining: dict[int, int] = {}    # a moved pod's lifetime left (by id of its outcome)
        self._stranded_sum = 0       # stranded MiB summed over the arrivals (its mean is reported)
        self._stranded_samples = 0

    async def close(self) -> None:
        await self.extender.close()

    async def play(self, workload: Workload) -> None:
        self.arrivals = arrivals = workload.arrivals()
        for arrival in arrivals:
            self.step = arrival.step
            await self._expire(arrival.step)
            outcome = PodOutcome(namespace=arrival.namespace, name=arrival.name, template=arrival.template.name,
                                 arrival=arrival.step, lifetime=arrival.template.lifetime)
            self.outcomes.append(outcome)
            created = self.api.create("pods", self._manifest(arrival.manifest(), outcome.template))
            outcome.uid = created["metadata"]["uid"]
            await self.attempt(outcome, created, arrival.step)
            if self.defrag_every and (arrival.step + 1) % self.defrag_every == 0 and self.pending:
                self.defrag_runs += 1
                self.moves += await defragmenting.defragment(self, arrival.step)
            self._sample_stranded()
            if self.progress is not None:
                self.progress(arrival.step + 1, len(arrivals), self.binds, len(self.pending))
        if self.defrag_every and self.pending and arrivals:
            # Once more after the last arrival: no pod is left pending that moves could place.
            self.defrag_runs += 1
            self.moves += await defragmenting.defragment(self, arrivals[-1].step)
        await self.allocations_done()

    def _manifest(self, pod: dict, template: str) -> dict:
        # Owned by a controller of its template, so that the defragmenter may move it (and the
        # end-of-run figure of what moves could place means the same with or without it); created
        # at the simulated time of its arrival, so that "running time lost" is in arrivals and a
        # run is reproducible.
        pod["metadata"]["creationTimestamp"] = defragmenting.simulated_time(self.step)
        return defragmenting.owned_by_template(pod, template)

    # allocations_done, attempt, forget_expiry and replace are the defragmenter's hooks too
    # (simulate/defragment.py).
    def forget_expiry(self, outcome: PodOutcome, step: int) -> None:
        """A moved pod keeps what is left of its lifetime: the work it stands for does not grow
        because it moved."""
        for at, due in self.expiries.items():
            if outcome in due:
                due.remove(outcome)
                self._remaining[id(outcome)] = max(at - step, 1)
                return

    async def replace(self, outcome: PodOutcome, step: int) -> None:
        """A moved pod's replacement: the same name again, a new uid, scheduled afresh, for the
        rest of its lifetime."""
        manifest = self._manifest(self.arrivals[outcome.arrival].manifest(), outcome.template)
        created = self.api.create("pods", manifest)
        outcome.uid = created["metadata"]["uid"]
        outcome.node, outcome.devices, outcome.moved = None, [], outcome.moved + 1
        await self.attempt(outcome, created, step)

    async def allocations_done(self) -> None:
        plugin = self.app.device_plugin
        await wait_for(lambda: plugin.allocated >= self.binds, timeout=_WAIT_S, interval=0.0005,
                       what="the device plugin to finish allocating")

    async def _expire(self, step: int) -> None:
        """Delete the pods whose lifetime ends now, then retry the pending ones."""
        due = self.expiries.pop(step, [])
        if not due:
            return
        await self.allocations_done()  # a pod mid-allocation still holds its node lock
        for outcome in due:
            self.api.delete("pods", outcome.name, outcome.namespace)
            outcome.completed_at = step
        cache = self.app.cache
        await wait_for(lambda: not any(o.uid in cache.pods for o in due), timeout=_WAIT_S, interval=0.0005,
                       what="the scheduler to see completed pods deleted")
        failed_templates: dict[str, PodOutcome] = {}
        for outcome in list(self.pending):
            earlier = failed_templates.get(outcome.template)
            if earlier is not None:
                # Same template, same free capacity since its twin failed: the same answer.
                outcome.reason, outcome.failed_nodes = earlier.reason, earlier.failed_nodes
                continue
            pod = self.api.get("pods", outcome.name, outcome.namespace)
            await self.attempt(outcome, pod, step)
            if outcome.node is None:
                failed_templates[outcome.template] = outcome

    async def attempt(self, outcome: PodOutcome, pod: dict, step: int) -> None:
        outcome.attempts += 1
        candidates = self._candidates(pod)
        if not candidates:
            self._still_pending(outcome, f"0/{len(self.nodes)} nodes are available: "
                                         f"{len(self.nodes)} node(s) didn't match the pod's nodeSelector", None)
            return
        result = await self._call("filter", outcome, self.extender.filter(pod, candidates))
        names = result.get("NodeNames") or []
        if result.get("Error") or not names:
            failed = result.get("FailedNodes")
            reason = result.get("Error") or summarize_failed(failed, len(candidates))
            self._still_pending(outcome, reason, failed)
            return
        node = names[0]
        await self.allocations_done()
        bound = await self._call("bind", outcome, self.extender.bind(pod, node))
        if bound.get("Error"):
            self._still_pending(outcome, f"bind to {node} failed: {bound['Error']}", None)
            return
        self.binds += 1
        self._sample_usage()     # the peak can only rise with a bind
        outcome.node, outcome.placed_at = node, step
        outcome.reason, outcome.failed_nodes = "", None
        outcome.devices = self._devices(outcome)
        if outcome in self.pending:
            self.pending.remove(outcome)
        if outcome.lifetime:
            lifetime = self._remaining.pop(id(outcome), outcome.lifetime)
            self.expiries.setdefault(step + lifetime, []).append(outcome)

    @staticmethod
    async def _call(verb: str, outcome: PodOutcome, request) -> dict:
        """An extender call; an answer that is not an ExtenderFilterResult/BindingResult (a crash
        inside the scheduler, a dropped connection) ends the run with one clear error."""
        try:
            return await request
        except (aiohttp.ClientError, ValueError) as exc:
            raise SimulationError(f"/{verb} of pod {outcome.namespace}/{outcome.name} got no valid answer "
                                  f"from the scheduler ({type(exc).__name__}: {exc}); see the log above") from None

    def _still_pending(self, outcome: PodOutcome, reason: str, failed: dict | None) -> None:
        outcome.reason, outcome.failed_nodes = reason, failed
        if outcome not in self.pending:
            self.pending.append(outcome)

    def _candidates(self, pod: dict) -> list[str]:
        """The nodes kube-scheduler would send: those matching the pod's nodeSelector."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        if not selector:
            return self.nodes
        return [n for n in self.nodes if all(self.labels[n].get(k) == v for k, v in selector.items())]

    def _devices(self, outcome: PodOutcome) -> list[dict]:
        """The devices the pod was given, read back from its allocation annotations."""
        stored = self.api.get("pods", outcome.name, outcome.namespace) or {}
        annotations = (stored.get("metadata") or {}).get("annotations") or {}
        spec = stored.get("spec") or {}
        containers = [c.get("name", "")
                      for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]]
        entry = self.app.cache.nodes.get(outcome.node)
        by_uuid = {d.id: d for d in entry.devices} if entry else {}
        out = []
        for vendor in self.app.vendors.values():
            for position, devices in enumerate(vendor.decode_allocation(annotations) or []):
                for dev in devices:
                    info = by_uuid.get(dev.uuid)
                    out.append({"container": containers[position] if position < len(containers) else "",
                                "vendor": vendor.vendor_key, "uuid": dev.uuid, "index": info.index if info else None,
                                "type": info.type if info else dev.type,
                                "memoryMiB": dev.usedmem, "cores": dev.usedcores,
                                "coresPercent": vendor.core_share(info.devcore, dev.usedcores) if info else None})
        return out

    @property
    def mean_stranded_mib(self) -> int:
        return self._stranded_sum // self._stranded_samples if self._stranded_samples else 0

    def _sample_stranded(self) -> None:
        """Stranded memory after an arrival (results.stranded_mib, over the cache's arrays)."""
        c = self.app.cache
        self._stranded_sum += stranded_mib(health=self._counted_devices(), slots=c.count, slots_used=c.used,
                                           memory=c.total_mem, memory_used=c.used_mem, cores=c.total_cores,
                                           cores_used=c.used_cores)
        self._stranded_samples += 1

    def _sample_usage(self) -> None:
        cache = self.app.cache
        counted = self._counted_devices()
        used = sum(compress(cache.used_mem, counted))
        total = sum(compress(cache.total_mem, counted))
        self.peak_memory_percent = max(self.peak_memory_percent, percent(used, total))

    def _counted_devices(self) -> list[bool]:
        """Per cache slot: a healthy device of a known family (dead slots and unhealthy devices
        count towards no figure)."""
        cache = self.app.cache
        # The simulated cluster's devices never change once it runs: which count is fixed.
        if self._counted is None or len(self._counted) != len(cache.vendor):
            self._counted = [v >= 0 and bool(h) for v, h in zip(cache.vendor, cache.health)]
        return self._counted


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

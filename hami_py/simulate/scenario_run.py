"""The kube-scheduler side of one scenario: arrivals, retries, lifetimes.

Each arriving pod is created in the embedded API server, sent through /filter and /bind over HTTP
exactly as kube-scheduler sends it, and finished by the simulated device plugin, which releases
the node lock as HAMi's plugin does. Nothing here decides a placement.

Time is counted in arrivals. A pod with a lifetime is deleted that many arrivals after it was
placed; the run waits until the scheduler's cache has seen the delete, then gives the pending
pods another try (oldest first, as kube-scheduler's queue would after a pod is deleted) before
the next pod arrives. A bind waits for the previous pod's allocation: the node lock is held from
/bind until the device plugin has allocated, and kube-scheduler would retry on contention; the
wait gives the same outcome without the retries.

Gangs (docs/GANGS.md) are the scheduler's: a member's /filter is refused until its gang can be
placed whole, and the member whose /filter makes the plan is placed at once. kube-scheduler is
then nudged (``hami.io/requeue-time``) and retries the members it parked; here they are retried
right after that bind, so a gang is bound whole within one arrival. A refused member's answer is
its gang's, so the gang's other pending members carry it too (asking each again gives the same).

The runner (runner.py) builds a ``ScenarioRun`` and hands it simulate/defragment.py's
``defragment`` for ``--defrag-every``; the figures (figures.py) and the defragmenter read the
run, and this module imports neither of them.
"""
from __future__ import annotations

import time
from itertools import compress
from typing import Awaitable, Callable

import aiohttp
import orjson

from hami_py.app import SchedulerApp
from hami_py.embedded import wait_for
from hami_py.fakeapi import FakeApiServer
from hami_py.fakeapi.kubescheduler import ExtenderClient
from hami_py.offline.cluster import Cluster
from hami_py.simulate.results import PodOutcome, gang_refusal, percent, stranded_mib, summarize_failed
from hami_py.simulate.workload import Arrival, Workload

# Generous: a scheduler that answers nothing for this long is broken, not slow.
WAIT_S = 60.0
EPOCH = 1_767_225_600       # 2026-01-01T00:00:00Z: arrival 0 of every simulation

# (arrived, total, placed, pending, re-placed): placed counts each workload pod's first placement
# once; re-placed counts the binds of pods placed again after the defragmenter moved them.
ProgressFn = Callable[[int, int, int, int, int], None]
# Plans for the pending pods and carries the plan's moves out at an arrival; the number moved.
Defragmenter = Callable[["ScenarioRun", int], Awaitable[int]]


class SimulationError(RuntimeError):
    """The scheduler (or the embedded cluster) failed in a way no pod outcome can describe."""


def simulated_time(step: int) -> str:
    """The wall-clock stamp of arrival ``step``: one second per arrival."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH + step))


def owned_by_template(pod: dict, template: str) -> dict:
    """The pod as a controller of its template would have made it (ownerReferences set)."""
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": template,
                                           "uid": f"simulated-{template}", "controller": True}]
    return pod


class ScenarioRun:
    """The kube-scheduler side of one scenario: arrivals, retries, lifetimes."""

    def __init__(self, *, api: FakeApiServer, app: SchedulerApp, cluster: Cluster, progress: ProgressFn | None,
                 defragment: Defragmenter, defrag_every: int = 0, cluster_pods: list[dict] = ()):
        self.api = api
        self.app = app
        self.progress = progress
        self.extender = ExtenderClient(app.url)
        self.nodes = cluster.node_names
        self.labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in cluster.nodes}
        self.outcomes: list[PodOutcome] = []
        # The dump's own pods that the defragmenter moved: their replacements, which the dump
        # pod's owner would have made (never workload pods: no figure of the workload counts them,
        # but one that finds no room again is pending like any other pod).
        self.moved_existing: list[PodOutcome] = []
        self.budgets = cluster.budgets      # the dump's PodDisruptionBudgets (objects)
        self.cluster_pods = list(cluster_pods)  # the dump's own pods, as created at the start
        self._manifests: dict[int, dict] = {}   # a moved dump pod's replacement manifest (by id of its outcome)
        self.pending: list[PodOutcome] = []
        self.expiries: dict[int, list[PodOutcome]] = {}
        self.placed = 0          # workload pods placed (the first time)
        self.replaced = 0        # binds of moved pods' replacements
        self._counted: list[bool] | None = None    # devices that count towards peak usage
        self.peak_memory_percent = 0.0
        self.defrag_every = defrag_every
        self.defragment = defragment     # simulate/defragment.py's, handed in by the runner
        self.step = 0
        self.moves = 0
        self.defrag_runs = 0
        self.arrivals: list[Arrival] = []     # in order: an outcome's arrival step is its index
        self._remaining: dict[int, int] = {}    # a moved pod's lifetime left (by id of its outcome)
        # (arrivals so far, pods pending, stranded MiB) after each arrival: the reports' line charts.
        self.timeline: list[tuple[int, int, int]] = []
        self._stranded_sum = 0       # stranded MiB summed over the arrivals (its mean is reported)
        self._stranded_samples = 0
        self._waking: set[str] = set()   # gangs whose pending members are being retried after a plan

    async def close(self) -> None:
        await self.extender.close()

    async def play(self, workload: Workload) -> None:
        self.arrivals = arrivals = workload.arrivals()
        self._sample_usage()     # the pods already running (a cluster dump's) count towards the peak
        for arrival in arrivals:
            self.step = arrival.step
            await self._expire(arrival.step)
            outcome = PodOutcome(namespace=arrival.namespace, name=arrival.name, template=arrival.template.name,
                                 arrival=arrival.step, lifetime=arrival.template.lifetime,
                                 gang=arrival.template.gang)
            self.outcomes.append(outcome)
            created = self.api.create("pods", self._manifest(arrival.manifest(), outcome.template))
            outcome.uid = created["metadata"]["uid"]
            await self.attempt(outcome, created, arrival.step)
            if self.defrag_every and (arrival.step + 1) % self.defrag_every == 0 and self.pending:
                self.defrag_runs += 1
                self.moves += await self.defragment(self, arrival.step)
            self._sample_stranded()
            if self.progress is not None:
                self.progress(arrival.step + 1, len(arrivals), self.placed, len(self.pending), self.replaced)
        if self.defrag_every and self.pending and arrivals:
            # Once more after the last arrival: no pod is left pending that moves could place.
            self.defrag_runs += 1
            self.moves += await self.defragment(self, arrivals[-1].step)
            if self.progress is not None:
                self.progress(len(arrivals), len(arrivals), self.placed, len(self.pending), self.replaced)
        await self.allocations_done()

    def _manifest(self, pod: dict, template: str) -> dict:
        # Owned by a controller of its template, so that the defragmenter may move it (and the
        # end-of-run figure of what moves could place means the same with or without it); created
        # at the simulated time of its arrival, so that "running time lost" is in arrivals and a
        # run is reproducible.
        pod["metadata"]["creationTimestamp"] = simulated_time(self.step)
        return owned_by_template(pod, template)

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

    def adopt_existing(self, pod: dict, replacement: dict) -> PodOutcome:
        """A pod of the dump about to be moved, as an outcome of this run: ``replacement`` is
        what its owner recreates once it is gone (scheduled by ``replace``)."""
        meta = pod.get("metadata") or {}
        owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller") is True), {})
        outcome = PodOutcome(namespace=meta.get("namespace") or "default", name=meta.get("name") or "",
                             template=f"{owner.get('kind', 'Pod')}/{owner.get('name', meta.get('name'))}",
                             arrival=-1, uid=meta.get("uid") or "", node=(pod.get("spec") or {}).get("nodeName"),
                             placed_at=0)
        self.moved_existing.append(outcome)
        self._manifests[id(outcome)] = replacement
        return outcome

    async def replace(self, outcome: PodOutcome, step: int) -> None:
        """A moved pod's replacement: the same name again, a new uid, scheduled afresh, for the
        rest of its lifetime (a dump's pod: its owner's copy, for good)."""
        kept = self._manifests.get(id(outcome))
        if kept is not None:
            manifest = orjson.loads(orjson.dumps(kept))
            manifest["metadata"]["creationTimestamp"] = simulated_time(self.step)
        else:
            manifest = self._manifest(self.arrivals[outcome.arrival].manifest(), outcome.template)
        created = self.api.create("pods", manifest)
        outcome.uid = created["metadata"]["uid"]
        outcome.node, outcome.devices, outcome.moved = None, [], outcome.moved + 1
        await self.attempt(outcome, created, step)

    async def allocations_done(self) -> None:
        plugin = self.app.device_plugin
        await wait_for(lambda: plugin.allocated >= self.binds, timeout=WAIT_S, interval=0.0005,
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
        await wait_for(lambda: not any(o.uid in cache.pods for o in due), timeout=WAIT_S, interval=0.0005,
                       what="the scheduler to see completed pods deleted")
        failed_templates: dict[str, PodOutcome] = {}
        for outcome in list(self.pending):
            if outcome not in self.pending:     # placed meanwhile, with its gang
                continue
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
        if outcome.gang:
            # The planner counts and places the members its watch has seen: as in a cluster,
            # where a pod is created well before kube-scheduler gets to it.
            book = self.app.service.gangs.book
            await wait_for(lambda: outcome.uid in book.gang_of_uid, timeout=WAIT_S, interval=0.0005,
                           what=f"the scheduler to see gang member {outcome.namespace}/{outcome.name}")
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
            if outcome.gang and failed and gang_refusal(outcome.gang, failed) is not None:
                for other in self.pending:
                    if other.gang == outcome.gang and other is not outcome:
                        other.reason, other.failed_nodes = reason, failed
            return
        node = names[0]
        await self.allocations_done()
        bound = await self._call("bind", outcome, self.extender.bind(pod, node))
        if bound.get("Error"):
            self._still_pending(outcome, f"bind to {node} failed: {bound['Error']}", None)
            return
        if outcome.moved:        # replace() counts the move before the replacement's attempt
            self.replaced += 1
        else:
            self.placed += 1
        self._sample_usage()     # the peak can only rise with a bind
        outcome.node, outcome.placed_at = node, step
        outcome.reason, outcome.failed_nodes = "", None
        outcome.devices = self._devices(outcome)
        if outcome in self.pending:
            self.pending.remove(outcome)
        if outcome.lifetime:
            lifetime = self._remaining.pop(id(outcome), outcome.lifetime)
            self.expiries.setdefault(step + lifetime, []).append(outcome)
        if outcome.gang and outcome.gang not in self._waking:
            await self._wake_gang(outcome.gang, step)

    async def _wake_gang(self, gang: str, step: int) -> None:
        """A gang's member was placed (its plan made, or the gang already whole): its pending
        members are tried again at once, oldest first, as the scheduler's nudge makes
        kube-scheduler do."""
        self._waking.add(gang)
        try:
            for other in [o for o in self.pending if o.gang == gang]:
                if other in self.pending:
                    await self.attempt(other, self.api.get("pods", other.name, other.namespace), step)
        finally:
            self._waking.discard(gang)

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
        nodes = self.app.cache.nodes
        out = []
        for vendor in self.app.vendors.values():
            for position, devices in enumerate(vendor.decode_allocation(annotations) or []):
                for dev in devices:
                    # On the pod's node, or for a pooled family (a remote GPU) the node serving it.
                    entry = nodes.get(vendor.charge_node(dev.uuid, outcome.node))
                    info = next((d for d in entry.devices if d.id == dev.uuid), None) if entry else None
                    out.append({"container": containers[position] if position < len(containers) else "",
                                "vendor": vendor.vendor_key, "uuid": dev.uuid, "index": info.index if info else None,
                                "type": info.type if info else dev.type,
                                "memoryMiB": dev.usedmem, "cores": dev.usedcores,
                                "coresPercent": vendor.core_share(info.devcore, dev.usedcores) if info else None})
        return out

    @property
    def binds(self) -> int:
        """Every bind: first placements and moved pods' re-placements."""
        return self.placed + self.replaced

    @property
    def mean_stranded_mib(self) -> int:
        return self._stranded_sum // self._stranded_samples if self._stranded_samples else 0

    def _sample_stranded(self) -> None:
        """Stranded memory after an arrival (results.stranded_mib, over the cache's arrays)."""
        c = self.app.cache
        stranded = stranded_mib(health=self._counted_devices(), slots=c.count, slots_used=c.used,
                                memory=c.total_mem, memory_used=c.used_mem, cores=c.total_cores,
                                cores_used=c.used_cores)
        self._stranded_sum += stranded
        self.timeline.append((self.step + 1, len(self.pending), stranded))
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

"""What one simulated scenario produced, and the figures a planner reads off it.

The runner fills these records from the scheduler's own books (the usage cache) and from the
pods' allocation annotations; everything here is arithmetic over them: utilisation of memory,
cores and slots per GPU, per node and in total, and the pending pods with their reasons. The
JSON, table and HTML reports all render the same :meth:`ScenarioResult.summary` and
:meth:`ScenarioResult.node_rows`, so they never disagree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from hami_py.scheduling.kernel.frag import stranded_memory


@dataclass
class PodOutcome:
    """One workload pod: where it went (or why it could not), and when."""
    namespace: str
    name: str
    template: str
    arrival: int
    uid: str = ""
    node: str | None = None
    devices: list[dict] = field(default_factory=list)
    placed_at: int | None = None
    completed_at: int | None = None
    lifetime: int | None = None
    reason: str = ""
    failed_nodes: dict[str, str] | None = None
    attempts: int = 0
    moved: int = 0              # times the defragmenter moved it
    gang: str = ""              # its gang (``PodGroup ns/name``), "" for none

    @property
    def state(self) -> str:
        if self.node is None:
            return "pending"
        return "completed" if self.completed_at is not None else "running"

    def as_json(self) -> dict:
        out = {"namespace": self.namespace, "name": self.name, "template": self.template, "state": self.state,
               "node": self.node, "devices": self.devices, "arrival": self.arrival, "placedAt": self.placed_at,
               "completedAt": self.completed_at}
        if self.gang:
            out["gang"] = self.gang
        if self.node is None:
            out["reason"] = self.reason
            out["failedNodes"] = self.failed_nodes
        return out


@dataclass
class DeviceState:
    """One device at the end of the run, as the scheduler's usage cache books it."""
    node: str
    index: int
    uuid: str
    type: str
    health: bool
    slots: int
    slots_used: int
    memory: int
    memory_used: int
    cores: int
    cores_used: int
    vendor: str = "NVIDIA"     # the scheduler's vendor key: what the reports name the device by

    @property
    def memory_percent(self) -> float:
        return percent(self.memory_used, self.memory)

    @property
    def whole(self) -> bool:
        """Healthy and used by nobody: free for a pod that needs the whole device."""
        return self.health and self.slots_used == 0

    @property
    def stranded_mib(self) -> int:
        """Free memory nothing can use: the device is out of slots or cores."""
        return _stranded(self.health, self.slots, self.slots_used, self.memory, self.memory_used, self.cores,
                         self.cores_used)

    def as_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "type": self.type, "vendor": self.vendor,
                "health": self.health,
                "memory": {"usedMiB": self.memory_used, "totalMiB": self.memory,
                           "percent": percent(self.memory_used, self.memory)},
                "cores": {"used": self.cores_used, "total": self.cores,
                          "percent": percent(self.cores_used, self.cores)},
                "slots": {"used": self.slots_used, "total": self.slots,
                          "percent": percent(self.slots_used, self.slots)}}


@dataclass
class Fragmentation:
    """Free memory stranded on GPUs that can no longer take the workload's typical request."""
    request: str = ""           # the typical request, in words; "" when there is none
    free_mib: int = 0
    stranded_mib: int = 0
    stranded_gpus: int = 0

    @property
    def percent(self) -> float:
        return percent(self.stranded_mib, self.free_mib)

    def as_json(self) -> dict:
        return {"typicalRequest": self.request, "freeMiB": self.free_mib,
                "refusingTypicalMiB": self.stranded_mib, "refusingTypicalGpus": self.stranded_gpus, "percent": self.percent}


@dataclass
class ScenarioResult:
    node_policy: str
    gpu_policy: str
    pods: list[PodOutcome]
    devices: list[DeviceState]
    fragmentation: Fragmentation
    peak_memory_percent: float = 0.0
    existing_pods: int = 0
    existing_on: dict[str, int] = field(default_factory=dict)   # the dump's running pods, per node
    elapsed_s: float = 0.0
    # Pending pods whose memory the family's free memory would hold (fragmentation failures).
    fragmentation_failures: int = 0
    mean_stranded_mib: int = 0     # stranded memory, averaged over the arrivals
    moves: int = 0                 # pods the defragmenter moved (simulate --defrag-every)
    defrag_runs: int = 0
    defrag_every: int = 0
    pending_movable: int = 0       # pending pods that a plan of moves would place, at the end
    # After each arrival, as the run samples it: (arrivals so far, pods pending, stranded MiB).
    # The HTML report draws it; empty when the run recorded none.
    timeline: list[tuple[int, int, int]] = field(default_factory=list)
    # With --defrag-every: the same arrivals under the same policies without moves (runner.py),
    # so that a report says what moving won or cost.
    baseline: "ScenarioResult | None" = None
    gang_sizes: dict[str, int] = field(default_factory=dict)   # each gang of the workload: its minMember

    @property
    def label(self) -> str:
        return f"{self.node_policy}/{self.gpu_policy}"

    def against_baseline(self) -> dict:
        """What moving pods won or cost against the same run without moves: pods placed in
        each, those only one of the two placed (by name), and why the first pod that moving cost
        stayed pending (its reason in this run)."""
        base = self.baseline
        placed = {(p.namespace, p.name) for p in self.pods if p.state != "pending"}
        base_placed = {(p.namespace, p.name) for p in base.pods if p.state != "pending"}
        order = {(p.namespace, p.name): p for p in self.pods}
        won = sorted(placed - base_placed, key=lambda k: order[k].arrival)
        lost = sorted(base_placed - placed, key=lambda k: order[k].arrival)
        first = order[lost[0]] if lost else None
        return {"placed": len(base_placed), "placedWithMoves": len(placed),
                "placedOnlyWithMoves": [f"{ns}/{n}" for ns, n in won],
                "placedOnlyWithoutMoves": [f"{ns}/{n}" for ns, n in lost],
                "firstLost": None if first is None else {"pod": f"{first.namespace}/{first.name}",
                                                         "arrival": first.arrival, "reason": first.reason}}

    def vendors(self) -> list[str]:
        """The device vendors of the cluster, in the order the devices list them."""
        return list(dict.fromkeys(d.vendor for d in self.devices))

    @property
    def mixed(self) -> bool:
        """Devices other than NVIDIA GPUs: the reports name devices by their vendor."""
        return any(d.vendor != "NVIDIA" for d in self.devices)

    def summary(self) -> dict:
        healthy = [d for d in self.devices if d.health]
        nodes = sorted({d.node for d in self.devices})
        busy_nodes = {d.node for d in self.devices if d.slots_used}
        states = [p.state for p in self.pods]
        mem_used, mem = sum(d.memory_used for d in healthy), sum(d.memory for d in healthy)
        cores_used, cores = sum(d.cores_used for d in healthy), sum(d.cores for d in healthy)
        slots_used, slots = sum(d.slots_used for d in healthy), sum(d.slots for d in healthy)
        return {
            "nodePolicy": self.node_policy, "gpuPolicy": self.gpu_policy,
            "pods": len(self.pods),
            "placed": states.count("running") + states.count("completed"),
            "pending": states.count("pending"),
            "running": states.count("running"),
            "completed": states.count("completed"),
            "existingPods": self.existing_pods,
            "nodes": len(nodes), "nodesInUse": len(busy_nodes),
            "gpus": len(self.devices), "gpusInUse": sum(1 for d in self.devices if d.slots_used),
            "unhealthyGpus": len(self.devices) - len(healthy),
            "memory": {"usedMiB": mem_used, "totalMiB": mem, "percent": percent(mem_used, mem)},
            "cores": {"used": cores_used, "total": cores, "percent": percent(cores_used, cores)},
            "slots": {"used": slots_used, "total": slots, "percent": percent(slots_used, slots)},
            "peakMemoryPercent": self.peak_memory_percent,
            "fragmentation": self.fragmentation.as_json(),
            "fragmentationFailures": self.fragmentation_failures,
            # Free memory on devices out of slots or cores: at the end, and averaged over the arrivals.
            "strandedMiBAtEnd": sum(d.stranded_mib for d in self.devices),
            "strandedMiBMean": self.mean_stranded_mib,
            "wholeDevicesFree": sum(1 for d in self.devices if d.whole),
            "moves": self.moves, "defragRuns": self.defrag_runs, "defragEvery": self.defrag_every,
            "pendingMovesCouldPlace": self.pending_movable,
            **({"withoutMoves": self.against_baseline()} if self.baseline is not None else {}),
            "devicesByVendor": self.by_vendor(),
            "gangs": self.gangs(),
        }

    def gangs(self) -> dict:
        """Gangs placed (at least minMember members placed, together) and waiting, each waiting
        one with its gang's answer (``PodGroup ns/name: k of N members fit``)."""
        rows = []
        for gang, minimum in self.gang_sizes.items():
            members = [p for p in self.pods if p.gang == gang]
            placed = sum(1 for p in members if p.state != "pending")
            row = {"gang": gang, "minMember": minimum, "members": len(members), "placed": placed,
                   "state": "placed" if placed >= minimum else "waiting"}
            if placed < minimum:
                pending = [p for p in members if p.state == "pending"]
                answers = [a for p in pending if (a := gang_refusal(gang, p.failed_nodes)) is not None]
                row["reason"] = answers[0] if answers else (pending[0].reason if pending else "")
            rows.append(row)
        waiting = [r for r in rows if r["state"] == "waiting"]
        return {"placed": len(rows) - len(waiting), "waiting": len(waiting), "each": rows}

    def by_vendor(self) -> dict[str, dict]:
        """Per vendor key (``NVIDIA``, ``Ascend910B3``, ``kunlun`` ...): devices, in use,
        unhealthy, and the memory, core and slot use of its healthy devices."""
        out: dict[str, dict] = {}
        for d in self.devices:
            row = out.setdefault(d.vendor, {"devices": 0, "inUse": 0, "unhealthy": 0,
                                            "memory": {"usedMiB": 0, "totalMiB": 0},
                                            "cores": {"used": 0, "total": 0}, "slots": {"used": 0, "total": 0}})
            row["devices"] += 1
            row["inUse"] += 1 if d.slots_used else 0
            if not d.health:
                row["unhealthy"] += 1
                continue
            row["memory"]["usedMiB"] += d.memory_used
            row["memory"]["totalMiB"] += d.memory
            row["cores"]["used"] += d.cores_used
            row["cores"]["total"] += d.cores
            row["slots"]["used"] += d.slots_used
            row["slots"]["total"] += d.slots
        for row in out.values():
            row["memory"]["percent"] = percent(row["memory"]["usedMiB"], row["memory"]["totalMiB"])
            row["cores"]["percent"] = percent(row["cores"]["used"], row["cores"]["total"])
            row["slots"]["percent"] = percent(row["slots"]["used"], row["slots"]["total"])
        return out

    def node_rows(self) -> list[dict]:
        """Per node: totals over its devices, the devices themselves, and its pod count (the
        running pods of a cluster dump included)."""
        pods_on: dict[str, int] = dict(self.existing_on)
        for pod in self.pods:
            if pod.state == "running":
                pods_on[pod.node] = pods_on.get(pod.node, 0) + 1
        rows: dict[str, dict] = {}
        for d in self.devices:
            row = rows.setdefault(d.node, {"name": d.node, "pods": pods_on.get(d.node, 0), "gpus": [],
                                           "memory": [0, 0], "cores": [0, 0], "slots": [0, 0]})
            row["gpus"].append(d)
            if d.health:
                for key, used, total in (("memory", d.memory_used, d.memory), ("cores", d.cores_used, d.cores),
                                         ("slots", d.slots_used, d.slots)):
                    row[key][0] += used
                    row[key][1] += total
        return [rows[name] for name in sorted(rows, key=natural_key)]

    def nodes_json(self) -> list[dict]:
        out = []
        for row in self.node_rows():
            (mu, mt), (cu, ct), (su, st) = row["memory"], row["cores"], row["slots"]
            out.append({"name": row["name"], "pods": row["pods"],
                        "memory": {"usedMiB": mu, "totalMiB": mt, "percent": percent(mu, mt)},
                        "cores": {"used": cu, "total": ct, "percent": percent(cu, ct)},
                        "slots": {"used": su, "total": st, "percent": percent(su, st)},
                        "gpus": [d.as_json() for d in row["gpus"]]})
        return out

    def pending_groups(self) -> list[tuple[str, str, list[str]]]:
        """Pending pods grouped by template and reason: (template, reason, pod names)."""
        groups: dict[tuple[str, str], list[str]] = {}
        for pod in self.pods:
            if pod.state == "pending":
                groups.setdefault((pod.template, pod.reason), []).append(pod.name)
        return [(t, r, names) for (t, r), names in groups.items()]


BEST_RULE = ("most pods placed, then fewest GPUs in use, then least free memory refusing the typical request "
             "(refusingTypicalMiB)")


def device_label(device: "DeviceState", *, mixed: bool) -> str:
    """``gpu3`` on an all-NVIDIA cluster; ``Ascend910B3 #3``, ``kunlun #3`` once families mix."""
    return f"{device.vendor} #{device.index}" if mixed else f"gpu{device.index}"


def allocation_label(entry: dict, *, mixed: bool) -> str:
    """One device a pod got (an entry of ``PodOutcome.devices``), named as :func:`device_label` does."""
    return f"{entry.get('vendor', 'NVIDIA')} #{entry['index']}" if mixed else f"gpu{entry['index']}"


def cores_label(entry: dict) -> str:
    """The compute one device gave a pod, as a share of the device (its family's unit, CUs or a
    core mask, converted by ``DeviceVendor.core_share``)."""
    share = entry.get("coresPercent")
    return f"{share:g}% cores" if share is not None else f"{entry['cores']} cores"


def best_scenario(results: list[ScenarioResult]) -> ScenarioResult:
    """The scenario that packs the workload best, by BEST_RULE (ties: the first listed)."""
    def rank(x: ScenarioResult) -> tuple:
        s = x.summary()
        return (-s["placed"], s["gpusInUse"], x.fragmentation.stranded_mib)
    return min(results, key=rank)


def stranded_mib(*, health, slots, slots_used, memory, memory_used, cores, cores_used) -> int:
    """Stranded memory summed over devices given column by column (one value per device in each,
    the usage cache's arrays as they are): free memory of healthy devices out of slots or cores.
    The runner samples it after every arrival, hot for large clusters: one map() over the columns,
    no object per device."""
    return sum(map(_stranded, health, slots, slots_used, memory, memory_used, cores, cores_used))


def _stranded(health, slots, slots_used, memory, memory_used, cores, cores_used) -> int:
    # Positional: map() calls it once per device. The rule is the fragmentation-aware policy's.
    return stranded_memory(memory, cores, slots, slots_used, memory_used, cores_used) if health else 0


def percent(used: int | float, total: int | float) -> float:
    return round(100.0 * used / total, 1) if total else 0.0


def natural_key(name: str) -> tuple:
    """``node-2`` before ``node-10``."""
    return tuple((1, int(part), "") if part.isdigit() else (0, 0, part) for part in re.split(r"(\d+)", name) if part)


def gang_refusal(gang: str, failed: dict[str, str] | None) -> str | None:
    """The gang's own answer when FailedNodes is one (every node refused with ``<gang>: ...``)."""
    answers = set((failed or {}).values())
    if len(answers) == 1:
        (answer,) = answers
        if answer.startswith(f"{gang}: "):
            return answer
    return None


def summarize_failed(failed: dict[str, str] | None, total: int) -> str:
    """FailedNodes in kube-scheduler's words: ``0/16 nodes are available: 12 node(s) 8/8
    CardInsufficientMemory; 4 node(s) NodeInsufficientDevice``. Each reason is the extender's
    string for that node, exactly as FailedNodes carries it."""
    counts: dict[str, int] = {}
    for reason in (failed or {}).values():
        counts[reason] = counts.get(reason, 0) + 1
    groups = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return f"0/{total} nodes are available: " + "; ".join(f"{n} node(s) {reason}" for reason, n in groups)


@dataclass
class Report:
    """Everything the reports show: the inputs in words, the chosen scenario and, with
    --compare-policies, every scenario (the chosen one among them)."""
    cluster_file: str
    cluster: str
    workload_file: str
    workload: str
    notes: list[str]
    primary: ScenarioResult
    comparison: list[ScenarioResult] = field(default_factory=list)

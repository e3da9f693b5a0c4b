"""``defrag --free N``: the fewest moves that leave N whole devices free.

A whole free device is healthy with nothing charged to it (no pod, no slot, no memory). The
devices wanted are those whose registered type contains ``--model`` (case-insensitive; every
device without it), on one node (the default) or anywhere (``--across-nodes``).

Freeing a set of devices means moving every pod charged to any of them, so the candidate device
sets are compared by the pods they hold: fewest pods first, then least running time lost, then
node names and device ids. Sets are listed exactly (every combination of N wanted devices on each
node, or over all nodes) up to the planner's ``max_combinations``; beyond it each node's N
emptiest devices are the candidates (and ``Plan.exact`` is False). Every pod of a set must be
movable (defrag/rules.py, with ``--max-priority`` as the priority limit), and together they must
fit their PodDisruptionBudgets.

Replacements must not land on the devices being freed. During a trial each freed device is
charged in full by a hold (a reservation named ``defrag-hold/<node>`` taking all its memory,
cores and slots), so ``Filterer.decide`` sees those devices as taken and places each
replacement where the scheduler would once the devices are held for whoever they are freed for.
Holds are removed before the plan's "after" books are captured, so the freed devices show free.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, islice

from hami_py.cache.pod_states import PodState
from hami_py.cache.records import PodUsage, UsageEntry
from hami_py.defrag.plan import Plan
from hami_py.defrag.search import Search

HOLD_PREFIX = "defrag-hold/"           # a hold's uid and name: defrag-hold/<node>
HOLD_NAMESPACE = "hami-defrag-hold"


@dataclass(slots=True, frozen=True)
class Device:
    """A wanted device (healthy, of the model) and the pods charged to it."""
    node: str
    id: str
    type: str
    vendor: str            # the vendor key its charges carry
    totalmem: int
    totalcore: int
    count: int
    occupants: frozenset[str]

    def hold_entry(self) -> UsageEntry:
        """A charge of the whole device: all its memory, cores and slots."""
        return UsageEntry(self.vendor, self.id, self.totalmem, self.totalcore, self.count)


def plan_free_devices(planner: Search, *, count: int, model: str | None, same_node: bool,
                      max_priority: int) -> Plan:
    wanted = (model or "").strip().lower()
    what = f"{model} device" if model else "device"
    where = "on one node" if same_node else "across nodes"
    plan = Plan(goal=f"{count} whole {what}{'s' if count != 1 else ''} free {where}", satisfied=False)
    devices = _wanted_devices(planner, wanted)
    pool, blocked = planner.candidates(priority_limit=max_priority)
    movable = {p.uid: p for p in pool}
    if same_node:
        groups = [d for d in devices.values() if len(d) >= count]
        if not groups:
            most = max((len(d), n) for n, d in devices.items()) if devices else (0, "")
            plan.reason = (f"no node has {count} healthy {what}s (most: {most[0]}"
                           + (f" on {most[1]})" if most[1] else ")"))
            return plan
    else:
        groups = [[d for ds in devices.values() for d in ds]]
        if len(groups[0]) < count:
            plan.reason = f"the cluster has {len(groups[0])} healthy {what}(s), fewer than {count}"
            return plan
    now = planner.clock()
    ranked = []
    why_not = []
    for chosen in _device_sets(planner, groups, count):
        occupants = sorted({u for d in chosen for u in d.occupants})
        stuck = [u for u in occupants if u not in movable]
        if stuck:
            why_not.append((len(occupants), _stuck_reason(planner, stuck[0], blocked)))
            continue
        victims = [movable[u] for u in occupants]
        ranked.append((planner.set_key(victims, now), [d.id for d in chosen], chosen, victims))
    ranked.sort(key=lambda r: (r[0], r[1]))
    for _, _, chosen, victims in ranked:
        if len(victims) > planner.moves_left():
            why_not.append((len(victims), f"it needs {len(victims)} moves, more than --max-moves"))
            continue
        if not planner.budgets_allow(victims):
            why_not.append((len(victims), "a PodDisruptionBudget allows too few disruptions"))
            continue
        if planner.trials >= planner.max_trials:
            planner.exact = False
            why_not.append((len(victims), f"the search stopped after {planner.trials} fits"))
            break
        found = planner.trial(None, None, victims, commit=True, holds=_holds(chosen))
        if found is None:
            why_not.append((len(victims), "a moved pod's replacement fits nowhere else"))
            continue
        planner.commit(found)
        plan.satisfied = True
        plan.freed = [{"node": d.node, "id": d.id, "type": d.type} for d in chosen]
        return plan
    best = min(why_not, default=(0, "no set of devices can be freed"))
    plan.reason = f"cannot free {count} {what}(s) {where}: {best[1]}"
    return plan


def _wanted_devices(planner: Search, wanted: str) -> dict[str, list[Device]]:
    """Per node (in the world's order), its healthy devices whose type contains ``wanted``."""
    cache = planner.cache
    keys = {i: key for key, i in cache.vendor_ids.items()}
    out: dict[str, list[Device]] = {}
    for node in planner.world.node_names:
        entry = cache.nodes.get(node)
        if entry is None:
            continue
        occupants: dict[str, set[str]] = {}
        # With the pods running elsewhere and charged here (a pooled family: remote GPUs).
        for uid in (*cache.node_pods.get(node, ()), *cache.ledger.foreign_pods.get(node, ())):
            for e in cache.pods[uid].entries:
                occupants.setdefault(e.uuid, set()).add(uid)
        for k, d in enumerate(cache.device_usage(node)):
            if d["health"] and wanted in d["type"].lower():
                out.setdefault(node, []).append(Device(
                    node=node, id=d["id"], type=d["type"], vendor=keys.get(cache.vendor[entry.offset + k], ""),
                    totalmem=d["totalmem"], totalcore=d["totalcore"], count=d["count"],
                    occupants=frozenset(occupants.get(d["id"], ()))))
    return out


def _device_sets(planner: Search, groups: list[list[Device]], count: int) -> list[tuple[Device, ...]]:
    """Every combination of ``count`` devices within a group, up to the planner's bound; beyond it
    each group's ``count`` devices holding the fewest pods (and the search is not exact)."""
    sets = []
    for group in groups:
        sets.extend(islice(combinations(group, count), planner.max_combinations + 1 - len(sets)))
        if len(sets) > planner.max_combinations:
            planner.exact = False
            return [tuple(sorted(g, key=lambda d: (len(d.occupants), d.id))[:count]) for g in groups]
    return sets


def _holds(chosen: tuple[Device, ...]) -> list[PodUsage]:
    """One hold per node, charging its chosen devices in full."""
    by_node: dict[str, list[UsageEntry]] = {}
    for d in chosen:
        by_node.setdefault(d.node, []).append(d.hold_entry())
    return [PodUsage(uid=f"{HOLD_PREFIX}{node}", namespace=HOLD_NAMESPACE, name=f"{HOLD_PREFIX}{node}", node=node,
                     entries=entries, state=PodState.HELD) for node, entries in by_node.items()]


def _stuck_reason(planner: Search, uid: str, blocked: dict[str, str]) -> str:
    record = planner.cache.pods.get(uid)
    name = f"{record.namespace}/{record.name}" if record else uid
    return f"pod {name} may not move: {blocked.get(uid, 'it is not a bound pod seen from the API server')}"

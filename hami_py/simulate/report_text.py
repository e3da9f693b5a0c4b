"""The table a planner reads in the terminal (``--output table``, and what ``make run`` prints).

Totals first, then one line per node with a strip of block characters showing each GPU's memory
use, then the pending pods grouped by template and reason. Per-GPU and per-pod tables follow for
small clusters (or with ``--detail``); larger ones have them in the JSON and HTML reports.
"""
from __future__ import annotations

from hami_py.offline.palette import memory_glyph
from hami_py.simulate.results import (
    BEST_RULE, Report, ScenarioResult, allocation_label, best_scenario, cores_label,
)

DETAIL_MAX_GPUS = 32
DETAIL_MAX_PODS = 40


def render_table(report: Report, *, detail: bool = False) -> str:
    lines: list[str] = []
    add = lines.append
    r = report.primary
    s = r.summary()
    add("hami-scheduler simulate")
    add(f"  cluster    {report.cluster_file}: {report.cluster}")
    add(f"  workload   {report.workload_file}: {report.workload}")
    add(f"  policies   node {r.node_policy}, gpu {r.gpu_policy}")
    for note in report.notes:
        add(f"  note       {note}")
    add("")
    add(_pods_line(s))
    if r.gang_sizes:
        lines.extend(gangs_lines(s["gangs"]))
    add(f"Nodes       {s['nodes']}, {s['nodesInUse']} in use")
    if r.mixed:     # one line per family, named by its vendor key
        width = max([11] + [len(v) + 1 for v in s["devicesByVendor"]])
        for vendor, row in s["devicesByVendor"].items():
            unhealthy = f", {row['unhealthy']} unhealthy" if row["unhealthy"] else ""
            add(f"{vendor:<{width}} {row['devices']}, {row['inUse']} in use{unhealthy}, "
                f"memory {row['memory']['percent']:.1f}%, slots {row['slots']['percent']:.1f}%")
    else:
        unhealthy = f", {s['unhealthyGpus']} unhealthy" if s["unhealthyGpus"] else ""
        add(f"GPUs        {s['gpus']}, {s['gpusInUse']} in use{unhealthy}")
    m, c, sl = s["memory"], s["cores"], s["slots"]
    add(f"Memory      {m['percent']:5.1f}%  {m['usedMiB']:,} / {m['totalMiB']:,} MiB "
        f"(peak {s['peakMemoryPercent']:.1f}%)")
    add(f"Cores       {c['percent']:5.1f}%  {c['used']:,} / {c['total']:,}")
    add(f"Slots       {sl['percent']:5.1f}%  {sl['used']:,} / {sl['total']:,}")
    devices = "devices" if r.mixed else "GPUs"
    add(_fragmentation_line(s["fragmentation"], devices=devices))
    add(f"Stranded    {s['strandedMiBAtEnd']:,} MiB on {devices} out of slots or cores "
        f"(mean over the arrivals {s['strandedMiBMean']:,} MiB); {s['wholeDevicesFree']} whole {devices} free")
    add(f"Pending     {s['fragmentationFailures']} of {s['pending']} although free memory would hold them; "
        f"{s['pendingMovesCouldPlace']} that moving pods could place")
    if r.defrag_every:
        add(f"Defrag      every {r.defrag_every} arrivals: {s['defragRuns']} runs, {s['moves']} pods moved")
        if "withoutMoves" in s:
            add(f"            {moves_verdict(s['withoutMoves'])}")
    add("")
    lines.extend(_node_table(r))
    pending = r.pending_groups()
    if pending:
        add("")
        add(f"PENDING ({s['pending']})")
        for template, reason, names in pending:
            shown = ", ".join(names[:3]) + (f", ... ({len(names)} pods)" if len(names) > 3 else "")
            add(f"  {shown}: {reason}")
    small = len(r.devices) <= DETAIL_MAX_GPUS and len(r.pods) <= DETAIL_MAX_PODS
    if detail or small:
        add("")
        lines.extend(_gpu_table(r))
        add("")
        lines.extend(_pod_table(r))
    elif not detail:
        add("")
        add("(per-GPU and per-pod tables: --detail, --output json or --output html)")
    if report.comparison:
        add("")
        lines.extend(comparison_table(report.comparison, chosen=r))
    return "\n".join(lines) + "\n"


def _pods_line(s: dict) -> str:
    placed = f"{s['placed']} placed"
    if s["completed"]:
        placed += f" ({s['running']} running, {s['completed']} completed)"
    existing = f"; {s['existingPods']} already running" if s["existingPods"] else ""
    return f"Pods        {s['pods']}: {placed}, {s['pending']} pending{existing}"


def gangs_lines(g: dict) -> list[str]:
    """``Gangs  2: 1 placed whole, 1 waiting``, then each waiting gang's answer."""
    out = [f"Gangs       {g['placed'] + g['waiting']}: {g['placed']} placed whole, {g['waiting']} waiting"]
    for row in g["each"]:
        if row["state"] == "waiting":
            held = f" ({row['placed']} of its members placed)" if row["placed"] else ""
            out.append(f"            waiting: {row['reason'] or row['gang']}{held}")
    return out


def _gangs_cell(s: dict) -> str:
    g = s["gangs"]
    return "-" if not g["each"] else f"{g['placed']}/{g['placed'] + g['waiting']}"


def _unmoved(s: dict) -> str:
    w = s.get("withoutMoves")
    if w is None:
        return "-"
    return f"{w['placed']}{'!' if w['placed'] > w['placedWithMoves'] else ''}"


def moves_verdict(w: dict) -> str:
    """What moving pods won or cost against the same arrivals without moves, in one sentence."""
    with_moves, without = w["placedWithMoves"], w["placed"]
    won, lost = len(w["placedOnlyWithMoves"]), len(w["placedOnlyWithoutMoves"])
    if with_moves >= without:
        gain = with_moves - without
        return (f"without moves the same arrivals place {without:,}: moving won {gain} placement(s)"
                if gain else f"without moves the same arrivals place {without:,} too: moving changed no count")
    first = w["firstLost"]
    return (f"WORSE THAN NOT MOVING: without moves the same arrivals place {without:,} ({lost} pod(s) placed only "
            f"without moves, {won} only with them). Moves change where every later pod lands: the first pod "
            f"that moving cost is {first['pod']} (arrival {first['arrival']}), pending with moves: {first['reason']}")


def _fragmentation_line(f: dict, *, devices: str = "GPUs") -> str:
    if not f["typicalRequest"]:
        return "Fragmented  -"
    return (f"Fragmented  {f['percent']:5.1f}%  of free memory ({f['refusingTypicalMiB']:,} of {f['freeMiB']:,} MiB, "
            f"on {f['refusingTypicalGpus']} {devices}) cannot take the typical request: {f['typicalRequest']}")


def _node_table(r: ScenarioResult) -> list[str]:
    rows = r.node_rows()
    width = max([len("NODE")] + [len(row["name"]) for row in rows])
    if r.mixed:     # the device column names each node's families: "8 Ascend910B3"
        kinds = {row["name"]: node_devices(row["gpus"]) for row in rows}
        kind_w = max([len("DEVICES")] + [len(k) for k in kinds.values()])
        out = [f"{'NODE':<{width}}  {'PODS':>4}  {'DEVICES':<{kind_w}}  {'MEMORY':>6}  {'CORES':>6}  {'SLOTS':>6}  "
               "DEVICE MEMORY"]
    else:
        out = [f"{'NODE':<{width}}  {'PODS':>4}  {'GPUS':>4}  {'MEMORY':>6}  {'CORES':>6}  {'SLOTS':>6}  GPU MEMORY"]
    for row in rows:
        (mu, mt), (cu, ct), (su, st) = row["memory"], row["cores"], row["slots"]
        strip = "".join(memory_glyph(d.memory_used, d.memory, d.health) for d in row["gpus"])
        count = f"{kinds[row['name']]:<{kind_w}}" if r.mixed else f"{len(row['gpus']):>4}"
        out.append(f"{row['name']:<{width}}  {row['pods']:>4}  {count}  {_pct(mu, mt)}  "
                   f"{_pct(cu, ct)}  {_pct(su, st)}  {strip}")
    return out


def node_devices(devices: list) -> str:
    """``8 NVIDIA``, ``8 Ascend910B3``, ``4 NVIDIA + 4 XPU``: a node's devices by vendor."""
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.vendor] = counts.get(d.vendor, 0) + 1
    return " + ".join(f"{n} {vendor}" for vendor, n in counts.items())


def _pct(used: int, total: int) -> str:
    return f"{(100.0 * used / total if total else 0.0):5.1f}%"


def _gpu_table(r: ScenarioResult) -> list[str]:
    width = max([len("NODE")] + [len(d.node) for d in r.devices])
    type_width = max([len("TYPE")] + [len(d.type) for d in r.devices])
    vendor_width = max([len("VENDOR")] + [len(d.vendor) for d in r.devices])
    vendor_head = f"{'VENDOR':<{vendor_width}}  " if r.mixed else ""
    out = [f"{'NODE':<{width}}  {vendor_head}{'DEV' if r.mixed else 'GPU':>3}  {'TYPE':<{type_width}}  "
           f"{'MEMORY MiB':>19}  {'MEM':>6}  {'CORES':>7}  {'SLOTS':>7}  HEALTH"]
    for d in r.devices:
        vendor = f"{d.vendor:<{vendor_width}}  " if r.mixed else ""
        out.append(f"{d.node:<{width}}  {vendor}{d.index:>3}  {d.type:<{type_width}}  "
                   f"{d.memory_used:>9}/{d.memory:<9}  {_pct(d.memory_used, d.memory)}  "
                   f"{d.cores_used:>3}/{d.cores:<3}  {d.slots_used:>3}/{d.slots:<3}  "
                   f"{'ok' if d.health else 'unhealthy'}")
    return out


def _pod_table(r: ScenarioResult) -> list[str]:
    width = max([len("POD")] + [len(f"{p.namespace}/{p.name}") for p in r.pods])
    out = [f"{'POD':<{width}}  {'STATE':<9}  {'NODE':<12}  DEVICES"]
    for p in r.pods:
        devices = ", ".join(f"{allocation_label(d, mixed=r.mixed)} {d['memoryMiB']} MiB {cores_label(d)}"
                            for d in p.devices)
        out.append(f"{p.namespace + '/' + p.name:<{width}}  {p.state:<9}  {p.node or '-':<12}  "
                   + (devices if p.node else p.reason))
    return out


def comparison_table(results: list[ScenarioResult], *, chosen: ScenarioResult | None = None) -> list[str]:
    """Every node x GPU policy pair side by side, the best packing marked (BEST_RULE)."""
    best = best_scenario(results)
    mixed = any(x.mixed for x in results)
    width = max([16] + [len(x.label) for x in results])
    moves = any(x.defrag_every for x in results)
    gangs = any(x.gang_sizes for x in results)
    out = ["POLICY COMPARISON (node/gpu)",
           f"  {'POLICIES':<{width}}  {'PLACED':>6}  {'PENDING':>7}  {'FRAGFAIL':>8}  {'NODES':>5}  "
           f"{'DEVS' if mixed else 'GPUS':>5}  {'WHOLE':>5}  {'MEM':>6}  {'CORES':>6}  "
           f"{'SLOTS':>6}  {'FRAGMENTED':>10}  {'STRANDED MiB':>12}  {'MEAN':>10}"
           + ("  MOVES  UNMOVED" if moves else "") + ("  GANGS" if gangs else "")]
    for x in results:
        s = x.summary()
        marks = (" best" if x is best else "") + (" (chosen)" if chosen is not None and x is chosen else "")
        out.append(f"  {x.label:<{width}}  {s['placed']:>6}  {s['pending']:>7}  {s['fragmentationFailures']:>8}  "
                   f"{s['nodesInUse']:>5}  {s['gpusInUse']:>5}  {s['wholeDevicesFree']:>5}  "
                   f"{s['memory']['percent']:5.1f}%  {s['cores']['percent']:5.1f}%  {s['slots']['percent']:5.1f}%  "
                   f"{s['fragmentation']['percent']:9.1f}%  {s['strandedMiBAtEnd']:>12,}  {s['strandedMiBMean']:>10,}"
                   + (f"  {s['moves']:>5}  {_unmoved(s):>7}" if moves else "")
                   + (f"  {_gangs_cell(s):>5}" if gangs else "") + marks)
    out.append(f"  best: {BEST_RULE}")
    if moves:
        out.append("  UNMOVED: pods the same arrivals place without moves (! where that is more than with them)")
    if gangs:
        out.append("  GANGS: gangs placed whole, of the workload's gangs")
    return out

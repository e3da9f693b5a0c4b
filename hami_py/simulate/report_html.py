"""``--output html``: one self-contained file to hand to whoever signs off the hardware order.

Everything is inline (CSS and SVG, no script, no font, no network fetch), so the file opens the
same from a mail attachment as from a wiki. The page reads top down: the figures (each card
names its JSON key, so the page, ``--output json`` and the terminal table say the same thing in
the same words), the heat map of the devices and what strands them (heatmap.py), the run over
its arrivals and, with --compare-policies, one panel of bars per figure (report_charts.py); then
the tables, and at the end a glossary that explains every figure and column name, the terminal
table's short ones (FRAGFAIL, WHOLE, MEAN) included.

The page holds at a 900 px window: charts scale to their box, and whatever has a natural width
(a wide table, a heat map of many devices) scrolls sideways inside its own box, never the page.
tests/test_reports_browser.py checks that in headless Chromium.
"""
from __future__ import annotations

from html import escape

from hami_py.offline.charts import CSS as CHART_CSS
from hami_py.offline.palette import CSS
from hami_py.simulate.heatmap import heat_map
from hami_py.simulate.report_charts import comparison_panels, timeline_charts
from hami_py.simulate.report_text import DETAIL_MAX_PODS, moves_verdict, node_devices
from hami_py.simulate.results import (
    BEST_RULE, Report, ScenarioResult, allocation_label, cores_label, percent,
)

__all__ = ["heat_map", "render_html", "GLOSSARY"]

PAGE_CSS = """
.card .k{font:11px ui-monospace,Menlo,Consolas,monospace;color:#5b6775}
.card .l{text-transform:none;letter-spacing:0;font-size:13px}
h3{font-size:14px;margin:14px 0 4px}
code{font:12px ui-monospace,Menlo,Consolas,monospace;background:#f3f6f9;padding:0 3px;border-radius:3px}
.inputs,.reason,.card .k{overflow-wrap:anywhere}
.best-ink{color:#1a7f37}.verdict.bad{color:#b2182b;font-weight:600}
.maps{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,420px),1fr));gap:12px 24px}
.map{min-width:0}
table.glossary{width:100%}table.glossary td{text-align:left;vertical-align:top;overflow-wrap:anywhere}
"""

# (figure as the page names it, JSON key, the terminal table's column or "", what it means).
GLOSSARY: tuple[tuple[str, str, str, str], ...] = (
    ("placed", "summary.placed", "PLACED",
     "Workload pods the scheduler placed: still running, or completed after their lifetime."),
    ("pending", "summary.pending", "PENDING",
     "Workload pods no node took by the end; each group's reason is kube-scheduler's, built from the "
     "extender's FailedNodes."),
    ("pending, memory free", "summary.fragmentationFailures", "FRAGFAIL",
     "Pending pods whose device memory the free memory of their family's healthy devices would hold: "
     "they wait because the free memory is scattered over devices, not because it is missing."),
    ("pending moves could place", "summary.pendingMovesCouldPlace", "",
     "Pending pods that a plan of moves (the defragmenter's) would place at the end."),
    ("policies", "summary.nodePolicy, summary.gpuPolicy", "POLICIES",
     "The node policy, then the GPU (device) policy, the scenario ran under: node/GPU."),
    ("memory used, cores used, slots used", "summary.memory.percent, summary.cores.percent, summary.slots.percent",
     "MEM, CORES, SLOTS",
     "Share of the healthy devices' memory, compute and sharing slots (pods per device) in use at the end."),
    ("peak memory", "summary.peakMemoryPercent", "",
     "The highest memory use seen at any moment of the run."),
    ("nodes in use", "summary.nodesInUse", "NODES", "Nodes with at least one device in use."),
    ("GPUs in use (devices in use)", "summary.gpusInUse", "GPUS (DEVS)",
     "Devices with at least one pod; on a cluster of several families, per family in summary.devicesByVendor."),
    ("whole devices free", "summary.wholeDevicesFree", "WHOLE",
     "Healthy devices nobody uses: what a pod that needs a whole device can still get."),
    ("fragmented", "summary.fragmentation.percent", "FRAGMENTED",
     "Of the free memory, the share on devices that would refuse the workload's typical request "
     "(its most common per-device request, asked through the scheduler's own filter)."),
    ("free memory refusing the typical request", "summary.fragmentation.refusingTypicalMiB", "",
     "That free memory in MiB (of fragmentation.freeMiB), on fragmentation.refusingTypicalGpus devices."),
    ("stranded MiB at end", "summary.strandedMiBAtEnd", "STRANDED MiB",
     "Free memory on devices out of slots or cores after the last arrival: no pod can use it. "
     "The heat map outlines those devices."),
    ("stranded MiB mean", "summary.strandedMiBMean", "MEAN",
     "The same stranded memory, sampled after every arrival and averaged over the run."),
    ("pods moved", "summary.moves", "MOVES", "Pods the defragmenter moved (--defrag-every K)."),
    ("gangs placed, waiting", "summary.gangs.placed, summary.gangs.waiting", "GANGS",
     "With gangs in the workload (podGroup): gangs whose minMember members were placed together, and gangs "
     "still waiting; a waiting gang's reason is the scheduler's answer (PodGroup ns/name: k of N members fit). "
     "The scheduler places a gang whole or not at all, so a waiting gang holds no device."),
    ("placed without moves", "summary.withoutMoves.placed", "UNMOVED",
     "With --defrag-every: the pods the same arrivals place under the same policies without any move. More than "
     "placed means moving cost placements: a move changes where every later pod lands."),
    ("state", "pods[].state", "STATE",
     "A workload pod's state at the end: running, completed (its lifetime ran out) or pending."),
    ("reason (FailedNodes)", "pods[].reason, pods[].failedNodes", "",
     "Why a pod is pending, in kube-scheduler's words: per reason the extender gave in FailedNodes, how many "
     "nodes gave it (8/8 CardInsufficientMemory: all 8 devices of the node lack the memory)."),
    ("best", "", "best", f"The pair that packs the workload best: {BEST_RULE}."),
    ("chosen", "", "(chosen)", "The policies the flags named (--node-scheduler-policy, --gpu-scheduler-policy)."),
    ("M, C, S in a heat-map cell", "", "",
     "The device has no memory (M), cores (C) or slots (S) left: that resource strands what is left of the others."),
    ("dashed outline in the heat map", "", "",
     "The device is out of slots or cores with memory still free: that memory counts in strandedMiBAtEnd."),
)


def render_html(report: Report) -> str:
    r = report.primary
    s = r.summary()
    devices = "Device" if r.mixed else "GPU"
    body = [
        "<h1>hami-scheduler simulate</h1>",
        '<div class="inputs">',
        f"<div><b>Cluster</b> {escape(report.cluster_file)}: {escape(report.cluster)}</div>",
        f"<div><b>Workload</b> {escape(report.workload_file)}: {escape(report.workload)}</div>",
        f"<div><b>Policies</b> node {escape(r.node_policy)}, GPU {escape(r.gpu_policy)}</div>",
        *(f'<div class="note">{escape(n)}</div>' for n in report.notes),
        "</div>",
        _cards(s, mixed=r.mixed),
        f"<h2>{devices} heat map: memory use, and what strands each {'device' if r.mixed else 'GPU'}</h2>",
        f'<div class="scroll">{heat_map(r, title=r.label)}</div>',
    ]
    timeline = timeline_charts(report.comparison or [r])
    if timeline:
        body += ["<h2>Over the arrivals</h2>", timeline]
    if report.comparison:
        body.append("<h2>Policy comparison (node / GPU)</h2>")
        body.append(comparison_panels(report.comparison, chosen=r))
        body.append(f"<h2>{devices} heat map per policy pair</h2>")
        body.append('<div class="maps">')
        for x in report.comparison:
            body.append(f'<div class="map"><h3>{escape(x.label)}: {x.summary()["placed"]} placed, '
                        f'{x.summary()["pending"]} pending</h3><div class="scroll">{heat_map(x, title=x.label)}'
                        "</div></div>")
        body.append("</div>")
    body.append("<h2>Nodes</h2>")
    body.append(_scroll(_nodes(r)))
    pending = r.pending_groups()
    if pending:
        body.append(f"<h2>Pending pods ({s['pending']})</h2>")
        body.append(_scroll(_pending(pending)))
    body.append(f"<h2>Pods ({len(r.pods)})</h2>")
    pods = _scroll(_pods(r))
    if len(r.pods) > DETAIL_MAX_PODS:
        pods = f"<details><summary>show all {len(r.pods)} pods</summary>{pods}</details>"
    body.append(pods)
    body.append("<h2>What the figures mean</h2>")
    body.append(glossary())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>hami-scheduler simulate: {escape(report.cluster_file)}</title>"
            f"<style>{CSS}{CHART_CSS}{PAGE_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def glossary() -> str:
    rows = ['<div class="scroll"><table class="glossary"><tr><th class="l">on this page</th>'
            '<th class="l">JSON (--output json)</th><th class="l">table column</th><th class="l">meaning</th></tr>']
    for name, key, column, meaning in GLOSSARY:
        rows.append(f'<tr><td>{escape(name)}</td><td>{f"<code>{escape(key)}</code>" if key else ""}</td>'
                    f"<td>{escape(column)}</td><td>{escape(meaning)}</td></tr>")
    rows.append("</table></div>")
    return "".join(rows)


def _scroll(html: str) -> str:
    return f'<div class="scroll">{html}</div>'


def _cards(s: dict, *, mixed: bool = False) -> str:
    f = s["fragmentation"]
    in_use = ("devices in use" if mixed else "GPUs in use", f"{s['gpusInUse']}/{s['gpus']}", "gpusInUse", "")
    cards = [
        ("placed", str(s["placed"]), "placed", "good" if s["placed"] else ""),
        ("pending", str(s["pending"]), "pending", "bad" if s["pending"] else "good"),
        ("memory used", f"{s['memory']['percent']}%", "memory.percent", ""),
        ("cores used", f"{s['cores']['percent']}%", "cores.percent", ""),
        ("slots used", f"{s['slots']['percent']}%", "slots.percent", ""),
        in_use,
        ("fragmented", f"{f['percent']}%" if f["typicalRequest"] else "-", "fragmentation.percent", ""),
        ("stranded MiB at end", f"{s['strandedMiBAtEnd']:,}", "strandedMiBAtEnd", ""),
        ("stranded MiB mean", f"{s['strandedMiBMean']:,}", "strandedMiBMean", ""),
        ("whole devices free", str(s["wholeDevicesFree"]), "wholeDevicesFree", ""),
        ("pending, memory free", str(s["fragmentationFailures"]), "fragmentationFailures",
         "bad" if s["fragmentationFailures"] else ""),
        ("pods moved", str(s["moves"]), "moves", ""),
    ]
    html = "".join(f'<div class="card {cls}"><div class="v">{escape(v)}</div>'
                   f'<div class="l">{escape(label)}</div><div class="k">{escape(key)}</div></div>'
                   for label, v, key, cls in cards)
    lines = []
    if mixed:       # one family's devices can be all busy while another's sit idle
        families = ", ".join(f"{escape(vendor)} {row['inUse']}/{row['devices']}"
                             for vendor, row in s["devicesByVendor"].items())
        lines.append(f"<div>In use per family (<code>devicesByVendor</code>): {families}.</div>")
    if f["typicalRequest"]:
        lines.append(f"<div>Fragmented: {f['refusingTypicalMiB']:,} of {f['freeMiB']:,} MiB free memory "
                     "(<code>refusingTypicalMiB</code> of <code>freeMiB</code>), on "
                     f"{f['refusingTypicalGpus']} {'devices' if mixed else 'GPUs'}, cannot take the typical request "
                     f"({escape(f['typicalRequest'])}).</div>")
    if s["gangs"]["each"]:
        g = s["gangs"]
        waiting = "; ".join(escape(row["reason"] or row["gang"]) for row in g["each"] if row["state"] == "waiting")
        lines.append(f"<div>Gangs (<code>gangs</code>): {g['placed']} placed whole, {g['waiting']} waiting"
                     f"{': ' + waiting if waiting else ''}.</div>")
    if "withoutMoves" in s:
        w = s["withoutMoves"]
        worse = w["placed"] > w["placedWithMoves"]
        lines.append(f'<div class="{"verdict bad" if worse else "verdict"}">Moves '
                     f"(<code>withoutMoves</code>): {escape(moves_verdict(w))}.</div>")
    return f'<div class="cards">{html}</div>{"".join(lines)}'


def _nodes(r: ScenarioResult) -> str:
    rows = ['<table><tr><th class="l">node</th><th>pods</th>'
            f'<th>{"devices" if r.mixed else "GPUs"}</th><th>memory MiB</th><th>memory</th>'
            "<th>cores</th><th>slots</th></tr>"]
    for row in r.node_rows():
        (mu, mt), (cu, ct), (su, st) = row["memory"], row["cores"], row["slots"]
        count = escape(node_devices(row["gpus"])) if r.mixed else str(len(row["gpus"]))
        rows.append(f'<tr><td class="l">{escape(row["name"])}</td><td>{row["pods"]}</td><td>{count}</td>'
                    f"<td>{mu:,} / {mt:,}</td><td>{percent(mu, mt)}%</td><td>{percent(cu, ct)}%</td>"
                    f"<td>{percent(su, st)}%</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _pending(groups: list[tuple[str, str, list[str]]]) -> str:
    rows = ['<table><tr><th class="l">template</th><th>pods</th><th class="l">reason (FailedNodes)</th></tr>']
    for template, reason, names in groups:
        rows.append(f'<tr><td class="l">{escape(template)}</td><td>{len(names)}</td>'
                    f'<td class="reason">{escape(reason)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def _pods(r: ScenarioResult) -> str:
    rows = ['<table><tr><th class="l">pod</th><th class="l">state</th><th class="l">node</th>'
            '<th class="l">devices / reason</th></tr>']
    for p in r.pods:
        detail = (", ".join(f"{allocation_label(d, mixed=r.mixed)} {d['memoryMiB']} MiB {cores_label(d)}"
                            for d in p.devices)
                  if p.node else p.reason)
        rows.append(f'<tr><td class="l">{escape(p.namespace + "/" + p.name)}</td><td class="l">{p.state}</td>'
                    f'<td class="l">{escape(p.node or "-")}</td><td class="reason">{escape(detail)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)

"""``--output html``: one self-contained file to hand to whoever signs off the hardware order.

Everything is inline (CSS and SVG, no script, no font, no network fetch), so the file opens the
same from a mail attachment as from a wiki. The centrepiece is a heat map of GPU memory use, one
row per node and one cell per GPU; with --compare-policies every policy pair gets its own map
beside the comparison table, so the packing difference is visible at a glance.
"""
from __future__ import annotations

from html import escape

from hami_py.offline.palette import CSS, IDLE, UNHEALTHY, colour
from hami_py.simulate.report_text import DETAIL_MAX_PODS, node_devices
from hami_py.simulate.results import (
    BEST_RULE, Report, ScenarioResult, allocation_label, best_scenario, cores_label, device_label, percent,
)

_CELL_W, _CELL_H, _GAP = 34, 22, 3
_LEGEND_W = 440


def heat_map(result: ScenarioResult, *, title: str = "") -> str:
    """Inline SVG: one row per node, one cell per GPU, coloured by memory use."""
    rows = result.node_rows()
    label_w = 8 + 7 * max([4] + [len(r["name"]) for r in rows])
    columns = max([1] + [len(r["gpus"]) for r in rows])
    width = max(label_w + columns * (_CELL_W + _GAP) + 10, _LEGEND_W)
    height = 24 + len(rows) * (_CELL_H + _GAP) + 34
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{"device" if result.mixed else "GPU"} memory heat map {escape(title)}" font-family="system-ui,sans-serif" font-size="11">']
    for k in range(columns):
        x = label_w + k * (_CELL_W + _GAP) + _CELL_W / 2
        out.append(f'<text x="{x}" y="14" text-anchor="middle" fill="#5b6775">{"dev" if result.mixed else "gpu"}{k}</text>')
    for i, row in enumerate(rows):
        y = 22 + i * (_CELL_H + _GAP)
        out.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" fill="#1d2733">'
                   f'{escape(row["name"])}</text>')
        for k, d in enumerate(row["gpus"]):
            x = label_w + k * (_CELL_W + _GAP)
            fraction = d.memory_used / d.memory if d.memory else 0.0
            fill = UNHEALTHY if not d.health else (IDLE if d.slots_used == 0 else colour(fraction))
            text = "x" if not d.health else f"{round(100 * fraction)}"
            ink = "#fff" if (not d.health or fraction > 0.6) else "#1d2733"
            tip = (f"{row['name']} {device_label(d, mixed=result.mixed)} {d.type}: memory {d.memory_used}/{d.memory} MiB "
                   f"({percent(d.memory_used, d.memory)}%), cores {d.cores_used}/{d.cores}, "
                   f"slots {d.slots_used}/{d.slots}"
                   + ("" if d.health else ", unhealthy"))
            out.append(f'<g><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{_CELL_W}" height="{_CELL_H}" '
                       f'rx="3" fill="{fill}" stroke="#c5ced8" stroke-width="0.5"/>'
                       f'<text x="{x + _CELL_W / 2}" y="{y + 15}" text-anchor="middle" fill="{ink}">'
                       f'{text}</text></g>')
    out.append(_legend(height - 22))
    out.append("</svg>")
    return "".join(out)


def _legend(y: float) -> str:
    """0% .. 100% colour steps, then the idle and unhealthy swatches, from the left edge."""
    steps, box = 10, 16
    parts = [f'<text x="4" y="{y + 11}" fill="#5b6775">0%</text>']
    x0 = 26
    for k in range(steps + 1):
        parts.append(f'<rect x="{x0 + k * box}" y="{y}" width="{box}" height="14" fill="{colour(k / steps)}"/>')
    x = x0 + (steps + 1) * box + 4
    parts.append(f'<text x="{x}" y="{y + 11}" fill="#5b6775">100% memory</text>')
    x += 84
    parts.append(f'<rect x="{x}" y="{y}" width="{box}" height="14" fill="{IDLE}" stroke="#c5ced8"/>'
                 f'<text x="{x + 20}" y="{y + 11}" fill="#5b6775">idle</text>')
    x += 50
    parts.append(f'<rect x="{x}" y="{y}" width="{box}" height="14" fill="{UNHEALTHY}"/>'
                 f'<text x="{x + 20}" y="{y + 11}" fill="#5b6775">unhealthy</text>')
    return "".join(parts)


def render_html(report: Report) -> str:
    r = report.primary
    s = r.summary()
    body = [
        "<h1>hami-scheduler simulate</h1>",
        '<div class="inputs">',
        f"<div><b>Cluster</b> {escape(report.cluster_file)}: {escape(report.cluster)}</div>",
        f"<div><b>Workload</b> {escape(report.workload_file)}: {escape(report.workload)}</div>",
        f"<div><b>Policies</b> node {escape(r.node_policy)}, GPU {escape(r.gpu_policy)}</div>",
        *(f'<div class="note">{escape(n)}</div>' for n in report.notes),
        "</div>",
        _cards(s, mixed=r.mixed),
        f"<h2>{'Device' if r.mixed else 'GPU'} memory heat map</h2>",
        heat_map(r, title=r.label),
    ]
    if report.comparison:
        body.append("<h2>Policy comparison (node / GPU)</h2>")
        body.append(_comparison(report.comparison, chosen=r))
        body.append('<div class="maps">')
        for x in report.comparison:
            body.append(f'<div class="map"><h3>{escape(x.label)}: {x.summary()["placed"]} placed, '
                        f'{x.summary()["pending"]} pending</h3>{heat_map(x, title=x.label)}</div>')
        body.append("</div>")
    body.append("<h2>Nodes</h2>")
    body.append(_nodes(r))
    pending = r.pending_groups()
    if pending:
        body.append(f"<h2>Pending pods ({s['pending']})</h2>")
        body.append(_pending(pending))
    body.append(f"<h2>Pods ({len(r.pods)})</h2>")
    pods = _pods(r)
    if len(r.pods) > DETAIL_MAX_PODS:
        pods = f"<details><summary>show all {len(r.pods)} pods</summary>{pods}</details>"
    body.append(pods)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>hami-scheduler simulate: {escape(report.cluster_file)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def _cards(s: dict, *, mixed: bool = False) -> str:
    f = s["fragmentation"]
    in_use = ([(f"{vendor} in use", f"{row['inUse']}/{row['devices']}", "")
               for vendor, row in s["devicesByVendor"].items()] if mixed
              else [("GPUs in use", f"{s['gpusInUse']}/{s['gpus']}", "")])
    cards = [
        ("placed", str(s["placed"]), "good" if s["placed"] else ""),
        ("pending", str(s["pending"]), "bad" if s["pending"] else "good"),
        ("memory used", f"{s['memory']['percent']}%", ""),
        ("cores used", f"{s['cores']['percent']}%", ""),
        ("slots used", f"{s['slots']['percent']}%", ""),
        *in_use,
        ("fragmented", f"{f['percent']}%" if f["typicalRequest"] else "-", ""),
        ("stranded MiB at end", f"{s['strandedMiBAtEnd']:,}", ""),
        ("whole devices free", str(s["wholeDevicesFree"]), ""),
        ("pending, memory free", str(s["fragmentationFailures"]), "bad" if s["fragmentationFailures"] else ""),
        ("pods moved", str(s["moves"]), ""),
    ]
    html = "".join(f'<div class="card {cls}"><div class="v">{escape(v)}</div>'
                   f'<div class="l">{escape(label)}</div></div>' for label, v, cls in cards)
    frag = ""
    if f["typicalRequest"]:
        frag = (f"<div>Fragmentation: {f['refusingTypicalMiB']:,} of {f['freeMiB']:,} MiB free memory, on "
                f"{f['refusingTypicalGpus']} {'devices' if mixed else 'GPUs'}, cannot take the typical request ({escape(f['typicalRequest'])}).</div>")
    return f'<div class="cards">{html}</div>{frag}'


def _comparison(results: list[ScenarioResult], *, chosen: ScenarioResult) -> str:
    best = best_scenario(results)
    rows = ['<table><tr><th class="l">policies</th><th>placed</th><th>pending</th><th>nodes used</th>'
            "<th>GPUs used</th><th>memory</th><th>cores</th><th>slots</th><th>fragmented</th>"
            "<th>pending, memory free</th><th>stranded MiB at end</th><th>stranded MiB mean</th><th>whole free</th>"
            "<th>moves</th></tr>"]
    for x in results:
        s = x.summary()
        marks = (" (best)" if x is best else "") + (" (chosen)" if x is chosen else "")
        rows.append(f'<tr class="{"best" if x is best else ""}"><td class="l">{escape(x.label + marks)}</td>'
                    f"<td>{s['placed']}</td><td>{s['pending']}</td><td>{s['nodesInUse']}</td>"
                    f"<td>{s['gpusInUse']}</td><td>{s['memory']['percent']}%</td><td>{s['cores']['percent']}%</td>"
                    f"<td>{s['slots']['percent']}%</td>"
                    f"<td>{s['fragmentation']['percent']}%</td><td>{s['fragmentationFailures']}</td>"
                    f"<td>{s['strandedMiBAtEnd']:,}</td><td>{s['strandedMiBMean']:,}</td><td>{s['wholeDevicesFree']}</td>"
                    f"<td>{s['moves']}</td></tr>")
    rows.append(f"</table><div class=\"inputs\">best: {escape(BEST_RULE)}</div>")
    return "".join(rows)


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

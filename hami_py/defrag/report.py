"""What ``hami-scheduler defrag`` prints: a table, JSON (``Plan.as_json``) or an HTML page.

The table and the page follow the simulator's reports: the same memory glyphs and heat colours
(offline/palette.py, which both use), so a planner reading both sees one picture. Devices are
shown for the nodes the plan touches (where pods leave, where they and their replacements land,
whose devices are freed), before and after the plan: the "after" is the scheduler's own books with
the plan applied (defrag/search.py captures them before putting the books back).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape

from hami_py.defrag.plan import Plan
from hami_py.offline.charts import CSS as CHART_CSS
from hami_py.offline.palette import CSS, IDLE, UNHEALTHY, colour, memory_glyph


@dataclass
class Header:
    """What the plan was made over, for the reports' heading."""
    source: str
    cluster: str = ""
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    notes: list[str] = field(default_factory=list)
    dry_run: bool = True


def touched_nodes(plan: Plan) -> list[str]:
    nodes = {m.node for m in plan.moves} | {m.to for m in plan.moves if m.to}
    nodes |= {p.node for p in plan.placements if p.node} | {f["node"] for f in plan.freed}
    order = list(plan.devices_before) or sorted(nodes)
    return [n for n in order if n in nodes]


def running_label(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours < 48 else f"{hours // 24}d{hours % 24:02d}h"


def render_json(plan: Plan, *, execution: dict | None = None) -> str:
    """The plan's JSON; with ``--execute``, what was carried out under ``execution``."""
    out = plan.as_json()
    if execution is not None:
        out["execution"] = execution
    return json.dumps(out, indent=2) + "\n"


def _summary(plan: Plan) -> str:
    state = "satisfied" if plan.satisfied else "NOT satisfied"
    search = "exact search" if plan.exact else "bounded search (a bound was hit: minimal, maybe not smallest)"
    return f"{state}, {len(plan.moves)} move{'s' if len(plan.moves) != 1 else ''} ({search}, {plan.trials} fits)"


def _strip(devices: list[dict]) -> str:
    return "".join(memory_glyph(d["usedmem"], d["totalmem"], d["health"]) for d in devices)


def render_table(plan: Plan, header: Header) -> str:
    lines: list[str] = []
    add = lines.append
    add("hami-scheduler defrag" + (" (dry run)" if header.dry_run else ""))
    add(f"  cluster    {header.source}" + (f": {header.cluster}" if header.cluster else ""))
    add(f"  policies   node {header.node_policy}, gpu {header.gpu_policy}")
    add(f"  goal       {plan.goal}")
    for note in header.notes:
        add(f"  note       {note}")
    add("")
    add(f"Plan        {_summary(plan)}")
    if plan.reason:
        add(f"Reason      {plan.reason}")
    if plan.moves:
        add("")
        lines.extend(_columns(("MOVE", "FROM", "TO", "PRIORITY", "RUNNING"), _move_rows(plan)))
    if plan.placements:
        add("")
        lines.extend(_columns(("MAKES ROOM FOR", "NODE", "AFTER MOVING"), _placement_rows(plan)))
    if plan.freed:
        add("")
        lines.extend(_columns(("FREED DEVICE", "NODE", "TYPE"), [(f["id"], f["node"], f["type"]) for f in plan.freed]))
    nodes = touched_nodes(plan)
    if nodes:
        add("")
        rows = [(n, _strip(plan.devices_before.get(n, [])), _strip(plan.devices_after.get(n, []))) for n in nodes]
        lines.extend(_columns(("NODE", "MEMORY BEFORE", "AFTER"), rows))
    return "\n".join(lines) + "\n"


def _move_rows(plan: Plan) -> list[tuple[str, ...]]:
    return [(m.pod, m.node, m.to or "-", str(m.priority), running_label(m.running_s)) for m in plan.moves]


def _placement_rows(plan: Plan) -> list[tuple[str, ...]]:
    """Each pod made room for, its node and the moves it waits for."""
    names = {m.uid: m.pod for m in plan.moves}
    return [(p.pod, p.node or "-", ", ".join(names.get(u, u) for u in p.victims) or "(fits now)")
            for p in plan.placements]


def _columns(head: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


# -- HTML ---------------------------------------------------------------------------------------
# The page holds at a 900 px window (tables scroll in their own box, the chart scales to its box)
# and explains each of its words at the end; tests/test_reports_browser.py renders it in Chromium.

_EXTRA_CSS = """
.cell{display:inline-block;min-width:64px;padding:1px 6px;border-radius:3px}
.card .k{font:11px ui-monospace,Menlo,Consolas,monospace;color:#5b6775}
code{font:12px ui-monospace,Menlo,Consolas,monospace;background:#f3f6f9;padding:0 3px;border-radius:3px}
table.glossary{width:100%}table.glossary td{text-align:left;vertical-align:top;overflow-wrap:anywhere}
"""

# (word on the page, JSON key of --output json or "", what it means).
GLOSSARY: tuple[tuple[str, str, str], ...] = (
    ("plan: satisfied / not satisfied", "satisfied",
     "Whether the goal (room for the pending pods, or N whole devices with --free) is reached once the "
     "moves are done."),
    ("moves", "moves",
     "Pods to evict. Each one's controller recreates it and the scheduler places the replacement; "
     "the plan counts on it landing where To says."),
    ("pods placed", "makesRoomFor",
     "Pending pods the plan makes room for, each on the node it names."),
    ("devices freed", "freedDevices", "Whole devices the plan frees (--free N)."),
    ("search: exact / bounded", "exact",
     "Exact: no plan with fewer moves exists. Bounded: a search bound was hit; no move of the plan can be "
     "dropped, but a smaller plan may exist."),
    ("fits", "trials", "Placements the search tried with the scheduler's own fit code."),
    ("From, To", "moves[].node, moves[].to", "The node the pod leaves, and where its replacement lands."),
    ("Priority", "moves[].priority",
     "The moved pod's priority: never above the pod it makes room for (with --free, at most --max-priority)."),
    ("Running", "moves[].runningSeconds", "How long the moved pod has been running: the work its move interrupts."),
    ("After moving", "placements[].after", "The moves a pod made room for waits for; (fits now) when none."),
    ("memory, slots before / after", "",
     "A device's memory used / total and pods / slots, in the scheduler's books before the plan and with it "
     "applied. Colour: memory use, pale green (little) to deep red (full); grey: idle."),
)


def render_html(plan: Plan, header: Header) -> str:
    cards = (
        ("satisfied" if plan.satisfied else "not satisfied", "plan", "satisfied", "good" if plan.satisfied else "bad"),
        (str(len(plan.moves)), "moves", "moves", ""),
        (str(len(plan.placements)), "pods placed", "makesRoomFor", ""),
        (str(len(plan.freed)), "devices freed", "freedDevices", ""),
        ("exact" if plan.exact else "bounded", f"search, {plan.trials} fits", "exact, trials", ""),
    )
    body = [
        "<h1>hami-scheduler defrag</h1>",
        '<div class="inputs">',
        f"<div><b>Cluster</b> {escape(header.source)}{': ' + escape(header.cluster) if header.cluster else ''}</div>",
        f"<div><b>Policies</b> node {escape(header.node_policy)}, GPU {escape(header.gpu_policy)}</div>",
        f"<div><b>Goal</b> {escape(plan.goal)}</div>",
        *(f'<div class="note">{escape(n)}</div>' for n in header.notes),
        "</div>",
        '<div class="cards">',
        *(f'<div class="card {cls}"><div class="v">{escape(v)}</div><div class="l">{escape(label)}</div>'
          f'<div class="k">{escape(key)}</div></div>' for v, label, key, cls in cards),
        "</div>",
    ]
    if plan.reason:
        body.append(f'<p class="reason">{escape(plan.reason)}</p>')
    if plan.moves:
        body.append("<h2>Moves</h2>")
        body.append(_html_table(("Pod", "From", "To", "Priority", "Running"), _move_rows(plan)))
    if plan.placements:
        body.append("<h2>Pods made room for</h2>")
        body.append(_html_table(("Pod", "Node", "After moving"), _placement_rows(plan)))
    if plan.freed:
        body.append("<h2>Devices freed</h2>")
        body.append(_html_table(("Device", "Node", "Type"), [(f["id"], f["node"], f["type"]) for f in plan.freed]))
    nodes = touched_nodes(plan)
    if nodes:
        body.append("<h2>Devices before and after</h2>")
        body.append(before_after_chart(plan, nodes))
        for node in nodes:
            body.append(f"<h3>{escape(node)}</h3>")
            body.append(_device_table(plan.devices_before.get(node, []), plan.devices_after.get(node, [])))
    body.append("<h2>What the words mean</h2>")
    body.append(_glossary())
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            "<title>hami-scheduler defrag</title>"
            f"<style>{CSS}{CHART_CSS}{_EXTRA_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def before_after_chart(plan: Plan, nodes: list[str]) -> str:
    """Inline SVG: per node the plan touches, its devices before the plan, then after it; each
    cell coloured by memory use and labelled with it and the pods on it."""
    cell_w, cell_h, gap = 52, 30, 3
    label_w = 8 + 7 * max([4] + [len(n) for n in nodes])
    columns = max([1] + [len(plan.devices_before.get(n, [])) for n in nodes])
    block = columns * (cell_w + gap)
    arrow = 36
    width = label_w + 2 * block + arrow + 8
    height = 24 + len(nodes) * (cell_h + gap) + 4
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="device memory before and after the plan" '
           'font-family="system-ui,sans-serif" font-size="11">'
           f'<text x="{label_w}" y="14" fill="#5b6775">before</text>'
           f'<text x="{label_w + block + arrow}" y="14" fill="#5b6775">after</text>']
    for i, node in enumerate(nodes):
        y = 22 + i * (cell_h + gap)
        out.append(f'<text x="{label_w - 6}" y="{y + 19}" text-anchor="end" fill="#1d2733">{escape(node)}</text>'
                   f'<text x="{label_w + block + arrow / 2 - 2}" y="{y + 19}" text-anchor="middle" '
                   'fill="#5b6775">&#8594;</text>')
        for side, devices in ((0, plan.devices_before.get(node, [])), (1, plan.devices_after.get(node, []))):
            for k, d in enumerate(devices):
                x = label_w + side * (block + arrow) + k * (cell_w + gap)
                out.append(_chart_cell(d, x, y, cell_w, cell_h, node=node, when=("before", "after")[side]))
    out.append("</svg>")
    return f'<div class="scroll">{"".join(out)}</div>'


def _fill(d: dict) -> tuple[str, str]:
    fraction = d["usedmem"] / d["totalmem"] if d["totalmem"] else 0.0
    fill = UNHEALTHY if not d["health"] else (IDLE if d["used"] == 0 else colour(fraction))
    ink = "#fff" if (not d["health"] or fraction > 0.6) else "#1d2733"
    return fill, ink


def _chart_cell(d: dict, x: float, y: float, w: int, h: int, *, node: str, when: str) -> str:
    fill, ink = _fill(d)
    share = round(100 * d["usedmem"] / d["totalmem"]) if d["totalmem"] else 0
    tip = (f"{node} device {d['index']} {when} the plan: memory {d['usedmem']}/{d['totalmem']} MiB, "
           f"{d['used']}/{d['count']} pods")
    return (f'<g class="mark"><title>{escape(tip)}</title><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" '
            f'fill="{fill}" stroke="#c5ced8" stroke-width="0.5"/>'
            f'<text x="{x + w / 2}" y="{y + 13}" text-anchor="middle" fill="{ink}">{share}%</text>'
            f'<text x="{x + w / 2}" y="{y + 25}" text-anchor="middle" fill="{ink}" font-size="9">'
            f'{d["used"]}/{d["count"]} pods</text></g>')


def _glossary() -> str:
    rows = ['<div class="scroll"><table class="glossary"><tr><th class="l">on this page</th>'
            '<th class="l">JSON (--output json)</th><th class="l">meaning</th></tr>']
    for word, key, meaning in GLOSSARY:
        rows.append(f'<tr><td>{escape(word)}</td><td>{f"<code>{escape(key)}</code>" if key else ""}</td>'
                    f"<td>{escape(meaning)}</td></tr>")
    rows.append("</table></div>")
    return "".join(rows)


def _html_table(head: tuple, rows: list[tuple]) -> str:
    out = ['<div class="scroll"><table><tr>', *(f'<th class="l">{escape(str(h))}</th>' for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="l">{escape(str(c))}</td>' for c in row) + "</tr>")
    out.append("</table></div>")
    return "".join(out)


def _device_cell(d: dict | None) -> str:
    if d is None:
        return "<td>-</td><td>-</td>"
    fill, ink = _fill(d)
    return (f'<td><span class="cell" style="background:{fill};color:{ink}">'
            f'{d["usedmem"]}/{d["totalmem"]} MiB</span></td><td>{d["used"]}/{d["count"]}</td>')


def _device_table(before: list[dict], after: list[dict]) -> str:
    after_by_id = {d["id"]: d for d in after}
    out = ['<div class="scroll"><table class="devices"><tr><th class="l">Device</th><th class="l">Type</th>'
           "<th>Memory before</th><th>Slots before</th><th>Memory after</th><th>Slots after</th></tr>"]
    for d in before:
        out.append(f'<tr><td class="l">{d["index"]}: {escape(d["id"])}</td><td class="l">{escape(d["type"])}</td>'
                   f"{_device_cell(d)}{_device_cell(after_by_id.get(d['id']))}</tr>")
    out.append("</table></div>")
    return "".join(out)

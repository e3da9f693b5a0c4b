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

_EXTRA_CSS = ".cell{display:inline-block;min-width:64px;padding:1px 6px;border-radius:3px}"


def render_html(plan: Plan, header: Header) -> str:
    body = [
        "<h1>hami-scheduler defrag</h1>",
        '<div class="inputs">',
        f"<div><b>Cluster</b> {escape(header.source)}{': ' + escape(header.cluster) if header.cluster else ''}</div>",
        f"<div><b>Policies</b> node {escape(header.node_policy)}, GPU {escape(header.gpu_policy)}</div>",
        f"<div><b>Goal</b> {escape(plan.goal)}</div>",
        *(f'<div class="note">{escape(n)}</div>' for n in header.notes),
        "</div>",
        '<div class="cards">',
        f'<div class="card {"good" if plan.satisfied else "bad"}"><div class="v">'
        f'{"satisfied" if plan.satisfied else "not satisfied"}</div><div class="l">plan</div></div>',
        f'<div class="card"><div class="v">{len(plan.moves)}</div><div class="l">moves</div></div>',
        f'<div class="card"><div class="v">{len(plan.placements)}</div><div class="l">pods placed</div></div>',
        f'<div class="card"><div class="v">{len(plan.freed)}</div><div class="l">devices freed</div></div>',
        f'<div class="card"><div class="v">{"exact" if plan.exact else "bounded"}</div>'
        f'<div class="l">search, {plan.trials} fits</div></div>',
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
    nodes = touched_nodes(plan)
    if nodes:
        body.append("<h2>Devices before and after</h2>")
        for node in nodes:
            body.append(f"<h3>{escape(node)}</h3>")
            body.append(_device_table(plan.devices_before.get(node, []), plan.devices_after.get(node, [])))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>hami-scheduler defrag</title>"
            f"<style>{CSS}{_EXTRA_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def _html_table(head: tuple, rows: list[tuple]) -> str:
    out = ["<table><tr>", *(f'<th class="l">{escape(str(h))}</th>' for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="l">{escape(str(c))}</td>' for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _device_cell(d: dict | None) -> str:
    if d is None:
        return "<td>-</td>"
    fraction = d["usedmem"] / d["totalmem"] if d["totalmem"] else 0.0
    fill = UNHEALTHY if not d["health"] else (IDLE if d["used"] == 0 else colour(fraction))
    ink = "#fff" if (not d["health"] or fraction > 0.6) else "#1d2733"
    return (f'<td><span class="cell" style="background:{fill};color:{ink}">'
            f'{d["usedmem"]}/{d["totalmem"]} MiB</span></td><td>{d["used"]}/{d["count"]}</td>')


def _device_table(before: list[dict], after: list[dict]) -> str:
    after_by_id = {d["id"]: d for d in after}
    out = ['<table class="devices"><tr><th class="l">Device</th><th class="l">Type</th>'
           "<th>Memory before</th><th>Slots before</th><th>Memory after</th><th>Slots after</th></tr>"]
    for d in before:
        out.append(f'<tr><td class="l">{d["index"]}: {escape(d["id"])}</td><td class="l">{escape(d["type"])}</td>'
                   f"{_device_cell(d)}{_device_cell(after_by_id.get(d['id']))}</tr>")
    out.append("</table>")
    return "".join(out)

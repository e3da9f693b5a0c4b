"""The simulation report's heat map: one row per node, one cell per device, and what strands it.

A cell's colour is its memory use (the palette the defrag page and the terminal strips share).
Memory alone hides why a device takes nothing more, so each cell also names the resource that is
used up, the one that strands what is left of the others: M memory, C cores, S slots. A device
out of slots or cores with memory still free is outlined: that free memory is stranded, and it is
what ``strandedMiBAtEnd`` adds up. The tooltip has the three figures in full.

The map keeps its natural size (a cell must stay readable) and sits in a box that scrolls
sideways on a narrow window, so a cluster with many devices per node never widens the page.
"""
from __future__ import annotations

from html import escape

from hami_py.offline.palette import IDLE, UNHEALTHY, colour
from hami_py.simulate.results import DeviceState, ScenarioResult, device_label, percent

_CELL_W, _CELL_H, _GAP = 40, 32, 3
_LEGEND_W = 560
EXHAUSTED_LETTERS = (("M", "memory"), ("C", "cores"), ("S", "slots"))


def used_up(d: DeviceState) -> str:
    """The letters of the resources a healthy device has none left of: ``M``, ``C``, ``S``
    (several when more than one is used up; "" when each has some left)."""
    if not d.health:
        return ""
    out = ""
    if d.memory and d.memory_used >= d.memory:
        out += "M"
    if d.cores and d.cores_used >= d.cores:
        out += "C"
    if d.slots and d.slots_used >= d.slots:
        out += "S"
    return out


def heat_map(result: ScenarioResult, *, title: str = "") -> str:
    """Inline SVG: one row per node, one cell per device, coloured by memory use, marked with
    what is used up, outlined when free memory is stranded."""
    rows = result.node_rows()
    label_w = 8 + 7 * max([4] + [len(r["name"]) for r in rows])
    columns = max([1] + [len(r["gpus"]) for r in rows])
    width = max(label_w + columns * (_CELL_W + _GAP) + 10, _LEGEND_W)
    height = 24 + len(rows) * (_CELL_H + _GAP) + 58
    kind = "device" if result.mixed else "GPU"
    out = [f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="{kind} heat map {escape(title)}" font-family="system-ui,sans-serif" '
           'font-size="11">']
    for k in range(columns):
        x = label_w + k * (_CELL_W + _GAP) + _CELL_W / 2
        out.append(f'<text x="{x}" y="14" text-anchor="middle" fill="#5b6775">{"dev" if result.mixed else "gpu"}{k}'
                   "</text>")
    for i, row in enumerate(rows):
        y = 22 + i * (_CELL_H + _GAP)
        out.append(f'<text x="{label_w - 6}" y="{y + 20}" text-anchor="end" fill="#1d2733">'
                   f'{escape(row["name"])}</text>')
        for k, d in enumerate(row["gpus"]):
            out.append(_cell(d, label_w + k * (_CELL_W + _GAP), y, node=row["name"], mixed=result.mixed))
    out.append(_legend(height - 48))
    out.append("</svg>")
    return "".join(out)


def _cell(d: DeviceState, x: float, y: float, *, node: str, mixed: bool) -> str:
    fraction = d.memory_used / d.memory if d.memory else 0.0
    fill = UNHEALTHY if not d.health else (IDLE if d.slots_used == 0 else colour(fraction))
    ink = "#fff" if (not d.health or fraction > 0.6) else "#1d2733"
    letters = used_up(d)
    stranded = d.stranded_mib
    tip = (f"{node} {device_label(d, mixed=mixed)} {d.type}: memory {d.memory_used}/{d.memory} MiB "
           f"({percent(d.memory_used, d.memory)}%), cores {d.cores_used}/{d.cores}, slots {d.slots_used}/{d.slots}"
           + ("" if d.health else ", unhealthy")
           + (f"; used up: {', '.join(name for letter, name in EXHAUSTED_LETTERS if letter in letters)}"
              if letters else "")
           + (f"; {stranded} MiB free memory stranded" if stranded else ""))
    outline = ('stroke="#1d2733" stroke-width="2.5" stroke-dasharray="4 2"' if stranded
               else 'stroke="#c5ced8" stroke-width="0.5"')
    text = "x" if not d.health else f"{round(100 * fraction)}"
    parts = [f'<g class="mark" data-used-up="{letters}" data-stranded-mib="{stranded}"><title>{escape(tip)}</title>'
             f'<rect x="{x}" y="{y}" width="{_CELL_W}" height="{_CELL_H}" rx="3" fill="{fill}" {outline}/>'
             f'<text x="{x + _CELL_W / 2}" y="{y + 13}" text-anchor="middle" fill="{ink}">{text}</text>']
    if letters:
        parts.append(f'<text x="{x + _CELL_W / 2}" y="{y + 27}" text-anchor="middle" fill="{ink}" font-size="10" '
                     f'font-weight="700">{letters}</text>')
    parts.append("</g>")
    return "".join(parts)


def _legend(y: float) -> str:
    """Two lines: the colour steps with the idle and unhealthy swatches; then the letters and the
    outline."""
    steps, box = 10, 16
    parts = [f'<text x="4" y="{y + 11}" fill="#5b6775">0%</text>']
    x0 = 26
    for k in range(steps + 1):
        parts.append(f'<rect x="{x0 + k * box}" y="{y}" width="{box}" height="14" fill="{colour(k / steps)}"/>')
    x = x0 + (steps + 1) * box + 4
    parts.append(f'<text x="{x}" y="{y + 11}" fill="#5b6775">100% memory used</text>')
    x += 124
    parts.append(f'<rect x="{x}" y="{y}" width="{box}" height="14" fill="{IDLE}" stroke="#c5ced8"/>'
                 f'<text x="{x + 20}" y="{y + 11}" fill="#5b6775">idle</text>')
    x += 50
    parts.append(f'<rect x="{x}" y="{y}" width="{box}" height="14" fill="{UNHEALTHY}"/>'
                 f'<text x="{x + 20}" y="{y + 11}" fill="#5b6775">unhealthy (x)</text>')
    y2 = y + 24
    parts.append(f'<text x="4" y="{y2 + 11}" fill="#5b6775"><tspan font-weight="700" fill="#1d2733">M C S</tspan>'
                 " used up: memory, cores, slots</text>")
    parts.append(f'<rect x="236" y="{y2}" width="{box + 8}" height="14" rx="3" fill="#fff" stroke="#1d2733" '
                 f'stroke-width="2.5" stroke-dasharray="4 2"/>'
                 f'<text x="268" y="{y2 + 11}" fill="#5b6775">free memory stranded (out of slots or cores)</text>')
    return "".join(parts)

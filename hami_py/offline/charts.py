"""Small inline SVG charts for the offline tools' HTML pages: bars and lines, drawn here.

The pages are single files that open from a mail attachment or a wiki with nothing fetched and
no script, so a chart is a few SVG elements written out by hand, not a library. Each chart has a
viewBox and scales down to the width of its box (the page's CSS gives ``svg.chart`` a max-width
of 100 %), so a page holds at a 900 px window however many policies it compares.

Every chart carries ``class="chart"`` and one ``class="mark"`` element per value drawn (a bar, a
line): the browser test (tests/test_reports_browser.py) counts them in the rendered page, so a
chart that lost its data fails there, not in a reader's hands.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

INK = "#1d2733"
MUTED = "#5b6775"
GRID = "#e3e8ee"
BAR = "#7d93ad"
BEST = "#1a7f37"
# Distinct line colours (colour-blind safe order), one per series.
SERIES = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

# The layout both pages share: a chart scales to its box; what has a natural width (a table, a
# heat map) scrolls inside its own box; a long unbroken word (a path, a pod name) wraps.
CSS = """
svg.chart{max-width:100%;height:auto;display:block}
.scroll{overflow-x:auto;max-width:100%}
.inputs,.reason{overflow-wrap:anywhere}
@media (max-width:700px){body{margin:12px}}
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:10px 18px;margin:8px 0}
.panel h3{font-size:13px;margin:4px 0 2px}.panel p{margin:0 0 2px;color:#5b6775;font-size:12px}
"""


@dataclass
class Bar:
    label: str          # what the bar is (a policy pair)
    value: float
    shown: str          # the value as the page prints it
    best: bool = False  # drawn in the "best" colour


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]   # (x, y), x ascending


def compact(value: float) -> str:
    """An axis tick: 0, 850, 12k, 1.5M."""
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:.1f}".rstrip("0").rstrip(".") + "M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}".rstrip("0").rstrip(".") + "k"
    return f"{value:g}"


def nice_ceiling(value: float, ticks: int = 4) -> tuple[float, float]:
    """(top, step) of an axis from 0 holding ``value`` in about ``ticks`` steps of 1, 2 or 5 x 10^k."""
    if value <= 0:
        return 1.0, 1.0
    raw = value / ticks
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if step < 1 and value >= 1:
        step = 1.0
    return step * math.ceil(value / step), step


def bar_panel(bars: list[Bar], *, caption: str, width: int = 300) -> str:
    """Horizontal bars from a common zero, one per item, the label above its bar: reads at any
    width (the labels never compete with the bars for room)."""
    row_h, top = 30, 4
    height = top + row_h * len(bars) + 4
    peak = max([b.value for b in bars] + [0])
    room = width - 70         # the value is printed after the bar
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{escape(caption)}" '
           f'font-family="system-ui,sans-serif" font-size="11">']
    for i, b in enumerate(bars):
        y = top + i * row_h
        length = room * b.value / peak if peak > 0 else 0.0
        fill = BEST if b.best else BAR
        weight = ' font-weight="600"' if b.best else ""
        out.append(f'<text x="0" y="{y + 10}" fill="{MUTED}"{weight}>{escape(b.label)}</text>'
                   f'<rect class="mark" x="0" y="{y + 13}" width="{max(length, 1.5):.1f}" height="11" rx="2" '
                   f'fill="{fill}"><title>{escape(b.label)}: {escape(b.shown)}</title></rect>'
                   f'<text x="{max(length, 1.5) + 5:.1f}" y="{y + 22}" fill="{INK}"{weight}>{escape(b.shown)}</text>')
    out.append("</svg>")
    return "".join(out)


def line_chart(series: list[Series], *, caption: str, x_label: str, y_label: str, width: int = 820,
               height: int = 220) -> str:
    """Lines over a common x axis from 0, a legend under the plot when there is more than one."""
    left, right, top = 52, 14, 10
    # Legend columns as wide as the longest name needs (about 6.5 px a character at 11 px).
    legend_cols = max(1, min(len(series), int((width - left - right) // (26 + 6.5 * max(
        [1] + [len(s.name) for s in series])))))
    legend_rows = math.ceil(len(series) / legend_cols) if len(series) > 1 else 0
    bottom = 34 + 18 * legend_rows
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x_top = max(xs + [1])
    y_top, y_step = nice_ceiling(max(ys + [0]))

    def px(x: float) -> float:
        return left + plot_w * x / x_top

    def py(y: float) -> float:
        return top + plot_h * (1 - y / y_top)

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{escape(caption)}" '
           f'font-family="system-ui,sans-serif" font-size="11">']
    tick = 0.0
    while tick <= y_top + 1e-9:
        y = py(tick)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{MUTED}">{compact(tick)}</text>')
        tick += y_step
    _, x_step = nice_ceiling(x_top, ticks=6)
    tick = 0.0
    while tick <= x_top + 1e-9:
        out.append(f'<text x="{px(tick):.1f}" y="{top + plot_h + 14}" text-anchor="middle" fill="{MUTED}">'
                   f'{compact(tick)}</text>')
        tick += x_step
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="{MUTED}"/>'
               f'<text x="{left + plot_w}" y="{top + plot_h + 28}" text-anchor="end" fill="{MUTED}">'
               f'{escape(x_label)}</text>'
               f'<text x="{left - 44}" y="{top + plot_h + 28}" fill="{MUTED}">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        colour = SERIES[i % len(SERIES)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        last = s.points[-1][1] if s.points else 0
        title = f"<title>{escape(s.name)}: {compact(last)} at the end</title>"
        if len(s.points) == 1:      # one sample draws no line: a dot
            (x, y), = s.points
            out.append(f'<circle class="mark" cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}">{title}</circle>')
        else:
            out.append(f'<polyline class="mark" data-points="{len(s.points)}" points="{points}" fill="none" '
                       f'stroke="{colour}" stroke-width="1.8" stroke-linejoin="round">{title}</polyline>')
        if legend_rows:
            lx = left + (i % legend_cols) * (plot_w / legend_cols)
            ly = top + plot_h + 44 + 18 * (i // legend_cols)
            out.append(f'<rect x="{lx:.1f}" y="{ly - 9}" width="14" height="4" fill="{colour}"/>'
                       f'<text x="{lx + 19:.1f}" y="{ly - 4}" fill="{INK}">{escape(s.name)}</text>')
    out.append("</svg>")
    return "".join(out)

"""The look both offline tools' reports share: memory-use colours, glyphs and the page's CSS.

``simulate`` and ``defrag`` show the same devices (the scheduler's books), so a planner reading
both reports must see one picture: the same heat colours in the HTML pages and the same glyph
strips in the terminal tables.
"""
from __future__ import annotations

# Sequential colour scale for memory use: pale green (little) through amber to deep red (full).
_STOPS = ((0.0, (214, 239, 207)), (0.5, (253, 190, 90)), (1.0, (178, 24, 43)))
IDLE = "#eef1f4"
UNHEALTHY = "#5c6670"
_BLOCKS = "▁▂▃▄▅▆▇█"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px 32px;color:#1d2733}
body{background:#fff}h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
.inputs{color:#4a5663}.inputs div{margin:2px 0}.note{color:#8a5a00}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #dde3ea;border-radius:8px;padding:10px 14px;min-width:130px;background:#f8fafc}
.card .v{font-size:22px;font-weight:600}
.card .l{color:#5b6775;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card.bad .v{color:#b2182b}.card.good .v{color:#1a7f37}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #edf0f3}
th{background:#f3f6f9;font-weight:600}td.l,th.l{text-align:left}tr.best td{font-weight:600;background:#f0f9f1}
.maps{display:flex;flex-wrap:wrap;gap:24px}.map h3{font-size:14px;margin:6px 0}
.reason{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;text-align:left}
details summary{cursor:pointer;color:#24527a}
"""


def colour(fraction: float) -> str:
    """The heat map colour for a memory-use fraction in [0, 1]."""
    f = min(1.0, max(0.0, fraction))
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:]):
        if f <= x1:
            t = (f - x0) / (x1 - x0)
            return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(c0, c1))
    return "#" + "".join(f"{v:02x}" for v in _STOPS[-1][1])


def memory_glyph(used: int, total: int, healthy: bool) -> str:
    """One character per GPU: ``x`` unhealthy, ``·`` idle, else a block as tall as its memory use."""
    if not healthy:
        return "x"
    if used <= 0 or total <= 0:
        return "·"
    return _BLOCKS[min(len(_BLOCKS) - 1, (len(_BLOCKS) * used - 1) // total)]

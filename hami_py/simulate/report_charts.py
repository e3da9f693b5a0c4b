"""The simulation report's charts: the policy comparison and the run over its arrivals.

``--compare-policies`` used to be a table of fourteen columns, wider than a laptop's window and
read column by column. Here each figure is a small panel of bars, one bar per policy pair, the
best pair (BEST_RULE) in green, so "which pair strands least" is one glance at one panel; the
exact numbers stay a click away in a table under the panels.

The line charts show what a figure at the end hides: when pods started to wait and whether
stranded memory grew steadily or in steps. They draw ``ScenarioResult.timeline`` (pending pods
and stranded MiB after each arrival), one line per policy pair.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Callable

from hami_py.offline.charts import Bar, Series, bar_panel, line_chart
from hami_py.simulate.results import BEST_RULE, ScenarioResult, best_scenario


@dataclass(frozen=True)
class Figure:
    """One comparison panel: the figure's name on the page, its JSON key in ``summary`` and in
    ``comparison[]``, which way is better, and how to read it off a summary."""
    name: str
    key: str
    better: str                       # "more" or "less"
    value: Callable[[dict], float]
    shown: Callable[[dict], str]


def _percent(path: str) -> Callable[[dict], float]:
    head, _, tail = path.partition(".")
    return lambda s: s[head][tail]


FIGURES = (
    Figure("placed", "placed", "more", lambda s: s["placed"], lambda s: str(s["placed"])),
    Figure("pending", "pending", "less", lambda s: s["pending"], lambda s: str(s["pending"])),
    Figure("pending, memory free", "fragmentationFailures", "less", lambda s: s["fragmentationFailures"],
           lambda s: str(s["fragmentationFailures"])),
    Figure("GPUs in use", "gpusInUse", "less", lambda s: s["gpusInUse"], lambda s: f"{s['gpusInUse']}/{s['gpus']}"),
    Figure("whole devices free", "wholeDevicesFree", "more", lambda s: s["wholeDevicesFree"],
           lambda s: str(s["wholeDevicesFree"])),
    Figure("stranded MiB at end", "strandedMiBAtEnd", "less", lambda s: s["strandedMiBAtEnd"],
           lambda s: f"{s['strandedMiBAtEnd']:,}"),
    Figure("stranded MiB mean", "strandedMiBMean", "less", lambda s: s["strandedMiBMean"],
           lambda s: f"{s['strandedMiBMean']:,}"),
    Figure("fragmented", "fragmentation.percent", "less", _percent("fragmentation.percent"),
           lambda s: f"{s['fragmentation']['percent']}%"),
    Figure("memory used", "memory.percent", "more", _percent("memory.percent"),
           lambda s: f"{s['memory']['percent']}%"),
    Figure("cores used", "cores.percent", "more", _percent("cores.percent"), lambda s: f"{s['cores']['percent']}%"),
)
MOVES = Figure("pods moved", "moves", "less", lambda s: s["moves"], lambda s: str(s["moves"]))
# With --defrag-every every pair is also run without moves (ScenarioResult.baseline).
UNMOVED = Figure("placed without moves", "withoutMoves.placed", "more", lambda s: s["withoutMoves"]["placed"],
                 lambda s: str(s["withoutMoves"]["placed"]))


def comparison_panels(results: list[ScenarioResult], *, chosen: ScenarioResult) -> str:
    """One panel of bars per figure, one bar per policy pair; the exact table folded below."""
    best = best_scenario(results)
    summaries = [(x, x.summary()) for x in results]
    mixed = any(x.mixed for x in results)
    figures = [*FIGURES, *([MOVES] if any(x.defrag_every for x in results) else []),
               *([UNMOVED] if all("withoutMoves" in s for _, s in summaries) else [])]
    out = [f'<p>Each panel is one figure, one bar per policy pair (node/GPU); '
           f'<b class="best-ink">green</b> is the best pair: {escape(BEST_RULE)}. '
           f'The pair the flags chose is marked "(chosen)". What each figure means: the glossary at the end.</p>',
           '<div class="panels">']
    for f in figures:
        name = f.name.replace("GPUs", "devices") if mixed else f.name
        bars = [Bar(label=x.label + (" (chosen)" if x is chosen else ""), value=f.value(s), shown=f.shown(s),
                    best=x is best) for x, s in summaries]
        out.append(f'<div class="panel" data-figure="{escape(f.key)}"><h3>{escape(name)}</h3>'
                   f'<p><code>{escape(f.key)}</code>, {f.better} is better</p>'
                   f'{bar_panel(bars, caption=f"{name} per policy pair")}</div>')
    out.append("</div>")
    out.append(_comparison_table(summaries, best=best, chosen=chosen, mixed=mixed))
    return "".join(out)


def _comparison_table(summaries: list[tuple[ScenarioResult, dict]], *, best: ScenarioResult,
                      chosen: ScenarioResult, mixed: bool) -> str:
    """The same figures as numbers, folded away: for copying into a ticket."""
    head = ("policies", "placed", "pending", "pending, memory free", "nodes in use",
            "devices in use" if mixed else "GPUs in use", "whole devices free", "memory used", "cores used",
            "slots used", "fragmented", "stranded MiB at end", "stranded MiB mean", "pods moved",
            "placed without moves")
    rows = ['<details><summary>the figures as a table</summary><div class="scroll"><table><tr>',
            *(f'<th class="{"l" if i == 0 else ""}">{escape(h)}</th>' for i, h in enumerate(head)), "</tr>"]
    for x, s in summaries:
        marks = (" (best)" if x is best else "") + (" (chosen)" if x is chosen else "")
        cells = (s["placed"], s["pending"], s["fragmentationFailures"], s["nodesInUse"], s["gpusInUse"],
                 s["wholeDevicesFree"], f"{s['memory']['percent']}%", f"{s['cores']['percent']}%",
                 f"{s['slots']['percent']}%", f"{s['fragmentation']['percent']}%", f"{s['strandedMiBAtEnd']:,}",
                 f"{s['strandedMiBMean']:,}", s["moves"], s["withoutMoves"]["placed"] if "withoutMoves" in s else "-")
        rows.append(f'<tr class="{"best" if x is best else ""}"><td class="l">{escape(x.label + marks)}</td>'
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    rows.append("</table></div></details>")
    return "".join(rows)


def timeline_charts(results: list[ScenarioResult]) -> str:
    """Pending pods and stranded MiB after each arrival, one line per scenario; "" when no run
    recorded a timeline."""
    # A run with moves brings its run without them (the baseline): drawn beside it.
    runs = [(x.label, x) for x in results]
    runs += [(f"{x.label} without moves", x.baseline) for x in results if x.baseline is not None]
    recorded = [(label, x) for label, x in runs if x.timeline]
    if not recorded:
        return ""
    pending = [Series(label, [(step, pods) for step, pods, _ in _samples(x)]) for label, x in recorded]
    stranded = [Series(label, [(step, mib) for step, _, mib in _samples(x)]) for label, x in recorded]
    return ('<div class="timeline"><h3>Pending pods after each arrival (<code>pending</code> at the end)</h3>'
            + line_chart(pending, caption="pending pods over the arrivals", x_label="arrivals", y_label="pods")
            + "<h3>Stranded memory after each arrival, MiB (<code>strandedMiBAtEnd</code> at the end, "
              "<code>strandedMiBMean</code> its mean)</h3>"
            + line_chart(stranded, caption="stranded MiB over the arrivals", x_label="arrivals", y_label="MiB")
            + "</div>")


def _samples(x: ScenarioResult) -> list[tuple[int, int, int]]:
    """The run's samples, ending on its figures at the end: the defragmenter runs once more after
    the last arrival, and a line must end where the cards' figures say."""
    s = x.summary()
    end = (x.timeline[-1][0], s["pending"], s["strandedMiBAtEnd"])
    return x.timeline if x.timeline[-1] == end else [*x.timeline, end]

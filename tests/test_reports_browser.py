"""Every HTML report, rendered in a real browser at 900 px: nothing overflows, every chart has data.

How it measures, and why this way. The reports carry no script (they must open the same from a
mail attachment or a wiki that strips scripts), so the test does not add one to them either: it
writes a small harness page beside the report that shows it in a 900 px wide ``<iframe>`` and,
from the iframe's ``onload`` (an attribute, so it cannot miss the event), measures the report's
own document and writes the figures as JSON into a ``data-measure`` attribute of the harness.
Headless Chromium loads the harness with ``--dump-dom`` and a virtual-time budget, which prints
the DOM only once the page (its iframe included: a frame holds up its parent's load event) has
loaded and gone idle; the test reads the attribute back. ``--allow-file-access-from-files``
lets the harness read a ``file://`` frame; without it the harness records the refusal and the
test fails naming it, rather than passing on nothing.

What is measured is what a reader sees: the report's width against the frame's (a table or a
heat map that does not fit must scroll in its own box, never widen the page), every element
sticking out of the frame outside such a box (named, for the failure message), and for each
chart its size, its right edge, and its data marks (bars and cells with an area, lines with
points). Folded ``<details>`` are opened first, as a reader would.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hami_py.defrag import cli as defrag_cli
from hami_py.defrag.report import GLOSSARY as DEFRAG_GLOSSARY
from hami_py.simulate import cli as simulate_cli
from hami_py.simulate.report_charts import FIGURES
from hami_py.simulate.report_html import render_html
from hami_py.simulate.results import DeviceState, Fragmentation, PodOutcome, Report, ScenarioResult

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
WIDTH = 900

_HARNESS = """<!DOCTYPE html><html><head><meta charset="utf-8">
<style>html,body{margin:0}iframe{border:0;display:block;width:%(width)dpx;height:1400px}</style>
<script>
function measure(frame) {
  var out = {};
  try {
    var doc = frame.contentDocument, root = doc.documentElement;
    Array.prototype.forEach.call(doc.querySelectorAll('details'), function (d) { d.open = true; });
    var view = root.clientWidth;
    out.viewport = view;
    out.pageWidth = root.scrollWidth;
    out.outside = [];
    var clipped = function (el) {        // inside a box that scrolls or clips sideways
      for (var a = el.parentElement; a && a !== doc.body; a = a.parentElement)
        if (frame.contentWindow.getComputedStyle(a).overflowX !== 'visible') return true;
      return false;
    };
    Array.prototype.forEach.call(doc.body.querySelectorAll('*'), function (el) {
      if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg' || clipped(el)) return;
      var r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > view + 0.5 && out.outside.length < 8)
        out.outside.push(el.tagName.toLowerCase() + '.' + (el.getAttribute('class') || '')
                         + ' right=' + Math.round(r.right) + ' "' + (el.textContent || '').slice(0, 40) + '"');
    });
    out.scrollBoxes = Array.prototype.map.call(doc.querySelectorAll('.scroll'), function (box) {
      return Math.round(box.getBoundingClientRect().right);
    });
    out.scrolling = [];       // the boxes that do scroll at this width, by what they hold
    Array.prototype.forEach.call(doc.querySelectorAll('.scroll'), function (box) {
      if (box.scrollWidth > box.clientWidth + 1 && box.firstElementChild)
        out.scrolling.push(box.firstElementChild.tagName.toLowerCase() + '.'
                           + (box.firstElementChild.getAttribute('class') || ''));
    });
    out.charts = Array.prototype.map.call(doc.querySelectorAll('svg.chart, svg.heatmap'), function (svg) {
      var r = svg.getBoundingClientRect(), marks = svg.querySelectorAll('.mark'), drawn = 0;
      Array.prototype.forEach.call(marks, function (m) {
        var b = m.getBoundingClientRect();
        if (m.tagName.toLowerCase() === 'polyline' ? m.points.numberOfItems >= 2 : b.width > 0 && b.height > 0)
          drawn += 1;
      });
      return {kind: svg.getAttribute('class'), label: svg.getAttribute('aria-label'), width: r.width,
              height: r.height, right: r.right, marks: marks.length, drawn: drawn,
              inScroll: !!svg.closest('.scroll')};
    });
  } catch (e) { out.error = String(e); }
  document.body.setAttribute('data-measure', JSON.stringify(out));
}
</script></head><body><iframe src="%(src)s" onload="measure(this)"></iframe></body></html>
"""


def _browser() -> str:
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the browser checks need it")
    return browser


def measure(report: Path, tmp_path: Path) -> dict:
    """The report as headless Chromium lays it out in a 900 px frame (see the module docstring)."""
    harness = report.with_name(report.stem + "-harness.html")
    harness.write_text(_HARNESS % {"width": WIDTH, "src": report.name})
    done = subprocess.run(
        [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--allow-file-access-from-files", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={WIDTH},1400", "--run-all-compositor-stages-before-draw", "--virtual-time-budget=10000",
         "--dump-dom", harness.as_uri()],
        capture_output=True, timeout=120, check=False, text=True)
    found = re.search(r'data-measure="([^"]*)"', done.stdout)
    assert found, f"the harness measured nothing (exit {done.returncode}): {done.stderr[-600:]}"
    out = json.loads(html.unescape(found.group(1)))
    assert "error" not in out, f"the harness could not read the report: {out['error']}"
    return out


def assert_holds_at_900(m: dict) -> None:
    assert m["viewport"] <= WIDTH
    assert m["pageWidth"] <= m["viewport"], f"the page is {m['pageWidth']} px wide: {m['outside']}"
    assert m["outside"] == [], m["outside"]
    assert all(right <= m["viewport"] + 0.5 for right in m["scrollBoxes"])
    # Text reflows: the glossary never needs a scroll bar at 900 px.
    assert "table.glossary" not in m["scrolling"], m["scrolling"]


def assert_charts_have_data(m: dict) -> None:
    assert m["charts"], "no chart on the page"
    for chart in m["charts"]:
        assert chart["width"] > 0 and chart["height"] > 0, chart
        assert chart["marks"] > 0 and chart["drawn"] == chart["marks"], f"a chart without data: {chart}"
        if chart["kind"] == "chart":     # a chart scales to its box; only a heat map may scroll
            assert chart["right"] <= m["viewport"] + 0.5, chart


def _charts(m: dict, label: str) -> list[dict]:
    return [c for c in m["charts"] if label in (c["label"] or "")]


def _simulate(tmp_path: Path, name: str, example: str, *flags: str) -> Path:
    target = tmp_path / name
    code = simulate_cli.main(["--cluster", str(EXAMPLES / example / "cluster.yaml"), "--workload",
                              str(EXAMPLES / example / "workload.yaml"), "--no-progress", "--output", "html",
                              "--report-file", str(target), *flags])
    assert code == 0
    return target


def _timeline_checked(m: dict, page: str, lines: int) -> None:
    """Pending pods and stranded memory over the arrivals, one line per scenario: both charts,
    each with its lines (every run records them: ScenarioRun.timeline)."""
    assert "<h2>Over the arrivals</h2>" in page
    charts = _charts(m, "over the arrivals")
    assert len(charts) == 2 and all(c["marks"] == lines for c in charts), charts


def test_simulate_report_of_one_policy_pair_holds_at_900px(tmp_path, capsys):
    report = _simulate(tmp_path, "churn.html", "churn")
    m = measure(report, tmp_path)
    assert_holds_at_900(m)
    assert_charts_have_data(m)
    (heat,) = [c for c in m["charts"] if c["kind"] == "heatmap"]
    assert heat["marks"] == 32                       # one cell per device: 8 nodes x 4 A100
    _timeline_checked(m, report.read_text(), lines=1)


def test_simulate_policy_comparison_holds_at_900px(tmp_path, capsys):
    report = _simulate(tmp_path, "compare.html", "small", "--compare-policies")
    m = measure(report, tmp_path)
    assert_holds_at_900(m)
    assert_charts_have_data(m)
    pairs = 5                                        # upstream's four pairs and fragmentation-aware
    panels = _charts(m, "per policy pair")
    assert len(panels) == len(FIGURES) and all(c["marks"] == pairs for c in panels), panels
    assert len([c for c in m["charts"] if c["kind"] == "heatmap"]) == 1 + pairs
    _timeline_checked(m, report.read_text(), lines=pairs)


def test_defrag_report_holds_at_900px(tmp_path, capsys):
    target = tmp_path / "defrag.html"
    code = defrag_cli.main(["--cluster", str(EXAMPLES / "defrag/cluster.yaml"), "--output", "html",
                            "--report-file", str(target)])
    assert code == 0
    m = measure(target, tmp_path)
    assert_holds_at_900(m)
    assert_charts_have_data(m)
    (chart,) = _charts(m, "before and after")
    assert chart["marks"] == 8                       # gpu-b and gpu-c, two devices each, before and after


def _crowded_report() -> Report:
    """A page built to overflow: sixteen devices a node, long node and pod names, a long reason,
    six policy pairs with a timeline each."""
    def result(node_policy: str, gpu_policy: str, shift: int) -> ScenarioResult:
        devices = [DeviceState(node=f"gpu-node-with-a-long-name-{n}", index=i, uuid=f"GPU-{n}-{i}",
                               type="NVIDIA H200", health=(n, i) != (0, 3), slots=4,
                               slots_used=(i + shift) % 5,
                               memory=143771, memory_used=min(143771, 9000 * ((i * 7 + shift) % 17)),
                               cores=100, cores_used=min(100, 10 * ((i + n + shift) % 11)))
                   for n in range(3) for i in range(16)]
        pods = [PodOutcome(namespace="a-namespace-with-a-long-name", name=f"pod-{k}-" + "x" * 60,
                           template="t", arrival=k, node=None if k % 3 else devices[k].node,
                           reason="0/3 nodes are available: 3 node(s) 16/16 CardInsufficientMemory" * 3)
                   for k in range(30)]
        timeline = [(k, (k * (shift + 1)) % 9, 4096 * ((k + shift) % 13)) for k in range(1, 41)]
        return ScenarioResult(node_policy=node_policy, gpu_policy=gpu_policy, pods=pods, devices=devices,
                              fragmentation=Fragmentation(request="1 NVIDIA device x 8192 MiB, 20% cores",
                                                          free_mib=900000, stranded_mib=120000 + shift,
                                                          stranded_gpus=4),
                              mean_stranded_mib=1000 * shift, timeline=timeline)

    pairs = [("binpack", "binpack"), ("binpack", "spread"), ("spread", "binpack"), ("spread", "spread"),
             ("fragmentation-aware", "fragmentation-aware"), ("binpack", "fragmentation-aware")]
    results = [result(n, g, k) for k, (n, g) in enumerate(pairs)]
    return Report(cluster_file="clusters/" + "a-very-long-directory-name/" * 6 + "cluster.yaml",
                  cluster="3 nodes, 48 devices", workload_file="workload.yaml", workload="30 pods",
                  notes=["a note " * 30], primary=results[-1], comparison=results)


def test_crowded_comparison_page_holds_at_900px(tmp_path):
    target = tmp_path / "crowded.html"
    target.write_text(render_html(_crowded_report()))
    m = measure(target, tmp_path)
    assert_holds_at_900(m)
    assert_charts_have_data(m)
    # The sixteen-device heat maps are wider than the window: they scroll in their own boxes.
    heat = [c for c in m["charts"] if c["kind"] == "heatmap"]
    assert len(heat) == 7 and all(c["inScroll"] and c["marks"] == 48 for c in heat)
    timeline = _charts(m, "over the arrivals")
    assert len(timeline) == 2 and all(c["marks"] == 6 for c in timeline)


def test_defrag_page_explains_its_words_in_the_json_names(tmp_path, capsys):
    """No browser needed: every word the defrag page explains names a key --output json has."""
    assert defrag_cli.main(["--cluster", str(EXAMPLES / "defrag/cluster.yaml"), "--output", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    target = tmp_path / "defrag.html"
    assert defrag_cli.main(["--cluster", str(EXAMPLES / "defrag/cluster.yaml"), "--output", "html",
                            "--report-file", str(target)]) == 0
    page = target.read_text()
    keys = {k for _, key, _ in DEFRAG_GLOSSARY for k in key.split(", ") if k}
    for key in keys:
        head, _, field = key.partition("[].")
        value = plan[head]
        assert all(field in entry for entry in value) if field else value is not None, key
    # Each card names its key, and each card's word is explained at the end of the page.
    for label, key in re.findall(r'<div class="l">([^<]+)</div><div class="k">([^<]+)</div>', page):
        assert all(k in plan for k in key.split(", ")), key
        assert any(word.startswith(label.split(",")[0]) for word, _, _ in DEFRAG_GLOSSARY), label

"""The HTML report: self-contained, what its charts draw, its words, and it really renders.

The heat map marks what strands each device, the comparison is a panel of bars per figure, the
timeline a line per policy pair, and every figure and column name is explained on the page in
the JSON's names. tests/test_reports_browser.py checks the layout at 900 px in Chromium.

The screenshot is decoded here with zlib (a PNG is a few chunks and filtered scanlines), so no
imaging library is needed: the page must show many colours, and the heat-map colour of a GPU
the report says is 90 % full must be on screen.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from hami_py.offline.charts import BEST
from hami_py.offline.palette import colour
from hami_py.simulate import cli
from hami_py.simulate.heatmap import used_up
from hami_py.simulate.report_charts import FIGURES, MOVES, UNMOVED, comparison_panels, timeline_charts
from hami_py.simulate.report_html import GLOSSARY, heat_map, render_html
from hami_py.simulate.report_json import report_object
from hami_py.simulate.report_text import comparison_table
from hami_py.simulate.results import DeviceState, Fragmentation, PodOutcome, Report, ScenarioResult

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _decode_png(data: bytes) -> tuple[int, int, list[bytes], int]:
    """(width, height, unfiltered rows, bytes per pixel) of an 8-bit, non-interlaced RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = previous[i]
            corner = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows, bpp


def _small_report_html(tmp_path: Path) -> Path:
    target = tmp_path / "report.html"
    code = cli.main(["--cluster", str(EXAMPLES / "small/cluster.yaml"), "--workload",
                     str(EXAMPLES / "small/workload.yaml"), "--output", "html", "--report-file", str(target)])
    assert code == 0
    return target


def test_html_report_is_self_contained(tmp_path, capsys):
    target = _small_report_html(tmp_path)
    assert capsys.readouterr().out == f"wrote {target}\n"
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>")
    # Nothing is fetched: no script, no stylesheet link, no src/href, no CSS import or url().
    assert not re.search(r"<script|<link|<img|<iframe|\b(src|href)\s*=|@import|url\(", html, re.I)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}   # SVG's namespace
    # One heat-map cell (a mark with a tooltip) per GPU: 5 in the small example.
    assert html.count('<g class="mark" data-used-up=') == 5
    assert "trainer" in html and "CardInsufficientMemory" in html


def test_html_comparison_has_a_heat_map_per_policy_pair():
    def result(node: str, gpu: str, used: int) -> ScenarioResult:
        devices = [DeviceState(node="n", index=i, uuid=f"GPU-{i}", type="NVIDIA H200", health=True, slots=10,
                               slots_used=1 if i < used else 0, memory=100, memory_used=50 if i < used else 0,
                               cores=100, cores_used=10 if i < used else 0) for i in range(4)]
        return ScenarioResult(node_policy=node, gpu_policy=gpu, pods=[], devices=devices, fragmentation=Fragmentation())

    results = [result("binpack", "binpack", 1), result("binpack", "spread", 3), result("spread", "binpack", 2),
               result("spread", "spread", 4)]
    html = render_html(Report(cluster_file="c.yaml", cluster="1 node", workload_file="w.yaml", workload="0 pods",
                              notes=["<b>escaped</b>"], primary=results[1], comparison=results))
    assert html.count('<svg class="heatmap"') == 5       # the chosen one, then one per pair
    assert "binpack/binpack (best)" in html and "binpack/spread (chosen)" in html
    assert "&lt;b&gt;escaped&lt;/b&gt;" in html and "<b>escaped</b>" not in html
    assert heat_map(results[0]).count('<g class="mark"') == 4


def test_colour_scale_runs_from_pale_to_deep_red():
    assert colour(0.0) == "#d6efcf" and colour(1.0) == "#b2182b" and colour(0.5) == "#fdbe5a"
    assert colour(2.0) == colour(1.0) and colour(-1.0) == colour(0.0)


def test_html_report_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the render check needs it")
    target = _small_report_html(tmp_path)
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,900",
                    target.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists(), "chromium wrote no screenshot"
    width, height, rows, bpp = _decode_png(shot.read_bytes())
    assert (width, height) == (1200, 900)
    pixels = {row[i:i + 3] for row in rows for i in range(0, len(row), bpp)}
    assert len(pixels) >= 20, f"the page looks blank: {len(pixels)} distinct colours"
    # The small example fills both GPUs of a100-0 to 90 %: their heat-map colour is on screen.
    full = bytes.fromhex(colour(0.9)[1:])
    near = [p for p in pixels if all(abs(a - b) <= 3 for a, b in zip(p, full))]
    assert near, f"no heat-map cell of colour {colour(0.9)} in the screenshot"


def _device(index: int, *, slots_used: int = 1, memory_used: int = 40000, cores_used: int = 30,
            health: bool = True) -> DeviceState:
    return DeviceState(node="n", index=index, uuid=f"GPU-{index}", type="NVIDIA A100", health=health, slots=4,
                       slots_used=slots_used, memory=81920, memory_used=memory_used, cores=100, cores_used=cores_used)


def _result(devices: list[DeviceState], node: str = "binpack", gpu: str = "spread",
            timeline: list | None = None) -> ScenarioResult:
    return ScenarioResult(node_policy=node, gpu_policy=gpu, pods=[], devices=devices,
                          fragmentation=Fragmentation(), timeline=timeline or [])


def test_heat_map_marks_what_strands_each_device():
    devices = [_device(0, slots_used=4),                          # out of slots, memory free: stranded
               _device(1, cores_used=100),                        # out of cores, memory free: stranded
               _device(2, memory_used=81920),                     # memory full: strands its cores and slots
               _device(3, slots_used=4, memory_used=81920, cores_used=100),   # all used up, nothing free
               _device(4),                                        # something of everything left
               _device(5, slots_used=4, health=False)]            # unhealthy: nothing counts
    assert [used_up(d) for d in devices] == ["S", "C", "M", "MCS", "", ""]
    svg = heat_map(_result(devices))
    cells = re.findall(r'<g class="mark" data-used-up="([A-Z]*)" data-stranded-mib="(\d+)">', svg)
    assert cells == [("S", "41920"), ("C", "41920"), ("M", "0"), ("MCS", "0"), ("", "0"), ("", "0")]
    # The two stranded devices are outlined (dashed), and their tooltips say what is stranded; the
    # legend explains both marks.
    assert svg.count('stroke-dasharray="4 2"') == 2 + 1
    assert "41920 MiB free memory stranded" in svg and "used up: slots" in svg and "used up: cores" in svg
    assert "used up: memory, cores, slots" in svg and "free memory stranded (out of slots or cores)" in svg


def test_comparison_is_a_panel_of_bars_per_figure_the_best_pair_in_green():
    results = [_result([_device(0, memory_used=m)], node=n, gpu=g)
               for n, g, m in (("binpack", "binpack", 10000), ("spread", "spread", 20000))]
    html = comparison_panels(results, chosen=results[1])
    panels = re.findall(r'<div class="panel" data-figure="([^"]+)">(.*?)</svg></div>', html)
    assert [key for key, _ in panels] == [f.key for f in FIGURES]
    for _, panel in panels:
        assert panel.count('class="mark"') == 2
        assert panel.count(f'fill="{BEST}"') == 1           # ties: the first listed is best
    memory = dict(panels)["memory.percent"]
    assert "12.2%" in memory and "24.4%" in memory and "spread/spread (chosen)" in memory
    # The exact numbers stay on the page, folded.
    assert "<details><summary>the figures as a table</summary>" in html


def test_timeline_draws_pending_and_stranded_per_arrival_one_line_per_pair():
    a = _result([_device(0)], timeline=[(1, 0, 0), (2, 1, 4096), (3, 2, 8192)])
    b = _result([_device(0)], node="spread", timeline=[(1, 0, 0), (2, 1, 2048), (3, 0, 0)])
    html = timeline_charts([a, b])
    lines = re.findall(r'<polyline class="mark" data-points="(\d+)"', html)
    # Two charts, a line per pair each. A line ends on the figures at the end (no pod pending,
    # nothing stranded here): b's last sample says so already; a's gets one more point, as the
    # defragmenter's run after the last arrival would make it.
    assert lines == ["4", "3", "4", "3"]
    assert "Pending pods after each arrival" in html and "strandedMiBAtEnd" in html
    assert "binpack/spread" in html and "spread/spread" in html
    assert timeline_charts([_result([_device(0)])]) == ""      # nothing recorded: no section


def _path(obj, dotted: str):
    """``summary.fragmentation.percent``, ``pods[].reason`` (in any entry of the list)."""
    head, _, rest = dotted.partition(".")
    if head.endswith("[]"):
        entries = [e for e in obj[head[:-2]] if rest.partition(".")[0] in e]
        assert entries, dotted
        return _path(entries[0], rest)
    return _path(obj[head], rest) if rest else obj[head]


def test_every_figure_and_column_is_explained_in_the_json_names():
    r = _result([_device(0), _device(1, slots_used=4)])
    r.defrag_every, r.baseline = 5, _result([_device(0)])      # a run with moves: MOVES and UNMOVED too
    r.pods = [PodOutcome(namespace="ns", name="waits", template="t", arrival=0, reason="0/1 nodes are available",
                         failed_nodes={"n": "1/2 CardInsufficientMemory"})]
    report = Report(cluster_file="c.yaml", cluster="1 node", workload_file="w.yaml", workload="0 pods", notes=[],
                    primary=r, comparison=[r])
    html = render_html(report)
    explained = {name for name, _, _, _ in GLOSSARY}

    def named(label: str) -> bool:      # "GPUs in use" is explained as "GPUs in use (devices in use)"
        return any(label == name or label in name.split(", ") or name.startswith(label + " (") for name in explained)

    # Each card's label is a glossary entry (or one of its parts), and its JSON key is the summary's.
    for label, key in re.findall(r'<div class="l">([^<]+)</div><div class="k">([^<]+)</div>', html):
        assert named(label), label
        _path(r.summary(), key)
    # Every JSON name the glossary gives exists in --output json (one name per figure: the
    # stranded figures are strandedMiBAtEnd, strandedMiBMean and refusingTypicalMiB).
    as_json = report_object(report)
    for _, keys, _, _ in GLOSSARY:
        for key in filter(None, keys.split(", ")):
            _path(as_json, key)
    # So does each panel of the policy comparison, under the glossary's name for it.
    for figure in (*FIGURES, MOVES, UNMOVED):
        assert named(figure.name), figure.name
        _path(as_json["summary"], figure.key)
    # Every column of the terminal table's policy comparison is explained (FRAGFAIL, WHOLE, MEAN ...).
    columns = {part.strip() for _, _, column, _ in GLOSSARY for part in re.split(r"[,()]", column) if part.strip()}
    header = comparison_table([r], chosen=r)[1]
    assert set(re.split(r"\s{2,}", header.strip())) <= columns, set(re.split(r"\s{2,}", header.strip())) - columns
    assert {"FRAGFAIL", "WHOLE", "MEAN", "best", "chosen"} <= columns
    assert "pending, memory free" in explained and "What the figures mean" in html
    assert '<div class="verdict">Moves (<code>withoutMoves</code>)' in html

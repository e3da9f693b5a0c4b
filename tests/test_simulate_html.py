"""The HTML report: self-contained, and it really renders (headless Chromium screenshot).

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

from hami_py.offline.palette import colour
from hami_py.simulate import cli
from hami_py.simulate.report_html import heat_map, render_html
from hami_py.simulate.results import DeviceState, Fragmentation, Report, ScenarioResult

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
    assert re.findall(r"https?://[^\s\"'<>]+", html) == ["http://www.w3.org/2000/svg"]
    # One heat-map cell (a <rect> with a tooltip) per GPU: 5 in the small example.
    assert html.count("<g><title>") == 5
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
    assert html.count("<svg") == 5                      # the chosen one, then one per pair
    assert "binpack/binpack (best)" in html and "binpack/spread (chosen)" in html
    assert "&lt;b&gt;escaped&lt;/b&gt;" in html and "<b>escaped</b>" not in html
    assert heat_map(results[0]).count("<g><title>") == 4


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

"""The device layer does not leak: no family is named outside ``hami_py/devices/``.

A family is one module (or package) under ``hami_py/devices/`` plus a line in its registry. The
scheduler's steps (``scheduling/``), the usage cache (``cache/``) and the HTTP layer (``http/``)
reach families only through ``hami_py.devices.base``'s interface, so adding one never edits them.
These checks fail the build the moment a vendor's name, annotation or module creeps back in.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hami_py"
NEUTRAL = ("scheduling", "cache", "http")
# Every family upstream schedules, and the vendors' resource domains.
VENDOR_NAME = re.compile(
    r"nvidia|ascend(?!ing)|huawei|cambricon|hygon|iluvatar|kunlun|baidu|enflame|metax|mthreads|neuron|"
    r"\bamd\b|amd\.com|biren|vastai|\bdcu\b|\bmlu\b|\bnpu\b|\bxpu\b|\bgcu\b", re.IGNORECASE)
# The device modules anything outside devices/ may import: the interface, not a family.
INTERFACE_MODULES = {"hami_py.devices.base", "hami_py.devices.registry", "hami_py.devices.codec"}


def _sources(part: str) -> list[Path]:
    return sorted((ROOT / part).rglob("*.py"))


@pytest.mark.parametrize("part", NEUTRAL)
def test_no_family_is_named_in_the_vendor_neutral_layers(part):
    found = []
    for path in _sources(part):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if (match := VENDOR_NAME.search(line)) is not None:
                found.append(f"{path.relative_to(ROOT.parent)}:{number}: {match.group(0)!r} in {line.strip()!r}")
    assert not found, "vendor names outside hami_py/devices/:\n" + "\n".join(found)


@pytest.mark.parametrize("part", NEUTRAL)
def test_the_vendor_neutral_layers_import_only_the_device_interface(part):
    found = []
    for path in _sources(part):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("hami_py.devices") and name not in INTERFACE_MODULES:
                    found.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert not found, "\n".join(found)


def test_the_device_layer_does_not_import_the_scheduler():
    """devices -> scheduling was an import cycle (the NVIDIA module took its reason codes from
    scheduling); the reasons now live beside both."""
    found = []
    for path in sorted((ROOT / "devices").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("hami_py.scheduling", "hami_py.cache", "hami_py.http")):
                found.append(f"{path.relative_to(ROOT.parent)} imports {node.module}")
    assert not found, "\n".join(found)

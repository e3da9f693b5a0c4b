"""docs/FEATURES.md stays true: every test it names exists, and every ``Inventory: <row id>`` test
is named by its row. A renamed or deleted test otherwise leaves the map pointing at nothing."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEATURES = ROOT / "docs" / "FEATURES.md"
STATUSES = {"covered", "covered (deliberate difference)", "not implemented yet", "does not apply",
            "other vendor, not implemented yet"}


def _rows() -> dict[str, tuple[str, str]]:
    """row id -> (status, tests cell)."""
    rows = {}
    for line in FEATURES.read_text().splitlines():
        if not line.startswith("| ") or line.startswith(("| ---", "| id ")):
            continue
        row_id, status, tests, _note = (cell.strip() for cell in line.strip()[1:-1].split("|"))
        assert row_id not in rows, f"row {row_id} listed twice"
        rows[row_id] = (status, tests)
    return rows


@lru_cache(maxsize=None)
def _test_functions(path: Path) -> dict[str, str]:
    """test name -> docstring, for every test function of a module."""
    tree = ast.parse(path.read_text())
    return {node.name: ast.get_docstring(node) or "" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def test_every_named_test_exists_and_every_status_is_known():
    rows = _rows()
    assert len(rows) > 100
    for row_id, (status, tests) in rows.items():
        assert status in STATUSES, f"{row_id}: unknown status {status!r}"
        if status.startswith("covered"):
            assert "tests/" in tests, f"{row_id}: covered without a test"
        for module, name in re.findall(r"`(tests/test_\w+\.py)::(\w+)`", tests):
            assert name in _test_functions(ROOT / module), f"{row_id}: {module}::{name} does not exist"


def test_every_inventory_test_is_linked_from_its_row():
    rows = _rows()
    for module in sorted((ROOT / "tests").glob("test_inventory_*.py")):
        for name, doc in _test_functions(module).items():
            if not doc.startswith("Inventory: "):
                continue
            named = doc.splitlines()[0][len("Inventory: "):].split(" (")[0]
            for row_id in (r.strip() for r in named.split(",")):
                assert row_id in rows, f"{name} names unknown row {row_id}"
                assert f"tests/{module.name}::{name}" in rows[row_id][1], f"{row_id} does not link {name}"

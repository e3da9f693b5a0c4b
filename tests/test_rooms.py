"""The house's rooms point one way, no module imports itself round a circle, and none grows too big.

docs/ARCHITECTURE.md draws the rooms of ``hami_py/`` from the top floor down; ``FLOORS`` below is
the same list. A module may import from its own room or from any room on a lower floor, never
from a higher one or from a room beside it on the same floor: so the offline tools sit on the
scheduler and never the reverse, the scheduler's verbs on its decision and never the reverse,
and the device families under everything that schedules. tests/test_layering.py keeps vendor
names out of the neutral rooms; this keeps the arrows between rooms pointing down.

Imports are read with ``ast`` (those inside functions too: a deferred import is still an arrow),
as the modules they name; ``from package import module`` names the module.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 600

# Top floor first. Each floor is a tuple of rooms (module prefixes, dotted); a room's own
# sub-rooms are listed on their own floors where the room is split in layers.
FLOORS: list[tuple[str, ...]] = [
    ("hami_py.__main__",),
    ("hami_py.cli",),
    ("hami_py.simulate",),
    ("hami_py.defrag",),
    ("hami_py.offline",),
    ("hami_py.embedded",),
    ("hami_py.app",),
    ("hami_py.http",),
    ("hami_py.scheduling.admission",),
    ("hami_py.scheduling.verbs",),
    ("hami_py.scheduling.eviction", "hami_py.scheduling.gangs"),
    ("hami_py.scheduling.decision",),
    ("hami_py.scheduling.kernel",),
    ("hami_py.scheduling",),              # the package's face (its docstring names the rooms)
    ("hami_py.allocation_metrics", "hami_py.fakeapi"),
    ("hami_py.k8s",),
    ("hami_py.cache",),
    ("hami_py.devices",),
    ("hami_py.config", "hami_py.kernel_codes"),
    ("hami_py.metrics", "hami_py.podshape", "hami_py.aio", "hami_py.reasons", "hami_py.quantity", "hami_py.logs",
     "hami_py.cliargs"),
    ("hami_py._kernel", "hami_py"),       # the compiled kernel; the package's own face (its version)
]


def _modules(base: str) -> dict[str, Path]:
    out = {}
    for path in sorted((REPO / base).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = {**_modules("hami_py"), **_modules("bench")}


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the house ``name`` imports (a package when the name is not a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m != name and (m in MODULES or m == "hami_py._kernel")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _floor(module: str) -> tuple[int, str]:
    """(floor, room) of a module: the longest room prefix that names it."""
    best = (-1, "")
    for number, rooms in enumerate(FLOORS):
        for room in rooms:
            # A package whose sub-packages are rooms of their own is a room only as its face.
            inside = module.startswith(room + ".") and room not in ("hami_py", "hami_py.scheduling")
            if (module == room or inside) and len(room) > len(best[1]):
                best = (number, room)
    return best


def test_every_module_of_hami_py_has_a_room():
    homeless = [m for m in MODULES if m.startswith("hami_py") and _floor(m)[0] < 0]
    assert not homeless, f"modules on no floor of FLOORS (add their room): {homeless}"


def _pointing_up(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, targets in graph.items():
        if not name.startswith("hami_py"):
            continue
        floor, room = _floor(name)
        for target in sorted(targets):
            their_floor, their_room = _floor(target)
            if their_room != room and their_floor <= floor:
                wrong.append(f"{name} ({room}, floor {floor}) imports {target} ({their_room}, floor {their_floor})")
    return wrong


def test_the_rooms_point_one_way():
    wrong = _pointing_up(GRAPH)
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_the_one_way_check_can_fail():
    """The cache reading the scheduler's decision, or the scheduler the HTTP layer, is caught; the
    reverse and an import inside one room are not."""
    graph = {"hami_py.cache.usage": {"hami_py.scheduling.decision.filter", "hami_py.cache.records"},
             "hami_py.scheduling.kernel.reference": {"hami_py.scheduling.verbs.bind"},
             "hami_py.http.server": {"hami_py.scheduling.verbs.service"}}
    assert _pointing_up(graph) == [
        "hami_py.cache.usage (hami_py.cache, floor 16) imports hami_py.scheduling.decision.filter "
        "(hami_py.scheduling.decision, floor 11)",
        "hami_py.scheduling.kernel.reference (hami_py.scheduling.kernel, floor 12) imports "
        "hami_py.scheduling.verbs.bind (hami_py.scheduling.verbs, floor 9)"]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_round_a_circle():
    circles = _circles(GRAPH)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_can_fail():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("base", ["hami_py", "bench"])
def test_no_module_is_over_600_lines(base):
    big = {str(p.relative_to(REPO)): n for p in sorted((REPO / base).rglob("*.py"))
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them): {big}"

"""The layer order of docs/architecture.md ("Layers") holds for every import of src/freshroll:
no module imports from a layer above its own, and the packages import each other in no
circle (issue 24). Imports inside functions and under ``TYPE_CHECKING`` count: a lazy import
does not make an upward dependency go away."""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "freshroll"
DOC = ROOT / "docs" / "architecture.md"


def _layers() -> dict[str, int]:
    """unit -> its layer's height (0: the ground), from the doc's ```layers block."""
    block = re.search(r"```layers\n(.*?)```", DOC.read_text(), flags=re.S)
    assert block, "docs/architecture.md has no ```layers block"
    rows = [line.split(":", 1)[1].split() for line in block.group(1).strip().splitlines()]
    return {unit: height for height, row in enumerate(reversed(rows)) for unit in row}


def _unit(path: Path, src: Path = SRC) -> str:
    return path.relative_to(src).with_suffix("").parts[0]


@functools.cache
def _imports(src: Path = SRC) -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: the files (and lines) that import it} (one walk of a tree per
    session: three tests read it; callers do not change it)."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(src.rglob("*.py")):
        here = _unit(path, src)
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "freshroll":
                    names = [a.name for a in node.names]
                elif node.module.startswith("freshroll."):
                    names = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names
                         if a.name.startswith("freshroll.")]
            for unit in names:
                if unit != here:
                    out[here][unit].append(f"{path.relative_to(src.parent)}:{node.lineno}")
    return out


def _upward(src: Path = SRC) -> list[str]:
    layers = _layers()
    return [f"{where}: {unit} ({layers[unit]}) imports {other} ({layers[other]})"
            for unit, targets in _imports(src).items() for other, places in targets.items()
            if other in layers and unit in layers and layers[other] > layers[unit]
            for where in places]


def test_every_unit_of_the_tree_has_a_layer() -> None:
    units = {_unit(p) for p in SRC.rglob("*.py")}
    layers = _layers()
    assert units - set(layers) == set(), "add these to docs/architecture.md's layers"
    assert set(layers) - units == set(), "these are in the layers but not in the tree"


def test_no_import_runs_up_a_layer() -> None:
    assert _upward() == []


def test_the_packages_import_each_other_in_no_circle() -> None:
    graph = {u: set(t) for u, t in _imports().items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                raise AssertionError("circle: " + " -> ".join([*path[path.index(v):], v]))
            if v not in state:
                visit(v, [*path, v])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])


def test_the_pipeline_and_the_placements_import_each_other_not() -> None:
    """One layer, two sides (docs/architecture.md): the pipeline awaits the ports, never a
    placement; a placement implements the ports, never reaches into the pipeline."""
    graph = _imports()
    assert dict(graph.get("pipeline", {})).get("placement", []) == []
    assert dict(graph.get("placement", {})).get("pipeline", []) == []


def test_the_check_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    """The walk is load-bearing: a kernel module importing the runtime inside a function (or
    as ``from freshroll import runtime``) is found."""
    src = tmp_path / "freshroll"
    (src / "runtime").mkdir(parents=True)
    (src / "runtime" / "__init__.py").write_text("from freshroll import errors\n")
    (src / "errors.py").write_text("def f():\n    from freshroll.runtime import run\n")
    (src / "clock.py").write_text("from freshroll import runtime\n")
    top = _layers()["runtime"]  # the runtime's height in the doc's layers
    assert sorted(_upward(src)) == [
        f"freshroll/clock.py:1: clock (0) imports runtime ({top})",
        f"freshroll/errors.py:2: errors (0) imports runtime ({top})",
    ]


def rooms_and_arrows(src: Path = SRC) -> tuple[int, int]:
    """The house's two numbers (issue 47): rooms, the folders and root modules of the
    package (``__init__`` and ``__main__`` included), and arrows, the distinct imports
    between two rooms (one arrow per ordered pair, however many lines make it)."""
    rooms = {_unit(p, src) for p in src.rglob("*.py")}
    arrows = sum(len(targets) for targets in _imports(src).values())
    return len(rooms), arrows


def test_the_house_keeps_its_rooms_and_arrows_within_the_goal() -> None:
    """At most 40 rooms, 200 arrows and 15 modules at the package root (issue 47's goals):
    a new root module or a new dependency between two rooms is a decision, made here."""
    rooms, arrows = rooms_and_arrows()
    root = sorted(p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(root) <= 15, f"{len(root)} modules at the package root: {root}"
    assert rooms <= 40, f"{rooms} rooms"
    assert arrows <= 200, f"{arrows} arrows between rooms"


if __name__ == "__main__":  # python tests/test_layers.py: the two numbers
    n_rooms, n_arrows = rooms_and_arrows()
    n_root = len([p for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__")])
    print(f"rooms {n_rooms} (root modules {n_root}), arrows {n_arrows}")

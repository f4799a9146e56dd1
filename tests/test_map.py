"""docs/architecture.md maps every module of src/freshroll: a module added without its line
in the map fails here (issue 24: the map redrawn from the tree, and kept so)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "freshroll"


def test_every_module_has_its_line_in_the_architecture_map() -> None:
    lines = (REPO / "docs" / "architecture.md").read_text().splitlines()
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        rel = path.relative_to(SRC)
        folder = f"{rel.parent.as_posix()}/" if rel.parent != Path(".") else ""
        if not any(path.name in ln and folder in ln for ln in lines):
            missing.append(rel.as_posix())
    assert missing == [], f"modules without a line in docs/architecture.md: {missing}"

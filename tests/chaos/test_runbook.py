"""The runbook covers every fault of the shipped library (issue 8's done-criterion)."""

from __future__ import annotations

from pathlib import Path

from freshroll.chaos.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]


def test_the_runbook_names_every_scenario_of_the_library() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    plan = load_plan(ROOT / "chaos" / "library.yaml")
    missing = [s.name for s in plan.scenarios if f"`{s.name}`" not in runbook]
    assert not missing, f"docs/runbook.md has no section naming {missing}"


def test_the_runbook_has_its_four_parts() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for part in ("## 1. Figures and alerts", "## 2. Fault classes",
                 "## 3. Reading a decision record", "## 4. Reproducing a failing chaos seed"):
        assert part in runbook

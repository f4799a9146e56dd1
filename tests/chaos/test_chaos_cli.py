"""``freshroll chaos``: the tables it writes and its exit statuses (0, 1, 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from freshroll.chaos import runner
from freshroll.cli import main

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _injector(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Injector where chaos/inject.py exists; else the stand-in of these tests."""
    try:
        import freshroll.chaos.inject  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(HERE))
        monkeypatch.setattr(runner, "INJECTOR", "standin:Injector")


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _plan(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    return p


GOOD = """
workload: {run: {steps: 8}}
scenarios:
  - name: operator-stop
    faults: [{kind: interrupt, at: {step: 3}}]
"""


def test_no_violation_exits_0_and_writes_the_tables(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _cli("chaos", str(_plan(tmp_path, GOOD)), "--seeds", "2", "--seed-start", "5",
             "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "| operator-stop | 2 | 0 | 2/2 |" in r.stdout
    assert "chaos operator-stop seed 5 [sim]: ok" in r.stderr
    assert "chaos operator-stop seed 6 [sim]: ok" in r.stderr
    body = json.loads((out / "chaos.json").read_text())
    assert body["seeds"] == [5, 6] and body["totals"]["violations"] == 0
    assert [c["seed"] for c in body["cases"]] == [5, 6]
    assert (out / "chaos.md").read_text().startswith("2 cases, 0 violation(s)")


def test_a_violation_exits_1(tmp_path: Path) -> None:
    plan = _plan(tmp_path, GOOD + """
  - name: never-fires
    faults: [{kind: interrupt, at: {step: 99}}]
""")
    r = _cli("chaos", str(plan), "--seeds", "1", "--out", str(tmp_path / "out"),
             "--only", "never-fires")
    assert r.exit_code == 1, r.output
    assert "faults_recorded" in r.stdout and "operator-stop" not in r.stdout
    assert "fault #0 was planned but never recorded" in r.stdout


@pytest.mark.parametrize(("text", "expect"), [
    ("scenarios: [{name: a, faults: [{kind: interrupt, at: {step: 1}, bogus: 1}]}]",
     "scenarios[0].faults[0].bogus: unknown key"),
    ("scenarios: [{name: a, faults: [{kind: interrupt, at: {}}]}]",
     "scenarios[0].faults[0].at"),
    ("scenarios: [", "not valid YAML"),
])
def test_a_bad_plan_exits_2_naming_file_and_key(tmp_path: Path, text: str, expect: str) -> None:
    plan = _plan(tmp_path, text)
    r = _cli("chaos", str(plan), "--out", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert str(plan) in r.stderr and expect in r.stderr
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_missing_plan_unknown_scenario_or_switch_exit_2(tmp_path: Path) -> None:
    r = _cli("chaos", str(tmp_path / "none.yaml"))
    assert r.exit_code == 2 and "cannot read the plan" in r.stderr
    plan = _plan(tmp_path, GOOD)
    r = _cli("chaos", str(plan), "--only", "nope", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no scenario named nope" in r.stderr
    r = _cli("chaos", str(plan), "--break", "gravity", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "gravity" in r.stderr


def test_break_is_hidden_but_documented_options_show(tmp_path: Path) -> None:
    r = _cli("chaos", "--help")
    assert r.exit_code == 0
    for opt in ("--seeds", "--seed-start", "--out", "--only", "--real"):
        assert opt in r.stdout
    assert "--break" not in r.stdout

"""Bad inputs at the command line are refused up front: one line, exit 2, nothing written.

Issue 23, defect 5: an empty ``--out``, a config file of random bytes, a resume whose
``run.steps`` is below the committed steps, a ``--baseline`` that is a file. Driven through
the real ``main`` (click's CliRunner); the runs that need a finished run directory use the
simulated engine in virtual time (seconds, no model).
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from freshroll.cli import main
from freshroll.runtime import run as run_mod

SIM = ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
       "rollout.batch_groups=2", "run.steps=3"]


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _error_line(result: Result) -> str:
    """The one ``error:`` line of a refused command (no traceback)."""
    assert "Traceback" not in result.output, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture
def never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that gets as far as running fails the test (as a bug: exit 3)."""
    def must_not_run(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the run started")

    monkeypatch.setattr(run_mod, "run", must_not_run)


@pytest.fixture(scope="module")
def finished_sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated run of 3 committed steps (copy it before changing it)."""
    out = tmp_path_factory.mktemp("sim") / "run"
    result = _cli("simulate", *SIM, "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def _digests(run_dir: Path) -> dict[str, str]:
    """Every file's digest, but the lock's (a resume locks the directory first: the lock
    file names the pid of its last holder)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != "run.lock"}


def _events(run_dir: Path) -> int:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        db.close()


# -- a: an empty --out / --resume ------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("run", "--out", ""), ("simulate", "--out", ""), ("run", "--resume", ""),
    ("run", "--out", " "),
], ids=["run-out", "simulate-out", "run-resume", "blank"])
def test_an_empty_run_directory_is_a_usage_error_naming_the_option(
    never_runs: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
):
    """Before: ``--out ''`` ran into the current directory and exited 0."""
    monkeypatch.chdir(tmp_path)
    result = _cli(*args, "run.progress=false")
    assert result.exit_code == 2, result.output
    assert f"'{args[1]}'" in result.stderr and "must not be empty" in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written in the current directory


# -- b: a config file of random bytes --------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "simulate", "bench"])
def test_a_config_of_random_bytes_is_a_config_error_naming_the_file(
    never_runs: None, tmp_path: Path, command: str
):
    """Before: ``internal error: UnicodeDecodeError`` (exit 3)."""
    config = tmp_path / "noise.yaml"
    config.write_bytes(bytes(range(128, 256)) * 4)
    result = _cli(command, str(config), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert str(config) in line and "not UTF-8" in line and "internal error" not in line
    assert not (tmp_path / "out").exists()


def test_a_config_with_a_duplicate_key_is_refused_naming_the_key_and_file(
    never_runs: None, tmp_path: Path
):
    config = tmp_path / "twice.yaml"
    config.write_text("run:\n  steps: 3\n  progress: false\n  steps: 40\n")
    result = _cli("run", str(config), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert str(config) in line and "duplicate key 'steps'" in line and "line 4" in line


# -- c: --resume with fewer steps than the run committed -------------------------------------


def test_resume_below_the_committed_steps_is_refused_and_changes_nothing(
    finished_sim: Path, tmp_path: Path
):
    """Before: the resume admitted new requests, discarded them, rewrote config.yaml, exit 0."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_sim, run_dir)
    before, events = _digests(run_dir), _events(run_dir)
    result = _cli("run", "--resume", str(run_dir), "run.steps=2")
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert "run.steps=2" in line and "already has 3 committed steps" in line
    assert "steps can only grow" in line
    assert _digests(run_dir) == before and _events(run_dir) == events


def test_resume_at_the_committed_steps_is_still_accepted(finished_sim: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_sim, run_dir)
    result = _cli("run", "--resume", str(run_dir), "run.steps=3")
    assert result.exit_code == 0, result.output


# -- h: report --baseline naming a file ------------------------------------------------------


def test_report_baseline_must_be_a_run_directory(finished_sim: Path, tmp_path: Path):
    """Before: a regular file as --baseline was ignored silently (exit 0)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_sim, run_dir)
    (run_dir / "report.html").unlink()
    not_a_run = tmp_path / "baseline.json"
    not_a_run.write_text("{}")
    result = _cli("report", str(run_dir), "--baseline", str(not_a_run))
    assert result.exit_code == 2, result.output
    line = _error_line(result)
    assert f"--baseline {not_a_run}" in line and "must be a run directory" in line
    assert not (run_dir / "report.html").exists()  # refused before anything was written
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _cli("report", str(run_dir), "--baseline", str(empty))
    assert result.exit_code == 2 and "not a run directory" in _error_line(result)
    result = _cli("report", str(run_dir), "--baseline", str(finished_sim))
    assert result.exit_code == 0, result.output

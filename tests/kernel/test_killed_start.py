"""Issue 23, defect 1: a start killed while its ledger was created does not brick the run
directory. Before the fix, ``--resume``, ``verify`` and ``export`` all failed with "cannot
open ledger: attempt to write a readonly database" (a read-only open cannot roll the hot
journal back) and the original command said the directory "already holds a run".

The directory is built as such a start leaves it: ``config.yaml`` written by the start's
checks (:func:`~freshroll.runtime.prepare.prepare_run_dir`), then the ledger with a hot
journal (:func:`killed.kill_inside_ledger_creation`).
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result
from killed import kill_inside_ledger_creation

from freshroll.cli import main
from freshroll.config import load_config
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.runtime.prepare import prepare_run_dir

STEPS = 3
SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", f"run.steps={STEPS}",
       "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
       "rollout.workers=3", "rollout.worker_batch=4"]


def _cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _killed_start(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    prep = prepare_run_dir(load_config(None, SIM), out, resume=False)
    prep.lock.release()
    kill_inside_ledger_creation(out / LEDGER_FILE)
    return out


def _finished(out: Path) -> None:
    report = verify_run(out)
    assert report.ok and report.closed, report.render()
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    assert sum(isinstance(e, ev.Committed) for e in events) == STEPS
    assert sum(isinstance(e, ev.Opened) for e in events) == 1  # one start: nothing before it


def test_verify_and_export_read_a_ledger_killed_in_creation(tmp_path: Path) -> None:
    out = _killed_start(tmp_path)
    verified = _cli("verify", "--allow-open", out)
    assert "readonly" not in verified.output + verified.stderr
    assert verified.exit_code == 0, verified.output + verified.stderr
    exported = _cli("export", out)
    assert exported.exit_code == 0, exported.stderr
    assert "wrote 0 events" in exported.stderr
    assert (out / "ledger.jsonl").read_bytes() == b""


def test_the_same_command_starts_the_run_again(tmp_path: Path) -> None:
    out = _killed_start(tmp_path)
    result = _cli("run", *SIM, "--out", out)
    assert "already holds a run" not in result.stderr
    assert result.exit_code == 0, result.stderr
    _finished(out)


def test_resume_starts_the_run_from_step_0(tmp_path: Path) -> None:
    out = _killed_start(tmp_path)
    result = _cli("run", "--resume", out)
    assert result.exit_code == 0, result.stderr
    _finished(out)


def test_a_ledger_with_events_still_holds_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with Ledger(out / LEDGER_FILE) as ledger:
        ledger.append(ev.Closed(ts=0.0))
    result = _cli("run", *SIM, "--out", out)
    assert result.exit_code == 2
    assert "already holds a run" in result.stderr

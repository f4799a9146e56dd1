"""The lines a finished run ends with (:mod:`freshroll.runtime.end_lines`): the same from
``freshroll run`` (notes on stderr, the closing lines on stdout) and from
``GRPOTrainer.train()`` (all on its stream), printed once (issue 48, item 10: from Python,
``train()`` printed none of them)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from freshroll import GRPOTrainer
from freshroll.cli import main
from freshroll.runtime import run as run_mod

SUMMARY: dict[str, Any] = {
    "steps": 3, "accepted_rollouts_per_s": 12.5, "reward_first": 0.25, "reward_last": 0.5,
    "lag": {"p50": 0, "p99": 1, "max": 1}, "trainer_idle_ratio": 0.1, "discard_rate": 0.0,
    "worker_losses": 2,
}


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """``run`` replaced by one that returns a finished run's result at once."""
    runs: list[Path] = []

    def fake_run(cfg: Any, out: Path, **kwargs: Any) -> run_mod.RunResult:
        runs.append(out)
        return run_mod.RunResult(out, SUMMARY, True)

    monkeypatch.setattr(run_mod, "run", fake_run)
    return runs


def test_train_prints_the_end_lines_on_its_stream(tmp_path: Path, finished: list[Path]) -> None:
    stream = io.StringIO()
    GRPOTrainer(output_dir=tmp_path / "r", args={"run.progress": False}).train(stream=stream)
    said = stream.getvalue()
    assert said.count("verify: ok  report: ") == 1 and f"run dir {tmp_path / 'r'}" in said
    assert "steps 3  accepted rollouts/s 12.5  reward 0.250 -> 0.500" in said
    assert "2 inference worker losses" in said  # a note: what the run recovered from
    quiet = io.StringIO()
    GRPOTrainer(output_dir=tmp_path / "q", args={"run.progress": False}).train(
        stream=quiet, end_lines=False)
    assert quiet.getvalue() == ""


def test_the_cli_prints_them_once_closing_lines_on_stdout(tmp_path: Path,
                                                          finished: list[Path]) -> None:
    res = CliRunner().invoke(main, ["run", "run.progress=false", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert finished == [tmp_path / "r"]
    assert res.stdout.count("verify: ok  report: ") == 1 and "verify:" not in res.stderr
    note = "2 inference worker losses"
    assert note in res.stderr and note not in res.stdout

"""The kernel commands of the CLI: ``export``, ``timing`` (and their errors), on a run written
by the kernel driver (``kernel_driver.py``; its own tests: test_kernel_driver.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from kernel_driver import SimConfig, simulate

from freshroll.cli import main
from freshroll.figures.timing import STAGES
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.store import LEDGER_FILE, Ledger


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("cli") / "run"
    simulate(run, KernelConfig(1, 4, 4), SimConfig(steps=10, seed=3, faults=True))
    return run


def _n_events(run: Path) -> int:
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        return sum(1 for _ in ledger.rows())


def test_export_line_count_equals_event_count(sim_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["export", str(sim_run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    n = _n_events(sim_run)
    assert len(lines) == n > 100
    assert f"wrote {n} events to {out}" in result.stderr
    objs = [json.loads(line) for line in lines]
    assert [o["seq"] for o in objs] == list(range(1, n + 1))
    assert objs[0]["kind"] == "opened" and objs[-1]["kind"] == "closed"


def test_export_default_output_and_stdout(sim_run: Path) -> None:
    n = _n_events(sim_run)
    cli = CliRunner()
    result = cli.invoke(main, ["export", str(sim_run)])
    assert result.exit_code == 0, result.output
    assert len((sim_run / "ledger.jsonl").read_text().splitlines()) == n
    (sim_run / "ledger.jsonl").unlink()
    to_stdout = cli.invoke(main, ["export", str(sim_run), "-o", "-"])
    assert to_stdout.exit_code == 0
    assert len(to_stdout.stdout.splitlines()) == n
    assert json.loads(to_stdout.stdout.splitlines()[0])["seq"] == 1


def test_timing_prints_the_table(sim_run: Path) -> None:
    result = CliRunner().invoke(main, ["timing", str(sim_run)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[0] == "stage" and "share" in lines[0]
    assert [line.split()[0] for line in lines[1 : 1 + len(STAGES)]] == list(STAGES)
    summary = lines[1 + len(STAGES)]
    assert summary.startswith("accepted rollouts/s")
    assert "steps 10" in summary and "trainer idle" in summary


@pytest.mark.parametrize("command", ["export", "timing", "verify"])
def test_commands_on_a_missing_run_exit_2(command: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [command, str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert str(tmp_path / "nope" / LEDGER_FILE) in result.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("command", ["export", "timing"])
def test_commands_on_a_garbage_ledger_exit_2(command: str, tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).write_bytes(b"SQLite format 3\x00" + b"\x07" * 2000)
    result = CliRunner().invoke(main, [command, str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "error: " in result.stderr and str(tmp_path / LEDGER_FILE) in result.stderr


def test_installed_entry_point_runs(sim_run: Path) -> None:
    exe = Path(sys.executable).with_name("freshroll")
    if not exe.exists():
        pytest.skip("no freshroll console script next to this interpreter")
    proc = subprocess.run([str(exe), "verify", str(sim_run)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok   conservation" in proc.stdout

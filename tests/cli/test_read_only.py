"""The commands that read a run directory leave it as they found it (issue 48, hostile trial):

* ``freshroll export RUN -o - | head``: the reader going away ends the command quietly
  (status 0), not as an "internal error" with an ``error.log`` written into the run;
* ``verify``, ``export``, ``timing``, ``replay`` write no ``-wal``/``-shm`` beside a closed
  ledger, and a cut ledger is named as damaged, not as a killed writer's leftover;
* ``replay`` exits with a status its help lists (a damaged ledger: 2, not 3)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main
from freshroll.config import load_config

SRC = Path(__file__).resolve().parents[2] / "src"
SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "task.n_prompts=64",
       "rollout.group_size=4", "rollout.batch_groups=4", "run.steps=40"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from freshroll.runtime.run import run

    out = tmp_path_factory.mktemp("read-only") / "run"
    assert run(load_config(None, SIM), out, stream=io.StringIO(), report=False).ok
    for side in ("-wal", "-shm"):  # as a closed run leaves it
        assert not (out / f"ledger.sqlite{side}").exists()
    return out


def test_export_to_a_reader_that_goes_away_is_quiet(finished: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "freshroll", "export", str(finished),
                             "-o", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(200).startswith(b'{"seq":1,')
    proc.stdout.close()  # what `| head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "internal error" not in err and "Traceback" not in err, err
    assert not (finished / "error.log").exists()


@pytest.mark.parametrize("args", [["verify"], ["timing"], ["export", "-o", os.devnull]])
def test_a_read_writes_no_side_file_beside_a_closed_ledger(finished: Path,
                                                           args: list[str]) -> None:
    before = sorted(p.name for p in finished.iterdir())
    result = CliRunner().invoke(main, [args[0], str(finished), *args[1:]])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in finished.iterdir()) == before


def test_a_cut_ledger_is_named_damaged_not_a_killed_writers(finished: Path,
                                                           tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ledger = run / "ledger.sqlite"
    data = ledger.read_bytes()
    ledger.write_bytes(data[: len(data) // 3])
    for cmd in ("verify", "timing"):
        result = CliRunner().invoke(main, [cmd, str(run)])
        assert result.exit_code == 2, (cmd, result.output)
        assert "ledger.sqlite" in result.stderr
        assert "-wal" not in result.stderr and "killed while writing" not in result.stderr
        assert "internal error" not in result.stderr
    assert not (run / "ledger.sqlite-wal").exists() and not (run / "error.log").exists()


@pytest.mark.slow
def test_replay_of_a_cut_ledger_exits_2_as_its_help_says(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    cfg = load_config(None, ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=2", "run.runtime=inline",
                             "run.torch_threads=1"])
    assert run(cfg, out, stream=io.StringIO(), report=False).ok
    data = (out / "ledger.sqlite").read_bytes()
    (out / "ledger.sqlite").write_bytes(data[: len(data) // 3])
    result = CliRunner().invoke(main, ["replay", str(out)])
    assert result.exit_code == 2, result.output
    assert "ledger.sqlite" in result.stderr and "internal error" not in result.stderr
    assert "3    a bug" in CliRunner().invoke(main, ["replay", "--help"]).output

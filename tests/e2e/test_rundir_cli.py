"""Run-directory safety through the real CLI: one process per run directory, and a bad
input leaves no run directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import REPO, freshroll


def test_a_bad_value_is_refused_before_anything_is_written(tmp_path: Path, small: list[str]):
    out = tmp_path / "run"
    res = freshroll("run", *small, "trainer.weight_decay=-1", "--out", str(out), check=False)
    assert res.returncode == 2 and "trainer.weight_decay" in res.stderr
    assert not out.exists()
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    res = freshroll("run", *small, f"model.path={bad}", "--out", str(out), check=False)
    assert res.returncode == 2 and "model.path" in res.stderr and "config.json" in res.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_second_process_on_a_running_run_dir_fails_at_once(tmp_path: Path, small: list[str]):
    """Before: both worked on the directory; the second failed late on events.seq."""
    import sqlite3

    out = tmp_path / "run"
    first = subprocess.Popen(  # long enough to outlast the second's start
        [sys.executable, "-m", "freshroll", "run", *small, "run.steps=100000", "--out",
         str(out)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").is_file() and time.time() < deadline:
            assert first.poll() is None, "the first run ended before the second started"
            time.sleep(0.05)
        res = freshroll("run", "--resume", str(out), check=False)
        assert res.returncode == 2, res.stderr
        live = f"{out}: a run is live in it (pid {first.pid} holds run.lock); do not resume"
        assert live in res.stderr
        res = freshroll("run", *small, "--out", str(out), check=False)
        assert res.returncode == 2 and live in res.stderr  # not "use --resume" (issue 48)
        assert first.poll() is None  # the first run went on undisturbed
    finally:
        first.kill()
        first.wait(timeout=30)
    db = sqlite3.connect(out / "ledger.sqlite")
    assert db.execute("SELECT count(*) FROM events WHERE kind='opened'").fetchone()[0] == 1
    db.close()

"""A trainer group's rendezvous directory outlives a SIGKILLed driver only until the next
freshroll start (issue 50: /tmp/freshroll-ranks-* were left by every killed DDP run)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from freshroll.runtime import leftovers
from freshroll.runtime.leftovers import RANKS_PREFIX, rank_store_dir, sweep_rank_stores


def test_a_dead_drivers_store_is_swept_a_live_ones_kept(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = rank_store_dir()  # this process: alive
    assert mine.parent == tmp_path and mine.name.startswith(f"{RANKS_PREFIX}{os.getpid()}-")
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = tmp_path / f"{RANKS_PREFIX}{int(child.stdout)}-abc"  # its driver has exited
    (dead / "store").mkdir(parents=True)
    odd = tmp_path / f"{RANKS_PREFIX}notapid-x"  # not ours to judge: kept
    odd.mkdir()
    assert sweep_rank_stores() == [dead]
    assert mine.is_dir() and odd.is_dir() and not dead.exists()
    (dead / "store").mkdir(parents=True)
    out = io.StringIO()
    monkeypatch.setattr(leftovers, "sweep_segments", lambda *a: [])
    monkeypatch.setattr(leftovers, "sweep_dead_drivers", lambda out: [])
    leftovers.sweep_leftovers(tmp_path / "run", out)  # every run's start sweeps them
    assert not dead.exists() and "removed 1 trainer-rank store(s)" in out.getvalue()

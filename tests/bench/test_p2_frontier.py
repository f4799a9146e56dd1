"""benchmarks/p2_frontier.py (issue 26): its table on synthetic runs, and one 2-step smoke
invocation of every system at one η (the real ``freshroll simulate``, fresh processes)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "p2_frontier.py"

pf = load_script("p2_frontier")


def _run(eta: int, system: str, seed: int, per_s: float, bound: float) -> object:
    return pf.Run(eta, system, seed, True, per_s, per_s / 30.0, per_s / 23.1, bound, 80.0,
                  0.25, 0.7, 0.1, 0.2, 0.0, -0.05, 1000.0, 2.0)


def test_the_table_has_one_row_per_eta_and_system_with_mean_and_sd_over_seeds() -> None:
    runs = [_run(eta, system, seed, rate + seed, 0.5)
            for eta in (4, 1) for system, rate in (("all", 10.0), ("static", 6.0))
            for seed in (0, 1)]
    lines = pf.render_table(runs).splitlines()
    assert lines[0].startswith("| η | system | seeds | accepted/s | E (own) | E (c_train) | "
                               "window bound |")
    assert [line.split(" | ")[:2] for line in lines[2:]] == [
        ["| 1", "static"], ["| 1", "all"], ["| 4", "static"], ["| 4", "all"]]
    assert lines[2].startswith("| 1 | static | 2 | 6.5 ± 0.7 | 0.22 ± 0.02 |")
    assert "| 0.50 ± 0.00 | 80 ± 0 | 25 ± 0% | 70.0 ± 0.0% | 10.0 ± 0.0% |" in lines[2]
    assert lines[2].endswith("| ok |")


@pytest.mark.slow  # 19 fresh `freshroll simulate` processes: ~35 CPU-s, out of make test-fast
def test_quick_run_prints_every_system_with_finite_figures(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--etas", "1",
                           "--work", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"load average before: [\d.]+ [\d.]+ [\d.]+", done.stdout)
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| η")}
    assert set(rows) == set(pf.SYSTEMS)
    for system, cells in rows.items():
        assert cells[0] == "1" and cells[2] == "1" and cells[-1] == "ok", (system, cells)
        numbers = [float(cells[i].rstrip("%")) for i in range(3, 15)]
        assert all(math.isfinite(x) for x in numbers), (system, cells)
        e_own, bound = numbers[1], numbers[3]
        assert 0 < e_own <= bound + 0.05, (system, cells)  # the window bounds the trainer
    assert float(rows["overprov"][11].rstrip("%")) > 0  # extras cancelled
    assert float(rows["deadlines"][12].rstrip("%")) >= 0
    assert float(rows["static"][13].rstrip("%")) == 0  # no refresh without the lever


@pytest.mark.parametrize("system", list(pf.SYSTEMS))
def test_every_system_names_config_keys_that_exist(system: str) -> None:
    from freshroll.config import load_config

    cfg = load_config(pf.CONFIG, [*pf.COMMON, *pf.overrides(4, system), "run.max_staleness=4"])
    assert cfg.run.max_staleness == 4 and cfg.rollout.engine == "sim"
    # the wide rows: WIDE freshness windows at the same η; every other row the default
    assert cfg.run.admission_window == (pf.WIDE * 5 if system.startswith("wide-") else "auto")

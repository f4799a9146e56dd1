"""benchmarks/longtail_real.py: its figures and table on synthetic run directories, and one
``--quick`` invocation of the real thing (sync, finish, continue on the long-tailed task)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from bench_scripts import load_script, run_main

lt = load_script("longtail_real")
SYSTEMS = ("sync", "finish", "continue")


def _write_run(out: Path, rate: float, rewards: list[float], by_lag: dict[str, Any]) -> Path:
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps({
        "accepted_rollouts_per_s": rate, "trainer_idle_ratio": 0.25, "accepted_rollouts": 90,
        "counted_discards": 10, "discards": {"stale": 6, "cancelled": 2, "fenced": 3},
        "token_lag": {"weighted": {"mean": 0.75}},
        "off_policy": {"mismatch_kl_mean": 0.004, "by_lag": by_lag}}))
    (out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "reward_mean": r}) + "\n" for i, r in enumerate(rewards)))
    return out


def test_figures_of_a_run_directory(tmp_path: Path) -> None:
    kl = {"tokens": 5.0, "mismatch_kl_mean": 0.01, "is_weight_mean": 1.0, "is_weight_max": 1.2}
    rewards = [0.1] * 18 + [0.4, 0.6]  # 20 steps: the last 10% is the last 2
    out = _write_run(tmp_path / "r", 50.0, rewards, {"0": None, "1": kl})
    r = lt.read_run("finish", 0, out, True, 1.5)
    assert r.accepted_per_s == 50.0 and r.idle == 0.25
    assert r.stale == pytest.approx(6 / 100) and r.cancelled == pytest.approx(2 / 100)
    assert r.token_lag == 0.75 and r.mismatch_kl == 0.004
    assert r.kl_by_lag == {"0": None, "1": 0.01, "2": None, "3+": None}
    assert r.reward_last == pytest.approx(0.5)
    assert lt.last_tenth([1.0, 2.0, 3.0]) == 3.0 and math.isnan(lt.last_tenth([]))


def test_the_table_has_one_row_per_system_with_mean_and_sd_over_seeds(tmp_path: Path) -> None:
    runs = [lt.read_run(s, seed, _write_run(tmp_path / f"{s}{seed}", rate, [r], {}), True, 2.0)
            for s, rate in (("sync", 10.0), ("continue", 30.0))
            for seed, r in ((0, 0.2), (1, 0.4))]
    lines = lt.render_table(runs).splitlines()
    assert lines[0].startswith("| system | seeds | accepted/s | trainer idle |")
    assert len(lines) == 4  # header, rule, sync, continue (finish was not run)
    assert lines[2].startswith("| sync | 2 | 10.0 ± 0.0 | 25.0 ± 0.0% | 6.00 ± 0.00 |")
    assert "| 0.300 ± 0.141 |" in lines[3]  # the last-10% reward over the two seeds
    assert "| - / - / - / - |" in lines[3]  # no bucket reported: dashes, not zeros


@pytest.mark.slow
def test_quick_run_prints_every_system_with_finite_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, stdout = run_main("longtail_real", ["--quick", "--work", str(tmp_path)], capsys)
    assert status == 0
    assert re.search(r"load average before: [\d.]+ [\d.]+ [\d.]+", stdout)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ")
            and not line.startswith("| system")}
    assert set(rows) == set(SYSTEMS)
    for system, cells in rows.items():
        assert cells[0] == "1" and cells[-1] == "ok", (system, cells)
        numbers = [cells[i].rstrip("%") for i in (1, 2, 3, 4, 5, 6, 8, 9)]
        assert all(math.isfinite(float(x)) for x in numbers), (system, cells)
        assert float(cells[1]) > 0  # accepted rollouts/s
    assert float(rows["sync"][5]) == 0.0  # sync trains on its own version's tokens
    assert all(x == "-" for x in rows["sync"][7].split(" / ")[1:])
    # an async run that trained tokens of older versions (token lag > 0) has a mismatch KL in
    # a lag >= 1 bucket. Whether it trained any is the machine's load's to say (under a loaded
    # suite every batch may be generated after the trainer's publish, in 6 steps too): the
    # table's figures must agree with each other, whichever it was
    for system in ("finish", "continue"):
        lag, lagged_kl = float(rows[system][5]), rows[system][7].split(" / ")[1:]
        assert lag >= 0.0, system
        if lag > 0.0:
            assert any(x != "-" for x in lagged_kl), (system, rows[system])

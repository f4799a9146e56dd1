"""benchmarks/agents_vs_sync.py: its figures and table on synthetic run directories, and its
``--quick`` mode (every system for two small steps, in this process: a smoke run)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from bench_scripts import load_script

av = load_script("agents_vs_sync")


def _write_run(out: Path, rate: float, rewards: list[float], tool: float | None) -> Path:
    out.mkdir(parents=True)
    stages = [{"stage": "generation", "mean": 0.1}]
    if tool is not None:
        stages.append({"stage": "tool", "mean": tool})
    (out / "summary.json").write_text(json.dumps({
        "accepted_rollouts_per_s": rate, "trainer_idle_ratio": 0.5,
        "token_lag": {"weighted": {"mean": 0.25}}, "stages": stages}))
    (out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "reward_mean": r}) + "\n" for i, r in enumerate(rewards)))
    return out


def test_figures_of_a_run_directory(tmp_path: Path) -> None:
    r = av.read_run("async", 0, _write_run(tmp_path / "r", 40.0, [0.1, 0.3], 0.2), True,
                    3.0, 9.0, 1.5)
    assert r.episodes_per_s == 40.0 and r.idle == 0.5 and r.token_lag == 0.25
    assert r.reward == pytest.approx(0.2) and r.tool_s == 0.2 and r.generation_s == 0.1
    assert (r.cpu_s, r.wall_s, r.load) == (3.0, 9.0, 1.5)
    none = av.read_run("sync", 0, _write_run(tmp_path / "s", 10.0, [], None), True, 1, 1, 1)
    assert none.tool_s == 0.0 and math.isnan(none.reward)


def test_the_table_has_a_row_per_system_and_the_ratio_to_sync(tmp_path: Path) -> None:
    runs = [av.read_run(s, seed, _write_run(tmp_path / f"{s}{seed}", rate, [rew], 0.1), True,
                        2.0, 5.0, 1.0)
            for s, rate in (("sync", 10.0), ("async-continue", 25.0))
            for seed, rew in ((0, 0.2), (1, 0.4))]
    lines = av.render_table(runs).splitlines()
    assert lines[0].startswith("| system | seeds | episodes/s | x sync | trainer idle |")
    assert len(lines) == 4  # header, rule, sync, async-continue (async was not run)
    assert lines[2].startswith("| sync | 2 | 10.0 ± 0.0 | 1.00x | 50.0 ± 0.0% |")
    assert "| 2.50x |" in lines[3]
    assert "| +0.000 (se 0.141) |" in lines[3]  # sqrt(sd²/n + sd²/n), sd 0.141, n 2


def test_quick_mode_runs_every_system_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        assert av.main(["--quick", "--work", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert re.search(r"load average before: [\d.]+ [\d.]+ [\d.]+", out)
    assert re.search(r"command: benchmarks/agents_vs_sync.py --quick[^;]*; \d{4}-\d\d-\d\d", out)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ")
            and not line.startswith("| system")}
    assert set(rows) == set(av.SYSTEMS)
    for system, cells in rows.items():
        assert cells[0] == "1" and cells[-1] == "ok", (system, cells)
        assert float(cells[1]) > 0  # episodes/s
        assert float(cells[7]) > 0  # tool s: every episode called the slow tool
    assert float(rows["sync"][4]) == 0.0  # sync trains on its own version's tokens

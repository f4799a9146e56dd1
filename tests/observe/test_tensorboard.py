"""monitor.tensorboard: each metrics.jsonl row as TensorBoard scalars at its step, read back."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from monitor_files import read_board

from freshroll.config import load_config, validate
from freshroll.errors import ConfigError
from freshroll.figures.metrics_log import read_rows
from freshroll.observe.live_names import scalars
from freshroll.observe.monitors import check_monitors
from freshroll.observe.tensorboard import TENSORBOARD_DIR, TensorBoardWriter


def _assert_rows_logged(got: dict[str, dict[int, float]], rows: list[dict[str, Any]]) -> None:
    want: dict[str, dict[int, float]] = {}
    for row in rows:
        for tag, value in scalars(row).items():
            want.setdefault(tag, {})[int(row["step"])] = value
    assert set(got) == set(want)
    for tag, by_step in want.items():
        assert got[tag] == pytest.approx(by_step, rel=1e-6), tag  # float32 on disk


def test_rows_become_scalars_under_the_shared_tags(tmp_path: Path):
    rows = [
        {"step": 1, "t": 2.5, "version": "p1-ab", "loss": 0.75, "trainer_idle_ratio": 0.25,
         "lag_mean": 0.5, "accepted_per_s": 812.5, "reward_mean": float("nan"),
         "rewards/acc/mean": 0.5, "discards": 2, "kv_cache_usage": None},
        {"step": 2, "t": 5.0, "version": "p2-cd", "loss": 0.5, "trainer_idle_ratio": 0.125,
         "lag_mean": 1.0, "accepted_per_s": 900.0, "reward_mean": 0.3, "discards": 3},
    ]
    writer = TensorBoardWriter(tmp_path / "tb")
    for row in rows:
        writer.on_row(row, True)
    writer.close()
    got = read_board(tmp_path / "tb")
    _assert_rows_logged(got, rows)
    assert got["trainer/idle_ratio"] == {1: 0.25, 2: 0.125}  # named as peers name them
    assert got["async/staleness_mean"] == {1: 0.5, 2: 1.0}
    assert got["loss"] == {1: 0.75, 2: 0.5}  # a field of no table: its row name
    assert got["reward"] == pytest.approx({2: 0.3})  # NaN / null / text: not logged
    assert "version" not in got and "kv_cache_usage" not in got and "step" not in got


def test_a_sim_run_with_tensorboard_on_writes_every_row(tmp_path: Path):
    from freshroll.runtime.run import run

    cfg = load_config(None, ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
                             "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=6",
                             "monitor.tensorboard=true"])
    out = tmp_path / "r"
    assert run(cfg, out, stream=io.StringIO()).ok
    rows, bad = read_rows(out / "metrics.jsonl")
    assert len(rows) == 6 and not bad
    _assert_rows_logged(read_board(out / TENSORBOARD_DIR), rows)


def test_without_the_package_the_option_is_one_error_naming_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    check_monitors(validate({}, "test").monitor)  # off: nothing needed
    mon = validate({"monitor": {"tensorboard": True}}, "test").monitor
    with pytest.raises(ConfigError, match=r"monitor\.tensorboard: needs the 'tensorboard' "
                                          r"package.*pip install 'freshroll\[tensorboard\]'"):
        check_monitors(mon)
    with pytest.raises(ConfigError, match=r"monitor\.tensorboard"):
        TensorBoardWriter(tmp_path)
    from freshroll.runtime.prepare import check_inputs

    with pytest.raises(ConfigError, match=r"monitor\.tensorboard"):  # config check's and run's
        check_inputs(load_config(None, ["monitor.tensorboard=true", "task.n_prompts=8"]))

"""monitor.wandb_project: each metrics.jsonl row logged to an offline W&B run, read back from
its ``.wandb`` file (no network: offline mode, files in the run directory)."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_files import read_wandb, wandb_offline

from freshroll.config import load_config, validate
from freshroll.errors import ConfigError
from freshroll.figures.metrics_log import read_rows
from freshroll.observe.live_names import scalars
from freshroll.observe.monitors import check_monitors
from freshroll.observe.wandb_log import WandbLogger


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    with wandb_offline(monkeypatch, tmp_path):
        yield


def _assert_rows_logged(run_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    # W&B's service process may still be writing the records file when finish() returned on a
    # loaded machine (seen once as an empty history): read it again until it holds every row
    want = {int(r["step"]): pytest.approx(scalars(r)) for r in rows}
    deadline = time.monotonic() + 20
    history, config = read_wandb(run_dir)
    while history != want and time.monotonic() < deadline:
        time.sleep(0.2)
        history, config = read_wandb(run_dir)
    assert history == want
    return config


@pytest.mark.slow  # W&B's own service process starts: make test runs it
def test_rows_are_logged_at_their_steps_and_the_run_finishes(tmp_path: Path):
    rows = [{"step": 1, "version": "p1-ab", "loss": 0.75, "trainer_idle_ratio": 0.25,
             "lag_max": 1, "reward_mean": float("nan"), "rewards/acc/mean": 0.5},
            {"step": 2, "version": "p2-cd", "loss": 0.5, "trainer_idle_ratio": 0.125,
             "lag_max": 2, "reward_mean": 0.3}]
    logger = WandbLogger("freshroll-test", "offline", tmp_path, {"run": {"steps": 2}}).start()
    for row in rows:
        logger.on_row(row, True)
    assert logger.run.summary["trainer/idle_ratio"] == 0.125  # the last row's
    logger.close()
    assert logger.run is None
    config = _assert_rows_logged(tmp_path, rows)
    assert config["run"] == {"steps": 2}
    history, _ = read_wandb(tmp_path)
    assert history[1]["async/staleness_max"] == 1 and "reward" not in history[1]


def test_a_sim_run_with_wandb_on_logs_every_row_and_its_config(tmp_path: Path):
    from freshroll.runtime.run import run

    cfg = load_config(None, ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
                             "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=5",
                             "monitor.wandb_project=freshroll-test"])
    out = tmp_path / "r"
    assert run(cfg, out, stream=io.StringIO()).ok
    rows, _ = read_rows(out / "metrics.jsonl")
    assert len(rows) == 5
    config = _assert_rows_logged(out, rows)
    assert config["monitor"]["wandb_mode"] == "offline" and config["run"]["steps"] == 5


def test_without_the_package_the_option_is_one_error_naming_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    mon = validate({"monitor": {"wandb_project": "p"}}, "test").monitor
    with pytest.raises(ConfigError, match=r"monitor\.wandb_project: needs the 'wandb' package"
                                          r".*pip install 'freshroll\[wandb\]'"):
        check_monitors(mon)
    with pytest.raises(ConfigError, match=r"monitor\.wandb_project"):
        WandbLogger("p", "offline", tmp_path, {})


def test_the_mode_is_offline_unless_set_and_checked():
    assert validate({}, "test").monitor.wandb_mode == "offline"
    assert validate({}, "test").monitor.wandb_project is None
    with pytest.raises(ConfigError, match="wandb_mode"):
        validate({"monitor": {"wandb_mode": "cloud"}}, "test")


def test_a_run_wandb_refuses_to_start_is_one_error_naming_the_key(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import wandb

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)  # what online mode without a login meets
    with pytest.raises(ConfigError, match=r"monitor\.wandb_project: W&B could not start a run "
                                          r"in online mode: api_key not configured"):
        WandbLogger("p", "online", tmp_path, {}).start()

"""monitor.*: all three watchers on one real run, and a watcher that fails to start gives back
what the ones before it took."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from monitor_files import read_board, read_wandb, wandb_offline

from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.figures.metrics_log import read_rows
from freshroll.observe.live_names import scalars
from freshroll.observe.monitors import build_monitors
from freshroll.observe.prometheus import check_port
from freshroll.observe.tensorboard import TENSORBOARD_DIR


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    with wandb_offline(monkeypatch, tmp_path):
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_watcher_that_fails_to_start_closes_those_started_before_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import wandb

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.UsageError("no")

    monkeypatch.setattr(wandb, "init", refuse)
    port = _free_port()
    cfg = load_config(None, [f"monitor.prometheus_port={port}", "monitor.tensorboard=true",
                             "monitor.wandb_project=p"])
    with pytest.raises(ConfigError, match=r"monitor\.wandb_project"):
        build_monitors(cfg, tmp_path, io.StringIO())
    check_port(port, "127.0.0.1")  # the endpoint started first was stopped


@pytest.mark.slow  # a real run (make test-fast leaves it to make test)
def test_a_real_run_with_every_watcher_on_gives_each_the_same_rows(tmp_path: Path):
    from freshroll.runtime.run import run

    port = _free_port()
    cfg = load_config(None, ["run.steps=3", "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", f"monitor.prometheus_port={port}",
                             "monitor.tensorboard=true", "monitor.wandb_project=freshroll-test"])
    out, said = tmp_path / "r", io.StringIO()
    assert run(cfg, out, stream=said).ok
    lines = said.getvalue()
    assert f"live metrics for Prometheus at http://127.0.0.1:{port}/metrics" in lines
    assert "TensorBoard scalars in" in lines and "W&B project freshroll-test (offline)" in lines
    rows, _ = read_rows(out / "metrics.jsonl")
    assert len(rows) == 3 and all(k in rows[0] for k in ("loss", "grad_norm", "lr"))
    board = read_board(out / TENSORBOARD_DIR)
    history, config = read_wandb(out)
    for row in rows:
        want = scalars(row)
        assert want["learning_rate"] == row["lr"] and "grad_norm" in want
        assert {t: board[t][row["step"]] for t in want} == pytest.approx(want, rel=1e-6)
        assert history[row["step"]] == pytest.approx(want)
    assert config["run"]["steps"] == 3 and json.dumps(config)  # the resolved config
    check_port(port, "127.0.0.1")  # given back at the run's end

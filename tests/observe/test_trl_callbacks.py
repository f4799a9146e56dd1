"""TRL's TrainerCallbacks through the observer seam (:mod:`freshroll.observe.trl_callbacks`):
each point called with transformers' own TrainerState and TrainerControl, rows under TRL's
names (issue 48, item 6)."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState

from freshroll.errors import ConfigError
from freshroll.ledger.lineage import PolicyVersion
from freshroll.observe.trl_callbacks import TrainerCallbacks, check_callbacks, trl_logs
from freshroll.pipeline.observers import StepReport

ROW = {"step": 3, "t": 1.5, "version": "p3", "loss": 0.25, "reward_mean": 0.5,
       "reward_std": 0.1, "rewards/exact/mean": 0.5, "lr": 1e-3, "grad_norm": 2.0,
       "entropy": 3.0, "clip_frac": 0.125, "kl_ref": 0.01, "tokens": 32.0, "samples": 8.0,
       "frac_reward_zero_std": 0.25}


class Seen(TrainerCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, Any]] = []

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                       **kw: Any) -> None:
        self.calls.append(("begin", state.global_step, args))

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl,
                    **kw: Any) -> None:
        assert isinstance(control, TrainerControl)
        self.calls.append(("step_end", state.global_step, None))

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kw: Any) -> None:
        self.calls.append(("log", state.global_step, logs))

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl,
                     **kw: Any) -> None:
        self.calls.append(("end", state.global_step, None))


def test_rows_go_out_under_trls_names() -> None:
    logs = trl_logs(ROW)
    assert {k: logs[k] for k in ("reward", "reward_std", "rewards/exact/mean", "loss",
                                 "learning_rate", "grad_norm", "entropy", "kl",
                                 "clip_ratio/region_mean", "frac_reward_zero_std",
                                 "completions/mean_length")} == {
        "reward": 0.5, "reward_std": 0.1, "rewards/exact/mean": 0.5, "loss": 0.25,
        "learning_rate": 1e-3, "grad_norm": 2.0, "entropy": 3.0, "kl": 0.01,
        "clip_ratio/region_mean": 0.125, "frac_reward_zero_std": 0.25,
        "completions/mean_length": 4.0}
    assert "clip_frac" not in logs and "version" not in logs


def test_each_point_calls_each_callback_in_order() -> None:
    first, second = Seen(), Seen()
    args = object()
    watch = TrainerCallbacks([first, second], args, max_steps=5)
    watch.begin()
    version = PolicyVersion(3, "d")
    watch.on_step(StepReport(step=3, version=version, metrics={}, wait_s=0.0, train_s=0.0))
    watch.on_row(ROW, live=True)
    watch.close()
    watch.close()  # once
    for cb in (first, second):
        assert [(c[0], c[1]) for c in cb.calls] == [("begin", 0), ("step_end", 3), ("log", 3),
                                                    ("end", 3)]
        assert cb.calls[0][2] is args and cb.calls[2][2]["reward"] == 0.5
    assert watch.state.max_steps == 5 and watch.state.log_history[0]["step"] == 3


def test_callbacks_are_instances_or_classes_of_trainercallback() -> None:
    made = check_callbacks([Seen])
    assert isinstance(made[0], Seen)
    with pytest.raises(ConfigError, match=r"callbacks: expected transformers.TrainerCallback"):
        check_callbacks([lambda *a: None])

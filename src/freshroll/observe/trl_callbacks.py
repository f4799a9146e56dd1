"""TRL's (transformers') ``TrainerCallback``s watching a freshroll run:
``GRPOTrainer(callbacks=[...])``, as TRL takes them.

An observer (:mod:`freshroll.pipeline.observers`) that calls each callback, in the list's
order, where transformers' ``Trainer`` would::

    on_train_begin   from begin(), before the run starts (GRPOTrainer.train)
    on_step_end      after each committed step (on_step, or its row where that comes
                     first); state.global_step is the step
    on_log           after it, with each metrics.jsonl row this process writes (on_row),
                     its figures under TRL's names (:func:`trl_logs`); the row is also
                     appended to state.log_history
    on_train_end     once, when the run ends (close), finished or stopped

Each callback gets ``(args, state, control)``: ``args`` the ``GRPOConfig`` the trainer was
given, or else a ``transformers.TrainingArguments`` holding the run's own settings
(:func:`training_arguments`: output_dir, max_steps, seed, learning_rate), ``state`` a
``transformers.TrainerState`` (``global_step``, ``max_steps``, ``log_history``), ``control``
a ``TrainerControl``. An observer never steers a run (the contract), so what a callback
sets on ``control`` (``should_training_stop``, ``should_save``, ...) is not acted on:
``run.steps`` and the stop-at-target rule end a run, ``trainer.checkpoint_every`` saves it.
A callback's error ends the run as any observer's does (the run stays resumable).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from freshroll.errors import ConfigError
from freshroll.observe.live_names import scalars
from freshroll.pipeline.observers import Observer, Row, StepReport

if TYPE_CHECKING:
    from freshroll.config import Config

#: a row field -> TRL's name for it, where :func:`scalars`' tag is not TRL's already
_TRL: Final[dict[str, str]] = {"kl_ref": "kl"}


def trl_logs(row: Row) -> dict[str, float]:
    """The row's figures as TRL's ``on_log`` names them (``reward``, ``reward_std``,
    ``rewards/<f>/mean``, ``loss``, ``grad_norm``, ``learning_rate``, ``entropy``, ``kl``,
    ``clip_ratio/region_mean``, ``frac_reward_zero_std``, ``completions/mean_length``; all but
    ``kl`` are :func:`scalars`' own tags), beside freshroll's own figures under their
    TensorBoard tags."""
    logs = scalars(row)
    for field, name in _TRL.items():
        if field in logs:
            logs[name] = logs.pop(field)
    return logs


def check_callbacks(callbacks: Any) -> list[Any]:
    """``callbacks`` as TrainerCallback instances (a class is instantiated, as transformers
    does); anything else is a ConfigError naming it."""
    from transformers import TrainerCallback

    items = list(callbacks) if isinstance(callbacks, Sequence) else [callbacks]
    out = []
    for cb in items:
        if isinstance(cb, type) and issubclass(cb, TrainerCallback):
            cb = cb()
        if not isinstance(cb, TrainerCallback):
            raise ConfigError(f"callbacks: expected transformers.TrainerCallback instances or "
                              f"classes, got {type(cb).__name__} (freshroll's own watchers go "
                              "to train(observers=[...]))")
        out.append(cb)
    return out


def training_arguments(cfg: Config, out: Path) -> Any:
    """The ``args`` a callback gets when the trainer was given freshroll's keys: transformers'
    ``TrainingArguments`` with the run's directory, steps, seed and learning rate (what stock
    callbacks read), reporting nowhere."""
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out), max_steps=cfg.run.steps, seed=cfg.run.seed,
                             learning_rate=cfg.trainer.lr, report_to="none", use_cpu=True)


class TrainerCallbacks(Observer):
    """Calls transformers ``TrainerCallback``s at a run's points (the module's table)."""

    def __init__(self, callbacks: Sequence[Any], args: Any, max_steps: int) -> None:
        from transformers import TrainerControl, TrainerState

        self.callbacks = list(callbacks)
        self.args = args
        self.state = TrainerState(max_steps=max_steps, is_local_process_zero=True,
                                  is_world_process_zero=True)
        self.control = TrainerControl()
        self._ended = False

    def _call(self, event: str, **kwargs: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(self.args, self.state, self.control, **kwargs)

    def begin(self) -> None:
        """``on_train_begin``: the run is about to start."""
        self._call("on_train_begin")

    def _step_end(self, step: int) -> None:
        """``on_step_end`` once per step, before its ``on_log`` (transformers' order; the
        run writes a step's row before the observers after the recorder see the step)."""
        if step > self.state.global_step:
            self.state.global_step = step
            self._call("on_step_end")

    def on_step(self, report: StepReport) -> None:
        self._step_end(report.step)

    def on_row(self, row: Row, live: bool) -> None:
        self._step_end(int(row["step"]))
        logs = trl_logs(row)
        self.state.log_history.append({**logs, "step": int(row["step"])})
        self._call("on_log", logs=logs)

    def close(self) -> None:
        if not self._ended:
            self._ended = True
            self._call("on_train_end")


__all__ = ["TrainerCallbacks", "check_callbacks", "trl_logs"]

"""Weights & Biases: a run's figures logged to a W&B run (``monitor.wandb_project``).

An observer (:mod:`freshroll.pipeline.observers`). At its start it opens one W&B run:
``wandb.init(project=monitor.wandb_project, mode=monitor.wandb_mode, dir=RUN_DIR,
name=<the run directory's name>, config=<the run's resolved config>)``; W&B keeps its files
in ``RUN_DIR/wandb/``. Each ``metrics.jsonl`` row this process writes is one
``run.log(scalars, step=row["step"], commit=True)`` (the step is complete: W&B shows it at
once, not when the next arrives) with the tags of
:func:`~freshroll.observe.live_names.scalars` (the table Prometheus and TensorBoard share),
so each value is the row's. :meth:`close` finishes the W&B run. W&B's service process
(``wandb-core``, started by the first ``init``) is shared by every W&B run of this process,
so it is left to W&B: it ends with the process (W&B's exit handler, or its watch of the
parent's pid); a program that must end it sooner calls ``wandb.teardown()``.

``monitor.wandb_mode`` is ``offline`` unless set: nothing leaves the machine until the user
runs ``wandb sync RUN_DIR/wandb/offline-run-*``; ``online`` streams to the W&B server
(``wandb login`` first). ``log`` hands the row to W&B's own service process and returns,
so the contract's no-blocking rule holds. W&B's console capture is off (the run's progress
line stays the run's). Each start and ``--resume`` is a W&B run of its own, under the same
name. Without the ``wandb`` package the option is one ConfigError
(:func:`~freshroll.observe.extras.require`); so is a run W&B refuses to start (``online``
without ``wandb login``: W&B's own message, naming the key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError
from freshroll.observe.extras import require
from freshroll.observe.live_names import scalars
from freshroll.pipeline.observers import Observer, Row


def check_wandb(project: str | None) -> None:
    """``monitor.wandb_project`` set without the package: the ConfigError naming it."""
    if project is not None:
        require("wandb", "monitor.wandb_project", "wandb")


class WandbLogger(Observer):
    """One W&B run, opened by :meth:`start`, fed by rows, finished by :meth:`close`."""

    def __init__(self, project: str, mode: str, run_dir: Path, config: dict[str, Any]) -> None:
        self.project, self.mode, self.run_dir, self.config = project, mode, run_dir, config
        self._wandb = require("wandb", "monitor.wandb_project", "wandb")
        self.run: Any = None

    def start(self) -> WandbLogger:
        wandb = self._wandb
        try:
            self.run = wandb.init(
                project=self.project, mode=self.mode, dir=str(self.run_dir),
                name=self.run_dir.name, config=self.config, reinit="create_new",
                settings=wandb.Settings(console="off"),
            )
        except wandb.errors.Error as exc:
            raise ConfigError(f"monitor.wandb_project: W&B could not start a run in "
                              f"{self.mode} mode: {exc}") from None
        return self

    def on_row(self, row: Row, live: bool) -> None:
        if self.run is not None:
            self.run.log(scalars(row), step=int(row["step"]), commit=True)

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish()


__all__ = ["WandbLogger", "check_wandb"]

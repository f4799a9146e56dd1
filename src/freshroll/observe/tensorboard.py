"""TensorBoard: a run's figures as scalars in ``RUN_DIR/tensorboard/`` (``monitor.tensorboard``).

An observer (:mod:`freshroll.pipeline.observers`): each ``metrics.jsonl`` row this process
writes becomes one scalar per finite number, at the row's ``step``, under the tags of
:func:`~freshroll.observe.live_names.scalars` (the table Prometheus and W&B share), so each
value is the row's, never a second computation. ``torch.utils.tensorboard.SummaryWriter``
writes the event files on a thread of its own (a row is queued, not waited on: the
contract's no-blocking rule holds), flushed every :data:`FLUSH_S` seconds and at
:meth:`close`. A resumed run appends a new event file to the same directory; TensorBoard
shows its steps after the earlier ones. Without the ``tensorboard`` package the option is
one ConfigError (:func:`~freshroll.observe.extras.require`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from freshroll.observe.extras import require
from freshroll.observe.live_names import scalars
from freshroll.pipeline.observers import Observer, Row

#: the writer's flush period: what ``tensorboard --logdir`` may lag behind the run
FLUSH_S: Final = 10
#: the directory in the run directory
TENSORBOARD_DIR: Final = "tensorboard"


def check_tensorboard(on: bool) -> None:
    """``monitor.tensorboard`` on without the package: the ConfigError naming it."""
    if on:
        require("torch.utils.tensorboard", "monitor.tensorboard", "tensorboard")


class TensorBoardWriter(Observer):
    """The event files of one run, under ``logdir`` (made at the first row)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self._module = require("torch.utils.tensorboard", "monitor.tensorboard", "tensorboard")
        self._writer: Any = None

    def on_row(self, row: Row, live: bool) -> None:
        if self._writer is None:
            self._writer = self._module.SummaryWriter(log_dir=str(self.logdir),
                                                      flush_secs=FLUSH_S)
        step = int(row["step"])
        for tag, value in scalars(row).items():
            self._writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()


__all__ = ["FLUSH_S", "TENSORBOARD_DIR", "TensorBoardWriter", "check_tensorboard"]

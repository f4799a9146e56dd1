"""Acts on a run whose policy collapsed, instead of only warning about it.

A policy can fall into a state it never leaves by itself: every completion ends at once, or
says the same thing, every group scores its members alike, every advantage is 0 and no
gradient flows (seen at 1.06M parameters, 16 new tokens, lr 1e-3: docs/benchmarks.md). Its
steps then get cheap, so its rate rises while it learns nothing; a run that goes on only
burns its budget and ends with a worse policy than it had.

**The rule** is :class:`~freshroll.figures.learning.CollapseWatch` (its module states it; the
same rule gives ``summary.json``'s ``learning.collapse``), fed each committed step's
``metrics.jsonl`` row with the ``monitor.collapse_steps``, ``entropy_floor`` and
``collapse_drop`` in force: a stretch of steps without learning signal or with entropy under
the floor, after the reward lost a share of what it had gained. A run that never learned
(the no-signal warning's case, :mod:`freshroll.observe.no_signal`) or that converged is not a
collapse.

**The act** (``monitor.on_collapse``): ``stop`` (the default) ends the run with
:class:`~freshroll.errors.LearningCollapsed` (exit status 3: the ledger closed ``failed``,
its checkpoints kept; ``--resume`` with ``--allow-change trainer.lr`` goes on from the last
one), naming the step, the best reward and what to change; ``warn`` says it once on stderr and
goes on. Rows a resumed run catches up on are folded but never acted on.
"""

from __future__ import annotations

from typing import Any, TextIO

from freshroll.errors import LearningCollapsed
from freshroll.figures.learning import CollapseWatch
from freshroll.pipeline.observers import Observer, Row


class CollapseGuard(Observer):
    """Feeds every row to a :class:`CollapseWatch` and acts once on a live collapse."""

    def __init__(self, watch: CollapseWatch, stop: bool, stream: TextIO) -> None:
        self.watch, self.stop, self.stream = watch, stop, stream
        self.said = False

    def on_row(self, row: Row, live: bool) -> None:
        found = self.watch.feed(row)
        if found is None or not live or self.said:
            return
        self.said = True
        if self.stop:
            raise LearningCollapsed(found.message(stopping=True))
        tty = self.stream.isatty()
        self.stream.write(("\n" if tty else "") + "warning: " + found.message(False) + "\n")
        self.stream.flush()


def collapse_guard(monitor: Any, stream: TextIO) -> CollapseGuard:
    """The guard ``monitor.*`` asks for."""
    watch = CollapseWatch(monitor.collapse_steps, monitor.entropy_floor, monitor.collapse_drop)
    return CollapseGuard(watch, monitor.on_collapse == "stop", stream)


__all__ = ["CollapseGuard", "collapse_guard"]

"""Run observers: what watches a run (rows, the progress line, checkpoints, exporters).

The :class:`~freshroll.pipeline.pipeline.Pipeline` takes a list of observers and calls every
one of them, in the list's order, at each of these points::

    checkpointed(step)   after the trainer's ``before_commit`` of ``step``, before its commit:
                         a record to make durable with the commit (``checkpoint_saved``,
                         ``evaluated``), or None
    on_step(report)      after a step's durable commit (and its weights' publication)
    on_skip(step, detail)  after a non-finite step was skipped (its batch discarded)
    on_mode(switch)      after the sync fallback's decision was recorded (``mode_decided``)
    on_wait(line)        a wait in flight past ``limits.heartbeat_s`` (real clock only):
                         ``waiting 60 s on w0 generate, limit 600 s``

and a run (:func:`freshroll.runtime.run.run`) adds two of its own::

    on_row(row, live)    a ``metrics.jsonl`` row, right after it was written (by the run's
                         :class:`~freshroll.runtime.recording.MetricsRows`); ``live`` False for
                         the rows a stopped run catches up on after the error that stopped it
                         (after the loop ended, best effort: an error there is dropped)
    close()              once, when the run ends (finished, failed or interrupted), before
                         the ledger is closed; a failing close is raised after it (a note
                         on the error of a run that had already failed)

The contract:

- **Where.** Every callback runs on the pipeline's event loop, in the task that reached
  the point (the trainer task; the watch task for ``on_wait``), except the write-ahead of a
  commit: a :class:`~freshroll.runtime.recording.Checkpointer`'s ``before_commit`` runs on
  the trainer adapter's thread in this process (a Ray trainer actor's state is fetched to it)
  and hands its record to ``checkpointed``; the step is committed only after it returned.
  Rows come from the ledger's durable events, never from in-memory state, so a kill between
  a commit and its row costs nothing: the next start writes the row.
- **No blocking.** A callback holds the loop while it runs: no sleeps, no network, no wait
  on another thread; append a line and return. An exporter that ships rows elsewhere hands
  them to its own bounded queue and thread. Under a virtual clock a callback's time is
  invisible to the run's figures but not to its wall.
- **No steering.** An observer reads; it never changes the buffer, the ledger, the
  pipeline or the report it is given. The one write it may ask for is ``checkpointed``'s
  record, which the pipeline makes durable with the step's commit.
- **Failures.** An exception raised by a callback is not swallowed: it ends the run like
  any task's failure (the ledger closed ``failed``, resumable; the error raised plain). A
  step's ``on_step`` and ``on_row`` run after its durable commit, so a failing observer
  never loses a committed step. An observer that must not stop a run catches its own errors.

:class:`Observer` gives every callback a no-op, so an observer overrides only what it
watches; adding one is a module with its class plus one registration (``run(...,
observers=[...])``; docs/architecture.md, "Adding an observer").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from freshroll.ledger.events import CheckpointSaved, Evaluated
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.fallback import Switch
from freshroll.ports.threads import ModeGroup
from freshroll.stage_threads import ModeThreads

Row = dict[str, Any]  # a metrics.jsonl row (freshroll.figures.metrics.Tally; docs/metrics.md)
#: what a write-ahead of a commit records with it (``checkpointed``)
WriteAhead = CheckpointSaved | Evaluated


@dataclass
class StepReport:
    """One committed step, as the trainer task saw it."""

    step: int
    version: PolicyVersion
    metrics: dict[str, float]
    wait_s: float
    train_s: float


class RunObserver(Protocol):
    """What watches a run (the contract: this module's docstring)."""

    def checkpointed(self, step: int) -> WriteAhead | None: ...

    def on_step(self, report: StepReport) -> None: ...

    def on_skip(self, step: int, detail: str) -> None: ...

    def on_mode(self, switch: Switch) -> None: ...

    def on_wait(self, line: str) -> None: ...

    def on_row(self, row: Row, live: bool) -> None: ...

    def close(self) -> None: ...


class Observer:
    """A :class:`RunObserver` that watches nothing: subclass it and override what you watch."""

    def checkpointed(self, step: int) -> WriteAhead | None:
        return None

    def on_step(self, report: StepReport) -> None:
        pass

    def on_skip(self, step: int, detail: str) -> None:
        pass

    def on_mode(self, switch: Switch) -> None:
        pass

    def on_wait(self, line: str) -> None:
        pass

    def on_row(self, row: Row, live: bool) -> None:
        pass

    def close(self) -> None:
        pass


class Notes(Observer):
    """What every run says on stderr however it is watched: a skipped non-finite step and
    the sync fallback's choice during the run (one line each)."""

    def on_skip(self, step: int, detail: str) -> None:
        sys.stderr.write(f"warning: trainer step {step} skipped, its batch discarded "
                         f"(nonfinite_step): {detail}\n")

    def on_mode(self, switch: Switch) -> None:
        # a choice made during the run; the mode a run starts in is in the ledger and its
        # end line, not a line of stderr of its own (a failing run's one line stays one)
        if switch.phase == "chose" and not switch.start:
            sys.stderr.write(f"sync fallback (step {switch.step}): {switch.reason}\n")


class FollowMode(Observer):
    """Each ``mode_decided`` moves an async inline run's engine calls: to the trainer's
    compute thread in the sync fallback's windows, to their own threads while async
    (:class:`~freshroll.ports.threads.ModeGroup`); or sets an async process run's thread
    count per call: every core in those windows, a share while async
    (:class:`~freshroll.stage_threads.ModeThreads`)."""

    def __init__(self, group: ModeGroup | ModeThreads) -> None:
        self.group = group

    def on_mode(self, switch: Switch) -> None:
        self.group.set_mode(switch.mode)


class Heartbeats(Observer):
    """The heartbeat as a line of its own on stderr (a bare pipeline's; a run draws it on
    its progress line instead: :class:`~freshroll.runtime.recording.ProgressLine`)."""

    def on_wait(self, line: str) -> None:
        sys.stderr.write(line + "\n")


def default_observers() -> list[RunObserver]:
    """A pipeline's observers when it is given none: :class:`Notes` and :class:`Heartbeats`."""
    return [Notes(), Heartbeats()]


class Callbacks(Observer):
    """An observer made of plain functions (a test's or a script's): each one given is
    called at its point, the others do nothing."""

    def __init__(self, *, on_step: Callable[[StepReport], None] | None = None,
                 on_skip: Callable[[int, str], None] | None = None,
                 on_mode: Callable[[Switch], None] | None = None,
                 on_wait: Callable[[str], None] | None = None,
                 on_row: Callable[[Row, bool], None] | None = None) -> None:
        self._step, self._skip, self._mode = on_step, on_skip, on_mode
        self._wait, self._row = on_wait, on_row

    def on_step(self, report: StepReport) -> None:
        if self._step is not None:
            self._step(report)

    def on_skip(self, step: int, detail: str) -> None:
        if self._skip is not None:
            self._skip(step, detail)

    def on_mode(self, switch: Switch) -> None:
        if self._mode is not None:
            self._mode(switch)

    def on_wait(self, line: str) -> None:
        if self._wait is not None:
            self._wait(line)

    def on_row(self, row: Row, live: bool) -> None:
        if self._row is not None:
            self._row(row, live)


def close_all(observers: Iterable[RunObserver]) -> None:
    """Close every observer, each even if one before it failed; the first failure is raised."""
    first: BaseException | None = None
    for o in observers:
        try:
            o.close()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first


__all__ = ["Callbacks", "Heartbeats", "Notes", "Observer", "Row", "RunObserver", "StepReport",
           "WriteAhead", "close_all", "default_observers"]

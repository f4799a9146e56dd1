"""The one contract of the ledger folds: a run directory's figures computed in one pass.

A :class:`Fold` reads a ledger's events one at a time, in ledger order, and keeps only what
its figures need (no per-sample state past a sample's end). The folds:

* :class:`~freshroll.figures.summary.SummaryFold`: everything ``summary.json`` says, by
  routing each event to the folds below that read its kind (and the
  :class:`~freshroll.figures.metrics.Tally`, which reads every event);
* :class:`~freshroll.figures.timing.SpanFold` (the stage spans),
  :class:`~freshroll.figures.bias.SampleBias`, :class:`~freshroll.figures.verdict.VerdictFold`,
  :class:`~freshroll.figures.summary.RewardVersions`,
  :class:`~freshroll.figures.overlap.OverlapFold` (and its
  :class:`~freshroll.figures.overlap.ModeFold`),
  :class:`~freshroll.figures.segments.SegmentFold`: the parts of the summary;
* :class:`~freshroll.figures.history.HistoryFold`,
  :class:`~freshroll.figures.trained.TrainedFold`: the report's timeline and sample completions.

The contract:

* ``KINDS``: the event types the fold reads; every type its ``feed`` tests for is listed. A
  router (``SummaryFold``) feeds a fold only events of these types (so a fold may take an
  event outside them for one of its own). A fold that reads every event lists
  :data:`~freshroll.ledger.events.EVENT_TYPES`.
* ``feed(e)``: one event, in ledger order. It never reads the ledger or the clock. Its return
  value, if any, is the fold's own (nothing reads it through this protocol).
* ``result()``: the figures of the events fed so far; it may be asked for any number of
  times, between feeds too, and changes nothing a later ``feed`` sees. Some folds keep an
  older name for it as well (``SummaryFold.summary``, ``HistoryFold.entries``,
  ``TrainedFold.steps``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Fold(Protocol):
    """One pass of ledger events to figures (the contract: module docstring)."""

    KINDS: ClassVar[tuple[type, ...]]

    def feed(self, e: Any) -> object:
        """One event, in ledger order."""
        ...

    def result(self) -> Any:
        """The figures of the events fed so far."""
        ...


__all__ = ["Fold"]

"""A run's history: what happened to it, when, in the order the ledger says.

A run is more than its last settings: a resume starts a new segment, ``--allow-change``
changes a setting at some step, the sync fallback switches modes, workers are lost and
replaced, the trainer restarts, the controller resizes, chaos injects faults. Each such
event becomes one :class:`Entry` (seconds since the ledger's first event, the committed
steps so far, a lane and one line of text) for the report's timeline; the controller's
live settings after each decision are kept as a series (:attr:`HistoryFold.controls`).

Lanes (the timeline's rows): ``segments`` (opened, closed), ``settings``, ``mode``,
``workers`` (lost, timed out, ready again), ``trainer`` (restarts), ``controller`` (decisions
that changed a setting), ``faults`` (injected). Routine decisions that changed nothing are
counted (:attr:`HistoryFold.decisions`), not listed.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Final, NamedTuple

from freshroll.figures.tally import WORKER_LOSS_REASONS
from freshroll.ledger.events import (
    Closed,
    Committed,
    ControllerDecided,
    FaultInjected,
    ModeDecided,
    Opened,
    SettingsChanged,
    TrainerRestarted,
    WorkerFenced,
    WorkerReady,
)

LANES: Final = ("segments", "settings", "mode", "workers", "trainer", "controller", "faults")


class Entry(NamedTuple):
    t: float  # seconds since the ledger's first event
    step: int  # committed steps when it happened
    lane: str
    text: str


class Control(NamedTuple):
    t: float
    workers: int
    concurrency: int
    admission_limit: int


class HistoryFold:
    """The entries of a run's history, one event at a time (``feed``; a
    :class:`~freshroll.figures.fold.Fold`)."""

    KINDS: ClassVar = (Opened, Closed, Committed, SettingsChanged, ModeDecided, WorkerFenced,
                       WorkerReady, TrainerRestarted, ControllerDecided, FaultInjected)

    def __init__(self) -> None:
        self.t0: float | None = None
        self.steps = 0
        self.entries: list[Entry] = []
        self.controls: list[Control] = []
        self.decisions = 0
        self._lost: set[tuple[str, int]] = set()  # (worker, epoch) lost, not yet ready again

    def result(self) -> list[Entry]:
        """The entries so far (:attr:`entries`; the controller's settings: :attr:`controls`)."""
        return list(self.entries)

    def _add(self, ts: float, lane: str, text: str) -> None:
        self.entries.append(Entry(ts - (self.t0 or 0.0), self.steps, lane, text))

    def feed(self, e: Any) -> None:
        if self.t0 is None:
            self.t0 = e.ts
        if isinstance(e, Committed):
            self.steps += 1
        elif isinstance(e, Opened):
            what = "started" if e.incarnation == 0 else f"resumed (incarnation {e.incarnation})"
            self._add(e.ts, "segments", f"{what}: max_staleness {e.max_staleness}")
        elif isinstance(e, Closed):
            self._add(e.ts, "segments", f"closed: {e.reason}")
        elif isinstance(e, SettingsChanged):
            self._add(e.ts, "settings", _changed(e))
        elif isinstance(e, ModeDecided):
            self._add(e.ts, "mode", f"{e.mode} ({e.phase}): {e.reason}")
        elif isinstance(e, WorkerFenced) and e.reason in WORKER_LOSS_REASONS:
            self._lost.add((e.worker, e.epoch))
            detail = f": {e.detail}" if e.detail else ""
            self._add(e.ts, "workers", f"{e.worker} epoch {e.epoch} {e.reason}{detail}")
        elif isinstance(e, WorkerReady) and any(w == e.worker for w, _ in self._lost):
            self._lost = {x for x in self._lost if x[0] != e.worker}
            self._add(e.ts, "workers", f"{e.worker} epoch {e.epoch} ready again "
                                       f"({e.startup_s:.1f} s to start)")
        elif isinstance(e, TrainerRestarted):
            self._add(e.ts, "trainer", f"trainer restarted ({e.reason}, restart {e.restart}, "
                                       f"rebuilt in {e.rebuild_s:.1f} s)")
        elif isinstance(e, ControllerDecided):
            self._decided(e)
        elif isinstance(e, FaultInjected):
            self._add(e.ts, "faults", f"{e.fault} on {e.target}"
                                      + (f": {e.detail}" if e.detail else ""))

    def _decided(self, e: ControllerDecided) -> None:
        self.decisions += 1
        s = e.settings
        self.controls.append(Control(e.ts - (self.t0 or 0.0), s.workers, s.concurrency,
                                     s.admission_limit))
        if s != e.previous:
            p = e.previous
            moves = [f"{name} {a} -> {b}" for name, a, b in (
                ("workers", p.workers, s.workers), ("concurrency", p.concurrency, s.concurrency),
                ("admission limit", p.admission_limit, s.admission_limit)) if a != b]
            self._add(e.ts, "controller", f"{', '.join(moves)} ({e.bottleneck}: {e.reason})")


def _changed(e: SettingsChanged) -> str:
    try:
        old, new = json.loads(e.old), json.loads(e.new)
    except ValueError:
        return f"settings changed at step {e.step}: {', '.join(e.keys)}"
    parts = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in e.keys]
    return f"changed at step {e.step}: {', '.join(parts)}"


__all__ = ["LANES", "Control", "Entry", "HistoryFold"]

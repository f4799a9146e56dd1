"""The end-of-run verdict: did the run train what was asked, and if not, why not.

A run that committed no step, or fewer steps than ``run.steps``, must say so plainly in the
terminal, ``summary.json`` and the report — never a green line over a run that trained
nothing. The verdict is a pure function of the ledger events (the steps asked are those of
the last ``run_config`` event), so ``verify`` recomputes it and a saved run rebuilds it::

    status = "complete"     steps committed >= steps asked, ledger closed
             "incomplete"   fewer steps than asked, ledger closed (stopped by a failure, ...)
             "no steps"     closed without a single committed step
             "open"         the ledger never closed (killed, or still running): resume it

``first_failure`` maps every discard reason that ends a request for a cause (not the
bookkeeping reasons ``fenced`` and ``shutdown``) to its count and the FIRST such discard's
detail, the message a user acts on (e.g. a reward's first ``KeyError``). ``stopped`` is the
reason of the last ``closed`` event (``done``, or the failure that ended the run).

:func:`recovery_line` says what a run survived (worker losses, re-issued attempts, trainer
restarts: the figures of :mod:`freshroll.figures.metrics`), so a run that recovered from crashes
ends neither green nor silent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from freshroll.ledger import events as ev

BOOKKEEPING_REASONS = frozenset({"fenced", "shutdown"})
#: discards an asynchronous run makes by design (freshness enforced): not shown as failures of a
#: complete run (they are in the discard figures)
EXPECTED_REASONS = frozenset({"stale"})


class VerdictFold:
    """:func:`verdict` one event at a time (``feed``), for a reader folding several figures
    in one pass over a ledger."""

    KINDS: ClassVar = (ev.RunConfig, ev.Committed, ev.Closed, ev.Opened, ev.Discarded)

    def __init__(self) -> None:
        self.committed, self.closed = 0, False
        self.stopped: str | None = None
        self.asked: int | None = None
        self.failures: dict[str, dict[str, Any]] = {}

    def feed(self, e: ev.Event) -> None:
        if isinstance(e, ev.RunConfig):
            self.asked = _steps_of(e.config)
        elif isinstance(e, ev.Committed):
            self.committed += 1
        elif isinstance(e, ev.Closed):
            self.closed, self.stopped = True, e.reason
        elif isinstance(e, ev.Opened):
            self.closed = False
        elif isinstance(e, ev.Discarded) and e.reason not in BOOKKEEPING_REASONS:
            slot = self.failures.setdefault(e.reason, {"count": 0, "first": e.detail})
            slot["count"] += 1

    def result(self, steps_asked: int | None = None) -> dict[str, Any]:
        """The verdict of the events fed so far (``steps_asked``: as for :func:`verdict`)."""
        if steps_asked is None:
            steps_asked = self.asked
        committed = self.committed
        if not self.closed:
            status = "open"
        elif committed == 0:
            status = "no steps"
        elif steps_asked is not None and committed < steps_asked:
            status = "incomplete"
        else:
            status = "complete"
        return {"status": status, "steps_asked": steps_asked, "steps_committed": committed,
                "stopped": self.stopped,
                "first_failure": {k: dict(v) for k, v in self.failures.items()}}


def verdict(events: Iterable[ev.Event], steps_asked: int | None = None) -> dict[str, Any]:
    """``{"status", "steps_asked", "steps_committed", "stopped", "first_failure"}``.

    ``steps_asked``: ``run.steps`` of the last ``run_config`` event unless given.
    """
    fold = VerdictFold()
    for e in events:
        fold.feed(e)
    return fold.result(steps_asked)


def _steps_of(config_json: str) -> int | None:
    try:
        steps = json.loads(config_json).get("run", {}).get("steps")
    except (ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) else None


def render(v: dict[str, Any]) -> str:
    """One or more plain lines for the terminal; empty for a complete run without failures."""
    lines = []
    asked = v.get("steps_asked")
    if v["status"] == "open":
        lines.append(f"run NOT closed after {v['steps_committed']} committed steps: it was "
                     "killed or is still running; `freshroll run --resume DIR` continues it")
    elif v["status"] != "complete":
        lines.append(f"run INCOMPLETE: committed {v['steps_committed']} of {asked} steps asked"
                     f" (stopped: {v.get('stopped')})")
    for reason, info in v.get("first_failure", {}).items():
        if v["status"] != "complete" or reason not in EXPECTED_REASONS:
            lines.append(f"  {info['count']} {reason} discards; first: {info['first']}")
    return "\n".join(lines)


def recovery_line(summary: Mapping[str, Any]) -> str:
    """One line on what the run recovered from (``summary.json``'s ``worker_losses``,
    ``reissued_attempts`` and ``trainer_restarts``); empty when it lost nothing."""
    losses = summary.get("worker_losses") or 0
    restarts = summary.get("trainer_restarts") or 0
    if not losses and not restarts:
        return ""
    parts = []
    if losses:
        by = summary.get("worker_losses_by_reason") or {}
        reasons = ", ".join(f"{n} {r}" for r, n in by.items())
        parts.append(f"{losses} inference worker loss{'es' if losses != 1 else ''} "
                     f"({reasons}), replaced; {summary.get('reissued_attempts') or 0} "
                     "attempts re-issued")
    if restarts:
        parts.append(f"{restarts} trainer restart{'s' if restarts != 1 else ''}")
    line = "recovered from " + "; ".join(parts)
    first = summary.get("worker_loss_first")
    return f"{line}; first loss: {first}" if first else line

"""Failure budgets: one circuit breaker per stage, so a stage that only fails ends the run.

A *stage* is one thing that fails on its own: a reward function, an inference
worker, the reward calls as a whole (timeouts), the trainer (non-finite steps).
Work reaches a stage in *calls* (one reward call, one generate call, one step)
of one or more *units* (samples; for timeouts and steps, the call itself). Each
call is recorded with how many of its units failed. A call *fails* when all its
units failed; a call with any success resets the streak. The breaker trips when::

        consecutive failed calls >= max_calls
    and units in those calls     >= max_units
    or  failed units among the last ``window`` units  >  max_ratio x window
        (only once ``window`` units were seen; ``window = 0`` turns this rule off)

Why both counts: a call can hold one sample or hundreds. Counting samples only,
two unlucky calls of 256 samples would stop a run whose reward server fails one
call in a hundred; counting calls only, eight unlucky one-sample calls would. A
stage that always fails stops after ``max_calls`` calls and ``max_units`` units,
whichever comes last; a stage that fails now and then never trips as long as it
succeeds in between and its failure ratio stays at most ``max_ratio``.

A tripped breaker raises :class:`~freshroll.errors.FailureBudgetExceeded` with
ONE line: the stage, the rule that tripped (with its config keys) and the
stage's *first* error, quoted. Everything here is pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from freshroll import unsafe
from freshroll.errors import FailureBudgetExceeded

_MAX_QUOTE = 300  # characters of the first error kept from its start, and from its end


@dataclass(frozen=True, slots=True)
class Rule:
    """When a stage's breaker trips; the ``*_key`` fields name config keys, for the message."""

    max_calls: int
    max_units: int = 1
    window: int = 0
    max_ratio: float = 1.0
    unit: str = "samples"
    calls_key: str = "limits.max_consecutive_failed_calls"
    units_key: str = "limits.max_consecutive_failures"
    ratio_key: str = "limits.max_failure_ratio"

    def __post_init__(self) -> None:
        if self.max_calls < 1 or self.max_units < 1:
            raise ValueError(f"max_calls and max_units must be >= 1, got "
                             f"{self.max_calls}, {self.max_units}")
        if self.window < 0 or not 0.0 < self.max_ratio <= 1.0:
            raise ValueError(f"need window >= 0 and 0 < max_ratio <= 1, got "
                             f"{self.window}, {self.max_ratio}")


@dataclass
class Breaker:
    """The failure record of one stage under one :class:`Rule`."""

    stage: str
    rule: Rule
    calls: int = 0  # consecutive failed calls
    units: int = 0  # units in those calls
    failures: int = 0  # failed units in total
    first_error: str | None = None
    _recent: deque[bool] = field(default_factory=deque)  # last `window` units, True = ok
    _recent_failures: int = 0

    def record(self, failed: int, total: int = 1, error: str = "") -> None:
        """Record one call of ``total`` units, ``failed`` of which failed; raise on a trip."""
        if not 0 <= failed <= total:
            raise ValueError(f"failed must be in [0, {total}], got {failed}")
        if total == 0:
            return
        if failed < total:
            self.calls = self.units = 0
        else:
            self.calls += 1
            self.units += total
        if failed:
            self.failures += failed
            if self.first_error is None:
                self.first_error = error or "(no message)"
        if self.rule.window:
            for ok in [True] * (total - failed) + [False] * failed:
                if len(self._recent) == self.rule.window:
                    self._recent_failures -= not self._recent.popleft()
                self._recent.append(ok)
                self._recent_failures += not ok
        if failed:
            self._check()

    def _check(self) -> None:
        r = self.rule
        if self.calls >= r.max_calls and self.units >= r.max_units:
            if r.max_units > 1:
                why = (f"failed {self.units} {r.unit} in {self.calls} calls in a row "
                       f"({r.units_key}={r.max_units}, {r.calls_key}={r.max_calls})")
            else:
                why = f"failed {self.calls} {r.unit} in a row ({r.calls_key}={r.max_calls})"
        elif (r.window and len(self._recent) == r.window
              and self._recent_failures > r.max_ratio * r.window):
            why = (f"failed {self._recent_failures} of its last {r.window} {r.unit} "
                   f"({r.ratio_key}={r.max_ratio})")
        else:
            return
        first = quote(self.first_error)
        raise FailureBudgetExceeded(f'{self.stage} {why}; first error: "{first}"')


class FailureBudget:
    """The breakers of a run, one per stage, created on first use with the stage's rule."""

    def __init__(self) -> None:
        self.breakers: dict[str, Breaker] = {}

    def record(self, stage: str, rule: Rule, failed: int, total: int = 1, error: str = "") -> None:
        """Record one call of ``stage``; raises :class:`FailureBudgetExceeded` on a trip."""
        breaker = self.breakers.get(stage)
        if breaker is None:
            breaker = self.breakers[stage] = Breaker(stage, rule)
        if unsafe.BROKEN and unsafe.broken("budget"):  # test-only: freshroll.unsafe
            return
        breaker.record(failed, total, error)


def quote(text: str | None) -> str:
    """The error on one line; a long one keeps its start and its end, where the hint is
    ("... (the reward asked for column 'solution'; the dataset has columns [...])")."""
    one_line = " ".join((text or "").split())
    if len(one_line) <= 2 * _MAX_QUOTE + 5:
        return one_line
    return f"{one_line[:_MAX_QUOTE]} ... {one_line[-_MAX_QUOTE:]}"


__all__ = ["Breaker", "FailureBudget", "Rule", "quote"]

"""Failure budgets: one circuit breaker per stage, so a stage that only fails ends the run.

A *stage* is one thing that fails on its own: a reward function, an inference
worker, the reward calls as a whole (timeouts), the trainer (non-finite steps).
Each unit of work a stage finishes is recorded as a success or a failure, in the
stage's unit (samples for reward functions and workers, calls for reward
timeouts, steps for the trainer). A stage's breaker trips when::

    consecutive failures                     >= max_consecutive
    or   failures among its last ``window`` units  >  max_ratio x window
         (only once ``window`` units were seen; ``window = 0`` turns this rule off)

A success resets the consecutive count; the window slides over the last
``window`` units. So a stage that always fails stops after ``max_consecutive``
units, and a stage that fails now and then never trips as long as it succeeds
in between and its failure ratio stays at most ``max_ratio``.

A tripped breaker raises :class:`~freshroll.errors.FailureBudgetExceeded` with
ONE line: the stage, the rule that tripped (with its config key) and the
stage's *first* error, quoted. Everything here is pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from freshroll.errors import FailureBudgetExceeded

_MAX_QUOTE = 300  # characters of the first error kept in the message


@dataclass(frozen=True, slots=True)
class Rule:
    """When a stage's breaker trips; ``keys`` name the config fields, for the message."""

    max_consecutive: int
    window: int = 0
    max_ratio: float = 1.0
    unit: str = "samples"
    consecutive_key: str = "limits.max_consecutive_failures"
    ratio_key: str = "limits.max_failure_ratio"

    def __post_init__(self) -> None:
        if self.max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {self.max_consecutive}")
        if self.window < 0 or not 0.0 < self.max_ratio <= 1.0:
            raise ValueError(f"need window >= 0 and 0 < max_ratio <= 1, got "
                             f"{self.window}, {self.max_ratio}")


@dataclass
class Breaker:
    """The failure record of one stage under one :class:`Rule`."""

    stage: str
    rule: Rule
    consecutive: int = 0
    failures: int = 0  # in total
    first_error: str | None = None
    _recent: deque[bool] = field(default_factory=deque)
    _recent_failures: int = 0

    def record(self, ok: bool, n: int = 1, error: str = "") -> None:
        """Record ``n`` units that all succeeded or all failed; raise if the breaker trips."""
        if n < 1:
            return
        if ok:
            self.consecutive = 0
        else:
            self.consecutive += n
            self.failures += n
            if self.first_error is None:
                self.first_error = error or "(no message)"
        if self.rule.window:
            for _ in range(n):
                if len(self._recent) == self.rule.window:
                    self._recent_failures -= not self._recent.popleft()
                self._recent.append(ok)
                self._recent_failures += not ok
        if not ok:
            self._check()

    def _check(self) -> None:
        r = self.rule
        if self.consecutive >= r.max_consecutive:
            why = (f"failed {self.consecutive} {r.unit} in a row "
                   f"({r.consecutive_key}={r.max_consecutive})")
        elif (r.window and len(self._recent) == r.window
              and self._recent_failures > r.max_ratio * r.window):
            why = (f"failed {self._recent_failures} of its last {r.window} {r.unit} "
                   f"({r.ratio_key}={r.max_ratio})")
        else:
            return
        first = _quote(self.first_error)
        raise FailureBudgetExceeded(f'{self.stage} {why}; first error: "{first}"')


class FailureBudget:
    """The breakers of a run, one per stage, created on first use with the stage's rule."""

    def __init__(self) -> None:
        self.breakers: dict[str, Breaker] = {}

    def record(self, stage: str, rule: Rule, ok: bool, n: int = 1, error: str = "") -> None:
        """Record ``n`` units of ``stage``; raises :class:`FailureBudgetExceeded` on a trip."""
        breaker = self.breakers.get(stage)
        if breaker is None:
            breaker = self.breakers[stage] = Breaker(stage, rule)
        breaker.record(ok, n, error)


def _quote(text: str | None) -> str:
    one_line = " ".join((text or "").split())
    return one_line if len(one_line) <= _MAX_QUOTE else one_line[:_MAX_QUOTE] + "..."


__all__ = ["Breaker", "FailureBudget", "Rule"]

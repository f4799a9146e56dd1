"""Steps per second and the time left, for the progress line.

Pure: fed each committed step's number and run time ``t`` (``metrics.jsonl``'s ``t``, the
trainer's wall time, carried over resumes), it answers with the recent pace::

    steps_per_s = (step_new - step_old) / (t_new - t_old)   over the last WINDOW steps
    eta_s       = (total - step_new) / steps_per_s

A window rather than the whole run: the pace after a warm-up, a mode switch of the sync
fallback or a worker's replacement is the one the rest of the run will see. None until two
steps are seen (or while their times are equal).
"""

from __future__ import annotations

from collections import deque

#: the steps the pace is taken over (at most)
WINDOW = 20


class Pace:
    def __init__(self, total: int, window: int = WINDOW) -> None:
        self.total = total
        self._seen: deque[tuple[int, float]] = deque(maxlen=window + 1)

    def feed(self, step: int, t: float) -> None:
        self._seen.append((step, t))

    @property
    def steps_per_s(self) -> float | None:
        if len(self._seen) < 2:
            return None
        (s0, t0), (s1, t1) = self._seen[0], self._seen[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    @property
    def eta_s(self) -> float | None:
        rate = self.steps_per_s
        if rate is None:
            return None
        return max(0, self.total - self._seen[-1][0]) / rate

    def render(self) -> str:
        """``2.31 steps/s  ETA 1m12s`` (``- steps/s  ETA -`` before the pace is known)."""
        rate, eta = self.steps_per_s, self.eta_s
        r = "-" if rate is None else f"{rate:.2f}" if rate < 100 else f"{rate:.0f}"
        return f"{r} steps/s  ETA {'-' if eta is None else duration(eta)}"


def duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``: the time left, to the precision a user reads."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


__all__ = ["WINDOW", "Pace", "duration"]

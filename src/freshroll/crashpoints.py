"""Named crash points: where a test SIGKILLs a run, to prove that every window of a run's
life leaves a directory that ``--resume`` and ``verify`` open (issue 23's crash-window
sweep, tests/kernel/test_crash_windows.py).

``FRESHROLL_CRASH_AT=<point>`` makes the process SIGKILL itself the first time it reaches
``<point>``; unset (always, outside that test), :func:`reach` is one environment lookup.
The points, in the order a new run meets them::

    rundir      the run directory exists and is locked; nothing else is written yet
    config      config.yaml is written; the embedded model is not saved yet
    model       the embedded model is written beside model/ (model.tmp), not renamed in
    ledger      the empty ledger is built aside (ledger.sqlite.tmp-PID), not linked in
    checkpoint  a checkpoint is written beside its step-N directory, not renamed in
    commit      the first trainer step is committed (durable), its metrics row not written
    summary     the run is closed and summary.json written; report.html is not

A SIGKILL is what a kill -9, an OOM kill or a power cut does to the process: nothing of
its own code runs after it (no ``finally``, no ``atexit``).
"""

from __future__ import annotations

import os
import signal

from freshroll.errors import ConfigError

ENV = "FRESHROLL_CRASH_AT"
POINTS = ("rundir", "config", "model", "ledger", "checkpoint", "commit", "summary")


def reach(point: str) -> None:
    """SIGKILL this process if ``FRESHROLL_CRASH_AT`` names ``point``."""
    assert point in POINTS, point
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def check_env() -> None:
    """Refuse (:class:`~freshroll.errors.ConfigError`) a ``FRESHROLL_CRASH_AT`` that names no
    point: a mistyped point would let the run finish and the test pass without a kill."""
    wanted = os.environ.get(ENV)
    if wanted is not None and wanted not in POINTS:
        raise ConfigError(f"{ENV}={wanted!r}: not a crash point; one of {', '.join(POINTS)}")


__all__ = ["ENV", "POINTS", "check_env", "reach"]

"""A reward module's import within a bound, said while it lasts.

A reward module runs its top-level code when it is imported; one that blocks (a socket, a
lock, ``time.sleep``) would hang ``freshroll run`` before anything starts, silently.
:func:`bounded` runs the import on a daemon thread and waits for it in slices of
``heartbeat_s``, saying each one past the first (``waiting 30 s on reward import
path/to/file.py, limit 120 s``, the words of :mod:`freshroll.ports.waits`); past
``timeout_s`` it raises :class:`ImportTimeout` (the caller names the reference in a
:class:`~freshroll.errors.ConfigError`). The stuck thread is abandoned: a daemon, it never
holds the process at exit. Whatever the import raised is raised again, unchanged.

``timeout_s=None`` imports on the calling thread (no bound: for callers that are bounded
otherwise, e.g. a Ray reward actor whose start is bounded by the driver).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ImportTimeout(Exception):
    """The import did not finish within its bound."""


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def bounded(fn: Callable[[], T], what: str, timeout_s: float | None, heartbeat_s: float = 30.0,
            say: Callable[[str], None] = _stderr) -> T:
    """``fn()`` within ``timeout_s`` seconds (module docstring); ``what`` names it in the
    heartbeat lines and the timeout (``reward import path/to/file.py``)."""
    if timeout_s is None:
        return fn()
    box: list[T] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # raised again on the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=work, name="reward-import", daemon=True)
    t0 = time.monotonic()
    thread.start()
    while True:
        left = timeout_s - (time.monotonic() - t0)
        thread.join(max(0.0, min(heartbeat_s, left)))
        if not thread.is_alive():
            break
        waited = time.monotonic() - t0
        if waited >= timeout_s:
            raise ImportTimeout(f"{what} did not finish within {timeout_s:g} s "
                                "(limits.reward_import_timeout_s); its thread was abandoned")
        say(f"waiting {waited:.0f} s on {what}, limit {timeout_s:g} s" if waited >= 10 else
            f"waiting {waited:.1f} s on {what}, limit {timeout_s:g} s")
    if failed:
        raise failed[0]
    return box[0]


__all__ = ["ImportTimeout", "bounded"]

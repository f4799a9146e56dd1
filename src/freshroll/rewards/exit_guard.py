"""A reward may not end the process: ``os._exit`` inside a reward call is a reward failure.

Rewards run in the run's own process (a thread of the driver, or a Ray reward actor), so a
reward that calls ``os._exit(0)`` would end the whole run at once with exit status 0: no
``closed`` event, no summary, a status that says success. ``os._exit`` skips ``finally``
blocks and ``atexit`` handlers, so nothing can clean up after it; it can only be stopped
before it runs.

:func:`guarded` does that: while a reward function runs (on this thread, in this
process), ``os._exit(n)`` raises :class:`ProcessExitCalled` instead (a ``SystemExit``, so a
reward's own ``except Exception`` does not swallow it), and
:func:`freshroll.rewards.scoring.RewardSet.score` fails that call's samples
(``reward_error: <name> raised ProcessExitCalled: ...``), budgeted like any failure.
``sys.exit`` needs no guard: it raises ``SystemExit``, already a reward failure.

What it cannot stop (documented in docs/rewards.md): ``os._exit`` from a thread or process
the reward started itself (a forked child keeps the real ``os._exit``: the guard checks
the pid), ``os.abort``, a signal, or C code that calls ``exit``/``_exit``. Those end the
process as ``SIGKILL`` would: the ledger stays open (``freshroll verify`` says so) and
``freshroll run --resume RUN_DIR`` continues from the last durable state.

Outside a reward call ``os._exit`` is the real one (installing the guard changes nothing
else); the guard is installed once, at the first guarded call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

_real_exit: Callable[[int], NoReturn] = os._exit
_local = threading.local()
_install_lock = threading.Lock()
_owner_pid: int | None = None  # the process that installed the guard


class ProcessExitCalled(SystemExit):
    """A reward called ``os._exit``; raised in its place, inside the reward call."""


def _guarded_exit(status: int) -> NoReturn:
    if getattr(_local, "depth", 0) > 0 and os.getpid() == _owner_pid:
        raise ProcessExitCalled(f"called os._exit({status}); a reward may not end the "
                                "process (return a score, or raise)")
    _real_exit(status)


def install() -> None:
    """Put the guard in place of ``os._exit`` for this process (idempotent)."""
    global _owner_pid
    with _install_lock:
        _owner_pid = os.getpid()
        setattr(os, "_exit", _guarded_exit)  # noqa: B010 (a module attribute, on purpose)


@contextmanager
def guarded() -> Iterator[None]:
    """While inside, ``os._exit`` on this thread raises :class:`ProcessExitCalled`."""
    if os._exit is not _guarded_exit or os.getpid() != _owner_pid:
        install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


__all__ = ["ProcessExitCalled", "guarded", "install"]

"""Processes by pid, for files named after the process that owns them.

:func:`pid_alive` answers whether a pid names a live process on this machine. It errs on
the safe side for cleanup: a pid that exists but belongs to another user is alive, and a
pid the kernel reused for an unrelated process is alive too (its owner's files are kept,
never removed too early).
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True unless no process has ``pid`` (signal 0 probes without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


__all__ = ["pid_alive"]

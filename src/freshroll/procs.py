"""Processes by pid, for files named after the process that owns them; the CPUs this
process may use (:func:`available_cores`).

:func:`pid_alive` answers whether a pid names a live process on this machine. It errs on
the safe side for cleanup: a pid that exists but belongs to another user is alive, and a
pid the kernel reused for an unrelated process is alive too (its owner's files are kept,
never removed too early).
"""

from __future__ import annotations

import math
import os
from pathlib import Path


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


def available_cores() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


__all__ = ["available_cores", "pid_alive"]

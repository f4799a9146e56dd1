"""The weight segments' names in shared memory, and the sweep of those whose owner died.

A segment of :mod:`freshroll.placement.shm_weights` is a file ``freshroll-w-<run key>-<pid>-
<random>`` in ``/dev/shm`` (``/tmp`` where there is none): the run key is 12 hex digits of the
resolved run directory's path (:func:`run_key`), the pid its driver's. Every start and resume
of any run on the machine calls :func:`sweep_segments` (through
:func:`freshroll.runtime.leftovers.sweep_leftovers`), which removes the segments whose owner is
dead, never a live process's. Torch-free, so that a simulated run's start imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

from freshroll.procs import pid_alive

PREFIX = "freshroll-w-"


def shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")


def unlink_quietly(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def run_key(run_dir: Path | None) -> str:
    """12 hex digits of ``run_dir``'s resolved path (``run_dir`` None: no run, all zeros)."""
    if run_dir is None:
        return "0" * 12
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


def segment_name(run_dir: Path | None, pid: int, tag: str) -> str:
    """The segment file name of run ``run_dir`` owned by process ``pid``."""
    return f"{PREFIX}{run_key(run_dir)}-{pid}-{tag}"


def segment_owner(name: str) -> tuple[str, int] | None:
    """``(run key, owner pid)`` of a segment name; None for a name of another form."""
    parts = name.removeprefix(PREFIX).split("-") if name.startswith(PREFIX) else []
    if len(parts) != 3 or len(parts[0]) != 12 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


#: a dead owner's segment of another run directory is swept once it is this old (seconds
#: since its last write): a start on a shared machine leaves alone what a run killed a
#: moment ago, or a test, has just laid (its own directory's go at once)
GRACE_S = 60.0


def sweep_segments(run_dir: Path | None = None, *, grace_s: float = GRACE_S) -> list[Path]:
    """Remove the segments whose owner process is dead (a kill of the whole process group
    leaves them): ``run_dir``'s, or (None) every run's on the machine last written more
    than ``grace_s`` ago, so a run that is never resumed does not keep its segment until a
    reboot. Returns the removed paths. A segment of a live owner, of another run directory
    (given one), or of another name form is kept."""
    key = run_key(run_dir) if run_dir is not None else None
    removed, now = [], time.time()
    for path in sorted(shm_dir().glob(f"{PREFIX}{key or ''}*")):
        owner = segment_owner(path.name)
        if owner is None or key not in (None, owner[0]) or pid_alive(owner[1]):
            continue
        with contextlib.suppress(OSError):  # gone meanwhile: nothing to remove
            if key is None and now - path.stat().st_mtime < grace_s:
                continue
            unlink_quietly(path)
            removed.append(path)
    return removed


__all__ = ["GRACE_S", "PREFIX", "run_key", "segment_name", "segment_owner", "shm_dir",
           "sweep_segments", "unlink_quietly"]

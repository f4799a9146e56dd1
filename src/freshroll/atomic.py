"""Atomic directories: a reader sees no directory, the old one or the new one, never a mix.

:func:`replace_dir` lets ``fill`` write everything into ``<dir>.tmp`` beside the target (a
stale one, left by a kill, is removed first), fsyncs every file in it and the directory
itself, then renames it into place; an existing ``<dir>`` is first renamed to ``<dir>.old``
and deleted after the swap, and the parent directory is fsynced so the rename is durable.
A failure inside ``fill`` removes the temp directory and leaves the target untouched.
Every file in it gets the mode a file created now gets (``0666`` less the umask: ``0644``
under the usual ``022``), whatever its writer used: transformers 5 writes
``model.safetensors`` through a private temp file (``0600``), which left an exported model
readable by its owner alone. Used for checkpoints, the embedded model's directory and
exported models.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from freshroll import crashpoints


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(directory: Path, fill: Callable[[Path], None],
                crash_point: str | None = None) -> Path:
    """Write ``directory`` atomically with ``fill(tmp)``; returns ``directory``.
    ``crash_point``: the :mod:`freshroll.crashpoints` point reached once ``tmp`` is whole,
    before the rename."""
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        mode = _new_file_mode(tmp)
        for file in tmp.iterdir():
            if file.is_file() and not file.is_symlink():
                os.chmod(file, mode)
                fsync_path(file)
        fsync_path(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if crash_point is not None:
        crashpoints.reach(crash_point)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    fsync_path(directory.parent)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def _new_file_mode(directory: Path) -> int:
    """The mode a file created in ``directory`` now gets (``0666`` less the umask), read off
    a probe file: ``os.umask`` can only be read by setting it, which races other threads."""
    probe = directory / ".mode-probe"
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink()

"""The error boundary of the ``freshroll`` command: every failure is one line and a status.

What reaches the top of a command, and what the user sees (on stderr)::

    FreshrollError (the error tree)   error: <message>                         exit_status(exc)
                                      (2 in commands that only read a run directory)
    KeyboardInterrupt / Interrupted   interrupted: <message>; resume with:
                                      freshroll run --resume DIR                130
    ExceptionGroup                    its first meaningful leaf, as above (an operator's
                                      interrupt first, then an error of the tree, then any
                                      other; cancellations are never meaningful)
    OSError                           mapped by errno: disk full, I/O error -> StorageError
                                      (3); read-only, permission, not a directory, a file
                                      in the way -> RunDirError (2); names the file
    RetryableError escaping a run     RunFailed: the retries are spent (3)
    (before ``run`` loads anything)   --out naming a file, a read-only run directory:
                                      RunDirError (2), from :func:`check_run_dir`
    anything else (a bug)             error: internal error: <type>: <message> (a bug;
                                      traceback in <file>)                      exit 3

The traceback of a bug goes to ``RUN_DIR/error.log`` when the command has a run
directory that exists, otherwise to ``$TMPDIR/freshroll-error-<pid>.log``; with
``FRESHROLL_DEBUG=1`` it is also printed to stderr. Exit statuses:
:func:`freshroll.errors.exit_status`.

``SIGTERM`` is handled like ``SIGINT`` (:func:`sigterm_as_sigint`): it calls whichever
``SIGINT`` handler is in force (asyncio's graceful cancellation of the pipeline, or
Python's ``KeyboardInterrupt``), so both stop the run the same way — also when ``SIGINT``
is ignored, as in a background job.
"""

from __future__ import annotations

import errno
import os
import signal
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from freshroll.errors import (
    EXIT_CONFIG,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    FreshrollError,
    Interrupted,
    RetryableError,
    RunDirError,
    RunFailed,
    StorageError,
    exit_status,
)
from freshroll.ledger.store import LEDGER_FILE

DEBUG_ENV = "FRESHROLL_DEBUG"
ERROR_LOG = "error.log"

_STORAGE = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG}
_RUN_DIR = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST}


def leaf(exc: BaseException) -> BaseException:
    """The first meaningful leaf of an exception group (``exc`` itself if it is none)."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = list(_leaves(exc))
    for wanted in ((KeyboardInterrupt, Interrupted), FreshrollError, BaseException):
        for x in leaves:
            if isinstance(x, wanted) and not _is_cancel(x):
                return x
    return leaves[0] if leaves else exc


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def _is_cancel(exc: BaseException) -> bool:
    import asyncio
    import concurrent.futures

    return isinstance(exc, asyncio.CancelledError | concurrent.futures.CancelledError)


def storage_error(exc: OSError, what: str = "") -> FreshrollError:
    """An ``OSError`` as the typed error it means, naming the file (``what`` if it has none)."""
    name = exc.filename if exc.filename is not None else what
    where = f"{name}: " if name else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno in _RUN_DIR:
        return RunDirError(f"{where}{reason}")
    return StorageError(f"cannot write {where}{reason}")


def typed(exc: BaseException) -> BaseException:
    """``exc`` (or its group's leaf) as an error of the tree where it is a known kind."""
    exc = leaf(exc)
    if isinstance(exc, RetryableError):
        return RunFailed(f"gave up after retries: {exc}")
    if isinstance(exc, OSError) and (exc.errno in _STORAGE or exc.errno in _RUN_DIR):
        return storage_error(exc)
    return exc


@dataclass(frozen=True)
class Outcome:
    line: str  # what stderr gets: one line
    status: int  # the exit status
    traceback_file: Path | None = None


def outcome(exc: BaseException, *, run_dir: Path | None = None,
            resumable: bool = False, reads_only: bool = False) -> Outcome:
    """The one line and exit status for ``exc`` ending a command.

    ``run_dir``: the command's run directory, if any (for the resume hint and error.log);
    ``resumable``: the command is ``run``, so an interrupt says how to resume;
    ``reads_only``: the command only reads a run directory (verify, export, timing,
    report), so any error of the tree is a usage error (2): nothing was run or changed.
    """
    original, exc = exc, typed(exc)
    if isinstance(exc, KeyboardInterrupt | Interrupted):
        return Outcome(_interrupted_line(exc, run_dir, resumable), EXIT_INTERRUPTED)
    if isinstance(exc, FreshrollError):
        return Outcome(_one_line(f"error: {exc}"), EXIT_CONFIG if reads_only else exit_status(exc))
    log = write_traceback(original, run_dir)  # the whole group, every leaf's traceback
    return Outcome(
        _one_line(f"error: internal error: {type(exc).__name__}: {exc}")
        + f" (a bug; traceback in {log})", EXIT_RUN_FAILED, log,
    )


def _interrupted_line(exc: BaseException, run_dir: Path | None, resumable: bool) -> str:
    msg = str(exc) if isinstance(exc, Interrupted) and str(exc) else "stopped by the operator"
    if resumable and "--resume" not in msg:
        if run_dir is not None and (run_dir / LEDGER_FILE).is_file():
            msg += f"; resume with: freshroll run --resume {run_dir}"
        else:
            msg += "; the run had not started: nothing to resume"
    return _one_line(f"interrupted: {msg}")


def _one_line(text: str, limit: int = 2000) -> str:
    line = " | ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def write_traceback(exc: BaseException, run_dir: Path | None) -> Path:
    """Write ``exc``'s traceback to ``RUN_DIR/error.log`` (or a temp file); returns the path."""
    text = "".join(traceback.format_exception(exc))
    if os.environ.get(DEBUG_ENV):
        import sys

        sys.stderr.write(text)
    if run_dir is not None and run_dir.is_dir():
        try:
            (run_dir / ERROR_LOG).write_text(text)
            return run_dir / ERROR_LOG
        except OSError:
            pass
    fd, name = tempfile.mkstemp(prefix=f"freshroll-error-{os.getpid()}-", suffix=".log")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return Path(name)


def check_run_dir(path: Path, flag: str) -> None:
    """Refuse (:class:`RunDirError`) a run directory that is a file, or that is (or would be
    created in) a directory where no file can be created; ``flag`` names the option."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag} {path}: is a file, not a run directory")
    probe = path if path.exists() else next((a for a in path.parents if a.exists()), None)
    if probe is not None and probe.is_dir() and not writable(probe):
        raise RunDirError(f"{flag} {path}: {probe} is read-only (a run writes its ledger, "
                          "metrics and checkpoints there)")


def writable(directory: Path) -> bool:
    """A file can be created in ``directory`` (tried: ``os.access`` tells root yes where
    permissions forbid writing, and cannot tell a read-only mount from a full one)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


@contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """While inside, ``SIGTERM`` stops the process as ``SIGINT`` would (graceful).

    A blocked ``SIGTERM`` is unblocked while inside: a signal mask is inherited through
    ``fork`` and ``exec``, so a parent that spawned us from a thread blocking it (as
    ``multiprocessing``'s resource tracker does while it spawns) would otherwise leave a
    run that ``kill`` cannot stop. The mask is put back on leaving.
    """
    def on_term(signum: int, frame: FrameType | None) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):  # asyncio's graceful one in a run, else KeyboardInterrupt
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored (a background job): SIGTERM must still stop the run
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        if signal.SIGTERM in mask:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGTERM, previous)

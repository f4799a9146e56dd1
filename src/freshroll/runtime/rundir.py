"""The run directory: one process at a time, checks before any write, atomic files.

Guarantees:

* :func:`lock_run_dir` takes an exclusive ``flock`` on ``RUN_DIR/run.lock`` and writes the
  holder's pid into it. A second process fails at once with
  :class:`~freshroll.errors.RunDirError` naming that pid (:func:`live_message`: the run is
  live, do not resume it while it runs); :func:`check_out_dir` says the same before any
  check of a new run or a resume, rather than "already holds a run; use --resume", which
  pointed at a run that is running. The lock is held until
  :meth:`RunDirLock.release` or the end of the process, however it ends: the kernel drops
  the locks of a dead process, also after SIGKILL. The file itself stays (deleting a locked
  file would let a third process lock a new one beside the holder).
* :func:`check_out_dir` only reads (at most SQLite recovers a journal a kill left beside the
  ledger, which changes no committed content): ``freshroll run`` calls it (and checks the model with
  :func:`freshroll.engines.model_dir.check_model_dir`, loads prompts and rewards) before it
  writes anything, so a bad input leaves no half-made run directory behind.
* :func:`write_text_atomic` writes a file under a temporary name, fsyncs it and renames it
  into place: a reader sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO, Any

from freshroll.config import Config, load_config
from freshroll.errors import LedgerError, RunDirError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger, holds_events

LOCK_FILE = "run.lock"


#: the lock files this process holds (its own lock is not another process's live run)
_HELD: set[Path] = set()


class RunDirLock:
    """An exclusive lock on a run directory, held by this process (see module docstring)."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path, self._handle = path, handle
        _HELD.add(path.resolve())

    def release(self) -> None:
        if not self._handle.closed:
            _HELD.discard(self.path.resolve())
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_dir(run_dir: Path) -> RunDirLock:
    """Create ``run_dir`` if needed and lock it for this process, or raise RunDirError."""
    path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")  # never truncates: a holder's pid stays readable
    except OSError as exc:
        raise RunDirError(f"{run_dir}: cannot use it as a run directory: {exc.strerror}") from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RunDirError(live_message(run_dir, holder)) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return RunDirLock(path, handle)


def live_message(run_dir: Path, holder: str) -> str:
    """What a start or a resume on a run directory that a live process holds is told."""
    return (f"{run_dir}: a run is live in it (pid {holder} holds {LOCK_FILE}); do not resume "
            f"it while it runs: wait for it to end, or stop it (kill -INT {holder}) and then "
            f"freshroll run --resume {run_dir}; or start elsewhere with another --out")


def live_holder(run_dir: Path) -> str | None:
    """The pid another live process holds ``run_dir``'s lock with (``"unknown"`` if it wrote
    none yet), or None. Probed with a shared ``flock`` taken and dropped at once (it
    conflicts with a holder's exclusive one), which creates nothing; a start that tries the
    lock in that instant is told the directory is in use and may try again."""
    path = run_dir / LOCK_FILE
    if path.resolve() in _HELD:
        return None
    try:
        handle = path.open("r")
    except OSError:  # no lock file (a new directory) or unreadable: the lock itself decides
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def check_out_dir(run_dir: Path, *, resume: bool) -> None:
    """A run directory that can be used: a new one, or (``resume``) one that holds a run.

    A ledger with no event (a kill during its creation or before the run's first write)
    holds no run: a new run may start in it, and ``--resume`` starts the run from step 0
    with the directory's ``config.yaml``. So does ``--resume`` of a directory with a
    ``config.yaml`` and no ledger yet (a start killed after writing its config: the model
    save or the ledger's creation). But a missing or empty ledger beside files that only a
    run with a ledger writes (:func:`earlier_run`) is refused, naming them."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory (--out and --resume name a run directory)")
    holder = live_holder(run_dir)
    if holder is not None:
        raise RunDirError(live_message(run_dir, holder))
    ledger = run_dir / LEDGER_FILE
    held = holds_events(ledger)
    if not held and (found := earlier_run(run_dir)):
        state = "holds no event" if ledger.exists() else "is missing"
        raise RunDirError(
            f"{run_dir}: holds files of an earlier run ({', '.join(found)}) but its "
            f"{LEDGER_FILE} {state}: the run's record is gone, and a run started here would "
            f"rewrite them; restore {LEDGER_FILE} from a copy, or use another --out")
    if resume and not ledger.is_file() and not (run_dir / "config.yaml").is_file():
        raise RunDirError(f"{run_dir}: nothing to resume (no {LEDGER_FILE}); start the run "
                          f"with --out {run_dir}")
    if not resume and held:
        raise RunDirError(
            f"{run_dir}: already holds a run; use --resume {run_dir} or another --out"
        )


#: files a run writes only once its ledger holds events (a start killed before that leaves
#: at most config.yaml, model/, run.lock and a ledger being built)
_RUN_FILES = ("metrics.jsonl", "summary.json", "counts.json", "eval.jsonl", "report.html")


def earlier_run(run_dir: Path) -> list[str]:
    """What in ``run_dir`` only a run with a ledger writes: its checkpoints and end files.
    Beside a missing or empty ledger they mean the run's record was lost (deleted,
    truncated, not copied), not that no run was made: such a directory is refused rather
    than started over (its checkpoints would be rewritten as a new run's)."""
    found = []
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir())
    if steps:
        found.append(f"checkpoints/{steps[-1]}" + (f" and {len(steps) - 1} more"
                                                   if len(steps) > 1 else ""))
    for name in _RUN_FILES:
        path = run_dir / name
        if path.is_file() and path.stat().st_size > 0:
            found.append(name)
    return found


def finished_run(run_dir: Path, cfg: Config, allow_change: tuple[str, ...] = ()
                 ) -> dict[str, Any] | None:
    """``summary.json`` of a run that a plain resume under ``cfg`` has nothing left to do
    for: its ledger closed ``done`` after committing step ``cfg.run.steps``, ``cfg`` the
    config it recorded last (no key changed, no ``allow_change``), its end files written
    (``summary.json`` and ``report.html``).
    None otherwise: a run to continue, a change for the resume rules to judge, or end
    files for a resume to rewrite.

    A resume of such a run would start the placement, admit groups and append events only
    to drain them again; it is answered from the directory instead, before anything is
    locked or written."""
    from freshroll.runtime.resume import diff, flatten, with_recorded_defaults

    ledger = run_dir / LEDGER_FILE
    if allow_change or not holds_events(ledger):
        return None
    try:
        with Ledger(ledger, readonly=True) as read:
            last = next(read.events(after=read.last_seq - 1), (0, None))[1]
            commit, config = read.last_of("committed"), read.last_of("run_config")
    except LedgerError:
        return None  # the resume itself reports a damaged ledger
    if not (isinstance(last, ev.Closed) and last.reason == "done"
            and isinstance(commit, ev.Committed) and isinstance(config, ev.RunConfig)):
        return None
    if policy_step(commit.version) != cfg.run.steps:  # fewer: to train; more: refused later
        return None
    defaults = flatten(Config().model_dump(mode="json"))
    recorded = with_recorded_defaults(json.loads(config.config))
    if diff(flatten(recorded), flatten(cfg.model_dump(mode="json")), defaults):
        return None
    if not (run_dir / "report.html").is_file():  # a kill after summary.json: the resume
        return None                               # writes the report
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and "steps" in summary else None


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename, fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_config(
    run_dir: Path, config: Path | None = None, overrides: tuple[str, ...] | list[str] = ()
) -> Config:
    """The config in force for ``--resume``: the run's saved ``config.yaml`` (or ``config``,
    when given), with ``overrides`` applied on top, validated (unknown keys rejected).

    Paths resolve as a fresh run's do (:func:`~freshroll.config.load_config`): a file's
    relative paths from its folder, the overrides' from the current directory, so the run's
    own config file resumes it unchanged from any directory (the saved one holds them
    absolute already)."""
    check_out_dir(run_dir, resume=True)
    return load_config(config if config is not None else run_dir / "config.yaml", overrides)


__all__ = [
    "LOCK_FILE", "RunDirLock", "check_out_dir", "earlier_run", "finished_run", "live_holder",
    "live_message", "lock_run_dir",
    "resume_config",
    "write_text_atomic",
]

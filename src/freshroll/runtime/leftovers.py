"""What a run removes when it starts: what killed runs left on the machine, and what its
own start left when a config error stopped it before it ran.

* :func:`sweep_leftovers` (every ``run`` and ``--resume``, before anything else): the
  shared-memory weight segments and the Ray instances and ``ray.json`` credentials of dead
  drivers, this run directory's at once, other runs' once a minute old
  (:func:`~freshroll.placement.shm_segments.sweep_segments`,
  :func:`~freshroll.placement.ray_reaper.sweep_dead_drivers`). A run killed with its process
  group and never resumed leaves nothing behind past the next start on the machine.
* :func:`undo_start`: a new run's ledger, removed when a config error is found after it was
  opened (the model, the learner, the engines), so the fixed command runs in the same
  ``--out`` instead of finding "already holds a run".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TextIO

from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.placement.ray_reaper import sweep_dead_drivers
from freshroll.placement.shm_segments import sweep_segments
from freshroll.procs import pid_alive

#: a trainer group's rendezvous directory, in the temp dir: ``<prefix><driver pid>-<random>``
RANKS_PREFIX = "freshroll-ranks-"


def sweep_leftovers(out: Path, stream: TextIO) -> None:
    """Remove what killed runs on this machine left behind, and say so: the weight segments
    in shared memory of dead drivers (:func:`~freshroll.placement.shm_segments.sweep_segments`:
    a killed process group's, this run's at once, any other's once a minute old) and the Ray
    instances and ``ray.json`` credentials of dead drivers
    (:func:`~freshroll.placement.ray_reaper.sweep_dead_drivers`, on the same terms) and the
    trainer-rank rendezvous directories of dead drivers (:func:`sweep_rank_stores`)."""
    removed = sweep_segments(out) + sweep_segments()  # its own at once, others' once stale
    if removed:
        stream.write(f"freshroll: {out}: removed {len(removed)} shared-memory weight "
                     f"segment(s) killed runs left: {', '.join(p.name for p in removed)}\n")
    for run_dir in sweep_dead_drivers(out):
        stream.write(f"freshroll: removed {run_dir}/ray.json (a Ray token) and the Ray "
                     "processes its killed driver left\n")
    stores = sweep_rank_stores()
    if stores:
        stream.write(f"freshroll: removed {len(stores)} trainer-rank store(s) killed runs "
                     f"left: {', '.join(str(p) for p in stores)}\n")


def rank_store_dir() -> Path:
    """A new trainer group's rendezvous directory, named after this driver's pid, so that a
    driver killed before it removed the directory leaves it to the next start's sweep."""
    return Path(tempfile.mkdtemp(prefix=f"{RANKS_PREFIX}{os.getpid()}-"))


def sweep_rank_stores(root: Path | None = None) -> list[Path]:
    """Remove the rendezvous directories (:func:`rank_store_dir`) of drivers no longer
    alive, in ``root`` (default: the temp dir); a live or unknown pid's are kept."""
    removed = []
    for path in sorted(Path(root or tempfile.gettempdir()).glob(f"{RANKS_PREFIX}*-*")):
        pid = path.name[len(RANKS_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)) or not path.is_dir():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def undo_start(ledger: Ledger, out: Path) -> None:
    """A new run's ledger removed after a config error found while its parts were built
    (the model, the learner, the engines: after the ledger was opened), so that the fixed
    command runs in the same directory instead of finding "already holds a run". Only a
    ledger that admitted nothing is removed: it records no sample, no step, nothing to
    resume; ``config.yaml`` and ``model/`` stay (the next start rewrites them)."""
    with contextlib.suppress(Exception):  # closed already where the run released it
        ledger.close()
    try:
        with Ledger(out / LEDGER_FILE, readonly=True) as read:
            if read.last_of("requested") is not None:
                return
    except Exception:  # unreadable: kept as it is, for the resume to report
        return
    for suffix in ("", "-wal", "-shm", "-journal", ".reserve"):
        (out / f"{LEDGER_FILE}{suffix}").unlink(missing_ok=True)


__all__ = ["RANKS_PREFIX", "rank_store_dir", "sweep_leftovers", "sweep_rank_stores", "undo_start"]

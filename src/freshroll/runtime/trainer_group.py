"""The trainer group of ``trainer.parallel: ddp``: ranks 1..W-1 as processes of this machine.

Rank 0 is the run's learner, in the run's process, trained where it always is (the
trainer thread, or a replay); :func:`start_group` starts the other ``W - 1`` ranks with
``torch.multiprocessing`` (spawn: a fresh interpreter, no forked threads), each building a
learner on the run's initial model with one intra-op thread, and meets them on a gloo
process group (a file store in a fresh temporary directory: two groups never meet). Rank 0
then sends its full state (:meth:`~freshroll.trainer.ranks.Gloo.sync`), and from then on
every step it trains is trained by the whole group (:mod:`freshroll.trainer.ranks`: the
split rule, the all-reduce, what is exchanged).

Every collective waits ``limits.train_timeout_s`` at most. A rank that dies before the group
forms fails the start with its exit code; one that dies later fails rank 0's next collective
(the trainer's step fails, the run stops resumable: ``--resume`` replays the committed steps
with a new group). :meth:`TrainerGroup.close` stops the ranks (a last message, then a join
bounded in time, then terminate) and removes the store.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from freshroll.config import Config
from freshroll.errors import ConfigError
from freshroll.trainer.grpo import GRPOLearner
from freshroll.trainer.ranks import SOLO, Gloo, connect, follow

#: seconds a stopped rank has to exit before it is terminated
_JOIN_S = 10.0


#: ``(cfg, initial model dir) -> (learner, tokenizer)``: runtime.learner.new_learner
NewLearner = Callable[[Config, Path], tuple[GRPOLearner, Any]]


def _rank_main(make: NewLearner, cfg: Config, path: str, store: str, rank: int, world: int,
               timeout_s: float) -> None:
    """A rank process: its learner on the initial model, then rank 0's orders until stop."""
    torch.set_num_threads(1)
    learner, _ = make(cfg, Path(path))
    ranks = Gloo(connect(Path(store), rank, world, timeout_s), rank, world)
    learner.ranks = ranks
    follow(learner, ranks)


class TrainerGroup:
    """Ranks 1..W-1 of a learner's group, and their store (module docstring)."""

    def __init__(self, learner: GRPOLearner, ranks: Gloo, procs: list[Any], store: Path) -> None:
        self.learner, self.ranks, self.procs, self.store = learner, ranks, procs, store
        self._closed = False

    def close(self) -> None:
        """Stop the ranks: a stop message (unless a step is still running on rank 0: then
        they are terminated), a bounded join, terminate; the learner trains alone again."""
        if self._closed:
            return
        self._closed = True
        if self.learner.ranks is self.ranks:
            self.learner.ranks = SOLO
            # on a thread: a step abandoned mid-collective would hold the stop back
            threading.Thread(target=self._stop, name="freshroll-rank-0-stop", daemon=True).start()
        deadline = time.monotonic() + _JOIN_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)
        shutil.rmtree(self.store.parent, ignore_errors=True)

    def _stop(self) -> None:
        with contextlib.suppress(Exception):  # a rank already gone: terminated by close()
            self.ranks.stop()


def start_group(cfg: Config, path: Path, learner: GRPOLearner,
                make: NewLearner) -> TrainerGroup | None:
    """The group of ``learner`` (rank 0) under ``cfg.trainer``, its other ranks' learners
    built by ``make`` (a module-level function: it is pickled by name), or None when it
    trains alone (``world_size`` 1: the learner is left exactly as it was)."""
    world = cfg.trainer.world_size
    if cfg.trainer.parallel == "none" or world == 1:
        return None
    store = Path(tempfile.mkdtemp(prefix="freshroll-ranks-")) / "store"
    timeout_s = cfg.limits.train_timeout_s
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, name=f"freshroll-rank-{r}", daemon=True,
                         args=(make, cfg, str(path), str(store), r, world, timeout_s))
             for r in range(1, world)]
    for p in procs:
        p.start()
    try:
        pg = _meet(store, world, timeout_s, procs)
    except BaseException:
        for p in procs:
            p.terminate()
        shutil.rmtree(store.parent, ignore_errors=True)
        raise
    ranks = Gloo(pg, 0, world)
    learner.ranks = ranks
    group = TrainerGroup(learner, ranks, procs, store)
    ranks.closer = group.close
    ranks.sync(learner)
    return group


def _meet(store: Path, world: int, timeout_s: float, procs: list[Any]) -> Any:
    """Rank 0's process group, formed once every rank has joined; a rank that exits first
    fails it at once with its exit code (rather than at the timeout)."""
    got: list[Any] = []
    err: list[BaseException] = []

    def join() -> None:
        try:
            got.append(connect(store, 0, world, timeout_s))
        except BaseException as exc:  # handed to the caller below
            err.append(exc)

    t = threading.Thread(target=join, name="freshroll-rank-0-meet", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
        dead = [p for p in procs if p.exitcode is not None]
        if dead and t.is_alive():
            raise ConfigError(f"trainer.world_size: rank {procs.index(dead[0]) + 1} exited "
                              f"with code {dead[0].exitcode} before the group formed")
    if err:
        raise err[0]
    return got[0]


__all__ = ["TrainerGroup", "start_group"]

"""The trainer group of ``trainer.parallel: ddp | fsdp``: ranks 1..W-1 as processes of this machine.

Rank 0 is the run's learner, in the run's process, trained where it always is (the
trainer thread, or a replay); :func:`start_group` starts the other ``W - 1`` ranks as forks
of the worker children's forkserver (:func:`freshroll.placement.process_engine.start_child`:
a server that imported torch and transformers and did no work, so no forked threads or
driver state, and no interpreter importing torch afresh for each group that a run, a resume,
a replay or a restart starts), each building a learner on the run's initial model with one
intra-op thread, and meets them on a gloo process group (a file store in a fresh temporary
directory: two groups never meet). Rank 0 then sends its full state
(:meth:`~freshroll.trainer.ranks.Gloo.sync`), and from then on every step it trains is
trained by the whole group (:mod:`freshroll.trainer.ranks`: the split rule, the all-reduce,
what is exchanged; under ``fsdp`` :mod:`freshroll.trainer.fsdp`: the group is each process's
default one, each rank trains its shard, and rank 0's model is the full state gathered after
each step).

Every collective waits ``limits.train_timeout_s`` at most. A rank that dies before the group
forms fails the start with its exit code; one that dies later fails rank 0's next collective
(the trainer's step fails, the run stops resumable: ``--resume`` replays the committed steps
with a new group). :meth:`TrainerGroup.close` stops the ranks (a last message, then a join
bounded in time, then terminate) and removes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import torch

from freshroll.config import Config
from freshroll.errors import ConfigError, RunFailed
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.placement.process_engine import start_child
from freshroll.runtime.leftovers import rank_store_dir
from freshroll.trainer.fsdp import Sharded, connect_default
from freshroll.trainer.grpo import GRPOLearner
from freshroll.trainer.ranks import SOLO, Gloo, RankLost, connect, follow
from freshroll.trainer.replay import weights_digest

#: seconds a stopped rank has to exit before it is terminated
_JOIN_S = 10.0


#: ``(cfg, initial model dir) -> (learner, tokenizer)``: runtime.learner.new_learner
NewLearner = Callable[[Config, Path], tuple[GRPOLearner, Any]]


def _rank_main(make: NewLearner, cfg: Config, path: str, store: str, rank: int, world: int,
               timeout_s: float) -> None:
    """A rank process: its learner on the initial model, then rank 0's orders until stop."""
    torch.set_num_threads(1)
    learner, _ = make(cfg, Path(path))
    ranks = _group(cfg.trainer.parallel, Path(store), rank, world, timeout_s)
    learner.ranks = ranks
    try:
        follow(learner, ranks)
    finally:
        ranks.end()


def _group(parallel: str, store: Path, rank: int, world: int, timeout_s: float) -> Gloo:
    """Rank ``rank``'s ranks object: a gloo group of its own (ddp), or this process's default
    group with the model sharded (fsdp)."""
    if parallel == "fsdp":
        return Sharded(connect_default(store, rank, world, timeout_s), rank, world)
    return Gloo(connect(store, rank, world, timeout_s), rank, world)


class TrainerGroup:
    """Ranks 1..W-1 of a learner's group, and their store (module docstring)."""

    def __init__(self, cfg: Config, path: Path, learner: GRPOLearner, make: NewLearner) -> None:
        self.cfg, self.path, self.learner, self.make = cfg, path, learner, make
        self.world, self.store = cfg.trainer.world_size, Path()
        self.procs: list[Any] = []
        self.ranks: Gloo | None = None
        self.restarts = 0

    def start(self) -> None:
        """Spawn ranks 1..W-1, meet them, and send them rank 0's full state."""
        self.store = rank_store_dir() / "store"  # swept by the next start if we are killed
        timeout_s = self.cfg.limits.train_timeout_s
        self.procs = [start_child(_rank_main, f"freshroll-rank-{r}",
                                  (self.make, self.cfg, str(self.path), str(self.store), r,
                                   self.world, timeout_s))
                      for r in range(1, self.world)]
        try:
            self.ranks = _meet(self.cfg.trainer.parallel, self.store, self.world, timeout_s,
                               self.procs)
        except BaseException:
            self._end_procs(0.0)
            raise
        self.ranks.owner = self
        self.learner.ranks = self.ranks
        self.ranks.sync(self.learner)

    def restart(self) -> None:
        """A new group from rank 0's state (after :class:`~freshroll.trainer.ranks.RankLost`:
        the failed step applied nothing): the old ranks terminated, new ones started."""
        self.learner.ranks = SOLO
        self._end_procs(0.0)
        if self.ranks is not None:
            self.ranks.end()
        self.restarts += 1
        self.start()

    def close(self) -> None:
        """Stop the ranks: a stop message (on a thread: a step abandoned mid-collective
        would hold it back), a bounded join, terminate; the learner trains alone again."""
        if self.ranks is None:
            return
        ranks, self.ranks = self.ranks, None
        if self.learner.ranks is ranks:
            self.learner.ranks = SOLO
            threading.Thread(target=_stop, args=(ranks,), name="freshroll-rank-0-stop",
                             daemon=True).start()
        self._end_procs(_JOIN_S)
        ranks.end()

    def _end_procs(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)
        shutil.rmtree(self.store.parent, ignore_errors=True)


def _stop(ranks: Gloo) -> None:
    with contextlib.suppress(Exception):  # a rank already gone: terminated by close()
        ranks.stop()


def start_group(cfg: Config, path: Path, learner: GRPOLearner,
                make: NewLearner) -> TrainerGroup | None:
    """The group of ``learner`` (rank 0) under ``cfg.trainer``, its other ranks' learners
    built by ``make`` (a module-level function: it is pickled by name), or None when it
    trains alone (``world_size`` 1: the learner is left exactly as it was)."""
    if cfg.trainer.parallel == "none" or cfg.trainer.world_size == 1:
        return None
    group = TrainerGroup(cfg, path, learner, make)
    group.start()
    return group


T = TypeVar("T")

#: restarts of a trainer group in one incarnation of a run before the run fails
MAX_RESTARTS = 2


class RestartingTrainer:
    """The run's trainer (the :class:`~freshroll.ports.seams.AsyncTrainer` of a learner with
    a group), whose group is restarted when a step loses a rank: at most
    :data:`MAX_RESTARTS` times, one line each on ``stream`` and one ``trainer_restarted``
    event in the ledger (reason ``lost``), the step of the still-open lease trained again
    by the new group. Nothing is committed twice: the failed step committed nothing, and
    applied nothing (every collective of a step comes before the optimizer's), which the
    restart checks: rank 0's weights digest must be the last commit's, else the run stops
    (``--resume`` rebuilds the learner from the ledger). Everything else is ``inner``'s."""

    def __init__(self, inner: Any, group: TrainerGroup, buf: SampleBuffer,
                 stream: TextIO | None = None) -> None:
        self.inner, self.group, self.buf = inner, group, buf
        self.stream = stream if stream is not None else sys.stderr
        self.settings_digest = inner.settings_digest

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        while True:
            try:
                result: tuple[dict[str, float], str] = await self.inner.step(lease)
                return result
            except RankLost as exc:
                version = self.buf.version
                assert version is not None
                t0 = time.perf_counter()
                await asyncio.to_thread(self._restart, lease, version, exc)
                self.buf.record(ev.TrainerRestarted(
                    ts=self.buf.clock.now(), lease=lease.id, version=str(version),
                    restart=self.group.restarts, reason="lost",
                    rebuild_s=time.perf_counter() - t0, detail=str(exc)[:500]))

    def _restart(self, lease: Lease, version: PolicyVersion, exc: RankLost) -> None:
        k = self.group.restarts + 1
        if k > MAX_RESTARTS:
            raise RunFailed(f"{exc}; the group was restarted {MAX_RESTARTS} times already: "
                            "--resume continues from the last commit") from exc
        held = weights_digest(self.group.learner.model)
        if version.weights_digest is not None and held != version.weights_digest:
            raise RunFailed(f"{exc}; rank 0 no longer holds the weights of {version} (an "
                            "earlier update of the step was applied): --resume rebuilds them "
                            "from the ledger") from exc
        self.stream.write(f"warning: {exc}; restarting the trainer's ranks from rank 0 at the "
                          f"last commit (step {version.step}) and retrying lease {lease.id} "
                          f"(restart {k} of at most {MAX_RESTARTS})\n")
        self.stream.flush()
        self.group.restart()


def restarting(trainer: T, learner: GRPOLearner, buf: SampleBuffer) -> T | RestartingTrainer:
    """``trainer`` with its group restarted on a lost rank (:class:`RestartingTrainer`)
    when ``learner`` has a group; else ``trainer`` itself."""
    owner = getattr(learner.ranks, "owner", None)
    return RestartingTrainer(trainer, owner, buf) if isinstance(owner, TrainerGroup) else trainer


def _meet(parallel: str, store: Path, world: int, timeout_s: float, procs: list[Any]) -> Gloo:
    """Rank 0's ranks object, formed once every rank has joined; a rank that exits first
    fails it at once with its exit code (rather than at the timeout)."""
    got: list[Any] = []
    err: list[BaseException] = []

    def join() -> None:
        try:
            got.append(_group(parallel, store, 0, world, timeout_s))
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
    ranks: Gloo = got[0]
    return ranks


__all__ = ["MAX_RESTARTS", "RestartingTrainer", "TrainerGroup", "restarting", "start_group"]

"""The ranks of a trainer step: which rows each rank trains, and what they exchange.

A :class:`~freshroll.trainer.grpo.GRPOLearner` trains through its ``ranks``: :data:`SOLO`
(one process: the step is exactly what it was before ranks existed) or a :class:`Gloo`
group of ``W`` ranks on ``torch.distributed`` (gloo on CPU; trainer.parallel: ddp).

The split rule (:data:`RANK_SPLIT`, ``contiguous``), for a batch of ``B`` rows and
``trainer.grad_accum`` = ``k``::

    shard_r     = micro_slices(B, W)[r]                 (consecutive rows, sizes differ by <= 1)
    micro-batch = micro_slices(|shard_r|, k) inside shard_r

Every rank gets the whole batch (broadcast by rank 0 with the step), computes the whole
batch's advantages and token totals, and runs only its shard's micro-batches, each loss
scaled by ``w_j`` of :mod:`freshroll.trainer.accum` against the whole batch. The gradients
are then summed across ranks (one all-reduce of one flat buffer, as DDP's buckets do), so
every rank holds ``sum_r sum_j w_j grad L_j``: the whole batch's gradient, as one process with
``W x k`` micro-batches computes it, up to float summation order. Every rank then clips the
same gradient and takes the same AdamW step: the weights stay identical on every rank, and
rank 0's are the committed ones (their digest computed there, once per version).

The step's metrics are the whole batch's: each rank's micro-batch metrics, losses, entropy
shares and a non-finite loss (its message) are gathered to every rank in rank order and
combined as one process combines its micro-batches (:func:`~freshroll.trainer.accum.
combine_metrics`). A non-finite loss on any rank makes every rank raise
:class:`~freshroll.errors.NonFiniteStep` before any gradient is applied.

Rank 0 leads: :meth:`Gloo.begin` broadcasts each step (its rows, number and the settings in
force) and :meth:`Gloo.sync` the full state after a checkpoint is loaded; ranks 1.. run
:func:`follow`, which obeys those messages until :meth:`Gloo.stop`. Every exchange is a
collective of the group with the group's timeout; nothing else passes between ranks.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist

from freshroll.errors import NonFiniteStep, WorkerLost
from freshroll.trainer.accum import micro_slices

if TYPE_CHECKING:
    from freshroll.trainer.grpo import GRPOLearner, TrainSample
    from freshroll.trainer.losses import LossConfig

class RankLost(WorkerLost):
    """A collective of the trainer's group failed: a rank died (or its connection did). The
    step it was part of applied nothing (every collective of a step comes before the
    optimizer's), so rank 0 still holds the last step's weights."""


@contextlib.contextmanager
def _collective(world: int, what: str) -> Iterator[None]:
    """A gloo failure inside as :class:`RankLost`, in one line."""
    try:
        yield
    except RuntimeError as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise RankLost(f"the trainer group of {world} ranks lost a rank ({what}: {first})") from exc


#: the rule that splits a step's batch across ranks (module docstring)
RANK_SPLIT: Final = "contiguous"

#: a rank's micro-batch results: each micro-batch's (metrics, tokens), loss, the entropy's
#: share of the whole batch's, and a non-finite loss's message
Parts = tuple[list[tuple[dict[str, float], float]], list[torch.Tensor], float, str | None]


def ranks_record(parallel: str, world: int) -> dict[str, object] | None:
    """What summary.json's ``host.trainer_ranks`` records of a run's trainer group (None for
    one process): the mode, the world size, the backend and the split rule."""
    if parallel == "none" or world == 1:
        return None
    return {"parallel": parallel, "world_size": world, "backend": "gloo", "split": RANK_SPLIT}


def rank_slices(n: int, k: int, world: int, rank: int) -> list[slice]:
    """Rank ``rank``'s micro-batches of a batch of ``n`` rows, as slices of the whole batch
    (module docstring); none when the batch has fewer rows than ranks and this rank is past
    them."""
    shard = micro_slices(n, world)[rank] if rank < min(n, world) else slice(0, 0)
    size = shard.stop - shard.start
    if size == 0:
        return []
    return [slice(shard.start + s.start, shard.start + s.stop) for s in micro_slices(size, k)]


class Solo:
    """One process: the micro-batches of :func:`~freshroll.trainer.accum.micro_slices`, no
    exchange (the learner's behaviour before ranks existed, unchanged)."""

    world, rank = 1, 0
    #: every rank must run every micro-batch's forward and backward (trainer/fsdp.py)
    lockstep = False

    def slices(self, n: int, k: int) -> list[slice]:
        return micro_slices(n, k)

    def begin(self, learner: GRPOLearner, samples: Sequence[TrainSample], number: int) -> None:
        """Before a step: nothing to tell anyone."""

    def gather(self, parts: Parts) -> Parts:
        return parts

    def reduce_grads(self, model: torch.nn.Module) -> None:
        """The gradients are this process's."""

    def net(self, learner: GRPOLearner) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The module a step runs and the optimizer that updates it: the learner's own."""
        return learner.model, learner.optimizer

    def filler(self, learner: GRPOLearner, samples: Sequence[TrainSample], adv: torch.Tensor,
               loss_cfg: LossConfig) -> None:
        """A filler micro-batch: never here (every slice of :meth:`slices` has rows)."""
        raise AssertionError("one process has no filler micro-batches")

    def finished(self, learner: GRPOLearner) -> float:
        """After a step: nothing to gather (the learner's model is the full state)."""
        return 0.0

    def close(self) -> None:
        """Nothing to stop."""


#: the learner's ranks when it trains alone
SOLO: Final = Solo()


@dataclass(frozen=True)
class StepOrder:
    """Rank 0's step, as every rank trains it: the rows, the step number and the settings in
    force (a resume's replay puts each step's recorded settings in force on rank 0)."""

    samples: list[TrainSample]
    number: int
    settings: dict[str, Any]


@dataclass(frozen=True)
class LoadOrder:
    """Rank 0's full state (after a checkpoint is loaded, or when the group starts)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    steps: int
    ref: dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class SaveOrder:
    """Every rank writes its shard of a sharded checkpoint into ``path`` (trainer/fsdp.py)."""

    path: str


@dataclass(frozen=True)
class StopOrder:
    """The group ends: ranks 1.. return from :func:`follow`."""


def connect(store: Path, rank: int, world: int, timeout_s: float) -> Any:
    """Rank ``rank``'s gloo process group, met through the file ``store`` (a fresh path per
    group, so groups of parallel tests never meet); a collective waits ``timeout_s`` at most.
    Its own group, not torch's default one: a run's process may hold several in turn."""
    timeout = datetime.timedelta(seconds=timeout_s)
    file_store = dist.FileStore(str(store), world)  # type: ignore[attr-defined]  # torch's stubs omit it
    return dist.ProcessGroupGloo(file_store, rank, world, timeout)


class Gloo:
    """Rank ``rank`` of a group of ``world`` ranks on a gloo process group (module docstring)."""

    #: every rank must run every micro-batch's forward and backward (trainer/fsdp.py)
    lockstep = False

    def __init__(self, pg: Any, rank: int, world: int) -> None:
        #: the gloo process group (``Any``: torch's stubs omit its collectives)
        self.pg, self.rank, self.world = pg, rank, world
        #: rank 0's: what started the group's processes and stops them (its ``close()``;
        #: runtime.trainer_group.TrainerGroup)
        self.owner: Any = None

    def close(self) -> None:
        """Stop the group (rank 0): its owner's ``close()``."""
        if self.owner is not None:
            self.owner.close()

    def net(self, learner: GRPOLearner) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The module a step runs and the optimizer that updates it: the learner's own (every
        rank holds the whole model)."""
        return learner.model, learner.optimizer

    def loaded(self, learner: GRPOLearner) -> None:
        """After a full state is loaded on every rank: nothing more (trainer/fsdp.py shards it)."""

    def filler(self, learner: GRPOLearner, samples: Sequence[TrainSample], adv: torch.Tensor,
               loss_cfg: LossConfig) -> None:
        """A filler micro-batch: none under ddp (a rank past a short batch's rows runs no
        micro-batch); trainer/fsdp.py's ranks run them."""
        raise AssertionError("ddp's ranks have no filler micro-batches")

    def finished(self, learner: GRPOLearner) -> float:
        """After a step: nothing to gather (rank 0's model is the full state)."""
        return 0.0

    def end(self) -> None:
        """After the group stopped: nothing to release (trainer/fsdp.py: its default group)."""

    def write_shards(self, learner: GRPOLearner, path: Path) -> dict[str, Any]:
        """A sharded checkpoint: none under ddp (rank 0's whole state is the checkpoint)."""
        raise AssertionError("ddp's ranks write no shards")

    def slices(self, n: int, k: int) -> list[slice]:
        return rank_slices(n, k, self.world, self.rank)

    def begin(self, learner: GRPOLearner, samples: Sequence[TrainSample], number: int) -> None:
        """Rank 0 tells the others the step (ranks 1.. got it already in :func:`follow`)."""
        if self.rank == 0:
            self.broadcast(StepOrder(list(samples), number, settings_of(learner)))

    def gather(self, parts: Parts) -> Parts:
        """Every rank's micro-batch results, combined in rank order (module docstring)."""
        metrics: list[tuple[dict[str, float], float]] = []
        losses: list[torch.Tensor] = []
        entropy, bad = 0.0, None
        for m, lo, e, b in self.all_objects(parts):
            metrics += m
            losses += lo
            entropy += e
            bad = bad or b
        return metrics, losses, entropy, bad

    def reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum every trainable parameter's gradient across ranks in one all-reduce; a
        parameter no rank has a gradient for keeps none (as in one process)."""
        params = [p for p in model.parameters() if p.requires_grad]
        flat = [p.grad.flatten() if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
                for p in params]
        has = torch.tensor([p.grad is not None for p in params], dtype=flat[0].dtype)
        buf = torch.cat([*flat, has])
        with _collective(self.world, "the gradients' all-reduce"):
            self.pg.allreduce([buf]).wait()
        at = 0
        for i, p in enumerate(params):
            n = p.numel()
            if bool(buf[buf.numel() - len(params) + i] > 0):
                p.grad = buf[at:at + n].view_as(p).clone()
            at += n

    def sync(self, learner: GRPOLearner) -> None:
        """Rank 0's model, optimizer, step count and KL reference on every rank."""
        ref = None if learner.ref is None else learner.ref.state_dict()
        self.broadcast(LoadOrder(learner.model_state(), learner.optimizer_state(),
                                 learner.steps, ref))

    def stop(self) -> None:
        self.broadcast(StopOrder())

    def broadcast(self, obj: object) -> object:
        """``obj`` pickled from rank 0 to every rank (the others pass None and get it)."""
        data = pickle.dumps(obj) if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.long)
        with _collective(self.world, f"a broadcast of {type(obj).__name__}"):
            self.pg.broadcast(size, 0).wait()
            buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.rank == 0
                   else torch.empty(int(size), dtype=torch.uint8))
            self.pg.broadcast(buf, 0).wait()
        return obj if self.rank == 0 else pickle.loads(buf.numpy().tobytes())

    def all_objects(self, obj: object) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.world)]
        with _collective(self.world, "the metrics' all-gather"):
            self.pg.allgather([sizes], [torch.tensor([data.numel()])]).wait()
            top = max(int(s) for s in sizes)
            padded = torch.zeros(top, dtype=torch.uint8)
            padded[:data.numel()] = data
            outs = [torch.zeros(top, dtype=torch.uint8) for _ in range(self.world)]
            self.pg.allgather([outs], [padded]).wait()
        return [pickle.loads(o[:int(n)].numpy().tobytes())
                for o, n in zip(outs, sizes, strict=True)]


def settings_of(learner: GRPOLearner) -> dict[str, Any]:
    """What rank 0 has in force that a step reads: its trainer settings, loss settings,
    temperature, total steps and the optimizer's weight decay."""
    return {"cfg": learner.cfg, "loss_cfg": learner.loss_cfg, "temperature": learner.temperature,
            "total_steps": learner.total_steps, "settings_digest": learner.settings_digest,
            "weight_decay": [g["weight_decay"] for g in learner.optimizer.param_groups]}


def _apply(learner: GRPOLearner, order: LoadOrder | StepOrder) -> None:
    if isinstance(order, StepOrder):
        s = order.settings
        learner.cfg, learner.loss_cfg = s["cfg"], s["loss_cfg"]
        learner.temperature, learner.total_steps = s["temperature"], s["total_steps"]
        learner.settings_digest = s["settings_digest"]
        for group, decay in zip(learner.optimizer.param_groups, s["weight_decay"], strict=True):
            group["weight_decay"] = decay
        return
    learner.load_model_state(order.model)
    learner.optimizer.load_state_dict(order.optimizer)
    learner.steps = order.steps
    if order.ref is not None:
        if learner.ref is None:
            learner.ref = copy.deepcopy(learner.model).eval()
        learner.ref.load_state_dict(order.ref)


def follow(learner: GRPOLearner, ranks: Gloo) -> int:
    """Rank 1..'s loop: obey rank 0's orders until it stops the group; returns the steps
    trained. A step rank 0 finds non-finite is not applied here either (every rank raises)."""
    trained = 0
    while True:
        order = ranks.broadcast(None)
        if isinstance(order, StopOrder):
            return trained
        if isinstance(order, SaveOrder):
            ranks.write_shards(learner, Path(order.path))
            continue
        assert isinstance(order, (StepOrder, LoadOrder)), f"unknown order {order!r}"
        _apply(learner, order)
        if isinstance(order, LoadOrder):
            ranks.loaded(learner)
        if isinstance(order, StepOrder):
            with contextlib.suppress(NonFiniteStep):  # rank 0 raised it too, and decides
                learner.step(order.samples, order.number)
            trained += 1


__all__ = ["RANK_SPLIT", "SOLO", "Gloo", "LoadOrder", "RankLost", "SaveOrder", "Solo", "StepOrder",
           "StopOrder",
           "connect", "follow", "rank_slices", "ranks_record"]

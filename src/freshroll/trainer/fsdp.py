"""The ranks of ``trainer.parallel: fsdp``: each rank holds a shard of the model (FSDP2).

:class:`Sharded` is a :class:`~freshroll.trainer.ranks.Gloo` group (the same orders from
rank 0, the same split rule, the same gathered metrics) whose ranks train a copy of the
model sharded by ``torch.distributed.fsdp.fully_shard`` (each ``ModuleList`` entry, e.g. a
decoder layer, then the root) over a 1-D CPU device mesh of the group's default process
group (gloo), with an AdamW over the shards. What differs from ``ddp``:

- the gradients are reduce-scattered by FSDP in each backward, summed (divide factor 1: the
  losses are already scaled against the whole batch, :mod:`freshroll.trainer.accum`), so no
  all-reduce follows; every rank holds its shard of ``sum_r sum_j w_j grad L_j``;
- every rank runs the same number of micro-batches (FSDP's all-gathers and
  reduce-scatters are collectives of every forward and backward): a rank with fewer than
  the most any rank has runs *fillers*, its batch's first row with its loss times 0
  (a zero gradient, no metrics), and a non-finite loss does not end a rank's micro-batches
  early (the step fails on every rank after them, as under ddp); rows never share their
  prompt's positions (one forward a micro-batch on every rank, whatever the layout);
- the learner's ``model`` and ``optimizer`` are the *full* state, a mirror, never trained
  directly: at the end of every step (once per version) every rank takes part in gathering
  the full model and optimizer state (``get_model_state_dict`` / ``get_optimizer_state_dict``
  with ``full_state_dict``, to rank 0's CPU), and rank 0 loads it into the mirror. So what
  rank 0 reads as today, the weights digest, the publication through ``WeightTransfer``, a
  checkpoint, is the gathered full state, the same object at any world size; the gather's
  seconds are the step's ``gather_s``;
- a full state loaded on rank 0 (a checkpoint, the group's start) is broadcast as under
  ``ddp`` and then loaded into every rank's shards (``set_model_state_dict``).

The group's default process group is this process's one (``torch.distributed``'s world): a
process holds one FSDP group at a time, destroyed by :meth:`Sharded.end`.
"""

from __future__ import annotations

import copy
import datetime
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from freshroll.trainer.grpo import GRPOLearner, TrainSample, collate, use_kernel
from freshroll.trainer.losses import LossConfig
from freshroll.trainer.ranks import Gloo, SaveOrder, _collective, rank_slices
from freshroll.trainer.replay import weights_digest

#: a micro-batch slice that is a filler (module docstring): no rows of this rank's
FILLER = slice(0, 0)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def connect_default(store: Path, rank: int, world: int, timeout_s: float) -> Any:
    """Rank ``rank``'s default process group (gloo), met through the file ``store``; returns
    it (its collectives are the group's, as :func:`~freshroll.trainer.ranks.connect`'s)."""
    if dist.is_initialized():  # a group of an earlier run of this process not ended
        dist.destroy_process_group()
    file_store = dist.FileStore(str(store), world)  # type: ignore[attr-defined]  # stubs omit it
    dist.init_process_group("gloo", store=file_store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.distributed_c10d._get_default_group()


def shard(model: torch.nn.Module, world: int) -> torch.nn.Module:
    """A copy of ``model`` sharded over a CPU mesh of ``world`` ranks: each entry of every
    ``ModuleList`` its own FSDP unit, then the root; gradients summed, not averaged."""
    mesh = init_device_mesh("cpu", (world,))
    module = copy.deepcopy(model)
    for m in list(module.modules()):
        if isinstance(m, torch.nn.ModuleList):
            for block in m:
                fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return module


def _names(model: torch.nn.Module) -> list[str]:
    """The names of the trained parameters, in the optimizer's order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def by_name(model: torch.nn.Module, osd: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict of ``model``'s parameters keyed by index, keyed by name."""
    names = _names(model)
    return {"state": {names[i]: v for i, v in osd["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in osd["param_groups"]]}


def by_index(model: torch.nn.Module, osd: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`by_name`."""
    at = {n: i for i, n in enumerate(_names(model))}
    return {"state": {at[n]: v for n, v in osd["state"].items()},
            "param_groups": [{**g, "params": [at[n] for n in g["params"]]}
                             for g in osd["param_groups"]]}


class Sharded(Gloo):
    """Rank ``rank`` of a ``trainer.parallel: fsdp`` group (module docstring)."""

    #: a non-finite micro-batch does not end this rank's micro-batches early (the step
    #: still fails on every rank, after them): the others wait in its collectives
    lockstep = True

    def __init__(self, pg: Any, rank: int, world: int) -> None:
        super().__init__(pg, rank, world)
        self.module: torch.nn.Module | None = None
        self.optim: torch.optim.Optimizer | None = None

    def net(self, learner: GRPOLearner) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        assert self.module is not None and self.optim is not None, "no state loaded yet"
        return self.module, self.optim

    def slices(self, n: int, k: int) -> list[slice]:
        """This rank's micro-batches, then fillers up to the most any rank has."""
        mine = rank_slices(n, k, self.world, self.rank)
        most = max(len(rank_slices(n, k, self.world, r)) for r in range(self.world))
        return mine + [FILLER] * (most - len(mine))

    def filler(self, learner: GRPOLearner, samples: Sequence[TrainSample], adv: torch.Tensor,
               loss_cfg: LossConfig) -> None:
        """A filler micro-batch: the batch's first row with its loss times 0, so this rank
        takes part in every collective of a micro-batch and adds nothing to the gradient."""
        batch = collate(samples[:1], learner.pad_id)
        loss, _, _, _ = learner._micro_loss(batch, adv[:1], loss_cfg)
        (loss * 0.0).backward()  # type: ignore[no-untyped-call]  # torch: unannotated

    def reduce_grads(self, model: torch.nn.Module) -> None:
        """Nothing: FSDP reduce-scattered (summed) each backward's gradients."""

    def sync(self, learner: GRPOLearner) -> None:
        super().sync(learner)
        self.loaded(learner)

    def loaded(self, learner: GRPOLearner) -> None:
        """The learner's full state (just loaded, or broadcast by rank 0) into this rank's
        shards and their optimizer; every rank calls it together."""
        if self.module is None:
            learner.share_prompts = False  # one forward a micro-batch on every rank
            self.module = shard(learner.model, self.world)
        with _collective(self.world, "the full state's load into the shards"):
            full: dict[str, Any] = dict(learner.model_state())
            set_model_state_dict(self.module, full,
                                 options=StateDictOptions(full_state_dict=True))
        self.optim = torch.optim.AdamW(
            [p for p in self.module.parameters() if p.requires_grad], lr=learner.cfg.lr,
            weight_decay=learner.cfg.weight_decay)
        osd = learner.optimizer.state_dict()
        if osd["state"]:  # a fresh optimizer has none (nothing to shard)
            with _collective(self.world, "the optimizer state's load into the shards"):
                set_optimizer_state_dict(self.module, self.optim, by_name(learner.model, osd),
                                         options=StateDictOptions(full_state_dict=True))
        use_kernel(self.optim, learner.cfg.optim)

    def finished(self, learner: GRPOLearner) -> float:
        """After a step: the full state gathered to rank 0's mirror (every rank takes part);
        returns the seconds it took (the version's gather)."""
        t0 = time.perf_counter()
        module, optim = self.net(learner)
        with _collective(self.world, "the full state's gather"):
            full = get_model_state_dict(module, options=_FULL)
            osd = get_optimizer_state_dict(module, optim, options=_FULL)
        if self.rank == 0:
            learner.model.load_state_dict(full)
            learner.optimizer.load_state_dict(by_index(learner.model, osd))
            use_kernel(learner.optimizer, learner.cfg.optim)
        return time.perf_counter() - t0

    def write_shards(self, learner: GRPOLearner, path: Path) -> dict[str, Any]:
        """Every rank's shard of the model and optimizer written into ``path`` with
        ``torch.distributed.checkpoint`` (rank 0 orders the others); returns the checkpoint
        manifest's entry: the mode, the world size and the full weights' digest."""
        if self.rank == 0:
            self.broadcast(SaveOrder(str(path)))
        module, optim = self.net(learner)
        with _collective(self.world, "the sharded checkpoint's write"):
            state = {"model": get_model_state_dict(module),
                     "optim": get_optimizer_state_dict(module, optim)}
            save(state, checkpoint_id=str(path))
        return {"parallel": "fsdp", "world_size": self.world,
                "digest": weights_digest(learner.model) if self.rank == 0 else None}

    def end(self) -> None:
        """This process's default group destroyed (the group is over)."""
        if dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["FILLER", "Sharded", "by_index", "by_name", "connect_default", "shard"]

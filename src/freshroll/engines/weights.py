"""The weight seam: what a published policy version is on its way to the workers.

A run publishes every committed version once (:meth:`~freshroll.ports.seams.AsyncTrainer.weights`)
and hands that one publication to every inference worker's
:meth:`~freshroll.engines.seams.AsyncEngine.load_weights`. What the publication *is* depends
on the placement, which chooses a :class:`WeightTransfer`; the engine of the same placement
loads exactly what its transfer publishes:

=================  ===========================================  ====================================
placement          publication (a :data:`Weights`)              loaded by
=================  ===========================================  ====================================
inline, vLLM       :data:`StateDict`: a detached copy of the    the HF engine's thread adapter
                   learner's state dict (a LoRA run: only its   (``engine.load_weights``), vLLM
                   adapters, :mod:`freshroll.engines.lora_merge`)
process            :class:`SlotHandle`: a shared-memory slot    the process worker's proxy (the
                   (:mod:`freshroll.placement.shm_weights`)     child copies the slot; a
                                                                :class:`TakesPublication`)
Ray                :data:`RayRef`: an ``ObjectRef`` to a        the Ray actor (it fetches the object
                   packed state dict (put by ``RayPut``, or     itself)
                   the trainer actor's return object)
sim                :data:`SimWeights`: the step number          the simulated engine (a token; it
                                                                sleeps the transfer time)
=================  ===========================================  ====================================

The contract of a :class:`WeightTransfer`:

* ``publish(learner)`` runs on the trainer's thread, once per version, right after the step
  that made it (never on the event loop; a resumed run publishes the version it resumes at
  on its first ask); it returns a publication the workers may load any number of times,
  concurrently, until the next-but-one publication (a shared-memory slot is reused then:
  :class:`~freshroll.placement.shm_weights.StaleHandle`);
* the weights move once per version, whatever the number of workers (the publication is a
  copy, a slot or an object, never per-worker serialisation);
* a worker's engine that is handed a publication of another placement's kind raises
  :class:`TypeError` (a wiring bug, never a retryable loss).

This module imports no torch at run time (a simulated run imports none): the tensor types are
annotations only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import torch
    from ray import ObjectRef


#: a full state dict, or a LoRA run's adapter publication (a flat dict of tensors as well)
StateDict: TypeAlias = "Mapping[str, torch.Tensor]"
#: a Ray object holding a state dict (the trainer actor's second return object)
RayRef: TypeAlias = "ObjectRef[Any]"  # a packed state dict (placement.ray_engine.pack_state)
#: the simulated trainer's publication: the step number of the last trained step
SimWeights: TypeAlias = int


@dataclass(frozen=True, slots=True)
class SlotHandle:
    """What a process worker loads: the version held in shared-memory ``slot`` under
    sequence number ``seq`` (:mod:`freshroll.placement.shm_weights`)."""

    slot: int
    seq: int


#: one published version's weights, as its placement moves them (module docstring)
Weights: TypeAlias = "StateDict | SlotHandle | RayRef | SimWeights"

W_co = TypeVar("W_co", covariant=True)


class Publishing(Protocol):
    """The learner as a transfer reads it (:class:`~freshroll.trainer.grpo.GRPOLearner`)."""

    def published_state(self) -> StateDict:
        """What workers load, as detached views (the state dict, or a LoRA run's adapters)."""
        ...

    def weights(self) -> StateDict:
        """A detached copy of :meth:`published_state`."""
        ...


class WeightTransfer(Protocol[W_co]):
    """How a placement moves a version's weights from the learner to its workers: one
    publication per version, loaded by every worker (the contract: module docstring).
    Implemented by :class:`~freshroll.placement.adapters.CloneTransfer` (inline),
    :class:`~freshroll.placement.shm_weights.WeightChannel` (process) and
    :class:`~freshroll.placement.ray_engine.RayPut` (Ray, ``ray.trainer: driver``); the Ray
    trainer actor publishes as its step's second return object, the simulated trainer its
    step number."""

    def publish(self, learner: Publishing) -> W_co:
        """Publish the learner's current weights (on the trainer thread); what the workers
        load for this version."""
        ...


@runtime_checkable
class TakesPublication(Protocol):
    """A blocking engine proxy that loads its placement's publication itself (the process
    worker's takes a :class:`SlotHandle`, the Ray actor's a :data:`RayRef`); an in-process
    engine (:class:`~freshroll.engines.base.InferenceEngine`) takes a :data:`StateDict`."""

    takes_publication: bool  # the mark (True): the thread adapter hands it the publication

    def load_weights(self, weights: Weights) -> float: ...


def publication_loader(engine: object) -> Callable[[Weights], float] | None:
    """``engine.load_weights`` when ``engine`` takes publications itself, else None."""
    return engine.load_weights if isinstance(engine, TakesPublication) else None


def state_dict_of(weights: Weights, who: str) -> StateDict:
    """``weights`` as a state dict, for an engine that loads tensors in its own process;
    :class:`TypeError` naming ``who`` for a publication of another placement."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{who} loads a state dict, not {type(weights).__name__}")
    return weights


__all__ = ["Publishing", "RayRef", "SimWeights", "SlotHandle", "StateDict", "TakesPublication",
           "WeightTransfer", "Weights", "publication_loader", "state_dict_of"]

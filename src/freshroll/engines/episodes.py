r"""The episode seam: how a worker's requests become completions (AReaL's ``arun_episode``).

Between the worker pool and its engine stands one :class:`EpisodeWorkflow`, chosen by
``rollout.workflow`` from :data:`WORKFLOWS` (name -> factory). The pool starts a call's
attempts, then awaits ``workflow.run_episode(engine, requests, params, seed, emit)``; the
workflow drives the engine (:class:`~freshroll.engines.seams.AsyncEngine`) as it needs (one
``generate`` for a single-turn rollout, several for a multi-turn or tool-using one) and
``emit``\ s one final :class:`~freshroll.engines.base.Completion` per request: the sample
the buffer stores, the rewards score and the trainer trains on (its ``prompt_token_ids`` the
context of the sampled tokens, its ``token_ids`` and ``logprobs`` those sampled). The pool
does not know which workflow runs: a new kind of episode is a module plus one
:func:`register_workflow` (docs/architecture.md, "Adding an episode workflow").

The contract, the engine's own (``AsyncEngine.generate``) widened to the whole episode:

* ``requests`` are one call's worth: at most ``concurrency`` of them, for a lock-step engine
  one batch. ``emit(i, completion)`` once per request ``i``, in any order, on the event loop.
  Return when every request was emitted, or dropped by a cancel.
* Time: ``limits.generate_timeout_s`` bounds the whole ``run_episode`` call (every turn
  together); on timeout the pool cancels it (never swallow ``CancelledError``) and fences the
  worker's epoch, so a late ``emit`` is rejected.
* Failures are the engine's: :class:`~freshroll.errors.WorkerLost` (let it through) replaces
  the worker; :class:`~freshroll.errors.Superseded` re-issues the unfinished requests; any
  other exception ends the requests not yet emitted as ``generation_error``.
* Cancel: a group deadline calls ``engine.cancel(samples)`` with the requests' sample ids,
  so every turn's :class:`~freshroll.engines.seams.GenRequest` keeps its request's
  ``sample``, and a request whose turn was not emitted (cancelled) gets no further turn.
* Replay: ``seed`` is the call's sampling seed, recorded on each member's ``started`` event
  with the call's membership (docs/ledger.md); every turn's seed derives from it alone.
* A multi-turn episode emits a trajectory (:func:`freshroll.engines.trajectory.assemble`:
  model and environment segments, a loss mask, its turns); a request whose tool or
  environment failed emits :class:`EpisodeFailed` instead (discarded by its typed reason,
  counted against the worker's failure budget), never a completion scored 0.
* A factory gets the run's :class:`WorkflowSetup` (its sections) when it takes an argument;
  a factory of no argument is called as it is (a workflow that needs no settings).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, runtime_checkable

from freshroll.config.rollout import RolloutSection, ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EpisodeFailed:
    """What a workflow emits for a request whose episode failed outside the model: the
    sample is discarded with ``reason`` (a typed discard reason of the ledger) and
    ``detail``. ``seconds``: the episode's time until the failure."""

    reason: Literal["tool_error"]
    detail: str
    seconds: float = 0.0


#: ``emit(i, outcome)``: request ``i``'s episode ended, in a completion (the sample) or a
#: failure outside the model (:class:`EpisodeFailed`); the engine's :data:`Emit`, widened
EpisodeEmit = Callable[[int, Completion | EpisodeFailed], None]


@dataclass(frozen=True, slots=True)
class WorkflowSetup:
    """What a workflow factory is given: the run's config sections it may read."""

    rollout: RolloutSection = field(default_factory=RolloutSection)
    tools: ToolsSection = field(default_factory=ToolsSection)
    runtime: str = "inline"  # run.runtime as configured


@runtime_checkable
class EpisodeWorkflow(Protocol):
    """Turns one call's requests into one final completion each (the contract above)."""

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        """Run the episodes of ``requests`` on ``engine``; ``emit`` each one's completion."""
        ...


@runtime_checkable
class HoldsEngines(Protocol):
    """A workflow that keeps something per engine (a gateway in front of it): the pool calls
    ``release(engine)`` before it closes that engine (a retired, replaced or last worker's)."""

    async def release(self, engine: AsyncEngine) -> None: ...


@runtime_checkable
class BatchesTurns(Protocol):
    """A workflow whose episodes are independent tasks whose model turns it batches itself,
    across calls (:class:`~freshroll.engines.turns.TurnBatcher`): with ``batches_turns``
    true the pool runs several of its calls at once on a lock-step engine too (the worker's
    lanes), so a finished episode's slot is refilled at once; a new policy version loads when
    the live calls have finished (or beside them, on an engine that swaps in flight)."""

    batches_turns: bool


def overlaps_calls(workflow: object) -> bool:
    """Whether the pool may overlap ``workflow``'s calls on a lock-step engine."""
    return isinstance(workflow, BatchesTurns) and workflow.batches_turns is True


class SingleTurn:
    """Today's rollout and the default: one ``generate`` call, its completions as they are."""

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: EpisodeEmit,
    ) -> None:
        await engine.generate(requests, params, seed, emit)


#: makes the workflow of one worker pool (called once per run, with the run's
#: :class:`WorkflowSetup` when it takes an argument, else with none)
WorkflowFactory = Callable[..., EpisodeWorkflow]

#: ``rollout.workflow`` name -> factory; :func:`register_workflow` adds one
WORKFLOWS: Final[dict[str, WorkflowFactory]] = {"single_turn": SingleTurn}


def register_workflow(name: str, factory: WorkflowFactory) -> None:
    """Make ``rollout.workflow: <name>`` select ``factory``'s workflow. A name is registered
    once (the same factory again is a no-op); a different factory under a taken name is a
    ValueError, so two modules cannot silently replace each other's workflow."""
    have = WORKFLOWS.get(name)
    if have is not None and have is not factory:
        raise ValueError(f"episode workflow {name!r} is already registered ({have!r})")
    WORKFLOWS[name] = factory


def workflow_for(name: str, setup: WorkflowSetup | None = None) -> EpisodeWorkflow:
    """The workflow ``rollout.workflow`` names, made with ``setup`` (the defaults when None)
    where its factory takes it; a ConfigError naming the key when none is registered under
    it (or from the factory, when the setup does not suit it)."""
    factory = WORKFLOWS.get(name)
    if factory is None:
        known = ", ".join(sorted(WORKFLOWS))
        raise ConfigError(f"rollout.workflow: unknown episode workflow {name!r} (registered: "
                          f"{known}; a new one is registered with "
                          f"freshroll.engines.episodes.register_workflow)")
    if _takes_setup(factory):
        return factory(setup if setup is not None else WorkflowSetup())
    return factory()


def _takes_setup(factory: WorkflowFactory) -> bool:
    """Whether ``factory`` takes a positional argument (the setup)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it bare
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


__all__ = [
    "WORKFLOWS", "BatchesTurns", "EpisodeEmit", "EpisodeFailed", "EpisodeWorkflow",
    "HoldsEngines", "SingleTurn", "WorkflowFactory", "WorkflowSetup", "overlaps_calls",
    "register_workflow", "workflow_for",
]

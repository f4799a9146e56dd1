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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Protocol, runtime_checkable

from freshroll.engines.seams import AsyncEngine, Emit, GenRequest, SamplingParams
from freshroll.errors import ConfigError


@runtime_checkable
class EpisodeWorkflow(Protocol):
    """Turns one call's requests into one final completion each (the contract above)."""

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: Emit,
    ) -> None:
        """Run the episodes of ``requests`` on ``engine``; ``emit`` each one's completion."""
        ...


class SingleTurn:
    """Today's rollout and the default: one ``generate`` call, its completions as they are."""

    async def run_episode(
        self, engine: AsyncEngine, requests: Sequence[GenRequest], params: SamplingParams,
        seed: int, emit: Emit,
    ) -> None:
        await engine.generate(requests, params, seed, emit)


#: makes the workflow of one worker pool (called once per run, with no arguments)
WorkflowFactory = Callable[[], EpisodeWorkflow]

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


def workflow_for(name: str) -> EpisodeWorkflow:
    """The workflow ``rollout.workflow`` names; a ConfigError naming the key when none is
    registered under it."""
    factory = WORKFLOWS.get(name)
    if factory is None:
        known = ", ".join(sorted(WORKFLOWS))
        raise ConfigError(f"rollout.workflow: unknown episode workflow {name!r} (registered: "
                          f"{known}; a new one is registered with "
                          f"freshroll.engines.episodes.register_workflow)")
    return factory()


__all__ = [
    "WORKFLOWS", "EpisodeWorkflow", "SingleTurn", "WorkflowFactory", "register_workflow",
    "workflow_for",
]

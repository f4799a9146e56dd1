"""Hand-off hooks: where a chaos session sees (and perturbs) what passes between stages.

Faults are injected at the pipeline's hand-offs. Most of them are seams already
(:mod:`freshroll.ports.seams`): a chaos session wraps the engine factory, the engines, the
scorer and the trainer (:meth:`freshroll.runtime.placements.ChaosSession.wrap`) and so sees
every ``generate``, ``emit``, ``load_weights``, ``score``, ``step`` and ``before_commit``.
The hand-offs that happen inside the pipeline, between a stage and the sample buffer, call
a :class:`Hooks` object instead:

* ``scored(sids, scores)``: a reward call returned, before its scores reach the buffer (a
  session may fail or corrupt some: the reward stage must discard them, never record 0);
* ``rewarded(sids)``: those rewards were delivered to the buffer (a session may deliver one
  again: the buffer must reject the duplicate);
* ``committed(version)``: a trainer step was committed durably;
* ``run(pipe)``: a task of the pipeline's task group for the whole run (time triggers, a
  liveness guard); it is cancelled when the run ends.

The default :class:`Hooks` does nothing; a run without a chaos session pays one no-op method
call per reward call and per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from freshroll.lineage import PolicyVersion, SampleId
from freshroll.rewards.scoring import Score

if TYPE_CHECKING:
    from freshroll.pipeline.pipeline import Pipeline


class Hooks:
    """No-op hand-off hooks (the default of every pipeline)."""

    async def run(self, pipe: Pipeline) -> None:
        """A task for the whole run; returning early is fine."""

    def scored(self, sids: Sequence[SampleId], scores: list[Score]) -> list[Score]:
        """A reward call's scores, before they reach the buffer; returns what is delivered."""
        return scores

    def rewarded(self, sids: Sequence[SampleId]) -> None:
        """A reward call's results were delivered to the buffer."""

    def committed(self, version: PolicyVersion) -> None:
        """A trainer step was committed (durably) and its version published."""


__all__ = ["Hooks"]

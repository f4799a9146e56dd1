"""What each step trained on, kept small: per committed step, its best-rewarded sample, its
worst and one drawn uniformly at random, for the report's sample completions.

Fed one event at a time in the end-of-run pass over the ledger (the report reads the ledger
once), it keeps three samples and a count per step, whatever the run's size: the random one
by reservoir sampling (the k-th scored sample of a step replaces the kept one with
probability 1/k), from a generator seeded with :data:`SEED`, so the same ledger always keeps
the same samples. A sample counts when it was committed with a reward.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Final, NamedTuple

from freshroll.ledger.events import Committed, Discarded, Rewarded, Started
from freshroll.ledger.lineage import policy_step

SEED: Final = 0


class Trained(NamedTuple):
    """A committed sample: the step that trained on it, its reward, its policy's step."""

    sample: str
    step: int
    reward: float
    version_step: int | None


class StepPicks(NamedTuple):
    """One committed step's kept samples and how many it had with a reward."""

    best: Trained
    worst: Trained
    any: Trained
    n: int


class TrainedFold:
    """:class:`StepPicks` per committed step, one event at a time (``feed``; a
    :class:`~freshroll.figures.fold.Fold`)."""

    KINDS: ClassVar = (Started, Rewarded, Committed, Discarded)

    def __init__(self) -> None:
        self.steps: list[StepPicks] = []
        self._gen: dict[str, int | None] = {}  # sample -> its policy's step, until it ends
        self._reward: dict[str, float] = {}
        self._rng = random.Random(SEED)

    def feed(self, e: Any) -> None:
        if isinstance(e, Started):
            self._gen[e.sample] = policy_step(e.version)
        elif isinstance(e, Rewarded):
            self._reward[e.sample] = e.reward
        elif isinstance(e, Discarded):
            if e.sample is not None:
                self._gen.pop(e.sample, None)
                self._reward.pop(e.sample, None)
        elif isinstance(e, Committed):
            self._committed(policy_step(e.version), e.samples)

    def result(self) -> list[StepPicks]:
        """The picks of every committed step so far (:attr:`steps`), in commit order."""
        return list(self.steps)

    def _committed(self, step: int, samples: list[str]) -> None:
        picks: StepPicks | None = None
        for s in samples:
            gen = self._gen.pop(s, None)
            reward = self._reward.pop(s, None)
            if reward is None:
                continue
            t = Trained(s, step, reward, gen)
            if picks is None:
                picks = StepPicks(t, t, t, 1)
                continue
            n = picks.n + 1
            picks = StepPicks(t if reward > picks.best.reward else picks.best,
                              t if reward < picks.worst.reward else picks.worst,
                              t if self._rng.randrange(n) == 0 else picks.any, n)
        if picks is not None:
            self.steps.append(picks)


def fold_trained(events: Any) -> list[StepPicks]:
    """The :class:`StepPicks` of an event history, in commit order."""
    fold = TrainedFold()
    for e in events:
        fold.feed(e)
    return fold.steps


__all__ = ["SEED", "StepPicks", "Trained", "TrainedFold", "fold_trained"]

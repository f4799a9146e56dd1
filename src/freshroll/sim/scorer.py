"""The simulated reward stage: a seeded success/failure reward after a lognormal latency.

A :class:`SimScorer` is an :class:`~freshroll.ports.seams.AsyncScorer`. A call
over ``n`` completions is **one batched reward call**; the pipeline runs up to
``sim.reward_workers`` such calls at once (parallel reward workers), each of at most
one group's completions::

    latency  = max over members of min(median_s x exp(sigma x z_i), timeout_s)   (x time_scale)
    hangs    with probability reward.timeout_p per call: it then sleeps hang_s (far
             beyond limits.reward_timeout_s, so the pipeline's timeout fires and
             discards the call's samples as reward_timeout)
    value_i  = 1.0 with probability p_g (p_g ~ Beta(1, 1) per group), else 0.0;
               a completion cut at the cap (finish_reason "length") scores 0.0

All draws are keyed by the run seed and the sample id (:mod:`freshroll.sim.keyed`),
which the simulated engine puts in ``Completion.text``; a completion without one
(a foreign engine) is keyed by its prompt id and position instead. GRPO groups
therefore have within-group variance, and the same seed scores the same way in
any order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict

from freshroll.engines.base import FINISH_LENGTH, Completion
from freshroll.ledger.lineage import RewardVersion
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt
from freshroll.sim.keyed import KeyedDraws

#: the reward rule's revision, part of its version (change it when the rule changes)
RULE = "bernoulli-beta11-capped0/v1"


def _key(prompt: Prompt, completion: Completion, i: int) -> str:
    """The sample id the engine put in ``text``, else ``<prompt>.<i>#0`` (a foreign engine)."""
    text = completion.text
    if text.startswith("g") and "#" in text and "." in text:
        return text
    return f"{prompt.prompt_id}.{i}#0"


class SimScorer:
    """The reward stage of the simulated cluster (see the module docstring)."""

    names: tuple[str, ...] = ("sim",)

    def __init__(self, draws: KeyedDraws, *, time_scale: float = 1.0, hang_s: float = 1e6,
                 concurrency: int = 64, max_batch: int = 16):
        self.draws = draws
        self.concurrency, self.max_batch = concurrency, max_batch
        self.version = str(RewardVersion.of(
            "sim", config={"rule": RULE, "reward": asdict(draws.profile.reward)}
        ))
        self._scale = time_scale
        self._hang_s = hang_s
        self.calls = 0
        self.hung = 0

    async def score(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], state: RewardState,
    ) -> list[Score]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        if not completions:
            return []
        draws = self.draws
        keys = [_key(p, c, i) for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
        self.calls += 1
        if draws.reward_call_hangs(keys):
            self.hung += 1
            await asyncio.sleep(self._hang_s)
            return [Score(None, "reward_error: the simulated reward call hung", {})] * len(keys)
        await asyncio.sleep(max(draws.reward_s(k) for k in keys) * self._scale)
        out = []
        for key, c in zip(keys, completions, strict=True):
            value = draws.reward(key, c.finish_reason == FINISH_LENGTH)
            out.append(Score(value, None, {"sim": value}))
        return out


__all__ = ["RULE", "SimScorer"]

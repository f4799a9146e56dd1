"""The simulated cluster's draws, keyed by the run seed and the ids they belong to.

A simulated engine, scorer and trainer must agree on every sample's figures
without sharing state, and the figures must not depend on which worker served a
request, in which order, or whether it was re-issued. So every draw here is a
pure function of ``(run seed, a salt naming the draw, an id)``::

    u(seed, salt, key) = (int(blake2b(seed, salt, key)[:8]) + 0.5) / 2**64   in (0, 1)
    z(seed, salt, key) = Phi^-1(u)                                          a standard normal

and the formulas of :mod:`freshroll.sim.draws` are applied to them:

==========================  ===============================  ================================
figure                      keyed by                         formula
==========================  ===============================  ================================
group length component z_g  group id (``g17``)               shared by all members and attempts
sample length component     sample id (``g17.3#2``)          a re-issued attempt draws anew
completion length L         both, + the policy step          :func:`~draws.length_of`
prompt length               group id                         :func:`~draws.prompt_length_of`
tool call k latency         sample id, k                     lognormal; ``timeout_p`` hang
reward latency              sample id                        lognormal, capped at timeout_s
reward call hangs           the call's sample ids            probability ``reward.timeout_p``
success probability p_g     group id                         ``p_g ~ Beta(1, 1)`` (uniform)
reward value                sample id                        ``1.0`` if ``u < p_g`` else ``0.0``
==========================  ===============================  ================================

A completion cut at the cap (``finish_reason = "length"``) is a failed answer
(reward 0). One draw costs about a microsecond (no ``numpy.random.Generator``
per id, which costs ~20 us).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

from freshroll.ledger.lineage import group_of
from freshroll.sim.draws import (
    latency_of,
    length_cap,
    median_tokens,
    prompt_length_of,
    split_turns,
)
from freshroll.sim.profiles import Profile

_PHI_INV = NormalDist().inv_cdf
_SCALE = 2.0**-64
_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes


def uniform(seed: int, salt: str, key: str) -> float:
    """A uniform in (0, 1), a pure function of its arguments."""
    h = hashlib.blake2b(f"{seed}\x00{salt}\x00{key}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") + 0.5) * _SCALE


def normal(seed: int, salt: str, key: str) -> float:
    """A standard normal, a pure function of its arguments."""
    h = _blake2b(f"{seed}\x00{salt}\x00{key}".encode(), digest_size=8).digest()
    return _PHI_INV((_from_bytes(h, "little") + 0.5) * _SCALE)


def group_of_sample(sample: str) -> str:
    """``g17`` of ``g17.3#2``."""
    return group_of(sample)


@dataclass(frozen=True, slots=True)
class SampleShape:
    """What the engine generates for one sample: its turns and tool calls."""

    prompt_tokens: int  # the first turn's prefill
    length: int  # completion tokens L (all turns)
    capped: bool  # L reached the cap (finish_reason "length")
    segments: tuple[int, ...]  # tokens per turn (one entry: single-turn)
    tool_s: tuple[float, ...]  # tool latency after each turn but the last (model seconds)
    tool_tokens: int = 0  # tool output tokens prefilled by the later turns

    @property
    def context_tokens(self) -> int:
        """Tokens a trainer step processes for it: prompt + completion + tool outputs."""
        return self.prompt_tokens + self.length + self.tool_tokens


class KeyedDraws:
    """The draws of one profile under one run seed."""

    def __init__(self, profile: Profile, seed: int) -> None:
        self.profile = profile
        self.seed = seed
        lengths = profile.lengths
        self.cap = length_cap(lengths)
        self._sigma_p = lengths.sigma * math.sqrt(lengths.prompt_share)
        self._sigma_s = lengths.sigma * math.sqrt(1.0 - lengths.prompt_share)
        self._median: dict[int, float] = {}  # policy step -> m(s)
        self._group = ""  # a one-group cache: members of a group come together
        self._group_draws = (0.0, 0)

    def group(self, group: str) -> tuple[float, int]:
        """``(z_g, prompt tokens)`` of ``group``."""
        if group != self._group:
            z_g = normal(self.seed, "len-g", group)
            prompt = prompt_length_of(self.profile.lengths, normal(self.seed, "prompt", group))
            self._group, self._group_draws = group, (z_g, prompt)
        return self._group_draws

    def length(self, group: str, sample: str, step: int) -> int:
        """Completion tokens of ``sample`` (of ``group``) generated at policy step ``step``."""
        median = self._median.get(step)
        if median is None:
            median = self._median[step] = median_tokens(self.profile.lengths, step)
        z_g = self.group(group)[0]  # = draws.length_of, with its constants precomputed
        z_gi = normal(self.seed, "len-s", sample)
        raw = median * math.exp(self._sigma_p * z_g + self._sigma_s * z_gi)
        return min(max(round(raw), 1), self.cap)

    def prompt_tokens(self, group: str) -> int:
        return self.group(group)[1]

    def tool_s(self, sample: str, call: int) -> float:
        """Latency of the tool call after turn ``call`` (model seconds; ``timeout_s`` if hung)."""
        t = self.profile.tools
        key = f"{sample}/{call}"
        hang = uniform(self.seed, "tool-hang", key) < t.timeout_p
        return latency_of(t.median_s, t.sigma, t.timeout_s, normal(self.seed, "tool", key), hang)

    def shape(self, group: str, sample: str, step: int) -> SampleShape:
        """Everything the engine needs to generate ``sample``."""
        length = self.length(group, sample, step)
        turns = self.profile.tools.turns
        if turns == 1:
            return SampleShape(self.prompt_tokens(group), length, length >= self.cap, (length,), ())
        segments = tuple(split_turns(length, turns))
        tool_s = tuple(self.tool_s(sample, k) for k in range(len(segments) - 1))
        return SampleShape(
            self.prompt_tokens(group), length, length >= self.cap, segments, tool_s,
            tool_tokens=(len(segments) - 1) * self.profile.tools.output_tokens,
        )

    def context_tokens(self, sample: str, step: int) -> int:
        """Prompt + completion + tool-output tokens of ``sample`` at ``step`` (the trainer's)."""
        group = group_of_sample(sample)
        length = self.length(group, sample, step)
        turns = min(self.profile.tools.turns, length)
        return self.prompt_tokens(group) + length + (turns - 1) * self.profile.tools.output_tokens

    def reward_s(self, sample: str) -> float:
        """Reward latency of ``sample`` (model seconds), capped at ``reward.timeout_s``."""
        r = self.profile.reward
        return latency_of(r.median_s, r.sigma, r.timeout_s, normal(self.seed, "reward-s", sample),
                          False)

    def reward_call_hangs(self, samples: list[str]) -> bool:
        """Whether a reward call over ``samples`` never answers (``reward.timeout_p``)."""
        p = self.profile.reward.timeout_p
        return p > 0 and uniform(self.seed, "reward-hang", "\n".join(samples)) < p

    def success_p(self, group: str) -> float:
        """The group's success probability ``p_g ~ Beta(1, 1)``."""
        return uniform(self.seed, "success-p", group)

    def reward(self, sample: str, capped: bool) -> float:
        """1.0 (success) with probability ``p_g``, else 0.0; a capped completion fails."""
        if capped:
            return 0.0
        p = self.success_p(group_of_sample(sample))
        return 1.0 if uniform(self.seed, "success", sample) < p else 0.0

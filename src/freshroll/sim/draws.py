"""Seeded draws of the simulated workload: lengths, reward and tool latencies, trainer time.

Every function takes a ``numpy.random.Generator`` and draws in a fixed order,
so the same seed gives the same figures; nothing here reads a clock.

Completion lengths (tokens) of ``G`` samples of prompt ``g`` at policy step ``s``::

    m(s)   = median_tokens x (1 + drift x min(max(s, 0), drift_steps) / drift_steps)
    L[g,i] = clip(round(m(s) x exp(sigma_p x z_g + sigma_s x z_gi)), 1, cap)
    sigma_p = sigma x sqrt(prompt_share),  sigma_s = sigma x sqrt(1 - prompt_share)
    cap    = max(1, floor(cap_multiple x median_tokens))       (= max_new_tokens)

with ``z_g`` one standard normal per prompt (shared by its group) and ``z_gi``
one per sample, so ``log L`` has variance ``sigma**2`` (before the cap) and the
covariance of two samples of a group is ``sigma_p**2``. The cap is fixed at
step 0's median (it is the run's ``max_new_tokens``): as the median drifts up,
more samples hit it, as on a real run.

Prompt lengths: ``round(prompt_tokens x exp(prompt_sigma x z))``, one per prompt.

Reward and tool latency (seconds), abandoned at ``timeout_s``::

    t = min(median_s x exp(sigma x z), timeout_s);  t = timeout_s with probability timeout_p
    timed_out = (t >= timeout_s)

Trainer step time: ``step_s + s_per_token x tokens`` (``c0 + c1 x tokens``).

Multi-turn samples (``turns = k > 1``): a completion of ``L`` tokens is split
into ``k`` segments as evenly as possible (:func:`split_turns`); between two
segments a tool call runs (latency as above), and each later segment first
prefills the tool's ``output_tokens`` (the earlier context is in the prefix cache).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from freshroll.sim.profiles import LengthModel, RewardModel, ToolModel, TrainerModel

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def drift_factor(lengths: LengthModel, step: int) -> float:
    """``m(s) / m(0)``: linear from 1 at step 0 to ``1 + drift`` at ``drift_steps``, then flat."""
    ramp = min(max(step, 0), lengths.drift_steps) / lengths.drift_steps
    return 1.0 + lengths.drift * ramp


def median_tokens(lengths: LengthModel, step: int) -> float:
    """The median completion length ``m(s)`` at policy step ``step`` (before the cap)."""
    return lengths.median_tokens * drift_factor(lengths, step)


def length_cap(lengths: LengthModel) -> int:
    """``max_new_tokens``: ``floor(cap_multiple x median_tokens)``, at least 1."""
    return max(1, int(lengths.cap_multiple * lengths.median_tokens))


def completion_lengths(
    rng: np.random.Generator, lengths: LengthModel, groups: int, group_size: int, step: int = 0
) -> IntArray:
    """Lengths of ``groups x group_size`` completions, shape ``(groups, group_size)``."""
    if groups < 0 or group_size < 1:
        raise ValueError(f"need groups >= 0 and group_size >= 1, got {groups}, {group_size}")
    z_g = rng.standard_normal(groups)
    z_gi = rng.standard_normal((groups, group_size))
    return lengths_from_normals(lengths, z_g, z_gi, step)


def lengths_from_normals(
    lengths: LengthModel, z_g: FloatArray, z_gi: FloatArray, step: int = 0
) -> IntArray:
    """The length formula applied to given standard normals: ``z_g`` of shape ``(groups,)``,
    ``z_gi`` of shape ``(groups, group_size)``.

    An engine draws a group's normals when the group is created (keyed by its
    index, so they do not depend on scheduling) and applies the step of the
    policy that generates it.
    """
    sigma_p = lengths.sigma * np.sqrt(lengths.prompt_share)
    sigma_s = lengths.sigma * np.sqrt(1.0 - lengths.prompt_share)
    raw = median_tokens(lengths, step) * np.exp(sigma_p * z_g[:, None] + sigma_s * z_gi)
    out: IntArray = np.clip(np.rint(raw), 1, length_cap(lengths)).astype(np.int64)
    return out


def length_of(lengths: LengthModel, z_g: float, z_gi: float, step: int = 0) -> int:
    """:func:`lengths_from_normals` for one sample (scalar, for an engine's hot path)."""
    sigma_p = lengths.sigma * math.sqrt(lengths.prompt_share)
    sigma_s = lengths.sigma * math.sqrt(1.0 - lengths.prompt_share)
    raw = median_tokens(lengths, step) * math.exp(sigma_p * z_g + sigma_s * z_gi)
    return int(min(max(round(raw), 1), length_cap(lengths)))


def prompt_length_of(lengths: LengthModel, z: float) -> int:
    """One prompt length from a standard normal ``z`` (scalar :func:`prompt_lengths`)."""
    return round(lengths.prompt_tokens * math.exp(lengths.prompt_sigma * z))


def latency_of(median_s: float, sigma: float, timeout_s: float, z: float, hang: bool) -> float:
    """One reward or tool latency (scalar ``_timed_latency``): ``timeout_s`` when it hangs."""
    return timeout_s if hang else min(median_s * math.exp(sigma * z), timeout_s)


def prompt_lengths(rng: np.random.Generator, lengths: LengthModel, groups: int) -> IntArray:
    """One prompt length per group (tokens, >= 0)."""
    z = rng.standard_normal(groups)
    return np.rint(lengths.prompt_tokens * np.exp(lengths.prompt_sigma * z)).astype(np.int64)


def _timed_latency(
    rng: np.random.Generator, median_s: float, sigma: float, timeout_p: float, timeout_s: float,
    n: int,
) -> tuple[FloatArray, BoolArray]:
    z = rng.standard_normal(n)
    hang = rng.random(n) < timeout_p
    t = np.minimum(median_s * np.exp(sigma * z), timeout_s)
    t[hang] = timeout_s
    return t, t >= timeout_s


def reward_latency(
    rng: np.random.Generator, reward: RewardModel, n: int
) -> tuple[FloatArray, BoolArray]:
    """``(seconds, timed_out)`` for ``n`` reward calls."""
    return _timed_latency(rng, reward.median_s, reward.sigma, reward.timeout_p, reward.timeout_s, n)


def tool_latency(
    rng: np.random.Generator, tools: ToolModel, n: int
) -> tuple[FloatArray, BoolArray]:
    """``(seconds, timed_out)`` for ``n`` tool calls."""
    return _timed_latency(rng, tools.median_s, tools.sigma, tools.timeout_p, tools.timeout_s, n)


def trainer_step_s(trainer: TrainerModel, tokens: int) -> float:
    """Seconds one trainer step takes on a batch of ``tokens`` tokens: ``c0 + c1 x tokens``."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return trainer.step_s + trainer.s_per_token * tokens


def split_turns(length: int, turns: int) -> list[int]:
    """``length`` tokens over ``turns`` segments, as evenly as possible, each >= 1 token.

    The first ``length mod k`` segments get one token more; a completion shorter
    than ``turns`` has fewer segments (one token each): the model stopped early.
    """
    if length < 1 or turns < 1:
        raise ValueError(f"need length >= 1 and turns >= 1, got {length}, {turns}")
    k = min(turns, length)
    q, r = divmod(length, k)
    return [q + 1] * r + [q] * (k - r)

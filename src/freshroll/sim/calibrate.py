"""Calibration figures of a profile: how long-tailed its lengths and rollout latencies are.

:func:`calibrate` draws ``samples`` rollouts (``groups x group_size``) of a
profile at policy step ``step`` and measures, each figure computed here only:

- ``length_p50``, ``length_p99``, ``length_p99_p50``: completion lengths (tokens);
- ``cap_hit_rate``: share of completions cut at ``max_new_tokens`` (the cap);
- ``latency_p50``, ``latency_p99``, ``latency_p99_p50``: a rollout's *service
  latency*, alone on a server (no queueing, decoder idle)::

      latency = sum over turns k of (prefill_s_per_token x prompt_k + L_k x (t0 + t1))
                + sum of the tool-call latencies between turns

- ``tail_share``: share of the total service latency taken by the slowest 10%
  of rollouts, ``sum(top 10% latencies) / sum(latencies)``;
- ``phase_tail``: a synchronous rollout phase: the rollouts are cut into phases of
  ``max_concurrent`` (one server's slots), each phase starts all its rollouts at
  t = 0 on a fresh server (:func:`~freshroll.sim.timelines.simulate_rollouts`),
  and ``phase_tail`` is the mean over phases of ``(T_100 - T_90) / T_100``: the
  share of the phase's wall time spent waiting for its slowest 10% (``T_q`` is the
  time by which a share ``q`` of its rollouts finished; the issue's "the slowest
  10% of requests can take half of a rollout phase");
- ``tool_timeout_rate``: share of tool calls that timed out (P3; 0 without tools).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from freshroll.sim.draws import (
    FloatArray,
    completion_lengths,
    length_cap,
    prompt_lengths,
    split_turns,
    tool_latency,
)
from freshroll.sim.profiles import Profile
from freshroll.sim.timelines import Rollout, simulate_batch, simulate_rollouts

TAIL = 0.10  # the slowest share whose weight the tail figures measure


@dataclass(frozen=True, slots=True)
class Calibration:
    """The figures :func:`calibrate` measured (lengths in tokens, latencies in seconds)."""

    profile: str
    samples: int
    step: int
    length_p50: float
    length_p99: float
    length_p99_p50: float
    cap_hit_rate: float
    latency_p50: float
    latency_p99: float
    latency_p99_p50: float
    tail_share: float
    phase_tail: float
    tool_timeout_rate: float


def tail_share(latencies: FloatArray, tail: float = TAIL) -> float:
    """``sum`` of the slowest ``ceil(tail x n)`` latencies over the ``sum`` of all of them."""
    n = len(latencies)
    k = max(1, math.ceil(tail * n))
    ordered = np.sort(latencies)
    return float(ordered[n - k:].sum() / ordered.sum())


def phase_tail(finish: FloatArray, tail: float = TAIL) -> float:
    """``(T_100 - T_(1-tail)) / T_100`` of one phase that started at t = 0."""
    ordered = np.sort(finish)
    n = len(ordered)
    k = max(1, math.ceil(tail * n))
    t_end = float(ordered[-1])
    return (t_end - float(ordered[n - k - 1])) / t_end if n > k and t_end > 0 else 0.0


def calibrate(
    profile: Profile, *, samples: int = 8192, group_size: int = 8, seed: int = 0, step: int = 0
) -> Calibration:
    """Draw ``samples`` rollouts of ``profile`` (seeded) and measure its calibration figures."""
    if samples < group_size or samples % group_size:
        raise ValueError(f"samples ({samples}) must be a positive multiple of group_size")
    rng = np.random.default_rng(seed)
    lp, server, tools = profile.lengths, profile.server, profile.tools
    groups = samples // group_size
    lengths = completion_lengths(rng, lp, groups, group_size, step).ravel()
    prompts = np.repeat(prompt_lengths(rng, lp, groups), group_size)
    tool_s, tool_to = tool_latency(rng, tools, samples * (tools.turns - 1))
    tool_s = tool_s.reshape(samples, tools.turns - 1)
    tool_to = tool_to.reshape(samples, tools.turns - 1)

    per_token = server.step_s + server.step_s_per_seq
    rollouts: list[Rollout] = []
    latency = np.empty(samples)
    calls = timeouts = 0
    for i in range(samples):
        segments = split_turns(int(lengths[i]), tools.turns)
        k = len(segments)
        turns = tuple(
            (int(prompts[i]) if j == 0 else tools.output_tokens, seg)
            for j, seg in enumerate(segments)
        )
        waits = tuple(float(x) for x in tool_s[i, : k - 1])
        calls += k - 1
        timeouts += int(tool_to[i, : k - 1].sum())
        rollouts.append(Rollout(0.0, turns, waits))
        prefill = sum(p for p, _ in turns) * server.prefill_s_per_token
        latency[i] = prefill + int(lengths[i]) * per_token + sum(waits)

    tails: list[float] = []
    size = server.max_concurrent
    for lo in range(0, samples, size):
        phase = rollouts[lo: lo + size]
        if tools.turns == 1:
            finish = simulate_batch(
                server, np.zeros(len(phase)), [r.turns[0][0] for r in phase],
                [r.turns[0][1] for r in phase],
            ).finish
        else:
            finish = simulate_rollouts(server, phase).finish
        tails.append(phase_tail(finish))

    l50, l99 = (float(x) for x in np.quantile(lengths, [0.5, 0.99]))
    t50, t99 = (float(x) for x in np.quantile(latency, [0.5, 0.99]))
    return Calibration(
        profile=profile.name, samples=samples, step=step,
        length_p50=l50, length_p99=l99, length_p99_p50=l99 / l50,
        cap_hit_rate=float(np.mean(lengths >= length_cap(lp))),
        latency_p50=t50, latency_p99=t99, latency_p99_p50=t99 / t50,
        tail_share=tail_share(latency), phase_tail=float(np.mean(tails)),
        tool_timeout_rate=timeouts / calls if calls else 0.0,
    )


def markdown_table(calibrations: Sequence[Calibration]) -> str:
    """The calibration figures as the Markdown table in docs/simulation.md."""
    head = (
        "| profile | step | samples | length p50 | length p99/p50 | cap hit | latency p50 (s) "
        "| latency p99/p50 | tail share | phase tail | tool timeouts |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [
        f"| {c.profile} | {c.step} | {c.samples} | {c.length_p50:.0f} | {c.length_p99_p50:.2f} "
        f"| {c.cap_hit_rate:.2%} | {c.latency_p50:.1f} | {c.latency_p99_p50:.2f} "
        f"| {c.tail_share:.3f} | {c.phase_tail:.3f} | {c.tool_timeout_rate:.2%} |"
        for c in calibrations
    ]
    return "\n".join([head, *rows])

"""Whole timelines off the continuous batcher: known arrivals in, every request's times out.

:func:`simulate_batch` submits a batch of single-turn requests (ties in arrival: input
order) and runs the :class:`~freshroll.sim.batching.ContinuousBatcher` to its end;
:func:`simulate_rollouts` runs multi-turn rollouts, each later turn arriving when the tool
call after the previous one returns (the slot is released during the tool call). Both drive
the batcher exactly as a simulated engine on a clock does, so their times are the engine's
(:mod:`freshroll.sim.calibrate` fits the profiles with them; the tests hold the two equal).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from freshroll.sim.batching import ContinuousBatcher
from freshroll.sim.profiles import ServerModel

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class BatchTimes:
    """Per-request timelines, indexed like the inputs of :func:`simulate_batch`."""

    start: FloatArray
    decode_start: FloatArray
    finish: FloatArray


def simulate_batch(server: ServerModel, arrivals: Sequence[float] | FloatArray,
                   prompt_tokens: Sequence[int] | npt.NDArray[np.int64],
                   completion_tokens: Sequence[int] | npt.NDArray[np.int64]) -> BatchTimes:
    """Start, decode-start and finish time of every request (ties in arrival: input order)."""
    arr = np.asarray(arrivals, dtype=np.float64)
    prompts = np.asarray(prompt_tokens, dtype=np.int64)
    lengths = np.asarray(completion_tokens, dtype=np.int64)
    if not (arr.shape == prompts.shape == lengths.shape) or arr.ndim != 1:
        raise ValueError("arrivals, prompt_tokens and completion_tokens must be 1-d, equal length")
    order = np.argsort(arr, kind="stable")
    batcher = ContinuousBatcher(server)
    for i in order.tolist():
        batcher.submit(float(arr[i]), int(prompts[i]), int(lengths[i]))
    n = len(arr)
    start, decode_start, finish = np.empty(n), np.empty(n), np.empty(n)
    for f in batcher.advance(math.inf):
        i = int(order[f.request])
        start[i], decode_start[i], finish[i] = f.start, f.decode_start, f.finish
    return BatchTimes(start, decode_start, finish)


@dataclass(frozen=True)
class Rollout:
    """A sample of one or more turns: ``turns[k] = (prompt_tokens, completion_tokens)``; a tool
    call of ``tool_s[k]`` seconds runs between turn ``k`` and ``k + 1``."""

    arrival: float
    turns: tuple[tuple[int, int], ...]
    tool_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.turns or len(self.tool_s) != len(self.turns) - 1:
            raise ValueError(f"a rollout needs >= 1 turn and one tool latency between two "
                             f"turns, got {len(self.turns)} turns and {len(self.tool_s)}")


@dataclass(frozen=True)
class RolloutTimes:
    """Per-rollout start (first turn's slot) and finish (last turn's end), input order."""

    start: FloatArray
    finish: FloatArray


def simulate_rollouts(server: ServerModel, rollouts: Sequence[Rollout]) -> RolloutTimes:
    """Multi-turn rollouts on one server: each later turn arrives when the tool call after the
    previous turn returns (the slot is released during the tool call).

    It drives a :class:`ContinuousBatcher` exactly as a simulated engine on a clock would.
    """
    pending: list[tuple[float, int, int, int]] = []  # (arrival, order, rollout, turn)
    for i, r in enumerate(rollouts):
        heapq.heappush(pending, (r.arrival, i, i, 0))
    counter = n = len(rollouts)
    start, finish = np.full(n, math.nan), np.full(n, math.nan)
    owner: dict[int, tuple[int, int]] = {}
    batcher = ContinuousBatcher(server)
    while pending or batcher.busy:
        t_event = batcher.next_event_time()
        t_submit = pending[0][0] if pending else math.inf
        if t_event is not None and t_event <= t_submit:
            for f in batcher.advance(t_event):
                i, k = owner.pop(f.request)
                r = rollouts[i]
                if k == 0:
                    start[i] = f.start
                if k + 1 < len(r.turns):
                    heapq.heappush(pending, (f.finish + r.tool_s[k], counter, i, k + 1))
                    counter += 1
                else:
                    finish[i] = f.finish
        else:
            arrival, _, i, k = heapq.heappop(pending)
            batcher.advance(arrival)
            prompt, tokens = rollouts[i].turns[k]
            owner[batcher.submit(arrival, prompt, tokens)] = (i, k)
    return RolloutTimes(start, finish)


__all__ = ["BatchTimes", "FloatArray", "Rollout", "RolloutTimes", "simulate_batch",
           "simulate_rollouts"]

"""The trajectory record: a sample made of several segments (model turns, environment turns).

A single-turn rollout is one model segment: its :class:`~freshroll.engines.base.Completion`
is what the engine returned, and nothing here changes it. A multi-turn episode (a tool-using
agent, a game) is a list of :class:`Segment`\\ s after the prompt, each with its own token ids:

* a ``model`` segment holds tokens the policy sampled, their behaviour log-probabilities and
  the load ordinals of the weights that sampled them (``version_spans``, as an engine reports
  them): it is trained on;
* an ``env`` segment holds tokens the environment or a tool wrote (its output, tokenised
  once by the engine's tokenizer when it was produced): it is context for the next model
  turn, never trained on (log-probabilities 0.0, loss mask 0).

:func:`assemble` folds them into one ``Completion``: ``token_ids`` and ``logprobs`` are the
segments' concatenated, ``loss_mask`` the run-length ``(trained, tokens)`` ranges (1: a model
token, 0: an environment token), ``turns`` one :class:`Turn` per segment (what the ledger's
payload records: kind, tokens, seconds, the tool call and its outcome). Rows are rebuilt from
the token ids of each call, never by re-tokenising text (token-in / token-out), so the trainer
scores exactly the tokens that were sampled.

Guarantees: ``len(token_ids) == len(logprobs) == sum of the mask's tokens == sum of the
turns' tokens``; a trajectory of one model segment assembles to a completion with an empty
``loss_mask`` and no ``turns`` (the single-turn record, byte for byte).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from freshroll.engines.base import Completion

SegmentKind = Literal["model", "env"]

#: a tool call's outcome: ``ok`` (a result), ``error`` (the tool refused the input: a result
#: the model reads, e.g. a malformed expression); an infrastructure failure (timeout, crash)
#: is no turn at all: the sample is discarded ``tool_error``
ToolOutcome = Literal["ok", "error"]


@dataclass(frozen=True, slots=True)
class Segment:
    """One turn of an episode: model tokens (trained) or environment tokens (context)."""

    kind: SegmentKind
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()  # a model turn's behaviour log-probs; env: none
    version_spans: tuple[tuple[int, int], ...] = ()  # a model turn's (load ordinal, tokens)
    seconds: float = 0.0  # generation time (model) or tool latency (env)
    call: str = ""  # env: the tool call this turn answers (``calc:3+4``)
    outcome: str = ""  # env: its ToolOutcome


class Turn(NamedTuple):
    """What the ledger records of one segment (in the payload, as an array)."""

    kind: str  # SegmentKind
    tokens: int
    seconds: float
    call: str = ""
    outcome: str = ""


def model_segment(c: Completion) -> Segment:
    """A model turn from the engine's completion of that turn."""
    return Segment("model", c.token_ids, c.logprobs, c.version_spans, c.gen_s)


def env_segment(token_ids: Sequence[int], seconds: float, call: str, outcome: str) -> Segment:
    """An environment turn: the tool's output tokens, its latency, the call, its outcome."""
    return Segment("env", tuple(token_ids), (0.0,) * len(token_ids), (), seconds, call,
                   outcome)


def mask_ranges(segments: Sequence[Segment]) -> tuple[tuple[int, int], ...]:
    """Run-length ``(trained, tokens)`` of the segments: 1 for model tokens, 0 for env."""
    out: list[tuple[int, int]] = []
    for s in segments:
        bit = 1 if s.kind == "model" else 0
        if not s.token_ids:
            continue
        if out and out[-1][0] == bit:
            out[-1] = (bit, out[-1][1] + len(s.token_ids))
        else:
            out.append((bit, len(s.token_ids)))
    return tuple(out)


def expand_mask(ranges: Sequence[tuple[int, int]], n: int) -> list[float]:
    """One loss weight per token (1.0 trained, 0.0 not) from run-length ranges; empty
    ranges: every one of the ``n`` tokens is trained (the single-turn case)."""
    if not ranges:
        return [1.0] * n
    out = [float(bit) for bit, k in ranges for _ in range(k)][:n]
    return out + [1.0] * (n - len(out))


def trained_tokens(ranges: Sequence[tuple[int, int]], n: int) -> int:
    """How many of ``n`` tokens get loss under ``ranges`` (all of them when empty)."""
    return n if not ranges else int(sum(expand_mask(ranges, n)))


def _spans(segments: Sequence[Segment]) -> tuple[tuple[int, int], ...]:
    """The episode's load ordinals per token: each model turn's spans; an env turn (and a
    model turn that reported none) takes the ordinal of the tokens before it. Empty when no
    turn reported any (every token of the weights the call started under)."""
    if not any(s.version_spans for s in segments if s.kind == "model"):
        return ()
    first = next(s.version_spans[0][0] for s in segments if s.version_spans)
    out: list[tuple[int, int]] = []
    current = first
    for s in segments:
        spans = s.version_spans if s.kind == "model" and s.version_spans else (
            ((current, len(s.token_ids)),))
        for k, n in spans:
            current = k
            if out and out[-1][0] == k:
                out[-1] = (k, out[-1][1] + n)
            elif n:
                out.append((k, n))
    return tuple(out)


def assemble(prompt_ids: Sequence[int], segments: Sequence[Segment], text: str,
             finish_reason: str) -> Completion:
    """One completion of an episode's segments (the module docstring); ``text`` is what the
    rewards score (the final answer), ``finish_reason`` the last model turn's."""
    if len(segments) == 1 and segments[0].kind == "model":
        s = segments[0]
        return Completion(tuple(prompt_ids), s.token_ids, s.logprobs, text, finish_reason,
                          s.seconds, version_spans=s.version_spans)
    tokens: list[int] = []
    logprobs: list[float] = []
    for s in segments:
        tokens.extend(s.token_ids)
        logprobs.extend(s.logprobs if s.kind == "model" else (0.0,) * len(s.token_ids))
    turns = tuple(Turn(s.kind, len(s.token_ids), s.seconds, s.call, s.outcome)
                  for s in segments)
    return Completion(
        tuple(prompt_ids), tuple(tokens), tuple(logprobs), text, finish_reason,
        sum(s.seconds for s in segments), version_spans=_spans(segments),
        loss_mask=mask_ranges(segments), turns=turns,
    )


__all__ = [
    "Segment", "SegmentKind", "ToolOutcome", "Turn", "assemble", "env_segment", "expand_mask",
    "mask_ranges", "model_segment", "trained_tokens",
]

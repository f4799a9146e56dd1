"""Sample bias: do the samples the trainer accepted differ from the samples generated?

Discarding stale samples starves slow prompts: long completions outlive the freshness window
more often, and hard prompts tend to produce long completions. Throughput and lag cannot show
it; this fold compares the **accepted** samples (committed) with every **generated** sample
that reached an outcome (committed, or discarded for a counted reason: not ``fenced``, whose
request is re-issued, nor ``shutdown``, which says nothing about the sample)::

    length_bias       mean tokens(accepted) / mean tokens(generated) - 1
                      (< 0: short completions over-represented among the accepted)
    reward_bias       (mean reward(accepted) - mean reward(generated)) / std reward(generated)
                      (over the samples that were scored; None when the std is 0)
    prompt_coverage   prompts with an accepted sample / prompts with a generated one
    version_tv        total variation distance between the generating policy steps of the
                      accepted and of the generated samples (0: the same version mix)
    easy_prompt_bias  per-prompt difficulty, measured on the data itself: each prompt's mean
                      reward over all its scored samples; (mean of it over the accepted
                      samples - over the generated) / its std across prompts (> 0: easy
                      prompts favoured; None with fewer than two prompts or no spread)
    divergence        max(|length_bias|, |reward_bias|, 1 - prompt_coverage, version_tv,
                      |easy_prompt_bias|)
                      over the figures that exist; ``flagged``: the figures above
                      ``monitor.bias_threshold`` (the config of the run's ledger)

With no counted discard the two populations are the same and every figure is 0 (coverage
1). ``over_time`` repeats the figures per window of trainer steps: at most
:data:`WINDOWS` windows of equal step ranges, each over the samples whose outcome fell in
it (the step count when the sample was committed or discarded). The figures are the
ledger's alone, so ``verify`` recomputes them with ``summary.json``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final, NamedTuple

from freshroll.events import (
    Committed,
    Discarded,
    Generated,
    Requested,
    Rewarded,
    RunConfig,
    Started,
)
from freshroll.lineage import group_of, policy_step, request_of
from freshroll.metrics import UNCOUNTED_DISCARD_REASONS

#: the default of ``monitor.bias_threshold`` (a ledger of an older run has none)
DEFAULT_THRESHOLD: Final = 0.1
#: windows of ``over_time``, at most
WINDOWS: Final = 10


class Outcome(NamedTuple):
    """One generated sample that reached an outcome."""

    step: int  # committed steps when it ended
    accepted: bool
    tokens: int
    reward: float | None
    prompt: str
    version_step: int | None  # the generating policy's step


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def figures(outcomes: Sequence[Outcome], threshold: float = DEFAULT_THRESHOLD
            ) -> dict[str, Any]:
    """The module's figures over ``outcomes`` (None where a population is empty)."""
    acc = [o for o in outcomes if o.accepted]
    out: dict[str, Any] = {"generated": len(outcomes), "accepted": len(acc),
                           "length_bias": None, "reward_bias": None,
                           "prompt_coverage": None, "version_tv": None,
                           "easy_prompt_bias": None}
    if acc:
        gen_len = _mean([o.tokens for o in outcomes])
        acc_len = _mean([o.tokens for o in acc])
        if gen_len and acc_len is not None:
            out["length_bias"] = acc_len / gen_len - 1
        scored = [o.reward for o in outcomes if o.reward is not None]
        acc_scored = [o.reward for o in acc if o.reward is not None]
        if len(scored) >= 2 and acc_scored:
            sd = statistics.pstdev(scored)
            if sd > 0:
                out["reward_bias"] = (statistics.fmean(acc_scored) - statistics.fmean(scored)) / sd
        out["version_tv"] = _tv([o.version_step for o in acc], [o.version_step for o in outcomes])
        out["easy_prompt_bias"] = _easy_prompt_bias(outcomes)
    if outcomes:
        prompts = {o.prompt for o in outcomes}
        out["prompt_coverage"] = len({o.prompt for o in acc}) / len(prompts)
    parts = {"length_bias": _abs(out["length_bias"]), "reward_bias": _abs(out["reward_bias"]),
             "prompt_coverage": None if out["prompt_coverage"] is None
             else 1 - out["prompt_coverage"], "version_tv": out["version_tv"],
             "easy_prompt_bias": _abs(out["easy_prompt_bias"])}
    there = {k: v for k, v in parts.items() if v is not None}
    out["divergence"] = max(there.values()) if there else None
    out["flagged"] = sorted(k for k, v in there.items() if v > threshold)
    return out


def _easy_prompt_bias(outcomes: Sequence[Outcome]) -> float | None:
    """How much easier the accepted samples' prompts were than the generated samples'
    (the module's formula): None without two scored prompts or without a spread."""
    by_prompt: dict[str, list[float]] = {}
    for o in outcomes:
        if o.reward is not None:
            by_prompt.setdefault(o.prompt, []).append(o.reward)
    if len(by_prompt) < 2:
        return None
    ease = {p: statistics.fmean(r) for p, r in by_prompt.items()}
    sd = statistics.pstdev(ease.values())
    scored = [o for o in outcomes if o.reward is not None]
    accepted = [ease[o.prompt] for o in scored if o.accepted]
    if sd <= 0 or not accepted:
        return None
    return (statistics.fmean(accepted) - statistics.fmean(ease[o.prompt] for o in scored)) / sd


def _abs(x: float | None) -> float | None:
    return None if x is None else abs(x)


def _tv(a: Sequence[int | None], b: Sequence[int | None]) -> float | None:
    """Total variation distance between the distributions of ``a`` and ``b``."""
    if not a or not b:
        return None
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


def windows(outcomes: Sequence[Outcome], steps: int, threshold: float = DEFAULT_THRESHOLD,
            n: int = WINDOWS) -> list[dict[str, Any]]:
    """:func:`figures` per window of trainer steps: ``min(n, steps)`` windows of equal step
    ranges ``(from_step, to_step]``; a sample ending after the last commit joins the last."""
    if steps <= 0 or not outcomes:
        return []
    k = min(n, steps)
    edges = [round(steps * (i + 1) / k) for i in range(k)]
    out, lo = [], 0
    for hi in edges:
        last = hi == edges[-1]
        part = [o for o in outcomes if lo <= o.step < hi or (last and o.step >= hi)]
        out.append({"from_step": lo, "to_step": hi, **figures(part, threshold)})
        lo = hi
    return out


class SampleBias:
    """The module's figures, one event at a time (``feed``); :meth:`result` at any point."""

    KINDS: ClassVar = (RunConfig, Requested, Started, Generated, Rewarded, Committed,
                       Discarded)

    def __init__(self) -> None:
        self.threshold = DEFAULT_THRESHOLD
        self.steps = 0
        self.prompt: dict[str, str] = {}  # group -> prompt id
        self.version: dict[str, int | None] = {}  # sample -> generating policy step
        self.tokens: dict[str, int] = {}
        self.reward: dict[str, float] = {}
        self.outcomes: list[Outcome] = []

    def feed(self, e: Any) -> None:
        if isinstance(e, Started):
            self.version[e.sample] = _step(e.version)
        elif isinstance(e, Generated):
            self.tokens[e.sample] = e.tokens
        elif isinstance(e, Rewarded):
            self.reward[e.sample] = e.reward
        elif isinstance(e, Committed):
            for s in e.samples:
                self._end(s, accepted=True)
            self.steps += 1
        elif isinstance(e, Discarded):
            if e.sample is None:
                return
            if e.reason in UNCOUNTED_DISCARD_REASONS:
                self._forget(e.sample)
            else:
                self._end(e.sample, accepted=False)
        elif isinstance(e, Requested):
            self.prompt[e.group] = e.prompt_id
        elif isinstance(e, RunConfig):
            self.threshold = _threshold(e.config)

    def _forget(self, sample: str) -> None:
        self.version.pop(sample, None)
        self.tokens.pop(sample, None)
        self.reward.pop(sample, None)

    def _end(self, sample: str, *, accepted: bool) -> None:
        tokens = self.tokens.pop(sample, None)
        version = self.version.pop(sample, None)
        reward = self.reward.pop(sample, None)
        if tokens is None:  # never generated (discarded before it ran): not a sample
            return
        prompt = self.prompt.get(group_of(request_of(sample)), "")
        self.outcomes.append(Outcome(self.steps, accepted, tokens, reward, prompt, version))

    def result(self) -> dict[str, Any]:
        return {"threshold": self.threshold, **figures(self.outcomes, self.threshold),
                "over_time": windows(self.outcomes, self.steps, self.threshold)}


def _step(version: str) -> int | None:
    try:
        return policy_step(version)
    except (ValueError, TypeError):
        return None


def _threshold(config: str) -> float:
    """``monitor.bias_threshold`` of a ``run_config`` event's config (the default when the
    config predates it or cannot be read)."""
    try:
        value = json.loads(config).get("monitor", {}).get("bias_threshold")
    except (ValueError, AttributeError):
        return DEFAULT_THRESHOLD
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else DEFAULT_THRESHOLD


def sample_bias(events: Iterable[Any]) -> dict[str, Any]:
    """The figures of a whole event history (:class:`SampleBias`)."""
    fold = SampleBias()
    for e in events:
        fold.feed(e)
    return fold.result()


def render(bias: dict[str, Any] | None) -> str:
    """One line for the end of a run: the flagged figures (empty: none flagged)."""
    if not bias or not bias.get("flagged"):
        return ""
    parts = []
    for k in bias["flagged"]:
        v = bias[k]
        parts.append(f"prompt coverage {v:.1%}" if k == "prompt_coverage"
                     else f"{k.replace('_', ' ')} {v:+.3f}")
    return (f"sample bias: the accepted samples differ from those generated "
            f"({', '.join(parts)}; monitor.bias_threshold {bias['threshold']:g}): "
            "discards favoured some samples over others (report: Discards)")


__all__ = ["DEFAULT_THRESHOLD", "WINDOWS", "Outcome", "SampleBias", "figures", "render",
           "sample_bias", "windows"]

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

The same fold gives ``summary.json``'s ``discard_bias`` (:meth:`SampleBias.by_outcome`: each
outcome's count, mean reward and mean length, ``shutdown`` included), so the end-of-run pass
tracks each sample's length and reward once.

A request cancelled while it ran (``cancelled``: over-provisioning's stop at target, or a
dropped group) has no ``generated`` event: it counts among the generated samples with a
*censored* length, the longest member of its group generated before it was cancelled (it ran
at least that long when the members start together, as a group's do; a lower bound), so the
length bias of stop-at-target shows. One cancelled before any member of its group was
generated, or before it started, is no sample.

With no counted discard the two populations are the same and every figure is 0 (coverage
1). ``over_time`` repeats the figures per window of trainer steps: at most
:data:`WINDOWS` windows of equal step ranges, each over the samples whose outcome fell in
it (the step count when the sample was committed or discarded). The figures are the
ledger's alone, so ``verify`` recomputes them with ``summary.json``.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final, NamedTuple

from freshroll.figures.tally import UNCOUNTED_DISCARD_REASONS
from freshroll.ledger.events import (
    Committed,
    Discarded,
    Generated,
    Requested,
    Rewarded,
    RunConfig,
    Started,
)
from freshroll.ledger.lineage import group_of, policy_step, request_of

#: the default of ``monitor.bias_threshold`` (a ledger of an older run has none)
DEFAULT_THRESHOLD: Final = 0.1
#: windows of ``over_time``, at most
WINDOWS: Final = 10
#: the outcome of an accepted sample (the others: their discard reason)
COMMITTED: Final = "committed"


class Outcome(NamedTuple):
    """One generated sample that reached an outcome."""

    step: int  # committed steps when it ended
    accepted: bool
    tokens: int
    reward: float | None
    prompt: str
    version_step: int | None  # the generating policy's step
    reason: str = COMMITTED  # or the discard reason that ended it


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
    parts: list[list[Outcome]] = [[] for _ in edges]
    for o in outcomes:  # one pass: each outcome to its window (past the last: the last)
        parts[min(bisect.bisect_right(edges, o.step), k - 1)].append(o)
    return [{"from_step": lo, "to_step": hi, **figures(part, threshold)}
            for lo, hi, part in zip([0, *edges[:-1]], edges, parts, strict=True)]


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
        self.longest: dict[str, int] = {}  # group -> its longest generated member (censoring)
        self.reward: dict[str, float] = {}
        self.outcomes: list[Outcome] = []

    def feed(self, e: Any) -> None:
        if isinstance(e, Started):
            self.version[e.sample] = _step(e.version)
        elif isinstance(e, Generated):
            self.tokens[e.sample] = e.tokens
            g = group_of(request_of(e.sample))
            self.longest[g] = max(e.tokens, self.longest.get(g, 0))
        elif isinstance(e, Rewarded):
            self.reward[e.sample] = e.reward
        elif isinstance(e, Committed):
            for s in e.samples:
                self._end(s, accepted=True, reason=COMMITTED)
            self.steps += 1
        elif isinstance(e, Discarded):
            if e.sample is None:
                return
            if e.reason == "fenced":  # re-issued under a new attempt: this one is no outcome
                self._forget(e.sample)
            elif e.reason == "cancelled" and e.sample in self.version \
                    and e.sample not in self.tokens:  # cut while running: censored length
                longest = self.longest.get(group_of(e.request))
                if longest is not None:
                    self.tokens[e.sample] = longest
                self._end(e.sample, accepted=False, reason=e.reason)
            else:
                self._end(e.sample, accepted=False, reason=e.reason)
        elif isinstance(e, Requested):
            self.prompt[e.group] = e.prompt_id
        elif isinstance(e, RunConfig):
            self.threshold = _threshold(e.config)

    def _forget(self, sample: str) -> None:
        self.version.pop(sample, None)
        self.tokens.pop(sample, None)
        self.reward.pop(sample, None)

    def _end(self, sample: str, *, accepted: bool, reason: str) -> None:
        tokens = self.tokens.pop(sample, None)
        version = self.version.pop(sample, None)
        reward = self.reward.pop(sample, None)
        if tokens is None:  # never generated (discarded before it ran): not a sample
            return
        prompt = self.prompt.get(group_of(request_of(sample)), "")
        self.outcomes.append(Outcome(self.steps, accepted, tokens, reward, prompt, version,
                                     reason))

    def result(self) -> dict[str, Any]:
        """The module's figures, over the outcomes that count (a ``shutdown`` discard says
        nothing about its sample)."""
        counted = [o for o in self.outcomes if o.reason not in UNCOUNTED_DISCARD_REASONS]
        return {"threshold": self.threshold, **figures(counted, self.threshold),
                "over_time": windows(counted, self.steps, self.threshold)}

    def by_outcome(self) -> dict[str, dict[str, Any]]:
        """``summary.json``'s ``discard_bias``: per outcome (``committed``, then each discard
        reason, ``shutdown`` included, in the order first seen) the samples' count, mean
        reward (over those scored) and mean length."""
        groups: dict[str, tuple[list[float], list[int]]] = {COMMITTED: ([], [])}
        for o in self.outcomes:
            rewards, lengths = groups.setdefault(o.reason, ([], []))
            lengths.append(o.tokens)
            if o.reward is not None:
                rewards.append(o.reward)
        return {name: {"n": len(lengths),  # plain sum / n: the figures as first defined
                       "reward_mean": sum(rewards) / len(rewards) if rewards else None,
                       "tokens_mean": sum(lengths) / len(lengths) if lengths else None}
                for name, (rewards, lengths) in groups.items()}


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

"""Off-policy distance by token lag: the lag buckets, and the fold behind the mismatch-KL and
importance-weight figures (``mismatch_kl_mean``, ``is_weight_mean``, ``is_weight_max``,
``off_policy_by_lag``).

A completion token's **lag** is the trainer step that consumes it minus the policy step that
generated it: with ``rollout.on_update: continue`` each token has its own generating version
(the payload's ``versions`` ranges); otherwise every token of a sample has the sample's
started version (the sample's lag). Tokens are counted in :data:`LAG_BUCKETS`::

    "0"   lag 0      (on-policy at the proximal step: the ratio's drift is numerical only)
    "1"   lag 1      (the one-step async of η = 1)
    "2"   lag 2
    "3+"  lag >= 3   (the long tail, together)

The learner reports per bucket ``b`` that has tokens (:func:`bucket_key`; a bucket without
tokens is absent, never 0): ``tokens/lag_<b>`` (its completion tokens),
``mismatch_kl/lag_<b>`` (the k3 KL of behaviour to proximal over them),
``is_weight_mean/lag_<b>`` and ``is_weight_max/lag_<b>`` (the raw importance weight
``exp(p - b)``, before truncation). :class:`OffPolicy` folds each commit's learner metrics:
per step the overall figures as before, and per bucket a token-weighted sum, so a run's
bucket mean is ``Σ_steps tokens·x / Σ_steps tokens`` (the mean over the bucket's tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

#: the lag buckets, in order; the last holds every lag >= its number
LAG_BUCKETS: Final = ("0", "1", "2", "3+")
#: the first lag of the last bucket
TOP_LAG: Final = len(LAG_BUCKETS) - 1
#: the per-bucket learner metrics (``<name>/lag_<b>``); ``tokens`` weighs the others
BUCKET_METRICS: Final = ("tokens", "mismatch_kl", "is_weight_mean", "is_weight_max")


def bucket_of(lag: int) -> str:
    """The bucket of a token lag (``lag`` >= 0)."""
    return LAG_BUCKETS[min(max(lag, 0), TOP_LAG)]


def bucket_key(name: str, bucket: str) -> str:
    """The metric name of ``name`` in ``bucket``: ``mismatch_kl/lag_3+``."""
    return f"{name}/lag_{bucket}"


def is_bucket_key(key: str) -> bool:
    """Whether a learner metric is a per-bucket one."""
    return "/lag_" in key and key.split("/lag_", 1)[0] in BUCKET_METRICS


def _finite(metrics: dict[str, float | None], key: str) -> float | None:
    v = metrics.get(key)
    return v if v is not None and math.isfinite(v) else None


@dataclass
class _Bucket:
    tokens: float = 0.0
    kl_sum: float = 0.0  # Σ tokens * mismatch_kl over the steps
    w_sum: float = 0.0  # Σ tokens * is_weight_mean
    w_top: float | None = None


@dataclass
class OffPolicy:
    """The learner's off-policy metrics over the committed steps (fed by
    :class:`freshroll.figures.metrics.Tally`, one commit at a time)."""

    #: each commit's ``mismatch_kl`` and ``is_weight_mean`` (where the learner reported them)
    mismatch_kls: list[float] = field(default_factory=list)
    is_weight_means: list[float] = field(default_factory=list)
    is_weight_top: float | None = None  # the largest ``is_weight_max`` so far
    buckets: dict[str, _Bucket] = field(
        default_factory=lambda: {b: _Bucket() for b in LAG_BUCKETS})

    def committed(self, metrics: dict[str, float | None]) -> None:
        for key, into in (("mismatch_kl", self.mismatch_kls),
                          ("is_weight_mean", self.is_weight_means)):
            v = _finite(metrics, key)
            if v is not None:
                into.append(v)
        self.is_weight_top = _top(self.is_weight_top, _finite(metrics, "is_weight_max"))
        for b, acc in self.buckets.items():
            n = _finite(metrics, bucket_key("tokens", b))
            kl = _finite(metrics, bucket_key("mismatch_kl", b))
            w = _finite(metrics, bucket_key("is_weight_mean", b))
            if not n or kl is None or w is None:  # no tokens of this lag in the step
                continue
            acc.tokens += n
            acc.kl_sum += n * kl
            acc.w_sum += n * w
            acc.w_top = _top(acc.w_top, _finite(metrics, bucket_key("is_weight_max", b)))

    def by_lag(self) -> dict[str, dict[str, float] | None]:
        """Per bucket ``{"tokens", "mismatch_kl_mean", "is_weight_mean", "is_weight_max"}``
        over the committed steps' tokens of that lag; None for a bucket without tokens."""
        out: dict[str, dict[str, float] | None] = {}
        for b, acc in self.buckets.items():
            out[b] = None if not acc.tokens else {
                "tokens": acc.tokens, "mismatch_kl_mean": acc.kl_sum / acc.tokens,
                "is_weight_mean": acc.w_sum / acc.tokens,
                "is_weight_max": acc.w_top if acc.w_top is not None else math.nan}
        return out


def _top(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else max(old, new)


__all__ = ["BUCKET_METRICS", "LAG_BUCKETS", "TOP_LAG", "OffPolicy", "bucket_key", "bucket_of",
           "is_bucket_key"]

"""Gradient accumulation: a step's batch as micro-batches whose gradients add up to the
whole batch's.

The batch of ``B`` sequences (``N`` completion tokens in all) is cut into ``k`` runs of
consecutive sequences (:func:`micro_slices`, sizes differing by at most one); micro-batch
``j`` has ``b_j`` sequences and ``n_j`` completion tokens. Each is run, its loss taken with
the step's aggregation (:mod:`freshroll.trainer.losses`) and the step's advantages
(computed on the whole batch, so groups never straddle a cut), and backpropagated scaled
by ``w_j`` (:func:`micro_weight`), so that ``sum_j w_j L_j`` is the whole batch's loss and
the accumulated gradient is the whole batch's gradient::

    grpo:    L_j = (1/b_j) sum_{i in j} seq_i            w_j = b_j / B
    dapo:    L_j = sum_j m L / max(1, n_j)              w_j = max(1, n_j) / max(1, N)
    dr_grpo: L_j = sum_j m L / (b_j * T_max)            w_j = b_j / B

where ``T_max`` is the whole batch's (``max_completion_len``, else the batch's width: the
caller fixes it for every micro-batch). Token-mean metrics combine the same way, by each
micro-batch's share of the tokens (:func:`combine_metrics`); the per-lag-bucket ones
(``<name>/lag_<b>``, :mod:`freshroll.figures.off_policy`) by each micro-batch's share of the
bucket's
tokens, a bucket no micro-batch has staying absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from freshroll.figures.off_policy import LAG_BUCKETS, bucket_key, is_bucket_key

Aggregation = Literal["grpo", "dr_grpo", "dapo"]

__all__ = ["combine_metrics", "micro_slices", "micro_weight"]

#: metrics of :func:`~freshroll.trainer.losses.policy_loss` that are extremes, not means
_MAX, _MIN = frozenset({"is_weight_max"}), frozenset({"is_weight_min"})


def micro_slices(n: int, k: int) -> list[slice]:
    """``n`` rows as ``min(k, n)`` consecutive runs whose sizes differ by at most one."""
    if n < 1 or k < 1:
        raise ValueError(f"need n >= 1 rows and k >= 1 micro-batches, got n={n}, k={k}")
    k = min(k, n)
    size, extra = divmod(n, k)
    out, start = [], 0
    for j in range(k):
        stop = start + size + (1 if j < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out


def micro_weight(
    aggregation: Aggregation, rows: int, tokens: float, total_rows: int, total_tokens: float
) -> float:
    """``w_j`` of the module docstring: the scale of micro-batch ``j``'s loss."""
    if aggregation == "dapo":
        return max(1.0, tokens) / max(1.0, total_tokens)
    return rows / total_rows


def combine_metrics(
    parts: Sequence[tuple[dict[str, float], float]], total_tokens: float
) -> dict[str, float]:
    """One step's loss metrics from its micro-batches' ``(metrics, tokens)``: each mean
    weighted by the micro-batch's tokens (a micro-batch without tokens adds nothing), the
    extremes as extremes over the micro-batches that have tokens. ``loss`` is left to the
    caller (the weighted sum of the micro-batch losses)."""
    if len(parts) == 1:
        return dict(parts[0][0])
    counted = [(m, n) for m, n in parts if n > 0] or [parts[0]]
    out: dict[str, float] = {}
    for key in (k for k in parts[0][0] if not is_bucket_key(k)):
        values = [m[key] for m, _ in counted]
        if key in _MAX:
            out[key] = max(values)
        elif key in _MIN:
            out[key] = min(values)
        elif total_tokens > 0:
            out[key] = sum(m[key] * n for m, n in counted) / total_tokens
        else:
            out[key] = values[0]
    out.update(_combine_buckets([m for m, _ in parts]))
    return out


def _combine_buckets(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The per-lag-bucket metrics of the whole batch from its micro-batches'."""
    out: dict[str, float] = {}
    for b in LAG_BUCKETS:
        tokens = bucket_key("tokens", b)
        having = [m for m in parts if m.get(tokens, 0.0) > 0]
        if not having:
            continue
        total = sum(m[tokens] for m in having)
        out[tokens] = total
        for name in ("mismatch_kl", "is_weight_mean"):
            key = bucket_key(name, b)
            out[key] = sum(m[key] * m[tokens] for m in having) / total
        top = bucket_key("is_weight_max", b)
        out[top] = max(m[top] for m in having)
    return out

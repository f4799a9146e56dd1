"""The report's token-lag tables: how much of each trained sample came from which policy
version (``token_lag``'s ``tokens_by_lag`` and ``older_share``, :mod:`freshroll.figures.token_lag`),
and the learner's mismatch KL and importance weights per token-lag bucket
(``off_policy_by_lag``, :mod:`freshroll.figures.off_policy`)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from freshroll.figures.off_policy import LAG_BUCKETS
from freshroll.figures.token_lag import SHARE_BINS
from freshroll.report.markup import fmt, pct, table


def token_mix(tok: Mapping[str, Any]) -> str:
    """The trained tokens by token lag and the trained samples by the share of their tokens
    that an older version than their newest token's made ("" without committed tokens)."""
    by_lag = tok.get("tokens_by_lag") or {}
    shares = tok.get("older_share") or {}
    tokens, samples = sum(by_lag.values()), sum(shares.values())
    if not tokens or not samples:
        return ""
    lags = table(("token lag", "trained tokens", "share"),
                 [(b, fmt(by_lag[b]), pct(by_lag[b] / tokens)) for b in LAG_BUCKETS
                  if b in by_lag], "num")
    mix = table(("tokens from older versions", "trained samples", "share"),
                [(escape(b), fmt(shares[b]), pct(shares[b] / samples)) for b in SHARE_BINS
                 if b in shares], "num")
    return ("<p class='hint'>Where the trained tokens came from. Token lag = the consuming "
            "trainer step minus the step of the version that generated the token (its own "
            "with <code>rollout.on_update: continue</code>). Per trained sample: the share of "
            "its tokens that a version older than its newest token's made (0%: one version)."
            f"</p><div class='row'><div>{lags}</div><div>{mix}</div></div>")


def off_policy_by_lag(by_lag: Mapping[str, Any] | None) -> str:
    """Mismatch KL and importance weights per token-lag bucket ("" when the learner reported
    none: a simulated trainer, or a run before these figures)."""
    if not by_lag or not any(by_lag.get(b) for b in LAG_BUCKETS):
        return ""
    rows = []
    for b in LAG_BUCKETS:
        x = by_lag.get(b)
        rows.append((b, "—", "—", "—", "—") if not x else (
            b, fmt(x["tokens"]), fmt(x["mismatch_kl_mean"]), fmt(x["is_weight_mean"]),
            fmt(x["is_weight_max"])))
    return ("<p class='hint'>Per token lag (the consuming step minus the token's generating "
            "step), over the trained tokens: mismatch KL (k3, behaviour to proximal) and the "
            "raw importance weight; — where no token had that lag.</p>"
            + table(("token lag", "tokens", "mismatch KL", "IS weight mean", "IS weight max"),
                    rows, "num"))


__all__ = ["off_policy_by_lag", "token_mix"]

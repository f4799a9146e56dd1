"""How old each committed sample's tokens were: the fold behind the token-lag figures.

With ``rollout.on_update: continue`` a sample's tokens may come from several policy
versions (the ``generated`` event's ``token_versions``); otherwise every token is of its
started version. For each committed sample, consumed at trainer step ``v`` (its lease's),
:func:`freshroll.kernel.freshness.token_lags` gives::

    oldest    v - s_first                   (the lag max_staleness bounds on oldest_token)
    newest    v - s_last                    (... on newest_token)
    weighted  v - (Σ n_i s_i) / (Σ n_i)     (token-weighted mean; binned to WEIGHTED_BIN)

:class:`TokenLags` is fed by :class:`freshroll.figures.metrics.Tally` (which holds one) and keeps,
over the committed samples so far, a histogram of each lag, their sums, and the last
commit's batch means; the figures of :mod:`freshroll.figures.metrics` (``token_lag``,
``step_token_lag``) read it. A sample with no ``token_versions`` has all
three lags equal; one with ``last_version`` alone (an engine that reports no per-token
versions: vLLM) weighs its two ends alike. :func:`lag_percentile` reads a percentile off a
lag histogram (``lag_p50``, ``lag_p99``).

It also says how much of each committed sample came from which version (``token_lag``'s
``tokens_by_lag`` and ``older_share``): its tokens counted by token lag in the buckets of
:mod:`freshroll.figures.off_policy` (a sample with no ranges: all at its lag; ends only: all at its
oldest-token lag, as the learner counts them), and the sample counted by the share of its
tokens made by a version older than its newest token's, in :data:`SHARE_BINS` (``"0%"``: one
version; ``"ends only"``: an engine that reports no per-token ranges, so no share).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from freshroll.figures.off_policy import LAG_BUCKETS, bucket_of
from freshroll.figures.timing import percentile
from freshroll.kernel.freshness import token_lags
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import policy_step

#: the token-weighted lag is counted in bins of this width (label: the bin's lower edge)
WEIGHTED_BIN: Final = 0.25
KINDS: Final = ("oldest", "newest", "weighted")
#: the bins of a sample's share of tokens older than its newest token's version (upper edges)
SHARE_BINS: Final = ("0%", "<=25%", "<=50%", "<=75%", "<100%", "ends only")


def share_bin(older: int, total: int) -> str:
    """The :data:`SHARE_BINS` label of ``older`` of ``total`` tokens (``older < total``)."""
    if older <= 0 or total <= 0:
        return SHARE_BINS[0]
    share = older / total
    for label, top in zip(SHARE_BINS[1:4], (0.25, 0.5, 0.75), strict=True):
        if share <= top:
            return label
    return SHARE_BINS[4]


def weighted_bin(lag: float) -> str:
    """The histogram label of a token-weighted lag: its bin's lower edge (``"1.25"``)."""
    edge = (lag // WEIGHTED_BIN) * WEIGHTED_BIN
    return f"{edge:g}"


def lag_percentile(lags: Counter[int], q: float) -> float:
    """:func:`freshroll.figures.timing.percentile` of the lags a histogram (lag -> samples) counts,
    read off the histogram (the same number, without a list of one entry per sample)."""
    n = sum(lags.values())
    if not n:
        return percentile([], q)
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    x_lo = x_hi = None
    seen = 0
    for lag, k in sorted(lags.items()):
        seen += k
        if x_lo is None and lo < seen:
            x_lo = float(lag)
        if hi < seen:
            x_hi = float(lag)
            break
    assert x_lo is not None and x_hi is not None
    return x_lo + (x_hi - x_lo) * (pos - lo)


class TokenLags:
    """The token lags of the committed samples whose tokens span versions, fed by
    :class:`freshroll.figures.metrics.Tally` (which counts every committed sample's oldest-token lag
    in ``Tally.lags``): a sample of one version has its three lags equal, so it costs
    nothing here; :meth:`summary` adds those back from the oldest-token histogram."""

    def __init__(self) -> None:
        self.basis = "oldest_token"  # the last opened's run.staleness_basis
        self.spans: dict[str, list[tuple[int, int]]] = {}  # attempt -> (step, tokens)
        self.hist: dict[str, Counter[str]] = {k: Counter() for k in KINDS}  # spanning ones
        self.sums: dict[str, float] = dict.fromkeys(KINDS, 0.0)  # ... their lags' sums
        self.top: dict[str, float] = dict.fromkeys(KINDS, 0.0)  # ... their largest lag
        self.spanning = 0  # committed samples whose tokens span versions
        self.batch: dict[str, float] = dict.fromkeys(KINDS, 0.0)  # the commit's, per kind
        self.counts: dict[str, int] = {}  # attempt -> its tokens, until committed or dropped
        self.by_lag: Counter[str] = Counter()  # lag bucket -> committed tokens
        self.shares: Counter[str] = Counter()  # SHARE_BINS label -> committed samples

    def generated(self, e: ev.Generated, first: int | None) -> None:
        """A ``generated`` event (``first``: its started step)."""
        self.counts[e.sample] = e.tokens
        if e.last_version is None:
            return
        if e.token_versions:
            self.spans[e.sample] = [(policy_step(v), n) for v, n in e.token_versions]
        elif e.last_version is not None and first is not None:  # its ends only
            self.spans[e.sample] = [(first, 0), (policy_step(e.last_version), 0)]

    def dropped(self, sample: str) -> None:
        """``sample`` was discarded."""
        self.spans.pop(sample, None)
        self.counts.pop(sample, None)

    def sample_committed(self, sample: str, consumer: int, lag: int) -> None:
        """``sample`` committed at step ``consumer``, ``lag`` its oldest-token lag."""
        total = self.counts.pop(sample, 0)
        spans = self.spans.pop(sample, None)
        if spans:
            self.committed(consumer, spans)
        if not spans or not sum(n for _, n in spans):  # one version, or its ends only
            self.by_lag[bucket_of(lag)] += total
            self.shares[SHARE_BINS[-1] if spans else SHARE_BINS[0]] += 1
            return
        for step, n in spans:
            self.by_lag[bucket_of(consumer - step)] += n
        newest = max(step for step, n in spans if n)
        made = sum(n for _, n in spans)
        self.shares[share_bin(made - sum(n for s, n in spans if s == newest), made)] += 1

    def committed(self, consumer: int, spans: list[tuple[int, int]]) -> None:
        """One committed sample of ``spans`` consumed at step ``consumer``."""
        self.spanning += 1
        for kind, lag in zip(KINDS, token_lags(consumer, spans), strict=True):
            self.hist[kind][weighted_bin(lag) if kind == "weighted" else str(int(lag))] += 1
            self.sums[kind] += lag
            self.top[kind] = max(self.top[kind], lag)
            self.batch[kind] += lag

    def step(self, oldest_lags: list[int]) -> dict[str, float] | None:
        """The batch means of the commit just folded (``oldest_lags``: each committed
        sample's oldest-token lag); resets the batch."""
        batch, self.batch = self.batch, dict.fromkeys(KINDS, 0.0)
        if not oldest_lags:
            return None
        plain = sum(oldest_lags) - batch["oldest"]  # the one-version samples' lags
        return {k: (plain + x) / len(oldest_lags) for k, x in batch.items()}

    def summary(self, lags: Counter[int]) -> dict[str, Any]:
        """``{"basis", "samples", "spanning", "tokens_by_lag", "older_share", "oldest" |
        "newest" | "weighted": {"mean", "max", "histogram"}}`` over the committed samples so
        far (``lags``: all of them by oldest-token lag)."""
        plain = Counter({f"{lag:g}": k for lag, k in lags.items()})
        plain.subtract(self.hist["oldest"])
        n = sum(lags.values())
        plain_sum = sum(lag * k for lag, k in lags.items()) - self.sums["oldest"]
        plain_top = max((float(x) for x, k in plain.items() if k > 0), default=0.0)
        out: dict[str, Any] = {
            "basis": self.basis, "samples": n, "spanning": self.spanning,
            "tokens_by_lag": {b: self.by_lag[b] for b in LAG_BUCKETS if self.by_lag[b]},
            "older_share": {b: self.shares[b] for b in SHARE_BINS if self.shares[b]}}
        for kind in KINDS:
            hist = +(plain + self.hist[kind])
            out[kind] = {"mean": (plain_sum + self.sums[kind]) / n if n else 0.0,
                         "max": max(plain_top, self.top[kind]),
                         "histogram": {k: hist[k] for k in sorted(hist, key=float)}}
        return out


__all__ = ["KINDS", "SHARE_BINS", "WEIGHTED_BIN", "TokenLags", "lag_percentile", "share_bin",
           "weighted_bin"]

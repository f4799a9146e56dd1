"""How old each committed sample's tokens were: the fold behind the token-lag figures.

With ``rollout.on_update: continue`` a sample's tokens may come from several policy
versions (the ``generated`` event's ``token_versions``); otherwise every token is of its
started version. For each committed sample, consumed at trainer step ``v`` (its lease's),
:func:`freshroll.freshness.token_lags` gives::

    oldest    v - s_first                   (the lag max_staleness bounds on oldest_token)
    newest    v - s_last                    (... on newest_token)
    weighted  v - (Σ n_i s_i) / (Σ n_i)     (token-weighted mean; binned to WEIGHTED_BIN)

:class:`TokenLags` folds the ledger one event at a time (as :class:`freshroll.metrics.Tally`
does, which holds one) and keeps, over the committed samples so far, a histogram of each
lag, their sums, and the last commit's batch means; the figures of :mod:`freshroll.metrics`
(``token_lag``, ``step_token_lag``) read it. A sample with no ``token_versions`` has all
three lags equal; one with ``last_version`` alone (an engine that reports no per-token
versions: vLLM) weighs its two ends alike. :func:`lag_percentile` reads a percentile off a
lag histogram (``lag_p50``, ``lag_p99``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from freshroll import events as ev
from freshroll.freshness import token_lags
from freshroll.lineage import policy_step
from freshroll.timing import percentile

#: the token-weighted lag is counted in bins of this width (label: the bin's lower edge)
WEIGHTED_BIN: Final = 0.25
KINDS: Final = ("oldest", "newest", "weighted")


def weighted_bin(lag: float) -> str:
    """The histogram label of a token-weighted lag: its bin's lower edge (``"1.25"``)."""
    edge = (lag // WEIGHTED_BIN) * WEIGHTED_BIN
    return f"{edge:g}"


def lag_percentile(lags: Counter[int], q: float) -> float:
    """:func:`freshroll.timing.percentile` of the lags a histogram (lag -> samples) counts,
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
    """Per committed sample: the lag of its oldest token, newest token and token-weighted."""

    def __init__(self) -> None:
        self.basis = "oldest_token"  # the last opened's run.staleness_basis
        self.hist: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
        self.sums: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        self.max: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        self.samples = 0  # committed samples folded
        self.spanning = 0  # ... of which their tokens span versions
        self.step: dict[str, float] | None = None  # the last commit's batch means
        self._started: dict[str, int] = {}  # attempt -> its started step
        self._spans: dict[str, list[tuple[int, int]]] = {}  # attempt -> (step, tokens)
        self._leases: dict[str, int] = {}  # lease -> its consuming step

    def feed(self, e: ev.Event) -> None:
        if isinstance(e, ev.Started):
            self._started[e.sample] = policy_step(e.version)
        elif isinstance(e, ev.Generated):
            if e.token_versions:
                self._spans[e.sample] = [(policy_step(v), n) for v, n in e.token_versions]
            elif e.last_version is not None and e.sample in self._started:  # ends only
                self._spans[e.sample] = [(self._started[e.sample], 0),
                                         (policy_step(e.last_version), 0)]
        elif isinstance(e, ev.Leased):
            self._leases[e.lease] = policy_step(e.version)
        elif isinstance(e, ev.Committed):
            self._committed(e)
        elif isinstance(e, ev.Discarded) and e.sample is not None:
            self._started.pop(e.sample, None)
            self._spans.pop(e.sample, None)
        elif isinstance(e, ev.Opened):
            self.basis = e.staleness_basis

    def _committed(self, e: ev.Committed) -> None:
        v = self._leases.pop(e.lease, None)
        batch: dict[str, list[float]] = {k: [] for k in KINDS}
        for s in e.samples:
            first = self._started.pop(s, None)
            spans = self._spans.pop(s, None)
            if v is None or first is None:  # a damaged ledger: verify says so
                continue
            lags = token_lags(v, spans or [(first, 1)])
            self.samples += 1
            self.spanning += spans is not None
            for kind, lag in zip(KINDS, lags, strict=True):
                self.hist[kind][weighted_bin(lag) if kind == "weighted" else str(int(lag))] += 1
                self.sums[kind] += lag
                self.max[kind] = max(self.max[kind], lag)
                batch[kind].append(lag)
        self.step = ({k: sum(x) / len(x) for k, x in batch.items()} if batch["oldest"]
                     else None)

    def summary(self) -> dict[str, Any]:
        """``{"basis", "samples", "spanning", "oldest" | "newest" | "weighted": {"mean",
        "max", "histogram"}}`` over the committed samples so far."""
        n = self.samples
        out: dict[str, Any] = {"basis": self.basis, "samples": n, "spanning": self.spanning}
        for kind in KINDS:
            hist = self.hist[kind]
            out[kind] = {"mean": self.sums[kind] / n if n else 0.0, "max": self.max[kind],
                         "histogram": {k: hist[k] for k in sorted(hist, key=float)}}
        return out


__all__ = ["KINDS", "WEIGHTED_BIN", "TokenLags", "lag_percentile", "weighted_bin"]

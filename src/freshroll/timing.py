"""Per-sample time decomposition, derived from ledger events alone.

For every *accepted* (committed) sample, with ``t(x)`` the timestamp of event x::

    queue      = t(started of the committed attempt) - t(requested)   # incl. failed attempts
    generation = min(gen_s, t(generated) - t(started))                # measured on the worker
    transfer   = max(0, t(generated) - t(started) - gen_s)            # dispatch + result transfer
    reward     = t(rewarded) - t(generated)                           # reward queue + scoring
    buffer     = t(leased) - t(rewarded)                              # waiting for the trainer
    trainer    = t(committed) - t(leased)                             # inside the trainer step

The six stages add up to ``t(committed) - t(requested)``. :func:`decompose`
gives p50/p95/p99, the mean and each stage's share of the summed total.

Run-level figures (accepted rollouts/s, trainer idle ratio, discard rate, ...) are
not computed here: each has its one function in :mod:`freshroll.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from freshroll import events as ev
from freshroll.errors import LedgerError

STAGES = ("queue", "generation", "transfer", "reward", "buffer", "trainer")


@dataclass
class Spans:
    """Stage durations (seconds) of each committed sample, in commit order."""

    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    total: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class StageRow:
    stage: str
    p50: float
    p95: float
    p99: float
    mean: float
    share: float  # of the summed end-to-end time of all accepted samples


def collect_spans(events: Iterable[ev.Event]) -> Spans:
    """One pass over the events; only committed samples get spans."""
    requested: dict[str, float] = {}
    started: dict[str, float] = {}
    generated: dict[str, tuple[float, float]] = {}
    rewarded: dict[str, float] = {}
    lease_ts: dict[str, float] = {}
    spans = Spans()
    for e in events:
        if isinstance(e, ev.Requested):
            requested[e.group] = e.ts
        elif isinstance(e, ev.Started):
            started[e.sample] = e.ts
        elif isinstance(e, ev.Generated):
            generated[e.sample] = (e.ts, e.gen_s)
        elif isinstance(e, ev.Rewarded):
            rewarded[e.sample] = e.ts
        elif isinstance(e, ev.Leased):
            lease_ts[e.lease] = e.ts
        elif isinstance(e, ev.Committed):
            try:
                t_lease = lease_ts[e.lease]
                for sid in e.samples:
                    t_req = requested[sid.partition(".")[0]]
                    t_start = started[sid]
                    t_gen, gen_s = generated[sid]
                    t_rew = rewarded[sid]
                    # the worker's own measure is capped at the span it was measured in, so
                    # the six stages always add up to the end-to-end time
                    gen = min(gen_s, max(0.0, t_gen - t_start))
                    values = (
                        t_start - t_req, gen, max(0.0, t_gen - t_start - gen_s),
                        t_rew - t_gen, t_lease - t_rew, e.ts - t_lease,
                    )
                    for name, value in zip(STAGES, values, strict=True):
                        spans.stages[name].append(value)
                    spans.total.append(e.ts - t_req)
            except KeyError as exc:
                raise LedgerError(
                    f"committed lease {e.lease} names {exc.args[0]!r}, which has no "
                    "requested/started/generated/rewarded/leased event (run `freshroll verify`)"
                ) from exc
    return spans


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (numpy's default 'linear'); 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decompose(spans: Spans) -> list[StageRow]:
    total = sum(spans.total) or 1.0
    rows = []
    for name in STAGES:
        vals = spans.stages[name]
        rows.append(StageRow(
            name, percentile(vals, 50), percentile(vals, 95), percentile(vals, 99),
            sum(vals) / len(vals) if vals else 0.0, sum(vals) / total,
        ))
    return rows


def format_table(rows: list[StageRow]) -> str:
    lines = [f"{'stage':<11}{'p50 s':>10}{'p95 s':>10}{'p99 s':>10}{'mean s':>10}{'share':>8}"]
    for r in rows:
        lines.append(
            f"{r.stage:<11}{r.p50:>10.4f}{r.p95:>10.4f}{r.p99:>10.4f}{r.mean:>10.4f}{r.share:>8.1%}"
        )
    return "\n".join(lines)

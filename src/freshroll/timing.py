"""Per-sample time decomposition and run-level rates, derived from ledger events alone.

For every *accepted* (committed) sample, with ``t(x)`` the timestamp of event x::

    queue      = t(started of the committed attempt) - t(requested)   # incl. failed attempts
    generation = min(gen_s, t(generated) - t(started))                # measured on the worker
    transfer   = max(0, t(generated) - t(started) - gen_s)            # dispatch + result transfer
    reward     = t(rewarded) - t(generated)                           # reward queue + scoring
    buffer     = t(leased) - t(rewarded)                              # waiting for the trainer
    trainer    = t(committed) - t(leased)                             # inside the trainer step

The six stages add up to ``t(committed) - t(requested)``. :func:`decompose`
gives p50/p95/p99, the mean and each stage's share of the summed total.

Run-level figures (:func:`run_rates`): accepted rollouts per second (committed
samples / trainer wall time), the trainer idle ratio (sum of ``leased.wait_s`` /
trainer wall time), and the discard counts by reason. The trainer wall time of
an incarnation runs from its trainer's first wait for data to its last commit
(setup and crash downtime excluded); incarnations add up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from freshroll import events as ev
from freshroll.errors import LedgerError
from freshroll.lineage import policy_step

STAGES = ("queue", "generation", "transfer", "reward", "buffer", "trainer")


@dataclass
class Spans:
    """Stage durations (seconds) of each committed sample, in commit order."""

    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    total: list[float] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class StageRow:
    stage: str
    p50: float
    p95: float
    p99: float
    mean: float
    share: float  # of the summed end-to-end time of all accepted samples


@dataclass(frozen=True)
class RunRates:
    accepted: int
    generated: int
    wall_s: float
    accepted_per_s: float
    trainer_wait_s: float
    trainer_wall_s: float
    trainer_idle_ratio: float
    steps: int
    discards: dict[str, int]



def collect_spans(events: Iterable[ev.Event]) -> Spans:
    """One pass over the events; only committed samples get spans."""
    requested: dict[str, float] = {}
    started: dict[str, tuple[float, int]] = {}
    generated: dict[str, tuple[float, float]] = {}
    rewarded: dict[str, float] = {}
    lease_ts: dict[str, tuple[float, int]] = {}
    spans = Spans()
    for e in events:
        if isinstance(e, ev.Requested):
            requested[e.group] = e.ts
        elif isinstance(e, ev.Started):
            started[e.sample] = (e.ts, policy_step(e.version))
        elif isinstance(e, ev.Generated):
            generated[e.sample] = (e.ts, e.gen_s)
        elif isinstance(e, ev.Rewarded):
            rewarded[e.sample] = e.ts
        elif isinstance(e, ev.Leased):
            lease_ts[e.lease] = (e.ts, policy_step(e.version))
        elif isinstance(e, ev.Committed):
            try:
                t_lease, consumer = lease_ts[e.lease]
                for sid in e.samples:
                    t_req = requested[sid.partition(".")[0]]
                    t_start, gen_step = started[sid]
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
                    spans.lags.append(consumer - gen_step)
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


def run_rates(events: Iterable[ev.Event]) -> RunRates:
    """Run-level rates. Each incarnation (``opened``) contributes the span from its trainer's
    first wait for data (first ``leased.ts - leased.wait_s``) to its last ``committed``: model
    loading before the trainer starts and the downtime between a crash and ``--resume`` are not
    counted; everything the trainer waited for or trained on is."""
    accepted = generated = steps = 0
    wait = wall = 0.0
    start: float | None = None
    last: float | None = None
    discards: Counter[str] = Counter()
    for e in events:
        if isinstance(e, ev.Opened):
            if start is not None and last is not None:
                wall += last - start
            start = last = None
        elif isinstance(e, ev.Leased):
            wait += e.wait_s
            if start is None:
                start = e.ts - e.wait_s
        elif isinstance(e, ev.Committed):
            accepted += len(e.samples)
            steps += 1
            last = e.ts
        elif isinstance(e, ev.Generated):
            generated += 1
        elif isinstance(e, ev.Discarded):
            discards[e.reason] += 1
    if start is not None and last is not None:
        wall += last - start
    return RunRates(
        accepted=accepted, generated=generated, wall_s=wall,
        accepted_per_s=accepted / wall if wall > 0 else 0.0,
        trainer_wait_s=wait, trainer_wall_s=wall,
        trainer_idle_ratio=min(1.0, wait / wall) if wall > 0 else 0.0,
        steps=steps, discards=dict(discards),
    )

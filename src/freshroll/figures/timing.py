"""Per-sample time decomposition, derived from ledger events alone.

For every *accepted* (committed) sample, with ``t(x)`` the timestamp of event x::

    queue      = t(started of the committed attempt) - t(requested)   # incl. failed attempts
    episode    = min(gen_s, t(generated) - t(started))                # measured on the worker
    tool       = min(env_s, episode)                                  # its tool/environment turns
    generation = episode - tool                                       # its model turns
    transfer   = max(0, t(generated) - t(started) - gen_s)            # dispatch + result transfer
    reward     = t(rewarded) - t(generated)                           # reward queue + scoring
    buffer     = t(leased) - t(rewarded)                              # waiting for the trainer
    trainer    = t(committed) - t(leased)                             # inside the trainer step

``env_s`` is the seconds of the sample's environment turns (a multi-turn episode's tool calls:
the ``env`` turns of its payload, :func:`freshroll.engines.payload.env_seconds`; 0 for a
single-turn sample, and where the fold is given no payloads). The stages add up to
``t(committed) - t(requested)``. :func:`decompose` gives p50/p95/p99, the mean and each
stage's share of the summed total; the ``tool`` row is there only when some sample had tool
time (a single-turn run's table and ``summary.json`` are as they were).

Run-level figures (accepted rollouts/s, trainer idle ratio, discard rate, ...) are
not computed here: each has its one function in :mod:`freshroll.figures.metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from freshroll.engines.payload import env_seconds
from freshroll.errors import LedgerError
from freshroll.ledger import events as ev

STAGES = ("queue", "generation", "transfer", "reward", "buffer", "trainer")
#: every row :func:`decompose` may give: the stages with ``tool`` after generation
TOOL_STAGES = ("queue", "generation", "tool", "transfer", "reward", "buffer", "trainer")
#: a sample id's payload (bytes, or None: none stored), e.g. ``Ledger.payload``
PayloadOf = Callable[[str], bytes | None]


@dataclass
class Spans:
    """Stage durations (seconds) of each committed sample, in commit order."""

    stages: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STAGES})
    total: list[float] = field(default_factory=list)
    #: each sample's tool stage (taken out of its generation stage), in the same order
    tool: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class StageRow:
    stage: str
    p50: float
    p95: float
    p99: float
    mean: float
    share: float  # of the summed end-to-end time of all accepted samples


class SpanFold:
    """:func:`collect_spans` one event at a time (``feed``), for a reader that folds several
    figures in one pass over a ledger. Keeps per request/attempt/lease timestamps only until
    the sample is committed or discarded, so its memory is that of the samples in flight
    plus the spans themselves.

    A committed sample that lacks one of its events makes the fold fail: ``error`` holds the
    :class:`~freshroll.errors.LedgerError` (later events are ignored) and :meth:`result`
    raises it.
    """

    #: what feed reads
    KINDS: ClassVar = (ev.Requested, ev.Started, ev.Generated, ev.Rewarded, ev.Leased,
                       ev.Committed, ev.Discarded, ev.LeaseReleased)

    def __init__(self, payload_of: PayloadOf | None = None) -> None:
        self.payload_of = payload_of  # where a sample's tool seconds are read (None: none)
        self.requested: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.generated: dict[str, tuple[float, float]] = {}
        self.rewarded: dict[str, float] = {}
        self.lease_ts: dict[str, float] = {}
        self.spans = Spans()
        self.error: LedgerError | None = None

    def feed(self, e: ev.Event) -> None:
        if self.error is not None:
            return
        if isinstance(e, ev.Requested):
            self.requested[e.group] = e.ts
        elif isinstance(e, ev.Started):
            self.started[e.sample] = e.ts
        elif isinstance(e, ev.Generated):
            self.generated[e.sample] = (e.ts, e.gen_s)
        elif isinstance(e, ev.Rewarded):
            self.rewarded[e.sample] = e.ts
        elif isinstance(e, ev.Leased):
            self.lease_ts[e.lease] = e.ts
        elif isinstance(e, ev.Committed):
            self._committed(e)
        elif isinstance(e, ev.Discarded) and e.sample is not None:  # it can no longer commit
            self.started.pop(e.sample, None)
            self.generated.pop(e.sample, None)
            self.rewarded.pop(e.sample, None)
        elif isinstance(e, ev.LeaseReleased):
            self.lease_ts.pop(e.lease, None)

    def _committed(self, e: ev.Committed) -> None:
        stages, total = self.spans.stages, self.spans.total
        queue, generation, transfer = stages["queue"], stages["generation"], stages["transfer"]
        reward, buffer, trainer = stages["reward"], stages["buffer"], stages["trainer"]
        tool, payload_of = self.spans.tool, self.payload_of
        try:
            t_lease = self.lease_ts.pop(e.lease)
            for sid in e.samples:
                t_req = self.requested[sid.partition(".")[0]]
                t_start = self.started.pop(sid)
                t_gen, gen_s = self.generated.pop(sid)
                t_rew = self.rewarded.pop(sid)
                # the worker's own measure is capped at the span it was measured in, so
                # the six stages always add up to the end-to-end time
                gen = min(gen_s, max(0.0, t_gen - t_start))
                env = min(gen, env_seconds(payload_of(sid))) if payload_of is not None else 0.0
                queue.append(t_start - t_req)
                generation.append(gen - env)
                tool.append(env)
                transfer.append(max(0.0, t_gen - t_start - gen_s))
                reward.append(t_rew - t_gen)
                buffer.append(t_lease - t_rew)
                trainer.append(e.ts - t_lease)
                total.append(e.ts - t_req)
        except KeyError as exc:
            self.error = LedgerError(
                f"committed lease {e.lease} names {exc.args[0]!r}, which has no "
                "requested/started/generated/rewarded/leased event (run `freshroll verify`)"
            )
            self.error.__cause__ = exc

    def result(self) -> Spans:
        """The spans of every committed sample so far (raises :attr:`error` if set)."""
        if self.error is not None:
            raise self.error
        return self.spans


def collect_spans(events: Iterable[ev.Event], payload_of: PayloadOf | None = None) -> Spans:
    """One pass over the events; only committed samples get spans (tool time read from
    ``payload_of``, where given)."""
    fold = SpanFold(payload_of)
    for e in events:
        fold.feed(e)
        if fold.error is not None:
            break
    return fold.result()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (numpy's default 'linear'); 0 for no values."""
    return percentiles(values, (q,))[0]


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """:func:`percentile` at each of ``qs``, sorting ``values`` once."""
    if not values:
        return [0.0 for _ in qs]
    xs = sorted(values)
    out = []
    for q in qs:
        pos = (len(xs) - 1) * q / 100.0
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def decompose(spans: Spans) -> list[StageRow]:
    """A row per stage (``tool`` only where some sample had tool time)."""
    total = sum(spans.total) or 1.0
    rows = []
    tooled = any(spans.tool)
    for name in TOOL_STAGES if tooled else STAGES:
        vals = spans.tool if name == "tool" else spans.stages[name]
        p50, p95, p99 = percentiles(vals, (50, 95, 99))
        rows.append(StageRow(
            name, p50, p95, p99, sum(vals) / len(vals) if vals else 0.0, sum(vals) / total,
        ))
    return rows


def format_table(rows: list[StageRow]) -> str:
    lines = [f"{'stage':<11}{'p50 s':>10}{'p95 s':>10}{'p99 s':>10}{'mean s':>10}{'share':>8}"]
    for r in rows:
        lines.append(
            f"{r.stage:<11}{r.p50:>10.4f}{r.p95:>10.4f}{r.p99:>10.4f}{r.mean:>10.4f}{r.share:>8.1%}"
        )
    return "\n".join(lines)

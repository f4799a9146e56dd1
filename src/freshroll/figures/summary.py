"""``summary.json``: the run's headline figures, recomputed from the ledger alone.

Reads only ``ledger.sqlite`` (the run directory is the report contract), so a
summary can be rebuilt on a saved run, and ``freshroll verify`` recomputes it to
check the file. The figures are those of :func:`freshroll.figures.metrics.summary_figures`
(defined once, in docs/metrics.md), plus the discard-bias check (committed vs
discarded completions' reward and length, by reason) and the per-stage time
decomposition of :mod:`freshroll.figures.timing`, the stages' overlap of
:mod:`freshroll.figures.overlap` (did asynchrony pay) and the same figures segment by
segment, one per start and resume (:mod:`freshroll.figures.segments`), and the freshness
window's bound on the trainer (:mod:`freshroll.figures.window`). Written as strict
JSON (a non-finite value as ``null``), atomically.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from freshroll.figures.bias import SampleBias
from freshroll.figures.history import HistoryFold
from freshroll.figures.learning import LearningFold
from freshroll.figures.metrics import Tally, jsonable, summary_figures
from freshroll.figures.metrics_log import read_rows
from freshroll.figures.overlap import OverlapFold
from freshroll.figures.segments import SegmentFold
from freshroll.figures.timing import PayloadOf, SpanFold, StageRow, decompose
from freshroll.figures.trained import TrainedFold
from freshroll.figures.verdict import VerdictFold
from freshroll.figures.window import WindowFold
from freshroll.ledger.events import (
    EVENT_TYPES,
    Closed,
    Committed,
    Discarded,
    Opened,
    Requested,
    Rewarded,
    RunConfig,
)
from freshroll.ledger.lineage import policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger

SUMMARY_FILE = "summary.json"
#: the tolerant ``metrics.jsonl`` reader (kept here for its callers)
read_metrics = read_rows


def discard_bias(events: Iterable[Any]) -> dict[str, Any]:
    """Do discards skew what the trainer sees? Committed vs discarded completions, by reason.

    Compares the mean reward (where one was computed) and mean completion length of the
    committed samples with those of each discard reason's generated samples
    (:meth:`freshroll.figures.bias.SampleBias.by_outcome`: the same fold as the sample
    bias). A stale discard that prefers long or low-reward completions biases training even
    at a small rate.
    """
    fold = SampleBias()
    for e in events:
        fold.feed(e)
    return fold.by_outcome()


class RewardVersions:
    """Which reward versions scored the committed samples: ``{version: {"samples": n,
    "first_step": a, "last_step": b}}``, in the order versions first trained. More than one:
    the reward functions changed within the run (``run.reward_versions``)."""

    KINDS: ClassVar = (Rewarded, Committed, Discarded)

    def __init__(self) -> None:
        self.of: dict[str, str] = {}  # sample -> reward version, until it is committed
        self.seen: dict[str, dict[str, int]] = {}

    def feed(self, e: Any) -> None:
        if isinstance(e, Rewarded):
            self.of[e.sample] = e.reward_version
            return
        if isinstance(e, Discarded):  # never trained on: out of the count
            if e.sample is not None:
                self.of.pop(e.sample, None)
            return
        step = policy_step(e.version)
        for s in e.samples:
            version = self.of.pop(s, None)
            if version is None:
                continue
            entry = self.seen.setdefault(version, {"samples": 0, "first_step": step,
                                                   "last_step": step})
            entry["samples"] += 1
            entry["last_step"] = step

    def result(self) -> dict[str, dict[str, int]]:
        return {v: dict(x) for v, x in self.seen.items()}


def render_reward_versions(versions: Any) -> str:
    """The line a run trained under more than one reward version prints (empty for one)."""
    if not isinstance(versions, dict) or len(versions) < 2:
        return ""
    parts = [f"{v} (steps {x['first_step']}-{x['last_step']}, {x['samples']} samples)"
             for v, x in versions.items()]
    return (f"reward versions: {len(versions)}, the reward functions changed within the run: "
            + "; ".join(parts) + " (freshroll lineage RUN_DIR STEP shows each batch's)")


class SummaryFold:
    """Everything ``summary.json`` (and the report's ledger figures) is computed from, folded
    one event at a time: the :class:`~freshroll.figures.metrics.Tally` (and the ``metrics.jsonl``
    rows
    it implies, one per commit), the discard bias, the stage spans and the verdict. So one
    pass over a ledger serves the summary, ``verify``'s checks of the files and the report.

    A damaged ledger never stops the pass that feeds the fold (``verify`` reads on and says
    what is wrong): the first error the fold meets is kept in ``error`` and raised by
    :attr:`rows` and :meth:`summary`, as folding the events again would raise it; a commit
    whose events are missing fails only the stage spans
    (:class:`~freshroll.figures.timing.SpanFold`).

    A :class:`~freshroll.figures.fold.Fold` of every event kind; it feeds each of its folds
    only the kinds in that fold's ``KINDS``.
    """

    KINDS: ClassVar = EVENT_TYPES

    def __init__(self, payload_of: PayloadOf | None = None) -> None:
        self.tally = Tally()
        self._rows: list[dict[str, Any]] = []
        self.bias = SampleBias()  # discard_bias and sample_bias
        self.history = HistoryFold()  # the report's timeline (not in summary.json)
        self.trained = TrainedFold()  # the report's sample completions (not in summary.json)
        self.spans = SpanFold(payload_of)  # payload_of: the tool stage's seconds
        self.verdict = VerdictFold()
        self.reward_versions = RewardVersions()
        self.window = WindowFold()  # the freshness window's bound on the trainer
        self.learning = LearningFold()  # collapse and the off-policy signals, from the rows
        self.overlap = OverlapFold(self.tally)
        self.segments = SegmentFold(self.tally, self.overlap)  # fed before the two above
        self.requests = 0  # admitted requests (sum of the groups' sizes)
        self.closed = False  # the ledger ends ``closed``
        self.error: Exception | None = None
        self._fed = 0  # events fed, so that a summary is computed once per state
        self._summary: tuple[int, dict[str, Any]] | None = None
        self._stages: tuple[int, list[StageRow]] | None = None  # for that many spans
        self._routes: dict[type, tuple[Callable[[Any], None], ...]] = {}  # by event type
        self.engine: str | None = None  # rollout.engine of the newest run_config

    def feed(self, e: Any) -> None:
        if self.error is not None:
            return
        self._fed += 1
        kind = type(e)
        route = self._routes.get(kind)
        if route is None:
            route = self._routes[kind] = self._route(kind)
        try:
            for fn in route:
                fn(e)
        except Exception as exc:  # kept, and raised where the figures are used
            self.error = exc

    def _route(self, kind: type) -> tuple[Callable[[Any], None], ...]:
        """The folds that read events of ``kind`` (the tally reads every event)."""
        route: list[Callable[[Any], None]] = [self.segments.feed, self._tally]
        route += [f.feed for f in (self.bias, self.history, self.trained,
                                   self.spans, self.verdict, self.overlap,
                                   self.reward_versions, self.window) if kind in f.KINDS]
        if kind in (Requested, Opened, Closed):
            route.append(self._lifecycle)
        if kind is RunConfig:
            route.append(self._config)
        return tuple(route)

    def _config(self, e: RunConfig) -> None:
        """The engine that generated the run's samples (hf, vllm, sim), and the collapse
        rule's settings (``monitor.*``), for the summary."""
        try:
            config = json.loads(e.config)
            rollout = config.get("rollout", {})
        except (ValueError, AttributeError):
            return
        monitor = config.get("monitor")
        if isinstance(monitor, dict):  # the collapse rule's settings in force
            self.learning.configure(monitor)
        engine = rollout.get("engine", "hf") if isinstance(rollout, dict) else None
        self.engine = engine if isinstance(engine, str) else None

    def _tally(self, e: Any) -> None:
        row = self.tally.feed(e)
        if row is not None:
            self._rows.append(row)
            self.learning.row(row, self.tally.max_staleness)

    def _lifecycle(self, e: Any) -> None:
        if isinstance(e, Requested):
            self.requests += e.size
        else:
            self.closed = isinstance(e, Closed)

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The ``metrics.jsonl`` rows of the events fed (:func:`freshroll.figures.metrics.rows`)."""
        self._check()
        return self._rows

    def stages(self) -> list[StageRow]:
        """The per-stage decomposition (raises :class:`LedgerError` for a damaged ledger)."""
        self._check()
        spans = self.spans.result()
        if self._stages is None or self._stages[0] != len(spans.total):
            self._stages = (len(spans.total), decompose(spans))
        return self._stages[1]

    def result(self) -> dict[str, Any]:
        """The :class:`~freshroll.figures.fold.Fold` name of :meth:`summary`."""
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """The summary of the events fed (JSON-ready: non-finite floats are ``None``); raises
        :class:`~freshroll.errors.LedgerError` when a commit's events are missing. Computed
        once per state of the fold (the end of a run asks for it to write, to verify and to
        note the overlap): each call returns a copy of its top level."""
        self._check()
        if self._summary is None or self._summary[0] != self._fed:
            self._summary = (self._fed, self._compute())
        return dict(self._summary[1])

    def _compute(self) -> dict[str, Any]:
        summary: dict[str, Any] = jsonable({
            **summary_figures(self.tally),
            "engine": self.engine,
            "discard_bias": self.bias.by_outcome(),
            "sample_bias": self.bias.result(),
            "stages": [row.__dict__ for row in self.stages()],
            "verdict": self.verdict.result(),
            "overlap": self.overlap.result(self.tally),
            "segments": self.segments.result(),
            "reward_versions": self.reward_versions.result(),
            "window_bound": self.window.result(),
            "learning": self.learning.result(),
        })
        return summary


def fold_events(events: Iterable[Any], payload_of: PayloadOf | None = None) -> SummaryFold:
    """The :class:`SummaryFold` of a whole event history (``payload_of``: its payloads, for
    the tool stage)."""
    fold = SummaryFold(payload_of)
    for e in events:
        fold.feed(e)
    return fold


def summarize_events(events: Iterable[Any],
                     payload_of: PayloadOf | None = None) -> dict[str, Any]:
    """The summary of an event history (JSON-ready: non-finite floats are ``None``)."""
    return fold_events(events, payload_of).summary()


def summarize(run_dir: Path) -> dict[str, Any]:
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        return summarize_events((e for _, e in ledger.events()), ledger.payload)


def read_host(run_dir: Path) -> dict[str, Any] | None:
    """The ``host`` block of ``run_dir``'s ``summary.json`` (None: no file, or none in it)."""
    try:
        host = json.loads((run_dir / SUMMARY_FILE).read_text()).get("host")
    except (OSError, ValueError, AttributeError):
        return None
    return host if isinstance(host, dict) else None

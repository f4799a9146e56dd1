"""The one-pass folds of the end of a run (:class:`freshroll.figures.summary.SummaryFold`,
:class:`~freshroll.figures.timing.SpanFold`, ...) give the figures of the list-based readers they
replaced, bit for bit, and keep no per-sample state past a sample's end."""

from __future__ import annotations

import inspect
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_driver import SimConfig, simulate

from freshroll.clock import VirtualClock
from freshroll.figures import metrics as m
from freshroll.figures.bias import SampleBias
from freshroll.figures.fold import Fold
from freshroll.figures.history import HistoryFold
from freshroll.figures.overlap import ModeFold, OverlapFold
from freshroll.figures.segments import SegmentFold
from freshroll.figures.summary import RewardVersions, SummaryFold, fold_events
from freshroll.figures.timing import STAGES, SpanFold, percentile
from freshroll.figures.token_lag import lag_percentile
from freshroll.figures.trained import TrainedFold
from freshroll.figures.verdict import VerdictFold
from freshroll.figures.window import WindowFold
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger


def _reference_spans(events: list[ev.Event]) -> tuple[dict[str, list[float]], list[float]]:
    """The list-based collect_spans the fold replaced (timestamps kept for every sample)."""
    req: dict[str, float] = {}
    start: dict[str, float] = {}
    gen: dict[str, tuple[float, float]] = {}
    rew: dict[str, float] = {}
    lease: dict[str, float] = {}
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    total: list[float] = []
    for e in events:
        if isinstance(e, ev.Requested):
            req[e.group] = e.ts
        elif isinstance(e, ev.Started):
            start[e.sample] = e.ts
        elif isinstance(e, ev.Generated):
            gen[e.sample] = (e.ts, e.gen_s)
        elif isinstance(e, ev.Rewarded):
            rew[e.sample] = e.ts
        elif isinstance(e, ev.Leased):
            lease[e.lease] = e.ts
        elif isinstance(e, ev.Committed):
            for s in e.samples:
                t_req, t_start, (t_gen, gen_s) = req[s.partition(".")[0]], start[s], gen[s]
                values = (t_start - t_req, min(gen_s, max(0.0, t_gen - t_start)),
                          max(0.0, t_gen - t_start - gen_s), rew[s] - t_gen,
                          lease[e.lease] - rew[s], e.ts - lease[e.lease])
                for name, v in zip(STAGES, values, strict=True):
                    stages[name].append(v)
                total.append(e.ts - t_req)
    return stages, total


def _reference_bias(events: list[ev.Event]) -> dict[str, Any]:
    reward: dict[str, float] = {}
    tokens: dict[str, int] = {}
    groups: dict[str, list[str]] = {"committed": []}
    for e in events:
        if isinstance(e, ev.Generated):
            tokens[e.sample] = e.tokens
        elif isinstance(e, ev.Rewarded):
            reward[e.sample] = e.reward
        elif isinstance(e, ev.Committed):
            groups["committed"].extend(e.samples)
        elif isinstance(e, ev.Discarded) and e.sample in tokens and e.reason != "fenced":
            groups.setdefault(e.reason, []).append(e.sample)
    out = {}
    for name, ss in groups.items():
        rs, ts = [reward[s] for s in ss if s in reward], [tokens[s] for s in ss]
        out[name] = {"n": len(ts), "reward_mean": sum(rs) / len(rs) if rs else None,
                     "tokens_mean": sum(ts) / len(ts) if ts else None}
    return out


@pytest.fixture(scope="module", params=[0, 1, 2])
def sim_events(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> list[ev.Event]:
    run = tmp_path_factory.mktemp("folds") / "run"
    simulate(run, KernelConfig(1, 2, 4),
             SimConfig(steps=8, seed=request.param, faults=True, sync="off"), VirtualClock())
    with Ledger(run / "ledger.sqlite", readonly=True) as ledger:
        return [e for _, e in ledger.events()]


def test_folds_equal_the_list_based_figures(sim_events: list[ev.Event]) -> None:
    fold = fold_events(sim_events)
    stages, total = _reference_spans(sim_events)
    spans = fold.spans.result()
    assert spans.stages == stages and spans.total == total and total
    assert fold.bias.by_outcome() == _reference_bias(sim_events)  # discard_bias
    assert fold.rows == m.rows(sim_events)
    assert fold.summary()["lag"] == {
        "p50": m.lag_p50(fold.tally), "p99": m.lag_p99(fold.tally),
        "max": m.lag_max(fold.tally), "mean": m.lag_mean(fold.tally),
        "histogram": m.lag_histogram(fold.tally)}
    assert fold.closed and fold.requests == sum(
        e.size for e in sim_events if isinstance(e, ev.Requested))


def test_no_per_sample_state_outlives_the_sample(sim_events: list[ev.Event]) -> None:
    """Once every sample has ended (a closed ledger), the folds hold only the figures: no
    timestamps, lengths or rewards of samples (the memory of the end pass is not per event)."""
    fold = fold_events(sim_events)
    assert not fold.spans.started and not fold.spans.generated and not fold.spans.rewarded
    assert not fold.spans.lease_ts
    assert not fold.bias.tokens and not fold.bias.reward


#: every ledger fold (figures.fold.Fold), made fresh
FOLDS: dict[type, Any] = {
    SummaryFold: SummaryFold, SpanFold: SpanFold, SampleBias: SampleBias,
    VerdictFold: VerdictFold, RewardVersions: RewardVersions, OverlapFold: OverlapFold,
    ModeFold: ModeFold, HistoryFold: HistoryFold, TrainedFold: TrainedFold,
    SegmentFold: lambda: SegmentFold(m.Tally(), OverlapFold()), WindowFold: WindowFold,
}


@pytest.mark.parametrize("cls", list(FOLDS), ids=lambda c: c.__name__)
def test_every_fold_is_a_fold(cls: type, sim_events: list[ev.Event]) -> None:
    """Each fold states the kinds it reads, takes events one at a time and has a result,
    asked for any number of times (here: midway and at the end of a whole run's events)."""
    fold = FOLDS[cls]()
    assert isinstance(fold, Fold)
    kinds = cls.KINDS  # type: ignore[attr-defined]  # every fold class has one (asserted)
    assert kinds and all(isinstance(k, type) for k in kinds)
    tally = m.Tally()  # an OverlapFold's figures need the run's tally (fed every event)
    if cls is OverlapFold:
        fold = OverlapFold(tally)
    half, midway = len(sim_events) // 2, None
    for i, e in enumerate(sim_events):
        tally.feed(e)
        if isinstance(e, kinds):
            fold.feed(e)
        if i == half:
            midway = repr(fold.result())
    assert midway is not None and fold.result() == fold.result()


def test_summary_fold_routes_each_fold_only_the_kinds_it_reads(
        sim_events: list[ev.Event]) -> None:
    """No fold inside the SummaryFold (ModeFold inside OverlapFold too) is ever fed an event
    of a kind outside its KINDS, and each is fed every event of its kinds."""
    fold = SummaryFold()
    inner = [fold.segments, fold.bias, fold.history, fold.trained, fold.spans, fold.verdict,
             fold.overlap, fold.reward_versions, fold.overlap.modes, fold.window]
    fed: Counter[str] = Counter()

    def checked(f: Any) -> Any:
        feed = f.feed

        def check(e: Any) -> Any:
            assert isinstance(e, f.KINDS), f"{type(f).__name__} fed {type(e).__name__}"
            fed[type(f).__name__] += 1
            return feed(e)
        return check

    for f in inner:
        f.feed = checked(f)
    for e in sim_events:
        fold.feed(e)
    assert fold.error is None
    assert fed == {type(f).__name__: sum(isinstance(e, f.KINDS) for e in sim_events)
                   for f in inner}
    assert fold.result() == fold.summary()


@pytest.mark.parametrize("cls", [SpanFold, SampleBias, VerdictFold, RewardVersions, OverlapFold,
                                 ModeFold, HistoryFold, TrainedFold], ids=lambda c: c.__name__)
def test_each_fold_is_routed_every_kind_it_reads(cls: type) -> None:
    """SummaryFold sends a fold only the event kinds in its KINDS: every kind its feed
    tests for must be listed, or the fold would silently miss it."""
    source = inspect.getsource(cls.feed)
    read = set(re.findall(r"isinstance\(e, (?:ev\.)?(\w+)\)", source))
    assert read, source
    assert read <= {k.__name__ for k in cls.KINDS}  # type: ignore[attr-defined]


def test_a_damaged_ledger_is_kept_and_raised_where_it_is_used() -> None:
    fold = SummaryFold()
    fold.feed(ev.Started(ts=0, sample="g0.0#1", worker="w", epoch=0, version="not-a-version"))
    fold.feed(ev.Closed(ts=1))  # no raise: the pass reads on (verify reports what is wrong)
    assert isinstance(fold.error, ValueError)
    with pytest.raises(ValueError):
        fold.summary()
    with pytest.raises(ValueError):
        _ = fold.rows


@given(st.dictionaries(st.integers(-1, 8), st.integers(1, 30), max_size=6),
       st.sampled_from([0, 1, 50, 95, 99, 100]))
def test_lag_percentiles_off_the_histogram_equal_the_list_percentile(
    lags: dict[int, int], q: int,
) -> None:
    expanded = [float(lag) for lag, n in sorted(lags.items()) for _ in range(n)]
    got = lag_percentile(Counter(lags), q)  # moved from metrics to freshroll.figures.token_lag
    assert got == percentile(expanded, q) and type(got) is float


def test_lag_histogram_of_counts_is_the_histogram_of_samples(tmp_path: Path) -> None:
    from freshroll.report import plots

    lags = Counter({0: 7, 1: 12, 2: 3})
    assert plots.lag_histogram(lags, 1) == plots.lag_histogram(sorted(lags.elements()), 1)

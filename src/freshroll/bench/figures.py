"""The figures of the bench table, from stage capacities and finished run directories.

Each figure is one pure function (numbers in, a number out); :func:`run_figures` reads
what they need from a run directory (``summary.json`` and the ledger, the run directory
being the report contract), and :func:`table_rows` puts a table together. Definitions
(docs/bench.md repeats them):

Stage capacities (measured in isolation, :mod:`freshroll.bench.capacity`), each in
samples per second of the run's clock: generation ``c_gen`` (the worker pool fed
without admission limit), reward ``c_reward``, trainer ``c_train`` (fed from a full
buffer), and weight transfer ``c_sync = B / s_per_version``. With ``B`` samples per
trainer step, the per-batch stage times are ``t_x = B / c_x`` (``t_sync`` = seconds per
version)::

    E       = accepted/s / min(c_gen, c_reward, c_train, c_sync)     pipeline efficiency
    window bound = min(1, W·B / (λ·L))       the most of the trainer's demand the freshness
              window can feed (summary.json window_bound, freshroll.figures.window: W the
              admission window in trainer steps, η + 1 unless run.admission_window; L the
              run's mean group latency, λ its own trainer's groups/s; on a train-bound
              workload E stays under it, up to c_train against the run's own trainer step)
    speedup = accepted/s / accepted/s of the synchronous baseline (max_staleness 0)
    bound   = (t_gen + t_reward + t_train + t_sync) / max(t_x)      ideal async / sync
    A       = speedup / max(1, min(bound, parallel limit))         bound attainment
    t-reward vs sync = seconds to the middle reward level / sync's (reward_s_ratio: time to
              reward, freshroll.figures.reward_time; throughput is not convergence)

``bound`` is what a perfect pipeline gains over a perfect lock-step loop: the lock-step
loop pays every stage per batch, the pipeline only the slowest. Asynchrony "pays" on a
workload when the best measured speedup is at least :data:`PAYS_AT` (1.05).

Worker-seconds (from the ledger): each worker epoch counts from its ``worker_started``
to its ``worker_fenced``, or else to its incarnation's end (``closed``, or the last event
before the next ``opened`` when a crash left no ``closed``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from freshroll.errors import ConfigError
from freshroll.figures import reward_time
from freshroll.figures.metrics_log import read_rows
from freshroll.ledger import events as ev
from freshroll.ledger.events import DECODER
from freshroll.ledger.store import LEDGER_FILE, Ledger

#: the speedup below which the table says asynchrony does not pay on the workload
PAYS_AT: Final = 1.05
STAGES: Final = ("gen", "reward", "train", "sync")


@dataclass(frozen=True, slots=True)
class Capacities:
    """Stage capacities in isolation, in samples per second of one clock."""

    batch: int  # samples per trainer step (B = batch_groups x group_size)
    gen_per_s: float  # the whole worker pool, fed without admission limit
    reward_per_s: float
    train_per_s: float
    transfer_s: float  # seconds to install one policy version on a worker
    gen_per_worker_per_s: float = 0.0  # one worker alone (to size the pool)

    def per_s(self) -> dict[str, float]:
        """Every stage's capacity in samples/s (``sync``: ``B / transfer_s``)."""
        sync = self.batch / self.transfer_s if self.transfer_s > 0 else math.inf
        return {"gen": self.gen_per_s, "reward": self.reward_per_s,
                "train": self.train_per_s, "sync": sync}

    def scaled(self, time_scale: float) -> Capacities:
        """The same capacities on a clock where every duration is ``time_scale`` times longer."""
        return replace(
            self, gen_per_s=self.gen_per_s / time_scale,
            reward_per_s=self.reward_per_s / time_scale,
            train_per_s=self.train_per_s / time_scale, transfer_s=self.transfer_s * time_scale,
            gen_per_worker_per_s=self.gen_per_worker_per_s / time_scale,
        )


def stage_times(c: Capacities) -> dict[str, float]:
    """Per-batch seconds of each stage: ``t_x = B / c_x``; ``t_sync`` = seconds per version."""
    return {name: (c.batch / rate if rate > 0 else math.inf) if name != "sync" else c.transfer_s
            for name, rate in c.per_s().items()}


def min_capacity(c: Capacities) -> float:
    return min(c.per_s().values())


def binding_stage(c: Capacities) -> str:
    """The stage with the least capacity (the one that bounds any pipeline)."""
    rates = c.per_s()
    return min(STAGES, key=lambda s: rates[s])


def efficiency(accepted_per_s: float, c: Capacities) -> float:
    """E = accepted/s / min(stage capacities)."""
    low = min_capacity(c)
    return accepted_per_s / low if low > 0 else math.nan


def speedup(accepted_per_s: float, sync_per_s: float) -> float:
    """Accepted rollouts/s over the synchronous baseline's."""
    return accepted_per_s / sync_per_s if sync_per_s > 0 else math.nan


def async_bound(c: Capacities) -> float:
    """(t_gen + t_reward + t_train + t_sync) / max t_x: the ideal speedup of a pipeline."""
    times = stage_times(c).values()
    top = max(times)
    return sum(times) / top if top > 0 and math.isfinite(top) else math.nan


def attainment(speedup_value: float, c: Capacities | float,
               limit: float = math.inf) -> float:
    """A = speedup / max(1, min(bound, limit)): the speedup over what the tighter of the
    pipeline's stage bound (:func:`async_bound` of ``c``, or ``c`` itself: a bound measured
    otherwise) and the machine's parallel limit allows. A non-finite or non-positive bound or
    limit is left out (NaN: neither is known); the denominator is never below 1, since a
    bound measured under 1 on a busy machine would let an async run slower than sync "attain"
    it, while sync itself is always there to match. The one definition of A, for
    ``freshroll bench`` and ``benchmarks/async_sweep.py``."""
    bound = async_bound(c) if isinstance(c, Capacities) else c
    caps = [x for x in (bound, limit) if math.isfinite(x) and x > 0]
    if not caps or not math.isfinite(speedup_value):
        return math.nan
    return speedup_value / max(1.0, min(caps))


def async_pays(speedups: Iterable[float]) -> bool:
    """Does asynchrony pay on this workload: a finite speedup of at least :data:`PAYS_AT`."""
    return any(s >= PAYS_AT for s in speedups if math.isfinite(s))


def workers_for_demand(c: Capacities) -> int:
    """Workers whose generation matches the trainer's demand: ceil(c_train / c_gen per worker)."""
    if c.gen_per_worker_per_s <= 0:
        return 1
    return max(1, math.ceil(c.train_per_s / c.gen_per_worker_per_s - 1e-9))


def worker_seconds(events: Iterable[ev.Event]) -> float:
    """Sum over worker epochs of ``worker_started`` .. ``worker_fenced`` or the incarnation's
    end (its ``closed``, or its last event when a crash left none)."""
    total, live, last = 0.0, dict[tuple[str, int], float](), None
    for e in events:
        if isinstance(e, ev.Opened) and last is not None:  # a crash: no closed came
            total += sum(last - t for t in live.values())
            live.clear()
        if isinstance(e, ev.WorkerStarted):
            live[(e.worker, e.epoch)] = e.ts
        elif isinstance(e, ev.WorkerFenced):
            started = live.pop((e.worker, e.epoch), None)
            if started is not None:
                total += e.ts - started
        elif isinstance(e, ev.Closed):
            total += sum(e.ts - t for t in live.values())
            live.clear()
        last = e.ts
    if last is not None:
        total += sum(last - t for t in live.values())
    return total


_WORKER_KINDS: Final = frozenset({"opened", "closed", "worker_started", "worker_fenced"})


def worker_events(run_dir: Path) -> Iterator[ev.Event]:
    """The ledger's events that :func:`worker_seconds` reads: worker and incarnation
    boundaries, plus the last event before each ``opened`` and at the end (decoding only
    those keeps a million-sample ledger fast)."""
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        previous: bytes | None = None
        for _seq, kind, body in ledger.rows():
            if kind == "opened" and previous is not None:
                yield DECODER.decode(previous)
            if kind in _WORKER_KINDS:
                yield DECODER.decode(body)
                previous = None
            else:
                previous = body
        if previous is not None:
            yield DECODER.decode(previous)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What the table shows of one run, read from its run directory."""

    label: str
    accepted_per_s: float
    trainer_idle: float
    discard_rate: float
    lag_p50: float
    lag_p99: float
    lag_max: int
    worker_seconds: float
    steps: int
    accepted: int
    wall_s: float  # the run's clock (virtual seconds on a virtual clock)
    verify_ok: bool = True
    settings: Mapping[str, Any] | None = None
    #: (step, t, reward) of each metrics.jsonl row with a reward (time to reward)
    curve: tuple[reward_time.Point, ...] = ()
    #: summary.json's window_bound.bound: the share of the trainer's demand the freshness
    #: window can feed (freshroll.figures.window; NaN: not known)
    window_bound: float = math.nan


def run_figures(run_dir: Path, label: str, *, verify_ok: bool = True,
                settings: Mapping[str, Any] | None = None) -> RunFigures:
    """The figures of a finished run from its ``summary.json`` and ledger."""
    path = run_dir / "summary.json"
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a finished run's summary ({exc})") from exc
    return RunFigures(
        label=label, accepted_per_s=float(s["accepted_rollouts_per_s"]),
        trainer_idle=float(s["trainer_idle_ratio"]), discard_rate=float(s["discard_rate"]),
        lag_p50=float(s["lag"]["p50"]), lag_p99=float(s["lag"]["p99"]),
        lag_max=int(s["lag"]["max"]), worker_seconds=worker_seconds(worker_events(run_dir)),
        steps=int(s["steps"]), accepted=int(s["accepted_rollouts"]), wall_s=float(s["wall_s"]),
        verify_ok=verify_ok, settings=settings,
        curve=tuple(reward_time.curve(read_rows(run_dir / "metrics.jsonl")[0])),
        window_bound=_window_bound(s),
    )


def _window_bound(summary: Mapping[str, Any]) -> float:
    """summary.json's ``window_bound.bound`` (NaN: absent, or null)."""
    w = summary.get("window_bound")
    bound = w.get("bound") if isinstance(w, dict) else None
    return float(bound) if isinstance(bound, int | float) else math.nan


def reward_s_ratio(run: RunFigures, sync: RunFigures) -> float:
    """Seconds ``run`` needed to reach the middle reward level over the seconds ``sync``
    needed (:func:`freshroll.figures.reward_time.compare`; < 1: it got there sooner); NaN
    where either has no reward, neither progressed, or one never reached it."""
    mid = [lv for lv in reward_time.compare(run.curve, sync.curve)["levels"] if lv["frac"] == 0.5]
    ratio = mid[0]["s_ratio"] if mid else None
    return float(ratio) if ratio is not None else math.nan


def table_rows(runs: Sequence[RunFigures], sync_label: str, c: Capacities) -> list[dict[str, Any]]:
    """One row per run: its figures with E, speedup and A against ``sync_label``'s run."""
    sync = next((r for r in runs if r.label == sync_label), None)
    if sync is None:
        raise ValueError(f"no run labelled {sync_label!r} among {[r.label for r in runs]}")
    out = []
    for r in runs:
        up = speedup(r.accepted_per_s, sync.accepted_per_s)
        out.append({
            "run": r.label, "accepted_per_s": r.accepted_per_s,
            "E": efficiency(r.accepted_per_s, c), "window_bound": r.window_bound,
            "speedup": up, "A": attainment(up, c),
            "reward_s_ratio": reward_s_ratio(r, sync),
            "trainer_idle": r.trainer_idle, "discard_rate": r.discard_rate,
            "lag_p50": r.lag_p50, "lag_p99": r.lag_p99, "lag_max": r.lag_max,
            "worker_s": r.worker_seconds, "steps": r.steps, "wall_s": r.wall_s,
            "verify": r.verify_ok, "settings": dict(r.settings or {}),
        })
    return out


#: the numeric columns of a row that several seeds average (mean ± sample sd)
SEED_KEYS: Final = ("accepted_per_s", "E", "window_bound", "speedup", "A", "reward_s_ratio",
                    "trainer_idle", "discard_rate", "lag_p50", "lag_p99", "lag_max", "worker_s",
                    "steps", "wall_s", "load")


def mean_sd(xs: Iterable[float]) -> tuple[float, float]:
    """The mean and the sample sd of the finite ``xs`` (NaN for none; sd NaN for one)."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else math.nan


def aggregate_rows(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One row per run over several seeds (``per_seed``: seed -> its :func:`table_rows`, the
    same runs in the same order): each of :data:`SEED_KEYS` the mean over the seeds, its
    sample sd under ``sd``; ``verify`` true only if every seed's run verified; ``seeds`` the
    count and ``per_seed`` each seed's own row (``seed`` added; ``load``, where the rows
    carry it, the 1-minute load average after the run). A seed's speedup, A and
    t-reward are against the same seed's ``sync``, then averaged."""
    seeds = list(per_seed)
    if not seeds:
        raise ValueError("no seed to aggregate")
    labels = [r["run"] for r in per_seed[seeds[0]]]
    for s in seeds:
        if [r["run"] for r in per_seed[s]] != labels:
            raise ValueError(f"seed {s}: runs {[r['run'] for r in per_seed[s]]} != {labels}")
    out = []
    for i, label in enumerate(labels):
        rows = [per_seed[s][i] for s in seeds]
        stats = {k: mean_sd(r[k] for r in rows) for k in SEED_KEYS if k in rows[0]}
        out.append({
            "run": label, **{k: m for k, (m, _) in stats.items()},
            "sd": {k: sd for k, (_, sd) in stats.items()},
            "verify": all(r["verify"] for r in rows), "settings": dict(rows[0]["settings"]),
            "seeds": len(rows), "per_seed": [{"seed": s, **r} for s, r in zip(seeds, rows,
                                                                             strict=True)],
        })
    return out


__all__ = [
    "PAYS_AT", "SEED_KEYS", "Capacities", "RunFigures", "aggregate_rows", "async_bound",
    "async_pays", "attainment", "binding_stage", "efficiency", "mean_sd", "min_capacity",
    "run_figures", "speedup", "stage_times", "table_rows", "worker_events", "worker_seconds",
    "workers_for_demand",
]

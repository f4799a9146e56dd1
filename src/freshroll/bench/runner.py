"""The plan of a bench and running it: capacities first, then every run of the table.

One workload (a config) and one seed; per clock, in one invocation:

1. the stage capacities in isolation (:mod:`freshroll.bench.capacity`);
2. ``sync``: the synchronous baseline (``run.max_staleness = 0``, static settings);
3. at least three static settings (``control.mode: static``), chosen from the capacities
   (:func:`plan_runs`): ``static-all`` (every worker of the pool), ``static-matched`` (the
   worker count whose generation matches the trainer's demand, ``ceil(c_train / c_gen per
   worker)``), ``static-tuned`` (matched plus 25% headroom for the tail), and
   ``static-lean`` (half of matched); on a pool of one worker (the embedded default) the
   settings vary the per-worker batch and the admission limit instead;
4. ``adaptive``: the controller (``control.mode: adaptive``) within the pool, starting
   from the config's ``rollout.workers``; on simulated engines also ``adaptive-deadline``,
   the same with group deadlines (``tail.deadline: true``, long-tail handling) when the
   config does not already set them;
5. on simulated engines, unless the config over-provisions already, the tail levers:
   ``static-overprov`` (``static-all`` with ``tail.overprovision: auto``, the binomial rule),
   ``static-overprov-deadline`` (the same with group deadlines) and ``adaptive-tails`` (the
   controller with ``tail.overprovision: auto``: it moves the extras and deadlines itself,
   :mod:`freshroll.control.levers`); each table then carries the long-tail figures of every
   run (:mod:`freshroll.bench.tails`);
6. on simulated engines, unless the config sets ``rollout.on_update`` already, in-flight
   weight updates: ``static-continue`` (``static-all`` with ``rollout.on_update: continue``,
   the bound on the oldest token) and ``static-continue-newest`` (the same with
   ``run.staleness_basis: newest_token``), and with the tail levers ``adaptive-all``
   (``adaptive-tails`` with both).

The pool is ``control.max_workers`` (or ``rollout.workers`` when unset); the synchronous
baseline runs on the whole pool.

Every run goes through :func:`freshroll.runtime.run.run` (the real pipeline, kernel and
controller), writes its own run directory under ``OUT/<clock>/<run>`` and is verified.
The real clock of a simulated workload runs with a small ``sim.time_scale``
(:func:`real_time_scale`), so that it takes seconds; its capacities are the virtual ones
scaled by the same factor (every simulated duration is multiplied by it), and so are the
timeouts and the controller's intervals (:data:`MODEL_TIME_KEYS`): they are the modelled
cluster's seconds.
"""

from __future__ import annotations

import copy
import io
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

from freshroll.bench import figures as f
from freshroll.bench import tails
from freshroll.bench.table import make_table, render_json, render_markdown
from freshroll.config import Config, set_dotted, validate
from freshroll.engines.specs import engine_spec
from freshroll.errors import ConfigError

#: --quick: a CI smoke run of seconds
QUICK_STEPS = 4
#: steps of a real-clock run of a simulated workload (its virtual twin runs run.steps)
REAL_STEPS = 12
#: a real-clock step should not be shorter than this (seconds), or the orchestrator's own
#: per-sample work on a shared CPU, not the modelled cluster, sets the pace
MIN_REAL_STEP_S = 0.2


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of the table: its label and the config keys it sets."""

    label: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        return dict(self.overrides)


def with_overrides(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """``cfg`` with dotted keys set (``{"run.max_staleness": 0}``), validated again."""
    data = cfg.model_dump(mode="json")
    for key, value in overrides.items():
        set_dotted(data, key, copy.deepcopy(value), f"bench override {key!r}")
    return validate(data, "bench config")


def quick_overrides(cfg: Config) -> dict[str, Any]:
    """--quick: few steps, small shapes."""
    out: dict[str, Any] = {"run.steps": QUICK_STEPS, "rollout.group_size": 4,
                           "rollout.batch_groups": 2}
    if _sim(cfg):
        out["rollout.workers"] = min(cfg.rollout.workers, 4)
        out["rollout.worker_batch"] = min(cfg.rollout.call_batch, 8)
        if cfg.control.max_workers is not None:
            out["control.max_workers"] = min(cfg.control.max_workers, 4)
    else:
        if cfg.task.n_prompts is not None:  # the built-in task's (a dataset is as it is)
            out["task.n_prompts"] = min(cfg.task.n_prompts, 256)
        out["rollout.worker_batch"] = min(cfg.rollout.call_batch, 8)
    return out


def plan_runs(cfg: Config, caps: f.Capacities) -> list[RunSpec]:
    """The runs of one table, from the workload and its capacities (see the module doc)."""
    eta = max(1, cfg.run.max_staleness)
    pool = cfg.control.max_workers or cfg.rollout.workers
    batch = cfg.rollout.call_batch
    base = {"control.mode": "static", "rollout.max_inflight_groups": None}
    specs = [RunSpec("sync", {**base, "run.max_staleness": 0, "rollout.workers": pool})]
    statics: list[RunSpec] = []

    def add(label: str, **kw: Any) -> None:
        over = {**base, "run.max_staleness": eta, **{k.replace("__", "."): v
                                                    for k, v in kw.items()}}
        if all(s.overrides != over for s in statics):
            statics.append(RunSpec(label, over))

    matched = min(pool, f.workers_for_demand(caps))
    add("static-all", rollout__workers=pool)
    add("static-matched", rollout__workers=matched)
    add("static-tuned", rollout__workers=min(pool, math.ceil(1.25 * matched)))
    add("static-lean", rollout__workers=max(1, matched // 2))
    if len(statics) < 3:  # a pool of one: vary the per-worker batch and the admission limit
        add("static-halfbatch", rollout__workers=pool, rollout__worker_batch=max(1, batch // 2))
        add("static-admit1", rollout__workers=pool,
            rollout__max_inflight_groups=cfg.rollout.batch_groups)
        add("static-doublebatch", rollout__workers=pool, rollout__worker_batch=2 * batch)
    ctl = {"control.mode": "adaptive", "run.max_staleness": eta,
           "rollout.max_inflight_groups": None, "control.max_workers": pool}
    adaptive = [RunSpec("adaptive", ctl)]
    if _sim(cfg) and not cfg.tail.deadline:  # long-tail handling vs none
        adaptive.append(RunSpec("adaptive-deadline", {**ctl, "tail.deadline": True}))
    if _sim(cfg) and cfg.tail.overprovision == 0:  # the tail levers
        over = {**statics[0].overrides, "tail.overprovision": "auto"}
        statics.append(RunSpec("static-overprov", over))
        statics.append(RunSpec("static-overprov-deadline", {**over, "tail.deadline": True}))
        adaptive.append(RunSpec("adaptive-tails", {**ctl, "tail.overprovision": "auto"}))
    if _sim(cfg) and cfg.rollout.on_update in (None, "finish"):
        cont = {**statics[0].overrides, "rollout.on_update": "continue"}  # in-flight updates
        statics.append(RunSpec("static-continue", cont))
        newest = {"rollout.on_update": "continue", "run.staleness_basis": "newest_token"}
        statics.append(RunSpec("static-continue-newest", {**cont, **newest}))
        tails = [a for a in adaptive if a.label == "adaptive-tails"]
        if tails:  # every lever together: the controller's tail levers and in-flight updates
            adaptive.append(RunSpec("adaptive-all", {**tails[0].overrides, **newest}))
    return [*specs, *statics, *adaptive]


def real_time_scale(caps_virtual: f.Capacities, steps: int, target_s: float,
                    min_step_s: float = MIN_REAL_STEP_S,
                    sync_step_s: float | None = None) -> float:
    """``sim.time_scale`` for a real-clock run: the synchronous run's duration (``steps x
    sync_step_s``, its measured virtual seconds per step; unknown: the ideal ``sum t_x``)
    scaled to ``target_s``, but no async step (``max t_x``) shorter than ``min_step_s``;
    within (0, 1]."""
    times = f.stage_times(caps_virtual)
    per_step = sync_step_s if sync_step_s is not None else sum(times.values())
    total, top = steps * per_step, max(times.values())
    if not (math.isfinite(total) and total > 0):
        return 1.0
    scale = max(target_s / total, min_step_s / top if top > 0 else 0.0)
    return min(1.0, scale)


#: settings in seconds of the run's clock that model the cluster's time (a real-clock run of
#: a simulated workload multiplies them by sim.time_scale, as every simulated duration)
MODEL_TIME_KEYS = (
    "limits.generate_timeout_s", "limits.weights_timeout_s", "limits.worker_start_timeout_s",
    "limits.reward_timeout_s", "control.interval_s", "control.up_cooldown_s",
    "control.down_cooldown_s",
)


def scaled_settings(cfg: Config, scale: float) -> dict[str, Any]:
    """The :data:`MODEL_TIME_KEYS` of ``cfg`` multiplied by ``scale``."""
    data = cfg.model_dump(mode="json")
    out = {}
    for key in MODEL_TIME_KEYS:
        section, name = key.split(".")
        out[key] = data[section][name] * scale
    return out


def busy_warning(load: float, cores: int, cfg: Config) -> str:
    """A line for a real-clock table started on a busy machine (1-minute load average above
    half the cores), else "": the scaled timeouts are short, and the orchestrator's event loop
    is not scaled, so its stalls on a busy machine can read as timed-out calls (three in a
    row stop a run, ``limits.max_consecutive_timeouts``, and with it the bench)."""
    if not (load > cores / 2):
        return ""
    return (f"  warning: load average {load:.2f} on {cores} cores; the real clock's timeouts are "
            f"scaled (limits.reward_timeout_s {cfg.limits.reward_timeout_s:.3g} s) and a busy "
            "machine's stalls can time calls out: measure on a quiet machine\n")


@dataclass
class BenchResult:
    tables: list[dict[str, Any]]
    out: Path


def _measure_capacities(cfg: Config, quick: bool) -> f.Capacities:
    from freshroll.bench.parts import measure_capacities

    return measure_capacities(cfg, quick=quick)


def bench(cfg: Config, out: Path, *, workload: str, quick: bool = False,
          clocks: Sequence[str] = ("virtual",), stream: TextIO,
          capacities: Callable[[Config, bool], f.Capacities] = _measure_capacities,
          seeds: Sequence[int] | None = None, jobs: int = 1,
          ) -> BenchResult:
    """Measure the capacities, run every planned run per clock, write the tables.

    ``seeds``: run every row once per seed (``run.seed``), each in ``OUT/<clock>/<run>/
    seed-<s>``, and show each figure as the mean ± sd over them; ``None`` (the default): the
    config's seed, once, in ``OUT/<clock>/<run>``. The capacities are measured once, at the
    config's seed. ``jobs``: how many runs at once, each in its own process."""
    _check_args(seeds, jobs)
    if quick:
        cfg = with_overrides(cfg, quick_overrides(cfg))
    if not _sim(cfg):
        clocks = ("real",)  # a real model runs on the real clock only
    out.mkdir(parents=True, exist_ok=True)
    stream.write(f"bench {workload}: measuring stage capacities in isolation ...\n")
    t0 = time.perf_counter()
    caps0 = capacities(cfg, quick)
    stream.write(f"  ({time.perf_counter() - t0:.1f} s)\n")
    tables: list[dict[str, Any]] = []
    sync_step_s: float | None = None  # virtual seconds per synchronous step
    runner = _Runner(stream, jobs)
    try:
        for clock in sorted(clocks, key=lambda c: c != "virtual"):  # virtual first
            if not _sim(cfg):
                tables.append(_table(cfg, caps0, workload, clock, out, runner, seeds)[0])
                continue
            run_cfg = with_overrides(cfg, {"sim.clock": clock})
            if clock == "virtual":
                table, runs = _table(run_cfg, caps0, workload, clock, out, runner, seeds)
                sync = runs[0]
                sync_step_s = sync.wall_s / sync.steps if sync.steps else None
                tables.append(table)
                continue
            steps = min(cfg.run.steps, QUICK_STEPS if quick else REAL_STEPS)
            if sync_step_s is None:  # a real-clock table alone: time the sync run virtually
                probe_cfg = with_overrides(run_cfg, {"sim.clock": "virtual", "run.steps": steps})
                probe = runner.run_all(probe_cfg, [(plan_runs(run_cfg, caps0)[0],
                                                    out / "virtual-probe" / "sync")],
                                       "virtual")[0]
                sync_step_s = probe.wall_s / probe.steps if probe.steps else None
            scale = real_time_scale(caps0, steps, 1.0 if quick else 10.0,
                                    0.02 if quick else MIN_REAL_STEP_S, sync_step_s)
            real_cfg = with_overrides(run_cfg, {"run.steps": steps,
                                                "sim.time_scale": scale * cfg.sim.time_scale,
                                                **scaled_settings(run_cfg, scale)})
            stream.write(f"  real clock: {steps} steps at sim.time_scale {scale:.4g}\n"
                         + busy_warning(_load(), os.cpu_count() or 1, real_cfg))
            tables.append(_table(real_cfg, caps0.scaled(scale), workload, clock, out, runner,
                                 seeds)[0])
    finally:
        runner.close()
    (out / "bench.md").write_text("".join(render_markdown(t) for t in tables))
    (out / "bench.json").write_text(render_json(tables))
    return BenchResult(tables, out)


def _check_args(seeds: Sequence[int] | None, jobs: int) -> None:
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1")
    if seeds is not None:
        if not seeds:
            raise ConfigError("--seeds: give at least one seed")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: a seed given twice")
        if any(s < 0 for s in seeds):
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: seeds are >= 0")


def _table(cfg: Config, caps: f.Capacities, workload: str, clock: str, out: Path,
           runner: _Runner, seeds: Sequence[int] | None = None,
           ) -> tuple[dict[str, Any], list[f.RunFigures]]:
    """Every planned run of ``cfg`` on one clock (per seed of ``seeds``), and their table;
    the runs returned are the first seed's."""
    specs = plan_runs(cfg, caps)
    root = out / clock
    changes = [step for step, _ in cfg.sim.trainer_speed] if _sim(cfg) else []
    if seeds is None:
        runs = runner.run_all(cfg, [(spec, root / spec.label) for spec in specs], clock)
        table = make_table(workload, clock, caps, f.table_rows(runs, "sync", caps))
        if _sim(cfg):
            table["tails"] = [tails.tail_row(root / s.label, s.label, changes) for s in specs]
    else:
        t0, load0 = time.perf_counter(), _load()
        jobs = [(RunSpec(spec.label, {**spec.overrides, "run.seed": seed}),
                 root / spec.label / f"seed-{seed}") for spec in specs for seed in seeds]
        done = runner.run_all(cfg, jobs, clock)  # row by row, every seed of a row together
        by_seed = {seed: done[i::len(seeds)] for i, seed in enumerate(seeds)}
        per_seed = {}
        for seed, seed_runs in by_seed.items():
            rows = f.table_rows(seed_runs, "sync", caps)
            for row, run in zip(rows, seed_runs, strict=True):
                row["load"] = runner.loads[run.label, seed]
            per_seed[seed] = rows
        table = make_table(workload, clock, caps, f.aggregate_rows(per_seed))
        table.update(seeds=list(seeds), capacity_seed=cfg.run.seed, runs=len(jobs),
                     wall_s=time.perf_counter() - t0, load_start=load0, load_end=_load())
        if _sim(cfg):
            table["tails"] = tails.aggregate_tails({
                seed: [tails.tail_row(root / s.label / f"seed-{seed}", s.label, changes)
                       for s in specs] for seed in seeds})
        runs = by_seed[seeds[0]]
    if _sim(cfg):
        table["time_scale"] = cfg.sim.time_scale
    table["steps"] = cfg.run.steps
    return table, runs


def _load() -> float:
    """The 1-minute load average (NaN where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


def _run(cfg: Config, spec: RunSpec, path: Path) -> tuple[f.RunFigures, float]:
    """One run of the table, through the real ``run()``; its figures from its run dir, and
    its wall seconds. The run is verified but draws no ``report.html`` (no table reads it;
    ~0.02 CPU-s for a short run since its figures are SVG, ~1 CPU-s as PNGs): ``freshroll
    report OUT/<clock>/<run>`` draws any run's page."""
    from freshroll.runtime.run import run

    rcfg = with_overrides(cfg, {"run.progress": False, **spec.overrides})
    t1 = time.perf_counter()
    result = run(rcfg, path, stream=io.StringIO(), report=False)  # the bench prints its own
    figs = f.run_figures(path, spec.label, verify_ok=result.ok, settings=spec.settings())
    return figs, time.perf_counter() - t1


class _Runner:
    """Runs a table's runs, one at a time in this process or ``jobs`` at once in worker
    processes (each run is independent: its own run directory, ledger and clock), and
    prints a line per finished run with the load average after it (kept in ``loads``)."""

    def __init__(self, stream: TextIO, jobs: int) -> None:
        self.stream, self.jobs = stream, jobs
        self.loads: dict[tuple[str, int | None], float] = {}
        self._pool: ProcessPoolExecutor | None = None

    def run_all(self, cfg: Config, jobs: Sequence[tuple[RunSpec, Path]], clock: str,
                ) -> list[f.RunFigures]:
        """The figures of every ``(spec, run dir)`` of ``jobs``, in their order."""
        if self.jobs == 1 or len(jobs) == 1:
            return [self._done(clock, spec, *_run(cfg, spec, path)) for spec, path in jobs]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=get_context("spawn"))
        futures = {self._pool.submit(_run, cfg, spec, path): i
                   for i, (spec, path) in enumerate(jobs)}
        out: list[f.RunFigures | None] = [None] * len(jobs)
        for fut in as_completed(futures):
            i = futures[fut]
            out[i] = self._done(clock, jobs[i][0], *fut.result())
        return [x for x in out if x is not None]

    def _done(self, clock: str, spec: RunSpec, figs: f.RunFigures, wall: float) -> f.RunFigures:
        seed = spec.overrides.get("run.seed")
        load = _load()
        self.loads[spec.label, seed] = load
        name = spec.label if seed is None else f"{spec.label} seed {seed}"
        self.stream.write(f"  {clock:7} {name:25} accepted/s {figs.accepted_per_s:9.2f}  "
                          f"steps {figs.steps}  ({wall:.1f} s wall, load {load:.2f})\n")
        self.stream.flush()
        return figs

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None



def _sim(cfg: Config) -> bool:
    """The simulated cluster (engine spec): its runs, clocks and figures of its own."""
    return engine_spec(cfg.rollout.engine).simulated

__all__ = ["BenchResult", "RunSpec", "bench", "busy_warning", "plan_runs", "quick_overrides",
           "real_time_scale", "with_overrides"]

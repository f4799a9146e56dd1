"""``freshroll validate``: run the repeats, read their run directories, gate, write the record.

::

    ACCEPTANCE.yaml --load--> workload config, seeds, gates      (:mod:`.acceptance`)
      for each seed k:  OUT/async-seed<k>   the workload, run.seed = k
                        OUT/sync-seed<k>    the same, run.max_staleness = 0 (when a gate
                                            compares with the synchronous baseline)
      each through freshroll.runtime.run.run(cfg, dir, report=False): the real pipeline,
      verified at its end; its figures read back from the run directory (summary.json via
      :func:`freshroll.bench.figures.run_figures`, metrics.jsonl, counts.json, the ledger's
      controller decisions, fences and faults)
      recovery: for each scenario x seed, freshroll.chaos.runner.run_case(...) under
                        OUT/recovery (its layout: <placement>/<scenario>/seed-<k>/run)
    -> gates (:mod:`.gates`) -> OUT/decision.md + OUT/decision.json (:mod:`.record`)

A repeat whose run raises (a failure budget spent, ...) is kept as a failed repeat (the
``verify`` gate fails, naming it) and the others still run, unless
:data:`MAX_FAILED_IN_A_ROW` repeats in a row failed so: a failure that repeats stops the
runs, and the rest are recorded as not run, quoting the first error; a config error (the workload's
files) and an interrupt end the validation. OUT holds one validation: a second one into the
same OUT replaces the run directories the first wrote (OUT/acceptance.yaml marks it);
a non-empty OUT without that mark is refused.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from freshroll.bench.figures import run_figures
from freshroll.bench.runner import with_overrides
from freshroll.config import Config
from freshroll.engines.specs import engine_spec
from freshroll.errors import ConfigError, FreshrollError, Interrupted, RunDirError
from freshroll.figures import reward_time
from freshroll.figures.metrics import jsonable
from freshroll.figures.summary import SUMMARY_FILE, read_metrics
from freshroll.figures.verdict import render as render_verdict
from freshroll.ledger.events import DECODER
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.validate import record
from freshroll.validate.acceptance import Loaded, load, seed_list
from freshroll.validate.gates import FIGURE_KEYS, Case, Measured, Repeat, evaluate

MARK = "acceptance.yaml"
#: repeats failing in a row (their run raised) after which the rest are not run
MAX_FAILED_IN_A_ROW = 2
RUN_FAILED = "the run failed: "
#: a chaos case: (plan, scenario, seed, out_dir, placement) -> CaseResult
RunCase = Callable[..., Any]


@dataclass
class Validation:
    decision: record.Decision
    out: Path


def validate(path: str | Path, out: Path, *, stream: TextIO = sys.stderr,
             run_case: RunCase | None = None) -> Validation:
    """Run ``path``'s repeats into ``out`` and write the decision record there."""
    t0 = time.perf_counter()
    load_start = _loadavg()
    loaded = load(path)
    _claim(out, Path(path))
    spec, cfg = loaded.spec, loaded.cfg
    seeds = spec.seed_list()
    modes = ["async", "sync"] if spec.needs_sync() else ["async"]
    total = len(seeds) * len(modes)
    stream.write(f"validate {loaded.name}: {len(seeds)} seed(s) {seeds}, "
                 f"{' + '.join(modes)}, {cfg.run.steps} steps each -> {out}\n")
    measured, signals = Measured(), []
    done = 0
    failing: list[str] = []  # the run errors of the last repeats, in a row
    for seed in seeds:
        for mode in modes:
            done += 1
            if len(failing) >= MAX_FAILED_IN_A_ROW:  # a failure that repeats stops the runs
                rep = skipped(mode, seed, out, failing[0])
                stream.write(f"  [{done}/{total}] {rep.label}: {rep.problem}\n")
            else:
                rep, sig = run_repeat(loaded, mode, seed, out, stream, f"{done}/{total}")
                signals.append(sig)
                run_error = rep.problem if rep.problem and rep.problem.startswith(
                    RUN_FAILED) else None
                failing = [*failing, run_error] if run_error else []
            (measured.async_runs if mode == "async" else measured.sync_runs).append(rep)
    if spec.gates.recovery is not None:
        measured.cases = run_recovery(loaded, out, stream, run_case, signals)
    reward = "eval reward (eval.file)" if cfg.eval.file is not None else "reward"
    criteria = evaluate(spec.gates, cfg.run.max_staleness, measured, reward)
    decision = record.build(
        name=loaded.name, acceptance=str(path), cfg=cfg, seeds=seeds, criteria=criteria,
        signals=signals, recovery=_recovery_json(measured.cases),
        time_to_reward=time_to_reward(measured),
        wall_s=time.perf_counter() - t0,
        environment={"cpus": os.cpu_count(), "loadavg_start": load_start,
                     "loadavg_end": _loadavg(), "clock": _clock(cfg)},
    )
    record.write(decision, out)
    return Validation(decision, out)


def time_to_reward(measured: Measured) -> list[dict[str, Any]]:
    """Each seed's async repeat against its sync repeat: the seconds and steps each needed
    to reach the same rewards (:func:`freshroll.figures.reward_time.compare_dirs`); none
    without sync repeats."""
    sync = {r.seed: r for r in measured.sync_runs}
    out = []
    for a in measured.async_runs:
        b = sync.get(a.seed)
        if b is None:
            continue
        cmp = reward_time.compare_dirs(Path(a.run_dir), Path(b.run_dir))
        out.append({"seed": a.seed, **jsonable(cmp), "baseline": b.run_dir})
    return out


def skipped(mode: str, seed: int, out: Path, first: str) -> Repeat:
    """A repeat not run because the repeats before it failed (their first error quoted)."""
    label = f"{mode}-seed{seed}"
    return Repeat(label=label, mode="async" if mode == "async" else "sync", seed=seed,
                  run_dir=str(out / label), figures=dict.fromkeys(FIGURE_KEYS), ok=False,
                  problem=f"not run: {MAX_FAILED_IN_A_ROW} repeats in a row failed; the first: "
                          f"{first.removeprefix(RUN_FAILED)}")


def _clock(cfg: Config) -> str:
    """The repeats' clock: virtual (a simulated cluster) or real (wall time)."""
    simulated = engine_spec(cfg.rollout.engine).simulated
    return "virtual" if simulated and cfg.sim.clock == "virtual" else "real"


def _loadavg() -> float | None:
    """The 1-minute load average (other work competing for the CPUs moves every rate)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _claim(out: Path, acceptance: Path) -> None:
    """Refuse an OUT holding something else; clear what a previous validation wrote there."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out}: is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARK).is_file():
            raise RunDirError(f"--out {out}: not empty and not a validation's directory (no "
                              f"{MARK}); choose another --out")
        for child in out.iterdir():
            name = child.name
            if name.startswith(("async-seed", "sync-seed")) or name == "recovery":
                shutil.rmtree(child)
            elif name.startswith("decision."):
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text(acceptance.read_text())


def repeat_config(cfg: Config, mode: str, seed: int) -> Config:
    over: dict[str, Any] = {"run.seed": seed, "run.progress": False}
    if mode == "sync":
        over["run.max_staleness"] = 0
    return with_overrides(cfg, over)


def run_repeat(loaded: Loaded, mode: str, seed: int, out: Path, stream: TextIO,
               progress: str = "") -> tuple[Repeat, dict[str, Any]]:
    """One repeat through ``run()``; its figures and failure signals from its run directory."""
    from freshroll.runtime.run import run

    label = f"{mode}-seed{seed}"
    run_dir = out / label
    cfg = repeat_config(loaded.cfg, mode, seed)
    t1 = time.perf_counter()
    stream.write(f"  [{progress}] {label} ...")
    stream.flush()
    problem: str | None = None
    ok = False
    try:
        result = run(cfg, run_dir, stream=io.StringIO(), report=False)
        ok = result.ok
        if not ok:
            problem = _violations(run_dir)
    except (ConfigError, Interrupted):
        stream.write(" stopped\n")
        raise
    except FreshrollError as exc:  # a failed run: kept, the verify gate names it
        problem = f"{RUN_FAILED}{exc}"
    figures = read_figures(run_dir, loaded)
    verdict = _read_summary(run_dir).get("verdict")
    if ok and verdict is not None and verdict.get("status") != "complete":
        ok, problem = False, render_verdict(verdict).splitlines()[0]
    rep = Repeat(label=label, mode="async" if mode == "async" else "sync", seed=seed,
                 run_dir=str(run_dir), figures=figures, ok=ok, problem=problem)
    acc = figures.get("accepted_per_s")
    stream.write(f" accepted/s {acc:.1f}" if acc is not None else " no figures")
    reward = figures.get("reward_window")
    if reward is not None:
        stream.write(f"  reward(last {_last_steps(loaded)}) {reward:.3f}")
    stream.write(f"  verify {'ok' if ok else 'FAILED'}  ({time.perf_counter() - t1:.1f} s)\n")
    if problem:
        stream.write(f"    {problem}\n")
    summary = _read_summary(run_dir)
    if (summary.get("overlap") or {}).get("verdict") == "did not pay":  # said plainly here too
        from freshroll.figures.overlap import render as render_overlap

        stream.write(f"    {render_overlap(summary['overlap'], summary.get('host'))}\n")
    return rep, signals_of(run_dir, label, mode, ok)


def _violations(run_dir: Path) -> str:
    from freshroll.harness.verify import verify_run

    try:
        report = verify_run(run_dir)
    except FreshrollError as exc:
        return f"verify: {exc}"
    return "verify: " + " | ".join(report.render().splitlines()[:4])


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last_steps(loaded: Loaded) -> int:
    conv = loaded.spec.gates.convergence
    return conv.last_steps if conv is not None else min(10, loaded.cfg.run.steps)


def read_figures(run_dir: Path, loaded: Loaded) -> dict[str, float | None]:
    """The gates' figures of one finished run (None where the run left none)."""
    out: dict[str, float | None] = dict.fromkeys(FIGURE_KEYS)
    try:
        figs = run_figures(run_dir, run_dir.name)
    except (FreshrollError, KeyError, TypeError, ValueError):
        return out
    out.update(accepted_per_s=figs.accepted_per_s, discard_rate=figs.discard_rate,
               lag_p99=figs.lag_p99, lag_max=float(figs.lag_max),
               trainer_idle_ratio=figs.trainer_idle)
    # with eval.file set, convergence is judged on the held-out set's reward (eval/reward)
    column = "eval/reward" if loaded.cfg.eval.file is not None else "reward_mean"
    out["reward_window"] = reward_window(run_dir, _last_steps(loaded), column)
    out["sample_bias"] = sample_bias_of(run_dir)
    out.update(learning_of(run_dir))
    return out


def learning_of(run_dir: Path) -> dict[str, float | None]:
    """``summary.json``'s ``learning``: ``collapsed`` (1.0 or 0.0) and the stale steps'
    ``mismatch_kl_stale`` (0.0 when no step trained on a stale sample); None without one."""
    learning = _read_summary(run_dir).get("learning")
    if not isinstance(learning, dict) or "verdict" not in learning:
        return {"collapsed": None, "mismatch_kl_stale": None}
    kl = learning.get("mismatch_kl_stale")
    stale = learning.get("stale_steps")
    if isinstance(kl, int | float) and math.isfinite(kl):
        value: float | None = float(kl)
    else:
        value = 0.0 if stale == 0 else None
    return {"collapsed": float(learning["verdict"] == "collapsed"), "mismatch_kl_stale": value}


def sample_bias_of(run_dir: Path) -> float | None:
    """``summary.json``'s ``sample_bias.divergence`` (None: no summary or no figure)."""
    try:
        bias = json.loads((run_dir / SUMMARY_FILE).read_text()).get("sample_bias")
    except (OSError, ValueError, AttributeError):
        return None
    value = bias.get("divergence") if isinstance(bias, dict) else None
    return float(value) if isinstance(value, int | float) else None


def reward_window(run_dir: Path, last_steps: int, column: str = "reward_mean") -> float | None:
    """The mean of ``metrics.jsonl``'s ``column`` (the training reward, ``reward_mean``, or
    the eval reward, ``eval/reward``, which the last step always has) over the rows of the
    last ``last_steps`` steps that hold it."""
    rows, _ = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        return None
    top = max(int(r["step"]) for r in rows)
    vals = [float(r[column]) for r in rows
            if int(r["step"]) > top - last_steps and isinstance(r.get(column), int | float)]
    return statistics.fmean(vals) if vals else None


_SIGNAL_KINDS = frozenset({"controller_decided", "worker_fenced", "fault_injected"})


def signals_of(run_dir: Path, label: str, mode: str, ok: bool) -> dict[str, Any]:
    """A run's diagnosis inputs: controller bottleneck verdicts, fences, faults (ledger),
    rejected results (counts.json), discards, idle, stages and verdict (summary.json)."""
    s = _read_summary(run_dir)
    bottlenecks: Counter[str] = Counter()
    fences: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    if (run_dir / LEDGER_FILE).is_file():
        try:
            with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
                for _seq, kind, body in ledger.rows():
                    if kind not in _SIGNAL_KINDS:
                        continue
                    e = DECODER.decode(body)
                    if kind == "controller_decided":
                        bottlenecks[getattr(e, "bottleneck", "unknown")] += 1
                    elif kind == "worker_fenced":
                        fences[getattr(e, "reason", "?")] += 1
                    else:
                        faults[getattr(e, "fault", "?")] += 1
        except FreshrollError:
            pass
    rejected: dict[str, int] = {}
    try:
        counts = json.loads((run_dir / "counts.json").read_text())
        rejected = {k.removeprefix("rejected_"): int(v) for k, v in counts.items()
                    if k.startswith("rejected_")}
    except (OSError, ValueError, AttributeError):
        pass
    stages = s.get("stages") or []
    top = max(stages, key=lambda r: r.get("share") or 0.0, default=None)
    return {
        "label": label, "mode": mode, "run_dir": str(run_dir), "ok": ok,
        "bottlenecks": dict(bottlenecks), "fences": dict(fences), "faults": dict(faults),
        "rejected": rejected, "discards": s.get("discards", {}),
        "trainer_idle_ratio": s.get("trainer_idle_ratio"),
        "top_stage": None if top is None else {"stage": top.get("stage"),
                                               "share": top.get("share")},
        "verdict": (s.get("verdict") or {}).get("status"),
        "first_failure": (s.get("verdict") or {}).get("first_failure", {}),
    }


def run_recovery(loaded: Loaded, out: Path, stream: TextIO, run_case: RunCase | None = None,
                 signals: list[dict[str, Any]] | None = None) -> list[Case] | str:
    """Every scenario x seed of the recovery gate through the chaos runner; or, when the
    runner is not in this build, the error every recovery gate fails with. ``signals``
    gets each faulted run's failure signals (mode ``chaos``)."""
    rec = loaded.spec.gates.recovery
    assert rec is not None and loaded.plan_path is not None
    if run_case is None:
        try:
            from freshroll.chaos.runner import run_case as found
        except ImportError as exc:
            msg = (f"the chaos runner (freshroll.chaos.runner.run_case) is not available in "
                   f"this build: {exc}; the recovery gates cannot be measured")
            stream.write(f"  recovery: {msg}\n")
            return msg
        run_case = found
    from freshroll.chaos.plan import load_plan

    plan = load_plan(loaded.plan_path)
    by_name = {s.name: s for s in plan.scenarios}
    seeds = seed_list(rec.seeds) if rec.seeds is not None else loaded.spec.seed_list()
    cases = []
    root = out / "recovery"  # the runner's layout below: <placement>/<scenario>/seed-<k>
    for name in rec.scenarios:
        for seed in seeds:
            case_dir = root / rec.placement / name / f"seed-{seed}"
            t1 = time.perf_counter()
            try:
                res = run_case(plan, by_name[name], seed, root, placement=rec.placement)
            except (ConfigError, Interrupted):
                raise
            except ImportError as exc:  # a part of the chaos harness missing from this build
                msg = (f"the chaos harness is incomplete in this build ({exc}); the recovery "
                       "gates cannot be measured")
                stream.write(f"  recovery: {msg}\n")
                return msg
            except FreshrollError as exc:
                cases.append(Case(name, seed, str(case_dir), None, (), f"{exc}"))
                stream.write(f"  recovery {name} seed {seed}: error {exc}\n")
                continue
            viol = tuple(f"{v.invariant}: {v.message}" for v in res.violations)
            cases.append(Case(name, seed, str(res.run_dir), res.recovery_s, viol,
                              throughput_ratio=res.throughput_ratio, outcome=res.outcome))
            if signals is not None:
                signals.append(signals_of(Path(res.run_dir), f"{name}-seed{seed}", "chaos",
                                          not viol))
            rs = "never" if res.recovery_s is None else f"{res.recovery_s:.1f} s"
            stream.write(f"  recovery {name} seed {seed}: {rs}, {len(viol)} violation(s)  "
                         f"({time.perf_counter() - t1:.1f} s)\n")
    return cases


def _recovery_json(cases: list[Case] | str) -> list[dict[str, Any]] | str:
    if isinstance(cases, str):
        return cases
    return [{"scenario": c.scenario, "seed": c.seed, "run_dir": c.run_dir,
             "recovery_s": c.recovery_s, "throughput_ratio": c.throughput_ratio,
             "outcome": c.outcome, "violations": list(c.violations), "error": c.error}
            for c in cases]


__all__ = ["Validation", "read_figures", "repeat_config", "reward_window", "run_recovery",
           "run_repeat", "signals_of", "validate"]

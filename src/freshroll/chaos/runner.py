"""The chaos runner: a whole plan over seeds (``freshroll chaos``), case by case.

:func:`run_plan` runs every scenario (or those named) x seed x placement through
:func:`~freshroll.chaos.case.run_case` (one case: its fault-free twin, its faulted run
incarnation by incarnation, its checks; :mod:`freshroll.chaos.case`), sharing the twins of a
seed and one zygote for the kill incarnations, in this process or over ``jobs`` worker
processes; :func:`chaos` is the command: the plan loaded, run, and its tables written
(``OUT/chaos.md``, ``OUT/chaos.json``). What a case is and how it is run is re-exported from
:mod:`freshroll.chaos.case`, the runner's public face for the command line, ``freshroll
validate`` and the chaos child.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from freshroll import unsafe
from freshroll.chaos.case import (
    BASELINE_HORIZON_S,
    CHILD_TIMEOUT_S,
    HORIZON_FACTOR,
    INJECTOR,
    KILL_KINDS,
    MAX_INCARNATIONS,
    Baseline,
    Baselines,
    Guard,
    LivenessTimeout,
    broken_switches,
    error_line,
    load_injector,
    outcome_of,
    read_events,
    run_case,
    run_in_process,
    workload_digest,
    workload_for,
)
from freshroll.chaos.child import ChildPool
from freshroll.chaos.plan import Plan, Scenario
from freshroll.chaos.real import skip_reason
from freshroll.chaos.result import CaseResult, Violation
from freshroll.errors import ConfigError


# == a plan =================================================================================
def run_plan(
    plan: Plan, seeds: Sequence[int], out_dir: Path, *, only: Sequence[str] | None = None,
    placements: Sequence[str] = ("sim",), progress: TextIO | None = None,
    broken: Sequence[str] = (), injector: str = INJECTOR,
    child_timeout_s: float = CHILD_TIMEOUT_S, fork: bool = True, jobs: int = 1,
    children: ChildPool | None = None,
) -> list[CaseResult]:
    """Every scenario (or those named in ``only``) x seed x placement; one progress line per
    case. Real placements run only the ``real: true`` scenarios whose faults apply there
    (:func:`freshroll.chaos.real.skip_reason`; a skipped one gets a line saying why).
    ``fork``: kill incarnations are forks of one zygote (:class:`ChildPool`) instead of a
    ``python -m`` each.

    ``jobs`` > 1: the seeds are shared out among that many worker processes (a forkserver's:
    clean processes, not forks of this one), each running every scenario of its seeds; the
    results come back in the same order as with one job, progress lines seed by seed.

    ``children``: the zygote to fork kill incarnations from (its ``broken`` switches must be
    ``broken``'s), left open; None: one of this call's own, closed at its end. A worker
    process of ``jobs`` > 1 keeps one for all the seeds it runs (:func:`_worker_children`):
    a zygote costs a Python start-up, its imports and a warm-up run (~2.5 CPU-s), and the
    forks it makes are the same whichever seed asks."""
    scenarios = select(plan, only)
    if jobs > 1 and len(seeds) > 1:
        return _run_parallel(plan, seeds, Path(out_dir), only, placements, progress, broken,
                             injector, child_timeout_s, fork, jobs)
    baselines = Baselines(Path(out_dir), tuple(broken))
    results = []
    own = children is None
    with ChildPool(broken) if own else contextlib.nullcontext(children) as pool:
        assert pool is not None
        for placement in placements:
            for scenario in scenarios:
                why = skip_reason(scenario, placement)
                if why is not None:
                    if progress is not None and scenario.real and placement != "tool":
                        progress.write(f"chaos {scenario.name} [{placement}]: skipped: {why}\n")
                    continue
                for seed in seeds:
                    r = run_case(plan, scenario, seed, out_dir, placement=placement,
                                 baselines=baselines, broken=broken, injector=injector,
                                 child_timeout_s=child_timeout_s,
                                 children=pool if fork else None)
                    results.append(r)
                    if progress is not None:
                        progress.write(progress_line(r) + "\n")
                        progress.flush()
    return results


#: a worker process's zygote (jobs > 1), by its ``broken`` switches: started on its first
#: kill incarnation, closed when the worker process exits (:func:`_worker_children`)
_WORKER_CHILDREN: dict[tuple[str, ...], ChildPool] = {}


def _worker_children(broken: Sequence[str]) -> ChildPool:
    """This worker process's zygote for ``broken``, shared by every seed it runs."""
    key = tuple(broken)
    if key not in _WORKER_CHILDREN:
        from multiprocessing import util

        pool = _WORKER_CHILDREN[key] = ChildPool(key)
        # run when the worker process exits normally (the parent closes and joins the pool)
        util.Finalize(None, pool.close, exitpriority=10)
    return _WORKER_CHILDREN[key]


def _seed_task(args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One worker process's task: every case of one seed (as JSON)."""
    plan_data, seed, out_dir, only, placements, broken, injector, child_timeout_s, fork = args
    plan = Plan.model_validate(plan_data)
    return [r.to_json() for r in run_plan(
        plan, [seed], Path(out_dir), only=only, placements=placements, broken=broken,
        injector=injector, child_timeout_s=child_timeout_s, fork=fork,
        children=_worker_children(broken) if fork else None)]


def case_from_json(data: dict[str, Any]) -> CaseResult:
    """A :class:`CaseResult` back from :meth:`CaseResult.to_json`."""
    r = CaseResult(data["scenario"], data["seed"], data["placement"], Path(data["run_dir"]),
                   Path(data["baseline_dir"]))
    r.violations = [Violation(v["invariant"], v["message"]) for v in data["violations"]]
    for key in ("faults_planned", "faults_injected", "incarnations", "outcome", "recovery_s",
                "throughput_ratio", "accepted_per_s", "baseline_accepted_per_s",
                "ledger_digest", "wall_s"):
        setattr(r, key, data[key])
    return r


def _run_parallel(plan: Plan, seeds: Sequence[int], out_dir: Path,
                  only: Sequence[str] | None, placements: Sequence[str],
                  progress: TextIO | None, broken: Sequence[str], injector: str,
                  child_timeout_s: float, fork: bool, jobs: int) -> list[CaseResult]:
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["freshroll.chaos.runner", "freshroll.runtime.run",
                                "freshroll.sim.components"])
    tasks = [(plan.model_dump(mode="json"), seed, str(out_dir), list(only or ()),
              list(placements), list(broken), injector, child_timeout_s, fork)
             for seed in seeds]
    by_seed: dict[int, list[CaseResult]] = {}
    with ctx.Pool(min(jobs, len(seeds))) as pool:
        for cases in pool.imap_unordered(_seed_task, tasks):
            done = [case_from_json(c) for c in cases]
            if done:
                by_seed[done[0].seed] = done
            if progress is not None:
                for r in done:
                    progress.write(progress_line(r) + "\n")
                progress.flush()
        pool.close()  # the workers exit normally: each closes its zygote (_worker_children)
        pool.join()
    order = {(p, s.name): i for i, (p, s) in enumerate(
        (p, s) for p in placements for s in plan.scenarios)}
    position = {seed: i for i, seed in enumerate(seeds)}
    results = [r for cases in by_seed.values() for r in cases]
    results.sort(key=lambda r: (order[(r.placement, r.scenario)], position[r.seed]))
    return results


def select(plan: Plan, only: Sequence[str] | None) -> list[Scenario]:
    """The scenarios named in ``only`` (all: None or empty); an unknown name is an error."""
    if not only:
        return list(plan.scenarios)
    names = {s.name for s in plan.scenarios}
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--only: no scenario named {', '.join(unknown)} in the plan "
                          f"(it has: {', '.join(sorted(names))})")
    return [s for s in plan.scenarios if s.name in set(only)]


def progress_line(r: CaseResult) -> str:
    what = "ok" if r.ok else (f"{len(r.violations)} violation(s): {r.violations[0].invariant}: "
                              f"{r.violations[0].message}")
    rec = f"{r.recovery_s:.1f}s" if r.recovery_s is not None else "-"
    thr = f"{r.throughput_ratio:.2f}" if r.throughput_ratio is not None else "-"
    return (f"chaos {r.scenario} seed {r.seed} [{r.placement}]: {what}  faults "
            f"{r.faults_injected}/{r.faults_planned}  incarnations {r.incarnations}  "
            f"recovery {rec}  throughput x{thr}  {r.wall_s:.2f}s")


__all__ = [
    "BASELINE_HORIZON_S",
    "HORIZON_FACTOR",
    "INJECTOR",
    "KILL_KINDS",
    "MAX_INCARNATIONS",
    "Baseline",
    "Baselines",
    "ChaosRun",
    "ChildPool",
    "Guard",
    "LivenessTimeout",
    "broken_switches",
    "case_from_json",
    "chaos",
    "error_line",
    "load_injector",
    "outcome_of",
    "progress_line",
    "read_events",
    "run_case",
    "run_in_process",
    "run_plan",
    "select",
    "workload_digest",
    "workload_for",
]


# == the command ============================================================================
@dataclass
class ChaosRun:
    results: list[CaseResult]
    table: str  # the markdown table (also OUT/chaos.md)
    out: Path

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def chaos(plan_path: Path, *, seeds: Sequence[int], out: Path, only: Sequence[str] = (),
          real: bool = False, broken: Sequence[str] = (), progress: TextIO | None = None,
          injector: str | None = None, jobs: int = 1) -> ChaosRun:
    """``freshroll chaos``: load the plan (a bad plan is a ConfigError naming file and key),
    run it, write ``OUT/chaos.md`` and ``OUT/chaos.json``."""
    from freshroll.chaos.plan import load_plan
    from freshroll.chaos.table import write_tables

    plan = load_plan(plan_path)
    select(plan, only)  # an unknown --only name fails before anything runs
    unknown = sorted(set(broken) - set(unsafe.SWITCHES))
    if unknown:
        raise ConfigError(f"--break: unknown switch(es) {', '.join(unknown)}")
    placements = ("sim", "tool", "inline", "ray") if real else ("sim", "tool")
    t0 = time.perf_counter()
    results = run_plan(plan, seeds, out, only=only, placements=placements, progress=progress,
                       broken=broken, injector=injector or INJECTOR, jobs=jobs)
    header = {"plan": str(plan_path), "seeds": list(seeds), "placements": list(placements),
              "broken": list(broken), "jobs": jobs, "wall_s": round(time.perf_counter() - t0, 2)}
    table = write_tables(results, out, header=header)
    return ChaosRun(results, table, out)


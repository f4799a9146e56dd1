"""One chaos case (scenario x seed x placement): its twin, its faulted run, its checks.

One case::

    workload_for(plan, scenario, seed, placement)      the run's config (sim: workload_of)
      -> the fault-free twin (same config, no faults)  cached per (workload, seed): the
                                                       scenarios of a plan share one per seed
      -> the faulted run, incarnation by incarnation:
           a fault that ends the process still to fire (kill_process, trainer_crash):
               a CHILD process (python -m freshroll.chaos.child) whose Injector's on_kill
               sends itself a real SIGKILL
           otherwise in this process; an ``interrupt`` ends it with Interrupted
         each later incarnation resumes the run (``run(None, out, resume=True)``) with an
         Injector that skips the faults the ledger records as fired, until the run finishes
         or stops, at most MAX_INCARNATIONS times
      -> the checks (:mod:`freshroll.chaos.checks`), the figures
         (:mod:`freshroll.chaos.recovery`), the ledger digest (:mod:`freshroll.chaos.digest`)

Liveness: a run that never finishes must not hang the harness. Every run (the twin too)
runs under a :class:`Guard` session whose ``hooks.run`` task raises :class:`LivenessTimeout`
once the run's clock is HORIZON_FACTOR (50) times the fault-free run's duration past the
incarnation's start (in virtual time that costs nothing: the loop jumps there when nothing
else is due); a child process also has a wall-clock timeout. A case that hits either is a
``liveness`` violation.

Directories: ``OUT/<placement>/<scenario>/seed-<n>/run`` (the faulted run; ``child-<i>.*``
beside it: the spec, output and result of each child) and
``OUT/<placement>/baselines/<workload digest>-seed-<n>``. A case directory left by an earlier
``freshroll chaos`` is replaced.

The switches of :mod:`freshroll.unsafe` (``broken``) are set around every in-process run and
passed to children in ``FRESHROLL_UNSAFE_BREAK``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freshroll import unsafe
from freshroll.chaos import checks
from freshroll.chaos.child import ChildPool, exec_child
from freshroll.chaos.digest import digest_events
from freshroll.chaos.plan import Plan, Scenario, workload_of
from freshroll.chaos.real import real_workload
from freshroll.chaos.recovery import RunRates, case_figures, rates_of
from freshroll.chaos.result import CaseResult, Violation
from freshroll.config import Config, validate
from freshroll.errors import ConfigError, FreshrollError, Interrupted, RunFailed
from freshroll.ledger.events import Event
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.pipeline.hooks import HookContext, Hooks

if TYPE_CHECKING:
    from freshroll.engines.episodes import EpisodeWorkflow
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.ledger.lineage import PolicyVersion, SampleId
    from freshroll.rewards.scoring import Score
    from freshroll.runtime.placements import ChaosSession, Components


#: faults that end the process with a SIGKILL: their incarnation runs in a child process
KILL_KINDS = frozenset({"kill_process", "trainer_crash"})
#: incarnations of one faulted run at most (1 + resumes), beyond its faults' own
MAX_INCARNATIONS = 8
#: the liveness horizon, in fault-free run durations
HORIZON_FACTOR = 50.0
#: the fault-free twin's own horizon (seconds of run time; it has no faults)
BASELINE_HORIZON_S = 1e6
#: a child process's wall-clock limit (seconds)
CHILD_TIMEOUT_S = 300.0
#: the Injector a case uses (module:attribute), in this process and in children
INJECTOR = "freshroll.chaos.inject:Injector"
PLACEMENTS = ("sim", "tool", "inline", "ray")


class LivenessTimeout(RunFailed):
    """A run under the chaos harness did not finish within its horizon."""


# == the liveness guard =======================================================================
class _GuardHooks(Hooks):
    """The session's hooks, plus a watchdog task: past ``horizon_s`` of run time since the
    incarnation started, the run fails with :class:`LivenessTimeout`."""

    def __init__(self, inner: Hooks, horizon_s: float) -> None:
        self.inner, self.horizon_s = inner, horizon_s

    async def run(self, ctx: HookContext) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.inner.run(ctx), name="chaos-hooks")
            tg.create_task(self._watch(ctx), name="liveness")

    async def _watch(self, ctx: HookContext) -> None:
        clock, start = ctx.clock, ctx.clock.now()
        await asyncio.sleep(self.horizon_s)
        steps = ctx.buffer.counts["steps"]
        raise LivenessTimeout(
            f"liveness: the run did not finish within {self.horizon_s:,.0f} s of run time "
            f"({HORIZON_FACTOR:g}x the fault-free run) since {start:,.1f} s: step {steps} of "
            f"{ctx.steps} at {clock.now():,.1f} s")

    def scored(self, sids: Sequence[SampleId], scores: list[Score]) -> list[Score]:
        return self.inner.scored(sids, scores)

    def rewarded(self, sids: Sequence[SampleId]) -> None:
        self.inner.rewarded(sids)

    def committed(self, version: PolicyVersion) -> None:
        self.inner.committed(version)

    def workflow(self, workflow: EpisodeWorkflow) -> EpisodeWorkflow:
        return self.inner.workflow(workflow)


class Guard:
    """A :class:`~freshroll.runtime.placements.ChaosSession`: ``inner`` (None: no faults) with
    the liveness watchdog around its hooks."""

    def __init__(self, inner: ChaosSession | None, horizon_s: float) -> None:
        self.inner = inner
        self.hooks: Hooks = _GuardHooks(inner.hooks if inner is not None else Hooks(),
                                        horizon_s)

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        return self.inner.wrap(parts, buf) if self.inner is not None else parts


# == workloads ================================================================================
def workload_for(plan: Plan, scenario: Scenario, seed: int, placement: str) -> dict[str, Any]:
    """The config (a mapping) of one case. ``sim``: :func:`~freshroll.chaos.plan.workload_of`
    (the simulated cluster in virtual time); ``inline``/``ray``: the tiny real model
    (:func:`freshroll.chaos.real.real_workload`, with ``plan.real_workload``), for
    ``real: true`` scenarios; ``tool``: a multi-turn tool task on the tiny model
    (:data:`freshroll.chaos.real.TOOL_WORKLOAD`), for scenarios with environment faults."""
    if placement == "sim":
        return workload_of(plan, scenario, seed)
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    return real_workload(plan, scenario, seed, placement)


def workload_digest(data: dict[str, Any]) -> str:
    """A short digest of a workload mapping without its seed (the twin cache's key)."""
    body = json.loads(json.dumps(data, sort_keys=True, default=str))
    body.get("run", {}).pop("seed", None)
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def load_injector(spec: str = INJECTOR) -> Callable[..., ChaosSession]:
    """``module:attribute`` -> the Injector class (a ChaosSession factory)."""
    import importlib

    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]  # an attribute found by name


@contextlib.contextmanager
def broken_switches(names: Iterable[str]) -> Iterator[None]:
    """:func:`freshroll.unsafe.set_broken` for the duration of a block (then restored)."""
    previous = unsafe.set_broken(names)
    try:
        yield
    finally:
        unsafe.set_broken(previous)


# == the fault-free twin =====================================================================
@dataclass(frozen=True)
class Baseline:
    run_dir: Path
    rates: RunRates
    duration_s: float  # run time from the first event to the last
    wall_s: float  # seconds this process took to run it


@dataclass
class Baselines:
    """The fault-free twins of one plan run, by (placement, workload digest, seed)."""

    root: Path
    broken: tuple[str, ...] = ()
    cache: dict[tuple[str, str, int], Baseline] = field(default_factory=dict)

    def get(self, data: dict[str, Any], seed: int, placement: str) -> Baseline:
        key = (placement, workload_digest(data), seed)
        if key not in self.cache:
            out = self.root / placement / "baselines" / f"{key[1]}-seed-{seed}"
            _clear(out)
            t0 = time.perf_counter()
            with broken_switches(self.broken):
                run_in_process(validate(data, f"baseline of seed {seed}"), out, False,
                                Guard(None, BASELINE_HORIZON_S))
            events = read_events(out)
            duration = events[-1].ts - events[0].ts if events else 0.0
            self.cache[key] = Baseline(out, rates_of(events), duration,
                                       time.perf_counter() - t0)
        return self.cache[key]


def read_events(run_dir: Path) -> list[Event]:
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        return [e for _, e in ledger.events()]


def _clear(path: Path) -> None:
    """Remove a case or twin directory an earlier chaos run left (only such directories)."""
    if path.is_dir() and ((path / LEDGER_FILE).exists() or (path / "run").is_dir()
                          or not any(path.iterdir())):
        shutil.rmtree(path)
    elif path.exists():
        raise ConfigError(f"{path}: exists and is not a chaos case directory: choose another "
                          "--out")


def run_in_process(cfg: Config | None, out: Path, resume: bool, session: ChaosSession) -> None:
    from freshroll.runtime.run import run

    run(cfg, out, resume=resume, chaos=session, stream=io.StringIO(), report=False)


# == the faulted run ==========================================================================
@dataclass
class Incarnations:
    """How the faulted run went."""

    count: int = 0
    error: str | None = None  # the error line that stopped it (None: finished)
    liveness: str | None = None  # why it hit the liveness guard
    #: incarnations that ended (killed, interrupted) with no new fault recorded: a process
    #: fault must be durable before it ends the process, so each is a violation
    unrecorded: list[str] = field(default_factory=list)
    #: the faulted run's events as read after its last incarnation (None: no ledger): the
    #: checks read them from here rather than from the ledger again (nothing writes after)
    events: list[Event] | None = None


def _pending_kill(scenario: Scenario, fired: frozenset[int]) -> bool:
    return any(f.kind in KILL_KINDS and i not in fired for i, f in enumerate(scenario.faults))


def _faulted(scenario: Scenario, seed: int, cfg: Config, case_dir: Path, horizon_s: float,
             broken: Sequence[str], injector: str, child_timeout_s: float,
             children: ChildPool | None) -> Incarnations:
    out, inc = case_dir / "run", Incarnations()
    fired: frozenset[int] = frozenset()
    make = load_injector(injector)
    while True:
        if inc.count >= MAX_INCARNATIONS + len(scenario.faults):
            inc.liveness = (f"liveness: the run did not finish in {inc.count} incarnations "
                            "(each ended by a fault)")
            return inc
        resume = (out / LEDGER_FILE).exists()
        inc.count += 1
        if _pending_kill(scenario, fired):
            status, detail = _run_child(scenario, seed, cfg, out, resume, fired, horizon_s,
                                        broken, injector, case_dir / f"child-{inc.count}",
                                        child_timeout_s, children)
        else:
            status, detail = _incarnation(make, scenario, seed, cfg, out, resume, fired,
                                          horizon_s, broken,
                                          case_dir / f"incarnation-{inc.count}.log")
        before = fired
        if (out / LEDGER_FILE).exists():
            inc.events = read_events(out)
            fired = checks.fired_indexes(inc.events)
        if status in ("killed", "interrupted"):
            if fired == before:  # no fault of the plan ended it: say so
                inc.unrecorded.append(f"incarnation {inc.count} {status} with no new fault "
                                 f"recorded: {detail}")
            continue
        if status == "finished":
            return inc
        if status == "liveness":
            inc.liveness = detail
            return inc
        inc.error = detail
        return inc


def _incarnation(make: Callable[..., ChaosSession], scenario: Scenario, seed: int,
                 cfg: Config, out: Path, resume: bool, fired: frozenset[int],
                 horizon_s: float, broken: Sequence[str], log: Path) -> tuple[str, str]:
    """One in-process incarnation: (finished | interrupted | liveness | stopped, detail).
    What the run writes to stderr (warnings) goes to ``log`` (written only if any)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _incarnation_body(make, scenario, seed, cfg, out, resume, fired, horizon_s,
                                     broken)
    finally:
        if err.getvalue():
            log.write_text(err.getvalue())


def _incarnation_body(make: Callable[..., ChaosSession], scenario: Scenario, seed: int,
                      cfg: Config, out: Path, resume: bool, fired: frozenset[int],
                      horizon_s: float, broken: Sequence[str]) -> tuple[str, str]:

    def refuse(kind: str) -> None:  # a kill in this process would end the harness
        raise RuntimeError(f"chaos runner: a {kind} fault fired in the harness's process")

    session = Guard(make(scenario, seed, skip=fired, on_kill=refuse), horizon_s)
    with broken_switches(broken):
        try:
            run_in_process(None if resume else cfg, out, resume, session)
        except Exception as exc:
            return outcome_of(exc)
    return "finished", ""


#: what the Injector's own guard says when a run stops making progress (chaos/inject.py)
NO_PROGRESS = "made no progress"


def outcome_of(exc: Exception) -> tuple[str, str]:
    """How an incarnation that raised ``exc`` ended: ``liveness`` (the runner's horizon, or
    the Injector's no-progress guard), ``interrupted``, or ``stopped`` (its error line; a bug
    is named by its type)."""
    if isinstance(exc, LivenessTimeout) or (isinstance(exc, RunFailed)
                                            and NO_PROGRESS in str(exc)):
        return "liveness", f"liveness: {error_line(exc)}".replace("liveness: liveness: ",
                                                                   "liveness: ")
    if isinstance(exc, Interrupted):
        return "interrupted", str(exc)
    if isinstance(exc, FreshrollError):
        return "stopped", error_line(exc)
    return "stopped", f"{type(exc).__name__}: {error_line(exc)}"  # a bug: recorded, not raised


def error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _run_child(scenario: Scenario, seed: int, cfg: Config, out: Path, resume: bool,
               fired: frozenset[int], horizon_s: float, broken: Sequence[str], injector: str,
               stem: Path, timeout_s: float, children: ChildPool | None) -> tuple[str, str]:
    """One incarnation in a child process (``python -m freshroll.chaos.child SPEC``, or a
    fork of the pool's zygote)."""
    result_path = stem.with_suffix(".result.json")
    spec = {
        "scenario": scenario.model_dump(mode="json"), "seed": seed,
        "config": None if resume else cfg.model_dump(mode="json"), "out": str(out),
        "resume": resume, "skip": sorted(fired), "horizon_s": horizon_s,
        "injector": injector, "result": str(result_path),
    }
    spec_path = stem.with_suffix(".json")
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = stem.with_suffix(".log")
    if children is not None:
        code = children.run(spec_path, timeout_s)
    else:
        code = exec_child(spec_path, log_path, broken, timeout_s)
    if code is None:
        return "liveness", (f"liveness: child process {spec_path.name} did not end within "
                            f"{timeout_s:g} s wall time (killed)")
    if code == -9 and not result_path.exists():
        return "killed", f"SIGKILL (see {log_path})"
    try:
        result = json.loads(result_path.read_text())
    except (OSError, json.JSONDecodeError):
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return "stopped", (f"child process ended with status {code} and no result: "
                           f"{tail[0]}")
    return str(result["status"]), str(result.get("detail", ""))


# == one case ===============================================================================
def run_case(
    plan: Plan, scenario: Scenario, seed: int, out_dir: Path, *, placement: str = "sim",
    baselines: Baselines | None = None, broken: Sequence[str] = (),
    injector: str = INJECTOR, child_timeout_s: float = CHILD_TIMEOUT_S,
    children: ChildPool | None = None,
) -> CaseResult:
    """Run one case (module docstring); never raises for what the run does."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    baselines = baselines if baselines is not None else Baselines(out_dir, tuple(broken))
    data = workload_for(plan, scenario, seed, placement)
    cfg = validate(data, f"scenario {scenario.name} seed {seed}")
    base = baselines.get(data, seed, placement)
    case_dir = out_dir / placement / scenario.name / f"seed-{seed}"
    _clear(case_dir)
    case_dir.mkdir(parents=True)
    horizon = HORIZON_FACTOR * max(base.duration_s, 1.0)
    inc = _faulted(scenario, seed, cfg, case_dir, horizon, broken, injector, child_timeout_s,
                   children)
    run_dir = case_dir / "run"
    result = CaseResult(scenario.name, seed, placement, run_dir, base.run_dir,
                        faults_planned=len(scenario.faults), incarnations=inc.count)
    if not (run_dir / LEDGER_FILE).exists():
        result.violations.append(Violation("liveness", inc.liveness or inc.error
                                           or "the faulted run wrote no ledger"))
        result.outcome = f"stopped: {inc.error or inc.liveness}"
        result.wall_s = time.perf_counter() - t0
        return result
    events = inc.events if inc.events is not None else read_events(run_dir)
    found = checks.check_case(scenario, run_dir, events, steps=cfg.run.steps,
                              error=inc.error if inc.liveness is None else inc.liveness,
                              order=checks.planned_order(cfg))
    if inc.liveness is not None:
        found = [v for v in found if v.invariant != "expected_outcome"]
        found.insert(0, Violation("liveness", inc.liveness))
    found += [Violation("faults_recorded", why) for why in inc.unrecorded]
    result.violations = found
    result.faults_injected = len(checks.fired_indexes(events))
    result.outcome = "finished" if inc.error is None and inc.liveness is None else \
        f"stopped: {inc.error or inc.liveness}"
    rates = rates_of(events)
    result.recovery_s, result.throughput_ratio = case_figures(rates, base.rates)
    result.accepted_per_s = rates.accepted_per_s
    result.baseline_accepted_per_s = base.rates.accepted_per_s
    result.ledger_digest = digest_events(events, run_dir=str(run_dir.resolve()),
                                         timing=placement == "sim")
    result.wall_s = time.perf_counter() - t0
    return result


__all__ = [
    "BASELINE_HORIZON_S", "CHILD_TIMEOUT_S", "HORIZON_FACTOR", "INJECTOR", "KILL_KINDS",
    "MAX_INCARNATIONS", "PLACEMENTS", "Baseline", "Baselines", "Guard", "LivenessTimeout",
    "broken_switches", "error_line", "load_injector", "outcome_of", "read_events", "run_case",
    "run_in_process", "workload_digest", "workload_for",
]

"""The gates of ``freshroll validate``: measured values per repeat in, one criterion per gate out.

Pure: numbers and labels in (what :mod:`freshroll.validate.runner` read from the run
directories), :class:`Criterion` records out; no file is read here. How each gate reads its
repeats (``worst`` = the repeat furthest on the wrong side of the threshold)::

    verify              every repeat (async and sync) finished its steps and passed verify
    accepted_per_s      worst repeat's accepted rollouts/s          >= min
    accepted_per_s_ratio worst seed's async / sync accepted/s        >= min_ratio_to_sync
                        (:func:`freshroll.bench.figures.speedup`, paired by seed)
    discard_rate        worst repeat's discard rate                 <= max
    lag_p99, lag_max    worst repeat's committed lag figure         <= max (versions)
    trainer_idle_ratio  worst repeat's trainer idle ratio           <= max
    recovery_s[NAME]    worst seed's recovery time under scenario NAME (never recovered: inf)
                                                                    <= max_s
    chaos_invariants    invariant violations over every chaos case  <= 0
    collapses           async repeats whose policy collapsed (summary.json learning)
                                                                    <= max_collapses
    mismatch_kl_stale   worst repeat's stale steps' mean mismatch KL <= max_mismatch_kl
    convergence_parity  mean over seeds of (async - sync) reward of the last K steps
                        >= -tol  (two_sided: |.| <= tol), tol = max(tolerance,
                        tolerance_sd x stdev of the sync figure across seeds)

A repeat without a figure (its run failed) fails every gate that reads that figure. The
spread shown with every measured value is over the repeats (mean, min, max, sample stdev).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from freshroll.bench.figures import speedup
from freshroll.validate.acceptance import Gates

#: the figures a repeat carries (keys of :attr:`Repeat.figures`)
FIGURE_KEYS = ("accepted_per_s", "discard_rate", "lag_p99", "lag_max", "trainer_idle_ratio",
               "reward_window", "sample_bias", "collapsed", "mismatch_kl_stale")


@dataclass(frozen=True)
class Repeat:
    """One run of the workload (async or its synchronous baseline) with one seed."""

    label: str  # async-seed0, sync-seed0
    mode: Literal["async", "sync"]
    seed: int
    run_dir: str
    figures: Mapping[str, float | None]
    ok: bool = True  # finished every step asked and passed verify
    problem: str | None = None  # why not ok


@dataclass(frozen=True)
class Case:
    """One chaos case (scenario x seed) reduced to what the recovery gates read."""

    scenario: str
    seed: int
    run_dir: str
    recovery_s: float | None  # None: never back to 80% of the fault-free rate
    violations: tuple[str, ...] = ()
    error: str | None = None  # the case could not run
    throughput_ratio: float | None = None  # accepted/s under faults / fault-free (same seed)
    outcome: str = ""  # finished | stopped: <error line>


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float | None
    min: float | None
    max: float | None
    stdev: float | None  # sample standard deviation (None below two values)
    missing: int = 0  # repeats without the figure

    @staticmethod
    def of(values: Sequence[float | None]) -> Spread:
        got = [v for v in values if v is not None]
        finite = [v for v in got if math.isfinite(v)]
        return Spread(
            n=len(got), mean=statistics.fmean(got) if got else None,
            min=min(got) if got else None, max=max(got) if got else None,
            stdev=statistics.stdev(finite) if len(finite) >= 2 else None,
            missing=len(values) - len(got),
        )


@dataclass(frozen=True)
class Criterion:
    """One gate's verdict: threshold, measured value with its spread, pass/fail, evidence."""

    name: str
    figure: str  # what is measured, in words
    op: Literal[">=", "<="]
    limit: float | None
    value: float | None  # the value compared with the limit
    spread: Spread | None
    passed: bool
    evidence: tuple[str, ...] = ()  # run directories
    per_repeat: tuple[tuple[str, float | None], ...] = ()  # (label, value)
    note: str = ""

    @property
    def threshold(self) -> str:
        return f"{self.op} {_num(self.limit)}"

    def to_json(self) -> dict[str, Any]:
        """Strict JSON (an infinite value as the string ``"inf"``); :meth:`from_json` reads it."""
        return {
            "name": self.name, "figure": self.figure, "op": self.op,
            "threshold": self.threshold, "limit": _enc(self.limit), "value": _enc(self.value),
            "spread": None if self.spread is None else {
                k: _enc(v) if isinstance(v, float) else v
                for k, v in asdict(self.spread).items()},
            "passed": self.passed, "evidence": list(self.evidence),
            "per_repeat": [{"label": k, "value": _enc(v)} for k, v in self.per_repeat],
            "note": self.note,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Criterion:
        spread = d.get("spread")
        return Criterion(
            name=d["name"], figure=d["figure"], op=d["op"], limit=_dec(d["limit"]),
            value=_dec(d["value"]),
            spread=None if spread is None else Spread(
                n=int(spread["n"]), mean=_dec(spread["mean"]), min=_dec(spread["min"]),
                max=_dec(spread["max"]), stdev=_dec(spread["stdev"]),
                missing=int(spread.get("missing", 0))),
            passed=d["passed"], evidence=tuple(d.get("evidence", ())),
            per_repeat=tuple((r["label"], _dec(r["value"])) for r in d.get("per_repeat", ())),
            note=d.get("note", ""),
        )


def _enc(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return None if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _dec(v: Any) -> float | None:
    if isinstance(v, str):
        return float(v)
    return None if v is None else float(v)


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf"
    return f"{v:.4g}"


# == the gates ========================================================================
def verify_gate(repeats: Sequence[Repeat]) -> Criterion:
    bad = [r for r in repeats if not r.ok]
    note = "; ".join(f"{r.label}: {r.problem or 'failed'}" for r in bad)
    if not repeats:
        note = "no repeat ran"
    return Criterion(
        name="verify", figure="repeats that did not finish their steps or failed verify",
        op="<=", limit=0, value=float(len(bad)) if repeats else None,
        spread=None, passed=bool(repeats) and not bad,
        evidence=tuple(r.run_dir for r in (bad or repeats)),
        per_repeat=tuple((r.label, 0.0 if r.ok else 1.0) for r in repeats), note=note,
    )


def bound_gate(name: str, figure: str, op: Literal[">=", "<="], limit: float,
               repeats: Sequence[Repeat], key: str) -> Criterion:
    """Every repeat's ``figures[key]`` against ``limit``; the worst repeat is the value."""
    values = [r.figures.get(key) for r in repeats]
    return _bound(name, figure, op, limit, [r.label for r in repeats], values,
                  [r.run_dir for r in repeats])


def _bound(name: str, figure: str, op: Literal[">=", "<="], limit: float, labels: Sequence[str],
           values: Sequence[float | None], dirs: Sequence[str], note: str = "") -> Criterion:
    got = [v for v in values if v is not None]
    worst = (min(got) if op == ">=" else max(got)) if got else None
    missing = [lbl for lbl, v in zip(labels, values, strict=True) if v is None]
    ok = bool(values) and not missing and worst is not None and (
        worst >= limit if op == ">=" else worst <= limit)
    if missing:
        note = "; ".join(filter(None, [note, f"no figure for {', '.join(missing)}"]))
    if not values:
        note = "; ".join(filter(None, [note, "nothing measured"]))
    return Criterion(name=name, figure=figure, op=op, limit=limit, value=worst,
                     spread=Spread.of(values), passed=ok, evidence=tuple(dirs),
                     per_repeat=tuple(zip(labels, values, strict=True)), note=note)


def ratio_gate(limit: float, async_runs: Sequence[Repeat], sync_runs: Sequence[Repeat]
               ) -> Criterion:
    """Async / sync accepted rollouts/s, paired by seed; the worst seed is the value."""
    sync_by_seed = {r.seed: r for r in sync_runs}
    labels, values, dirs = [], [], []
    for a in async_runs:
        s = sync_by_seed.get(a.seed)
        labels.append(f"seed{a.seed}")
        av = a.figures.get("accepted_per_s")
        sv = s.figures.get("accepted_per_s") if s is not None else None
        ratio = speedup(av, sv) if av is not None and sv is not None else math.nan
        values.append(ratio if math.isfinite(ratio) else None)
        dirs += [a.run_dir] + ([s.run_dir] if s is not None else [])
    return _bound("accepted_per_s_ratio",
                  "accepted rollouts/s of async / of the synchronous baseline, same seed",
                  ">=", limit, labels, values, dirs)


def reward_tolerance(sync_values: Sequence[float], tolerance: float | None,
                     tolerance_sd: float | None) -> float:
    """max(tolerance, tolerance_sd x sample stdev of the baseline's figure across seeds)."""
    parts = []
    if tolerance is not None:
        parts.append(tolerance)
    if tolerance_sd is not None and len(sync_values) >= 2:
        parts.append(tolerance_sd * statistics.stdev(sync_values))
    return max(parts) if parts else 0.0


def convergence_gate(last_steps: int, tolerance: float | None, tolerance_sd: float | None,
                     two_sided: bool, async_runs: Sequence[Repeat],
                     sync_runs: Sequence[Repeat], reward: str = "reward") -> Criterion:
    """``reward``: what the runs' ``reward_window`` is of (``eval reward``: the held-out set's,
    eval.file), named in the criterion's figure."""
    sync_by_seed = {r.seed: r for r in sync_runs}
    labels, diffs, dirs, sync_vals = [], [], [], []
    for a in async_runs:
        s = sync_by_seed.get(a.seed)
        av = a.figures.get("reward_window")
        sv = s.figures.get("reward_window") if s is not None else None
        labels.append(f"seed{a.seed}")
        diffs.append(av - sv if av is not None and sv is not None else None)
        if sv is not None:
            sync_vals.append(sv)
        dirs += [a.run_dir] + ([s.run_dir] if s is not None else [])
    tol = reward_tolerance(sync_vals, tolerance, tolerance_sd)
    got = [d for d in diffs if d is not None]
    mean = statistics.fmean(got) if got else None
    missing = [lbl for lbl, d in zip(labels, diffs, strict=True) if d is None]
    value = (abs(mean) if two_sided else mean) if mean is not None else None
    if two_sided:
        op: Literal[">=", "<="] = "<="
        limit, ok = tol, value is not None and value <= tol
        what = "|mean over seeds of (async - sync)|"
    else:
        op, limit, ok = ">=", -tol, value is not None and value >= -tol
        what = "mean over seeds of (async - sync)"
    spread_note = (f"tolerance {tol:.4g} = max(tolerance {_num(tolerance)}, "
                   f"{_num(tolerance_sd)} x baseline stdev "
                   f"{_num(statistics.stdev(sync_vals) if len(sync_vals) >= 2 else None)})")
    gaps = f"no figure for {', '.join(missing)}" if missing else ""
    note = "; ".join(filter(None, [spread_note, gaps]))
    return Criterion(
        name="convergence_parity",
        figure=f"{what} of the mean {reward} of the last {last_steps} steps",
        op=op, limit=limit, value=value, spread=Spread.of(diffs),
        passed=bool(diffs) and not missing and ok, evidence=tuple(dirs),
        per_repeat=tuple(zip(labels, diffs, strict=True)), note=note,
    )


def recovery_gates(max_s: float, scenarios: Sequence[str], cases: Sequence[Case] | str
                   ) -> list[Criterion]:
    """One ``recovery_s[NAME]`` gate per scenario and ``chaos_invariants`` over all cases.

    ``cases``: the chaos cases, or the error that kept them from running (every recovery gate
    then fails with it).
    """
    if isinstance(cases, str):
        out = [Criterion(name=f"recovery_s[{n}]", figure=_RECOVERY, op="<=", limit=max_s,
                         value=None, spread=None, passed=False, note=cases) for n in scenarios]
        out.append(Criterion(name="chaos_invariants", figure=_VIOLATIONS, op="<=", limit=0,
                             value=None, spread=None, passed=False, note=cases))
        return out
    out = []
    for name in scenarios:
        mine = [c for c in cases if c.scenario == name]
        values = [None if c.error else math.inf if c.recovery_s is None else c.recovery_s
                  for c in mine]
        notes = [f"seed {c.seed}: {c.error}" for c in mine if c.error]
        notes += [f"seed {c.seed}: never recovered" for c in mine
                  if not c.error and c.recovery_s is None]
        out.append(_bound(f"recovery_s[{name}]", _RECOVERY, "<=", max_s,
                          [f"seed{c.seed}" for c in mine], values, [c.run_dir for c in mine],
                          "; ".join(notes)))
    bad = [c for c in cases if c.violations]
    n_viol = sum(len(c.violations) for c in cases)
    note = "; ".join(f"{c.scenario} seed {c.seed}: {v}" for c in bad for v in c.violations[:3])
    out.append(Criterion(
        name="chaos_invariants", figure=_VIOLATIONS, op="<=", limit=0,
        value=float(n_viol) if cases else None, spread=None,
        passed=bool(cases) and n_viol == 0, evidence=tuple(c.run_dir for c in (bad or cases)),
        per_repeat=tuple((f"{c.scenario}-seed{c.seed}", float(len(c.violations)))
                         for c in cases),
        note=note or ("" if cases else "no chaos case ran"),
    ))
    return out


def learning_gates(max_collapses: int, max_kl: float | None,
                   async_runs: Sequence[Repeat]) -> list[Criterion]:
    """The async repeats' learning (``summary.json`` ``learning``): collapses counted over
    the repeats (each repeat 1 or 0), and the stale steps' mismatch KL, worst repeat."""
    labels = [r.label for r in async_runs]
    dirs = [r.run_dir for r in async_runs]
    flags = [r.figures.get("collapsed") for r in async_runs]
    got = [f for f in flags if f is not None]
    missing = [lbl for lbl, f in zip(labels, flags, strict=True) if f is None]
    count = float(sum(got)) if got else None
    fell = [lbl for lbl, f in zip(labels, flags, strict=True) if f]
    notes = ([f"collapsed: {', '.join(fell)}"] if fell else []) + (
        [f"no figure for {', '.join(missing)}"] if missing else [])
    note = "; ".join(notes)
    out = [Criterion(
        name="collapses", figure="async repeats whose policy collapsed (no learning signal or "
        "entropy under the floor while the reward fell; docs/metrics.md, 'Learning')", op="<=",
        limit=max_collapses, value=count, spread=Spread.of(flags),
        passed=bool(async_runs) and not missing and count is not None
        and count <= max_collapses,
        evidence=tuple(d for d, f in zip(dirs, flags, strict=True) if f) or tuple(dirs),
        per_repeat=tuple(zip(labels, flags, strict=True)),
        note=note or ("" if async_runs else "nothing measured"))]
    if max_kl is not None:
        out.append(bound_gate("mismatch_kl_stale", "the stale steps' mean mismatch KL, "
                              "behaviour vs proximal policy (worst repeat)", "<=", max_kl,
                              async_runs, "mismatch_kl_stale"))
    return out


_RECOVERY = ("seconds (run clock) from the first fault until accepted rollouts/s is back to "
             ">= 80% of the fault-free run; worst seed")
_VIOLATIONS = "invariant violations (verify + chaos checks) over every chaos case"


@dataclass
class Measured:
    """Everything the gates read: the repeats, and the chaos cases (or why they did not run)."""

    async_runs: list[Repeat] = field(default_factory=list)
    sync_runs: list[Repeat] = field(default_factory=list)
    cases: list[Case] | str = field(default_factory=list)


def evaluate(gates: Gates, max_staleness: int, m: Measured,
             reward: str = "reward") -> list[Criterion]:
    """Every configured gate's criterion, ``verify`` first (always on); ``reward``: what the
    convergence gate compares (:func:`convergence_gate`)."""
    out = [verify_gate([*m.async_runs, *m.sync_runs])]
    a = m.async_runs
    tp = gates.accepted_per_s
    if tp is not None and tp.min is not None:
        out.append(bound_gate("accepted_per_s", "accepted rollouts/s (worst repeat)", ">=",
                              tp.min, a, "accepted_per_s"))
    if tp is not None and tp.min_ratio_to_sync is not None:
        out.append(ratio_gate(tp.min_ratio_to_sync, a, m.sync_runs))
    if gates.discard_rate is not None:
        out.append(bound_gate("discard_rate", "counted discards / (accepted + counted "
                              "discards) (worst repeat)", "<=", gates.discard_rate.max, a,
                              "discard_rate"))
    for key, lag in (("lag_p99", gates.lag_p99), ("lag_max", gates.lag_max)):
        if lag is not None:
            what = "99th percentile" if key == "lag_p99" else "maximum"
            out.append(bound_gate(key, f"{what} of committed samples' lag in policy versions "
                                  "(worst repeat)", "<=", lag.resolve(max_staleness), a, key))
    if gates.trainer_idle_ratio is not None:
        out.append(bound_gate("trainer_idle_ratio", "trainer wait for data / trainer wall time "
                              "(worst repeat)", "<=", gates.trainer_idle_ratio.max, a,
                              "trainer_idle_ratio"))
    if gates.sample_bias is not None:
        out.append(bound_gate("sample_bias", "largest divergence of the accepted samples from "
                              "those generated: |length bias|, |reward bias| (reward std), "
                              "1 - prompt coverage, version mix distance (worst repeat)", "<=",
                              gates.sample_bias.max, a, "sample_bias"))
    if gates.learning is not None:
        out += learning_gates(gates.learning.max_collapses, gates.learning.max_mismatch_kl, a)
    if gates.recovery is not None:
        out += recovery_gates(gates.recovery.max_s, gates.recovery.scenarios, m.cases)
    c = gates.convergence
    if c is not None:
        out.append(convergence_gate(c.last_steps, c.tolerance, c.tolerance_sd, c.two_sided, a,
                                    m.sync_runs, reward))
    return out


def failed(criteria: Sequence[Criterion]) -> list[str]:
    return [c.name for c in criteria if not c.passed]


__all__ = [
    "FIGURE_KEYS", "Case", "Criterion", "Measured", "Repeat", "Spread", "bound_gate",
    "convergence_gate", "evaluate", "failed", "learning_gates", "ratio_gate", "recovery_gates",
    "reward_tolerance", "verify_gate",
]

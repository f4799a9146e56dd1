"""The decision record of ``freshroll validate``: markdown for people, JSON for machines.

It follows the engagement the product promises, in four sections::

    Diagnosis       the measured bottleneck (the controller's ``controller_decided`` verdicts
                    over the async repeats; without any, the trainer idle ratio against
                    control.idle_high) and the failure signals per repeat: discards by reason,
                    rejected results, worker fences, injected faults, the run's verdict
    Design          the settings and limits in force: max_staleness, batch shape, workers,
                    admission, the controller's bounds (control), the limits section
    Validation      every gate: threshold, measured value with its spread across repeats,
                    pass/fail, the evidence run directories (relative links)
    Recommendation  production-transition when every gate passed, else stop, naming every
                    gate that failed

``decision.json`` holds the same (:meth:`Decision.to_json`, read back by
:func:`read_decision`); its ``recommendation`` and ``failed`` keys are what CI reads.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from freshroll.config import Config
from freshroll.validate.gates import Criterion, failed

FORMAT: Final = "freshroll.decision/1"
PRODUCTION: Final = "production-transition"
STOP: Final = "stop"
SECTIONS: Final = ("Diagnosis", "Design", "Validation", "Recommendation")
#: the controller's bottleneck words (control/controller.py) in the record's words
BOUND_WORDS: Final = {"producer": "generation-bound", "trainer": "trainer-bound",
                      "balanced": "balanced"}


@dataclass(frozen=True)
class Decision:
    name: str
    acceptance: str
    seeds: list[int]
    diagnosis: dict[str, Any]
    design: dict[str, Any]
    criteria: list[Criterion]
    recommendation: str
    failed: list[str]
    wall_s: float
    created: str = ""
    recovery: list[dict[str, Any]] | str = field(default_factory=list)
    #: per seed, the async repeat's time to reward against the sync repeat's
    #: (:mod:`freshroll.figures.reward_time`); empty without sync repeats
    time_to_reward: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "name": self.name, "acceptance": self.acceptance,
            "created": self.created, "wall_s": self.wall_s, "seeds": self.seeds,
            "diagnosis": self.diagnosis, "design": self.design,
            "validation": [c.to_json() for c in self.criteria],
            "recovery": self.recovery, "time_to_reward": self.time_to_reward,
            "recommendation": self.recommendation, "failed": self.failed,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Decision:
        if d.get("format") != FORMAT:
            raise ValueError(f"not a decision record of format {FORMAT} "
                             f"(format: {d.get('format')!r})")
        return Decision(
            name=d["name"], acceptance=d["acceptance"], seeds=list(d["seeds"]),
            diagnosis=dict(d["diagnosis"]), design=dict(d["design"]),
            criteria=[Criterion.from_json(c) for c in d["validation"]],
            recommendation=d["recommendation"], failed=list(d["failed"]),
            wall_s=float(d["wall_s"]), created=d.get("created", ""),
            recovery=d.get("recovery", []), time_to_reward=list(d.get("time_to_reward", [])),
        )


def recommend(criteria: Sequence[Criterion]) -> tuple[str, list[str]]:
    """``production-transition`` when every gate passed, else ``stop`` and the failed gates."""
    bad = failed(criteria)
    return (STOP if bad or not criteria else PRODUCTION), bad


def diagnose(signals: Sequence[Mapping[str, Any]], idle_high: float) -> dict[str, Any]:
    """The bottleneck and failure signals of the repeats (see the module doc)."""
    runs = [s for s in signals if s.get("mode") == "async"] or [
        s for s in signals if s.get("mode") != "chaos"]
    votes: Counter[str] = Counter()
    for s in runs:
        votes.update(s.get("bottlenecks") or {})
    idles = [s["trainer_idle_ratio"] for s in runs
             if isinstance(s.get("trainer_idle_ratio"), int | float)]
    idle = sum(idles) / len(idles) if idles else None
    decided = {k: v for k, v in votes.items() if k in BOUND_WORDS}
    if decided:
        top = max(sorted(decided), key=lambda k: decided[k])
        bound, basis = BOUND_WORDS[top], (
            f"{sum(decided.values())} controller decisions over the async repeats: "
            + ", ".join(f"{BOUND_WORDS[k]} {v}" for k, v in sorted(decided.items())))
    elif idle is not None:
        bound = "generation-bound" if idle > idle_high else "trainer-bound"
        basis = (f"no controller decision; trainer idle {idle:.1%} "
                 f"{'>' if idle > idle_high else '<='} control.idle_high {idle_high:.1%}")
    else:
        bound, basis = "unknown", "no repeat left figures"
    stages = Counter(s["top_stage"]["stage"] for s in runs
                     if isinstance(s.get("top_stage"), Mapping) and s["top_stage"].get("stage"))
    return {
        "bottleneck": bound, "basis": basis, "trainer_idle_ratio_mean": idle,
        "dominant_stage": stages.most_common(1)[0][0] if stages else None,
        "signals": [dict(s) for s in signals],
    }


def design(cfg: Config, seeds: Sequence[int]) -> dict[str, Any]:
    """The settings and limits in force for the async repeats."""
    r, run = cfg.rollout, cfg.run
    return {
        "engine": r.engine, "runtime": run.runtime, "steps": run.steps,
        "max_staleness": run.max_staleness, "seeds": list(seeds),
        "batch": {"batch_groups": r.batch_groups, "group_size": r.group_size,
                  "rollouts_per_step": r.batch_groups * r.group_size},
        "workers": r.workers, "worker_batch": r.call_batch,
        "max_inflight_groups": r.max_inflight_groups,
        "control": cfg.control.model_dump(mode="json"),
        "limits": cfg.limits.model_dump(mode="json"),
        "trainer": {"correction": cfg.trainer.correction, "lr": cfg.trainer.lr,
                    "aggregation": cfg.trainer.aggregation},
        "tail": cfg.tail.model_dump(mode="json"),
        "sim": ({"profile": cfg.sim.profile, "clock": cfg.sim.clock}
                if r.engine == "sim" else None),
    }


def build(*, name: str, acceptance: str, cfg: Config, seeds: Sequence[int],
          criteria: Sequence[Criterion], signals: Sequence[Mapping[str, Any]],
          recovery: list[dict[str, Any]] | str, wall_s: float,
          environment: Mapping[str, Any] | None = None,
          time_to_reward: Sequence[Mapping[str, Any]] = ()) -> Decision:
    """The record of one validation; ``environment``: the machine (cpus, load averages)."""
    rec, bad = recommend(criteria)
    diagnosis = diagnose(signals, cfg.control.idle_high)
    diagnosis["environment"] = dict(environment or {})
    return Decision(
        name=name, acceptance=acceptance, seeds=list(seeds),
        diagnosis=diagnosis, design=design(cfg, seeds),
        criteria=list(criteria), recommendation=rec, failed=bad, wall_s=wall_s,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), recovery=recovery,
        time_to_reward=[dict(x) for x in time_to_reward],
    )


# == markdown =========================================================================
def _n(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, int | float):
        return format(v, spec)
    return str(v)


def _pct(v: Any) -> str:
    return format(v, ".1%") if isinstance(v, int | float) else "-"


def _link(run_dir: str, base: Path | None) -> str:
    """A relative link to a run directory; named by its path below ``base`` (a chaos case's
    ``<placement>/<scenario>/seed-<k>/run`` as ``<scenario>/seed-<k>``)."""
    p = Path(run_dir)
    rel = os.path.relpath(p, base) if base is not None else str(p)
    parts = Path(rel).parts
    name = p.name
    if name == "run" and len(parts) >= 3:
        name = f"{parts[-3]}/{parts[-2]}"
    return f"[{name}]({rel})"


def _counts(d: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"


def validation_table(criteria: Sequence[Criterion], base: Path | None = None,
                     links: bool = True) -> str:
    lines = ["| gate | threshold | measured | mean | min | max | stdev | n | result | evidence |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in criteria:
        sp = c.spread
        ev = ", ".join(_link(d, base) for d in c.evidence[:6]) if links else (
            f"{len(c.evidence)} run dir(s)")
        if links and len(c.evidence) > 6:
            ev += f" (+{len(c.evidence) - 6})"
        lines.append(
            f"| {c.name} | {c.threshold} | {_n(c.value)} | "
            f"{_n(sp.mean if sp else None)} | {_n(sp.min if sp else None)} | "
            f"{_n(sp.max if sp else None)} | {_n(sp.stdev if sp else None)} | "
            f"{sp.n if sp else len(c.per_repeat)} | {'PASS' if c.passed else '**FAIL**'} | "
            f"{ev or '-'} |")
    return "\n".join(lines)


def render_markdown(d: Decision, base: Path | None = None) -> str:
    """The record as markdown; evidence links relative to ``base`` (the record's folder):
    the verdict, then its diagnosis, design, validation and recommendation sections."""
    verdict = (f"**Recommendation: {d.recommendation.upper()}**"
               + (f": failed gates: {', '.join(d.failed)}" if d.failed else
                  ": every gate passed"))
    out = [f"# Decision record: {d.name}", "", verdict, "",
           f"Acceptance file `{d.acceptance}`; seeds {d.seeds}; written {d.created}; "
           f"validation took {d.wall_s:.1f} s.", ""]
    out += _diagnosis(d.diagnosis, base)
    out += _design(d.design)
    out += _validation(d, base)
    out += _recommendation(d)
    return "\n".join(out) + "\n"


def _diagnosis(dg: Mapping[str, Any], base: Path | None) -> list[str]:
    """The diagnosis section: the bottleneck, and the failure signals of every repeat."""
    out = ["## Diagnosis", "",
           f"- Bottleneck: **{dg['bottleneck']}** ({dg['basis']}).",
           f"- Trainer idle (mean over async repeats): {_pct(dg.get('trainer_idle_ratio_mean'))}; "
           f"dominant stage of a sample's time: {dg.get('dominant_stage') or '-'}.",
           *_machine(dg.get("environment") or {}),
           "", "Failure signals per repeat (and per chaos case of the recovery gates):", "",
           "| repeat | verdict | discards by reason | rejected results | worker fences | "
           "faults injected |", "|---|---|---|---|---|---|"]
    for s in dg.get("signals", []):
        out.append(f"| {_link(s['run_dir'], base)} | {s.get('verdict') or '-'}"
                   f"{'' if s.get('ok') else ' (FAILED)'} | {_counts(s.get('discards'))} | "
                   f"{_counts(s.get('rejected'))} | {_counts(s.get('fences'))} | "
                   f"{_counts(s.get('faults'))} |")
    failures = [(s["label"], k, v) for s in dg.get("signals", [])
                for k, v in (s.get("first_failure") or {}).items()]
    if failures:
        out += ["", "First failure per discard reason:", ""]
        out += [f"- {lbl}: {k} x{v.get('count')}: {v.get('first')}" for lbl, k, v in failures]
    return out


def _design(ds: Mapping[str, Any]) -> list[str]:
    """The design section: the settings every repeat ran with."""
    b = ds["batch"]
    out = ["", "## Design", "",
           "| setting | value |", "|---|---|",
           f"| engine / runtime | {ds['engine']} / {ds['runtime']} |",
           f"| steps per repeat | {ds['steps']} |",
           f"| max_staleness | {ds['max_staleness']} (synchronous baseline: 0) |",
           f"| batch | {b['batch_groups']} groups x {b['group_size']} = "
           f"{b['rollouts_per_step']} rollouts per step |",
           f"| workers / worker_batch | {ds['workers']} / {ds['worker_batch']} |",
           f"| max_inflight_groups | {_n(ds['max_inflight_groups'])} |",
           f"| control | {_kv(ds['control'])} |",
           f"| limits | {_kv(ds['limits'])} |",
           f"| trainer | {_kv(ds['trainer'])} |",
           f"| tail | {_kv(ds['tail'])} |"]
    if ds.get("sim"):
        out.append(f"| sim | {_kv(ds['sim'])} |")
    return out


def _validation(d: Decision, base: Path | None) -> list[str]:
    """The validation section: the gates' table and notes, the recovery gates' chaos cases,
    time to reward, and each gate's figure per repeat."""
    out = ["", "## Validation", "", validation_table(d.criteria, base), ""]
    notes = [c for c in d.criteria if c.note]
    if notes:
        out += ["Notes:", ""] + [f"- {c.name}: {c.note}" for c in notes] + [""]
    if isinstance(d.recovery, list) and d.recovery:
        out += ["Chaos cases of the recovery gates (each beside its fault-free twin, same "
                "seed):", "", "| case | recovery s | throughput vs fault-free | outcome | "
                "violations |", "|---|---|---|---|---|"]
        for case in d.recovery:
            rs = case.get("recovery_s")
            out.append(f"| {_link(case['run_dir'], base)} | "
                       f"{'never' if rs is None and not case.get('error') else _n(rs)} | "
                       f"{_n(case.get('throughput_ratio'), '.2f')} | "
                       f"{case.get('error') or case.get('outcome') or '-'} | "
                       f"{len(case.get('violations') or [])} |")
        out.append("")
    out += _time_to_reward(d.time_to_reward)
    out += ["Per repeat:", ""]
    for c in d.criteria:
        if c.per_repeat:
            out.append(f"- {c.name} ({c.figure}): "
                       + ", ".join(f"{k} {_n(v)}" for k, v in c.per_repeat))
    return out


def _recommendation(d: Decision) -> list[str]:
    """The recommendation section: production, or stop with each failed gate's figure."""
    out = ["", "## Recommendation", ""]
    if d.recommendation == PRODUCTION:
        out.append(f"**{PRODUCTION}**: every gate of `{d.acceptance}` passed on every repeat.")
    else:
        out.append(f"**{STOP}**: {len(d.failed)} gate(s) failed: "
                   + ", ".join(f"`{n}`" for n in d.failed) + ".")
        for c in d.criteria:
            if not c.passed:
                out.append(f"- `{c.name}`: measured {_n(c.value)}, required {c.threshold}"
                           + (f" ({c.note})" if c.note else ""))
    return out


def _time_to_reward(per_seed: Sequence[Mapping[str, Any]]) -> list[str]:
    """The time-to-reward table (each seed's async repeat against its sync repeat)."""
    if not per_seed:
        return []
    out = ["Time to reward, async against sync (throughput is not convergence): the wall "
           "seconds and steps each repeat needed to reach 25/50/75% of the way from the lower "
           "starting reward to the best either reached (`freshroll.figures.reward_time`).", "",
           "| seed | level (reward) | async | sync | seconds ratio | steps ratio |",
           "|---|---|---|---|---|---|"]

    def at(x: Mapping[str, Any] | None) -> str:
        return "not reached" if x is None else f"{_n(x['s'], '.1f')} s (step {x['step']})"

    for c in per_seed:
        if c.get("note"):
            out.append(f"| {c['seed']} | - | {c['note']} | | | |")
        for lv in c.get("levels") or []:
            out.append(f"| {c['seed']} | {int(lv['frac'] * 100)}% ({_n(lv['reward'], '.3f')}) "
                       f"| {at(lv['run'])} | {at(lv['baseline'])} | "
                       f"{_n(lv['s_ratio'], '.2f')} | {_n(lv['steps_ratio'], '.2f')} |")
    return [*out, ""]


def _machine(env: Mapping[str, Any]) -> list[str]:
    cpus, a, b = env.get("cpus"), env.get("loadavg_start"), env.get("loadavg_end")
    if cpus is None and a is None:
        return []
    line = f"- Machine: {cpus or '?'} CPUs; load average {_n(a, '.2f')} at the start, " \
           f"{_n(b, '.2f')} at the end"
    busy = [x for x in (a, b) if isinstance(x, int | float)]
    if env.get("clock") == "virtual":
        line += " (the repeats ran in virtual time: the load does not move their rates)"
    elif cpus and busy and max(busy) > cpus:
        line += (" (above the CPU count: other work competed for the CPUs, so every rate is "
                 "lower and noisier than on an idle machine)")
    return [line + "."]


def _kv(d: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k} {_n(v)}" for k, v in (d or {}).items()) or "-"


def write(d: Decision, out: Path) -> tuple[Path, Path]:
    """``OUT/decision.md`` and ``OUT/decision.json``."""
    from freshroll.runtime.rundir import write_text_atomic

    md, js = out / "decision.md", out / "decision.json"
    write_text_atomic(js, json.dumps(d.to_json(), indent=1, allow_nan=False) + "\n")
    write_text_atomic(md, render_markdown(d, out))
    return md, js


def read_decision(path: Path) -> Decision:
    return Decision.from_json(json.loads(path.read_text()))


def sections(markdown: str) -> list[str]:
    """The ``##`` headings of a rendered record, in order."""
    return [line[3:].strip() for line in markdown.splitlines() if line.startswith("## ")]


def summary_line(d: Decision) -> str:
    if d.recommendation == PRODUCTION:
        return f"decision: {PRODUCTION} (every gate passed)"
    return f"decision: {STOP} (failed: {', '.join(d.failed)})"


__all__ = ["PRODUCTION", "SECTIONS", "STOP", "Decision", "build", "design", "diagnose",
           "read_decision", "recommend", "render_markdown", "sections", "summary_line",
           "validation_table", "write"]

"""Running one chaos case in-process (for the Injector's own tests): a scenario on a seed, on
the virtual clock; a kill (kill_process, trainer_crash) raises :class:`Killed` from
``on_kill`` instead of SIGKILL, and the run is resumed with the fired faults skipped, as the
chaos runner's child process would be."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from freshroll.chaos.inject import Injector
from freshroll.chaos.plan import Plan, Scenario, workload_of
from freshroll.config import validate
from freshroll.errors import Interrupted
from freshroll.harness.verify import Report, verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import open_ledger
from freshroll.runtime.run import run

LIBRARY = Path(__file__).resolve().parents[2] / "chaos" / "library.yaml"


class Killed(Exception):
    """What ``on_kill`` raises in-process (the child process SIGKILLs itself instead)."""


def on_kill(kind: str) -> None:
    raise Killed(kind)


@dataclass
class Case:
    run_dir: Path
    events: list[ev.Event]
    errors: list[BaseException] = field(default_factory=list)  # each incarnation's end
    injectors: list[Injector] = field(default_factory=list)
    verify: Report | None = None

    def of(self, kind: type[ev.Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def faults(self) -> list[ev.FaultInjected]:
        """The firings (not the continuation records naming the samples a reward fault
        failed: ``#<i> failed <sample> ...``)."""
        return [e for e in self.of(ev.FaultInjected) if not re.match(r"#\d+ failed ", e.detail)]

    def fired(self) -> set[int]:
        return fired_indexes(self.events)

    def discarded(self, reason: str) -> list[ev.Discarded]:
        return [e for e in self.of(ev.Discarded) if e.reason == reason]

    def rejected(self, reason: str) -> list[ev.Rejected]:
        return [e for e in self.of(ev.Rejected) if e.reason == reason]

    def committed_samples(self) -> set[str]:
        return {s for e in self.of(ev.Committed) for s in e.samples}


def fired_indexes(events: list[ev.Event]) -> set[int]:
    out = set()
    for e in events:
        if isinstance(e, ev.FaultInjected):
            m = re.match(r"#(\d+) ", e.detail)
            assert m, f"fault_injected detail without its index: {e.detail!r}"
            out.add(int(m.group(1)))
    return out


def scenario(kind: str, at: dict[str, Any], **kw: Any) -> Scenario:
    workload = kw.pop("workload", {})
    return Scenario.model_validate({"name": f"t-{kind.replace('_', '-')}", "workload": workload,
                                    "faults": [{"kind": kind, "at": at, **kw}]})


def run_case(sc: Scenario, seed: int, tmp: Path, plan: Plan | None = None,
             max_incarnations: int = 4) -> Case:
    """Run ``sc`` on ``seed`` in ``tmp/<name>-<seed>``; resume after a kill or an interrupt."""
    plan = plan or Plan(scenarios=[sc])
    cfg = validate(workload_of(plan, sc, seed), f"{sc.name} seed {seed}")
    out = tmp / f"{sc.name}-{seed}"
    case = Case(out, [])
    resume = False
    for _ in range(max_incarnations):
        skip = fired_indexes([e for _, e in open_ledger(out).events()]) if resume else set()
        inj = Injector(sc, seed, skip=frozenset(skip), on_kill=on_kill)
        case.injectors.append(inj)
        try:
            run(None if resume else cfg, out, resume=resume, chaos=inj, stream=io.StringIO(),
                report=False)
        except (Killed, Interrupted) as exc:
            case.errors.append(exc)
            resume = True
            continue
        except Exception as exc:
            case.errors.append(exc)
        break
    case.events = [e for _, e in open_ledger(out).events()]
    case.verify = verify_run(out)
    return case


def event_key(events: list[ev.Event]) -> list[dict[str, Any]]:
    """The events as plain data, without the run id (which names the run directory)."""
    out = []
    for e in events:
        d = msgspec.to_builtins(e)
        d.pop("run_id", None)
        out.append(d)
    return out


def evidence(case: Case, sc: Scenario) -> list[str]:
    """What each fault of ``sc`` must have left in the ledger (beyond its ``fault_injected``
    event); empty when all is there. Parameter-aware, for any seed."""
    problems: list[str] = []
    faults = {fired: e for e in case.faults() for fired in fired_indexes([e])}
    inj = case.injectors[0]
    for i, fault in enumerate(sc.faults):
        e = faults.get(i)
        if e is None:
            problems.append(f"#{i} {fault.kind} never fired")
            continue
        ok = _EVIDENCE.get(fault.kind, lambda c, f, e, inj: True)(case, fault, e, inj)
        if not ok:
            problems.append(f"#{i} {fault.kind}: no evidence ({e.detail})")
    return problems


def _fences(case: Case, e: ev.FaultInjected, reason: str) -> list[ev.WorkerFenced]:
    return [f for f in case.of(ev.WorkerFenced) if f.ts >= e.ts and f.reason == reason
            and (e.target in ("all", "none") or f.worker in e.target.split(","))]


def _stall(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    fences = _fences(case, e, "timeout")
    return bool(fences) and any(r.ts > fences[0].ts for r in case.rejected("fenced"))


def _burst(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    return sum(1 for c in case.of(ev.Committed) if c.train_s == 0.0) >= f.count


def _bump(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    m = re.search(r"published (\S+) ", e.detail)
    return bool(m) and not [s for s in case.of(ev.Started) if s.version == m.group(1)]


def _held(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    ends = [d.reason for s in inj.held for d in case.of(ev.Discarded) if d.sample == s]
    return bool(inj.held) and ends in (["fenced"] * len(inj.held),
                                       ["deadline"] * len(inj.held))


def _gap(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    ts = [c.ts for c in case.of(ev.Committed)]
    return max(b - a for a, b in itertools.pairwise(ts)) >= f.duration_s


def _failed(case: Case, f: Any, e: ev.FaultInjected, inj: Injector) -> bool:
    failed = {s for ids in inj.failed.values() for s in ids}
    return bool(failed) and not failed & case.committed_samples()


_EVIDENCE: dict[str, Callable[[Case, Any, ev.FaultInjected, Injector], bool]] = {
    "stall_worker": _stall,
    "kill_worker": lambda c, f, e, inj: bool(_fences(c, e, "lost")),
    "kill_all_workers": lambda c, f, e, inj: len(_fences(c, e, "lost")) >= 3,
    "fail_weights": lambda c, f, e, inj: bool(_fences(c, e, "lost")),
    "stall_weights": lambda c, f, e, inj: bool(_fences(c, e, "timeout")),
    "duplicate_reward": lambda c, f, e, inj: len(c.rejected("duplicate")) >= f.count,
    "duplicate_messages": lambda c, f, e, inj: len(c.rejected("duplicate")) >= f.count,
    "malformed_completion": lambda c, f, e, inj: len(c.discarded("invalid")) == f.count,
    "malformed_reward": lambda c, f, e, inj: len(c.discarded("reward_error")) >= f.count,
    "fail_reward": _failed,
    "version_burst": _burst,
    "version_bump": _bump,
    "hold_group": _held,
    "stall_trainer": _gap,
    "kill_process": lambda c, f, e, inj: len(c.of(ev.Opened)) >= 2,
    "trainer_crash": lambda c, f, e, inj: len(c.of(ev.Opened)) >= 2,
    "interrupt": lambda c, f, e, inj: "interrupted" in [x.reason for x in c.of(ev.Closed)],
}

"""The checks of one chaos case: every ``verify`` invariant, and what faults must not break.

Like :mod:`freshroll.harness.verify` these read the run directory and its ledger only, and
share no state-machine code with :mod:`freshroll.kernel.buffer`.

===================  ===============================================================
invariant            what is checked
===================  ===============================================================
(verify's)           every invariant of ``freshroll verify`` on the faulted run's
                     directory (conservation, duplicates, loss, unexpected,
                     freshness, fencing, lineage, accounting)
faults_recorded      every planned fault fired and was recorded as ``fault_injected``
                     (``detail`` starts ``#<index> ``), in one incarnation only (a fault
                     that fires again after a resume is a violation); no record names
                     a fault the scenario does not have
prompt_sequence      across incarnations, groups are admitted as ``g0, g1, ...`` with
                     no gap and no repeat, and group ``g<k>``'s prompt is
                     ``order[k % len(order)]``, the run's planned order (its prompts
                     shuffled with ``run.seed``, as :mod:`freshroll.runtime.run` does):
                     no prompt skipped or repeated across a resume (NeMo-RL #3599)
admission_bound      at every admission, before and after a resume, the groups in
                     flight stay within the kernel's window:
                     ``accepted + running <= (W + v) x B`` (``W``: the admission window
                     in force, ``eta + 1`` by default), and ``running`` within
                     the live admission limit (AReaL #1388; :mod:`freshroll.kernel.freshness`)
reward_failures      every sample the injector failed (``fail_reward``,
                     ``malformed_reward``: the sample ids its records name) is never
                     committed, and is discarded ``reward_error``
tool_failures        every sample whose tool call the injector failed (``hang_tool``,
                     ``fail_tool``, ``malformed_tool``, ``kill_env``,
                     ``disconnect_gateway``:
                     :mod:`freshroll.chaos.envfaults`) is never committed, and is discarded
                     ``tool_error`` (never a reward of 0, never a hang)
expected_outcome     ``expect: recovers``: the run finished with all its steps and the
                     ledger closed ``done``; ``expect: stops``: it stopped with an error
                     containing the scenario's ``error``
liveness             (the runner's) the run finished or stopped within its horizon
===================  ===============================================================

Each check is a function of the events (and what it needs besides) returning
:class:`~freshroll.chaos.result.Violation` s; :func:`check_case` runs them all.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from freshroll.chaos.plan import Scenario
from freshroll.chaos.result import Violation
from freshroll.config import Config
from freshroll.harness.admission import AdmissionFold
from freshroll.harness.verify import INVARIANTS, verify_run
from freshroll.ledger import events as ev

#: chaos checks beyond verify's invariants, in report order
CHECKS = ("faults_recorded", "prompt_sequence", "admission_bound", "reward_failures",
          "tool_failures", "expected_outcome", "liveness")
ALL_INVARIANTS = (*INVARIANTS, *CHECKS)
#: fault kinds whose records name the samples they failed
REWARD_FAILURES = frozenset({"fail_reward", "malformed_reward"})
TOOL_FAILURES = frozenset({"hang_tool", "fail_tool", "malformed_tool", "kill_env",
                           "disconnect_gateway"})
#: violations kept per invariant (the count is kept whole)
LIMIT = 20

_INDEX = re.compile(r"#(\d+)(?:\s|$)")
_SAMPLE = re.compile(r"\bg\d+\.\d+#\d+\b")


def fault_index(detail: str) -> int | None:
    """The fault index a ``fault_injected`` detail starts with (``#3 ...`` -> 3)."""
    m = _INDEX.match(detail)
    return int(m.group(1)) if m else None


# -- faults_recorded ----------------------------------------------------------------------
def faults_recorded(events: Iterable[ev.Event], n_faults: int) -> list[Violation]:
    where: dict[int, set[int]] = {}  # fault index -> incarnations that recorded it
    out: list[Violation] = []
    incarnation = -1
    for e in events:
        if isinstance(e, ev.Opened):
            incarnation = e.incarnation
        elif isinstance(e, ev.FaultInjected):
            i = fault_index(e.detail)
            if i is None or not 0 <= i < n_faults:
                out.append(Violation("faults_recorded", f"fault_injected {e.fault} at "
                                     f"{e.ts:.1f}s names no planned fault: {e.detail!r}"))
                continue
            where.setdefault(i, set()).add(incarnation)
    for i in range(n_faults):
        seen = where.get(i)
        if not seen:
            out.append(Violation("faults_recorded", f"fault #{i} was planned but never "
                                 "recorded (it did not fire)"))
        elif len(seen) > 1:
            out.append(Violation("faults_recorded", f"fault #{i} fired in incarnations "
                                 f"{sorted(seen)}: again after a resume"))
    return out


def fired_indexes(events: Iterable[ev.Event]) -> frozenset[int]:
    """The fault indexes the ledger recorded as fired (what a resume must skip)."""
    out = set()
    for e in events:
        if isinstance(e, ev.FaultInjected):
            i = fault_index(e.detail)
            if i is not None:
                out.add(i)
    return frozenset(out)


# -- prompt_sequence ----------------------------------------------------------------------
def planned_order(cfg: Config) -> list[str] | None:
    """The run's prompt order as :func:`freshroll.runtime.run.run` derives it: the prompt
    ids shuffled with ``run.seed`` (None: prompts from a file, not derivable here)."""
    t = cfg.task
    if t.file is not None:
        return None
    from freshroll.rewards.tasks import make_prompts

    name, n, params = t.builtin()
    order = [p.prompt_id for p in make_prompts(name, n, cfg.run.seed, **params)]
    random.Random(cfg.run.seed).shuffle(order)
    return order


def prompt_sequence(events: Iterable[ev.Event], order: Sequence[str] | None) -> list[Violation]:
    out: list[Violation] = []
    k, incarnation = 0, 0
    for e in events:
        if isinstance(e, ev.Opened):
            incarnation = e.incarnation
        elif isinstance(e, ev.Requested):
            if e.group != f"g{k}":
                out.append(Violation("prompt_sequence", f"incarnation {incarnation}: group "
                                     f"{e.group} admitted where g{k} was next (a gap or a "
                                     "repeat)"))
                m = re.fullmatch(r"g(\d+)", e.group)
                k = int(m.group(1)) if m else k
            if order and e.prompt_id != order[k % len(order)]:
                out.append(Violation("prompt_sequence", f"incarnation {incarnation}: group "
                                     f"{e.group} got prompt {e.prompt_id}, the planned order "
                                     f"has {order[k % len(order)]} (a prompt skipped or "
                                     "repeated)"))
            k += 1
    return out


# -- admission_bound ----------------------------------------------------------------------
def admission_bound(events: Iterable[ev.Event]) -> list[Violation]:
    fold = AdmissionFold()  # the window in force (verify's freshness check shares it)
    limit: int | None = None  # the live admission limit on groups running
    last_decision: ev.ControllerDecided | None = None
    out: list[Violation] = []
    incarnation = 0
    for e in events:
        if isinstance(e, ev.Opened):
            incarnation = e.incarnation
            d = last_decision
            limit = (d.settings.admission_limit or None) if d is not None and \
                d.mode == "adaptive" else e.max_inflight_groups
        elif isinstance(e, ev.ControllerDecided):
            last_decision, limit = e, e.settings.admission_limit or None
        bad = fold.feed(e)
        if bad is not None:
            out.append(Violation("admission_bound", f"incarnation {incarnation}: {bad}"))
        if isinstance(e, ev.Requested) and limit is not None and fold.running > limit:
            out.append(Violation("admission_bound", f"incarnation {incarnation}: {e.group} "
                                 f"admitted with {fold.running} groups running > the "
                                 f"admission limit {limit}"))
    return out


# -- reward_failures, tool_failures -------------------------------------------------------
def reward_failures(events: Iterable[ev.Event]) -> list[Violation]:
    return failed_samples(events, REWARD_FAILURES, "reward_error", "reward_failures")


def tool_failures(events: Iterable[ev.Event]) -> list[Violation]:
    return failed_samples(events, TOOL_FAILURES, "tool_error", "tool_failures")


def failed_samples(events: Iterable[ev.Event], kinds: frozenset[str], reason: str,
                   name: str) -> list[Violation]:
    """Every sample a ``kinds`` fault record names is never committed and is discarded
    ``reason``."""
    failed: dict[str, str] = {}  # sample -> the fault record naming it
    committed: set[str] = set()
    discarded: dict[str, str] = {}  # sample -> reason
    for e in events:
        if isinstance(e, ev.FaultInjected) and e.fault in kinds:
            for s in _SAMPLE.findall(e.detail):
                failed.setdefault(s, f"{e.fault} {e.detail.split(' ', 1)[0]}")
        elif isinstance(e, ev.Committed):
            committed.update(e.samples)
        elif isinstance(e, ev.Discarded) and e.sample is not None:
            discarded.setdefault(e.sample, e.reason)
    out = []
    for s, why in failed.items():
        if s in committed:
            out.append(Violation(name, f"{s} was failed by {why} but committed"))
        elif discarded.get(s) != reason:
            got = discarded.get(s)
            out.append(Violation(name, f"{s} was failed by {why} but "
                                 + (f"discarded {got}" if got else "never discarded")
                                 + f", not {reason}"))
    return out


# -- expected_outcome ---------------------------------------------------------------------
def expected_outcome(scenario: Scenario, events: Sequence[ev.Event], steps: int,
                     error: str | None) -> list[Violation]:
    """``error``: the line of the error that stopped the run (None: it finished)."""
    committed = sum(1 for e in events if isinstance(e, ev.Committed))
    closed = next((e.reason for e in reversed(events) if isinstance(e, ev.Closed)), None)
    if scenario.expect == "recovers":
        if error is not None:
            return [Violation("expected_outcome", f"expected to recover, but the run stopped: "
                              f"{error}")]
        if committed != steps or closed != "done":
            return [Violation("expected_outcome", f"expected to recover: {committed} of "
                              f"{steps} steps committed, ledger closed {closed!r}")]
        return []
    want = scenario.error or ""
    if error is None:
        return [Violation("expected_outcome", f"expected to stop with {want!r}, but the run "
                          f"finished ({committed} of {steps} steps)")]
    if want not in error:
        return [Violation("expected_outcome", f"expected to stop with {want!r}, but it "
                          f"stopped with: {error}")]
    return []


# -- all of them --------------------------------------------------------------------------
def verify_violations(run_dir: Path) -> list[Violation]:
    report = verify_run(run_dir)
    return [Violation(name, msg) for name, msgs in report.violations.items() for msg in msgs]


def check_case(scenario: Scenario, run_dir: Path, events: Sequence[ev.Event], *, steps: int,
               error: str | None, order: Sequence[str] | None) -> list[Violation]:
    """Every check of one faulted run (``error``: what stopped it, None: it finished)."""
    found = [
        *verify_violations(run_dir),
        *faults_recorded(events, len(scenario.faults)),
        *prompt_sequence(events, order),
        *admission_bound(events),
        *reward_failures(events),
        *tool_failures(events),
        *expected_outcome(scenario, events, steps, error),
    ]
    return capped(found)


def capped(found: Sequence[Violation], limit: int = LIMIT) -> list[Violation]:
    """At most ``limit`` violations per invariant, then one saying how many more."""
    seen: dict[str, int] = {}
    out = []
    for v in found:
        n = seen[v.invariant] = seen.get(v.invariant, 0) + 1
        if n <= limit:
            out.append(v)
    for name, n in seen.items():
        if n > limit:
            out.append(Violation(name, f"... and {n - limit} more {name} violation(s)"))
    return out


__all__ = [
    "ALL_INVARIANTS",
    "CHECKS",
    "admission_bound",
    "capped",
    "check_case",
    "expected_outcome",
    "failed_samples",
    "fault_index",
    "faults_recorded",
    "fired_indexes",
    "planned_order",
    "prompt_sequence",
    "reward_failures",
    "tool_failures",
    "verify_violations",
]

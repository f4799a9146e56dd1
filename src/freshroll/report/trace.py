"""``freshroll trace RUN_DIR``: every sample's life as a Chrome trace-event file, which
Perfetto (ui.perfetto.dev) and chrome://tracing open.

Everything comes from the ledger's events (docs/ledger.md); nothing is estimated. With
``t(x)`` the timestamp of event x of one attempt, the spans are::

    queue        [t(requested), t(started)]; a re-issued attempt: from its predecessor's
                 fenced discard                                          track  queue
    generate     [t(started), t(generated) or t(its discard)]                   its worker
    reward       [t(generated), t(rewarded) or t(its discard)]                  reward
    buffer wait  [t(rewarded), t(leased) of its group or t(its discard)]; after a released
                 lease, again from t(lease_released)                            buffer
    train step   [t(leased), t(committed) | t(step_skipped) | t(lease_released)], one per
                 lease                                                          trainer
    load weights [t(weights_loaded) - transfer_s, t(weights_loaded)]            its worker
    start engine [t(worker_started), t(worker_ready)]                           its worker

A span that ends otherwise than its phase normally does is named ``<phase> (<outcome>)``
(``generate (fenced)``, ``buffer wait (stale)``) and has ``args.outcome`` (the discard
reason, ``skipped``, ``released``); one still open when the ledger ends (a crashed or live
run) ends at the ledger's last event with outcome ``unfinished``. A sample's spans carry its
``sample``, ``request``, ``attempt``, ``policy_version``, ``reward_version`` (once scored)
and ``step`` (the trainer step that consumed it) in ``args``.

The file (:mod:`freshroll.report.chrome`) has one process per stage (:data:`PROCESSES`),
one thread per worker, split into lanes where spans overlap. Times are whole microseconds
since the ledger's first event (any clock: virtual runs start at 0).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError, RunDirError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import (
    GroupId,
    group_of,
    parse_sample_id,
    policy_step,
    request_ids,
    request_of,
)
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.report.chrome import Mark, Span, Track, chrome_trace

TRACE_FILE = "trace.json"
#: the processes of the trace, top to bottom (pid = position + 1)
PROCESSES = ("queue", "inference", "reward", "buffer", "trainer")
UNFINISHED = "unfinished"

End = tuple[float, str, str]  # (ts, outcome, detail)


@dataclass
class _Attempt:
    sample: str
    queued: float
    started: ev.Started
    generated: ev.Generated | None = None
    rewarded: ev.Rewarded | None = None
    end: End | None = None  # its discard


@dataclass
class _Request:
    request: str
    queued: float | None  # queued, not started, since then
    attempts: list[_Attempt] = field(default_factory=list)
    lost_queue: tuple[float, End] | None = None  # discarded while queued: (since, end)
    discarded: End | None = None  # its terminal discard


@dataclass
class _Lease:
    leased: ev.Leased
    end: End | None = None
    committed: ev.Committed | None = None


@dataclass
class History:
    """A ledger folded for the trace (:func:`fold`)."""

    t0: float = 0.0  # the first event's ts
    t_end: float = 0.0  # the last event's ts
    requests: dict[str, _Request] = field(default_factory=dict)
    leases: dict[str, _Lease] = field(default_factory=dict)
    by_group: dict[str, list[_Lease]] = field(default_factory=dict)
    step_of: dict[str, int] = field(default_factory=dict)  # sample -> step that consumed it
    resources: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    #: (worker, epoch) -> ts of its worker_started, until its worker_ready
    starting: dict[tuple[str, int], float] = field(default_factory=dict)


# -- folding the events -----------------------------------------------------------------------


def fold(events: Iterable[ev.Event]) -> History:
    """The ledger's events (in ``seq`` order) indexed by request, lease and worker."""
    h = History()
    for n, e in enumerate(events):
        if n == 0:
            h.t0 = h.t_end = e.ts
        h.t_end = max(h.t_end, e.ts)
        _feed(h, e)
    return h


def _feed(h: History, e: ev.Event) -> None:
    if isinstance(e, ev.Requested):
        for q in request_ids(GroupId(e.group), e.size):
            h.requests[q] = _Request(q, e.ts)
    elif isinstance(e, ev.Started):
        r = _request(h, request_of(e.sample))
        r.attempts.append(_Attempt(e.sample, e.ts if r.queued is None else r.queued, e))
        r.queued = None
    elif isinstance(e, ev.Generated | ev.Rewarded):
        a = _attempt(h, e.sample)
        if a is not None:
            if isinstance(e, ev.Generated):
                a.generated = e
            else:
                a.rewarded = e
    elif isinstance(e, ev.Discarded):
        _discard(h, e)
    elif isinstance(e, ev.Leased):
        lease = h.leases[e.lease] = _Lease(e)
        for g in e.groups:
            h.by_group.setdefault(g, []).append(lease)
    elif isinstance(e, ev.StepSkipped | ev.LeaseReleased | ev.Committed):
        _end_lease(h, e)
    else:
        _resource(h, e)


def _request(h: History, request: str) -> _Request:
    """The record of ``request``; for one whose ``requested`` the ledger lacks, a new one
    (never queued)."""
    return h.requests.get(request) or h.requests.setdefault(request, _Request(request, None))


def _attempt(h: History, sample: str) -> _Attempt | None:
    r = h.requests.get(request_of(sample))
    return next((a for a in r.attempts if a.sample == sample), None) if r else None


def _discard(h: History, e: ev.Discarded) -> None:
    r = _request(h, e.request)
    end = (e.ts, e.reason, e.detail)
    a = _attempt(h, e.sample) if e.sample is not None else None
    if a is not None and a.end is None:
        a.end = end
    if e.reason in ev.RETRY_REASONS:
        r.queued = e.ts
        return
    if r.queued is not None:
        r.lost_queue, r.queued = (r.queued, end), None
    r.discarded = end


def _end_lease(h: History, e: ev.StepSkipped | ev.LeaseReleased | ev.Committed) -> None:
    lease = h.leases[e.lease]
    if lease.end is not None:  # a skipped step's lease is released after it
        return
    if isinstance(e, ev.Committed):
        lease.end, lease.committed = (e.ts, "committed", ""), e
        for s in e.samples:
            h.step_of[s] = policy_step(e.version)
    elif isinstance(e, ev.StepSkipped):
        lease.end = (e.ts, "skipped", e.detail)
    else:
        lease.end = (e.ts, "released", e.reason)


def _resource(h: History, e: ev.Event) -> None:
    """Worker and run events: engine start-ups, weight loads, fences, faults, open/close."""
    if isinstance(e, ev.WorkerStarted):
        h.starting[(e.worker, e.epoch)] = e.ts
    elif isinstance(e, ev.WorkerReady):
        since = h.starting.pop((e.worker, e.epoch), e.ts - e.startup_s)
        h.resources.append(Span(("inference", e.worker), "start engine", since, e.ts,
                                {"worker": e.worker, "epoch": e.epoch,
                                 "startup_s": e.startup_s}))
    elif isinstance(e, ev.WeightsLoaded):
        h.resources.append(Span(("inference", e.worker), "load weights",
                                e.ts - e.transfer_s, e.ts,
                                {"worker": e.worker, "epoch": e.epoch,
                                 "policy_version": e.version, "transfer_s": e.transfer_s}))
    elif isinstance(e, ev.WorkerFenced):
        h.marks.append(Mark(("inference", e.worker), f"fenced ({e.reason})", e.ts,
                            {"worker": e.worker, "epoch": e.epoch, "reason": e.reason,
                             "detail": e.detail}))
    elif isinstance(e, ev.FaultInjected):
        h.marks.append(Mark(("trainer", "trainer"), f"fault {e.fault}", e.ts,
                            {"fault": e.fault, "target": e.target, "detail": e.detail}))
    elif isinstance(e, ev.TrainerRestarted):
        h.marks.append(Mark(("trainer", "trainer"), "trainer restarted", e.ts,
                            {"lease": e.lease, "reason": e.reason, "detail": e.detail,
                             "rebuild_s": e.rebuild_s}))
    elif isinstance(e, ev.Opened | ev.Closed):
        name = (f"opened (incarnation {e.incarnation})" if isinstance(e, ev.Opened)
                else f"closed ({e.reason})")
        h.marks.append(Mark(("trainer", "trainer"), name, e.ts, {}))


# -- spans ------------------------------------------------------------------------------------


def spans(h: History) -> list[Span]:
    """Every span of the run (module docstring): the samples', the trainer's, the workers'."""
    out = [s for r in h.requests.values() for s in _request_spans(h, r)]
    out += [_lease_span(h, lease) for lease in h.leases.values()]
    return out + h.resources


def _named(phase: str, outcome: str, normal: str) -> str:
    return phase if outcome == normal else f"{phase} ({outcome})"


def _span(track: Track, phase: str, start: float, end: End, normal: str,
          args: dict[str, Any], key: str) -> Span:
    ts, outcome, detail = end
    extra = {"outcome": outcome} | ({"detail": detail} if detail else {})
    return Span(track, _named(phase, outcome, normal), start, ts, args | extra, key)


def _request_spans(h: History, r: _Request) -> list[Span]:
    out = []
    for a in r.attempts:
        out += _attempt_spans(h, r.request, a)
    last = h.t_end
    if r.lost_queue is not None:
        since, end = r.lost_queue
        out.append(_span(("queue", "queue"), "queue", since, end, "started",
                         {"request": r.request}, r.request))
    elif r.queued is not None:
        out.append(_span(("queue", "queue"), "queue", r.queued, (last, UNFINISHED, ""),
                         "started", {"request": r.request}, r.request))
    return out


def _attempt_spans(h: History, request: str, a: _Attempt) -> list[Span]:
    """The queue, generate, reward and buffer-wait spans of one attempt."""
    s, g, rw = a.started, a.generated, a.rewarded
    args: dict[str, Any] = {
        "sample": a.sample, "request": request, "attempt": parse_sample_id(a.sample)[1],
        "policy_version": s.version, "worker": s.worker, "epoch": s.epoch,
        "reward_version": rw.reward_version if rw else None, "step": h.step_of.get(a.sample),
    }
    open_end = a.end or (h.t_end, UNFINISHED, "")
    out = [_span(("queue", "queue"), "queue", a.queued, (s.ts, "started", ""), "started",
                 args, request)]
    gen_end = (g.ts, "generated", "") if g else open_end
    gen_args = args if g is None else args | {
        "tokens": g.tokens, "gen_s": g.gen_s, "last_version": g.last_version}
    out.append(_span(("inference", s.worker), "generate", s.ts, gen_end, "generated",
                     gen_args, request))
    if g is None:
        return out
    reward_end = (rw.ts, "rewarded", "") if rw else open_end
    reward_args = args if rw is None else args | {"reward": rw.reward, "reward_s": rw.reward_s}
    out.append(_span(("reward", "reward"), "reward", g.ts, reward_end, "rewarded",
                     reward_args, request))
    if rw is not None:
        out += _buffer_waits(h, request, a, rw.ts, args)
    return out


def _buffer_waits(h: History, request: str, a: _Attempt, since: float,
                  args: dict[str, Any]) -> list[Span]:
    """From its reward to the lease of its group, and again from each release of a lease
    to the next; if no lease took it, the last wait ends at its discard (of no length when
    it came with the release: ``nonfinite_step``, ``shutdown``) or the ledger's end."""
    out = []
    for lease in h.by_group.get(group_of(request), []):
        if lease.leased.ts < since or (a.end is not None and lease.leased.ts > a.end[0]):
            continue
        out.append(_span(("buffer", "buffer"), "buffer wait", since,
                         (lease.leased.ts, "leased", ""), "leased",
                         args | {"lease": lease.leased.lease}, request))
        if lease.end is None or lease.end[1] == "committed":
            return out
        since = lease.end[0]
    end = a.end or (h.t_end, UNFINISHED, "")
    out.append(_span(("buffer", "buffer"), "buffer wait", since, end, "leased", args, request))
    return out


def _lease_span(h: History, lease: _Lease) -> Span:
    e, c = lease.leased, lease.committed
    args: dict[str, Any] = {
        "lease": e.lease, "step": policy_step(c.version) if c else None,
        "policy_version": e.version, "new_version": c.version if c else None,
        "groups": e.groups, "samples": c.samples if c else None,
        "train_s": c.train_s if c else None, "wait_s": e.wait_s,
    }
    end = lease.end or (h.t_end, UNFINISHED, "")
    return _span(("trainer", "trainer"), "train step", e.ts, end, "committed", args, e.lease)


# -- --steps A:B ------------------------------------------------------------------------------

_STEPS = re.compile(r"(\d+):(\d+)")


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)``: two step numbers, ``1 <= A <= B``; else a ConfigError
    naming ``--steps``."""
    m = _STEPS.fullmatch(text.strip())
    if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--steps {text!r}: expected A:B, two trainer steps with "
                          "1 <= A <= B (e.g. 3:7)")
    return int(m.group(1)), int(m.group(2))


def select_steps(h: History, all_spans: Sequence[Span], first: int, last: int,
                 ) -> tuple[list[Span], list[Mark]]:
    """The spans and marks of trainer steps ``first``..``last`` (inclusive).

    With W = (commit of the last step before ``first``, commit of ``last``] (from the
    ledger's start when no step precedes ``first``), it keeps every span of a request
    with a sample committed in those steps (all its attempts, fenced ones too) or
    terminally discarded within W; the trainer spans of those steps and of the leases
    skipped, released or unfinished that were leased within W; and the workers' spans and
    the marks that overlap [the first kept span's start, the end of W].
    """
    commits = sorted(((policy_step(x.committed.version), x.committed)
                      for x in h.leases.values() if x.committed is not None),
                     key=lambda sc: sc[0])
    chosen = [c for step, c in commits if first <= step <= last]
    if not chosen:
        have = f"steps {commits[0][0]}..{commits[-1][0]}" if commits else "no step"
        raise ConfigError(f"--steps {first}:{last}: no trainer step in that range "
                          f"(the run committed {have})")
    lo = max((c.ts for step, c in commits if step < first), default=-math.inf)
    hi = chosen[-1].ts
    keys = {r.partition("#")[0] for c in chosen for r in c.samples}
    keys |= {c.lease for c in chosen}
    keys |= {q for q, r in h.requests.items() if r.discarded and lo < r.discarded[0] <= hi}
    keys |= {k for k, x in h.leases.items() if x.committed is None and lo < x.leased.ts <= hi}
    kept = [s for s in all_spans if s.key in keys]
    start = min((s.start for s in kept), default=hi)
    kept += [s for s in all_spans if s.key is None and s.end >= start and s.start <= hi]
    return kept, [m for m in h.marks if start <= m.at <= hi]


# -- the run's trace -------------------------------------------------------------------------


def build_trace(events: Iterable[ev.Event], steps: tuple[int, int] | None = None,
                ) -> dict[str, Any]:
    """The trace of a ledger's events (module docstring), of trainer steps ``steps``
    (inclusive; :func:`select_steps`) or of the whole run."""
    h = fold(events)
    all_spans = spans(h)
    if steps is None:
        return chrome_trace(all_spans, h.marks, h.t0, PROCESSES)
    kept, marks = select_steps(h, all_spans, *steps)
    return chrome_trace(kept, marks, h.t0, PROCESSES)


def write_trace(run_dir: Path, output: Path | None = None, steps: str | None = None) -> Path:
    """Write the trace of ``run_dir`` (finished, crashed or live) to ``output`` (default
    ``RUN_DIR/trace.json``, replaced whole) and return its path. A missing run directory or
    ledger is a RunDirError; a bad ``steps`` or output directory a ConfigError."""
    span_range = parse_steps(steps) if steps is not None else None
    if not run_dir.is_dir():
        raise RunDirError(f"RUN_DIR {run_dir}: no such directory")
    if not (run_dir / LEDGER_FILE).is_file():
        raise RunDirError(f"RUN_DIR {run_dir}: not a run directory (no {LEDGER_FILE})")
    out = output if output is not None else run_dir / TRACE_FILE
    if not out.parent.is_dir():
        raise ConfigError(f"-o {out}: no directory {out.parent}")
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        trace = build_trace((e for _, e in ledger.events()), span_range)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(trace, separators=(",", ":")))
    os.replace(tmp, out)
    return out

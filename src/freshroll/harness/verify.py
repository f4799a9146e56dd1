"""``freshroll verify``: the invariants of DESIGN.md, checked on the ledger alone.

This is an independent re-reading of the event history; it shares no state
machine code with :mod:`freshroll.kernel.buffer`, so a bug there shows up here. The pass over the
events is :mod:`freshroll.harness.history`'s; this module runs it on a run directory's ledger
and checks the directory's files against it.

=============  =====================================================================
invariant      what is checked
=============  =====================================================================
conservation   the ledger ends ``closed`` (unless ``allow_open``: a live run, or a crash
               not resumed yet); every request ends in exactly one terminal state
               (committed once, or discarded once with a terminal reason); none in
               flight once closed; no retry (``fenced`` or ``refreshed`` discard) of a
               request that already ended; a retried attempt is never rewarded or
               committed afterwards (``unexpected``)
duplicates     no sample and no request is committed twice, across incarnations; no
               attempt is rewarded twice
loss           every accepted completion (``generated``) is committed or discarded
unexpected     every event names requests and groups that were admitted; every
               committed sample was started, generated, rewarded, made ready and
               leased in the batch that committed it (a lease not released since);
               only an open lease is released; an over-provisioned group (``target``)
               is made ready with at most ``target`` samples (stop at target)
freshness      every lease is taken at the current policy version; committed lag is
               >= 0 and <= max_staleness in force, on the staleness basis in force
               (``opened.staleness_basis``: the oldest token's or the newest's); every
               ``stale`` discard really exceeded it, and every ``refreshed`` one
               (``tail.refresh``) re-issued a finished attempt outside any lease whose lag
               then exceeded it; every admission keeps the groups
               accepted + running within ``(W + v) x B``, ``W`` the admission window in
               force (``opened.admission_window``, ``max_staleness + 1`` when null:
               :mod:`freshroll.harness.admission`)
fencing        every attempt starts on a registered epoch that is not fenced, and no
               result is applied from a fenced one; a worker's new epoch is registered
               only after its previous epoch was fenced, and is newer
lineage        every committed sample names a policy and a reward version that
               parse; every committed version's digest recomputes from its parent,
               its batch and its settings digest; an attempt that names its episode
               call (``started.call``) joins a call its first member opened on the same
               worker epoch and policy version, with the same seed; a sample whose
               tokens span versions (``generated.token_versions``) names published
               versions, oldest first, from its started version to ``last_version``,
               their tokens adding up to its own
accounting     ``counts.json`` equals the recount; ``summary.json`` equals the summary
               recomputed from the ledger (:mod:`freshroll.figures.summary`, figures of
               :mod:`freshroll.figures.metrics`); ``metrics.jsonl`` holds exactly one row per
               committed step, in order, each equal to the row the ledger implies
               (:func:`freshroll.figures.metrics.row`). A file that is absent is not checked;
               with an open ledger ``counts.json`` and ``summary.json`` (written at
               the end of a run) are not checked, and ``metrics.jsonl`` may lack the
               row of the last commit (a kill between the commit and the row's write)
files          every payload, checkpoint and ``config.yaml`` is bound to the ledger: a
               payload has the digest its ``generated`` event recorded; a checkpoint's
               ``meta.json`` names the committed version of its step and its files have
               the sha256 its ``checkpoint_saved`` recorded; ``config.yaml`` is the newest
               ``run_config`` (:mod:`freshroll.harness.files`)
=============  =====================================================================

The legal orders of worker epochs: :meth:`~freshroll.kernel.buffer.SampleBuffer.register_worker`
fences a live previous epoch before it registers the next, and every ``opened`` of a
resume fences each epoch still live in the ledger before anything else runs; so an
epoch is always fenced before its successor's ``worker_started``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll.errors import LedgerError
from freshroll.harness.eval_files import bound, check_eval_file, recorded, summary_block
from freshroll.harness.files import (
    FileBindings,
    check_checkpoints,
    check_config,
    check_inputs,
    check_payloads,
    check_report,
)
from freshroll.harness.history import INVARIANTS, HistoryChecker, Report
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"


def verify_events(
    events: Iterable[tuple[int, ev.Event]], counts: dict[str, int] | None = None, *,
    allow_open: bool = False, also: Callable[[ev.Event], object] | None = None,
) -> tuple[Report, Counter[str]]:
    """Check ``(seq, event)`` pairs; also returns the recount (for the run-directory checks).

    ``also``: called with every event in the same pass (the figures a reader folds while the
    history is checked, so the ledger is read once).
    """
    checker = HistoryChecker()
    n = 0
    if also is None:
        for seq, event in events:
            checker.feed(seq, event)
            n += 1
    else:
        for seq, event in events:
            checker.feed(seq, event)
            also(event)
            n += 1
    report = checker.finish(allow_open)
    report.stats["events"] = n
    if counts is not None:
        _compare_counts(report, counts, checker.counts)
    return report, checker.counts


def verify_ledger(
    ledger: Ledger, counts: dict[str, int] | None = None, *, allow_open: bool = False
) -> Report:
    """Check a ledger (and ``counts``, the counters a component reported, if given)."""
    return verify_events(ledger.events(), counts, allow_open=allow_open)[0]


def _compare_counts(report: Report, counts: dict[str, int], recount: Counter[str]) -> None:
    for key in sorted(set(counts) | set(recount)):
        if counts.get(key, 0) != recount.get(key, 0):
            report.add("accounting", f"{key}: reported {counts.get(key, 0)}, "
                                     f"ledger says {recount.get(key, 0)}")


@dataclass
class LedgerPass:
    """One read of a run directory's ledger: the invariants checked (``report``, and the
    recount for ``counts.json``) and, in the same pass, the folds that ``summary.json``,
    ``metrics.jsonl`` and the report are computed from (``fold``, a
    :class:`freshroll.figures.summary.SummaryFold`)."""

    report: Report
    recount: Counter[str]
    fold: Any
    files: FileBindings = field(default_factory=FileBindings)


def check_ledger(run_dir: str | Path, *, allow_open: bool = False) -> LedgerPass:
    """Read ``run_dir``'s ledger once: check its invariants and fold its figures."""
    from freshroll.figures.summary import SummaryFold

    files = FileBindings()
    with Ledger(Path(run_dir) / LEDGER_FILE, readonly=True) as ledger:
        fold = SummaryFold(ledger.payload)  # the tool stage: each sample's env turns

        def also(e: ev.Event) -> None:
            fold.feed(e)
            files.feed(e)

        report, recount = verify_events(ledger.events(), allow_open=allow_open, also=also)
        check_payloads(files, ledger, report.add)
    return LedgerPass(report, recount, fold, files)


def check_files(
    run_dir: str | Path, passed: LedgerPass, counts: dict[str, int] | None
) -> Report:
    """Complete ``passed.report`` with the run directory's files checked against the pass:
    ``counts`` (``counts.json`` as read, or None: absent), ``summary.json`` and
    ``metrics.jsonl``. Returns the report."""
    run_dir = Path(run_dir)
    report = passed.report
    if not report.closed:
        skipped = [f for f in ("counts.json", SUMMARY_FILE) if (run_dir / f).is_file()]
        if skipped:
            report.notes.append(f"{', '.join(skipped)} not checked: written when a run "
                                "closes, and the ledger is open")
    else:
        if counts is not None:
            _compare_counts(report, counts, passed.recount)
        _check_summary(report, run_dir / SUMMARY_FILE, passed.fold, passed.files)
        _note_overlap(report, run_dir, passed.fold)
    _check_rows(report, run_dir / METRICS_FILE, passed.fold.rows, passed.files)
    files = passed.files
    check_checkpoints(files, run_dir, report.add, report.notes)
    check_config(files, run_dir, report.closed, report.add, report.notes)
    check_inputs(files, run_dir, report.add, report.notes)
    check_eval_file(files, run_dir, report.closed, report.add, report.notes)
    return report


def check_report_file(run_dir: str | Path, report: Report) -> Report:
    """``report.html`` still has the sha256 it was written with (not part of
    :func:`check_files`: the end of a run writes the report after that check)."""
    check_report(Path(run_dir), report.add, report.notes)
    return report


def verify_run(run_dir: str | Path, *, allow_open: bool = False) -> Report:
    """Check a run directory: its ledger, and the figures it reports where present.

    ``allow_open``: a ledger that never closed is checked as it stands instead of failing.
    One read of the ledger (:func:`check_ledger`), then the files (:func:`check_files`).
    """
    counts = read_counts(Path(run_dir) / "counts.json")
    report = check_files(run_dir, check_ledger(run_dir, allow_open=allow_open), counts)
    return check_report_file(run_dir, report)


def read_counts(path: Path) -> dict[str, int] | None:
    if not path.is_file():
        return None
    try:
        counts = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LedgerError(f"{path}: unreadable counters: {exc}") from exc
    if not isinstance(counts, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in counts.items()
    ):
        raise LedgerError(f"{path}: expected a JSON object of integer counters")
    return counts


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON as ``{"lag.p99": ..., "stages.0.mean": ...}``."""
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out: dict[str, Any] = {}
        for key, item in items:
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _check_summary(report: Report, path: Path, fold: Any, files: FileBindings) -> None:
    """``summary.json`` equals the summary recomputed from the ledger (``fold``: the
    :class:`~freshroll.figures.summary.SummaryFold` of the pass), figure by figure; its
    ``eval`` the block the ledger's ``evaluated`` records give, where the run recorded every
    evaluation (:mod:`freshroll.harness.eval_files`)."""
    if not path.is_file():
        return
    try:
        reported = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.add("accounting", f"{path.name}: unreadable: {exc}")
        return
    if not isinstance(reported, dict):
        report.add("accounting", f"{path.name}: not a JSON object")
        return
    try:
        want = json.loads(json.dumps(fold.summary()))
    except LedgerError as exc:  # a damaged ledger: its own invariants say what is wrong
        report.notes.append(f"{path.name} not checked: the ledger cannot be summarised: {exc}")
        return
    evals_bound, block = summary_block(files)
    if evals_bound:
        if block is not None:
            want["eval"] = block
        elif "eval" in reported:
            report.add("accounting", f"{path.name} eval: reported, the ledger records no "
                                     "evaluation")
    elif "eval" in reported and files.bound_from is not None:
        report.notes.append(f"{path.name} eval not checked: evaluations before step "
                            f"{files.bound_from + 1} were not recorded (a resume of an "
                            "older run)")
    have, flat = _flat(reported), _flat(want)
    for key, value in flat.items():
        if key not in have:
            report.add("accounting", f"{path.name} {key}: missing, ledger says {value!r}")
        elif have[key] != value:
            report.add("accounting",
                       f"{path.name} {key}: reported {have[key]!r}, ledger says {value!r}")
    for key in sorted(set(have) - set(flat)):  # inside a figure the ledger computes
        if key.partition(".")[0] in want:
            report.add("accounting", f"{path.name} {key}: reported {have[key]!r}, "
                                     "the ledger has no such entry")


def _note_overlap(report: Report, run_dir: Path, fold: Any) -> None:
    """An async run whose asynchrony did not pay says so in the notes (the ledger's overlap
    figures, :mod:`freshroll.figures.overlap`, with the host load ``summary.json`` recorded)."""
    from freshroll.figures.overlap import render
    from freshroll.figures.summary import read_host

    try:
        overlap = fold.summary().get("overlap")
    except LedgerError:  # a damaged ledger: its own invariants say what is wrong
        return
    if overlap and overlap.get("verdict") == "did not pay":
        report.notes.append(render(overlap, read_host(run_dir)))


def _check_rows(report: Report, path: Path, rows: Sequence[dict[str, Any]],
                files: FileBindings) -> None:
    """One ``metrics.jsonl`` row per committed step, in order, each the row the ledger implies
    (``rows``: :func:`freshroll.figures.metrics.rows` of the ledger, with the ``eval/*`` columns of
    the ``evaluated`` records; a step evaluated before the run recorded evaluations has its
    eval columns left out of the comparison)."""
    from freshroll.figures.evals import with_eval
    from freshroll.figures.metrics_log import encode_row, read_rows

    if not path.is_file():
        return
    have, bad = read_rows(path)
    want = [json.loads(encode_row(r)) for r in with_eval(rows, recorded(files))]
    for i, h in enumerate(have):
        step = h.get("step")
        if not bound(files, step if isinstance(step, int) else 0):
            have[i] = _no_eval(h)
            if i < len(want):
                want[i] = _no_eval(want[i])
    torn_ok = 0 if report.closed else 1  # a live or killed run may be mid-write
    if bad > torn_ok:
        report.add("accounting", f"{path.name}: {bad} unparsable line(s)")
    for i, (h, w) in enumerate(zip(have, want, strict=False)):
        if h == w:
            continue
        keys = sorted(k for k in set(h) | set(w) if h.get(k, _MISSING) != w.get(k, _MISSING))
        for k in keys[:5]:
            report.add("accounting", f"{path.name} row {i + 1} (step {w['step']}): {k} "
                                     f"reported {h.get(k, _MISSING)!r}, ledger says "
                                     f"{w.get(k, _MISSING)!r}")
    missing = want[len(have):]
    if len(missing) > (0 if report.closed else 1):
        for w in missing:
            report.add("accounting", f"{path.name}: no row for committed step {w['step']}")
    for i, h in enumerate(have[len(want):], start=len(want) + 1):
        report.add("accounting", f"{path.name} row {i} (step {h.get('step')!r}): the ledger "
                                 "holds no such committed step")


def _no_eval(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("eval/")}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


__all__ = [
    "INVARIANTS",
    "METRICS_FILE",
    "SUMMARY_FILE",
    "LedgerPass",
    "Report",
    "check_files",
    "check_ledger",
    "check_report_file",
    "read_counts",
    "verify_events",
    "verify_ledger",
    "verify_run",
]

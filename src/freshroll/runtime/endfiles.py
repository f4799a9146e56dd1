"""The end of a run: ``summary.json``, the ``verify`` report and ``report.html``, from ONE read
of the ledger.

At the end of ``freshroll run``/``simulate`` (and for ``freshroll report``) every product is
computed once and reused::

    ledger --one pass--> verify's checker (invariants, recount)
                      +-> SummaryFold: Tally (+ metrics.jsonl rows), discard bias, spans, verdict
    summary.json   = the fold's summary
    verify report  = the checker's + counts.json, summary.json and metrics.jsonl checked
                     against the same pass (:func:`freshroll.harness.verify.check_files`)
    report.html    = the fold's figures and that verify report (not verified again)

So the end phase is linear in the ledger with one decode of each event (it was read and
folded about six times). ``freshroll verify RUN_DIR`` still checks everything itself
(:func:`~freshroll.harness.verify.verify_run`: the same pass, on its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshroll import crashpoints
from freshroll.errors import RunDirError
from freshroll.figures.metrics_log import write_atomic
from freshroll.figures.summary import SUMMARY_FILE, read_host, summarize
from freshroll.harness.verify import Report, check_files, check_ledger, read_counts
from freshroll.ledger import LEDGER_FILE
from freshroll.metrics import jsonable
from freshroll.runtime.evaluation import eval_summary


def write_summary(run_dir: Path, summary: dict[str, Any] | None = None,
                  host: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``summary.json``: ``summary`` (already computed from this run's ledger, e.g. by a
    :class:`SummaryFold` of the end-of-run pass), or the ledger's summary read now.

    ``host``: the host's load at the run's end (:func:`freshroll.figures.overlap.host_now`),
    kept as ``host`` (not from the ledger: ``verify`` does not recompute it); None keeps the
    ``host`` block of an existing ``summary.json`` (a summary rebuilt later)."""
    if summary is None:
        summary = summarize(run_dir)
    if host is None:
        host = read_host(run_dir)
    if host is not None:
        summary = {**summary, "host": jsonable(host)}
    evaluation = eval_summary(run_dir)  # from eval.jsonl (not the ledger), when there is one
    if evaluation is not None:
        summary = {**summary, "eval": jsonable(evaluation)}
    write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary



@dataclass
class Finished:
    summary: dict[str, Any]
    #: verify's report of the run directory, or the error that kept it from running (an
    #: unreadable ``counts.json``); the report page shows either
    verified: Report | Exception


def finish_run_dir(run_dir: Path, *, baseline: Path | None = None, report: bool = True,
                   host: dict[str, Any] | None = None) -> Finished:
    """Write ``summary.json`` and ``report.html`` of ``run_dir`` and verify it, reading its
    ledger once. An unreadable or damaged ledger raises (:class:`~freshroll.errors.LedgerError`)
    before anything is written, as :func:`write_summary` does.
    ``report``: False writes no ``report.html``. ``host``: the host's load now (the end of a
    run: :func:`freshroll.figures.overlap.host_now`); None keeps the summary's recorded one.
    A ``baseline`` that is not a run directory is refused first (:func:`check_baseline`)."""
    if baseline is not None:
        check_baseline(baseline)
    passed = check_ledger(run_dir)
    summary = write_summary(run_dir, passed.fold.summary(), host)
    crashpoints.reach("summary")
    verified: Report | Exception
    try:
        verified = check_files(run_dir, passed, read_counts(run_dir / "counts.json"))
    except Exception as exc:  # shown on the page; the caller decides whether it is fatal
        verified = exc
    if report:
        from freshroll.report.html import write_report

        write_report(run_dir, baseline=baseline, fold=passed.fold, verified=verified)
    return Finished(summary, verified)


def check_baseline(path: Path) -> None:
    """Refuse (:class:`~freshroll.errors.RunDirError`) a ``--baseline`` that is not a run
    directory: missing, a file, or a directory without a ledger."""
    if not path.exists():
        raise RunDirError(f"--baseline {path}: does not exist (name a run directory)")
    if not path.is_dir():
        raise RunDirError(f"--baseline {path}: is a file; the baseline must be a run "
                          "directory (e.g. RUN_DIR/baseline)")
    if not (path / LEDGER_FILE).is_file():
        raise RunDirError(f"--baseline {path}: not a run directory (no {LEDGER_FILE})")

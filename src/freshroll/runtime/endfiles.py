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
from freshroll.figures import reward_time
from freshroll.figures.evals import eval_summary
from freshroll.figures.headline import headline
from freshroll.figures.metrics import jsonable
from freshroll.figures.metrics_log import write_atomic
from freshroll.figures.summary import SUMMARY_FILE, read_host, summarize
from freshroll.harness.verify import Report, check_files, check_ledger, read_counts
from freshroll.ledger.store import LEDGER_FILE


def write_summary(run_dir: Path, summary: dict[str, Any] | None = None,
                  host: dict[str, Any] | None = None, *,
                  baseline: Path | None = None) -> dict[str, Any]:
    """Write ``summary.json``: ``summary`` (already computed from this run's ledger, e.g. by a
    :class:`SummaryFold` of the end-of-run pass), or the ledger's summary read now.

    ``host``: the host's load at the run's end (:func:`freshroll.figures.overlap.host_now`),
    kept as ``host`` (not from the ledger: ``verify`` does not recompute it); None keeps the
    ``host`` block of an existing ``summary.json`` (a summary rebuilt later). ``baseline``: a
    run to compare time to reward with (:mod:`freshroll.figures.reward_time`, the
    ``time_to_reward`` block); None keeps the block an earlier comparison wrote."""
    if summary is None:
        summary = summarize(run_dir)
    if host is None:
        host = read_host(run_dir)
    if host is not None:
        summary = {**summary, "host": jsonable(host)}
    for key in (FIXED_COSTS, reward_time.BLOCK):  # a summary rebuilt later keeps them
        kept = read_block(run_dir, key)
        if kept is not None and key not in summary:
            summary = {**summary, key: kept}
    if baseline is not None:
        summary = {**summary, reward_time.BLOCK: jsonable(reward_time.compare_dirs(run_dir,
                                                                                 baseline))}
    evaluation = eval_summary(run_dir)  # from eval.jsonl (not the ledger), when there is one
    if evaluation is not None:
        summary = {**summary, "eval": jsonable(evaluation)}
    asynchrony = headline(summary, _baseline_rate(run_dir, baseline, summary))
    if asynchrony is not None:  # the one answer to "did asynchrony pay", its source named
        summary = {**summary, ASYNCHRONY: jsonable(asynchrony)}
    write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary



#: ``summary.json``'s answer to "did asynchrony pay" (:mod:`freshroll.figures.headline`)
ASYNCHRONY = "asynchrony"


def _baseline_rate(run_dir: Path, baseline: Path | None, summary: dict[str, Any]
                   ) -> float | None:
    """The accepted rollouts/s of the run's synchronous baseline: ``baseline``, or the one
    its ``time_to_reward`` block names (a summary rebuilt later); None without one."""
    if baseline is None:
        kept = summary.get(reward_time.BLOCK)
        name = kept.get("baseline") if isinstance(kept, dict) else None
        if not isinstance(name, str):
            return None
        baseline = run_dir / name if not Path(name).is_absolute() else Path(name)
    try:
        rate = json.loads((baseline / SUMMARY_FILE).read_text()).get("accepted_rollouts_per_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(rate) if isinstance(rate, int | float) else None


#: ``summary.json``'s block of the seconds a run spent outside its measured wall (written by
#: :func:`record_fixed_costs` at the end of the run; not from the ledger: verify ignores it)
FIXED_COSTS = "fixed_costs"


def read_block(run_dir: Path, key: str) -> dict[str, Any] | None:
    """The ``key`` block of ``run_dir``'s ``summary.json`` (None: no file, or none in it)."""
    try:
        block = json.loads((run_dir / SUMMARY_FILE).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return block if isinstance(block, dict) else None


def record_fixed_costs(run_dir: Path, summary: dict[str, Any], span: tuple[float, float],
                       called_at: float, now: float,
                       parts: dict[str, float] | None = None) -> dict[str, float]:
    """Add ``fixed_costs`` to ``summary`` and rewrite ``summary.json``: ``start_s``, the
    seconds from the ``run`` call to the measured wall's start (config, model load, thread
    probe, workers), and ``end_s``, from the wall's end (the last commit) to ``now`` (the
    pipeline's close and the end files: summary, verify, report). ``span``: the wall's
    (start, end) as ledger timestamps; all times on the real clock. ``parts``: named
    seconds inside those two (a Ray run's ``ray_start_s`` and ``ray_stop_s``: Ray's own)."""
    fixed = {"start_s": max(0.0, span[0] - called_at), "end_s": max(0.0, now - span[1]),
             **(parts or {})}
    summary[FIXED_COSTS] = fixed
    write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return fixed


def render_fixed_costs(summary: dict[str, Any]) -> str:
    """The end line's account of the seconds outside the measured wall; empty if none."""
    fixed = summary.get(FIXED_COSTS)
    if not isinstance(fixed, dict):
        return ""
    ray_start, ray_stop = fixed.get("ray_start_s"), fixed.get("ray_stop_s")
    of_start = f"; Ray's own start {ray_start:.1f} s" if ray_start is not None else ""
    of_end = f"; Ray's own stop {ray_stop:.1f} s" if ray_stop is not None else ""
    return (f"outside the measured wall: start-up {fixed['start_s']:.1f} s (config, model, "
            f"thread probe, workers{of_start}), end {fixed['end_s']:.1f} s (close, summary, "
            f"verify, report{of_end})")


@dataclass
class Finished:
    summary: dict[str, Any]
    #: verify's report of the run directory, or the error that kept it from running (an
    #: unreadable ``counts.json``); the report page shows either
    verified: Report | Exception
    #: the current incarnation's measured wall as ledger timestamps (None: no commit)
    span: tuple[float, float] | None = None


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
    summary = write_summary(run_dir, passed.fold.summary(), host, baseline=baseline)
    crashpoints.reach("summary")
    verified: Report | Exception
    try:
        verified = check_files(run_dir, passed, read_counts(run_dir / "counts.json"))
    except Exception as exc:  # shown on the page; the caller decides whether it is fatal
        verified = exc
    if report:
        from freshroll.report.html import write_report

        write_report(run_dir, baseline=baseline, fold=passed.fold, verified=verified)
    return Finished(summary, verified, passed.fold.tally.current_span())


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

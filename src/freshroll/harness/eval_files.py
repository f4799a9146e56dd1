"""verify's binding of the evaluation to the ledger: ``eval.jsonl``, the ``eval/*`` columns of
``metrics.jsonl`` and ``summary.json``'s ``eval``.

The evaluation's completions are no training samples, so before the ``evaluated`` event the
ledger held nothing of it and an edited, cut or deleted ``eval.jsonl`` (or an edited eval
column or summary block) changed what the run reports with no check failing. Now each due
evaluation's lines are recorded with its step's commit, and:

==================  ========================================================================
file                bound by
==================  ========================================================================
eval.jsonl          its latest line of each (step, mode) equals the line the step's
                    ``evaluated`` recorded; every recorded line is there; a line of a step
                    evaluated after the binding began that the ledger does not record fails
                    (with an open ledger, one of a step past the last commit is a note: a
                    kill between the evaluation and its commit; the next start drops it)
metrics.jsonl       the ``eval/*`` columns of a row equal those the recorded lines give
                    (:func:`freshroll.figures.evals.with_eval`)
summary.json        ``eval`` equals :func:`freshroll.figures.evals.summary_of` the recorded
                    lines
==================  ========================================================================

The binding begins at the first ``run_config`` that records ``input_files`` (this version's
mark): a run written before it is checked as before (its eval columns and block are not
compared) and a note says so; a run resumed from such a one binds the steps after the resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from freshroll.figures.evals import EVAL_FILE, Line, by_step, latest, summary_of
from freshroll.figures.metrics import jsonable
from freshroll.figures.metrics_log import read_rows
from freshroll.harness.files import INVARIANT, FileBindings

UNBOUND_NOTE = ("eval.jsonl, the eval/* columns of metrics.jsonl and summary.json's eval not "
                "checked: the run records no evaluations (written before verify bound them)")


def recorded(bindings: FileBindings) -> dict[int, list[Line]]:
    """The recorded lines by step, as JSON reads them back (the file's form)."""
    lines = [json.loads(json.dumps(x)) for rs in bindings.evaluated.values() for x in rs]
    return by_step(lines)


def bound(bindings: FileBindings, step: int) -> bool:
    """Is the evaluation of ``step`` bound to the ledger (recorded when it ran)?"""
    return bindings.bound_from is not None and step > bindings.bound_from


def check_eval_file(bindings: FileBindings, run_dir: Path, closed: bool, add: Any,
                    notes: list[str]) -> None:
    """``eval.jsonl`` against the ``evaluated`` records (module docstring)."""
    path = run_dir / EVAL_FILE
    if bindings.bound_from is None:
        if path.is_file():
            notes.append(UNBOUND_NOTE)
        return
    want = {(x["step"], x["mode"]): x for rs in recorded(bindings).values() for x in rs}
    if not path.is_file():
        if want:
            steps = sorted({s for s, _ in want})
            add(INVARIANT, f"{EVAL_FILE}: missing (the ledger records the evaluations of "
                           f"steps {', '.join(map(str, steps))})")
        return
    rows, bad = read_rows(path)
    if bad > (0 if closed else 1):
        add(INVARIANT, f"{EVAL_FILE}: {bad} unparsable line(s)")
    have = {(x["step"], x["mode"]): x for x in latest(rows)}
    last = max(bindings.versions, default=0)
    for key, line in sorted(want.items()):
        got = have.get(key)
        if got is None:
            add(INVARIANT, f"{EVAL_FILE}: no line for step {key[0]} ({key[1]}), the ledger "
                           "recorded its evaluation (cut or deleted)")
        elif got != line:
            diff = sorted(k for k in set(got) | set(line) if got.get(k) != line.get(k))
            add(INVARIANT, f"{EVAL_FILE} step {key[0]} ({key[1]}): "
                           + "; ".join(f"{k} {got.get(k)!r}, the ledger recorded "
                                       f"{line.get(k)!r}" for k in diff[:3]))
    for key in sorted(set(have) - set(want)):
        step = key[0]
        if not bound(bindings, step):
            notes.append(f"{EVAL_FILE} step {step} ({key[1]}) not checked: evaluated before "
                         "the run recorded evaluations")
        elif not closed and step > last:
            notes.append(f"{EVAL_FILE} step {step}: evaluated, never committed (a kill "
                         "before the commit); the next start drops the line")
        else:
            add(INVARIANT, f"{EVAL_FILE} step {step} ({key[1]}): not an evaluation the "
                           "ledger recorded")


def summary_block(bindings: FileBindings) -> tuple[bool, dict[str, Any] | None]:
    """Whether ``summary.json``'s ``eval`` is bound (every evaluation of the run recorded),
    and the block the records give (None: no evaluation)."""
    if bindings.bound_from != 0:
        return False, None
    lines = [x for rs in recorded(bindings).values() for x in rs]
    block = summary_of(lines)
    return True, None if block is None else json.loads(json.dumps(jsonable(block)))


__all__ = ["UNBOUND_NOTE", "bound", "check_eval_file", "recorded", "summary_block"]

"""The evaluation's figures, from its lines (``eval.jsonl``, or the ``evaluated`` events that
record them in the ledger): the ``eval/*`` columns of a ``metrics.jsonl`` row and
``summary.json``'s ``eval`` block.

Here, below the runtime that writes ``eval.jsonl`` (:mod:`freshroll.runtime.evaluation`) and
beside the other run-directory figures, so that ``verify`` (:mod:`freshroll.harness`) can
recompute both from the ledger's record with the same functions the run wrote them with: one
figure, one function. Pure: lines in, columns and blocks out; no model, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from freshroll.figures.metrics_log import read_rows

EVAL_FILE = "eval.jsonl"

Line = dict[str, Any]  # one eval.jsonl line: one step, one mode


def metrics_columns(rows: Sequence[Line]) -> dict[str, Any]:
    """``eval/reward`` (greedy's when there is one) and, with both modes, each mode's."""
    by_mode = {r["mode"]: r.get("reward") for r in rows}
    if not by_mode:
        return {}
    main = "greedy" if "greedy" in by_mode else next(iter(by_mode))
    out = {"eval/reward": by_mode[main]}
    if len(by_mode) > 1:
        out.update({f"eval/reward_{m}": v for m, v in sorted(by_mode.items())})
    return out


def with_eval(rows: Sequence[dict[str, Any]], evals: dict[int, list[Line]]
              ) -> list[dict[str, Any]]:
    """``metrics.jsonl`` rows with the eval columns of their steps."""
    return [{**row, **metrics_columns(evals.get(int(row["step"]), []))} for row in rows]


def latest(lines: Iterable[Line]) -> list[Line]:
    """One line per (step, mode), the later one winning (a step evaluated again after a
    resume), sorted; lines without an int ``step`` and a str ``mode`` are skipped."""
    last: dict[tuple[int, str], Line] = {}
    for row in lines:
        if isinstance(row.get("step"), int) and isinstance(row.get("mode"), str):
            last[(row["step"], row["mode"])] = row
    return [last[k] for k in sorted(last)]


def by_step(lines: Iterable[Line]) -> dict[int, list[Line]]:
    """:func:`latest`'s lines grouped by step."""
    out: dict[int, list[Line]] = {}
    for row in latest(lines):
        out.setdefault(int(row["step"]), []).append(row)
    return out


def read_eval(run_dir: Path) -> list[Line]:
    """``eval.jsonl``'s lines (a torn last line skipped), :func:`latest` of them."""
    rows, _ = read_rows(run_dir / EVAL_FILE)
    return latest(rows)


def evals_by_step(run_dir: Path) -> dict[int, list[Line]]:
    """:func:`read_eval`'s lines by step."""
    return by_step(read_eval(run_dir))


def eval_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json``'s ``eval`` of ``eval.jsonl`` (:func:`summary_of`); None without it."""
    return summary_of(read_eval(run_dir))


def summary_of(lines: Sequence[Line]) -> dict[str, Any] | None:
    """``summary.json``'s ``eval``: the first, last and best ``eval/reward`` and every step's
    eval columns with its skipped count; None without any line."""
    rows = latest(lines)
    if not rows:
        return None
    steps = by_step(rows)
    per_step = [{"step": s, **metrics_columns(rs), "n_scored": rs[0].get("n_scored"),
                 "n_skipped": rs[0].get("n_skipped"), "wall_s": rs[0].get("wall_s")}
                for s, rs in sorted(steps.items())]
    scored = [p for p in per_step if isinstance(p.get("eval/reward"), int | float)]
    best = max(scored, key=lambda p: p["eval/reward"]) if scored else None
    return {
        "modes": sorted({r["mode"] for r in rows}),
        "first": scored[0]["eval/reward"] if scored else None,
        "last": scored[-1]["eval/reward"] if scored else None,
        "best": best["eval/reward"] if best else None,
        "best_step": best["step"] if best else None,
        "skipped": sum(int(p.get("n_skipped") or 0) for p in per_step),
        "steps": per_step,
    }


def render_eval(block: Any) -> str:
    """``summary.json``'s ``eval`` as the end line: what was scored and how (the number of
    prompts of the last evaluation and its decoding, so 32 greedy prompts are never read as
    the whole held-out set), the first, last and best reward; empty without a score."""
    if not isinstance(block, dict) or block.get("last") is None:
        return ""
    steps = block.get("steps") or [{}]
    last = steps[-1]
    n = int(last.get("n_scored") or 0) + int(last.get("n_skipped") or 0)
    how = "/".join(block.get("modes") or []) or "?"
    skipped = f", {block['skipped']} prompt(s) skipped over the run (eval.budget_s)" \
        if block.get("skipped") else ""
    return (f"eval: reward {block['first']:.3f} -> {block['last']:.3f} (best "
            f"{block['best']:.3f} at step {block['best_step']}) on the first {n} prompts of "
            f"eval.file (eval.n_prompts), {how}, at {len(steps)} step(s){skipped}")


__all__ = [
    "EVAL_FILE", "Line", "by_step", "eval_summary", "evals_by_step", "latest", "metrics_columns",
    "read_eval", "render_eval", "summary_of", "with_eval",
]

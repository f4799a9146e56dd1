"""``summary.json``: the run's headline figures, recomputed from the ledger alone.

Reads only ``ledger.sqlite`` (the run directory is the report contract), so a
summary can be rebuilt on a saved run, and ``freshroll verify`` recomputes it to
check the file. The figures are those of :func:`freshroll.metrics.summary_figures`
(defined once, in docs/metrics.md), plus the discard-bias check (committed vs
discarded completions' reward and length, by reason) and the per-stage time
decomposition of :mod:`freshroll.timing`. Written as strict JSON (a non-finite
value as ``null``), atomically.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from freshroll.events import Committed, Discarded, Generated, Rewarded
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.metrics import jsonable, summary_figures, tally
from freshroll.runtime.metrics_log import read_rows, write_atomic
from freshroll.runtime.verdict import verdict
from freshroll.timing import collect_spans, decompose

SUMMARY_FILE = "summary.json"
#: the tolerant ``metrics.jsonl`` reader (kept here for its callers)
read_metrics = read_rows


def _stats(rewards: list[float], tokens: list[int]) -> dict[str, Any]:
    n = len(tokens)
    return {
        "n": n,
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "tokens_mean": sum(tokens) / n if n else None,
    }


def discard_bias(events: Iterable[Any]) -> dict[str, Any]:
    """Do discards skew what the trainer sees? Committed vs discarded completions, by reason.

    Compares the mean reward (where one was computed) and mean completion length of the
    committed samples with those of each discard reason's generated samples. A stale discard
    that prefers long or low-reward completions biases training even at a small rate.
    """
    reward: dict[str, float] = {}
    tokens: dict[str, int] = {}
    groups: dict[str, list[str]] = {"committed": []}
    for e in events:
        if isinstance(e, Generated):
            tokens[e.sample] = e.tokens
        elif isinstance(e, Rewarded):
            reward[e.sample] = e.reward
        elif isinstance(e, Committed):
            groups["committed"].extend(e.samples)
        elif isinstance(e, Discarded) and e.sample in tokens and e.reason != "fenced":
            groups.setdefault(e.reason, []).append(e.sample)
    return {
        name: _stats([reward[s] for s in ss if s in reward], [tokens[s] for s in ss])
        for name, ss in groups.items()
    }


def summarize_events(events: Sequence[Any]) -> dict[str, Any]:
    """The summary of an event history (JSON-ready: non-finite floats are ``None``)."""
    summary: dict[str, Any] = jsonable({
        **summary_figures(tally(events)),
        "discard_bias": discard_bias(events),
        "stages": [row.__dict__ for row in decompose(collect_spans(events))],
        "verdict": verdict(events),
    })
    return summary


def summarize(run_dir: Path) -> dict[str, Any]:
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        return summarize_events([e for _, e in ledger.events()])


def write_summary(run_dir: Path) -> dict[str, Any]:
    summary = summarize(run_dir)
    write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary

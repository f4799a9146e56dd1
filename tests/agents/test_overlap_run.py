"""A tool-using run on the embedded model with a slow tool (issue 49, item 5): the worker
starts a new call while an earlier one still has episodes waiting on their tools (per-sample
refill on the lock-step HF engine), and ``verify`` passes: nothing lost, nothing doubled."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from freshroll.config import load_config
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

pytestmark = pytest.mark.slow

SLOW_TOOL = ["run.progress=false", "task.name=calc", "task.n_prompts=64", "task.params={}",
             "rollout.group_size=4", "rollout.batch_groups=2", "rollout.max_new_tokens=6",
             "run.steps=3", "run.runtime=inline", "run.torch_threads=1",
             "rewards.0.fn=numeric", "rollout.workflow=calc_tool",
             "tools.latency={dist: lognormal, median_s: 0.05, p99_s: 1.0}"]


def overlapping_starts(events: list[ev.Event]) -> int:
    """How many calls started on a worker while another call of that worker had members
    not yet ended (generated or discarded)."""
    live: dict[str, dict[str, set[str]]] = {}  # worker -> call -> live samples
    where: dict[str, tuple[str, str]] = {}
    seen: set[tuple[str, str]] = set()
    overlaps = 0
    for e in events:
        if isinstance(e, ev.Started) and e.call is not None:
            calls = live.setdefault(e.worker, {})
            if (e.worker, e.call) not in seen:
                seen.add((e.worker, e.call))
                overlaps += any(c != e.call and s for c, s in calls.items())
            calls.setdefault(e.call, set()).add(e.sample)
            where[e.sample] = (e.worker, e.call)
        elif isinstance(e, ev.Generated | ev.Discarded) and e.sample in where:
            worker, call = where.pop(e.sample)
            live[worker][call].discard(e.sample)
    return overlaps


def test_a_slow_tool_run_refills_per_sample_and_verifies(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    result = run(load_config(None, SLOW_TOOL), out, stream=io.StringIO(), report=False)
    assert result.ok
    report = verify_run(out)
    assert report.ok, report.render()
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    assert overlapping_starts(events) >= 1
    assert sum(isinstance(e, ev.Committed) for e in events) == 3

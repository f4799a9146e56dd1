"""Multi-turn episodes on the process placement (issue 49): the tokenizer is loaded beside the
worker's proxy (a tool's output encoded once, in the run's process), every later turn goes to
the child as token ids (token-in across the process boundary), and the run verifies."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from freshroll.config import load_config
from freshroll.engines import payload as pl
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger


@pytest.mark.slow
@pytest.mark.parametrize("workflow", ["calc_tool", "guess_game"])
def test_a_multi_turn_run_on_the_process_placement_verifies(tmp_path: Path,
                                                            workflow: str) -> None:
    from freshroll.runtime.run import run

    task = "task.name=calc" if workflow == "calc_tool" else "task.name=guess"
    out = tmp_path / "run"
    cfg = load_config(None, [
        "run.progress=false", task, "task.n_prompts=64", "task.params={}",
        "rollout.group_size=4", "rollout.batch_groups=2", "rollout.max_new_tokens=6",
        "run.steps=2", "run.runtime=process", "run.torch_threads=1", "rewards.0.fn=numeric",
        f"rollout.workflow={workflow}"])
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok
    report = verify_run(out)
    assert report.ok, report.render()
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
        payloads = ledger.payloads()
    generated = [e.sample for e in events if isinstance(e, ev.Generated)]
    decoded = [pl.decode(payloads[s]) for s in generated if s in payloads]
    multi = [p for p in decoded if len(p.turns) >= 3]
    assert multi  # model, env, model: the later turn was generated in the child
    for p in multi:
        assert sum(t[1] for t in p.turns) == len(p.token_ids)
        assert [t[0] for t in p.turns][:2] == ["model", "env"]

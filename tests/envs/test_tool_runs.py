"""Tool-using runs on the embedded model (issue 49): every turn in the ledger, the loss mask
in each payload, a hanging tool's samples discarded ``tool_error`` by its timeout, and
``verify`` passing."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.engines import payload as pl
from freshroll.engines.episodes import WORKFLOWS, WorkflowSetup
from freshroll.envs.calc import Calculator, ToolResult
from freshroll.envs.tool_use import ToolUse
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

pytestmark = pytest.mark.slow

SMALL = ["run.progress=false", "task.name=calc", "task.n_prompts=64", "task.params={}",
         "rollout.group_size=4", "rollout.batch_groups=2", "rollout.max_new_tokens=6",
         "run.steps=3", "run.runtime=inline", "run.torch_threads=1", "rewards.0.fn=numeric"]


class HangsSometimes:
    """The calculator, except that every ``every``-th call never answers."""

    name = "calc"

    def __init__(self, every: int) -> None:
        self.every, self.calls, self.calc = every, 0, Calculator()

    async def __call__(self, arg: str) -> ToolResult:
        self.calls += 1
        if self.calls % self.every == 0:
            await asyncio.sleep(3600)
        return await self.calc(arg)


def _ledger(out: Path) -> tuple[list[Any], dict[str, bytes]]:
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        return [e for _, e in ledger.events()], ledger.payloads()


def test_a_calc_tool_run_records_every_turn_and_verifies(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    cfg = load_config(None, [*SMALL, "rollout.workflow=calc_tool"])
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok and verify_run(out).ok
    events, payloads = _ledger(out)
    committed = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    assert len(committed) == 3 * 8
    for sid in committed:
        p = pl.decode(payloads[sid])
        kinds = [t[0] for t in p.turns]
        assert kinds[:3] == ["model", "env", "model"], kinds
        assert sum(t[1] for t in p.turns) == len(p.token_ids) == sum(n for _, n in p.mask)
        assert all(p.logprobs[i] == 0.0 for i in _env_positions(p))
        assert all(t[3].startswith("calc:") and t[4] in ("ok", "error")
                   for t in p.turns if t[0] == "env")
    # freshroll lineage shows an episode's turns, from its stored payload
    from freshroll.report.provenance import lineage, render

    sid = sorted(committed)[0]
    info = lineage(out, sid)
    turns = info["attempts"][-1]["turns"]
    assert [t["kind"] for t in turns][:3] == ["model", "env", "model"]
    shown = render(info)
    assert "turn 2: env," in shown and "calc:" in shown


def _env_positions(p: pl.RolloutPayload) -> list[int]:
    out, at = [], 0
    for bit, n in p.mask:
        if bit == 0:
            out.extend(range(at, at + n))
        at += n
    return out


def test_a_hanging_tool_ends_in_its_timeout_with_the_sample_discarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from freshroll.runtime.run import run

    tool = HangsSometimes(every=11)
    monkeypatch.setitem(WORKFLOWS, "hanging_calc",
                        lambda setup: ToolUse(setup, tool=tool))
    out = tmp_path / "run"
    cfg = load_config(None, [*SMALL, "rollout.workflow=hanging_calc", "tools.timeout_s=0.2"])
    assert isinstance(ToolUse(WorkflowSetup()), ToolUse)
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok, result
    report = verify_run(out)
    assert report.ok, report.render()
    events, _ = _ledger(out)
    tool_errors = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "tool_error"]
    assert tool_errors and tool.calls >= 11
    assert all("did not answer within tools.timeout_s=0.2" in e.detail for e in tool_errors)
    committed = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    assert not committed & {e.sample for e in tool_errors}  # never trained, never scored
    rewarded = {e.sample for e in events if isinstance(e, ev.Rewarded)}
    assert not rewarded & {e.sample for e in tool_errors}


def test_a_tool_run_resumes_and_replays_its_multi_turn_batches(tmp_path: Path) -> None:
    """A tool run resumed keeps every invariant, and ``freshroll replay`` trains every
    committed multi-turn batch again from its payloads (loss masks included) to the committed
    weights digests: the mask is part of what a step recorded."""
    import torch

    from freshroll.runtime.replay_run import replay_run
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    base = [*SMALL, "rollout.workflow=calc_tool", "trainer.checkpoint_every=100"]
    first = run(load_config(None, [*base, "run.steps=2"]), out, stream=io.StringIO(),
                report=False)
    assert first.ok
    again = run(load_config(None, [*base, "run.steps=4"]), out, resume=True,
                stream=io.StringIO(), report=False)
    assert again.ok
    report = verify_run(out)
    assert report.ok, report.render()
    events, _ = _ledger(out)
    assert sum(isinstance(e, ev.Committed) for e in events) == 4
    threads = torch.get_num_threads()
    try:
        replayed = replay_run(out)
    finally:
        torch.set_num_threads(threads)
    assert replayed.ok and replayed.steps == 4, replayed.render()


def test_turns_under_in_flight_updates_carry_each_tokens_version(tmp_path: Path) -> None:
    """rollout.on_update: continue: weights may change between (and within) an episode's
    turns; each token's version goes to the ledger (token_versions, env tokens taking the
    version before them) and verify recomputes them."""
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    cfg = load_config(None, [*SMALL, "rollout.workflow=calc_tool", "rollout.on_update=continue",
                             "run.steps=4", "tools.latency_s=0.02"])
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok
    report = verify_run(out)
    assert report.ok, report.render()
    events, payloads = _ledger(out)
    for e in events:
        if isinstance(e, ev.Generated) and e.token_versions:
            p = pl.decode(payloads[e.sample])
            assert sum(n for _, n in e.token_versions) == len(p.token_ids)

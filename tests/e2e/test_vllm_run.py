"""End-to-end runs on vLLM engines (configs/vllm.yaml): the CLI run verifies; a run whose
engine core is SIGKILLed mid-run fences the worker, re-issues its attempts, restarts the
engine (a new epoch) and still verifies. Each vLLM start takes ~30 s."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, freshroll, summary

from freshroll import events as ev
from freshroll.config import load_config
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.runtime.hooks import Hooks

pytestmark = pytest.mark.slow


def test_cli_run_on_vllm_verifies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = freshroll("run", "configs/vllm.yaml", "run.steps=4", "--out", str(out), timeout=600)
    assert "vLLM engine w0" in proc.stderr
    s = summary(out)
    assert s["engine"] == "vllm" and s["steps"] == 4
    assert s["weight_loads"] >= 3 and s["accepted_rollouts"] >= 4 * 128
    freshroll("verify", str(out))


class KillOnce(Hooks):
    """Kills worker w0's engine core once, after step 2, while requests are in flight."""

    def __init__(self) -> None:
        self.factory: Any = None
        self.killed_inflight = -1

    def wrap(self, parts: Any, buf: Any) -> Any:
        self.factory = parts.engine_factory
        return parts

    @property
    def hooks(self) -> Hooks:
        return self

    async def run(self, pipe: Any) -> None:
        while pipe.buf.counts["steps"] < 2:
            await asyncio.sleep(0.02)
        engine = self.factory.engines["w0"]
        while engine.inflight == 0:
            await asyncio.sleep(0.005)
        self.killed_inflight = engine.inflight
        await engine.kill()


def test_a_killed_engine_is_fenced_reissued_restarted_and_the_run_verifies(
        tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    cfg = load_config(REPO / "configs" / "vllm.yaml", ["run.steps=6", "run.progress=false"])
    out = tmp_path / "run"
    killer = KillOnce()
    result = run(cfg, out, chaos=killer, report=False, stream=io.StringIO())
    assert result.ok and result.summary["steps"] == 6
    assert killer.killed_inflight > 0
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    fenced = [e for e in events if isinstance(e, ev.WorkerFenced)]
    assert [(f.worker, f.epoch, f.reason) for f in fenced][:1] == [("w0", 0, "lost")]
    assert any(isinstance(e, ev.WorkerReady) and e.worker == "w0" and e.epoch == 1
               for e in events)
    reissued = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "fenced"]
    assert reissued
    freshroll("verify", str(out))

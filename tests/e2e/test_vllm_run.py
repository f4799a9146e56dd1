"""An end-to-end run of configs/vllm.yaml (what ``freshroll run configs/vllm.yaml`` runs) whose
engine core is SIGKILLed mid-run: the worker is fenced ``lost``, its attempts re-issued, the
engine restarted (a new epoch), and the run finishes and verifies (``freshroll verify``).
One run, two vLLM starts (~30 s each): the CI budget of this part."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, freshroll, summary

from freshroll.config import load_config
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.pipeline.hooks import HookContext, Hooks

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


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

    async def run(self, ctx: HookContext) -> None:
        while ctx.buffer.counts["steps"] < 2:
            await asyncio.sleep(0.02)
        engine = self.factory.engines["w0"]
        while engine.inflight == 0:
            await asyncio.sleep(0.005)
        self.killed_inflight = engine.inflight
        await engine.kill()


def test_a_vllm_run_survives_a_killed_engine_and_verifies(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from freshroll.runtime.run import run

    cfg = load_config(REPO / "configs" / "vllm.yaml", ["run.steps=6", "run.progress=false"])
    out = tmp_path / "run"
    killer = KillOnce()
    result = run(cfg, out, chaos=killer, stream=io.StringIO())
    assert result.ok and killer.killed_inflight > 0
    s = summary(out)
    assert s["engine"] == "vllm" and s["steps"] == 6
    assert s["weight_loads"] >= 5 and s["accepted_rollouts"] >= 6 * 128
    assert (out / "report.html").is_file()
    err = capfd.readouterr().err
    assert "starting vLLM engine w0" in err and "restarting vLLM engine w0" in err
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    fenced = [e for e in events if isinstance(e, ev.WorkerFenced)]
    assert [(f.worker, f.epoch, f.reason) for f in fenced][:1] == [("w0", 0, "lost")]
    assert any(isinstance(e, ev.WorkerReady) and e.worker == "w0" and e.epoch == 1
               for e in events)
    reissued = [e for e in events if isinstance(e, ev.Discarded) and e.reason == "fenced"]
    assert reissued
    freshroll("verify", str(out))

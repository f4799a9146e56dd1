"""A harness client that disconnects from the gateway mid-call (issue 49's tests): its episode
ends ``tool_error``, the gateway keeps serving, and the call that lands after its episode ended
is dropped, never left behind in the gateway's record (where it used to stay for good); and the
built-in ``calc_harness`` workflow plays the calc task through the gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from freshroll.chaos.envfaults import disconnect_mid_call
from freshroll.config.ops import LimitsSection
from freshroll.config.rollout import RolloutSection, ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.engines.tiny import build_tiny
from freshroll.envs.calc_harness import CalcHarness
from freshroll.envs.harnessed import Harnessed


def _run(make: Any, n: int = 2) -> tuple[dict[int, object], Any]:
    from freshroll.engines.hf import HFEngine
    from freshroll.placement.adapters import ThreadEngine

    model, tok = build_tiny(seed=3)
    engine = ThreadEngine(HFEngine(model, tok), "w0", LimitsSection())
    wf = make(WorkflowSetup(RolloutSection(max_new_tokens=5), ToolsSection(timeout_s=60)))
    out: dict[int, object] = {}
    reqs = [GenRequest(f"g0.{i}#1", "g0", "p", "calc 3*4 c:", 0) for i in range(n)]

    async def go() -> Any:
        try:
            await wf.run_episode(engine, reqs, SamplingParams(5), 11, out.__setitem__)
            gw = next(iter(wf.gateways.values()))
            for _ in range(400):  # the disconnected calls still run on the engine: wait
                if gw.dropped >= getattr(wf, "disconnects", 0):
                    break
                await asyncio.sleep(0.05)
            return gw
        finally:
            await wf.close()
            await engine.close()
    return out, asyncio.run(go())


def test_a_client_gone_mid_call_fails_its_episode_and_leaves_no_call_behind(
    one_thread: Any,
) -> None:
    class Gone(Harnessed):
        disconnects = 2

        def __init__(self, setup: WorkflowSetup) -> None:
            super().__init__(setup, self.agent_)

        async def agent_(self, url: str, prompt: str, episode: str) -> str:
            await disconnect_mid_call(url, prompt, episode)
            raise ConnectionResetError("the client went away")

    out, gw = _run(Gone)
    assert sorted(out) == [0, 1]
    assert all(isinstance(o, EpisodeFailed) and o.reason == "tool_error"
               and "ConnectionResetError" in o.detail for o in out.values())
    assert gw.dropped == 2  # both late calls were answered, to nobody
    assert gw.calls == [] and gw.open_episodes == set()


def test_calc_harness_plays_model_tool_model_through_the_gateway(one_thread: Any,
                                                                 tmp_path: Path) -> None:
    out, gw = _run(CalcHarness)
    assert sorted(out) == [0, 1]
    for comp in out.values():
        assert isinstance(comp, Completion)
        kinds = [t.kind for t in comp.turns]
        assert kinds == ["model", "env", "model"]
        assert comp.loss_mask and not comp.loss_mask[1][0]  # the tool's tokens: no loss
    assert gw.calls == [] and gw.dropped == 0

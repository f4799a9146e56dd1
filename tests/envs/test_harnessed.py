"""A harness's own loop through the gateway (freshroll.envs.harnessed): the real ``openai``
client, the real HF engine; the sample rebuilt token for token from the gateway's record."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.config.ops import LimitsSection
from freshroll.config.rollout import ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.episodes import WORKFLOWS, EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.engines.tiny import build_tiny
from freshroll.envs.calc import evaluate
from freshroll.envs.gateway import GatewayCall
from freshroll.envs.harnessed import Harnessed, trajectory_of

openai = pytest.importorskip("openai")


def _call(prompt: tuple[int, ...], tokens: tuple[int, ...]) -> GatewayCall:
    return GatewayCall("completions", "e", "t", "stop", "v", prompt, tokens,
                       tuple(-0.5 for _ in tokens), 0.1)


def test_calls_that_grow_one_context_are_model_and_env_segments() -> None:
    segs = trajectory_of([_call((1, 2), (3, 4)), _call((1, 2, 3, 4, 9, 9), (5,))])
    assert not isinstance(segs, str)
    assert [(s.kind, s.token_ids) for s in segs] == [
        ("model", (3, 4)), ("env", (9, 9)), ("model", (5,))]
    broken = trajectory_of([_call((1, 2), (3, 4)), _call((1, 2, 3, 9), (5,))])
    assert isinstance(broken, str) and "re-tokenised" in broken
    assert trajectory_of([]) == "the harness made no model call"


def token_in_agent(tok: Any) -> Any:
    """A harness: asks, runs the calculator on the answer, and asks again with the context
    as token ids (what the gateway returned plus the tool's text, encoded once)."""
    async def agent(url: str, prompt: str, episode: str) -> str:
        client = openai.AsyncOpenAI(base_url=url, api_key="local", max_retries=0)
        async with client:
            first = await client.completions.create(
                model="freshroll", prompt=prompt, max_tokens=5, extra_body={"episode": episode})
            value = evaluate(first.choices[0].text)
            tool = "=err|" if value is None else f"={value}|"
            ids = [*first.model_extra["prompt_token_ids"],
                   *first.choices[0].model_extra["token_ids"],
                   *tok.encode(tool, add_special_tokens=False)]
            second = await client.completions.create(
                model="freshroll", prompt=ids, max_tokens=5, extra_body={"episode": episode})
            return str(second.choices[0].text)
    return agent


def text_agent(url_unused: Any = None) -> Any:
    async def agent(url: str, prompt: str, episode: str) -> str:
        client = openai.AsyncOpenAI(base_url=url, api_key="local", max_retries=0)
        async with client:
            first = await client.completions.create(
                model="freshroll", prompt=prompt, max_tokens=5, extra_body={"episode": episode})
            again = "q: " + prompt + first.choices[0].text  # a re-rendered history
            await client.completions.create(model="freshroll", prompt=again, max_tokens=5,
                                            extra_body={"episode": episode})
            return "x"
    return agent



def _episodes(agent_of: Any, n: int = 2) -> dict[int, object]:
    from freshroll.engines.hf import HFEngine
    from freshroll.placement.adapters import ThreadEngine

    model, tok = build_tiny(seed=3)
    engine = ThreadEngine(HFEngine(model, tok), "w0", LimitsSection())
    wf = Harnessed(WorkflowSetup(tools=ToolsSection(timeout_s=60)), agent_of(tok))
    out: dict[int, object] = {}
    reqs = [GenRequest(f"g0.{i}#1", "g0", "p", "calc 3*4 c:", 0) for i in range(n)]

    async def go() -> None:
        try:
            await wf.run_episode(engine, reqs, SamplingParams(5), 11, out.__setitem__)
        finally:
            await wf.close()
            await engine.close()
    asyncio.run(go())
    return out


@pytest.mark.usefixtures("one_thread")
def test_a_token_in_harness_gives_trajectories_with_their_tool_turns_masked() -> None:
    out = _episodes(token_in_agent)
    assert sorted(out) == [0, 1]
    for c in out.values():
        assert isinstance(c, Completion)
        assert [t[0] for t in c.turns] == ["model", "env", "model"]
        n1, n_env = c.turns[0][1], c.turns[1][1]
        assert c.loss_mask == ((1, n1), (0, n_env), (1, c.turns[2][1]))
        assert all(lp == 0.0 for lp in c.logprobs[n1:n1 + n_env])


@pytest.mark.usefixtures("one_thread")
def test_a_harness_that_resends_text_is_refused_not_trained_on() -> None:
    out = _episodes(lambda tok: text_agent())
    for failed in out.values():
        assert isinstance(failed, EpisodeFailed) and failed.reason == "tool_error"
        assert "re-tokenised" in failed.detail


@pytest.mark.slow
def test_a_harness_run_trains_and_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           one_thread: Any) -> None:
    from freshroll.engines.tiny import build_tiny as _bt
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    _, tok = _bt(seed=0)
    made: list[Harnessed] = []

    def factory(setup: WorkflowSetup) -> Harnessed:
        made.append(Harnessed(setup, token_in_agent(tok)))
        return made[-1]

    monkeypatch.setitem(WORKFLOWS, "calc_harness_unit", factory)  # not the built-in's name
    cfg = load_config(None, [
        "run.progress=false", "task.name=calc", "task.n_prompts=32", "task.params={}",
        "rewards.0.fn=numeric", "rollout.group_size=4", "rollout.batch_groups=2",
        "rollout.max_new_tokens=5", "run.steps=2", "run.runtime=inline", "run.torch_threads=1",
        "rollout.workflow=calc_harness_unit", "tools.timeout_s=60"])
    out = tmp_path / "run"
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok
    report = verify_run(out)
    assert report.ok, report.render()
    assert made and all(not wf.gateways for wf in made)  # each released with its engine

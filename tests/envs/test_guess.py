"""The guess game (freshroll.envs.guess): a hidden secret from the dataset row, answers as
environment turns, the last guess scored; on a scripted engine and in a real run."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from test_tool_use import EOS, Scripted, enc

from freshroll.config import load_config
from freshroll.config.rollout import ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.episodes import WorkflowSetup
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.envs.guess import GuessGame, reply


@pytest.mark.parametrize(("text", "secret", "answer"), [
    ("3", 5, ">"), ("7", 5, "<"), (" 5", 5, "="), ("x", 5, "?"), ("12a", 12, "=")])
def test_each_guess_gets_one_character(text: str, secret: int, answer: str) -> None:
    assert reply(text, secret) == answer


def _play(script: list[str], max_calls: int = 3) -> tuple[Completion, Scripted]:
    engine = Scripted(script)
    out: dict[int, object] = {}
    req = GenRequest("g0.0#1", "g0", "p", "guess 0-9:", 0, row={"answer": "5"})
    wf = GuessGame(WorkflowSetup(tools=ToolsSection(max_calls=max_calls)))
    asyncio.run(wf.run_episode(engine, [req], SamplingParams(3), 1,  # type: ignore[arg-type]  # a scripted engine
                               out.__setitem__))
    c = out[0]
    assert isinstance(c, Completion)
    return c, engine


def test_the_game_ends_when_the_secret_is_found() -> None:
    c, engine = _play(["3", "7", "5", "9"])
    assert c.token_ids == (*enc("3"), EOS, *enc(">"), *enc("7"), EOS, *enc("<"),
                           *enc("5"), EOS)
    assert c.loss_mask == ((1, 2), (0, 1), (1, 2), (0, 1), (1, 2))
    assert c.text == "5" and len(engine.asked) == 3
    assert "5" not in engine.asked[0][0].text  # the secret is never in the prompt


def test_after_max_calls_answers_the_next_guess_is_the_last() -> None:
    c, engine = _play(["1", "2", "3", "4"], max_calls=2)
    assert c.text == "3" and len(engine.asked) == 3
    assert [t[0] for t in c.turns] == ["model", "env", "model", "env", "model"]


@pytest.mark.slow
def test_a_guess_run_trains_and_verifies(tmp_path: Path) -> None:
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(repo / "configs" / "guess-smoke.yaml",
                      ["run.progress=false", "run.torch_threads=1", "run.steps=2"])
    out = tmp_path / "run"
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok
    report = verify_run(out)
    assert report.ok, report.render()

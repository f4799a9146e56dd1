"""The OpenEnv adapter (issue 49): an in-process reset/step environment played by the embedded
tiny model, a new environment as one module plus one registration, and a clear error naming the
extra when openenv-core is missing."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.config.rollout import RolloutSection, ToolsSection
from freshroll.engines.base import Completion
from freshroll.engines.episodes import (
    WORKFLOWS,
    EpisodeFailed,
    WorkflowSetup,
    register_workflow,
    workflow_for,
)
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.errors import ConfigError

core = pytest.importorskip("openenv.core.env_server")

from freshroll.envs.openenv import OpenEnvWorkflow, guess_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _Says:
    """A Tokenizes engine that answers every turn with ``text`` (no model)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def encode_text(self, text: str) -> tuple[int, ...]:
        return tuple(ord(c) for c in text)

    async def generate(self, requests: Any, params: Any, seed: int, emit: Any) -> None:
        for i in range(len(requests)):
            emit(i, Completion((7, 8), (1, 2), (-0.1, -0.1), self.text, "length", 0.0))


def _play(wf: Any, text: str, n: int = 2, answer: str = "5") -> dict[int, object]:
    out: dict[int, object] = {}
    reqs = [GenRequest(f"g0.{i}#1", "g0", "p", "guess 0-9:", 0, row={"answer": answer})
            for i in range(n)]
    asyncio.run(wf.run_episode(_Says(text), reqs, SamplingParams(3), 1,  # type: ignore[arg-type]
                               out.__setitem__))
    return out


def test_a_new_environment_is_one_class_and_one_registration() -> None:
    class Count(core.Action):  # type: ignore[misc,name-defined]
        n: int

    class CountObs(core.Observation):  # type: ignore[misc,name-defined]
        total: int = 0

    class Counter(core.Environment):  # type: ignore[misc,name-defined]
        def reset(self, seed: Any = None, episode_id: Any = None, **kw: Any) -> Any:
            self.total, self._state = 0, core.State(episode_id=episode_id)
            return CountObs()

        def step(self, action: Any, timeout_s: Any = None, **kw: Any) -> Any:
            self.total += action.n
            return CountObs(total=self.total, done=self.total >= 4, reward=float(self.total))

        @property
        def state(self) -> Any:
            return self._state

    def factory(setup: WorkflowSetup) -> OpenEnvWorkflow:
        return OpenEnvWorkflow(setup, Counter, lambda text: Count(n=len(text)),
                               lambda obs: f"={obs.total}|", name="counter")

    register_workflow("test_counter", factory)
    try:
        wf = workflow_for("test_counter", WorkflowSetup(tools=ToolsSection(max_calls=5)))
        out = _play(wf, "12")
    finally:
        del WORKFLOWS["test_counter"]
    for comp in out.values():
        assert isinstance(comp, Completion)
        # model, env (=2|), model, env (=4|, done): the episode ends on done
        assert [t[0] for t in comp.turns] == ["model", "env", "model", "env"]
        assert [t[3] for t in comp.turns if t[0] == "env"] == ["counter.step reward=2.0",
                                                                "counter.step reward=4.0"]
        assert comp.loss_mask == ((1, 2), (0, 3), (1, 2), (0, 3))  # observations: no loss


def test_the_guess_env_ends_on_the_secret_and_a_raising_env_is_tool_error() -> None:
    env = guess_env()
    setup = WorkflowSetup(RolloutSection(workflow="openenv_guess"), ToolsSection(max_calls=3))
    wf = OpenEnvWorkflow(setup, env, lambda t: env.Action(guess=t), lambda o: o.feedback)
    found = _play(wf, "5", answer="5")
    assert all(isinstance(c, Completion) and len(c.turns) == 2 for c in found.values())
    missed = _play(wf, "3", answer="5")  # > each time: max_calls steps, then the last turn
    assert all(isinstance(c, Completion) and len(c.turns) == 7 for c in missed.values())

    class Broken(env):  # type: ignore[misc,valid-type]
        def step(self, action: Any, timeout_s: Any = None, **kw: Any) -> Any:
            raise RuntimeError("the environment fell over")

    wf = OpenEnvWorkflow(setup, Broken, lambda t: env.Action(guess=t), lambda o: o.feedback)
    out = _play(wf, "3")
    assert all(isinstance(o, EpisodeFailed) and o.reason == "tool_error"
               and "fell over" in o.detail for o in out.values())


def test_without_openenv_core_the_workflow_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "openenv", None)  # type: ignore[arg-type]
    from freshroll.envs.registry import register_builtins

    register_builtins()
    with pytest.raises(ConfigError, match=r"pip install 'freshroll\[openenv\]'"):
        workflow_for("openenv_guess", WorkflowSetup())


@pytest.mark.slow
def test_a_50_step_run_through_the_adapter_verifies_with_every_turn_versioned(
    tmp_path: Path,
) -> None:
    from freshroll.engines import payload as pl
    from freshroll.harness.verify import verify_run
    from freshroll.ledger import events as ev
    from freshroll.ledger.store import LEDGER_FILE, Ledger
    from freshroll.runtime.run import run

    cfg = load_config(ROOT / "configs" / "openenv-smoke.yaml",
                      ["run.steps=50", "run.progress=false", "run.torch_threads=1"])
    result = run(cfg, tmp_path, stream=io.StringIO(), report=False)
    assert result.ok and verify_run(tmp_path).ok
    with Ledger(tmp_path / LEDGER_FILE, readonly=True) as ledger:
        events, payloads = [e for _, e in ledger.events()], ledger.payloads()
    assert sum(isinstance(e, ev.Committed) for e in events) == 50
    committed = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    started = {e.sample: e.version for e in events if isinstance(e, ev.Started)}
    spans = {e.sample: e.token_versions for e in events if isinstance(e, ev.Generated)}
    for sid in committed:
        p = pl.decode(payloads[sid])
        assert [t[0] for t in p.turns][:2] == ["model", "env"]
        assert all(t[3].startswith("guess.step reward=") for t in p.turns if t[0] == "env")
        # every token (so every turn) has its policy version: the started one, or its span's
        assert started[sid]
        if spans[sid]:
            assert sum(n for _, n in spans[sid]) == len(p.token_ids)

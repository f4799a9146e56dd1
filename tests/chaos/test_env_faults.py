"""Environment faults in the chaos library (issue 49, item 6): a tool that hangs past
``tools.timeout_s``, raises, returns malformed output, or whose environment process dies, on a
multi-turn tool task (calc_tool on the embedded tiny model), and a harness client that
disconnects from the gateway mid-call (calc_harness). Each failed call's sample is
discarded ``tool_error`` (never committed, never a reward of 0, never a hang), and the run keeps
every invariant of ``verify`` (`make chaos` / ``freshroll chaos`` run them at 20 seeds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from freshroll.chaos import checks, runner
from freshroll.chaos.plan import ENV_KINDS, load_plan
from freshroll.chaos.real import skip_reason
from freshroll.engines.episodes import EpisodeFailed, WorkflowSetup
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.envs.calc import ToolResult
from freshroll.envs.tool_use import ToolUse, malformed
from freshroll.ledger import events as ev

LIBRARY = Path(__file__).parents[2] / "chaos" / "library.yaml"
ENV_SCENARIOS = ("tool-hang", "tool-crash", "tool-malformed", "env-killed",
                 "gateway-disconnect")


def test_env_scenarios_run_on_the_tool_placement_only() -> None:
    plan = load_plan(LIBRARY)
    env = [s for s in plan.scenarios if s.env_faults]
    assert sorted(s.name for s in env) == sorted(ENV_SCENARIOS)
    assert {f.kind for s in env for f in s.faults} == ENV_KINDS
    for s in plan.scenarios:
        assert (skip_reason(s, "tool") is None) == s.env_faults
        assert (skip_reason(s, "sim") is None) == (not s.env_faults)


def _check_cases(tmp_path: Path, names: tuple[str, ...], seeds: range) -> None:
    plan = load_plan(LIBRARY)
    results = runner.run_plan(plan, seeds, tmp_path, only=names, placements=("tool",))
    assert sorted({r.scenario for r in results}) == sorted(names)
    assert len(results) == len(names) * len(seeds)
    for r in results:
        assert r.ok, (r.scenario, r.seed, r.violations)
        assert r.outcome == "finished" and r.faults_injected == 1
        events = runner.read_events(r.run_dir)
        hit = {s for e in events if isinstance(e, ev.FaultInjected) and " failed " in e.detail
               for s in e.detail.split(" failed ", 1)[1].split()}
        assert hit, r.scenario  # the check had samples to check
        reasons = {e.sample: e.reason for e in events
                   if isinstance(e, ev.Discarded) and e.sample in hit}
        assert reasons == dict.fromkeys(hit, "tool_error"), r.scenario


def test_a_crashing_tool_a_malformed_one_and_a_client_gone_keep_every_invariant(
    tmp_path: Path,
) -> None:
    _check_cases(tmp_path, ("tool-crash", "tool-malformed", "gateway-disconnect"), range(1))


@pytest.mark.slow
def test_every_env_scenario_over_3_seeds_keeps_every_invariant(tmp_path: Path) -> None:
    _check_cases(tmp_path, ENV_SCENARIOS, range(3))


def _events(outcome: ev.Event) -> list[ev.Event]:
    return [ev.FaultInjected(ts=1.0, fault="fail_tool", target="tool",
                             detail="#0 failed g3.1#1"), outcome]


def test_tool_failures_catches_a_failed_call_committed_or_discarded_by_another_reason() -> None:
    committed = ev.Committed(ts=2.0, lease="l1", version="v1", parent="v0",
                             settings_digest="s", samples=["g3.1#1"])
    assert [v.invariant for v in checks.tool_failures(_events(committed))] == ["tool_failures"]
    other = ev.Discarded(ts=2.0, request="g3.1", reason="generation_error", sample="g3.1#1")
    [v] = checks.tool_failures(_events(other))
    assert "discarded generation_error, not tool_error" in v.message
    ok = ev.Discarded(ts=2.0, request="g3.1", reason="tool_error", sample="g3.1#1")
    assert checks.tool_failures(_events(ok)) == []


def test_a_malformed_tool_answer_is_named_before_it_is_encoded() -> None:
    assert malformed(ToolResult("=3|", "ok")) is None
    assert malformed(ToolResult("=err|", "error")) is None
    assert "not a ToolResult" in (malformed("=3|") or "")
    assert "text is NoneType" in (malformed(ToolResult(None, "ok")) or "")  # type: ignore[arg-type]
    assert "outcome 'fine'" in (malformed(ToolResult("=3|", "fine")) or "")  # type: ignore[arg-type]


class _Echo:
    """A Tokenizes engine that answers every turn with ``1+2`` (no model)."""

    def __init__(self) -> None:
        self.encoded: list[object] = []

    def encode_text(self, text: str) -> tuple[int, ...]:
        self.encoded.append(text)
        return tuple(ord(c) for c in text)  # raises TypeError for text that is not a str

    async def generate(self, requests, params, seed, emit):  # type: ignore[no-untyped-def]
        from freshroll.engines.base import Completion
        for i in range(len(requests)):
            emit(i, Completion((7, 8), (1, 2, 3), (-0.1, -0.1, -0.1), "1+2", "length", 0.0))


@pytest.mark.parametrize("bad", ["=3|", ToolResult(None, "ok"), ToolResult("=3|", "fine")])
def test_a_malformed_answer_fails_its_sample_not_the_call(bad: object) -> None:
    class Bad:
        name = "calc"

        async def __call__(self, arg: str) -> object:
            return bad

    wf = ToolUse(WorkflowSetup(), tool=Bad())  # type: ignore[arg-type]
    engine, out = _Echo(), {}
    reqs = [GenRequest(f"g0.{i}#1", "g0", "p", "calc 1+2 c:", 0) for i in range(2)]
    asyncio.run(wf.run_episode(engine, reqs, SamplingParams(3), 1,  # type: ignore[arg-type]
                               out.__setitem__))
    assert sorted(out) == [0, 1]
    assert all(isinstance(o, EpisodeFailed) and o.reason == "tool_error" for o in out.values())
    assert engine.encoded == []  # refused before it was encoded

"""The episode seam (:mod:`freshroll.engines.episodes`): the pool hands each call to the run's
workflow (``rollout.workflow``, a registry by name), single-turn by default; a new workflow is
a module plus one registration (the two-turn example of docs/architecture.md); every
``started`` records its call and sampling seed, so generation can be replayed."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest
from two_turn import TwoTurn

from async_fakes import AsyncHarness
from freshroll.config import load_config
from freshroll.engines import payload as pl
from freshroll.engines.episodes import (
    WORKFLOWS,
    EpisodeWorkflow,
    SingleTurn,
    register_workflow,
    workflow_for,
)
from freshroll.errors import ConfigError
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.pipeline.calls import generation_seed


@pytest.fixture
def two_turn(monkeypatch: pytest.MonkeyPatch) -> TwoTurn:
    """``rollout.workflow: two_turn`` for this test (the one registration), one instance."""
    wf = TwoTurn()
    monkeypatch.setitem(WORKFLOWS, "two_turn", lambda: wf)
    return wf


def calls_of(events: list[Any]) -> dict[str, list[ev.Started]]:
    """call -> its members' ``started`` events, in ledger order."""
    out: dict[str, list[ev.Started]] = defaultdict(list)
    for e in events:
        if isinstance(e, ev.Started):
            assert e.call is not None and e.seed is not None
            out[e.call].append(e)
    return out


def check_calls(events: list[Any], run_seed: int, most: int) -> dict[str, list[ev.Started]]:
    """Each call is named by its first member, holds 1..``most`` members of one worker
    epoch started together, and its seed is the one the run seed and its name fix."""
    calls = calls_of(events)
    assert calls
    for name, members in calls.items():
        assert members[0].sample == name and 1 <= len(members) <= most
        assert {(m.worker, m.epoch, m.version, m.seed) for m in members} == {
            (members[0].worker, members[0].epoch, members[0].version,
             generation_seed(run_seed, name))}
    return calls


def test_the_registry_names_the_default_and_rejects_unknown_names() -> None:
    assert isinstance(workflow_for("single_turn"), SingleTurn)
    assert isinstance(SingleTurn(), EpisodeWorkflow) and isinstance(TwoTurn(), EpisodeWorkflow)
    assert load_config(None, []).rollout.workflow == "single_turn"
    # (the built-in environments' workflows are there once freshroll.envs.registry ran)
    with pytest.raises(ConfigError, match=r"rollout\.workflow: unknown episode workflow "
                                          r"'three_turn' \(registered: "
                                          r"(calc_harness, calc_tool, guess_game, openenv_guess, )?"
                                          r"single_turn"):
        workflow_for("three_turn")
    register_workflow("single_turn", SingleTurn)  # the same factory again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register_workflow("single_turn", TwoTurn)
    assert WORKFLOWS["single_turn"] is SingleTurn


def test_a_run_with_an_unknown_workflow_is_refused_before_any_write(tmp_path: Path) -> None:
    from freshroll.runtime.prepare import check_inputs, prepare_run_dir

    cfg = load_config(None, ["rollout.engine=sim", "rollout.workflow=three_turn"])
    with pytest.raises(ConfigError, match=r"rollout\.workflow: unknown episode workflow"):
        check_inputs(cfg)
    with pytest.raises(ConfigError, match=r"rollout\.workflow"):
        prepare_run_dir(cfg, tmp_path / "run", False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"rollout\.workflow"):
        load_config(None, ["rollout.workflow=no spaces"])


def test_an_older_started_event_reads_with_no_call_and_no_seed() -> None:
    old = (b'{"kind":"started","sample":"g0.0#1","worker":"w0","epoch":0,'
           b'"version":"p0-aa","ts":1.0}')
    e = msgspec.json.decode(old, type=ev.AnyEvent)
    assert isinstance(e, ev.Started) and (e.call, e.seed) == (None, None)


def test_the_default_workflow_records_each_calls_membership_and_seed(tmp_path: Path) -> None:
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=10"])
    assert h.run() is None
    assert isinstance(h.pipe.pool.workflow, SingleTurn)
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
    events = h.events(ev.Started)
    calls = check_calls(events, h.cfg.run.seed, h.cfg.rollout.call_batch)
    assert sum(e.calls for e in h.factory.made) == len(calls)  # one generate call each
    assert len(calls) < len(events)  # calls of several requests


def test_a_two_turn_workflow_is_a_module_and_one_registration(
    tmp_path: Path, two_turn: TwoTurn,
) -> None:
    h = AsyncHarness(tmp_path, overrides=["rollout.workers=2", "run.steps=10",
                                          "rollout.workflow=two_turn"])
    assert h.run() is None
    assert len(h.steps) == 10 and h.pipe.pool.workflow is two_turn
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
    calls = check_calls(h.events(ev.Started), h.cfg.run.seed, h.cfg.rollout.call_batch)
    assert two_turn.episodes == len(calls)  # the pool ran every call through it
    # two generate calls per episode (a call cut at the run's end may not reach its second)
    turns = sum(e.calls for e in h.factory.made)
    assert 2 * two_turn.episodes - 2 * len(h.factory.made) <= turns <= 2 * two_turn.episodes


@pytest.mark.slow
def test_two_turns_on_the_tiny_model_verify_and_replay_their_generation(
    tmp_path: Path, two_turn: TwoTurn,
) -> None:
    """A real run (the embedded model, inline): the ledger verifies, and a step-0 call's
    recorded members and seed give its samples again, token for token: the original
    prompts in the recorded order with the recorded seed (the first turn), then each
    prompt, its first answer and the follow-up (the second turn, the stored sample)."""
    import torch

    from freshroll.engines.hf import HFEngine
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.prepare import load_task_prompts
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    cfg = load_config(None, ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=2", "run.runtime=inline",
                             "run.torch_threads=1", "rollout.workflow=two_turn"])
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok and two_turn.episodes > 0
    assert verify_run(out).ok
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
        payloads = ledger.payloads()
    calls = check_calls(events, cfg.run.seed, cfg.rollout.call_batch)
    texts = {p.prompt_id: p.text for p in load_task_prompts(cfg, out / "model")}
    prompt_of = {e.group: e.prompt_id for e in events if isinstance(e, ev.Requested)}
    step0 = next(e.version for e in events if isinstance(e, ev.PolicyPublished))
    engine = HFEngine.from_pretrained(out / "model")
    ro, threads, replayed = cfg.rollout, torch.get_num_threads(), 0
    torch.set_num_threads(1)  # as the run generated
    try:
        for members in calls.values():
            stored = [payloads.get(m.sample) for m in members]
            if members[0].version != step0 or None in stored:
                continue  # a later policy's call, or one whose members did not all finish
            seed = members[0].seed
            assert seed is not None
            asked = [texts[prompt_of[m.sample.partition(".")[0]]] for m in members]
            first = engine.generate(asked, max_new_tokens=ro.max_new_tokens,
                                    temperature=ro.temperature, top_p=ro.top_p, seed=seed)
            again = [a + c.text + TwoTurn.follow_up for a, c in zip(asked, first, strict=True)]
            second = engine.generate(again, max_new_tokens=ro.max_new_tokens,
                                     temperature=ro.temperature, top_p=ro.top_p, seed=seed + 7919)
            for comp, data in zip(second, stored, strict=True):
                assert data is not None
                sample = pl.decode(data)
                assert sample.prompt_ids == list(comp.prompt_token_ids)  # the first turn in it
                assert sample.token_ids == list(comp.token_ids)
            replayed += 1
    finally:
        torch.set_num_threads(threads)
    assert replayed > 0

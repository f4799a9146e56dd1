"""Evaluation on a held-out set (freshroll.runtime.evaluation): the config section, the budget,
the figures it adds, and a real short run of the embedded default with an eval file."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import Config, load_config
from freshroll.engines.base import Completion
from freshroll.errors import ConfigError
from freshroll.figures.evals import render_eval
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt, make_prompts
from freshroll.runtime.evaluation import (
    EVAL_FILE,
    Evaluator,
    eval_summary,
    load_eval_prompts,
    metrics_columns,
    read_eval,
    run_eval,
    trim,
    with_eval,
)


def _eval_file(path: Path, n: int = 6) -> Path:
    with path.open("w") as fh:
        for p in make_prompts("reverse", n, 123, min_len=3, max_len=3):
            fh.write(json.dumps({"prompt": p.text, "answer": p.answer}) + "\n")
    return path


# -- config ------------------------------------------------------------------------------------


def test_eval_is_off_by_default_and_its_keys_are_checked() -> None:
    cfg = load_config(None)
    assert cfg.eval.file is None and cfg.eval.mode == "greedy"
    with pytest.raises(ConfigError, match=r"eval\.bogus: unknown key"):
        load_config(None, ["eval.bogus=1"])
    with pytest.raises(ConfigError, match=r"eval\.every_steps"):
        load_config(None, ["eval.every_steps=0"])
    with pytest.raises(ConfigError, match=r"eval\.mode"):
        load_config(None, ["eval.mode=beam"])
    with pytest.raises(ConfigError, match=r"TRL's eval_steps is eval\.every_steps"):
        load_config(None, ["eval_steps=5"])
    with pytest.raises(ConfigError, match=r"eval\.file: rollout\.engine sim"):
        load_config(None, ["eval.file=x.jsonl", "rollout.engine=sim"])


def test_eval_file_resolves_from_the_config_files_folder(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("eval:\n  file: held/out.jsonl\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.eval.file == str(tmp_path / "held" / "out.jsonl")


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    from freshroll.engines.tiny import build_tiny

    return build_tiny(0)


def test_a_missing_eval_file_is_one_config_error_naming_eval_file(
        tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    cfg = load_config(None, [f"eval.file={tmp_path / 'nope.jsonl'}"])
    with pytest.raises(ConfigError, match=r"^eval\.file: prompt file .*nope\.jsonl does not "
                                          r"exist$"):
        load_eval_prompts(cfg, tmp_path, tiny[1])


def test_eval_prompts_are_capped_at_n_prompts(tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    path = _eval_file(tmp_path / "e.jsonl", n=6)
    cfg = load_config(None, [f"eval.file={path}", "eval.n_prompts=4"])
    prompts = load_eval_prompts(cfg, tmp_path, tiny[1])
    assert len(prompts) == 4 and prompts[0].answer is not None


# -- the budget and the figures ----------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(str(i), f"p{i}", {"answer": "1"}) for i in range(n)]


def test_prompts_past_the_budget_are_skipped_and_counted() -> None:
    clock = _Clock()
    calls: list[tuple[str, int]] = []

    def generate(chunk: Sequence[Prompt], mode: str, offset: int) -> list[Completion]:
        calls.append((mode, offset))
        clock.t += 1.0  # each batch and mode takes 1 s
        return [Completion((), (1,), (0.0,), "1", "stop", 0.0) for _ in chunk]

    def score(chunk: Sequence[Prompt], comps: Sequence[Completion]) -> list[Score]:
        return [Score(1.0, None, {"r": 1.0}) for _ in chunk]

    rows = run_eval(_prompts(20), ("greedy", "sampled"), generate, score, step=3, budget_s=5.0,
                    batch=4, now=clock)
    # batch 1: 2 s; batch 2 starts at 2 + 2 <= 5 and ends at 4; batch 3 would end past 5
    assert [r["mode"] for r in rows] == ["greedy", "sampled"]
    assert all(r["n_scored"] == 8 and r["n_skipped"] == 12 for r in rows)
    assert rows[0]["reward"] == 1.0 and rows[0]["rewards"] == {"r": 1.0}
    assert rows[0]["wall_s"] == 4.0 <= rows[0]["budget_s"]
    assert calls == [("greedy", 0), ("sampled", 0), ("greedy", 4), ("sampled", 4)]


def test_metric_columns_trim_and_summary(tmp_path: Path) -> None:
    lines = [
        {"step": 2, "mode": "greedy", "reward": 0.1, "n_scored": 4, "n_skipped": 0},
        {"step": 2, "mode": "sampled", "reward": 0.2, "n_scored": 4, "n_skipped": 0},
        {"step": 4, "mode": "greedy", "reward": 0.5, "n_scored": 3, "n_skipped": 1},
        {"step": 4, "mode": "sampled", "reward": 0.3, "n_scored": 3, "n_skipped": 1},
        {"step": 6, "mode": "greedy", "reward": 0.4, "n_scored": 4, "n_skipped": 0},
    ]
    (tmp_path / EVAL_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"st')
    assert metrics_columns(lines[:2]) == {"eval/reward": 0.1, "eval/reward_greedy": 0.1,
                                          "eval/reward_sampled": 0.2}
    assert metrics_columns(lines[1:2]) == {"eval/reward": 0.2}
    rows = with_eval([{"step": 1}, {"step": 2}], {2: lines[:1]})
    assert rows == [{"step": 1}, {"step": 2, "eval/reward": 0.1}]
    assert trim(tmp_path, 5) == 1  # step 6 was evaluated but never committed; torn line gone
    assert [r["step"] for r in read_eval(tmp_path)] == [2, 2, 4, 4]
    summary = eval_summary(tmp_path)
    assert summary is not None
    assert (summary["first"], summary["last"], summary["best"], summary["best_step"]) == (
        0.1, 0.5, 0.5, 4)
    assert summary["skipped"] == 1 and [s["step"] for s in summary["steps"]] == [2, 4]
    assert eval_summary(tmp_path / "none") is None
    # the end line says what was scored and how (issue 48 item 7: 32 greedy prompts by
    # default, never said)
    assert render_eval(summary) == (
        "eval: reward 0.100 -> 0.500 (best 0.500 at step 4) on the first 4 prompts of "
        "eval.file (eval.n_prompts), greedy/sampled, at 2 step(s), 1 prompt(s) skipped over "
        "the run (eval.budget_s)")
    assert render_eval(None) == "" and render_eval({"last": None}) == ""


def test_the_progress_line_shows_each_evaluation_and_keeps_it() -> None:
    """Issue 48 item 7: a log's line is throttled to every ~2.5% of the run, so step 20's
    evaluation was never printed; now a row with an evaluation is always drawn, and the last
    evaluation stays in the lines after it."""
    from freshroll.config import validate
    from freshroll.runtime.recording import ProgressLine

    log = io.StringIO()
    line = ProgressLine(validate({"run": {"steps": 400}}), log)
    base = {"t": 1.0, "reward_mean": 0.5, "accepted_per_s": 10.0, "trainer_idle_ratio": 0.0,
            "discards": 0, "discard_rate": 0.0}
    for step in range(1, 31):
        extra = {"eval/reward": 0.25} if step == 13 else {}
        line.on_row({"step": step, **base, **extra}, live=True)
    drawn = log.getvalue().splitlines()
    assert [ln.split()[1] for ln in drawn] == ["10/400", "13/400", "20/400", "30/400"]
    assert "eval" not in drawn[0] and all("eval 0.250@13" in ln for ln in drawn[1:])


def test_a_tiny_budget_returns_promptly_and_restores_training_mode(
        tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    from freshroll.rewards.scoring import build_reward_set

    model, tok = tiny
    prompts = make_prompts("reverse", 40, 1, min_len=3, max_len=3)
    cfg = load_config(None, ["eval.file=x.jsonl", "eval.budget_s=1e-9", "eval.mode=both"])
    ev = Evaluator(cfg, prompts, build_reward_set([{"fn": "reverse"}]), tok, tmp_path,
                   lambda state: model)
    model.train()
    t0 = time.monotonic()
    rows = ev.evaluate(7, model)
    assert time.monotonic() - t0 < 1.0
    assert model.training
    assert all(r["n_scored"] + r["n_skipped"] == 40 and r["n_skipped"] > 0 for r in rows)
    assert read_eval(tmp_path) == rows
    model.eval()


def test_the_budget_stops_a_generate_call_that_runs_past_it(
        tmp_path: Path, tiny: tuple[Any, Any]) -> None:
    """Issue 48: the budget was checked only between batches, so one long generate call
    (eval.max_new_tokens=100000) held the trainer for minutes. Now a call stops between two
    decoding steps once the budget is spent, its batch counted as skipped. The clock jumps
    past the budget at the first decoding step (no real time involved)."""
    from freshroll.rewards.scoring import build_reward_set

    model, tok = tiny
    prompts = make_prompts("reverse", 16, 1, min_len=3, max_len=3)
    cfg = load_config(None, ["eval.file=x.jsonl", "eval.budget_s=30", "eval.max_new_tokens=60",
                             "eval.mode=greedy"])
    ev = Evaluator(cfg, prompts, build_reward_set([{"fn": "reverse"}]), tok, tmp_path,
                   lambda state: model)
    ticks = iter([0.0])
    ev.now = lambda: next(ticks, 1e6)  # the deadline is set at 0, then time is far past it
    rows = ev.evaluate(3, model)
    assert [(r["n_scored"], r["n_skipped"]) for r in rows] == [(0, 16)]
    model.eval()


def test_an_eval_max_new_tokens_beyond_the_models_positions_is_refused(tmp_path: Path) -> None:
    """Issue 48: eval.max_new_tokens=100000 with a 128-position model passed config check."""
    from click.testing import CliRunner

    from freshroll.cli import main

    held = _eval_file(tmp_path / "held.jsonl")
    for new, ok in (("100000", False), ("128", False), ("32", True)):
        result = CliRunner().invoke(main, ["config", "check", f"eval.file={held}",
                                           f"eval.max_new_tokens={new}"])
        assert (result.exit_code == 0) == ok, result.output
        if not ok:
            assert result.exit_code == 2
            assert f"eval.max_new_tokens ({new}): the model has 128 positions" in result.stderr


# -- a real run --------------------------------------------------------------------------------


def _run(out: Path, *extra: str) -> Any:
    from freshroll.runtime.run import run

    cfg = load_config(None, ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=5", "run.max_staleness=0",
                             "run.runtime=inline", "run.torch_threads=1", *extra])
    return run(cfg, out, stream=io.StringIO(), report=False)


def _kinds(run_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        for _, e in ledger.events():
            kind = type(e).__name__
            counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Config]]:
    root = tmp_path_factory.mktemp("eval")
    path = _eval_file(root / "held.jsonl")
    with_eval_dir, plain = root / "with", root / "plain"
    result = _run(with_eval_dir, f"eval.file={path}", "eval.every_steps=2", "eval.mode=both")
    assert result.ok
    assert _run(plain).ok
    yield with_eval_dir, plain, load_config(None)


@pytest.mark.slow
def test_a_run_evaluates_at_every_steps_and_at_the_end(runs: tuple[Path, Path, Config]) -> None:
    run_dir, _, _ = runs
    lines = read_eval(run_dir)
    assert [(r["step"], r["mode"]) for r in lines] == [
        (s, m) for s in (2, 4, 5) for m in ("greedy", "sampled")]
    assert all(r["n_scored"] == 6 and r["n_skipped"] == 0 for r in lines)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/reward" in r] == [2, 4, 5]
    assert all({"eval/reward_greedy", "eval/reward_sampled"} <= set(r)
               for r in rows if "eval/reward" in r)
    by_step = {r["step"]: r for r in lines if r["mode"] == "greedy"}
    assert rows[1]["eval/reward"] == by_step[2]["reward"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [s["step"] for s in summary["eval"]["steps"]] == [2, 4, 5]
    assert summary["eval"]["last"] == by_step[5]["reward"]


@pytest.mark.slow
def test_eval_samples_never_enter_the_ledger(runs: tuple[Path, Path, Config]) -> None:
    run_dir, plain, _ = runs
    kinds = _kinds(run_dir)
    assert kinds.pop("Evaluated") == 3  # its lines recorded (verify binds eval.jsonl), no sample
    assert kinds == _kinds(plain)  # a sync run: the same events, eval or not
    assert json.loads((run_dir / "counts.json").read_text()) == json.loads(
        (plain / "counts.json").read_text())
    assert not (plain / EVAL_FILE).exists()
    assert "eval" not in json.loads((plain / "summary.json").read_text())
    rows = (plain / "metrics.jsonl").read_text()
    assert "eval/" not in rows


@pytest.mark.slow
def test_a_resume_keeps_the_eval_columns(runs: tuple[Path, Path, Config],
                                         tmp_path: Path) -> None:
    import shutil

    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    run_dir = tmp_path / "run"
    shutil.copytree(runs[0], run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    stream = io.StringIO()
    run(None, run_dir, resume=True, stream=stream, report=False)  # nothing left: rows kept
    assert (run_dir / "metrics.jsonl").read_text() == before, stream.getvalue()
    assert verify_run(run_dir).ok


def test_validate_reads_the_eval_reward_when_eval_is_configured(tmp_path: Path) -> None:
    from freshroll.validate.gates import Repeat, convergence_gate
    from freshroll.validate.runner import reward_window

    rows = [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 7)]
    rows[3]["eval/reward"], rows[5]["eval/reward"] = 0.9, 0.7
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert reward_window(tmp_path, 3) == pytest.approx(0.5)  # training reward: steps 4-6
    assert reward_window(tmp_path, 3, "eval/reward") == pytest.approx(0.8)
    assert reward_window(tmp_path, 1, "eval/reward") == pytest.approx(0.7)  # the last step's
    a = [Repeat("async-seed0", "async", 0, "a", {"reward_window": 0.8})]
    s = [Repeat("sync-seed0", "sync", 0, "s", {"reward_window": 0.8})]
    c = convergence_gate(3, 0.05, None, False, a, s, "eval reward (eval.file)")
    assert c.passed and "mean eval reward (eval.file) of the last 3 steps" in c.figure

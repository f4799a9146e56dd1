"""Failure budgets: a stage that only fails ends the run with one line; rare failures never do.

Before the budget, each of the pipeline tests below ran forever (admit, generate, discard).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from freshroll.control.breaker import Breaker, FailureBudget, Rule
from freshroll.errors import FailureBudgetExceeded, FreshrollError, Interrupted
from freshroll.ledger import events as ev
from freshroll.pipeline.observers import Callbacks
from pipeline_fakes import FakeEngine, Harness, ok_reward

# -- the policy, against nothing but itself ------------------------------------------------


def test_always_failing_stage_trips_on_calls_and_samples_with_one_line_naming_it():
    b = Breaker("reward function 'raises'", Rule(max_calls=3, max_units=10))
    b.record(4, 4, "raises raised RuntimeError: boom\nsecond line")
    b.record(4, 4, "a later error")
    with pytest.raises(FailureBudgetExceeded) as info:
        b.record(4, 4, "a later error")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("reward function 'raises' failed 12 samples in 3 calls in a row")
    assert "limits.max_consecutive_failures=10" in msg
    assert "limits.max_consecutive_failed_calls=3" in msg
    assert 'first error: "raises raised RuntimeError: boom second line"' in msg


def test_a_long_first_error_keeps_its_end_where_the_hint_is():
    """Issue 28, defect 2: the quote was cut at 300 characters, before the hint that a
    reward's KeyError gets (the ledger held it, the terminal did not)."""
    from freshroll.rewards.calling import explain

    columns = ["level", "source", "target"]
    hint = explain(KeyError("solution"), columns, conversational=False)
    error = "wants raised KeyError: 'solution' " + "x" * 800 + hint
    b = Breaker("reward function 'wants'", Rule(max_calls=1, max_units=1))
    with pytest.raises(FailureBudgetExceeded) as info:
        b.record(1, 1, error)
    msg = str(info.value)
    assert "wants raised KeyError: 'solution'" in msg  # its start
    assert msg.endswith(f'{hint.strip()}"')  # and its end, whole
    assert " ... " in msg and len(msg) < len(error) + 200


def test_both_counts_must_be_reached():
    many_small = Breaker("s", Rule(max_calls=3, max_units=10))
    for _ in range(9):
        many_small.record(1, 1, "e")  # 9 calls but 9 samples: not yet
    with pytest.raises(FailureBudgetExceeded, match="failed 10 samples in 10 calls"):
        many_small.record(1, 1, "e")
    few_big = Breaker("s", Rule(max_calls=3, max_units=10))
    few_big.record(256, 256, "e")
    few_big.record(256, 256, "e")  # 512 samples but 2 calls: not yet
    with pytest.raises(FailureBudgetExceeded, match="failed 768 samples in 3 calls"):
        few_big.record(256, 256, "e")


def test_a_call_with_any_success_resets_so_rare_failures_never_trip():
    b = Breaker("s", Rule(max_calls=2, max_units=2))  # the ratio rule is off here
    for _ in range(1000):
        b.record(256, 256, "whole call failed")
        b.record(3, 4, "three of four failed")
    assert b.failures == 1000 * 259 and b.calls == 0 and b.units == 0


def test_the_ratio_rule_trips_only_on_a_full_window_above_the_ratio():
    b = Breaker("w", Rule(10**6, window=10, max_ratio=0.5))
    for _ in range(3):
        b.record(2, 3, "e")  # 6 of 9 failed, but the window is not full yet
    with pytest.raises(FailureBudgetExceeded, match=r"failed 7 of its last 10 samples "
                                                    r"\(limits.max_failure_ratio=0.5\)"):
        b.record(1, 1, "e")


def test_window_zero_turns_the_ratio_rule_off():
    b = Breaker("w", Rule(10**6, window=0))
    for _ in range(1000):
        b.record(9, 10, "e")


def test_one_unit_stages_count_calls():
    b = Breaker("trainer", Rule(3, unit="steps", calls_key="limits.max_consecutive_skipped_steps"))
    b.record(1, 1, "step 4: loss is nan")
    b.record(0, 1)
    b.record(1, 1, "step 6: loss is nan")
    b.record(1, 1, "e")
    with pytest.raises(FailureBudgetExceeded) as info:
        b.record(1, 1, "e")
    assert str(info.value) == ('trainer failed 3 steps in a row '
                               '(limits.max_consecutive_skipped_steps=3); '
                               'first error: "step 4: loss is nan"')


def test_rule_and_record_bounds_are_checked():
    with pytest.raises(ValueError):
        Rule(0)
    with pytest.raises(ValueError):
        Rule(1, window=5, max_ratio=0.0)
    with pytest.raises(ValueError):
        Breaker("s", Rule(1)).record(2, 1)


def test_budget_keeps_one_breaker_per_stage():
    budget = FailureBudget()
    budget.record("a", Rule(3), 1, 1, "first a")
    budget.record("b", Rule(3), 1, 1, "first b")
    budget.record("a", Rule(3), 1, 1, "later")
    with pytest.raises(FailureBudgetExceeded, match=r'^a failed 3 .*"first a"'):
        budget.record("a", Rule(3), 1, 1, "later")


# -- the pipeline: always-failing stages end the run, closed and verifiable ------------------


def _raises(prompts: Any, completions: list[str], **kw: Any) -> Any:
    raise RuntimeError("boom")


def _nan(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return [math.nan] * len(completions)


def _short(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return [1.0]


def _none(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return None


def _strings(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return ["good"] * len(completions)


def _exit(prompts: Any, completions: list[str], **kw: Any) -> Any:
    raise SystemExit(3)


def _ctrl_c(prompts: Any, completions: list[str], **kw: Any) -> Any:
    raise KeyboardInterrupt("from the reward")


def _huge(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return [1e308] * len(completions)  # finite in float64, infinite in the trainer's float32


BAD_REWARDS = {
    "raises": (_raises, "RuntimeError: boom"), "nan": (_nan, "no reward applies to this sample"),
    "short": (_short, "returned 1 values"), "none": (_none, "returned NoneType"),
    "strings": (_strings, "non-numeric str"), "exit": (_exit, "SystemExit"),
    "huge": (_huge, "not finite in float32"),
}


@pytest.mark.parametrize("kind", sorted(BAD_REWARDS))
def test_an_always_failing_reward_ends_the_run_naming_it(tmp_path: Path, kind: str):
    fn, quoted = BAD_REWARDS[kind]
    h = Harness(tmp_path, rewards=[(kind, fn)])
    err = h.run()
    assert type(err) is FailureBudgetExceeded, repr(err)  # plain, not an ExceptionGroup
    msg = str(err)
    assert msg.startswith(f"reward function '{kind}' failed ") and "\n" not in msg
    assert quoted in msg
    assert h.steps == [] and h.buf.closed
    assert [e.reason for e in h.events(ev.Closed)] == ["failed"]
    report = h.verify()
    assert report.ok and report.closed, report.render()


def test_a_keyboard_interrupt_in_a_reward_stops_the_run_as_interrupted(tmp_path: Path):
    """Not a failure of the reward (the budget does not count it): the run stops as if the
    operator pressed Ctrl-C, closed and verifiable, so --resume continues it."""
    h = Harness(tmp_path, rewards=[("ctrl_c", _ctrl_c)])
    err = h.run()
    assert isinstance(err, Interrupted), repr(err)
    assert "KeyboardInterrupt" in str(err)
    assert [e.reason for e in h.events(ev.Closed)] == ["interrupted"]
    report = h.verify()
    assert report.ok and report.closed, report.render()


def test_the_failing_function_of_a_set_is_the_one_named(tmp_path: Path):
    h = Harness(tmp_path, rewards=[("fine", ok_reward), ("broken", _raises)])
    err = h.run()
    assert isinstance(err, FailureBudgetExceeded)
    assert str(err).startswith("reward function 'broken' failed")


def _wants_solution(prompts: Any, completions: list[str], **kw: Any) -> Any:
    return [float(a == b) for a, b in zip(kw["solution"], completions, strict=True)]


def test_a_reward_errors_hint_reaches_the_terminal_whole(tmp_path: Path):
    """Issue 28, defect 2: the stage's errors, joined with "; ", were split on "; ", which
    cut a KeyError's hint at its own "; " ("...asked for column 'solution'" without "; the
    dataset has columns [...]")."""
    h = Harness(tmp_path, rewards=[("fine", ok_reward), ("wants", _wants_solution)])
    err = h.run()
    assert isinstance(err, FailureBudgetExceeded)
    msg = str(err)
    assert msg.startswith("reward function 'wants' failed"), msg
    assert "(the reward asked for column 'solution'; the dataset has columns [" in msg, msg
    assert msg.endswith('])"'), msg


def test_rare_reward_failures_never_stop_a_run(tmp_path: Path):
    calls = 0

    def flaky(prompts: Any, completions: list[str], **kw: Any) -> list[float]:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            raise RuntimeError("reward server down")
        return [math.nan if i == 0 else 0.5 * (i % 2) for i in range(len(completions))]

    h = Harness(tmp_path, rewards=[("flaky", flaky)], overrides=["run.steps=4"])
    assert h.run() is None
    assert len(h.steps) == 4 and h.buf.counts["discarded_reward_error"] > 0
    h.buf.shutdown("done")
    assert h.verify().ok


def test_an_always_failing_engine_ends_the_run_naming_the_worker(tmp_path: Path):
    def fail(call: int) -> None:
        raise RuntimeError("CUDA error: device-side assert")

    h = Harness(tmp_path, engines=[FakeEngine(), FakeEngine(fail)],
                overrides=["limits.max_consecutive_failures=16", "rollout.workers=2",
                           "run.steps=100000"])  # ends on the budget, not on steps
    err = h.run()
    assert isinstance(err, FailureBudgetExceeded)
    assert str(err).startswith("inference worker 'w1' failed")
    assert "CUDA error: device-side assert" in str(err)
    assert h.buf.counts["discarded_generation_error"] >= 16
    assert h.verify().ok


def test_an_unexpected_error_in_a_task_is_raised_plain_and_the_ledger_closed(tmp_path: Path):
    h = Harness(tmp_path)

    def on_step(r: Any) -> None:
        raise ZeroDivisionError("bug in a callback")

    h.pipe.observers.append(Callbacks(on_step=on_step))
    err = h.run()
    assert type(err) is ZeroDivisionError
    assert not isinstance(err, FreshrollError)
    assert h.buf.closed and h.verify().ok

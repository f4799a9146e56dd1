"""Tests for freshroll.rewards.functions: hand-computed values of the built-in rewards."""

from __future__ import annotations

import pytest

from freshroll.rewards.functions import (
    REWARDS,
    exact_match_reward,
    length_penalty,
    numeric_reward,
    reverse_reward,
    sort_reward,
)


def _one(fn: object, completion: str, answer: str) -> float:
    assert callable(fn)
    (value,) = fn(["p"], [completion], answer=[answer])
    return float(value)


@pytest.mark.parametrize("fn", [reverse_reward, sort_reward])
@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("4321", "4321", 1.0),
        ("4321 \n", "4321", 1.0),   # trailing whitespace stripped
        ("4301", "4321", 0.75),
        ("43", "4321", 0.5),        # too short: missing positions earn nothing
        ("432199", "4321", 0.8),    # 1.0 - 0.1 * 2 extra chars
        ("1234", "4321", 0.0),
        ("9999999999999", "4321", 0.0),  # floored at 0
        ("", "", 1.0),
    ],
)
def test_positional_reward_values(
    fn: object, completion: str, answer: str, expected: float
) -> None:
    assert _one(fn, completion, answer) == pytest.approx(expected)


def test_exact_match() -> None:
    out = exact_match_reward(["a", "b", "c"], [" 12 ", "13", "1"], answer=["12", "12", "12"])
    assert out == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("57", "57", 1.0),
        (" 57\n", "57", 1.0),
        ("47", "57", 0.45),     # ones digit right: 0.9 * 1/2
        ("7", "57", 0.45),      # right-aligned: the 7 is the ones digit
        ("157", "57", 0.8),     # 0.9 * 2/2 - 0.1 * 1 extra, below exact
        ("00", "57", 0.0),
        ("100", "7", 0.0),
    ],
)
def test_numeric_reward_values(completion: str, answer: str, expected: float) -> None:
    assert _one(numeric_reward, completion, answer) == pytest.approx(expected)


def test_length_penalty_uses_raw_length() -> None:
    assert length_penalty(["p", "p"], ["abcd", ""]) == pytest.approx([-0.04, 0.0])


def test_conversational_completions_use_last_message() -> None:
    completions = [[{"role": "assistant", "content": "4301"}]]
    assert reverse_reward(["p"], completions, answer=["4321"]) == [0.75]


def test_extra_kwargs_are_ignored_and_length_mismatch_raises() -> None:
    assert sort_reward(["p"], ["12"], answer=["12"], completion_ids=[[1]], trainer_state=None) == [
        1.0
    ]
    with pytest.raises(ValueError):
        reverse_reward(["p", "q"], ["1", "2"], answer=["1"])


def test_registry_rewards_stay_in_range() -> None:
    completions = ["", "1", "21", "321", "4321", "54321 ", "x9"]
    for name, fn in REWARDS.items():
        if name in ("length_penalty", "reasoning_gym"):  # no answer; its entry (own tests)
            continue
        values = fn(["p"] * len(completions), completions, answer=["4321"] * len(completions))
        assert all(0.0 <= v <= 1.0 for v in values), (name, values)
        assert values[4] == 1.0
        assert max(values[:4] + values[5:]) < 1.0


def test_length_score_pays_half_for_length_and_half_for_digits() -> None:
    from freshroll.rewards.functions import length_score, repeat_reward

    assert length_score("777", "777") == 1.0
    assert length_score("7777", "777") == pytest.approx(0.75)  # docstring example
    assert length_score("778", "777") == pytest.approx(0.5 + 0.5 * 2 / 3)
    run_on = length_score("7" * 40, "777")
    assert 0 < run_on < length_score("7" * 10, "777") < 1  # shorter earns more
    assert length_score("", "") == 1.0 and length_score("1", "") == 0.0
    assert repeat_reward(["p"], [" 77 "], ["77"]) == [1.0]  # stripped, as the others

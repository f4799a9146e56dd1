"""Tests for freshroll.rewards.tasks: deterministic generation and the Prompt record."""

from __future__ import annotations

import random

import pytest

from freshroll.errors import ConfigError
from freshroll.rewards.functions import REWARDS
from freshroll.rewards.tasks import (
    TASKS,
    VOCAB,
    Prompt,
    make_prompts,
    task_params,
)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_same_seed_same_prompts_different_seed_differs(task: str) -> None:
    a = make_prompts(task, 20, seed=1)
    assert a == make_prompts(task, 20, seed=1)
    # (text, answer): a game's prompts are alike and its secrets differ (guess)
    assert [(p.text, p.answer) for p in a] != [
        (p.text, p.answer) for p in make_prompts(task, 20, seed=2)]


def test_generation_does_not_touch_global_random_state() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    make_prompts("reverse", 10, seed=0)
    assert random.random() == expected


@pytest.mark.parametrize("task", sorted(TASKS))
def test_texts_and_answers_stay_in_vocabulary(task: str) -> None:
    for p in make_prompts(task, 200, seed=7):
        assert set(p.text) <= VOCAB, p.text
        assert set(p.answer) <= VOCAB, p.answer


def test_reverse_sort_add_answers_are_correct() -> None:
    for p in make_prompts("reverse", 50, seed=3, min_len=2, max_len=7):
        digits = p.text.removeprefix("rev ").removesuffix("=")
        assert 2 <= len(digits) <= 7 and digits.isdigit()
        assert p.answer == digits[::-1]
    for p in make_prompts("sort", 50, seed=3):
        digits = p.text.removeprefix("sort ").removesuffix("=")
        assert 3 <= len(digits) <= 5
        assert p.answer == "".join(sorted(digits))
    for p in make_prompts("add", 50, seed=3, max_operand=9):
        a, b = p.text.removesuffix("=").split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert p.answer == str(int(a) + int(b))


def test_prompt_ids_are_stable_and_unique() -> None:
    prompts = make_prompts("reverse", 43, seed=0)
    assert prompts[42].prompt_id == "reverse-s0-000042"
    assert len({p.prompt_id for p in prompts}) == 43


def test_registry_defaults_point_at_known_rewards() -> None:
    assert {name: t.reward for name, t in TASKS.items()} == {
        "reverse": "reverse", "sort": "sort", "add": "numeric", "repeat": "repeat",
        "calc": "numeric", "guess": "numeric",
    }
    assert all(t.reward in REWARDS for t in TASKS.values())
    assert task_params("reverse") == {"min_len": 3, "max_len": 5}


def test_unknown_task_names_it_and_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"'mul'.*add, calc, guess, repeat, reverse, sort"):
        make_prompts("mul", 3, seed=0)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_lenn": 4}, "max_lenn"),
        ({"min_len": 0}, "min_len"),
        ({"min_len": 6, "max_len": 4}, "min_len"),
        ({"max_len": "5"}, "max_len"),
    ],
)
def test_bad_params_name_the_param(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make_prompts("reverse", 0, seed=0, **params)


def test_bad_n_is_rejected() -> None:
    with pytest.raises(ConfigError, match="n must be"):
        make_prompts("add", -1, seed=0)


def test_generated_prompts_carry_answer_as_their_only_column() -> None:
    (p,) = make_prompts("add", 1, seed=0)
    assert list(p.columns) == ["answer"] and p.answer == p.columns["answer"]
    assert not p.is_chat and p.reward_prompt() == p.text


def test_chat_prompt_hands_rewards_a_copy_of_its_messages() -> None:
    messages = ({"role": "user", "content": "hi"},)
    p = Prompt("c-0", "rendered", {"prompt": list(messages)}, messages)
    given = p.reward_prompt()
    assert p.is_chat and given == [{"role": "user", "content": "hi"}]
    assert isinstance(given, list)
    given[0]["content"] = "changed"  # a reward mutating its input cannot change the prompt
    assert p.messages is not None and p.messages[0]["content"] == "hi"
    assert Prompt("x", "t").answer is None


def test_repeat_answers_are_correct_and_their_lengths_long_tailed() -> None:
    import statistics

    prompts = make_prompts("repeat", 4000, seed=0, min_len=2, max_len=48, tail=12)
    lengths = []
    for p in prompts:
        digit, _, count = p.text.removeprefix("rep ").removesuffix("=").partition("x")
        assert digit.isdigit() and len(digit) == 1 and p.answer == digit * int(count)
        lengths.append(len(p.answer))
    assert min(lengths) == 2 and max(lengths) == 48  # the floor and the cap
    assert statistics.median(lengths) <= 4 < statistics.mean(lengths)  # most short, a tail
    assert 0.01 < sum(n >= 24 for n in lengths) / len(lengths) < 0.1
    heavier = make_prompts("repeat", 4000, seed=0, min_len=2, max_len=48, tail=8)
    assert statistics.mean(len(p.answer) for p in heavier) > statistics.mean(lengths)
    with pytest.raises(ConfigError, match="tail"):
        make_prompts("repeat", 1, seed=0, tail=0)

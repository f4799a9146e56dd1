"""TRL's own reward functions plug into freshroll unchanged (trl is a test dependency)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import trl.rewards

from freshroll.errors import ConfigError
from freshroll.rewards.scoring import build_reward_set
from freshroll.rewards.tasks import Prompt

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None

#: how each function of trl.rewards is configured in freshroll: (entry, columns it needs)
CONFIGURED: dict[str, tuple[dict[str, Any], list[str]]] = {
    "think_format_reward": ({"fn": "trl.rewards:think_format_reward"}, []),
    "get_soft_overlong_punishment": (
        {"fn": "trl.rewards:get_soft_overlong_punishment",
         "args": {"max_completion_len": 16, "soft_punish_cache": 4}}, []),
    "get_repetition_penalty_reward": (
        {"fn": "trl.rewards:get_repetition_penalty_reward", "args": {"ngram_size": 2}}, []),
    # these three need the math_verify package when called; they build and plug in all the same
    "accuracy_reward": ({"fn": "trl.rewards:accuracy_reward"}, ["solution"]),
    "reasoning_accuracy_reward": ({"fn": "trl.rewards:reasoning_accuracy_reward"}, ["solution"]),
    "get_cosine_scaled_reward": (
        {"fn": "trl.rewards:get_cosine_scaled_reward", "args": {"max_len": 16}}, ["solution"]),
}


def _chat_prompts(n: int, **columns: list[Any]) -> list[Prompt]:
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"q{i}"}]
        row = {"prompt": messages, **{k: v[i] for k, v in columns.items()}}
        out.append(Prompt(f"c-{i}", f"q{i}", row, messages))
    return out


def test_every_trl_reward_is_covered() -> None:
    exported = {name for names in trl.rewards._import_structure.values() for name in names}
    assert exported == set(CONFIGURED)


@pytest.mark.parametrize("name", sorted(CONFIGURED))
def test_every_trl_reward_builds_and_asks_for_its_columns(name: str) -> None:
    entry, needs = CONFIGURED[name]
    rs = build_reward_set([entry])
    rs.check_columns(["prompt", *needs])
    if needs:
        with pytest.raises(ConfigError, match=repr(needs)):
            rs.check_columns(["prompt", "answer"])


def test_think_format_reward_scores_chat_completions() -> None:
    rs = build_reward_set([CONFIGURED["think_format_reward"][0]])
    texts = ["<think>\nwhy\n</think>\nanswer", "no thinking"]
    scores = rs.score_prompts(_chat_prompts(2), texts, [[1], [2]])
    assert [s.value for s in scores] == [1.0, 0.0]


def test_think_format_reward_on_string_prompts_explains_what_it_expects() -> None:
    rs = build_reward_set([CONFIGURED["think_format_reward"][0]])
    (score,) = rs.score_prompts([Prompt("p", "q", {"prompt": "q"})], ["<think>x</think>y"], [[1]])
    assert score.value is None and score.error is not None
    assert "think_format_reward raised TypeError" in score.error
    assert "conversational completions" in score.error and "chat-format prompts" in score.error


def test_soft_overlong_punishment_with_args_scores_completion_ids() -> None:
    rs = build_reward_set([CONFIGURED["get_soft_overlong_punishment"][0]])
    assert rs.specs[0].name == "soft_overlong_punishment_reward"  # TRL's metric name
    ids = [[1] * 10, [1] * 14, [1] * 20]  # <= 12: 0; 12 < 14 <= 16: (12-14)/4; > 16: -1
    scores = rs.score_prompts(_chat_prompts(3), ["a", "b", "c"], ids)
    assert [s.value for s in scores] == [0.0, -0.5, -1.0]


def test_repetition_penalty_with_and_without_args() -> None:
    ids = [[1, 2, 3, 4], [5, 5, 5, 5, 5]]
    two = build_reward_set([CONFIGURED["get_repetition_penalty_reward"][0]])
    assert [s.value for s in two.score_prompts(_chat_prompts(2), ["", ""], ids)] == [0.0, -0.75]
    default = build_reward_set([{"fn": "trl.rewards:get_repetition_penalty_reward", "args": {}}])
    assert [s.value for s in default.score_prompts(_chat_prompts(2), ["", ""], ids)] == [
        0.0, pytest.approx(-2 / 3)]
    assert default.version != two.version


def test_a_trl_factory_without_args_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"rewards\[0\].*reward factory.*args"):
        build_reward_set([{"fn": "trl.rewards:get_soft_overlong_punishment"}])
    with pytest.raises(ConfigError, match=r"soft_punish_cache"):
        build_reward_set([{"fn": "trl.rewards:get_soft_overlong_punishment",
                           "args": {"max_completion_len": 16}}])


def test_trl_weighted_rewards_combine_as_trl_does() -> None:
    rs = build_reward_set([
        {**CONFIGURED["think_format_reward"][0], "weight": 2.0},
        {**CONFIGURED["get_soft_overlong_punishment"][0], "weight": 0.5},
    ])
    (score,) = rs.score_prompts(_chat_prompts(1), ["<think>a</think>b"], [[1] * 14])
    assert score.value == pytest.approx(2.0 * 1.0 + 0.5 * -0.5)


@pytest.mark.skipif(HAS_MATH_VERIFY, reason="checks the message without math_verify")
def test_a_math_verify_reward_without_the_package_fails_with_its_message() -> None:
    rs = build_reward_set([CONFIGURED["accuracy_reward"][0]])
    prompts = _chat_prompts(1, solution=["1"])
    (score,) = rs.score_prompts(prompts, ["\\boxed{1}"], [[1]])
    assert score.value is None and score.error is not None and "math" in score.error.lower()


@pytest.mark.skipif(not HAS_MATH_VERIFY, reason="needs math_verify")
def test_accuracy_reward_with_math_verify() -> None:
    rs = build_reward_set([CONFIGURED["accuracy_reward"][0]])
    prompts = _chat_prompts(2, solution=["$\\frac{1}{3}$", "$\\frac{1}{3}$"])
    texts = ["\\boxed{\\frac{1}{3}}", "\\boxed{\\frac{1}{2}}"]
    scores = rs.score_prompts(prompts, texts, [[1]] * 2)
    assert [s.value for s in scores] == [1.0, 0.0]

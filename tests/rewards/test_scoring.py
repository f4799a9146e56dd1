"""Tests for freshroll.rewards.scoring: safe evaluation, combination, versions, loading."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from freshroll.errors import ConfigError
from freshroll.lineage import RewardVersion
from freshroll.rewards.functions import length_penalty, reverse_reward
from freshroll.rewards.scoring import (
    RewardSet,
    RewardSpec,
    Score,
    build_reward_set,
    load_reward_fn,
)

PROMPTS = ["rev 1234=", "rev 567="]
COMPLETIONS = ["4301", "765"]
ANSWERS = ["4321", "765"]


def _constant(values: Any) -> Any:
    def reward(prompts: list[str], completions: list[str], **kwargs: Any) -> Any:
        return values

    return reward


def _raising(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    raise KeyError("boom")


def test_weighted_combination_arithmetic() -> None:
    rs = RewardSet([
        RewardSpec("reverse", reverse_reward, weight=2.0),
        RewardSpec("length_penalty", length_penalty, weight=0.5),
    ])
    scores = rs.score(PROMPTS, COMPLETIONS, answer=ANSWERS)
    assert scores[0].value == pytest.approx(2.0 * 0.75 + 0.5 * -0.04)
    assert scores[1].value == pytest.approx(2.0 * 1.0 + 0.5 * -0.03)
    assert scores[0].components == pytest.approx({"reverse": 0.75, "length_penalty": -0.04})
    assert scores[0].error is None


def test_raising_reward_fails_every_sample_without_raising() -> None:
    rs = RewardSet([RewardSpec("reverse", reverse_reward), RewardSpec("bad", _raising)])
    scores = rs.score(PROMPTS, COMPLETIONS, answer=ANSWERS)
    assert scores == [Score(None, "reward_error: bad raised KeyError: 'boom'", {})] * 2


def test_nan_fails_only_that_sample() -> None:
    rs = RewardSet([RewardSpec("flaky", _constant([1.0, math.nan, None, 0.5]))])
    scores = rs.score(["p"] * 4, ["c"] * 4)
    assert [s.value for s in scores] == [1.0, None, None, 0.5]
    assert scores[1].error == "reward_error: flaky returned nan at index 1"
    assert scores[2].error is not None and "index 2" in scores[2].error
    assert scores[1].components == {}


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ("1.0", "returned str"),
        ([1.0, "x"], "non-numeric str"),
        (math.inf, "returned float"),
    ],
)
def test_bad_shape_fails_all_samples(returned: Any, fragment: str) -> None:
    rs = RewardSet([RewardSpec("odd", _constant(returned))])
    scores = rs.score(["p", "q"], ["a", "b"])
    assert all(s.value is None for s in scores)
    assert all(s.error is not None and fragment in s.error for s in scores)


def test_infinite_entry_fails_only_that_sample() -> None:
    scores = RewardSet([RewardSpec("r", _constant([math.inf, 0.0]))]).score(["p", "q"], ["a", "b"])
    assert scores[0].value is None and scores[1].value == 0.0


def test_caller_length_mismatch_is_a_value_error() -> None:
    rs = RewardSet([RewardSpec("reverse", reverse_reward)])
    with pytest.raises(ValueError, match="answer"):
        rs.score(PROMPTS, COMPLETIONS, answer=ANSWERS[:1])


def test_version_is_stable_and_tracks_weights() -> None:
    def make(weight: float) -> RewardSet:
        return RewardSet([
            RewardSpec("reverse", reverse_reward),
            RewardSpec("length_penalty", length_penalty, weight=weight),
        ])

    v = make(0.5).version
    assert v == make(0.5).version
    assert v.name == "combined"
    assert v != make(0.25).version
    assert RewardVersion.parse(str(v)) == v
    single = RewardSet([RewardSpec("reverse", reverse_reward)]).version
    assert single.name == "reverse"
    reordered = RewardSet([
        RewardSpec("length_penalty", length_penalty, weight=0.5),
        RewardSpec("reverse", reverse_reward),
    ])
    assert reordered.version == v


def test_version_tracks_config() -> None:
    a = RewardSet([RewardSpec("reverse", reverse_reward, config={"k": 1})]).version
    b = RewardSet([RewardSpec("reverse", reverse_reward, config={"k": 2})]).version
    assert a != b


def test_duplicate_names_and_empty_sets_are_rejected() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        RewardSet([RewardSpec("r", reverse_reward), RewardSpec("r", length_penalty)])
    with pytest.raises(ConfigError, match="at least one"):
        RewardSet([])


# --- loading -----------------------------------------------------------------------------


def test_load_reward_fn_from_file(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def shout(prompts, completions, **kwargs):\n"
        "    return [float(len(c)) for c in completions]\n"
    )
    fn = load_reward_fn(f"{path}:shout")
    assert fn(["p"], ["abc"]) == [3.0]


def test_load_reward_fn_from_module_and_builtin() -> None:
    assert load_reward_fn("freshroll.rewards.functions:reverse_reward") is reverse_reward
    assert load_reward_fn("reverse") is reverse_reward


@pytest.mark.parametrize(
    "ref",
    [
        "no_such_builtin",
        "freshroll_no_such_module:fn",
        "freshroll.rewards.functions:nope",
        "freshroll.rewards.functions:EXTRA_CHAR_PENALTY",  # not callable
        "/no/such/file.py:fn",
    ],
)
def test_load_reward_fn_errors_name_the_reference(ref: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_reward_fn(ref)
    assert ref in str(info.value)


def test_broken_reward_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('no')\n")
    with pytest.raises(ConfigError, match=r"broken\.py"):
        load_reward_fn(f"{path}:fn")


def test_build_reward_set_from_entries() -> None:
    rs = build_reward_set([
        {"fn": "reverse"},
        {"fn": "freshroll.rewards.functions:length_penalty", "weight": 0.5, "name": "len"},
    ])
    assert [(s.name, s.weight) for s in rs.specs] == [("reverse", 1.0), ("len", 0.5)]
    (score,) = rs.score(["p"], ["4301"], answer=["4321"])
    assert score.value == pytest.approx(0.75 - 0.02)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"fn": "reverse", "wieght": 1.0}, "wieght"),
        ({"weight": 1.0}, r"rewards\[0\]\.fn"),
        ({"fn": "reverse", "weight": "big"}, r"rewards\[0\]\.weight"),
        ({"fn": "reverse", "name": "bad name"}, r"rewards\[0\]\.name"),
        ({"fn": "unknown_reward"}, "unknown_reward"),
    ],
)
def test_build_reward_set_errors_name_the_field(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build_reward_set([entry])

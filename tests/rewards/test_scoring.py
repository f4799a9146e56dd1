"""Tests for freshroll.rewards.scoring: safe evaluation, combination, versions, loading."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from freshroll.errors import ConfigError
from freshroll.ledger.lineage import RewardVersion
from freshroll.rewards.calling import RewardState
from freshroll.rewards.functions import length_penalty, reverse_reward
from freshroll.rewards.scoring import (
    ImportBound,
    RewardSet,
    RewardSpec,
    Score,
    build_reward_set,
    load_reward_fn,
)
from freshroll.rewards.tasks import Prompt

PROMPTS = ["rev 1234=", "rev 567="]
COMPLETIONS = ["4301", "765"]
ANSWERS = ["4321", "765"]


def _constant(values: Any) -> Any:
    def reward(prompts: list[str], completions: list[str], **kwargs: Any) -> Any:
        return values

    return reward


def _raising(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    raise RuntimeError("boom")


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
    assert scores == [Score(None, "reward_error: bad raised RuntimeError: boom", {})] * 2


def test_none_or_nan_is_not_applicable_and_left_out_of_the_sum() -> None:
    """TRL: None -> NaN, and the weighted sum over rewards is a nansum."""
    rs = RewardSet([
        RewardSpec("a", _constant([None, 1.0, 0.25]), weight=2.0),
        RewardSpec("b", _constant([0.5, math.nan, 1.0]), weight=3.0),
    ])
    scores = rs.score(["p"] * 3, ["c"] * 3)
    assert [s.value for s in scores] == [1.5, 2.0, 3.5]
    assert [s.components for s in scores] == [{"b": 0.5}, {"a": 1.0}, {"a": 0.25, "b": 1.0}]
    assert all(s.error is None for s in scores)


def test_a_sample_no_reward_applies_to_is_discarded_with_the_reason() -> None:
    rs = RewardSet([RewardSpec("flaky", _constant([1.0, math.nan, None, 0.5]))])
    scores = rs.score(["p"] * 4, ["c"] * 4)
    assert [s.value for s in scores] == [1.0, None, None, 0.5]
    assert scores[1].error == scores[2].error == (
        "reward_error: no reward applies to this sample (every reward returned None or nan): "
        "flaky"
    )
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


# --- TRL's calling convention ------------------------------------------------------------


def _prompts(*rows: dict[str, Any], chat: bool = False) -> list[Prompt]:
    out = []
    for i, row in enumerate(rows):
        messages = [{"role": "user", "content": row["prompt"]}] if chat else None
        columns = {**row, "prompt": messages or row["prompt"]}
        out.append(Prompt(f"p{i}", str(row["prompt"]), columns, messages))
    return out


def test_rewards_are_called_by_keyword_with_every_column_ids_and_hooks() -> None:
    seen: dict[str, Any] = {}

    def spy(**kwargs: Any) -> list[float]:
        seen.update(kwargs)
        return [0.0] * len(kwargs["completions"])

    rs = RewardSet([RewardSpec("spy", spy)])
    prompts = _prompts({"prompt": "rev 1=", "answer": "1", "level": 3})
    rs.score_prompts(prompts, ["1"], [(5, 2)], RewardState(global_step=7, max_steps=9))
    assert set(seen) == {"prompts", "completions", "completion_ids", "answer", "level",
                         "trainer_state", "log_extra", "log_metric"}  # 'prompt' is prompts=
    assert (seen["prompts"], seen["completions"], seen["completion_ids"]) == (
        ["rev 1="], ["1"], [[5, 2]])
    assert (seen["answer"], seen["level"]) == (["1"], [3])
    assert seen["trainer_state"] == RewardState(7, 9)


def test_chat_prompts_give_messages_and_assistant_completions() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seen.update(prompts=prompts, completions=completions)
        return [1.0]

    RewardSet([RewardSpec("spy", spy)]).score_prompts(
        _prompts({"prompt": "hi"}, chat=True), ["yo"], [[1]])
    assert seen["prompts"] == [[{"role": "user", "content": "hi"}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "yo"}]]


def test_a_reward_without_kwargs_gets_only_the_keywords_it_names() -> None:
    def old_style(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    rs = RewardSet([RewardSpec("old", old_style)])
    scores = rs.score_prompts(_prompts({"prompt": "p", "answer": "x", "other": 1}), ["x"], [[1]])
    assert scores[0].value == 1.0


def test_log_extra_and_log_metric_are_kept() -> None:
    def logging_reward(completions: list[str], log_extra: Any, log_metric: Any,
                       **kwargs: Any) -> list[float]:
        log_extra("parsed", [c.upper() for c in completions])
        log_metric("parse_rate", 0.5)
        return [1.0] * len(completions)

    rs = RewardSet([RewardSpec("logs", logging_reward)])
    scores = rs.score(["p", "q"], ["a", "b"])
    assert [s.extras for s in scores] == [{"parsed": "A"}, {"parsed": "B"}]
    assert rs.logged_metrics == {"parse_rate": 0.5}


def test_a_key_error_on_a_column_names_asked_and_available_columns() -> None:
    def wants_solution(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(c == s) for c, s in zip(completions, kwargs["solution"], strict=True)]

    (score,) = RewardSet([RewardSpec("acc", wants_solution)]).score(["p"], ["c"], answer=["a"])
    assert score.error == (
        "reward_error: acc raised KeyError: 'solution' (the reward asked for column "
        "'solution'; the dataset has columns ['answer'])"
    )


def test_a_missing_required_column_is_refused_before_the_run_and_explained_during_it() -> None:
    def needs(prompts: list[str], completions: list[str], solution: list[str],
              **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    rs = RewardSet([RewardSpec("needs", needs)])
    with pytest.raises(ConfigError, match=r"'needs' needs dataset column\(s\) \['solution'\].*"
                                          r"columns: \['answer', 'question'\]"):
        rs.check_columns(["answer", "question"])
    rs.check_columns(["solution"])
    (score,) = rs.score(["p"], ["c"], answer=["a"])
    assert score.error is not None and "needs column(s) ['solution']" in score.error
    assert "the dataset has columns ['answer']" in score.error


def test_builtin_rewards_need_answer_and_columns_may_not_shadow_keywords() -> None:
    rs = build_reward_set([{"fn": "reverse"}, {"fn": "length_penalty"}])
    with pytest.raises(ConfigError, match=r"'reverse' needs .*\['answer'\].*task\.answer_field"):
        rs.check_columns(["prompt", "solution"])
    rs.check_columns(["answer"])
    with pytest.raises(ConfigError, match=r"\['trainer_state'\] clash"):
        rs.check_columns(["answer", "trainer_state"])


def test_string_completions_given_to_a_chat_reward_get_a_hint() -> None:
    def chat_only(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(c[0]["content"] == "x") for c in completions]

    (score,) = RewardSet([RewardSpec("chat_only", chat_only)]).score(["p"], ["x"])
    assert score.error is not None and "conversational completions" in score.error


# --- factories ---------------------------------------------------------------------------

FACTORIES = Path(__file__).with_name("reward_factories.py")
FACTORY = f"{FACTORIES}:make_threshold"


def test_a_factory_is_called_with_its_args() -> None:
    rs = build_reward_set([{"fn": FACTORY, "args": {"at": 2}}])
    (spec,) = rs.specs
    assert spec.name == "threshold_reward"  # the made function's __name__, as TRL logs it
    assert [s.value for s in rs.score(["p", "q"], ["a", "abc"])] == [0.0, 1.0]
    named = build_reward_set([{"fn": FACTORY, "args": {"at": 2}, "name": "short"}])
    assert named.specs[0].name == "short"


def test_the_version_tracks_factory_args_and_is_stable() -> None:
    def version(args: dict[str, Any]) -> RewardVersion:
        return build_reward_set([{"fn": FACTORY, "args": args}]).version

    assert version({"at": 2}) == version({"at": 2})
    assert version({"at": 2}) != version({"at": 3})
    plain = build_reward_set([{"fn": "reverse"}]).version
    assert plain == RewardSet([RewardSpec("reverse", reverse_reward)]).version  # unchanged


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"fn": FACTORY}, r"rewards\[0\]: .*make_threshold.*reward factory.*args"),
        ({"fn": FACTORY, "args": {"nope": 1}}, r"rewards\[0\]: .*make_threshold.*TypeError"),
        ({"fn": FACTORY, "args": [1]}, r"rewards\[0\]\.args: expected a mapping"),
        ({"fn": "freshroll.rewards.functions:numeric_score", "args": {}},
         r"rewards\[0\]: .*TypeError"),
        ({"fn": f"{FACTORIES}:make_number", "args": {}},
         r"returned int, not a reward function"),
    ],
)
def test_factory_mistakes_name_the_entry(entry: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_reward_set([entry])


def test_an_async_reward_is_awaited() -> None:
    async def remote(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [None if c == "skip" else 0.5 for c in completions]

    scores = RewardSet([RewardSpec("remote", remote)]).score(["p", "q"], ["a", "skip"])
    assert scores[0].value == 0.5 and scores[1].value is None


def test_a_callable_objects_attributes_enter_its_version() -> None:
    def version(attr: str) -> RewardVersion:
        return build_reward_set([{"fn": f"{FACTORIES}:{attr}", "name": "p"}]).version

    assert version("small_penalty") != version("big_penalty")
    assert version("small_penalty") == version("small_penalty")


def test_a_reward_module_that_blocks_at_import_fails_within_its_bound_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
):
    """Before: ``freshroll run`` hung forever on a reward file whose top level blocks. The
    bound (2 s) is 20 heartbeats (0.1 s) long, so a heartbeat line is said before it even on
    a loaded machine (at 0.5 s and 0.2 s the line was once missing at a load of ~8)."""
    f = tmp_path / "blocks.py"
    f.write_text("import time\ntime.sleep(30)\n"
                 "def r(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        build_reward_set([{"fn": f"{f}:r"}], ImportBound(timeout_s=2.0, heartbeat_s=0.1))
    assert time.monotonic() - t0 < 15  # it sleeps 30 s
    msg = str(info.value)
    assert msg.startswith(f"rewards[0].fn: reward '{f}:r': reward import {f} did not finish "
                          "within 2 s (limits.reward_import_timeout_s)"), msg
    assert f"s on reward import {f}, limit 2 s" in capsys.readouterr().err
    assert not [m for m in sys.modules if m.startswith("freshroll_user_reward_")
                and getattr(sys.modules[m], "__file__", None) == str(f)]


def test_a_bounded_import_raises_what_the_module_raised(tmp_path: Path):
    f = tmp_path / "broken.py"
    f.write_text("raise ValueError('nope')\n")
    with pytest.raises(ConfigError, match=r"failed to load \(ValueError\('nope'\)\)"):
        load_reward_fn(f"{f}:r", ImportBound(timeout_s=5))

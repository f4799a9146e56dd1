"""Profile parameters: documented values, bounds with typed errors, dict building."""

from __future__ import annotations

import pytest

from freshroll.errors import ConfigError
from freshroll.sim.profiles import (
    P1,
    P2,
    P3,
    PROFILES,
    LengthModel,
    Profile,
    RewardModel,
    ServerModel,
    ToolModel,
    TrainerModel,
    get_profile,
    profile_from_dict,
)


def test_documented_profiles():
    assert set(PROFILES) == {"P1", "P2", "P3"}
    assert (P1.lengths.sigma, P1.lengths.cap_multiple, P1.lengths.drift) == (0.4, 8.0, 0.0)
    assert P1.tools.turns == 1
    assert (P2.lengths.sigma, P2.lengths.cap_multiple, P2.lengths.drift) == (1.0, 16.0, 0.5)
    assert 0.0 < P2.lengths.prompt_share < 1.0  # split between prompt and sample
    assert P2.tools.turns == 1
    # P3 is P2 plus tools
    assert P3.lengths == P2.lengths and P3.server == P2.server and P3.reward == P2.reward
    assert P3.tools.turns > 1 and P3.tools.timeout_p == 0.05
    assert get_profile("P2") is P2


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: LengthModel(sigma=-0.1), "lengths.sigma"),
        (lambda: LengthModel(prompt_share=1.5), "lengths.prompt_share"),
        (lambda: LengthModel(cap_multiple=0.5), "lengths.cap_multiple"),
        (lambda: LengthModel(median_tokens=float("nan")), "lengths.median_tokens"),
        (lambda: LengthModel(drift_steps=0), "lengths.drift_steps"),
        (lambda: LengthModel(drift_steps=2.5), "lengths.drift_steps"),
        (lambda: ServerModel(step_s=0.0), "server.step_s"),  # open lower bound
        (lambda: ServerModel(max_concurrent=0), "server.max_concurrent"),
        (lambda: ServerModel(max_concurrent=True), "server.max_concurrent"),
        (lambda: RewardModel(timeout_p=1.01), "reward.timeout_p"),
        (lambda: RewardModel(timeout_s=0.0), "reward.timeout_s"),
        (lambda: ToolModel(turns=0), "tools.turns"),
        (lambda: ToolModel(median_s="1"), "tools.median_s"),
        (lambda: TrainerModel(s_per_token=-1e-6), "trainer.s_per_token"),
    ],
)
def test_out_of_bounds_names_the_field(build, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build()


def test_bounds_are_inclusive_where_documented():
    LengthModel(sigma=0.0, prompt_share=1.0, cap_multiple=1.0)
    RewardModel(timeout_p=1.0)
    ServerModel(step_s_per_seq=0.0, prefill_s_per_token=0.0, max_concurrent=1)


def test_from_dict_on_a_base():
    p = profile_from_dict({"base": "P2", "name": "P2-short", "lengths": {"median_tokens": 500}})
    assert p.name == "P2-short" and p.lengths.median_tokens == 500
    assert p.lengths.sigma == P2.lengths.sigma and p.reward == P2.reward
    assert profile_from_dict({"base": "P1"}) == P1
    q = profile_from_dict({"name": "mine", "server": {"max_concurrent": 4}})
    assert q.server.max_concurrent == 4 and q.lengths == LengthModel()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"base": "P1", "lenghts": {}}, "lenghts"),
        ({"base": "P1", "lengths": {"sigmaa": 1.0}}, r"lengths: unknown key\(s\) sigmaa"),
        ({"base": "P1", "tools": {"turns": 2, "retries": 1}}, "retries"),
        ({"base": "P9"}, "P9"),
        ({"lengths": {}}, "name"),
        ({"base": "P1", "server": 3}, "server: expected a mapping"),
        ({"base": "P1", "server": {"max_concurrent": -1}}, r"server\.max_concurrent"),
    ],
)
def test_from_dict_rejects(data, match):
    with pytest.raises(ConfigError, match=match):
        profile_from_dict(data)


def test_profile_rejects_wrong_section_type():
    with pytest.raises(ConfigError, match="lengths"):
        Profile(name="x", lengths=ServerModel())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="name"):
        Profile(name="")

"""Seeded draws: length model (group component, cap, drift), latencies, trainer time."""

from __future__ import annotations

import numpy as np
import pytest

from freshroll.sim import draws
from freshroll.sim.profiles import P2, LengthModel, RewardModel, ToolModel, TrainerModel


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_same_seed_same_draws_other_seed_other_draws():
    a = draws.completion_lengths(rng(7), P2.lengths, 50, 8, step=3)
    b = draws.completion_lengths(rng(7), P2.lengths, 50, 8, step=3)
    c = draws.completion_lengths(rng(8), P2.lengths, 50, 8, step=3)
    assert a.shape == (50, 8) and a.dtype == np.int64
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    r1 = draws.reward_latency(rng(1), P2.reward, 100)
    r2 = draws.reward_latency(rng(1), P2.reward, 100)
    assert np.array_equal(r1[0], r2[0]) and np.array_equal(r1[1], r2[1])


def test_drift_curve():
    lm = LengthModel(median_tokens=100.0, drift=0.5, drift_steps=100)
    assert draws.drift_factor(lm, 0) == 1.0
    assert draws.drift_factor(lm, -5) == 1.0
    assert draws.drift_factor(lm, 50) == pytest.approx(1.25)
    assert draws.drift_factor(lm, 100) == pytest.approx(1.5)
    assert draws.drift_factor(lm, 10_000) == pytest.approx(1.5)  # flat after drift_steps
    assert draws.median_tokens(lm, 100) == pytest.approx(150.0)


def test_median_and_log_sd_match_parameters():
    lm = LengthModel(median_tokens=400.0, sigma=0.4, prompt_share=0.5, cap_multiple=100.0)
    x = draws.completion_lengths(rng(), lm, 4000, 8).astype(float)
    assert np.median(x) == pytest.approx(400.0, rel=0.03)
    assert np.log(x).std() == pytest.approx(0.4, rel=0.05)


def test_sigma_split_between_prompt_and_sample():
    lm = LengthModel(median_tokens=1000.0, sigma=1.0, prompt_share=0.25, cap_multiple=1000.0)
    logs = np.log(draws.completion_lengths(rng(), lm, 4000, 8).astype(float))
    within = logs.var(axis=1, ddof=1).mean()  # sigma_s^2 = 0.75
    between = logs.mean(axis=1).var(ddof=1) - within / 8  # sigma_p^2 = 0.25
    assert within == pytest.approx(0.75, rel=0.05)
    assert between == pytest.approx(0.25, rel=0.1)
    same = draws.completion_lengths(rng(), LengthModel(sigma=1.0, prompt_share=1.0), 20, 4)
    assert (same == same[:, :1]).all()  # all of the variance is the prompt's


def test_cap_and_floor():
    lm = LengthModel(median_tokens=10.0, sigma=2.0, cap_multiple=3.0, drift=1.0, drift_steps=10)
    x = draws.completion_lengths(rng(), lm, 500, 8, step=0)
    assert x.min() >= 1 and x.max() == draws.length_cap(lm) == 30
    # the cap is max_new_tokens, fixed at step 0's median: drift makes more samples hit it
    later = draws.completion_lengths(rng(), lm, 500, 8, step=10)
    assert later.max() == 30 and (later == 30).mean() > (x == 30).mean()


def test_prompt_lengths():
    p = draws.prompt_lengths(rng(), LengthModel(prompt_tokens=200.0, prompt_sigma=0.0), 5)
    assert p.tolist() == [200] * 5


def test_timeouts():
    fast = RewardModel(median_s=0.1, sigma=0.5, timeout_p=0.0, timeout_s=1e4)
    t, out = draws.reward_latency(rng(), fast, 10_000)
    assert not out.any() and np.median(t) == pytest.approx(0.1, rel=0.05)
    tools = ToolModel(turns=2, median_s=1.0, sigma=0.8, timeout_p=0.05, timeout_s=30.0)
    t, out = draws.tool_latency(rng(), tools, 20_000)
    assert t.max() == 30.0 and np.array_equal(out, t >= 30.0)
    assert out.mean() == pytest.approx(0.05 + 0.95 * 1.0e-5, abs=0.006)  # hangs + rare slow ones


def test_trainer_time():
    tr = TrainerModel(step_s=2.0, s_per_token=1e-4)
    assert draws.trainer_step_s(tr, 0) == 2.0
    assert draws.trainer_step_s(tr, 10_000) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        draws.trainer_step_s(tr, -1)


@pytest.mark.parametrize(("length", "turns"), [(10, 4), (3, 4), (1, 1), (8, 8), (1000, 7)])
def test_split_turns(length, turns):
    seg = draws.split_turns(length, turns)
    assert sum(seg) == length and len(seg) == min(length, turns)
    assert min(seg) >= 1 and max(seg) - min(seg) <= 1


def test_lengths_from_normals_is_the_formula():
    lm = LengthModel(median_tokens=100.0, sigma=1.0, prompt_share=0.36, cap_multiple=4.0,
                     drift=0.5, drift_steps=10)
    z_g, z_gi = np.array([0.0, 1.0]), np.array([[0.0, 1.0], [-1.0, 10.0]])
    # sigma_p = 0.6, sigma_s = 0.8; median at step 5 = 125; cap = 400
    expected = [[125, round(125 * np.exp(0.8))], [round(125 * np.exp(0.6 - 0.8)), 400]]
    assert draws.lengths_from_normals(lm, z_g, z_gi, step=5).tolist() == expected

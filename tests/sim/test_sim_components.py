"""build_sim from the config: profile overrides (bad keys named), the engine factory, the
simulated scorer (latency, hangs, per-group success) and trainer (c0 + c1 x tokens, speed)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from freshroll.clock import VirtualClock
from freshroll.config import Config
from freshroll.engines.base import Completion
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import ConfigError
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import RewardVersion
from freshroll.ports.seams import AsyncScorer, AsyncTrainer
from freshroll.rewards.calling import RewardState
from freshroll.rewards.tasks import Prompt
from freshroll.sim.components import build_sim, resolve_profile, sim_model_digest
from freshroll.sim.engine import SimEngine
from freshroll.sim.profiles import P2


def config(**sim: Any) -> Config:
    return Config.model_validate({"rollout": {"engine": "sim"}, "sim": sim})


class FakeBuffer:
    """What the simulated trainer reads: ``sample_info(sid) -> (reward, policy step)``."""

    def __init__(self, step: int = 0, reward: float = 1.0) -> None:
        self.step, self.value = step, reward

    def sample_info(self, sample: str) -> tuple[float, int]:
        return self.value, self.step


def build(cfg: Config, buf: Any = None) -> Any:
    return build_sim(cfg, VirtualClock(), buf or FakeBuffer())


def test_build_sim_returns_the_parts_behind_the_seams():
    parts = build(config(profile="P3", params={"lengths": {"median_tokens": 500}}))
    assert parts.profile.name == "P3" and parts.profile.lengths.median_tokens == 500
    assert parts.profile.tools.turns == 4  # the rest of P3 stays
    assert isinstance(parts.scorer, AsyncScorer) and isinstance(parts.trainer, AsyncTrainer)
    assert parts.model_digest.startswith("sim-")
    assert parts.scorer.names == ("sim",)
    RewardVersion.parse(parts.scorer.version)


def test_model_digest_follows_the_profile_and_the_sim_settings_but_not_the_clock():
    digest = build(config()).model_digest
    assert build(config()).model_digest == digest
    assert build(config(clock="real")).model_digest == digest
    assert build(config(profile="P1")).model_digest != digest
    assert build(config(params={"server": {"max_concurrent": 64}})).model_digest != digest
    assert build(config(trainer_speed=[[5, 2.0]])).model_digest != digest
    assert sim_model_digest(config()) == digest


@pytest.mark.parametrize(("params", "named"), [
    ({"lengths": {"bogus": 1}}, "sim.params.lengths: unknown key(s) bogus"),
    ({"bogus": {}, "description": "x"}, "sim.params: unknown key(s) bogus, description"),
    ({"lengths": {"sigma": 9.0}}, "sim.params.lengths.sigma"),
    ({"base": "P1"}, "sim.params.base"),
    ({"server": 3}, "sim.params.server"),
])
def test_bad_sim_params_are_a_config_error_naming_the_key(params, named):
    with pytest.raises(ConfigError, match=r"sim\.params") as info:
        build(config(params=params))
    assert named in str(info.value)


def test_unknown_profile_and_bad_trainer_speed_are_config_errors():
    with pytest.raises(ConfigError, match="P9"):
        resolve_profile(config(profile="P9").sim)
    with pytest.raises(ConfigError, match=r"sim.trainer_speed\[1\]"):
        build(config(trainer_speed=[[5, 2.0], [3, 1.0]]))
    with pytest.raises(ConfigError, match=r"sim.trainer_speed\[0\].*factor"):
        build(config(trainer_speed=[[5, 0.0]]))


def test_engine_factory_sleeps_worker_start_s_times_time_scale():
    parts = build(config(worker_start_s=8.0, time_scale=0.5, transfer_s=2.0))
    clock = VirtualClock()

    async def main() -> tuple[AsyncEngine, float, float]:
        engine = await parts.engine_factory("w3")
        started = clock.now()
        seconds = await engine.load_weights(1)
        return engine, started, seconds

    engine, started, seconds = clock.run(main())
    assert isinstance(engine, SimEngine) and engine.name == "w3"
    assert started == 4.0 and seconds == 1.0


def comps(samples: list[str], reason: str = "stop") -> list[Completion]:
    return [Completion((), (), (), s, reason, 1.0, 10) for s in samples]


def prompts(n: int) -> list[Prompt]:
    return [Prompt("p0", "") for _ in range(n)]


def test_scorer_waits_the_slowest_member_and_scores_per_group_success():
    parts = build(config(profile="P2"))
    scorer, draws = parts.scorer, parts.draws
    samples = [f"g{g}.{m}#0" for g in range(400) for m in range(8)]
    clock = VirtualClock()

    async def main() -> tuple[list[Any], float]:
        scores = await scorer.score(prompts(8), comps(samples[:8]), RewardState())
        first = clock.now()
        scores += await scorer.score(prompts(len(samples) - 8), comps(samples[8:]), RewardState())
        return scores, first

    scores, first = clock.run(main())
    assert first == max(draws.reward_s(s) for s in samples[:8])
    values = np.array([s.value for s in scores]).reshape(400, 8)
    assert set(np.unique(values)) <= {0.0, 1.0}
    assert all(s.components == {"sim": s.value} and s.error is None for s in scores)
    mixed = np.mean([0 < row.mean() < 1 for row in values])
    assert mixed > 0.6  # GRPO groups have variance
    p = np.array([draws.success_p(f"g{g}") for g in range(400)])
    assert np.corrcoef(p, values.mean(axis=1))[0, 1] > 0.7
    assert 0.4 < values.mean() < 0.6  # p_g ~ Beta(1, 1)


def test_scorer_is_deterministic_and_a_capped_completion_fails():
    parts = build(config())
    samples = [f"g{g}.0#0" for g in range(50)]

    async def score(reason: str) -> list[float | None]:
        out = await parts.scorer.score(prompts(50), comps(samples, reason), RewardState())
        return [s.value for s in out]

    once, again = VirtualClock().run(score("stop")), VirtualClock().run(score("stop"))
    assert once == again and 0 < sum(v or 0 for v in once) < 50
    assert VirtualClock().run(score("length")) == [0.0] * 50


def test_a_hung_reward_call_outlasts_the_pipeline_timeout():
    cfg = config(params={"reward": {"timeout_p": 1.0}})
    parts = build(cfg)
    clock = VirtualClock()

    async def main() -> bool:
        try:
            async with asyncio.timeout(cfg.limits.reward_timeout_s):
                await parts.scorer.score(prompts(2), comps(["g0.0#0", "g0.1#0"]), RewardState())
        except TimeoutError:
            return True
        return False

    assert clock.run(main()) and clock.now() == cfg.limits.reward_timeout_s
    assert parts.scorer.hung == 1


def lease(version: int, samples: list[str]) -> Lease:
    groups = tuple(sorted({s.partition(".")[0] for s in samples}))
    return Lease("l0", version, groups, tuple(samples))  # type: ignore[arg-type]


def test_trainer_sleeps_c0_plus_c1_tokens_of_what_the_engine_generated():
    cfg = config(profile="P3", time_scale=0.5)
    parts = build(cfg, FakeBuffer(step=30, reward=0.5))
    samples = [f"g{g}.{m}#1" for g in range(3) for m in range(8)]
    clock = VirtualClock()
    tokens = sum(
        parts.draws.shape(s.partition(".")[0], s, 30).context_tokens for s in samples
    )

    async def main() -> tuple[dict[str, float], str]:
        return await parts.trainer.step(lease(4, samples))

    metrics, digest = clock.run(main())
    t = P2.trainer
    assert metrics["tokens"] == tokens
    assert metrics["train_s"] == (t.step_s + t.s_per_token * tokens) * 0.5 == clock.now()
    assert metrics["loss"] == 0.0 and metrics["reward_mean"] == 0.5
    assert parts.trainer.weights() == 5
    again = VirtualClock().run(build(cfg, FakeBuffer(step=30)).trainer.step(lease(4, samples)))
    assert again[1] == digest  # deterministic lineage
    other = VirtualClock().run(parts.trainer.step(lease(5, samples)))
    assert other[1] != digest


def test_trainer_speed_changes_the_step_time_from_the_given_step_on():
    parts = build(config(trainer_speed=[[5, 2.0], [9, 0.5]]))
    samples = ["g0.0#0", "g0.1#0"]

    def train_s(version: int) -> float:
        return VirtualClock().run(parts.trainer.step(lease(version, samples)))[0]["train_s"]

    base = train_s(0)
    assert train_s(3) == base  # step 4
    assert train_s(4) == base / 2  # step 5 on: twice as fast
    assert train_s(7) == base / 2
    assert train_s(8) == base * 2  # step 9 on: half as fast
    assert parts.trainer.settings_digest == build(
        config(trainer_speed=[[5, 2.0], [9, 0.5]])).trainer.settings_digest


def test_a_whole_group_through_engine_scorer_and_trainer():
    parts = build(config(profile="P1", worker_start_s=1.0))
    clock = VirtualClock()

    async def main() -> tuple[list[Completion], list[Any], dict[str, float]]:
        engine = await parts.engine_factory("w0")
        requests = [GenRequest(f"g0.{m}#0", "g0", "p0", "", 0) for m in range(8)]
        got: dict[int, Completion] = {}
        await engine.generate(requests, SamplingParams(4), 0, got.__setitem__)
        done = [got[i] for i in range(8)]
        scores = await parts.scorer.score(prompts(8), done, RewardState())
        metrics, _ = await parts.trainer.step(lease(0, [r.sample for r in requests]))
        await engine.close()
        return done, scores, metrics

    done, scores, metrics = clock.run(main())
    assert metrics["tokens"] == sum(
        c.tokens + parts.draws.prompt_tokens("g0") for c in done
    )
    assert len(scores) == 8


"""Builds the simulated cluster of ``rollout.engine: sim`` from the config.

:func:`build_sim` resolves the profile (``sim.profile`` with ``sim.params``
overrides, unknown keys rejected) and returns the parts the pipeline awaits:
an engine factory, the scorer and the trainer (:mod:`freshroll.sim.engine`,
:mod:`~freshroll.sim.scorer`, :mod:`~freshroll.sim.trainer`), all sharing one
:class:`~freshroll.sim.keyed.KeyedDraws` of the profile under ``run.seed``.

Every part sleeps on the running event loop (``asyncio.sleep`` or a loop timer)
and never on a thread, so under a :class:`~freshroll.clock.VirtualClock` a run
takes no real time; every simulated duration is multiplied by ``sim.time_scale``.
``rollout.max_new_tokens`` is not used: the profile's cap applies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from freshroll.clock import Clock
from freshroll.config import Config
from freshroll.config.rollout import SimSection
from freshroll.engines.seams import AsyncEngine, EngineFactory
from freshroll.errors import ConfigError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.lineage import digest_json
from freshroll.sim.engine import SimEngine
from freshroll.sim.keyed import KeyedDraws
from freshroll.sim.profiles import KV_CAPACITY_DEFAULT, Profile, get_profile, profile_from_dict
from freshroll.sim.scorer import SimScorer
from freshroll.sim.trainer import SimTrainer, check_speed

#: the profile sections ``sim.params`` may override
SECTIONS = ("lengths", "server", "reward", "tools", "trainer")

#: a hung reward call sleeps this many times limits.reward_timeout_s (the pipeline's
#: timeout fires long before)
HANG_FACTOR = 100.0


@dataclass(frozen=True)
class SimParts:
    """What :func:`build_sim` returns."""

    engine_factory: EngineFactory
    scorer: SimScorer
    trainer: SimTrainer
    model_digest: str  # "sim-<digest of the resolved profile and the sim settings>"
    profile: Profile
    draws: KeyedDraws

    def close(self) -> None:
        """Nothing to release (no threads, no files); for symmetry with the real parts."""


def resolve_profile(sim: SimSection) -> Profile:
    """``sim.profile`` with ``sim.params`` applied; a ConfigError names ``sim.params.<key>``."""
    params: Mapping[str, Any] = sim.params
    get_profile(sim.profile)  # "profile: unknown profile ..."
    for key in ("base", "name"):
        if key in params:
            raise ConfigError(f"sim.params.{key}: not an override (set sim.profile instead)")
    unknown = sorted(set(params) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"sim.params: unknown key(s) {', '.join(map(str, unknown))} "
            f"(allowed: {', '.join(SECTIONS)})"
        )
    try:
        return profile_from_dict({"base": sim.profile, **params})
    except ConfigError as exc:
        raise ConfigError(f"sim.params.{exc}") from None
    except TypeError as exc:  # e.g. a section given as a list
        raise ConfigError(f"sim.params: {exc}") from None


def model_digest(profile: Profile, sim: SimSection) -> str:
    """A digest of the resolved profile and every sim setting but the clock."""
    settings = {
        "time_scale": sim.time_scale, "worker_start_s": sim.worker_start_s,
        "transfer_s": sim.transfer_s, "trainer_speed": [list(e) for e in sim.trainer_speed],
    }
    resolved = asdict(profile)
    if profile.server.kv_capacity_tokens == KV_CAPACITY_DEFAULT:  # older runs' digests stay
        del resolved["server"]["kv_capacity_tokens"]
    return "sim-" + digest_json({"profile": resolved, "sim": settings})


def sim_model_digest(cfg: Config) -> str:
    """:func:`model_digest` of ``cfg`` (what :func:`build_sim` puts in ``SimParts``), for a
    caller that needs the root of the lineage before the buffer exists."""
    return model_digest(resolve_profile(cfg.sim), cfg.sim)


def build_sim(cfg: Config, clock: Clock, buf: SampleBuffer) -> SimParts:
    """The simulated engines, scorer and trainer of ``cfg`` (``clock`` is the run's: the
    parts time themselves by the running loop, which that clock drives)."""
    sim = cfg.sim
    profile = resolve_profile(sim)
    speed = check_speed(sim.trainer_speed)
    digest = model_digest(profile, sim)
    draws = KeyedDraws(profile, cfg.run.seed)
    scale = sim.time_scale

    async def engine_factory(name: str) -> AsyncEngine:
        await asyncio.sleep(sim.worker_start_s * scale)
        return SimEngine(name, draws, time_scale=scale, transfer_s=sim.transfer_s,
                         on_update=cfg.rollout.on_update)

    scorer = SimScorer(
        draws, time_scale=scale, hang_s=HANG_FACTOR * cfg.limits.reward_timeout_s,
        concurrency=sim.reward_workers, max_batch=cfg.rollout.group_size,
    )
    trainer = SimTrainer(draws, buf, model_digest=digest, time_scale=scale, speed=speed)
    return SimParts(engine_factory, scorer, trainer, digest, profile, draws)


__all__ = [
    "HANG_FACTOR", "SECTIONS", "SimParts", "build_sim", "model_digest", "resolve_profile",
    "sim_model_digest",
]

"""The simulated trainer: sleeps ``c0 + c1 x tokens`` per step, trains nothing.

A :class:`SimTrainer` is an :class:`~freshroll.ports.seams.AsyncTrainer`. The
step that trains from policy version ``s`` to ``s + 1`` (its *step number* is
``k = s + 1``, the step it commits) takes::

    tokens  = sum over the lease's samples of prompt + completion + tool-output tokens
    train_s = (trainer.step_s + trainer.s_per_token x tokens) / speed(k) x time_scale
    speed(k) = the factor of the last sim.trainer_speed entry [step, factor] with step <= k
               (1.0 before the first)

A sample's tokens are recomputed from the keyed draws (:mod:`freshroll.sim.keyed`)
at the policy step the buffer recorded for it (``SampleBuffer.sample_info``), so
they equal what the simulated engine generated without the two sharing state.
The new weights' digest is ``digest_of(model_digest, k, sorted sample ids)``:
deterministic, so two runs with the same batches give the same lineage.
``weights()`` is the step number of the last trained step: the token the
simulated engines "load".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import asdict

from freshroll.engines.weights import SimWeights
from freshroll.errors import ConfigError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion, digest_json, digest_of
from freshroll.sim.draws import trainer_step_s
from freshroll.sim.keyed import KeyedDraws


def check_speed(speed: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Validate ``sim.trainer_speed``: steps >= 0 and strictly increasing, factors > 0."""
    out: list[tuple[int, float]] = []
    for i, entry in enumerate(speed):
        step, factor = entry
        name = f"sim.trainer_speed[{i}]"
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{name}: step must be an integer >= 0, got {step!r}")
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"{name}: factor must be a finite number > 0, got {factor!r}")
        if out and step <= out[-1][0]:
            raise ConfigError(f"{name}: steps must increase, got {step} after {out[-1][0]}")
        out.append((step, float(factor)))
    return tuple(out)


def speed_at(speed: Sequence[tuple[int, float]], step: int) -> float:
    """The factor in force at step number ``step`` (1.0 before the first entry)."""
    factor = 1.0
    for at, f in speed:
        if at > step:
            break
        factor = f
    return factor


class SimTrainer:
    """The learner of the simulated cluster (see the module docstring)."""

    def __init__(
        self, draws: KeyedDraws, buf: SampleBuffer, *, model_digest: str,
        time_scale: float = 1.0, speed: Sequence[tuple[int, float]] = (),
    ) -> None:
        self.draws = draws
        self._buf = buf
        self._model_digest = model_digest
        self._scale = time_scale
        self._speed = check_speed(speed)
        self.settings_digest = digest_json({
            "sim_trainer": asdict(draws.profile.trainer), "speed": self._speed,
        })
        self._step = 0

    def step_seconds(self, step: int, tokens: int) -> float:
        """``train_s`` of step number ``step`` over ``tokens`` tokens (clock seconds)."""
        base = trainer_step_s(self.draws.profile.trainer, tokens)
        return base / speed_at(self._speed, step) * self._scale

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        step = lease.version + 1
        tokens = 0
        reward = 0.0
        for sid in lease.samples:
            value, gen_step = self._buf.sample_info(sid)
            tokens += self.draws.context_tokens(sid, gen_step)
            reward += value
        seconds = self.step_seconds(step, tokens)
        await asyncio.sleep(seconds)
        self._step = step
        n = len(lease.samples)
        metrics = {
            "train_s": seconds, "loss": 0.0, "tokens": float(tokens),
            "reward_mean": reward / n if n else 0.0,
        }
        return metrics, digest_of(self._model_digest, str(step), *sorted(lease.samples))

    async def before_commit(self, version: PolicyVersion) -> None:
        """Nothing to write ahead: the simulated weights are the step number."""

    def weights(self) -> SimWeights:
        return self._step


__all__ = ["SimTrainer", "check_speed", "speed_at"]

"""A latency model of an RL rollout cluster: inference servers, reward stage, tools, trainer.

Pure and seeded: every draw comes from a ``numpy.random.Generator`` the caller
passes, and nothing reads a clock; the model computes durations, which a
simulated engine then sleeps on the run's :class:`~freshroll.clock.Clock`
(on a :class:`~freshroll.clock.VirtualClock` a sleep is a jump).

- :mod:`~freshroll.sim.profiles`  parameters (frozen, validated) and the profiles P1, P2, P3
- :mod:`~freshroll.sim.draws`     lengths with drift and cap, reward/tool latency, trainer time
- :mod:`~freshroll.sim.batching`  the continuous-batching server, exact and event-skipping
  (:mod:`~freshroll.sim.batch_state`: its state and every read of it)
- :mod:`~freshroll.sim.timelines` that server's timelines for known arrivals (one or more turns)
- :mod:`~freshroll.sim.calibrate` the figures that pin each profile to its documentation
- :mod:`~freshroll.sim.keyed`     the draws keyed by run seed and sample / group id
- :mod:`~freshroll.sim.engine`, :mod:`~freshroll.sim.scorer`, :mod:`~freshroll.sim.trainer`
  the simulated parts behind the pipeline's seams (``rollout.engine: sim``), built by
  :func:`freshroll.sim.components.build_sim` (not imported here: they need the engine types)

docs/simulation.md describes the model and the measured calibration.
"""

from freshroll.sim.batching import ContinuousBatcher, Finished
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
from freshroll.sim.timelines import (
    BatchTimes,
    Rollout,
    RolloutTimes,
    simulate_batch,
    simulate_rollouts,
)

__all__ = [
    "P1",
    "P2",
    "P3",
    "PROFILES",
    "BatchTimes",
    "ContinuousBatcher",
    "Finished",
    "LengthModel",
    "Profile",
    "RewardModel",
    "Rollout",
    "RolloutTimes",
    "ServerModel",
    "ToolModel",
    "TrainerModel",
    "get_profile",
    "profile_from_dict",
    "simulate_batch",
    "simulate_rollouts",
]

"""Parameters of the simulated workload: lengths, server, reward, tools, trainer; three profiles.

A :class:`Profile` is a frozen record of five frozen sections. Every field has
a documented unit and bounds; constructing a section out of bounds raises
:class:`~freshroll.errors.ConfigError` naming the field (``lengths.sigma: ...``).
:func:`profile_from_dict` builds one from a config mapping, on top of a named
base profile, and rejects unknown keys.

The formulas that use these parameters are in :mod:`freshroll.sim.draws`
(lengths, latencies, trainer time) and :mod:`freshroll.sim.batching` (the
continuous-batching server). The three profiles (figures measured by
``benchmarks/sim_calibration.py``, documented in docs/simulation.md)::

    P1  low tail    sigma 0.4 (half prompt, half sample), cap 8 x median, no drift
    P2  reasoning   sigma 1.0 (half prompt, half sample), cap 16 x median,
                    median +50% over 100 policy steps
    P3  agentic     P2's lengths split over 4 turns, with a tool call between turns:
                    lognormal tool latency (median 1 s, sigma 0.8), 5% of calls time out (30 s)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from freshroll.errors import ConfigError


def _f(default: float, lo: float, hi: float, *, open_lo: bool = False) -> Any:
    """A float field with bounds [lo, hi] (or (lo, hi] when ``open_lo``)."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "open_lo": open_lo})


def _i(default: int, lo: int, hi: int) -> Any:
    """An int field with bounds [lo, hi]."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "int": True})


def _validate(obj: object, section: str) -> None:
    for f in fields(obj):  # type: ignore[arg-type]  # obj: a profile dataclass
        meta = f.metadata
        if "lo" not in meta:
            continue
        name = f"{section}.{f.name}"
        value = getattr(obj, f.name)
        if meta.get("int"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}: expected an integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        elif not math.isfinite(value):
            raise ConfigError(f"{name}: must be finite, got {value!r}")
        lo, hi = meta["lo"], meta["hi"]
        low_ok = value > lo if meta.get("open_lo") else value >= lo
        if not (low_ok and value <= hi):
            bracket = "(" if meta.get("open_lo") else "["
            raise ConfigError(f"{name}: must be in {bracket}{lo}, {hi}], got {value!r}")


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Completion and prompt lengths (tokens); formulas in :mod:`freshroll.sim.draws`."""

    median_tokens: float = _f(300.0, 1.0, 1e6)  # median completion length at policy step 0
    sigma: float = _f(0.4, 0.0, 3.0)  # total log-sd of a completion length
    prompt_share: float = _f(0.5, 0.0, 1.0)  # share of sigma**2 shared by a group (same prompt)
    cap_multiple: float = _f(8.0, 1.0, 1e3)  # max_new_tokens = cap_multiple x median at step 0
    drift: float = _f(0.0, -0.9, 10.0)  # relative growth of the median at drift_steps
    drift_steps: int = _i(100, 1, 10**9)  # policy steps over which the drift ramps linearly
    prompt_tokens: float = _f(256.0, 0.0, 1e6)  # median prompt length
    prompt_sigma: float = _f(0.3, 0.0, 3.0)  # log-sd of prompt lengths

    def __post_init__(self) -> None:
        _validate(self, "lengths")


#: the default KV capacity of a simulated server (tokens): no profile here comes near it
KV_CAPACITY_DEFAULT = 10**9


@dataclass(frozen=True, slots=True)
class ServerModel:
    """One continuous-batching inference server; see :mod:`freshroll.sim.batching`."""

    step_s: float = _f(0.02, 0.0, 60.0, open_lo=True)  # t0: fixed cost of one decode step
    step_s_per_seq: float = _f(1e-4, 0.0, 60.0)  # t1: added cost per active sequence
    prefill_s_per_token: float = _f(2e-5, 0.0, 60.0)  # prefill time per prompt token
    max_concurrent: int = _i(256, 1, 10**6)  # slots: sequences decoding or prefilling at once
    #: KV cache (tokens) the sequences holding a slot share; past it the newest is preempted
    #: and recomputed. The default (1e9) is far above what any profile here holds (~8e6 at
    #: 256 slots): they never preempt. A real 80 GB GPU holds ~1e5-1e6 tokens of a 7B model.
    kv_capacity_tokens: int = _i(KV_CAPACITY_DEFAULT, 1, 10**15)

    def __post_init__(self) -> None:
        _validate(self, "server")


@dataclass(frozen=True, slots=True)
class RewardModel:
    """Reward latency: lognormal, abandoned at ``timeout_s``; ``timeout_p`` of calls hang."""

    median_s: float = _f(0.05, 0.0, 3600.0)
    sigma: float = _f(0.5, 0.0, 3.0)
    timeout_p: float = _f(0.0, 0.0, 1.0)  # probability that a call never answers
    timeout_s: float = _f(10.0, 0.0, 86400.0, open_lo=True)

    def __post_init__(self) -> None:
        _validate(self, "reward")


@dataclass(frozen=True, slots=True)
class ToolModel:
    """Multi-turn tool calls (P3); ``turns = 1`` is a single-turn rollout without tools."""

    turns: int = _i(1, 1, 1000)  # generation segments per sample; a tool call between two
    median_s: float = _f(1.0, 0.0, 3600.0)  # tool latency median
    sigma: float = _f(0.8, 0.0, 3.0)
    timeout_p: float = _f(0.05, 0.0, 1.0)  # probability that a tool call hangs
    timeout_s: float = _f(30.0, 0.0, 86400.0, open_lo=True)  # a tool call is abandoned here
    output_tokens: int = _i(64, 0, 10**6)  # tokens a tool result adds (prefilled next turn)

    def __post_init__(self) -> None:
        _validate(self, "tools")


@dataclass(frozen=True, slots=True)
class TrainerModel:
    """Trainer step time ``c0 + c1 x tokens`` (prompt + completion tokens of the batch)."""

    step_s: float = _f(2.0, 0.0, 86400.0)  # c0
    s_per_token: float = _f(2e-5, 0.0, 60.0)  # c1

    def __post_init__(self) -> None:
        _validate(self, "trainer")


_SECTIONS: dict[str, type[Any]] = {
    "lengths": LengthModel,
    "server": ServerModel,
    "reward": RewardModel,
    "tools": ToolModel,
    "trainer": TrainerModel,
}


@dataclass(frozen=True, slots=True)
class Profile:
    """A named simulated workload."""

    name: str
    description: str = ""
    lengths: LengthModel = field(default_factory=LengthModel)
    server: ServerModel = field(default_factory=ServerModel)
    reward: RewardModel = field(default_factory=RewardModel)
    tools: ToolModel = field(default_factory=ToolModel)
    trainer: TrainerModel = field(default_factory=TrainerModel)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"name: expected a non-empty string, got {self.name!r}")
        for key, cls in _SECTIONS.items():
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"{key}: expected a {cls.__name__}")


P1 = Profile(
    name="P1",
    description="low tail: lognormal lengths, sigma 0.4, cap 8 x median, no drift",
    lengths=LengthModel(median_tokens=300.0, sigma=0.4, prompt_share=0.5, cap_multiple=8.0),
)

P2 = Profile(
    name="P2",
    description=(
        "reasoning: sigma 1.0 split evenly between prompt and sample, cap 16 x median, "
        "median +50% over 100 policy steps"
    ),
    lengths=LengthModel(
        median_tokens=1000.0, sigma=1.0, prompt_share=0.5, cap_multiple=16.0,
        drift=0.5, drift_steps=100,
    ),
    reward=RewardModel(median_s=0.2, sigma=0.8, timeout_p=0.001, timeout_s=10.0),
)

P3 = replace(
    P2,
    name="P3",
    description=(
        "agentic: P2's lengths over 4 turns with a tool call between turns "
        "(lognormal latency, median 1 s, sigma 0.8; 5% time out at 30 s)"
    ),
    tools=ToolModel(turns=4, median_s=1.0, sigma=0.8, timeout_p=0.05, timeout_s=30.0),
)

PROFILES: dict[str, Profile] = {p.name: p for p in (P1, P2, P3)}


def get_profile(name: str) -> Profile:
    """One of the documented profiles by name (``P1``, ``P2``, ``P3``)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"profile: unknown profile {name!r} (known: {', '.join(PROFILES)})"
        ) from None


def profile_from_dict(data: Mapping[str, Any]) -> Profile:
    """Build a profile from a config mapping, rejecting unknown keys.

    ``{"base": "P2", "name": "P2-short", "lengths": {"median_tokens": 500}}`` is P2
    with a shorter median; without ``base`` the defaults of each section apply.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"sim profile: expected a mapping, got {type(data).__name__}")
    allowed = {"base", "name", "description", *_SECTIONS}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"sim profile: unknown key(s) {', '.join(map(str, unknown))} "
            f"(allowed: {', '.join(sorted(allowed))})"
        )
    base = get_profile(data["base"]) if "base" in data else None
    name = data.get("name", base.name if base else None)
    if name is None:
        raise ConfigError("name: required when no base profile is given")
    sections: dict[str, Any] = {}
    for key, cls in _SECTIONS.items():
        current = getattr(base, key) if base else cls()
        overrides = data.get(key, {})
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(overrides).__name__}")
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ConfigError(
                f"{key}: unknown key(s) {', '.join(map(str, bad))} "
                f"(allowed: {', '.join(sorted(known))})"
            )
        sections[key] = replace(current, **overrides)
    description = data.get("description", base.description if base else "")
    return Profile(name=name, description=description, **sections)

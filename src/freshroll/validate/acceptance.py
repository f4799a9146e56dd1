"""``ACCEPTANCE.yaml``: what a run must show to be accepted (validated, unknown keys rejected).

An acceptance file names a workload (a config plus overrides), the repeats (fixed seeds) and
the gates, each with its threshold::

    config: ../configs/default.yaml      # relative to this file's folder; unset: the default
    overrides: {run.steps: 200}          # dotted config keys over that config
    seeds: 3                             # a count (seeds 0, 1, 2) or a list: [0, 7, 11]
    gates:
      accepted_per_s: {min: 500, min_ratio_to_sync: 1.0}
      discard_rate: {max: 0.2}
      lag_p99: {max: max_staleness}      # a number, or the config's run.max_staleness
      lag_max: {max: max_staleness}
      trainer_idle_ratio: {max: 0.10}
      recovery:                          # freshroll chaos cases, one per scenario x seed
        plan: ../chaos/library.yaml      # a fault plan file (relative to this file's folder)
        scenarios: [worker-kill, worker-stall]
        max_s: 60                        # seconds of the plan's run clock
      convergence:                       # reward at equal steps vs the synchronous baseline
        last_steps: 50
        tolerance: 0.05                  # absolute, and/or
        tolerance_sd: 2.0                # in standard deviations of the baseline across seeds

How each gate is read (the figures are those of :mod:`freshroll.figures.metrics`, from each repeat's
``summary.json``): a threshold is met by every repeat (the worst repeat is compared), except
convergence, whose figure is a mean over seeds (:mod:`freshroll.validate.gates`). The
``verify`` gate is always on: every repeat must finish its steps and pass ``freshroll verify``.

The synchronous baseline is the same workload with ``run.max_staleness = 0`` and the same
seeds; it runs when a gate needs it (``min_ratio_to_sync``, ``convergence``).

Errors are :class:`~freshroll.errors.ConfigError` naming the file and the key
(``acceptance/x.yaml: gates.discard_rate.max: Input should be less than or equal to 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from freshroll.config import Config, parse_mapping, read_yaml, resolve_paths, set_dotted, validate
from freshroll.config.base import SEED_MAX, Section
from freshroll.config.yamlfile import read_yaml_file
from freshroll.errors import ConfigError

#: a lag threshold may name the config's freshness bound instead of a number
MAX_STALENESS = "max_staleness"
#: the most repeats one acceptance file may ask for
MAX_REPEATS = 1_000


class _Strict(Section):
    """The config's rules: unknown keys refused, no NaN, no boolean for a number."""


class Throughput(_Strict):
    """Accepted rollouts/s (:func:`freshroll.figures.metrics.accepted_rollouts_per_s`), each
    repeat."""

    min: float | None = Field(None, ge=0, description="accepted rollouts/s, at least")
    min_ratio_to_sync: float | None = Field(
        None, gt=0, le=1_000, description="async / sync accepted rollouts/s (same seed), at least")

    @model_validator(mode="after")
    def _some(self) -> Throughput:
        if self.min is None and self.min_ratio_to_sync is None:
            raise ValueError("give min and/or min_ratio_to_sync")
        return self


class AtMostRatio(_Strict):
    max: float = Field(ge=0, le=1, description="a ratio in [0, 1], at most")


class AtMostLag(_Strict):
    max: float | Literal["max_staleness"] = Field(
        description="policy versions, at most (or max_staleness: the config's run.max_staleness)")

    @model_validator(mode="after")
    def _nonneg(self) -> AtMostLag:
        if isinstance(self.max, float | int) and self.max < 0:
            raise ValueError("max: must be >= 0")
        return self

    def resolve(self, max_staleness: int) -> float:
        return float(max_staleness) if self.max == MAX_STALENESS else float(self.max)


class AtMostBias(_Strict):
    """The sample bias of each async repeat (``summary.json`` ``sample_bias.divergence``,
    :mod:`freshroll.figures.bias`): the largest of |length bias|, |reward bias| (in reward
    std), 1 - prompt coverage and the version mix's distance, at most ``max``."""

    max: float = Field(gt=0, le=1e3, description="the largest divergence, at most")


class Learning(_Strict):
    """What each async repeat's own learning signals say (``summary.json`` ``learning``,
    :mod:`freshroll.figures.learning`): how many repeats collapsed, and how far the policy
    moved from the one that sampled its stale batches."""

    max_collapses: int = Field(0, ge=0, le=MAX_REPEATS,
                               description="async repeats whose policy collapsed, at most")
    max_mismatch_kl: float | None = Field(
        None, gt=0, le=1e3, description="the stale steps' mean mismatch KL (behaviour vs "
        "proximal, k3), at most, on every repeat (unset: not gated)")


class Recovery(_Strict):
    """Recovery time under fault plans: one chaos case per scenario x seed."""

    plan: str = Field(description="a fault plan file, relative to the acceptance file's folder")
    scenarios: list[str] = Field(min_length=1, description="scenario names of the plan")
    max_s: float = Field(gt=0, le=1e7, description="seconds from the first fault until "
                         "accepted rollouts/s is back to >= 80% of the fault-free run, at most")
    placement: Literal["sim", "inline", "ray"] = Field(
        "sim", description="sim: the plan's simulated workload in virtual time")
    seeds: int | list[int] | None = Field(
        None, description="seeds of the chaos cases (unset: the acceptance's seeds)")

    @model_validator(mode="after")
    def _unique(self) -> Recovery:
        if len(set(self.scenarios)) != len(self.scenarios):
            raise ValueError("scenarios: a scenario is named twice")
        return self


class Convergence(_Strict):
    """Reward at equal steps against the synchronous baseline (same config, max_staleness 0).

    The figure: per run, the mean of ``metrics.jsonl``'s ``reward_mean`` over the last
    ``last_steps`` committed steps (the same steps for both runs: each commits ``run.steps``).
    Per seed the difference async - sync; the gate reads the mean difference over seeds and
    passes when it is >= -tolerance (``two_sided``: when its absolute value is <= tolerance).
    ``tolerance`` = the larger of ``tolerance`` and ``tolerance_sd`` x the sample standard
    deviation of the baseline's figure across seeds (which needs >= 2 seeds).
    """

    last_steps: int = Field(ge=1, le=10_000_000, description="K: the last K steps' mean reward")
    tolerance: float | None = Field(None, ge=0, le=1e6, description="absolute reward units")
    tolerance_sd: float | None = Field(
        None, ge=0, le=1e3, description="in standard deviations of the baseline across seeds")
    two_sided: bool = Field(False, description="also fail when async is better by > tolerance")

    @model_validator(mode="after")
    def _some(self) -> Convergence:
        if self.tolerance is None and self.tolerance_sd is None:
            raise ValueError("give tolerance and/or tolerance_sd")
        return self


class Gates(_Strict):
    accepted_per_s: Throughput | None = None
    discard_rate: AtMostRatio | None = None
    lag_p99: AtMostLag | None = None
    lag_max: AtMostLag | None = None
    trainer_idle_ratio: AtMostRatio | None = None
    sample_bias: AtMostBias | None = None
    learning: Learning | None = None
    recovery: Recovery | None = None
    convergence: Convergence | None = None


class Acceptance(_Strict):
    name: str | None = Field(None, description="what is validated (default: the file's name)")
    config: str | None = Field(
        None, description="a config file, relative to this file's folder (unset: the default)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted config keys")
    seeds: int | list[int] = Field(3, description="a count (0..N-1) or a list of seeds")
    gates: Gates = Field(default_factory=Gates)

    @model_validator(mode="after")
    def _seeds(self) -> Acceptance:
        _check_seeds(self.seeds)
        if self.gates.recovery is not None and self.gates.recovery.seeds is not None:
            _check_seeds(self.gates.recovery.seeds)
        conv = self.gates.convergence
        if conv is not None and conv.tolerance_sd is not None and len(seed_list(self.seeds)) < 2:
            raise ValueError("gates.convergence.tolerance_sd needs at least 2 seeds (a spread)")
        return self

    def seed_list(self) -> list[int]:
        return seed_list(self.seeds)

    def needs_sync(self) -> bool:
        g = self.gates
        return g.convergence is not None or (
            g.accepted_per_s is not None and g.accepted_per_s.min_ratio_to_sync is not None)


def seed_list(seeds: int | list[int]) -> list[int]:
    return list(range(seeds)) if isinstance(seeds, int) else list(seeds)


def _check_seeds(seeds: int | list[int]) -> None:
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_REPEATS:
            raise ValueError(f"seeds: a count from 1 to {MAX_REPEATS} (got {seeds})")
        return
    if not seeds:
        raise ValueError("seeds: the list is empty")
    if len(seeds) > MAX_REPEATS:
        raise ValueError(f"seeds: at most {MAX_REPEATS}")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds: a seed is listed twice (repeats need distinct seeds)")
    if any(not 0 <= s <= SEED_MAX for s in seeds):
        raise ValueError(f"seeds: each seed from 0 to {SEED_MAX}")


@dataclass(frozen=True)
class Loaded:
    """An acceptance file read and resolved: the file, the workload's config, the plan path."""

    path: Path
    spec: Acceptance
    cfg: Config  # the workload (async) with overrides, run.progress off
    plan_path: Path | None

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem


def parse(data: Any, source: str) -> Acceptance:
    """Validate a mapping; a :class:`ConfigError` names ``source`` and every bad key."""
    return parse_mapping(Acceptance, data, source, "an acceptance file is a mapping with "
                         "`gates`")


def workload(spec: Acceptance, folder: Path, source: str) -> Config:
    """The config of the async repeats: ``config`` (or the defaults), ``overrides`` on top."""
    data: dict[str, Any] = {}
    if spec.config is not None:
        path = (folder / spec.config).resolve()
        if not path.is_file():
            raise ConfigError(f"{source}: config: {spec.config}: no such file (relative to "
                              f"{folder})")
        data = read_yaml(path)
        resolve_paths(data, path.parent)
    for key, value in spec.overrides.items():
        set_dotted(data, key, value, f"{source}: overrides.{key}")
    resolve_paths(data, folder)
    data.setdefault("run", {})
    if isinstance(data["run"], dict):
        data["run"]["progress"] = False  # validate prints its own line per repeat
    return validate(data, f"{source}: config {spec.config or '(the defaults)'} with overrides")


def load(path: str | Path) -> Loaded:
    """Read and check an acceptance file: its schema, its config, its fault plan's scenarios."""
    p = Path(path)
    source = str(p)
    spec = parse(read_yaml_file(p, "acceptance file"), source)
    folder = p.resolve().parent
    cfg = workload(spec, folder, source)
    conv = spec.gates.convergence
    if conv is not None and conv.last_steps > cfg.run.steps:
        raise ConfigError(f"{source}: gates.convergence.last_steps: {conv.last_steps} exceeds "
                          f"the workload's run.steps ({cfg.run.steps})")
    plan_path = None
    rec = spec.gates.recovery
    if rec is not None:
        plan_path = (folder / rec.plan).resolve()
        _check_scenarios(plan_path, rec, source)
    return Loaded(p, spec, cfg, plan_path)


def _check_scenarios(plan_path: Path, rec: Recovery, source: str) -> None:
    from freshroll.chaos.plan import load_plan

    try:
        plan = load_plan(plan_path)
    except ConfigError as exc:
        raise ConfigError(f"{source}: gates.recovery.plan: {exc}") from None
    names = [s.name for s in plan.scenarios]
    for i, name in enumerate(rec.scenarios):
        if name not in names:
            raise ConfigError(f"{source}: gates.recovery.scenarios[{i}]: {name!r} is not a "
                              f"scenario of {plan_path} (it has: {', '.join(names)})")


__all__ = [
    "MAX_STALENESS", "Acceptance", "AtMostLag", "AtMostRatio", "Convergence", "Gates", "Loaded",
    "Recovery", "Throughput", "load", "parse", "seed_list", "workload",
]

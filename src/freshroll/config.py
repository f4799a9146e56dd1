"""Typed run configuration: YAML file + ``key=value`` overrides, unknown keys rejected.

Every section is a pydantic model with ``extra="forbid"``, so a typo such as
``trainer.lr_rate`` is an error that names the key. Overrides use dotted paths
(``trainer.lr=1e-3``, ``run.max_staleness=0``) and YAML scalars (``true``,
``1e-3``, ``[1, 2]``). :func:`load_config` returns the validated config; the
run directory stores its fully resolved form (``config.yaml``), which is what
``--resume`` reads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from freshroll.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Section):
    seed: int = 0
    steps: int = Field(400, ge=1, description="trainer steps to commit")
    max_staleness: int = Field(1, ge=0, description="eta: 0 = synchronous baseline")
    torch_threads: int = Field(1, ge=1, description="intra-op threads per compute thread")
    runtime: Literal["inline", "ray"] = Field(
        "inline", description="inline: workers are threads; ray: each worker is a Ray actor"
    )
    progress: bool = True


class ModelSection(_Section):
    path: str | None = Field(None, description="local transformers model dir; None = tiny")
    tiny_seed: int = 0
    tiny: dict[str, Any] = Field(default_factory=dict, description="tiny config overrides")


class TaskSection(_Section):
    name: str = "reverse"
    n_prompts: int = Field(4096, ge=1)
    params: dict[str, Any] = Field(default_factory=lambda: {"min_len": 3, "max_len": 3})
    file: str | None = Field(None, description="JSONL/Parquet prompt file instead of a task")
    prompt_field: str = "prompt"
    answer_field: str = "answer"


class RewardEntry(_Section):
    fn: str
    weight: float = 1.0
    name: str | None = None


class RolloutSection(_Section):
    group_size: int = Field(16, ge=1)
    batch_groups: int = Field(8, ge=1, description="groups per trainer step")
    workers: int = Field(1, ge=1)
    worker_batch: int = Field(64, ge=1, description="max requests per generate call")
    max_new_tokens: int = Field(4, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_inflight_groups: int | None = Field(None, ge=1)


class TrainerSection(_Section):
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = 0.0
    max_grad_norm: float = Field(1.0, gt=0)
    aggregation: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    correction: Literal["none", "tis", "decoupled"] = "tis"
    clip_low: float = 0.2
    clip_high: float = 0.28
    is_cap: float = 2.0
    kl_coef: float = Field(0.0, ge=0)
    checkpoint_every: int = Field(
        10, ge=1, description="steps between checkpoints; resume replays the rest from the ledger"
    )
    keep_checkpoints: int = Field(2, ge=1)
    on_nonfinite: Literal["skip", "stop"] = Field(
        "skip", description="a step whose loss or gradients are not finite is never applied: "
        "skip discards its batch (nonfinite_step) and goes on, stop ends the run (NonFiniteStep)"
    )


class LimitsSection(_Section):
    """Timeouts on every hand-off and the failure budget (rules in freshroll.breaker)."""

    generate_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="max seconds of one generate call; then the worker "
        "is fenced, its attempts re-issued and it is restarted (WorkerTimeout)"
    )
    weights_timeout_s: float = Field(
        300.0, gt=0, le=86_400, description="max seconds for a worker to load published weights"
    )
    worker_start_timeout_s: float = Field(
        300.0, gt=0, le=86_400, description="max seconds for a (re)started Ray worker to be ready"
    )
    reward_timeout_s: float = Field(
        300.0, gt=0, le=86_400, description="max seconds of one reward call; its samples are "
        "discarded as reward_timeout and the stuck thread is abandoned"
    )
    max_consecutive_failures: int = Field(
        32, ge=1, le=10**9, description="failed samples in a row that stop the run, per reward "
        "function and per worker, once max_consecutive_failed_calls is reached too"
    )
    max_consecutive_failed_calls: int = Field(
        8, ge=1, le=10**9, description="reward or generate calls in a row whose every sample "
        "failed that stop the run, once max_consecutive_failures is reached too"
    )
    failure_window: int = Field(
        1024, ge=0, le=10**7, description="samples in the sliding window of the failure-ratio "
        "rule, per reward function and per worker; 0 turns the rule off"
    )
    max_failure_ratio: float = Field(
        0.9, gt=0, le=1.0, description="failure ratio over failure_window above which the run stops"
    )
    max_consecutive_timeouts: int = Field(
        3, ge=1, le=10**6, description="reward calls in a row that time out before the run stops"
    )
    max_consecutive_skipped_steps: int = Field(
        3, ge=1, le=10**6, description="non-finite trainer steps in a row skipped before the run "
        "stops (trainer.on_nonfinite: skip)"
    )


class Config(_Section):
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rewards: list[RewardEntry] = Field(default_factory=lambda: [RewardEntry(fn="reverse")])
    rollout: RolloutSection = RolloutSection()
    trainer: TrainerSection = TrainerSection()
    limits: LimitsSection = LimitsSection()

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.rewards:
            raise ValueError("rewards: at least one reward is needed")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value`` to nested ``data`` in place."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.lr=1e-3)")
    key, _, raw = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r}: empty key segment")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML: {exc}") from exc


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def validate(data: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}: {msg}")
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (or the defaults), apply overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    for item in overrides:
        apply_override(data, item)
    return validate(data, str(path) if path else "config")

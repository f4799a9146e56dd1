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

#: bounds shared by several fields: a seed torch, numpy and ``random`` all accept
SEED_MAX = 2**32 - 1


class _Section(BaseModel):
    # allow_inf_nan=False: no float setting may be NaN or infinite (``lr: .inf`` passes gt=0)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunSection(_Section):
    seed: int = Field(0, ge=0, le=SEED_MAX)
    steps: int = Field(400, ge=1, le=10_000_000, description="trainer steps to commit")
    max_staleness: int = Field(1, ge=0, le=1_000, description="eta: 0 = synchronous baseline")
    torch_threads: int = Field(
        1, ge=1, le=1_024, description="intra-op threads per compute thread"
    )
    runtime: Literal["inline", "ray"] = Field(
        "inline", description="inline: workers are threads; ray: each worker is a Ray actor"
    )
    progress: bool = True


class ModelSection(_Section):
    path: str | None = Field(None, description="local transformers model dir; None = tiny")
    tiny_seed: int = Field(0, ge=0, le=SEED_MAX)
    tiny: dict[str, Any] = Field(default_factory=dict, description="tiny config overrides")


class TaskSection(_Section):
    name: str = "reverse"
    n_prompts: int = Field(4096, ge=1, le=100_000_000)
    params: dict[str, Any] = Field(default_factory=lambda: {"min_len": 3, "max_len": 3})
    file: str | None = Field(None, description="JSONL/Parquet prompt file instead of a task")
    prompt_field: str = "prompt"
    answer_field: str = "answer"


class RewardEntry(_Section):
    fn: str
    weight: float = Field(1.0, ge=-1e6, le=1e6, description="negative: a penalty")
    name: str | None = None


class RolloutSection(_Section):
    group_size: int = Field(16, ge=1, le=4_096)
    batch_groups: int = Field(8, ge=1, le=4_096, description="groups per trainer step")
    workers: int = Field(1, ge=1, le=256)
    worker_batch: int = Field(64, ge=1, le=65_536, description="max requests per generate call")
    max_new_tokens: int = Field(4, ge=1, le=131_072)
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_inflight_groups: int | None = Field(None, ge=1, le=1_000_000)


class TrainerSection(_Section):
    lr: float = Field(1e-3, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW (decoupled) decay")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    aggregation: Literal["grpo", "dr_grpo", "dapo"] = "grpo"
    correction: Literal["none", "tis", "decoupled"] = "tis"
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio floor is 1 - clip_low")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="ratio ceiling is 1 + clip_high")
    is_cap: float = Field(2.0, ge=1.0, le=1e6, description="cap on the importance weight")
    kl_coef: float = Field(0.0, ge=0, le=1e3)
    checkpoint_every: int = Field(
        10, ge=1, le=10_000_000,
        description="steps between checkpoints; resume replays the rest from the ledger",
    )
    keep_checkpoints: int = Field(2, ge=1, le=1_000)


class Config(_Section):
    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rewards: list[RewardEntry] = Field(default_factory=lambda: [RewardEntry(fn="reverse")])
    rollout: RolloutSection = RolloutSection()
    trainer: TrainerSection = TrainerSection()

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

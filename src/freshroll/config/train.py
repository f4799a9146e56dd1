"""The policy and its training: the model (the embedded tiny one's shape) and trainer
(LoRA) sections, and what earlier runs trained with (:data:`TRAINER_BEFORE`). Part of
:class:`freshroll.config.Config` (imported from there as its other sections are)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import Field, model_validator

from freshroll.config.base import SEED_MAX, _Section


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


class LoraSection(_Section):
    """LoRA (peft): only low-rank adapters on ``target_modules`` are trained, and only they
    travel to the inference workers each version (docs/training.md, "LoRA")."""

    r: int = Field(8, ge=1, le=1_024, description="adapter rank")
    alpha: float = Field(
        16.0, gt=0, le=1e6, description="scaling numerator: the update is alpha / r x B @ A"
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="dropout on the adapter's input (trained only with trainer.disable_dropout: "
        "false)"
    )
    target_modules: Annotated[list[str], Field(min_length=1)] | Literal["all-linear"] = Field(
        default_factory=lambda: ["q_proj", "v_proj"],
        description="linear layers that get an adapter, by name or name suffix (peft's "
        "target_modules), e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; "
        "or all-linear: every linear layer but the output head (peft's shorthand)",
    )


#: ``trainer.lora.target_modules``: every linear layer but the output head (peft's shorthand)
ALL_LINEAR: Final = "all-linear"


#: trainer keys whose default is not what earlier runs trained with: a recorded config
#: without one of them (an earlier freshroll's) trained with this value
TRAINER_BEFORE: dict[str, object] = {"optim": "adamw_torch", "disable_dropout": False}



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
    warmup_ratio: float = Field(
        0.0, ge=0.0, lt=1.0, description="warmup as a share of run.steps: ceil(ratio x "
        "run.steps) steps (TRL's warmup_ratio, transformers' get_warmup_steps); 0: "
        "warmup_steps; both set is an error"
    )
    grad_accum: int = Field(
        1, ge=1, le=1_024, description="micro-batches a step's batch is split into, each "
        "backward on its own, one optimizer step: the same gradient, less activation memory"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward pass instead of keeping "
        "them (TRL's gradient_checkpointing): less memory, more compute, the same gradients; "
        "rows sharing a prompt then run whole"
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
    disable_dropout: bool = Field(
        True, description="train with every dropout of the policy off (its Dropout modules and "
        "attention dropout, LoRA's included), as it samples: with dropout on, the trained "
        "log-probs differ from the behaviour policy's even at lag 0 (TRL's disable_dropout, "
        "whose default is false)"
    )
    aggregation: Literal["grpo", "dr_grpo", "dapo"] = Field(
        "grpo", description="loss aggregation: per-sequence mean (grpo), "
        "sum / (B x max tokens) (dr_grpo), token mean (dapo)"
    )
    scale_rewards: Literal["auto", "group", "batch", "none"] = Field(
        "auto", description="what a reward minus its group's mean is divided by (TRL's "
        "scale_rewards): the group's reward std (group), the whole batch's (batch), nothing "
        "(none); auto: group, or none with aggregation dr_grpo (as before 2026-12-07)"
    )
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="the PPO ratio per token, or per sequence: exp of the mean of "
        "its tokens' log-ratios, GSPO (TRL's importance_sampling_level)"
    )
    mask_truncated: bool = Field(
        False, description="a completion that ended at rollout.max_new_tokens (no end token) "
        "gets no loss and counts in no token total (TRL's mask_truncated_completions); its "
        "reward still counts in its group's mean"
    )
    num_iterations: int = Field(
        1, ge=1, le=64, description="optimizer updates per trainer step on its batch (TRL's "
        "num_iterations), each clipped against the behaviour log-probs; > 1 needs correction "
        "none or dual_clip"
    )
    correction: Literal["none", "tis", "decoupled", "dual_clip"] = Field(
        "dual_clip", description="off-policy correction: none (PPO clipped against the behaviour "
        "policy), truncated importance sampling (tis), AReaL decoupled (masks weights above "
        "is_cap), dual_clip (none with the negative-advantage ratio capped at is_cap)"
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
    parallel: Literal["none", "ddp", "fsdp"] = Field(
        "none", description="the trainer's ranks (docs/parallel.md): none (one process), ddp "
        "(trainer.world_size ranks on torch.distributed, gloo on CPU: each step's batch split "
        "into contiguous shards, gradients all-reduced, the weights the same up to float "
        "summation order) or fsdp (the same split, each rank holding a shard of the model: "
        "FSDP2's fully_shard; the full state gathered to rank 0 once per version)"
    )
    world_size: int = Field(
        1, ge=1, le=1_024, description="ranks of the trainer group (trainer.parallel: ddp or "
        "fsdp); rank 0 is the run's learner, the others are processes of this machine"
    )

    @model_validator(mode="after")
    def _dual_clip(self) -> TrainerSection:
        if self.num_iterations > 1 and self.correction not in ("none", "dual_clip"):
            raise ValueError(f"num_iterations {self.num_iterations} needs correction none or "
                             "dual_clip (their ratio is to the behaviour policy; "
                             f"{self.correction}'s proximal policy would move with each update)")
        if self.warmup_ratio and self.warmup_steps:
            raise ValueError(f"warmup_ratio {self.warmup_ratio} and warmup_steps "
                             f"{self.warmup_steps} both set: give one")
        if self.world_size > 1 and self.parallel == "none":
            raise ValueError(f"world_size {self.world_size} needs parallel: ddp or fsdp "
                             "(parallel none trains in one process)")
        if self.parallel == "fsdp" and self.world_size > 1 and self.lora is not None:
            raise ValueError("lora with parallel: fsdp is not supported (the adapters are a "
                             "few MB: use parallel: ddp, which replicates them)")
        if self.correction == "dual_clip" and self.is_cap <= 1.0 + self.clip_high:
            raise ValueError(f"is_cap {self.is_cap} must exceed 1 + clip_high = "
                             f"{1.0 + self.clip_high:g} with correction dual_clip (the cap "
                             "bounds a ratio the clip has already let through)")
        return self

"""TRL's names, in one table: each ``GRPOConfig`` / ``GRPOTrainer`` name a TRL user reaches
for is either freshroll's key (:data:`TRL_NAMES`) or not supported, with the nearest freshroll
feature (:data:`NOT_SUPPORTED`).

Two readers, so the two answers never drift apart: the config's "unknown key" answer
(:func:`trl_hint`: ``trainer.scale_rewards: unknown key; TRL's scale_rewards ...`` instead
of a "did you mean" that points at an unrelated key) and the ``GRPOConfig`` converter
(:mod:`freshroll.trl_args`), which maps the first and refuses or drops the second.

A name not supported carries ``trains``: True where setting it changes what TRL trains
(the sampled tokens, the loss, the data): the converter refuses it, since running without
it would train something else under the user's settings. False where it changes only how a
run is watched or where it runs (logging, the hub, memory): dropped with one warning.
docs/guide.md ("TRL to freshroll") is the same table for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GUIDE: Final = "docs/guide.md, 'TRL to freshroll'"

#: TRL's ``GRPOConfig`` / ``GRPOTrainer`` names -> freshroll's key (in words where one TRL
#: name is two keys); :mod:`freshroll.trl_args` holds how each value converts
TRL_NAMES: Final[dict[str, str]] = {
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "per_device_train_batch_size": "rollout.batch_groups x rollout.group_size (completions)",
    "generation_batch_size": "rollout.batch_groups x rollout.group_size (completions)",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "repetition_penalty": "rollout.repetition_penalty",
    "generation_kwargs": "rollout.* (its top_k, min_p, repetition_penalty, temperature, top_p, "
                         "max_new_tokens: each its rollout key; any other key is refused)",
    "learning_rate": "trainer.lr",
    "weight_decay": "trainer.weight_decay",
    "max_grad_norm": "trainer.max_grad_norm",
    "lr_scheduler_type": "trainer.lr_schedule",
    "warmup_steps": "trainer.warmup_steps (under 1: trainer.warmup_ratio)",
    "warmup_ratio": "trainer.warmup_ratio",
    "scale_rewards": "trainer.scale_rewards (group, batch, none)",
    "importance_sampling_level": "trainer.ratio_level (token, sequence: GSPO)",
    "mask_truncated_completions": "trainer.mask_truncated",
    "num_iterations": "trainer.num_iterations (run.steps counts batches: max_steps / "
                      "num_iterations)",
    "max_prompt_length": "task.max_prompt_tokens (a longer prompt is refused, not truncated)",
    "gradient_accumulation_steps": "trainer.grad_accum",
    "bf16": "trainer.bf16",
    "gradient_checkpointing": "trainer.gradient_checkpointing",
    "log_completions": "monitor.log_completions (every N steps: TRL's logging_steps)",
    "num_completions_to_print": "monitor.completions_to_print",
    "optim": "trainer.optim (adamw_torch_fused, adamw_torch)",
    "loss_type": "trainer.aggregation",
    "epsilon": "trainer.clip_low",
    "epsilon_high": "trainer.clip_high",
    "delta": "trainer.is_cap (with trainer.correction: dual_clip)",
    "beta": "trainer.kl_coef",
    "disable_dropout": "trainer.disable_dropout (default true here, false in TRL)",
    "max_steps": "run.steps",
    "seed": "run.seed",
    "output_dir": "the run directory (GRPOTrainer's output_dir, freshroll run --out)",
    "save_steps": "trainer.checkpoint_every",
    "save_total_limit": "trainer.keep_checkpoints",
    "use_vllm": "rollout.engine: vllm",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_max_model_length": "vllm.max_model_len",
    "reward_funcs": "rewards (a list of {fn: file.py:f}; a reward model's directory: "
                    "{fn: freshroll.rewards.reward_model:reward_model, args: {path: DIR}})",
    "reward_weights": "rewards[].weight",
    "train_dataset": "task.file",
    "eval_dataset": "eval.file",
    "eval_steps": "eval.every_steps",
    "eval_strategy": "eval.every_steps (evaluation is on while eval.file is set)",
    "peft_config": "trainer.lora",
    "callbacks": "GRPOTrainer(callbacks=[...]) (TrainerCallbacks), or train(observers=[...])",
}


@dataclass(frozen=True)
class NotSupported:
    """A TRL name freshroll has no key for: the nearest feature, and whether dropping the
    setting changes what is trained (the module's rule)."""

    nearest: str
    trains: bool = True


_REPORT = ("monitor.tensorboard: true, monitor.wandb_project, monitor.prometheus_port; every "
           "run writes metrics.jsonl")

#: TRL (and transformers' ``TrainingArguments``) names with no freshroll key
NOT_SUPPORTED: Final[dict[str, NotSupported]] = {
    "vllm_mode": NotSupported("rollout.engine: vllm runs vLLM as freshroll's own inference "
                              "workers, see docs/vllm.md", trains=False),
    "vllm_server_base_url": NotSupported("rollout.engine: vllm (freshroll starts its own "
                                         "engines)", trains=False),
    "vllm_server_host": NotSupported("rollout.engine: vllm", trains=False),
    "vllm_server_port": NotSupported("rollout.engine: vllm", trains=False),
    "vllm_tensor_parallel_size": NotSupported(
        "vllm.engine_args: {tensor_parallel_size: N}", trains=False),
    "vllm_enable_sleep_mode": NotSupported("rollout.engine: vllm", trains=False),
    "steps_per_generation": NotSupported(
        "trainer.num_iterations (updates per batch); run.max_staleness bounds how far "
        "behind a batch may be"),
    "num_train_epochs": NotSupported("run.steps (max_steps): freshroll counts trainer steps"),
    "shuffle_dataset": NotSupported("the prompt order is freshroll's own, seeded by run.seed"),
    "model_init_kwargs": NotSupported("model.path's own config.json (dtype: trainer.bf16)"),
    "chat_template_kwargs": NotSupported("chat prompts are rendered by the tokenizer's own "
                                         "template, as saved with the model"),
    "vllm_structured_outputs_regex": NotSupported("no constrained decoding"),
    "router_aux_loss_coef": NotSupported("no mixture-of-experts auxiliary loss"),
    "max_tool_calling_iterations": NotSupported("rollout.workflow (a registered multi-turn "
                                                "workflow bounds its own turns)"),
    "num_generations_eval": NotSupported("eval.mode: greedy, sampled (one completion per "
                                         "prompt) or both", trains=False),
    "multi_objective_aggregation": NotSupported(
        "rewards are summed with their weights, then normalised (TRL's sum_then_normalize)"),
    "top_entropy_quantile": NotSupported("every completion token is trained on"),
    "entropy_coef": NotSupported("no entropy bonus; monitor.entropy_floor watches entropy"),
    "use_adaptive_entropy": NotSupported("no entropy bonus; monitor.entropy_floor watches "
                                         "entropy"),
    "sync_ref_model": NotSupported("trainer.kl_coef is to the initial policy"),
    "use_bias_correction_kl": NotSupported("trainer.kl_coef (k3 to the initial policy)"),
    "off_policy_mask_threshold": NotSupported("trainer.correction: decoupled with "
                                              "trainer.is_cap"),
    "vllm_importance_sampling_correction": NotSupported(
        "trainer.correction (tis, decoupled, dual_clip) with trainer.is_cap"),
    "vllm_importance_sampling_mode": NotSupported("trainer.correction with trainer.is_cap"),
    "vllm_importance_sampling_cap": NotSupported("trainer.is_cap"),
    "vllm_importance_sampling_clip_max": NotSupported("trainer.is_cap"),
    "cast_lm_head_to_fp32": NotSupported("trainer.bf16 keeps the loss and log-probs float32"),
    "adam_beta1": NotSupported("trainer.optim: AdamW with betas (0.9, 0.999)"),
    "adam_beta2": NotSupported("trainer.optim: AdamW with betas (0.9, 0.999)"),
    "adam_epsilon": NotSupported("trainer.optim: AdamW with eps 1e-8"),
    "optim_args": NotSupported("trainer.optim"),
    "lr_scheduler_kwargs": NotSupported("trainer.lr_schedule"),
    "fp16": NotSupported("trainer.bf16"),
    "label_smoothing_factor": NotSupported("no label smoothing in a policy-gradient loss"),
    "neftune_noise_alpha": NotSupported("no embedding noise"),
    "report_to": NotSupported(_REPORT, trains=False),
    "logging_steps": NotSupported("every committed step writes a metrics.jsonl row",
                                  trains=False),
    "push_to_hub": NotSupported("freshroll export-model RUN_DIR OUT (or "
                                "GRPOTrainer.save_model), then push that folder",
                                trains=False),
    "hub_model_id": NotSupported("freshroll export-model RUN_DIR OUT", trains=False),
    "run_name": NotSupported("the run directory's name (output_dir)", trains=False),
    "reward_processing_classes": NotSupported(
        "a reward model's directory in reward_funcs is scored with that directory's own "
        "tokenizer (freshroll.rewards.reward_model)"),
    "optimizers": NotSupported("trainer.optim (AdamW), trainer.lr_schedule, "
                               "trainer.warmup_steps"),
    "tools": NotSupported("rollout.workflow (multi-turn and tool-using workflows are "
                          "registered; docs/architecture.md)"),
    "rollout_func": NotSupported("rollout.workflow (an episode workflow, registered by name)"),
    "resume_from_checkpoint": NotSupported("GRPOTrainer.train(resume_from_checkpoint=True), "
                                           "freshroll run --resume RUN_DIR", trains=False),
}


def trl_hint(name: str) -> str | None:
    """The answer to an unknown key named ``name``: freshroll's key, or "not supported" with
    the nearest feature; None when ``name`` is not a TRL name."""
    key = TRL_NAMES.get(name)
    if key is not None:
        return f"freshroll's key for TRL's {name} is {key} ({GUIDE})"
    gap = NOT_SUPPORTED.get(name)
    if gap is not None:
        return f"TRL's {name} is not supported in freshroll; nearest: {gap.nearest} ({GUIDE})"
    return None


__all__ = ["GUIDE", "NOT_SUPPORTED", "TRL_NAMES", "NotSupported", "trl_hint"]

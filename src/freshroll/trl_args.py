"""TRL's ``GRPOConfig`` read as freshroll's keys: ``GRPOTrainer(args=GRPOConfig(...))``.

Only the fields set away from TRL's defaults count (each compared with a default
``GRPOConfig`` made on the same machine, whose ``__post_init__`` fills in ``bf16``,
``output_dir``, ``report_to``; the fields it derives from others, such as
``generation_batch_size``, compared with what it would derive from the user's), so TRL's
defaults never replace freshroll's: a ``GRPOConfig()`` left as it is gives freshroll's
default run, not TRL's learning rate of 1e-6 or its linear decay. What a set field becomes
follows :mod:`freshroll.config.trl`'s one table:

* a name with a freshroll key is converted (:data:`CONVERT`; a value freshroll cannot take,
  such as ``loss_type="sapo"``, is a ConfigError naming the field);
* a name not supported that changes what is trained (``steps_per_generation``,
  ``shuffle_dataset``, ``top_entropy_quantile``, ...) is refused: one ConfigError naming
  every such field with its nearest freshroll feature, since running without it would train
  something the user did not ask for under the user's other settings;
* anything else set is dropped, named in one :class:`DroppedTrlArgs` warning: a name the
  table knows (``report_to``, ``logging_steps``, ``push_to_hub``, ...) with its nearest
  feature, a name it does not know (a field of transformers' ``TrainingArguments`` such as
  ``torch_compile``) said to be unknown, so the user can check it trains nothing.

``trl`` is not imported here: a GRPOConfig is recognised by its class's name and module
(:func:`is_grpo_config`), and its fields are read as a dataclass's.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from freshroll.config import set_dotted
from freshroll.config.trl import GUIDE, NOT_SUPPORTED
from freshroll.errors import ConfigError

Values = dict[str, Any]  # freshroll dotted key -> value
Convert = Callable[[Any, Any], Values]


class DroppedTrlArgs(UserWarning):
    """GRPOConfig fields set that freshroll drops (they change nothing that is trained)."""


@dataclass(frozen=True)
class Converted:
    """A GRPOConfig as freshroll takes it: the nested keys, and what ``GRPOTrainer`` itself
    takes (``output_dir``, ``reward_weights``); ``dropped``: the fields the warning named."""

    data: dict[str, Any]
    output_dir: str | None
    reward_weights: list[float] | None
    dropped: tuple[str, ...]


def is_grpo_config(obj: Any) -> bool:
    """``obj`` is TRL's ``GRPOConfig`` (or a subclass), known without importing ``trl``."""
    return any(c.__name__ == "GRPOConfig" and c.__module__.split(".")[0] == "trl"
               for c in type(obj).__mro__)


def _to(key: str) -> Convert:
    return lambda value, args: {key: value}


def _choice(field: str, key: str, allowed: dict[str, str]) -> Convert:
    """A TRL value among ``allowed`` (TRL's value -> freshroll's), else a ConfigError."""
    def pick(value: Any, args: Any) -> Values:
        text = str(getattr(value, "value", value))
        if text not in allowed:
            raise ConfigError(f"args (GRPOConfig): {field}={text!r} is not supported; "
                              f"{key} takes {', '.join(sorted(set(allowed)))} ({GUIDE})")
        return {key: allowed[text]}
    return pick


def _batch(value: Any, args: Any) -> Values:
    """Completions per optimizer step (TRL's generation_batch_size: per_device_train_batch_size
    x gradient_accumulation_steps on one process) over the group size: any of these or
    num_generations set sets the step's batch as TRL would have it (freshroll's grad_accum
    splits the step's batch, TRL's multiplies it)."""
    completions, group = int(args.generation_batch_size), int(args.num_generations)
    if completions % group:
        raise ConfigError(f"args (GRPOConfig): generation_batch_size {completions} is not a "
                          f"multiple of num_generations {group}")
    return {"rollout.batch_groups": completions // group}


def _loss_type(value: Any, args: Any) -> Values:
    """bnpo is dapo's token mean taken per micro-batch: the same with one micro-batch. TRL's
    scale_rewards does not follow loss_type (freshroll's ``auto`` does): it goes with it."""
    allowed = {"grpo": "grpo", "dr_grpo": "dr_grpo", "dapo": "dapo"}
    if args.gradient_accumulation_steps == 1:
        allowed["bnpo"] = "dapo"
    return {**_choice("loss_type", "trainer.aggregation", allowed)(value, args),
            **_SCALE(args.scale_rewards, args)}


def _warmup(value: Any, args: Any) -> Values:
    """transformers 5's warmup_steps: a count, or under 1 a share of the run's steps."""
    if value >= 1:
        return {"trainer.warmup_steps": int(value)}
    return {"trainer.warmup_ratio": float(value)}


_SCALE: Final = _choice("scale_rewards", "trainer.scale_rewards",
                        {"group": "group", "batch": "batch", "none": "none"})


def _eval(value: Any, args: Any) -> Values:
    """eval_strategy / eval_steps: every eval_steps steps (logging_steps where unset)."""
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    if strategy == "no":
        return {}
    if strategy != "steps":
        raise ConfigError(f"args (GRPOConfig): eval_strategy={strategy!r} is not supported; "
                          f"freshroll evaluates every eval.every_steps steps: give "
                          f"eval_strategy='steps' ({GUIDE})")
    every = args.eval_steps if args.eval_steps is not None else args.logging_steps
    if every < 1:
        raise ConfigError(f"args (GRPOConfig): eval_steps={every} (a share of the run) is not "
                          "supported; give a number of steps")
    return {"eval.every_steps": int(every)}


def _steps(max_steps: int, args: Any) -> Values:
    """TRL's max_steps counts optimizer updates, num_iterations of them per batch; freshroll's
    run.steps counts batches (each of trainer.num_iterations updates)."""
    if max_steps <= 0:
        return {}
    per = int(args.num_iterations)
    if max_steps % per:
        raise ConfigError(f"args (GRPOConfig): max_steps {max_steps} is not a multiple of "
                          f"num_iterations {per} (freshroll's run.steps counts batches of "
                          f"{per} updates)")
    return {"run.steps": max_steps // per}


#: generate() keywords freshroll samples with -> their rollout keys
_GENERATION: Final = {"top_k": "rollout.top_k", "min_p": "rollout.min_p",
                      "repetition_penalty": "rollout.repetition_penalty",
                      "temperature": "rollout.temperature", "top_p": "rollout.top_p",
                      "max_new_tokens": "rollout.max_new_tokens"}


def _generation_kwargs(value: Any, args: Any) -> Values:
    """TRL's extra generate() keywords: the sampling knobs freshroll has, each its key; any
    other would sample something else, so it is refused."""
    if not value:
        return {}
    other = sorted(k for k in value if k not in _GENERATION)
    if other:
        raise ConfigError(f"args (GRPOConfig): generation_kwargs {', '.join(other)} not "
                          f"supported (freshroll samples with {', '.join(_GENERATION)}) "
                          f"({GUIDE})")
    return {_GENERATION[k]: v for k, v in value.items()}


def _save_steps(value: Any, args: Any) -> Values:
    if value < 1:
        raise ConfigError(f"args (GRPOConfig): save_steps={value} (a share of the run) is not "
                          "supported; give a number of steps")
    return {"trainer.checkpoint_every": int(value)}


#: GRPOConfig field -> its freshroll keys (config_trl.TRL_NAMES says the same in words)
CONVERT: Final[dict[str, Convert]] = {
    "num_generations": lambda value, args: {"rollout.group_size": value, **_batch(value, args)},
    "max_completion_length": _to("rollout.max_new_tokens"),
    "per_device_train_batch_size": _batch,
    "generation_batch_size": _batch,
    "temperature": _to("rollout.temperature"),
    "top_p": _to("rollout.top_p"),
    "top_k": _to("rollout.top_k"),
    "min_p": _to("rollout.min_p"),
    "repetition_penalty": _to("rollout.repetition_penalty"),
    "generation_kwargs": _generation_kwargs,
    "learning_rate": _to("trainer.lr"),
    "weight_decay": _to("trainer.weight_decay"),
    "max_grad_norm": _to("trainer.max_grad_norm"),
    "lr_scheduler_type": _choice("lr_scheduler_type", "trainer.lr_schedule", {
        "constant": "constant", "constant_with_warmup": "constant", "linear": "linear",
        "cosine": "cosine"}),
    "warmup_steps": _warmup,
    "gradient_accumulation_steps": lambda value, args: {"trainer.grad_accum": value,
                                                        **_batch(value, args)},
    "bf16": lambda value, args: {"trainer.bf16": bool(value)},
    "gradient_checkpointing": _to("trainer.gradient_checkpointing"),
    "optim": _choice("optim", "trainer.optim", {"adamw_torch_fused": "adamw_torch_fused",
                                                "adamw_torch": "adamw_torch"}),
    "loss_type": _loss_type,
    "epsilon": _to("trainer.clip_low"),
    "epsilon_high": _to("trainer.clip_high"),
    "delta": lambda value, args: {"trainer.correction": "dual_clip", "trainer.is_cap": value},
    "beta": _to("trainer.kl_coef"),
    "disable_dropout": _to("trainer.disable_dropout"),
    "max_steps": lambda value, args: _steps(value, args),
    "num_iterations": lambda value, args: {"trainer.num_iterations": value,
                                           **_steps(args.max_steps, args)},
    "seed": _to("run.seed"),
    "save_steps": _save_steps,
    "save_total_limit": _to("trainer.keep_checkpoints"),
    "use_vllm": lambda value, args: {"rollout.engine": "vllm"} if value else {},
    "vllm_gpu_memory_utilization": _to("vllm.gpu_memory_utilization"),
    "vllm_max_model_length": _to("vllm.max_model_len"),
    "scale_rewards": _SCALE,
    "importance_sampling_level": _choice("importance_sampling_level", "trainer.ratio_level",
                                         {"token": "token", "sequence": "sequence"}),
    "warmup_ratio": lambda value, args: {"trainer.warmup_ratio": float(value)},
    "mask_truncated_completions": _to("trainer.mask_truncated"),
    "max_prompt_length": lambda value, args: {} if value is None else {
        "task.max_prompt_tokens": value},
    "eval_steps": _eval,
    "eval_strategy": _eval,
    # TRL prints its completions table at each logging step (logging_steps; a share of the
    # run is not a step count here: every step)
    "log_completions": lambda value, args: {"monitor.log_completions": max(
        1, int(args.logging_steps))} if value else {},
    "num_completions_to_print": lambda value, args: {} if value is None else {
        "monitor.completions_to_print": value},
}

#: fields ``GRPOTrainer`` takes itself, not as keys
_OWN: Final = frozenset({"output_dir", "reward_weights"})
#: fields set from the machine (device, process layout), never a choice, and the ``do_*``
#: flags transformers' Trainer itself does not read (``__post_init__`` sets do_eval)
_MACHINE: Final = frozenset({"use_cpu", "accelerator_config", "local_rank", "do_train",
                             "do_eval", "do_predict"})


def _unset(name: str, value: Any, args: Any, default: Any) -> bool:
    """``value`` is what a default config holds for ``name`` given the other fields (its
    ``__post_init__`` fills some in from them)."""
    if name in _MACHINE:
        return True
    if name == "steps_per_generation":
        return value in (None, args.gradient_accumulation_steps)
    if name == "generation_batch_size":
        return value in (None, args.per_device_train_batch_size * args.steps_per_generation
                         * getattr(args, "world_size", 1))
    if name == "eval_steps" and args.eval_strategy == "steps":
        return value in (default, args.logging_steps)
    if name == "num_train_epochs":  # TRL trains max_steps where it is set
        return bool(value == default or args.max_steps > 0)
    return bool(value == default)


def _defaults(args: Any) -> dict[str, Any]:
    """What ``type(args)()`` holds on this machine (``__post_init__`` fills in ``bf16``,
    ``output_dir``, ``report_to`` from None); the dataclass defaults where it cannot be made."""
    try:
        made = type(args)(use_cpu=args.use_cpu)
        return {f.name: getattr(made, f.name, None) for f in dataclasses.fields(made)}
    except Exception:  # a subclass with required fields, a machine check that fails
        out: dict[str, Any] = {}
        for f in dataclasses.fields(args):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out


def set_fields(args: Any) -> dict[str, Any]:
    """The fields of ``args`` set away from their defaults (the module's rule)."""
    defaults = _defaults(args)
    return {f.name: getattr(args, f.name, None) for f in dataclasses.fields(args)
            if not _unset(f.name, getattr(args, f.name, None), args,
                          defaults.get(f.name, dataclasses.MISSING))}


def convert(args: Any) -> Converted:
    """``args`` (a GRPOConfig) as freshroll's keys; refused or warned as the module says."""
    given = set_fields(args)
    refused = [n for n in given if n in NOT_SUPPORTED and NOT_SUPPORTED[n].trains]
    if refused:
        said = "; ".join(f"{n}={given[n]!r} (nearest: {NOT_SUPPORTED[n].nearest})"
                         for n in refused)
        raise ConfigError(f"args (GRPOConfig): not supported in freshroll, and running without "
                          f"them would train something else: {said}. Unset them ({GUIDE})")
    data: dict[str, Any] = {}
    for name, value in given.items():
        for key, v in CONVERT[name](value, args).items() if name in CONVERT else ():
            set_dotted(data, key, v, f"args (GRPOConfig).{name}")
    dropped = [n for n in given if n not in CONVERT and n not in _OWN]
    if dropped:
        said = "; ".join(f"{n}={given[n]!r} " + (
            f"(nearest: {NOT_SUPPORTED[n].nearest})" if n in NOT_SUPPORTED else
            "(not in freshroll's table of TRL names: check it changes nothing trained)")
            for n in dropped)
        warnings.warn(f"args (GRPOConfig): dropped, freshroll has no such setting: {said}",
                      DroppedTrlArgs, stacklevel=3)
    weights = given.get("reward_weights")
    return Converted(data, given.get("output_dir"),
                     None if weights is None else [float(w) for w in weights], tuple(dropped))


__all__ = ["CONVERT", "Converted", "DroppedTrlArgs", "convert", "is_grpo_config", "set_fields"]

"""TRL's GRPOConfig read as freshroll's keys (:mod:`freshroll.trl_args`), and every TRL name a
user reaches for answered from one table (:mod:`freshroll.config.trl`) (issue 48, item 6)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.config.trl import NOT_SUPPORTED, TRL_NAMES, trl_hint
from freshroll.errors import ConfigError
from freshroll.trl_args import CONVERT, DroppedTrlArgs, convert, is_grpo_config, set_fields

trl = pytest.importorskip("trl")


def _cfg(**kw: Any) -> Any:
    return trl.GRPOConfig(use_cpu=True, **kw)


def test_a_default_grpoconfig_sets_nothing() -> None:
    """TRL's defaults (lr 1e-6, a linear schedule, bf16 where supported, output_dir
    trainer_output) never replace freshroll's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = convert(_cfg())
    assert (got.data, got.output_dir, got.reward_weights, got.dropped) == ({}, None, None, ())


def test_the_fields_a_user_sets_become_freshrolls_keys() -> None:
    got = convert(_cfg(
        learning_rate=3e-4, num_generations=4, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, max_completion_length=64, max_steps=40, seed=7,
        beta=0.04, epsilon=0.1, epsilon_high=0.3, delta=2.5, temperature=0.7, top_p=0.9,
        warmup_steps=0.1, lr_scheduler_type="cosine", weight_decay=0.01, max_grad_norm=0.5,
        save_steps=5, save_total_limit=3, loss_type="dr_grpo", output_dir="runs/x",
        reward_weights=[1.0, 0.5]))
    assert got.data == {
        "run": {"steps": 40, "seed": 7},
        "rollout": {"group_size": 4, "batch_groups": 4, "max_new_tokens": 64,
                    "temperature": 0.7, "top_p": 0.9},
        "trainer": {"lr": 3e-4, "grad_accum": 2, "kl_coef": 0.04, "clip_low": 0.1,
                    "clip_high": 0.3, "correction": "dual_clip", "is_cap": 2.5,
                    "warmup_ratio": 0.1, "lr_schedule": "cosine", "weight_decay": 0.01,
                    "max_grad_norm": 0.5, "checkpoint_every": 5, "keep_checkpoints": 3,
                    "aggregation": "dr_grpo", "scale_rewards": "group"}}
    assert (got.output_dir, got.reward_weights) == ("runs/x", [1.0, 0.5])


def test_the_features_trl_names_land_on_their_keys() -> None:
    got = convert(_cfg(scale_rewards="batch", importance_sampling_level="sequence",
                       warmup_steps=3, top_k=20, min_p=0.05, repetition_penalty=1.1,
                       mask_truncated_completions=True))
    assert got.data == {"trainer": {"scale_rewards": "batch", "ratio_level": "sequence",
                                    "warmup_steps": 3, "mask_truncated": True},
                        "rollout": {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}}


def test_num_iterations_counts_run_steps_in_batches() -> None:
    assert convert(_cfg(num_iterations=2, max_steps=10)).data == {
        "run": {"steps": 5}, "trainer": {"num_iterations": 2}}
    with pytest.raises(ConfigError, match="max_steps 9 is not a multiple of num_iterations 2"):
        convert(_cfg(num_iterations=2, max_steps=9))


def test_generation_kwargs_land_on_the_rollout_keys() -> None:
    assert convert(_cfg(generation_kwargs={"top_k": 3, "repetition_penalty": 1.1})).data == {
        "rollout": {"top_k": 3, "repetition_penalty": 1.1}}


def test_bnpo_is_dapo_on_one_micro_batch_only() -> None:
    assert convert(_cfg(loss_type="bnpo")).data == {"trainer": {"aggregation": "dapo",
                                                                "scale_rewards": "group"}}
    with pytest.raises(ConfigError, match=r"loss_type='bnpo' is not supported"):
        convert(_cfg(loss_type="bnpo", gradient_accumulation_steps=2))


@pytest.mark.parametrize(("kw", "said"), [
    ({"loss_type": "sapo"}, "loss_type='sapo' is not supported; trainer.aggregation takes"),
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type='polynomial' is not supported"),
    ({"optim": "sgd"}, "optim='sgd' is not supported; trainer.optim takes"),
    ({"scale_rewards": "max"}, "scale_rewards='max' is not supported"),
    ({"generation_kwargs": {"top_a": 0.1, "top_k": 3}}, "generation_kwargs top_a not supported"),
    ({"eval_strategy": "epoch"}, "eval_strategy='epoch' is not supported"),
])
def test_a_value_freshroll_cannot_take_names_the_field(kw: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        convert(_cfg(**kw))


def test_unsupported_fields_that_change_training_are_one_error_naming_each() -> None:
    with pytest.raises(ConfigError) as err:
        convert(_cfg(top_entropy_quantile=0.5, steps_per_generation=2,
                     shuffle_dataset=False, learning_rate=1e-4))
    msg = str(err.value)
    assert msg.startswith("args (GRPOConfig): not supported in freshroll")
    for name in ("top_entropy_quantile=0.5", "steps_per_generation=2",
                 "shuffle_dataset=False"):
        assert name in msg
    assert "nearest: run.max_staleness" not in msg  # each says its own nearest feature
    assert "learning_rate" not in msg  # mapped, not refused


def test_operational_fields_are_dropped_with_one_warning() -> None:
    with pytest.warns(DroppedTrlArgs) as caught:
        got = convert(_cfg(report_to="tensorboard", logging_steps=1, push_to_hub=False,
                           log_completions=True, learning_rate=1e-4))
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "report_to=['tensorboard'] (nearest: monitor.tensorboard: true" in msg
    assert "logging_steps=1" in msg and "log_completions" not in msg
    assert set(got.dropped) == {"report_to", "logging_steps"}
    # log_completions prints its table every logging_steps, as TRL's does
    assert got.data == {"trainer": {"lr": 1e-4}, "monitor": {"log_completions": 1}}


def test_a_field_the_table_does_not_know_is_dropped_said_unknown() -> None:
    with pytest.warns(DroppedTrlArgs) as caught:
        convert(_cfg(logging_first_step=True))
    assert "logging_first_step=True (not in freshroll's table of TRL names" in str(
        caught[0].message)


def test_num_train_epochs_counts_only_without_max_steps() -> None:
    assert convert(_cfg(num_train_epochs=1, max_steps=5)).data == {"run": {"steps": 5}}
    with pytest.raises(ConfigError, match="num_train_epochs=1"):
        convert(_cfg(num_train_epochs=1))


def test_a_grpoconfig_is_known_by_its_class_not_by_importing_trl() -> None:
    @dataclasses.dataclass
    class GRPOConfig:  # the same name in another package
        lr: float = 1.0

    assert is_grpo_config(_cfg()) and not is_grpo_config(GRPOConfig())
    assert not is_grpo_config({"learning_rate": 1.0})


def test_the_table_and_the_converter_agree() -> None:
    """One table: every converted field has its freshroll key in TRL_NAMES, no name is both
    mapped and not supported, and every GRPOConfig field a user reaches for is in it."""
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(CONVERT) <= set(TRL_NAMES)
    assert set(TRL_NAMES) & set(NOT_SUPPORTED) == set()
    reached = {"scale_rewards", "use_vllm", "vllm_mode", "delta", "num_iterations",
               "log_completions", "report_to", "push_to_hub", "gradient_checkpointing",
               "top_k", "min_p", "repetition_penalty", "importance_sampling_level",
               "mask_truncated_completions", "steps_per_generation"}
    assert reached <= fields and reached <= set(TRL_NAMES) | set(NOT_SUPPORTED)
    assert all(trl_hint(n) for n in reached | {"warmup_ratio", "max_prompt_length"})


@pytest.mark.parametrize(("override", "said"), [
    ("rollout.scale_rewards=batch", "freshroll's key for TRL's scale_rewards is "
                                    "trainer.scale_rewards"),
    ("use_vllm=true", "freshroll's key for TRL's use_vllm is rollout.engine: vllm"),
    ("rollout.vllm_mode=server", "TRL's vllm_mode is not supported in freshroll; nearest: "
                                 "rollout.engine: vllm"),
    ("trainer.delta=3", "freshroll's key for TRL's delta is trainer.is_cap"),
    ("rollout.num_iterations=2", "TRL's num_iterations is trainer.num_iterations"),
    ("steps_per_generation=2", "TRL's steps_per_generation is not supported"),
    ("log_completions=true", "TRL's log_completions is monitor.log_completions"),
    ("report_to=wandb", "nearest: monitor.tensorboard: true, monitor.wandb_project"),
    ("push_to_hub=true", "nearest: freshroll export-model"),
    ("rollout.warmup_ratio=0.1", "freshroll's key for TRL's warmup_ratio is trainer.warmup"),
    ("importance_sampling_level=sequence", "TRL's importance_sampling_level is trainer.ratio"),
    ("max_prompt_length=64", "TRL's max_prompt_length is task.max_prompt_tokens"),
    ("gradient_checkpointing=true", "TRL's gradient_checkpointing is trainer.gradient_check"),
    ("trainer.top_k=5", "freshroll's key for TRL's top_k is rollout.top_k"),
    ("generation_kwargs={}", "TRL's generation_kwargs is rollout.*"),
    ("shuffle_dataset=false", "TRL's shuffle_dataset is not supported"),
])
def test_a_trl_name_is_never_a_misleading_did_you_mean(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    msg = str(err.value)
    assert said in msg and "did you mean" not in msg
    assert "docs/guide.md, 'TRL to freshroll'" in msg


def test_set_fields_sees_a_subclass_default() -> None:
    @dataclasses.dataclass
    class Mine(trl.GRPOConfig):  # type: ignore[misc]  # trl: an untyped dataclass
        learning_rate: float = 5e-4

    assert set_fields(Mine(use_cpu=True)) == {}

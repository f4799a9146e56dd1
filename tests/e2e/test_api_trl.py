"""A TRL script's objects given to freshroll.GRPOTrainer (issue 48, item 6): ``args`` as TRL's
GRPOConfig (mapped, warned or refused by :mod:`freshroll.trl_args`) and ``callbacks`` as
transformers TrainerCallbacks, called through the observer seam on a real run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from freshroll import GRPOTrainer
from freshroll.errors import ConfigError
from freshroll.trl_args import DroppedTrlArgs

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

FAST = {"run": {"progress": False, "max_staleness": 1}, "run.runtime": "inline",
        "task.n_prompts": 64}


class Recorder(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.logs: list[dict[str, float]] = []
        self.args: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.args = args
        self.events.append(("begin", state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.events.append(("step_end", state.global_step))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.events.append(("log", state.global_step))
        self.logs.append(dict(logs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.events.append(("end", state.global_step))


def test_a_grpoconfig_and_callbacks_train(tmp_path: Path) -> None:
    args = trl.GRPOConfig(use_cpu=True, output_dir=str(tmp_path / "run"), max_steps=2,
                          num_generations=4, per_device_train_batch_size=8,
                          max_completion_length=4, learning_rate=3e-4, seed=5)
    seen = Recorder()
    trainer = GRPOTrainer(args=args, reward_funcs="reverse", callbacks=[seen],
                          freshroll_args=FAST)
    cfg = trainer.config
    assert (cfg.run.steps, cfg.run.seed, cfg.trainer.lr) == (2, 5, 3e-4)
    assert (cfg.rollout.group_size, cfg.rollout.batch_groups, cfg.rollout.max_new_tokens) == (
        4, 2, 4)
    assert trainer.output_dir == tmp_path / "run"  # GRPOConfig's output_dir
    result = trainer.train(stream=io.StringIO())
    assert result.ok and result.summary["steps"] == 2
    assert seen.events == [("begin", 0), ("step_end", 1), ("log", 1), ("step_end", 2),
                           ("log", 2), ("end", 2)]
    assert seen.args is args
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [log["reward"] for log in seen.logs] == [r["reward_mean"] for r in rows]
    assert all("rewards/reverse/mean" in log and "completions/mean_length" in log
               for log in seen.logs)


def test_a_grpoconfig_that_would_train_otherwise_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"steps_per_generation=2"):
        GRPOTrainer(args=trl.GRPOConfig(use_cpu=True, steps_per_generation=2),
                    output_dir=tmp_path / "run")


def test_callbacks_that_are_not_trainercallbacks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"callbacks: expected transformers.TrainerCallback"):
        GRPOTrainer(callbacks=[print], output_dir=tmp_path / "run")


def test_trls_top_k_reaches_the_inline_engine(tmp_path: Path) -> None:
    """GRPOConfig(top_k=1) -> rollout.top_k -> every worker call: a group's completions are
    then one greedy path, so every group's rewards are alike (without it they are not)."""
    def zero_std(top_k: int, out: str) -> list[float]:
        args = trl.GRPOConfig(use_cpu=True, output_dir=str(tmp_path / out), max_steps=2,
                              num_generations=4, per_device_train_batch_size=16,
                              max_completion_length=4, top_k=top_k, seed=1)
        GRPOTrainer(args=args, reward_funcs="reverse", freshroll_args=FAST).train(
            stream=io.StringIO())
        rows = (tmp_path / out / "metrics.jsonl").read_text().splitlines()
        return [json.loads(r)["frac_reward_zero_std"] for r in rows]

    assert zero_std(1, "k1") == [1.0, 1.0]
    assert min(zero_std(0, "k0")) < 1.0


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"tools": [print]}, r"tools \(nearest: rollout\.workflow"),
    ({"optimizers": (object(), None)}, r"optimizers \(nearest: trainer\.optim"),
    ({"reward_processing_classes": [object()]}, r"reward_processing_classes \(nearest: "),
    ({"rollout_func": print}, r"rollout_func \(nearest: rollout\.workflow"),
])
def test_trl_arguments_without_a_counterpart_are_one_clear_error(
        kwargs: dict[str, Any], said: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=said):
        GRPOTrainer(output_dir=tmp_path / "run", **kwargs)


def test_a_reward_model_as_reward_func_is_refused_naming_it(tmp_path: Path) -> None:
    import torch

    with pytest.raises(ConfigError, match=r"reward_funcs\[1\]: a reward model object \(Linear\) "
                                          r"is not taken; give its save_pretrained directory"):
        GRPOTrainer(reward_funcs=["reverse", torch.nn.Linear(2, 1)], output_dir=tmp_path)


def test_grpoconfig_reward_weights_need_reward_funcs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reward_weights: given without reward_funcs"):
        GRPOTrainer(args=trl.GRPOConfig(use_cpu=True, reward_weights=[1.0]),
                    output_dir=tmp_path)
    got = GRPOTrainer(args=trl.GRPOConfig(use_cpu=True, reward_weights=[2.0]),
                      reward_funcs="reverse", output_dir=tmp_path).config
    assert got.rewards[0].weight == 2.0


def test_stock_transformers_callbacks_run_with_the_runs_own_arguments(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Given freshroll's keys, a callback's ``args`` is a TrainingArguments of the run's own
    settings; transformers' PrinterCallback and ProgressCallback run through a whole run."""
    seen = Recorder()
    out = tmp_path / "run"
    trainer = GRPOTrainer(reward_funcs="reverse", output_dir=out,
                          args={**FAST, "run.steps": 2, "run.seed": 4, "trainer.lr": 5e-4,
                                "rollout": {"group_size": 4, "batch_groups": 2,
                                            "max_new_tokens": 4}},
                          callbacks=[seen, transformers.PrinterCallback,
                                     transformers.ProgressCallback()])
    assert trainer.train(stream=io.StringIO()).ok
    assert isinstance(seen.args, transformers.TrainingArguments)
    assert (seen.args.output_dir, seen.args.max_steps, seen.args.seed,
            seen.args.learning_rate) == (str(out), 2, 4, 5e-4)
    assert "'reward':" in capsys.readouterr().out  # PrinterCallback printed each log



def exact(completions: list[str], target: list[str], **kwargs: Any) -> list[float]:
    return [float(c.strip() == t) for c, t in zip(completions, target, strict=True)]


def test_a_trl_script_runs_with_only_its_import_changed(tmp_path: Path) -> None:
    """The issue's goal: TRL's GRPOConfig, callbacks, LoRA and an eval set, as a TRL script
    writes them (``from trl import GRPOTrainer`` became ``from freshroll import ...``)."""
    from datasets import Dataset
    from peft import LoraConfig

    from freshroll.engines.tiny import save_tiny

    model_dir = save_tiny(tmp_path / "tiny", seed=0)
    rows = [{"prompt": f"rev {i:03d}=", "target": str(i).zfill(3)[::-1]} for i in range(16)]
    seen = Recorder()
    # --- the TRL script, unchanged but for the import ---
    training_args = trl.GRPOConfig(
        output_dir=str(tmp_path / "run"), use_cpu=True, max_steps=2, learning_rate=1e-3,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=4,
        eval_strategy="steps", eval_steps=1, logging_steps=1, report_to="none", seed=3)
    with pytest.warns(DroppedTrlArgs, match=r"logging_steps=1 \(nearest: every committed"):
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=exact, args=training_args,
            train_dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[:4]),
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            callbacks=[seen])
    trainer.train()
    # ---
    assert trainer.result.ok and trainer.result.summary["steps"] == 2
    cfg = trainer.config
    assert cfg.trainer.lora is not None and cfg.trainer.lora.r == 4
    assert (cfg.eval.every_steps, cfg.rollout.batch_groups) == (1, 2)
    assert [e for e in seen.events if e[0] != "log"] == [
        ("begin", 0), ("step_end", 1), ("step_end", 2), ("end", 2)]
    assert all("eval/reward" in log for log in seen.logs)


def test_trls_resume_from_checkpoint_resumes_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"

    def build(steps: int) -> GRPOTrainer:
        return GRPOTrainer(reward_funcs="reverse", output_dir=out,
                           args={**FAST, "run.steps": steps, "rollout": {
                               "group_size": 4, "batch_groups": 2, "max_new_tokens": 4}})

    assert build(2).train(stream=io.StringIO()).summary["steps"] == 2
    resumed = build(3).train(resume_from_checkpoint=True, stream=io.StringIO())
    assert resumed.ok and resumed.summary["steps"] == 3
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint: .* is not in output_dir"):
        build(4).train(resume_from_checkpoint=str(tmp_path / "elsewhere"))


def test_a_run_refused_at_its_checks_still_ends_its_callbacks(tmp_path: Path) -> None:
    seen = Recorder()
    trainer = GRPOTrainer(model=str(tmp_path / "no-model"), reward_funcs="reverse",
                          output_dir=tmp_path / "run", callbacks=[seen])
    with pytest.raises(ConfigError, match="model"):
        trainer.train(stream=io.StringIO())
    assert seen.events == [("begin", 0), ("end", 0)]

"""The Python API (:mod:`freshroll.api`): a run from Python objects, as a notebook makes one.

The embedded default and a user's model object, with an in-memory ``datasets.Dataset`` and
reward functions defined in the notebook (``python:`` rewards), train, verify, resume from
Python and export; the CLI refuses to resume a run whose rewards exist only in Python, with
the way to do it. A script calling the API at its top level, with no ``__main__`` guard,
runs under ``run.runtime: process`` (its worker children do not run the script again).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import OFFLINE, REPO, freshroll

from freshroll import GRPOTrainer
from freshroll.errors import ConfigError
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.rewards import inmemory

FAST = {"run": {"progress": False, "max_staleness": 1}, "run.runtime": "inline",
        "rollout": {"group_size": 4, "batch_groups": 2, "max_new_tokens": 4}}


def _rows(n: int = 12) -> list[dict[str, Any]]:
    return [{"prompt": f"rev {i:03d}=", "target": str(i).zfill(3)[::-1], "level": i % 3}
            for i in range(n)]


def test_the_embedded_default_trains_from_python(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trainer = GRPOTrainer(args={**FAST, "run.steps": 2, "task.n_prompts": 64}, output_dir=out)
    stream = io.StringIO()
    result = trainer.train(stream=stream)
    assert result.ok and result.summary["steps"] == 2
    assert f"verify: ok  report: {out / 'report.html'}" in stream.getvalue()  # as the CLI ends
    assert not (out / "inputs").exists()  # nothing given as an object: nothing saved
    exported = trainer.save_model(tmp_path / "exported")
    assert (exported / "config.json").is_file()


def test_a_users_model_dataset_and_notebook_rewards(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from freshroll.engines.tiny import build_tiny, save_model_dir

    save_model_dir(*build_tiny(1), tmp_path / "mine")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "mine")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "mine")
    seen: list[int] = []

    def exact(completions: list[str], target: list[str], **kwargs: Any) -> list[float]:
        seen.append(len(completions))  # a closure: defined in the notebook, not importable
        return [float(c.strip() == t) for c, t in zip(completions, target, strict=True)]

    def build(steps: int) -> GRPOTrainer:
        return GRPOTrainer(
            model=model, processing_class=tokenizer,
            reward_funcs=[exact, lambda completions, **kw: [-len(c) / 10 for c in completions]],
            reward_weights=[1.0, 0.5], train_dataset=Dataset.from_list(_rows()),
            args={**FAST, "run.steps": steps}, output_dir=tmp_path / "run")

    out = tmp_path / "run"
    result = build(2).train(stream=io.StringIO())
    assert result.ok and result.summary["steps"] == 2 and seen
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert [r["fn"] for r in saved["rewards"]] == ["python:exact", "python:lambda"]
    assert saved["model"]["path"] == str((out / "inputs" / "model").resolve())
    assert saved["task"]["file"] == str((out / "inputs" / "train").resolve())
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        scored = [e for _, e in ledger.events() if type(e).__name__ == "Rewarded"]
    assert scored and all(set(e.components) <= {"exact", "lambda"} for e in scored)

    # the notebook's cells run again, with more steps: the run resumes from Python
    resumed = build(3).train(resume=True, stream=io.StringIO())
    assert resumed.ok and resumed.summary["steps"] == 3

    # the CLI, in a fresh process (no registry), cannot import them: refused, saying how
    monkeypatch.setattr(inmemory, "_REGISTRY", {})
    proc = freshroll("run", "--resume", str(out), "run.steps=4", check=False)
    assert proc.returncode == 2
    assert "'python:exact' was a Python function given to freshroll.GRPOTrainer" in proc.stderr


def test_args_take_sections_dotted_keys_and_yaml_files(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trainer: {lr: 0.01}\ntask: {file: data.jsonl}\n")
    from_file = GRPOTrainer(args=cfg).config
    assert from_file.trainer.lr == 0.01
    assert from_file.task.file == str(tmp_path / "data.jsonl")  # from the file's folder
    mixed = GRPOTrainer(args={"trainer": {"lr": 0.02}, "trainer.kl_coef": 0.1,
                              "rewards.0.weight": 2}).config
    assert (mixed.trainer.lr, mixed.trainer.kl_coef, mixed.rewards[0].weight) == (0.02, 0.1, 2)
    assert GRPOTrainer(reward_funcs="reverse").config.rewards[0].fn == "reverse"


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"args": {"trainer": {"lr_rate": 1}}}, "trainer.lr_rate: unknown key"),
    ({"args": 3}, "args: expected a Config, a mapping"),
    ({"model": object()}, "model: expected a model directory or a transformers model"),
    ({"model": "m", "processing_class": object()}, "processing_class: the model directory's"),
    ({"reward_funcs": ["reverse"], "reward_weights": [1.0, 2.0]}, "2 weights for 1"),
    ({"reward_weights": [1.0]}, "reward_weights: given without reward_funcs"),
    ({"reward_funcs": [3]}, "reward_funcs: 3 is not callable"),
    ({"reward_funcs": []}, "at least one reward function"),
    ({"train_dataset": []}, "train_dataset: expected a datasets.Dataset"),
    ({"train_dataset": [{"prompt": "a"}, {"prompt": 3}]}, "train_dataset: the rows do not"),
    ({"reward_funcs": [lambda completions, **kw: [0.0] * len(completions)],
      "args": {"run.runtime": "ray"}}, "Ray's reward actors cannot import them"),
])
def test_bad_arguments_are_one_clear_error(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as err:
        GRPOTrainer(**kwargs)
    assert said in str(err.value)


def test_a_model_object_needs_its_tokenizer() -> None:
    from freshroll.engines.tiny import build_tiny

    model, _ = build_tiny(0)
    with pytest.raises(ConfigError, match="processing_class: a model object needs"):
        GRPOTrainer(model=model)


def test_importable_functions_are_recorded_by_reference() -> None:
    from freshroll.rewards import functions

    fn = next(f for f in vars(functions).values() if callable(f) and getattr(
        f, "__module__", "") == functions.__name__ and not isinstance(f, type))
    assert inmemory.register(fn) == f"freshroll.rewards.functions:{fn.__name__}"
    assert inmemory.register(lambda completions, **kw: []) == "python:lambda"
    with pytest.raises(ConfigError, match="exists only in that process"):
        inmemory.resolve("python:never_registered")


def test_a_local_modules_function_is_recorded_by_its_file(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``rewards.py`` beside the script (importable from its directory only) is recorded
    by its file's absolute path, which a ``freshroll run --resume`` started from another
    directory resolves (issue 48: ``rewards:positional`` failed there)."""
    from freshroll.rewards.scoring import build_reward_set

    home = tmp_path / "project"
    home.mkdir()
    (home / "local_rewards_x1.py").write_text(
        "def positional(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(home))
    import local_rewards_x1  # type: ignore[import-not-found]

    ref = inmemory.register(local_rewards_x1.positional)
    assert ref == f"{(home / 'local_rewards_x1.py').resolve()}:positional"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delitem(sys.modules, "local_rewards_x1")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(home)])
    rewards = build_reward_set([{"fn": ref}])
    assert [s.name for s in rewards.specs] == ["positional"]


SCRIPT = textwrap.dedent("""
    # a notebook's cells saved as a script: no `if __name__ == "__main__":` guard
    import io, json, sys
    from freshroll import GRPOTrainer

    def exact(completions, target, **kwargs):
        return [float(c.strip() == t) for c, t in zip(completions, target)]

    rows = [{"prompt": f"rev {i:03d}=", "target": str(i).zfill(3)[::-1]} for i in range(8)]
    trainer = GRPOTrainer(reward_funcs=exact, train_dataset=rows, output_dir=sys.argv[1],
                          args={"run.steps": 2, "run.progress": False, "run.runtime": "process",
                                "rollout": {"group_size": 4, "batch_groups": 2,
                                            "max_new_tokens": 4}})
    result = trainer.train(stream=io.StringIO())
    print("RESULT", json.dumps({"ok": result.ok, "steps": result.summary["steps"]}))
""")


@pytest.mark.slow  # a real run (make test-fast leaves it to make test)
def test_a_script_without_a_main_guard_runs_with_worker_processes(tmp_path: Path) -> None:
    """True subprocess: the script is ``__main__``, as ``python train.py`` makes it (the
    worker children of run.runtime: process once ran it again, failing the run)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], cwd=tmp_path,
                          env={**__import__("os").environ, **OFFLINE,
                               "PYTHONPATH": str(REPO / "src")},
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout + proc.stderr
    assert json.loads(lines[0].removeprefix("RESULT ")) == {"ok": True, "steps": 2}


def test_peft_config_is_trainer_lora(tmp_path: Path) -> None:
    from peft import LoraConfig

    trainer = GRPOTrainer(
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                               target_modules=["v_proj", "q_proj"]),
        args={**FAST, "run.steps": 1, "task.n_prompts": 32}, output_dir=tmp_path / "run")
    lora = trainer.config.trainer.lora
    assert lora is not None and (lora.r, lora.alpha, lora.target_modules) == (
        4, 8.0, ["q_proj", "v_proj"])
    assert trainer.train(stream=io.StringIO()).ok
    adapter = trainer.save_model(tmp_path / "adapter", adapter_only=True)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        f.name for f in adapter.iterdir()}
    assert not (adapter / "model.safetensors").exists()
    assert GRPOTrainer(peft_config={"r": 2}).config.trainer.lora.r == 2  # type: ignore[union-attr]
    every = GRPOTrainer(peft_config=LoraConfig(target_modules="all-linear")).config.trainer.lora
    assert every is not None and every.target_modules == "all-linear"  # peft's shorthand
    for bad, said in [(LoraConfig(use_dora=True), "use_dora set"),
                      (LoraConfig(target_modules=".*proj"), "a regular expression"),
                      ("lora", "expected a peft.LoraConfig")]:
        with pytest.raises(ConfigError, match=said):
            GRPOTrainer(peft_config=bad)

"""A real ``trainer.lora`` run: it trains, publishes only the adapter each version (bytes per
version measured), verifies, resumes after a SIGKILL and exports merged or adapter-only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from e2e_helpers import freshroll, metrics, summary
from transformers import AutoModelForCausalLM

from freshroll.errors import ConfigError
from freshroll.runtime.export import export_model
from freshroll.trainer.lora import merged_copy

pytestmark = pytest.mark.slow

LORA = ("trainer.lora.r=4", "trainer.lora.alpha=8",
        "trainer.lora.target_modules=[q_proj,v_proj,down_proj]")
IDS = torch.tensor([[1, 5, 6, 7, 8, 9]])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lora") / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=4", "run.progress=false",
              "trainer.checkpoint_every=2", "trainer.lr=0.01", *LORA, "--out", str(out))
    return out


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-step run without LoRA, which two tests read (its weights' bytes; an adapter-only
    export of it refused)."""
    out = tmp_path_factory.mktemp("full") / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=1", "run.progress=false",
              "--out", str(out))
    return out


def _adapter_bytes() -> int:
    # 2 layers x (q_proj [64->64], v_proj [64->64 (4 kv heads x 16)], down_proj [128->64]),
    # each A [4, in] + B [out, 4] in float32, plus the scale
    per_layer = (4 * 64 + 64 * 4) * 2 + (4 * 128 + 64 * 4)
    return (2 * per_layer + 1) * 4


def test_lora_run_publishes_only_the_adapter(run_dir: Path, full_run: Path) -> None:
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {r["weights_bytes"] for r in rows} == {_adapter_bytes()}
    s = summary(run_dir)
    assert s["weights_bytes_mean"] == _adapter_bytes() and s["weight_loads"] >= 3
    freshroll("verify", str(run_dir))
    # the checkpoints hold the adapters (and their optimizer state) alone
    from safetensors.torch import load_file

    ckpt = load_file(run_dir / "checkpoints" / "step-000004" / "model.safetensors")
    assert ckpt and all("lora_" in k for k in ckpt)
    assert metrics(full_run)[0]["weights_bytes"] > 20 * _adapter_bytes()


def test_export_merged_and_adapter_only(run_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    from freshroll.clock import RealClock
    from freshroll.config import read_yaml, validate
    from freshroll.kernel.buffer import replay_ledger
    from freshroll.kernel.results import KernelConfig
    from freshroll.ledger.store import LEDGER_FILE, Ledger
    from freshroll.runtime.learner import build_learner

    done = export_model(run_dir, tmp_path / "merged")
    freshroll("export-model", str(run_dir), str(tmp_path / "adapter"), "--adapter-only")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "merged" / "freshroll_export.json").read_text())["lora"] \
        == "merged"
    # the trainer's merged model at the same step, rebuilt from checkpoint + ledger
    cfg = validate(read_yaml(run_dir / "config.yaml"), "config")
    kernel = KernelConfig(cfg.run.max_staleness, cfg.rollout.batch_groups, cfg.rollout.group_size)
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        buf = replay_ledger(ledger, kernel, RealClock())
        learner = build_learner(cfg, run_dir / "model", buf, run_dir, quiet=True)
    trainer_merged = merged_copy(learner.model).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(run_dir / "model", local_files_only=True)
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        want = trainer_merged(input_ids=IDS).logits
        assert torch.equal(merged(input_ids=IDS).logits, want)
        torch.testing.assert_close(adapted(input_ids=IDS).logits, want, atol=1e-5, rtol=0)
        initial = AutoModelForCausalLM.from_pretrained(run_dir / "model", local_files_only=True)
        assert not torch.allclose(initial(input_ids=IDS).logits, want)  # it did train
    assert done.step == 4


def test_adapter_only_of_a_full_run_is_refused(full_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError,
                       match=r"--adapter-only \(adapter_only=True\): .*\(no trainer\.lora\)"):
        export_model(full_run, tmp_path / "x", adapter_only=True)
    assert not (tmp_path / "x").exists()


def test_lora_resumes_after_a_sigkill_and_verifies(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    # killed while the step-2 checkpoint is written: the resume replays from the initial
    # model (the adapters' fixed init) and the digests must match the ledger's. Inline on
    # one thread: a killed process of its own, without the forkserver (a second Python
    # importing torch) and the thread probe of run.runtime and run.torch_threads auto; the
    # process placement's LoRA run is tested below
    monkeypatch.setenv("FRESHROLL_CRASH_AT", "checkpoint")
    proc = freshroll("run", "configs/smoke.yaml", "run.steps=4", "run.progress=false",
                     "run.runtime=inline", "run.torch_threads=1", "trainer.checkpoint_every=2",
                     *LORA, "--out", str(out),
                     subprocess=True, check=False)
    assert proc.returncode != 0
    monkeypatch.delenv("FRESHROLL_CRASH_AT")
    assert "FRESHROLL_CRASH_AT" not in os.environ
    freshroll("run", "--resume", str(out), "run.steps=5", "run.progress=false")
    assert [r["step"] for r in metrics(out)][-1] == 5
    freshroll("verify", str(out))
    # the LoRA settings cannot change within a run
    proc = freshroll("run", "--resume", str(out), "run.steps=6", "trainer.lora.r=8",
                     check=False)
    assert proc.returncode != 0 and "trainer.lora" in proc.stdout + proc.stderr


@pytest.mark.parametrize("placement", [
    ("run.runtime=process",),
    pytest.param(("run.runtime=ray", "ray.trainer=actor"), marks=pytest.mark.ray),
], ids=["process", "ray-actor"])
def test_lora_under_process_and_ray_placements(tmp_path: Path,
                                                placement: tuple[str, ...]) -> None:
    """Each worker process (or Ray actor) merges the published adapter into its own base;
    under ray.trainer: actor the learner that wraps the model lives in an actor too."""
    out = tmp_path / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=2", "run.progress=false",
              *placement, "rollout.workers=2", *LORA, "--out", str(out))
    assert {r["weights_bytes"] for r in metrics(out)} == {_adapter_bytes()}
    freshroll("verify", str(out))


@pytest.mark.vllm
def test_lora_with_vllm_merges_on_the_driver(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    out = tmp_path / "vllm"
    freshroll("run", "configs/vllm.yaml", "run.steps=2", "run.progress=false", *LORA,
              "--out", str(out))
    assert {r["weights_bytes"] for r in metrics(out)} == {_adapter_bytes()}
    freshroll("verify", str(out))


def test_a_bad_target_is_refused_before_the_run_directory_is_written(tmp_path: Path) -> None:
    """Issue 48: a ``target_modules`` entry that matches nothing was found when the learner
    was built, after config.yaml, model/ and the ledger were written; the fixed command then
    said "already holds a run". Now ``config check`` and ``run`` refuse it first, and the
    fixed command runs in the same directory."""
    bad = "trainer.lora.target_modules=[q_proj,qkv]"
    check = freshroll("config", "check", "configs/smoke.yaml", bad, check=False)
    assert check.returncode == 2, check.stdout + check.stderr
    assert "trainer.lora.target_modules: 'qkv' matches no linear layer" in check.stderr
    out = tmp_path / "run"
    proc = freshroll("run", "configs/smoke.yaml", "run.steps=1", "run.progress=false", bad,
                     "--out", str(out), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trainer.lora.target_modules: 'qkv'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(p.name != "run.lock" for p in out.iterdir())
    fixed = freshroll("run", "configs/smoke.yaml", "run.steps=1", "run.progress=false",
                      "trainer.lora.target_modules=[q_proj]", "--out", str(out))
    assert "verify: ok" in fixed.stdout

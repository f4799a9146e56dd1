"""The body of benchmarks/gpu_check.sh: the vLLM engine on CUDA (see that script)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
#: Qwen2-0.5B's shape (its vocabulary replaced by the embedded character tokenizer's)
QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 4096, "tie_word_embeddings": True}


def build_model(path: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from freshroll.engines.tiny import VOCAB, build_tokenizer, save_model_dir

    tok = build_tokenizer()
    cfg = Qwen2Config(vocab_size=len(VOCAB), bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      torch_dtype="bfloat16", **QWEN2_05B)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return save_model_dir(model, tok, path)


async def engine_figures(path: Path, n_prompts: int, new_tokens: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    from freshroll.config.rollout import VLLMSection
    from freshroll.engines.seams import GenRequest, SamplingParams
    from freshroll.engines.vllm_engine import start_vllm_engine
    from freshroll.rewards.tasks import make_prompts

    section = VLLMSection(device="cuda", dtype="bfloat16", gpu_memory_utilization=0.4)
    t0 = time.perf_counter()
    eng = await start_vllm_engine(path, section, seed=0)
    out: dict[str, Any] = {"start_s": time.perf_counter() - t0}
    try:
        prompts = [p.text for p in make_prompts("reverse", n_prompts, 0, min_len=3, max_len=9)]
        reqs = [GenRequest(f"g{i}.0#1", f"g{i}", f"p{i}", t, 0) for i, t in enumerate(prompts)]
        params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
        times, toks = [], 0
        for r in range(3):
            got: dict[int, Any] = {}
            t1 = time.perf_counter()
            await eng.generate(reqs, params, r, lambda i, c, got=got: got.__setitem__(i, c))
            if r:
                times.append(time.perf_counter() - t1)
                toks = sum(len(c.token_ids) for c in got.values())
        out["gen_tokens_per_s"] = toks / statistics.median(times)
        out["gen_requests"], out["gen_new_tokens"] = n_prompts, new_tokens
        state = load_file(str(path / "model.safetensors"))
        loads = [await eng.load_weights(state) for _ in range(3)]
        out["weight_update_s"] = statistics.median(loads)
        out["params"] = sum(t.numel() for t in state.values())
    finally:
        await eng.close()
    return out


def run_figures(staleness: int, steps: int, work: Path) -> dict[str, Any]:
    out = work / f"run-s{staleness}"
    cmd = [sys.executable, "-m", "freshroll", "run", str(REPO / "configs" / "vllm.yaml"),
           "vllm.device=cuda", "vllm.dtype=bfloat16", "vllm.gpu_memory_utilization=0.2",
           f"run.max_staleness={staleness}", f"run.steps={steps}", "run.progress=false",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"staleness": staleness, "error": proc.stderr.strip().splitlines()[-3:]}
    s = json.loads((out / "summary.json").read_text())
    return {"staleness": staleness, "accepted_per_s": s["accepted_rollouts_per_s"],
            "trainer_idle": s["trainer_idle_ratio"], "transfer_s": s["weight_transfer_s_mean"],
            "reward_first": s["reward_first"], "reward_last": s["reward_last"]}


def main() -> int:
    ap = argparse.ArgumentParser(description="the vLLM engine on CUDA")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="freshroll-gpu-"))
    try:
        result: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
        path = build_model(work / "qwen2-0.5b-shape")
        result["engine"] = asyncio.run(engine_figures(path, a.prompts, a.new_tokens))
        print(f"[engine] {result['engine']}", flush=True)
        result["runs"] = [run_figures(s, a.steps, work) for s in (0, 1)]
        for r in result["runs"]:
            print(f"[run] {r}", flush=True)
        ok = [r for r in result["runs"] if "accepted_per_s" in r]
        if len(ok) == 2:
            result["async_over_sync"] = ok[1]["accepted_per_s"] / ok[0]["accepted_per_s"]
            print(f"async / sync accepted rollouts/s: {result['async_over_sync']:.2f}x")
        if a.json:
            a.json.write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The vLLM engine against the HF engine, side by side in one invocation (docs/benchmarks.md).

Two model shapes, both built locally with :func:`freshroll.engines.tiny.save_tiny` (the
embedded tokenizer; head_dim 32, the smallest vLLM's CPU attention accepts):

- ``tiny``: the embedded default with 2 heads instead of 4 (configs/vllm.yaml), ~0.1M params;
- ``4m``:   hidden 256, 4 layers, 8 heads, MLP 1024, ~3.2M params.

Figures, each printed as a table row and kept in ``--json``:

1. **Generation** (engine level, no run): 128 prompts of the reverse task, at two completion
   lengths (4 and 16 new tokens; ``--quick``: 4 only), temperature 1: generated tokens/s of
   the HF engine (one batch of 128) and of the vLLM engine (128 requests in flight through
   freshroll's async seam), the median of ``--reps`` calls after one warm-up; the ratio
   vLLM / HF.
2. **Weight update** per policy version: ``load_weights`` of the model's own state dict,
   median of ``--reps`` (HF: a copy into the live model; vLLM: safetensors in /dev/shm and an
   in-place reload in the engine process).
3. **Log-prob agreement** of the two engines' numerics: for vLLM's sampled tokens, the
   HF model's teacher-forced log-probs under the same processed distribution; the max
   absolute difference and the k3 mismatch KL ``mean(exp(d) - d - 1)``, d = hf - vllm.
4. **Full runs** (``freshroll run`` in a subprocess; start-up excluded from the rate by
   the summary's own definition): accepted rollouts/s of ``engine: hf`` and ``engine: vllm``,
   sync (``max_staleness 0``) and async (1), at each shape, with the mean per-step
   ``mismatch_kl`` (sync runs: pure numerics, every sample is on-policy) and verify's verdict.
5. **Learning**: reward over the first and last 10% of steps of async runs of both engines
   at ``--seeds`` (default 0 1 2) on the tiny shape.

Usage::

    .venv/bin/python benchmarks/vllm_engine.py                # everything, ~10 min on 2 cores
    .venv/bin/python benchmarks/vllm_engine.py --quick        # tiny shape, 4 tokens, 1 seed
    .venv/bin/python benchmarks/vllm_engine.py --json out.json --steps 60

Nothing is downloaded (``HF_HUB_OFFLINE=1``). A bad figure is printed as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
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

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"num_attention_heads": 2, "num_key_value_heads": 2},
    "4m": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8},
}
N_PROMPTS = 128


def _prompts(n: int) -> list[str]:
    from freshroll.rewards.tasks import make_prompts

    return [p.text for p in make_prompts("reverse", n, 0, min_len=3, max_len=3)]


def _median_time(fn: Any, reps: int) -> tuple[float, Any]:
    out, times = None, []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def engine_level(model_dir: Path, lengths: list[int], reps: int) -> dict[str, Any]:
    """Generation tokens/s, weight-update seconds and log-prob agreement of both engines."""
    import torch

    from freshroll.config.rollout import VLLMSection
    from freshroll.engines.hf import HFEngine
    from freshroll.engines.seams import GenRequest, SamplingParams
    from freshroll.engines.vllm_engine import start_vllm_engine

    prompts = _prompts(N_PROMPTS)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    hf = HFEngine.from_pretrained(model_dir)
    out: dict[str, Any] = {"params": sum(p.numel() for p in hf.model.parameters())}
    for n in lengths:
        hf.generate(prompts, max_new_tokens=n, seed=0)  # warm-up
        secs, comps = _median_time(lambda n=n: hf.generate(prompts, max_new_tokens=n, seed=1),
                                   reps)
        out[f"hf_tok_s_{n}"] = sum(len(c.token_ids) for c in comps) / secs
    state = hf.state_dict()
    out["hf_load_s"], _ = _median_time(lambda: hf.load_weights(state), reps)

    async def vllm_side() -> dict[str, Any]:
        res: dict[str, Any] = {}
        t0 = time.perf_counter()
        eng = await start_vllm_engine(model_dir, VLLMSection(), seed=0)
        res["vllm_start_s"] = time.perf_counter() - t0
        try:
            for n in lengths:
                params = SamplingParams(max_new_tokens=n, temperature=1.0, top_p=1.0)
                reqs = [GenRequest(f"g{i}.0#1", f"g{i}", f"p{i}", text, 0)
                        for i, text in enumerate(prompts)]
                times, toks, got = [], 0, {}
                for r in range(reps + 1):
                    got = {}
                    t1 = time.perf_counter()
                    await eng.generate(reqs, params, 1000 * r,
                                       lambda i, c, got=got: got.__setitem__(i, c))
                    if r:  # the first call is a warm-up
                        times.append(time.perf_counter() - t1)
                        toks = sum(len(c.token_ids) for c in got.values())
                res[f"vllm_tok_s_{n}"] = toks / statistics.median(times)
                if n == lengths[-1]:
                    res["_last"] = [got[i] for i in range(len(prompts))]
            loads = [await eng.load_weights(state) for _ in range(reps)]
            res["vllm_load_s"] = statistics.median(loads)
        finally:
            await eng.close()
        return res

    v = asyncio.run(vllm_side())
    comps = v.pop("_last")
    out.update(v)
    for n in lengths:
        out[f"ratio_tok_s_{n}"] = out[f"vllm_tok_s_{n}"] / out[f"hf_tok_s_{n}"]
    out.update(_agreement(hf, comps))
    return out


def _agreement(hf: Any, comps: list[Any]) -> dict[str, float]:
    """HF's teacher-forced log-probs (T=1) of vLLM's sampled tokens against vLLM's own."""
    import torch

    diffs: list[float] = []
    with torch.inference_mode():
        for c in comps:
            if not c.token_ids:
                continue
            ids = torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])
            logits = hf.model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            p = len(c.prompt_token_ids)
            for j, tok in enumerate(c.token_ids):
                diffs.append(float(lp[p + j - 1, tok]) - c.logprobs[j])
    kl = statistics.fmean(math.exp(d) - d - 1.0 for d in diffs) if diffs else float("nan")
    return {"logprob_max_abs_diff": max(abs(d) for d in diffs) if diffs else float("nan"),
            "logprob_mismatch_kl": kl, "logprob_tokens": float(len(diffs))}


def run_one(engine: str, shape: str, staleness: int, seed: int, steps: int,
            work: Path) -> dict[str, Any]:
    """One ``freshroll run`` in a subprocess; its summary's figures and per-step means."""
    out = work / f"{engine}-{shape}-s{staleness}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "freshroll", "run", str(REPO / "configs" / "vllm.yaml"),
            f"rollout.engine={engine}", f"run.max_staleness={staleness}", f"run.seed={seed}",
            f"run.steps={steps}", "run.progress=false", "--out", str(out)]
    args += [f"model.tiny.{k}={v}" for k, v in SHAPES[shape].items()]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"engine": engine, "shape": shape, "staleness": staleness, "seed": seed,
                "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    verify = subprocess.run([sys.executable, "-m", "freshroll", "verify", str(out)],
                            cwd=REPO, capture_output=True, text=True, check=False)
    summ = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kls = [r["mismatch_kl"] for r in rows if isinstance(r.get("mismatch_kl"), float)]
    return {"engine": engine, "shape": shape, "staleness": staleness, "seed": seed,
            "accepted_per_s": summ["accepted_rollouts_per_s"],
            "trainer_idle": summ["trainer_idle_ratio"], "reward_first": summ["reward_first"],
            "reward_last": summ["reward_last"], "transfer_s": summ["weight_transfer_s_mean"],
            "mismatch_kl_mean": statistics.fmean(kls) if kls else None,
            "mismatch_kl_max": max(kls) if kls else None,
            "verify": "ok" if verify.returncode == 0 else f"exit {verify.returncode}",
            "stopped": summ["verdict"]["stopped"], "process_wall_s": wall}


def _fmt(x: Any, spec: str = ".3g") -> str:
    return format(x, spec) if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shape, 4 tokens, seed 0")
    ap.add_argument("--steps", type=int, default=60, help="trainer steps of each full run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--reps", type=int, default=3, help="timed calls per engine figure")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--skip", nargs="*", default=[], choices=["engine", "runs", "learning"])
    a = ap.parse_args(argv)
    shapes = ["tiny"] if a.quick else list(SHAPES)
    lengths = [4] if a.quick else [4, 16]
    seeds = a.seeds[:1] if a.quick else a.seeds
    steps = min(a.steps, 10) if a.quick else a.steps
    import torch
    import transformers
    import vllm

    result: dict[str, Any] = {
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "python": platform.python_version(), "cpus": os.cpu_count()},
        "engine": {}, "runs": [], "learning": []}
    work = Path(tempfile.mkdtemp(prefix="freshroll-vllm-bench-"))
    try:
        from freshroll.engines.tiny import save_tiny

        if "engine" not in a.skip:
            for shape in shapes:
                d = save_tiny(work / f"model-{shape}", **SHAPES[shape])
                fig = engine_level(d, lengths, a.reps)
                result["engine"][shape] = fig
                print(f"[engine] {shape} ({fig['params'] / 1e6:.2f}M params): "
                      + "  ".join(f"{k} {_fmt(v)}" for k, v in fig.items() if k != "params"),
                      flush=True)
        if "runs" not in a.skip:
            for shape in shapes:
                for staleness in (0, 1):
                    for engine in ("hf", "vllm"):
                        row = run_one(engine, shape, staleness, seeds[0], steps, work)
                        result["runs"].append(row)
                        print("[run] " + "  ".join(f"{k} {_fmt(v)}" for k, v in row.items()),
                              flush=True)
        if "learning" not in a.skip:
            done = {(r["engine"], r["seed"]): r for r in result["runs"]
                    if r["shape"] == "tiny" and r["staleness"] == 1}
            for seed in seeds:
                for engine in ("hf", "vllm"):
                    row = done.get((engine, seed)) or run_one(engine, "tiny", 1, seed, steps,
                                                              work)
                    result["learning"].append(row)
                    print(f"[learn] {engine} seed {seed}: reward {_fmt(row.get('reward_first'))}"
                          f" -> {_fmt(row.get('reward_last'))}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


def table(result: dict[str, Any]) -> str:
    """The markdown tables of docs/benchmarks.md."""
    lines = []
    if result["engine"]:
        lines += ["", "| shape | params | tokens | HF tok/s | vLLM tok/s | vLLM / HF | "
                  "HF load s | vLLM load s | logprob max abs diff | mismatch KL |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for shape, f in result["engine"].items():
            for k in sorted(int(k.rsplit("_", 1)[1]) for k in f if k.startswith("hf_tok_s_")):
                lines.append(
                    f"| {shape} | {f['params'] / 1e6:.2f}M | {k} | {f[f'hf_tok_s_{k}']:.0f} | "
                    f"{f[f'vllm_tok_s_{k}']:.0f} | {f[f'ratio_tok_s_{k}']:.2f}x | "
                    f"{f['hf_load_s']:.4f} | {f['vllm_load_s']:.3f} | "
                    f"{f['logprob_max_abs_diff']:.2e} | {f['logprob_mismatch_kl']:.2e} |")
    if result["runs"]:
        lines += ["", "| shape | mode | engine | accepted/s | trainer idle | transfer s | "
                  "mismatch KL mean (max) | reward first -> last | verify |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in result["runs"]:
            mode = "sync" if r["staleness"] == 0 else "async"
            if "error" in r:
                lines.append(f"| {r['shape']} | {mode} | {r['engine']} | error: {r['error']} "
                             "| | | | | |")
                continue
            lines.append(
                f"| {r['shape']} | {mode} | {r['engine']} | {r['accepted_per_s']:.0f} | "
                f"{r['trainer_idle']:.1%} | {_fmt(r['transfer_s'])} | "
                f"{_fmt(r['mismatch_kl_mean'])} ({_fmt(r['mismatch_kl_max'])}) | "
                f"{_fmt(r['reward_first'])} -> {_fmt(r['reward_last'])} | {r['verify']} |")
    if result["learning"]:
        lines += ["", "| engine | seed | reward first 10% | reward last 10% |", "|---|---|---|---|"]
        for r in result["learning"]:
            lines.append(f"| {r['engine']} | {r['seed']} | {_fmt(r.get('reward_first'))} | "
                         f"{_fmt(r.get('reward_last'))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

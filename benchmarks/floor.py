"""The machine's floor: the leanest correct PyTorch loop for one GRPO step (issue 25).

The time a step cannot beat on this machine, at the same work as a freshroll or TRL step:

1. **generate**: KV-cache sampling of the whole batch (``batch_groups x group_size`` rows,
   the run's real prompts, left-padded, position ids counting real tokens), one token per
   row per forward pass, ``softmax(logits / T)`` sampling, each row stopping at eos, the
   batch stopping when every row has (or at ``max_new_tokens``);
2. **train**: one forward and backward over prompt + completion (the same left-padded
   layout, no re-collation), the log-probabilities of the completion positions only
   (``logits_to_keep``), the GRPO loss against the detached log-probs (on-policy: ratio 1,
   the gradient of the clipped PPO term), gradient-norm clip and AdamW.

No ledger, no reward function, no checks, no metrics beyond the two timings. The rewards
are random (the work of a step does not depend on their values). At 1 intra-op thread and
at all the cores (``--threads``); a step's time is the median over ``--steps`` after
``--warmup`` untimed steps.

Usage::

    .venv/bin/python benchmarks/floor.py                         # tiny/1m/5m x 4/16 tokens
    .venv/bin/python benchmarks/floor.py --sizes 1m --lengths 8 --threads 1 2 --json f.json

:func:`measure` is what ``async_sweep.py`` calls for its ``floor`` system.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class Floor:
    """Median seconds of each half of a step, at ``threads`` intra-op threads."""

    threads: int
    rows: int
    new_tokens: int
    gen_s: float
    train_s: float
    steps: int

    @property
    def step_s(self) -> float:
        return self.gen_s + self.train_s

    @property
    def rollouts_per_s(self) -> float:
        return self.rows / self.step_s if self.step_s > 0 else float("nan")


def _left_pad(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids, mask


def generate(model: Any, ids: Any, mask: Any, new_tokens: int, temperature: float,
             eos: int, pad: int, gen: Any) -> tuple[Any, Any]:
    """Sampled tokens ``[B, T]`` (pad after eos) and the completion mask."""
    import torch

    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    logits_to_keep=1)
        cache, nxt = out.past_key_values, pos[:, -1:] + 1
        done = torch.zeros(ids.shape[0], dtype=torch.bool)
        toks, alive_cols = [], []
        for t in range(new_tokens):
            probs = torch.softmax(out.logits[:, -1].float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1).masked_fill(done, pad)
            alive_cols.append(~done)
            toks.append(tok)
            done = done | (tok == eos)
            if t == new_tokens - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, alive_cols[-1].long()[:, None]], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=nxt,
                        past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, nxt + 1
    return torch.stack(toks, 1), torch.stack(alive_cols, 1).long()


def train(model: Any, opt: Any, ids: Any, mask: Any, toks: Any, cmask: Any, adv: Any,
          temperature: float) -> None:
    """One forward+backward over prompt+completion, completion log-probs only, AdamW."""
    import torch

    full = torch.cat([ids, toks], 1)
    attn = torch.cat([mask, cmask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    c = toks.shape[1]
    logits = model(input_ids=full, attention_mask=attn, position_ids=pos,
                   logits_to_keep=c + 1).logits[:, :-1].float() / temperature
    logp = logits.gather(-1, toks[:, :, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    m = cmask.float()
    # the clipped PPO term on-policy: -exp(logp - sg[logp]) * A, per-sequence token mean
    per_tok = -torch.exp(logp - logp.detach()) * adv[:, None]
    loss = ((per_tok * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def measure(model_dir: Path, prompts: list[str], *, rows: int, group_size: int,
            new_tokens: int, threads: int, steps: int = 5, warmup: int = 1,
            temperature: float = 1.0, lr: float = 1e-3, seed: int = 0) -> Floor:
    """The floor's median step at ``threads`` threads (the caller's thread count restored)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        eos = int(tok.eos_token_id)
        pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)  # TRL's default kernel
        gen = torch.Generator().manual_seed(seed)
        groups = rows // group_size
        gens, trains = [], []
        for i in range(warmup + steps):
            picked = [prompts[(i * groups + g) % len(prompts)] for g in range(groups)]
            encoded = [tok(p, add_special_tokens=False)["input_ids"] or [pad]
                       for p in picked for _ in range(group_size)]
            t0 = time.perf_counter()
            ids, mask = _left_pad(encoded, pad)
            model.eval()
            toks, cmask = generate(model, ids, mask, new_tokens, temperature, eos, pad, gen)
            t1 = time.perf_counter()
            model.train()
            adv = torch.randn(rows, generator=gen)
            train(model, opt, ids, mask, toks, cmask, adv, temperature)
            t2 = time.perf_counter()
            if i >= warmup:
                gens.append(t1 - t0)
                trains.append(t2 - t1)
        return Floor(threads, rows, new_tokens, statistics.median(gens),
                     statistics.median(trains), steps)
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> int:
    import async_sweep
    import vs_trl

    vs_trl._offline()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="freshroll config overrides (key=value)")
    ap.add_argument("--sizes", nargs="+", choices=list(async_sweep.SIZES),
                    default=list(async_sweep.SIZES))
    ap.add_argument("--lengths", nargs="+", type=int, default=list(async_sweep.LENGTHS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, os.cpu_count() or 1])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        for size in args.sizes:
            model_dir = async_sweep.build_model(Path(tmp), size)
            for length in args.lengths:
                cfg = vs_trl.freshroll_config(
                    args.steps, 0, (0, "inline"), model_dir,
                    [*args.overrides, f"rollout.max_new_tokens={length}"])
                prompts, _ = vs_trl.prompt_rows(cfg)
                r = cfg.rollout
                for n in args.threads:
                    f = measure(model_dir, prompts, rows=r.batch_groups * r.group_size,
                                group_size=r.group_size, new_tokens=length, threads=n,
                                steps=args.steps, temperature=r.temperature or 1.0,
                                lr=cfg.trainer.lr)
                    load = os.getloadavg()[0]
                    print(f"{size:>4} {length:>3} tokens {n} threads: generate {f.gen_s:.3f} s"
                          f"  train {f.train_s:.3f} s  step {f.step_s:.3f} s"
                          f"  {f.rollouts_per_s:.0f} rollouts/s  (load {load:.2f})", flush=True)
                    out.append({"size": size, "length": length, **asdict(f),
                                "step_s": f.step_s, "load": load})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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

With ``shared=True`` (the ``floor-shared`` system of ``async_sweep.py``) both halves run
each distinct prompt once and index its KV cache to its group's rows, as freshroll's engine
and learner do (``freshroll/engines/prefix.py``): the leanest loop for the same work *with*
that saving, the floor a freshroll step is held to; the plain floor is the leanest loop over
full rows, as TRL runs them.

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
             eos: int, pad: int, gen: Any, rows: Any = None) -> tuple[Any, Any]:
    """Sampled tokens ``[B, T]`` (pad after eos) and the completion mask. ``rows``: each
    row's prompt, an index into ``ids`` (the distinct prompts); None: ``ids`` are the rows."""
    import torch

    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1]
        if rows is not None:
            cache.batch_select_indices(rows)
            logits, mask, pos = logits[rows], mask[rows], pos[rows]
        nxt = pos[:, -1:] + 1
        done = torch.zeros(mask.shape[0], dtype=torch.bool)
        toks, alive_cols = [], []
        for t in range(new_tokens):
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(-1).masked_fill(done, pad)
            alive_cols.append(~done)
            toks.append(tok)
            done = done | (tok == eos)
            if t == new_tokens - 1 or bool(done.all()):
                break
            mask = torch.cat([mask, alive_cols[-1].long()[:, None]], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=nxt,
                        past_key_values=cache, use_cache=True)
            cache, nxt, logits = out.past_key_values, nxt + 1, out.logits[:, -1]
    return torch.stack(toks, 1), torch.stack(alive_cols, 1).long()


def train(model: Any, opt: Any, ids: Any, mask: Any, toks: Any, cmask: Any, adv: Any,
          temperature: float, rows: Any = None) -> None:
    """One forward+backward over prompt+completion, completion log-probs only, AdamW.
    ``rows``: as :func:`generate`'s (each distinct prompt's positions run once)."""
    import torch

    c = toks.shape[1]
    if rows is None:
        full = torch.cat([ids, toks], 1)
        attn = torch.cat([mask, cmask], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=full, attention_mask=attn, position_ids=pos,
                       logits_to_keep=c + 1).logits[:, :-1].float() / temperature
    else:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    logits_to_keep=1)
        first = out.logits[:, -1:][rows]
        if c > 1:
            cache = out.past_key_values
            cache.batch_select_indices(rows)
            rest = model(input_ids=toks[:, :-1], position_ids=pos[rows, -1:] + 1
                         + torch.arange(c - 1), past_key_values=cache, use_cache=True,
                         attention_mask=torch.cat([mask[rows], cmask[:, :-1]], 1)).logits
            first = torch.cat([first, rest], 1)
        logits = first.float() / temperature
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
            temperature: float = 1.0, lr: float = 1e-3, seed: int = 0,
            shared: bool = False) -> Floor:
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
            encoded = [tok(p, add_special_tokens=False)["input_ids"] or [pad] for p in picked]
            t0 = time.perf_counter()
            if shared:  # each distinct prompt once; its group's rows index it
                index = torch.arange(groups).repeat_interleave(group_size)
                ids, mask = _left_pad(encoded, pad)
            else:
                index = None
                ids, mask = _left_pad([e for e in encoded for _ in range(group_size)], pad)
            model.eval()
            toks, cmask = generate(model, ids, mask, new_tokens, temperature, eos, pad, gen,
                                   index)
            t1 = time.perf_counter()
            model.train()
            adv = torch.randn(rows, generator=gen)
            train(model, opt, ids, mask, toks, cmask, adv, temperature, index)
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
    ap.add_argument("--shared", action="store_true",
                    help="also the shared-prompt floor (each distinct prompt's positions once)")
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
                for n, shared in ((n, s) for n in args.threads
                                  for s in ((False, True) if args.shared else (False,))):
                    f = measure(model_dir, prompts, rows=r.batch_groups * r.group_size,
                                group_size=r.group_size, new_tokens=length, threads=n,
                                steps=args.steps, temperature=r.temperature or 1.0,
                                lr=cfg.trainer.lr, shared=shared)
                    load = os.getloadavg()[0]
                    kind = "shared" if shared else "plain"
                    print(f"{size:>4} {length:>3} tokens {kind} {n} threads: "
                          f"generate {f.gen_s:.3f} s"
                          f"  train {f.train_s:.3f} s  step {f.step_s:.3f} s"
                          f"  {f.rollouts_per_s:.0f} rollouts/s  (load {load:.2f})", flush=True)
                    out.append({"size": size, "length": length, "shared": shared, **asdict(f),
                                "step_s": f.step_s, "load": load})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""freshroll's generation and training calls against the floor's, same batch, interleaved.

Issue 25, item 3: is a freshroll step's compute at the machine's floor? For each model size,
completion length and intra-op thread count, one process loads the model three times (the
floor's copy, an :class:`~freshroll.engines.hf.HFEngine`, a
:class:`~freshroll.trainer.grpo.GRPOLearner`) and times, round by round on one thread:

- ``floor gen``  :func:`floor.generate` (KV-cache sampling of the batch, left-padded);
- ``engine gen`` ``HFEngine.generate`` of the same prompts (what an inline worker runs);
- ``floor train`` :func:`floor.train` (forward+backward over prompt + completion, completion
  log-probs only, AdamW);
- ``learner step`` ``GRPOLearner.step`` on the engine's completions (collation, the GRPO
  loss with its importance weights, entropy, the finiteness checks, AdamW) and the weights'
  digest that every commit records.

Each figure is the median of ``--rounds`` after one untimed round; the ratio column is
freshroll over the floor. Everything runs on the calling thread (one OpenMP team, as a sync
run's one compute thread: docs/overlap.md).

Usage::

    .venv/bin/python benchmarks/stage_vs_floor.py                 # tiny/1m/5m x 4/16 x 1/2
    .venv/bin/python benchmarks/stage_vs_floor.py --sizes 1m --lengths 8 --threads 2
    .venv/bin/python benchmarks/stage_vs_floor.py --sizes 1m --lengths 4 --threads 2 --profile 12

``--profile TOP`` adds one round under ``torch.profiler`` after the timing and prints, per
pair (engine gen / floor gen, learner step / floor train), the TOP ops by self CPU time of
freshroll's call beside the floor's, and each call's profiled wall: where the gap is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


Profile = dict[str, dict[str, tuple[float, int]]]  # call -> op -> (self CPU ms, calls)


def measure(model_dir: Path, prompts: list[str], new_tokens: int, threads: int,
            rounds: int, profiles: Profile | None = None,
            shared: bool = False) -> dict[str, float]:
    """Median seconds of each call, by name (see the module doc); with ``profiles`` (a dict
    to fill) one more round under ``torch.profiler``: each call's ops by self CPU time.
    ``shared``: the floor's halves run each distinct prompt once (``floor.py``'s shared
    form, as freshroll's engine and learner do), not the full rows."""
    import torch
    from transformers import AutoModelForCausalLM

    import floor
    from freshroll.config.train import TrainerSection
    from freshroll.engines.hf import HFEngine
    from freshroll.engines.prefix import unique_rows
    from freshroll.trainer.grpo import GRPOLearner, TrainSample
    from freshroll.trainer.replay import weights_digest

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    engine = HFEngine.from_pretrained(model_dir)
    fm = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    opt = torch.optim.AdamW(fm.parameters(), lr=1e-3, fused=True)  # as floor.py
    lm = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    learner = GRPOLearner(lm, TrainerSection(), temperature=1.0, pad_id=engine.pad_id,
                          max_new_tokens=new_tokens)
    eos, pad = min(engine.eos_ids), engine.pad_id
    gen = torch.Generator().manual_seed(0)
    encoded = [engine.tokenizer.encode(p) for p in prompts]
    unique, index = unique_rows(encoded)
    rows = torch.tensor(index) if shared else None
    times: dict[str, list[float]] = {k: [] for k in
                                     ("floor gen", "engine gen", "floor train", "learner step")}
    for r in range(rounds + 1 + (profiles is not None)):
        prof = r == rounds + 1  # the extra round, profiled
        if prof:
            assert profiles is not None
            marks = {k: _Marked() for k in times}
        t0 = time.perf_counter()
        with marks["engine gen"] if prof else _nothing():
            comps = engine.generate(prompts, max_new_tokens=new_tokens, seed=r)
        t1 = time.perf_counter()
        with marks["floor gen"] if prof else _nothing():
            ids, mask = floor._left_pad(unique if shared else encoded, pad)
            fm.eval()
            toks, cmask = floor.generate(fm, ids, mask, new_tokens, 1.0, eos, pad, gen, rows)
        t2 = time.perf_counter()
        with marks["floor train"] if prof else _nothing():
            fm.train()
            floor.train(fm, opt, ids, mask, toks, cmask,
                        torch.randn(len(prompts), generator=gen), 1.0, rows)
        t3 = time.perf_counter()
        with marks["learner step"] if prof else _nothing():
            group = max(1, len(prompts) // 8)
            samples = [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, float(j % 3),
                                   j // group, 0) for j, c in enumerate(comps)]
            learner.step(samples)
            weights_digest(learner.model)
        t4 = time.perf_counter()
        if prof:
            assert profiles is not None
            for k, m in marks.items():
                profiles[k] = m.ops
        elif r:
            for k, v in zip(times, (t2 - t1, t1 - t0, t3 - t2, t4 - t3), strict=True):
                times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}


class _Marked:
    """A block run under ``torch.profiler`` (CPU): its ops' self CPU ms and call counts."""

    def __enter__(self) -> None:
        import torch

        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.t0 = time.perf_counter()
        self.prof.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.prof.__exit__(None, None, None)
        wall = (time.perf_counter() - self.t0) * 1000
        self.ops = {e.key: (e.self_cpu_time_total / 1000, e.count)
                    for e in self.prof.key_averages()}
        self.ops["(wall, profiled)"] = (wall, 1)


class _nothing:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def profile_table(profiles: Profile, ours: str, floors: str, top: int) -> list[str]:
    """Markdown rows: the ``top`` ops by self CPU ms in ``ours``, beside the floor's."""
    a, b = profiles[ours], profiles[floors]
    keys = sorted((k for k in a if not k.startswith("(")), key=lambda k: -a[k][0])[:top]
    rows = [f"| op | {floors} ms (calls) | {ours} ms (calls) |", "|---|---|---|"]
    for k in [*keys, "(wall, profiled)"]:
        fa, fb = a.get(k, (0.0, 0)), b.get(k, (0.0, 0))
        rows.append(f"| `{k}` | {fb[0]:.2f} ({fb[1]}) | {fa[0]:.2f} ({fa[1]}) |")
    return rows


def main(argv: list[str] | None = None) -> int:
    import async_sweep
    import vs_trl

    vs_trl._offline()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=list(async_sweep.SIZES),
                    default=list(async_sweep.SIZES))
    ap.add_argument("--lengths", nargs="+", type=int, default=[4, 16])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, os.cpu_count() or 1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="after the timing, one round under torch.profiler: the TOP ops by "
                    "self CPU time of each freshroll call beside the floor's (tables)")
    ap.add_argument("--shared", action="store_true",
                    help="the shared-prompt floor (each distinct prompt's positions once)")
    args = ap.parse_args(argv)
    print(f"floor: {'shared prompts' if args.shared else 'full rows'}")
    print(f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}; medians of "
          f"{args.rounds} rounds, ms per call (ratio: freshroll / floor)")
    print("| params | new tok | threads | floor gen | engine gen | ratio | floor train "
          "| learner step | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    tables: list[tuple[str, Profile]] = []
    with tempfile.TemporaryDirectory(prefix="stage-floor-") as tmp:
        for size in args.sizes:
            model_dir = async_sweep.build_model(Path(tmp), size)
            for length in args.lengths:
                cfg = vs_trl.freshroll_config(1, 0, (0, "inline"), model_dir,
                                              [f"rollout.max_new_tokens={length}"])
                prompts, _ = vs_trl.prompt_rows(cfg)
                rows = cfg.rollout.batch_groups * cfg.rollout.group_size
                batch = [p for p in prompts[: cfg.rollout.batch_groups]
                         for _ in range(cfg.rollout.group_size)][:rows]
                for n in args.threads:
                    profiles: Profile | None = {} if args.profile else None
                    m = {k: v * 1000 for k, v in
                         measure(model_dir, batch, length, n, args.rounds, profiles,
                                 args.shared).items()}
                    print(f"| {size} | {length} | {n} | {m['floor gen']:.1f} | "
                          f"{m['engine gen']:.1f} | {m['engine gen'] / m['floor gen']:.2f} | "
                          f"{m['floor train']:.1f} | {m['learner step']:.1f} | "
                          f"{m['learner step'] / m['floor train']:.2f} |", flush=True)
                    if profiles:
                        tables.append((f"{size}, {length} new tokens, {n} thread(s)",
                                       profiles))
    for title, profiles in tables:
        for ours, floors in (("engine gen", "floor gen"), ("learner step", "floor train")):
            print(f"\n{title}: {ours} against {floors}, one profiled round\n")
            print("\n".join(profile_table(profiles, ours, floors, args.profile)))
    print(f"load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

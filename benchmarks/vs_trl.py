"""freshroll (sync and async) against TRL's ``GRPOTrainer``, side by side in one process.

The same tiny Llama (``save_tiny(dir, seed=0)``, loaded with ``from_pretrained``), the
same digit-reversal prompts in the same order, the same reward function
(:func:`freshroll.rewards.functions.reverse_reward`, passed to TRL as ``reward_funcs``),
the same group size, prompts per optimizer step, completion length, temperature,
learning rate, optimizer (AdamW, constant LR, grad-norm clip 1.0), clip range, loss
aggregation and advantage scaling, no KL (beta 0), one optimizer step per generation
batch. Every TRL setting is derived from the freshroll config (the embedded default,
plus any ``key=value`` overrides given on the command line), so the two cannot drift.

Systems (``--systems``), interleaved seed by seed (the order rotates with the seed) so that
noise on a shared machine hits them alike:

- ``trl-1t``:       TRL ``GRPOTrainer``, ``torch.set_num_threads(1)``;
- ``trl-default``:  the same at torch's default thread count (all the cores: as a user runs
  it); every ratio to TRL is to the faster of the two ("best TRL": the peer at its best);
- ``freshroll-sync``:    ``freshroll.runtime.run.run`` with ``run.max_staleness=0``,
  ``run.runtime`` and ``run.torch_threads`` auto (each stage's threads settled on its steps);
- ``freshroll-default``: the embedded default: ``run.max_staleness=1``, both auto;
- ``freshroll-async-1t``: async inline at one thread (the earlier benchmark's system);
- ``freshroll-async-ray``: async with ``run.runtime=ray`` (engine in a Ray actor process).

Figures per run:

- wall s: TRL: ``trainer.train()`` (model building excluded); freshroll: the run's
  ``summary.json`` ``wall_s`` (first ``opened`` event to last ``committed``: includes the
  run's own model loading, the per-step checkpoint and the durable ledger commits);
- accepted rollouts/s: completions consumed by committed optimizer steps / wall s
  (TRL: ``global_step * per_device_train_batch_size``; freshroll: its summary's figure);
- reward first / last: mean batch reward over the first and last 10% of steps
  (TRL: ``trainer.state.log_history`` ``reward`` with ``logging_steps=1``; freshroll:
  ``metrics.jsonl`` ``reward_mean``), and the mean over all steps.

- time to reward: the wall seconds from the start of training until the mean reward of the
  last 10 steps first reaches ``--reward-level`` (0.5: the embedded default's task), NaN
  where a run never reaches it.
- **the headline** (printed first, issue 46): time to 90% of freshroll-sync's last-10%
  reward, per system, beside accepted rollouts/s and the last-10% reward, each as a ratio to
  sync and to the best TRL: a rate is never read without the learning it bought.

Goals (issue 25, against the best TRL): freshroll-default >= 1.3x its accepted
rollouts/s, freshroll-sync >= 1.0x; freshroll-default's time to reward <= 0.77x the best
TRL's and <= freshroll-sync's; reward at equal steps (last 10%) of freshroll-default not
below the best TRL's or freshroll-sync's by more than 2 standard errors of the difference
across seeds. The script prints PASS/MISS and always the figures it measured.

Usage::

    .venv/bin/pip install -e '.[bench]'          # TRL
    .venv/bin/python benchmarks/vs_trl.py                      # 100 steps x 3 seeds
    .venv/bin/python benchmarks/vs_trl.py --quick              # smoke run (seconds)
    .venv/bin/python benchmarks/vs_trl.py --steps 400           # time to reward 0.5, 3 seeds
    .venv/bin/python benchmarks/vs_trl.py --steps 200 --seeds 0 1 2 3 --json out.json
    .venv/bin/python benchmarks/vs_trl.py trainer.lr=5e-4      # freshroll config overrides

Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before any Hugging Face import.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GOAL_DEFAULT, GOAL_SYNC, GOAL_TIME = 1.3, 1.0, 0.77
#: name -> (max_staleness, run.runtime, run.torch_threads)
FRESHROLL_SYSTEMS: dict[str, tuple[int, str, int | str]] = {
    "freshroll-sync": (0, "auto", "auto"),
    "freshroll-default": (1, "auto", "auto"),
    "freshroll-async-1t": (1, "inline", 1),
    "freshroll-async-ray": (1, "ray", "auto"),
}
DEFAULT_SYSTEMS = ["trl-1t", "trl-default", "freshroll-sync", "freshroll-default"]
#: torch's default intra-op threads in this fresh process, read by :func:`main` before any run
#: sets them (a freshroll run leaves the main thread at its budget, often 1: read afterwards,
#: "trl-default" ran at one thread, as the 2026-12-05 night measurement found)
TORCH_DEFAULT_THREADS = 0
SMOOTH = 10  # steps of the trailing mean that time to reward reads


def _offline() -> None:
    """Never reach the hub; must run before anything imports huggingface_hub."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLED", "true")


@dataclass
class Result:
    system: str
    seed: int
    threads: int
    steps: int
    wall_s: float
    rollouts: int
    rollouts_per_s: float
    reward_first: float
    reward_last: float
    reward_all: float
    outer_s: float  # the whole call, model building and (freshroll) report/verify included
    cpu_s: float  # process CPU time (all threads) over the timed span; see ``cpu_ratio``
    rewards: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)  # each step's end, s from training's start


def time_to_reward(rewards: list[float], times: list[float], level: float,
                   smooth: int = SMOOTH) -> float:
    """Seconds until the trailing mean of ``smooth`` steps' rewards first reaches ``level``
    (NaN if it never does, or without per-step times)."""
    if len(times) != len(rewards):
        return math.nan
    for i in range(len(rewards)):
        window = rewards[max(0, i + 1 - smooth): i + 1]
        if i + 1 >= min(smooth, len(rewards)) and statistics.fmean(window) >= level:
            return times[i]
    return math.nan


def edge_means(rewards: list[float], frac: float = 0.1) -> tuple[float, float, float]:
    """Mean of the first and last ``frac`` of the steps (at least one), and of all steps."""
    if not rewards:
        return math.nan, math.nan, math.nan
    k = max(1, round(frac * len(rewards)))
    return (
        statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:]), statistics.fmean(rewards)
    )


# --- the shared setup -------------------------------------------------------------------


def freshroll_config(
    steps: int, seed: int, system: tuple[int, str] | tuple[int, str, int | str],
    model_dir: Path, overrides: list[str], torch_threads: int | str = 1,
):
    """The freshroll config of one run (``system``: (max_staleness, run.runtime[,
    run.torch_threads])); the TRL settings are derived from it (:func:`trl_args`).
    ``torch_threads``: ``run.torch_threads`` where ``system`` names none."""
    from freshroll.config import load_config

    staleness, runtime = system[0], system[1]
    if len(system) > 2:
        torch_threads = system[2]  # type: ignore[misc]
    return load_config(None, [
        *overrides, f"run.steps={steps}", f"run.seed={seed}", f"run.max_staleness={staleness}",
        f"run.runtime={runtime}",
        "run.progress=false", f"run.torch_threads={torch_threads}", f"model.path={model_dir}",
    ])


def prompt_rows(cfg) -> tuple[list[str], list[str]]:
    """The run's prompts in the exact order freshroll admits them (see ``runtime.run``)."""
    from freshroll.runtime.prepare import load_task_prompts

    prompts = load_task_prompts(cfg, Path(cfg.model.path))
    by_id = {p.prompt_id: p for p in prompts}
    order = [p.prompt_id for p in prompts]
    random.Random(cfg.run.seed).shuffle(order)
    return [by_id[i].text for i in order], [by_id[i].answer for i in order]


def trl_args(cfg, out_dir: Path):
    """A ``GRPOConfig`` equal to the freshroll config in every setting that has a match."""
    from trl import GRPOConfig

    r, t = cfg.rollout, cfg.trainer
    return GRPOConfig(
        output_dir=str(out_dir),
        # one optimizer step = batch_groups prompts x group_size completions; in TRL >= 0.18
        # per_device_train_batch_size counts completions, and with gradient_accumulation_steps=1
        # and steps_per_generation=1 each generation batch feeds exactly one optimizer step
        per_device_train_batch_size=r.batch_groups * r.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=r.group_size,
        num_iterations=1,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=0,
        learning_rate=t.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim=t.optim,  # adamw_torch_fused by default: TRL's own default on torch >= 2.8
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        beta=t.kl_coef,
        epsilon=t.clip_low,
        epsilon_high=t.clip_high,
        loss_type=t.aggregation,  # grpo | dr_grpo | dapo: same formulas as freshroll's
        scale_rewards="none" if t.aggregation == "dr_grpo" else "group",
        max_steps=cfg.run.steps,
        seed=cfg.run.seed,
        shuffle_dataset=False,  # the dataset is already in freshroll's admission order
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        push_to_hub=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )


# --- the systems ------------------------------------------------------------------------


def run_trl(cfg, model_dir: Path, out_dir: Path, threads: int | None,
            reward: Any = None) -> Result:
    """One TRL run at ``threads`` intra-op threads (None: torch's default, all the cores);
    ``reward``: its reward function (default: the embedded task's, digit reversal).

    ``outer_s`` counts from before TRL's imports (datasets, transformers, trl), as freshroll's
    counts its own (transformers is imported inside ``run``): a run's start-up is the whole
    of it, for both."""
    t_outer = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from freshroll.rewards.functions import reverse_reward

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = self.end = 0.0
            self.threads: set[int] = set()
            self.times: list[float] = []

        def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self.end = time.perf_counter()
            self.times.append(self.end - self.begin)
            self.threads.add(torch.get_num_threads())

    torch.manual_seed(cfg.run.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    texts, answers = prompt_rows(cfg)
    args = trl_args(cfg, out_dir)
    clock = Clock()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward or reverse_reward], args=args,
        train_dataset=Dataset.from_dict({"prompt": texts, "answer": answers}),
        processing_class=tok, callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)
    default_threads = TORCH_DEFAULT_THREADS or torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    c0, t0 = time.process_time(), time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    outer = time.perf_counter() - t_outer
    steps = trainer.state.global_step
    rollouts = steps * args.per_device_train_batch_size
    logged = {e["step"]: e["reward"] for e in trainer.state.log_history if "reward" in e}
    rewards = [logged[s] for s in sorted(logged)]
    first, last, mean_all = edge_means(rewards)
    step_times = [e["step_time"] for e in trainer.state.log_history if "step_time" in e]
    loop = clock.end - clock.begin
    extra = {
        "loop_s": loop,
        "loop_rollouts_per_s": rollouts / loop if loop > 0 else math.nan,
        "step_time_mean": statistics.fmean(step_times) if step_times else math.nan,
        "threads_seen": sorted(clock.threads),
        "generation_batch_size": args.generation_batch_size,
        "steps_per_generation": args.steps_per_generation,
    }
    del trainer, model
    gc.collect()
    torch.set_num_threads(default_threads)
    name = f"trl-{threads}t" if threads else "trl-default"
    return Result(
        name, cfg.run.seed, threads or default_threads, steps, wall, rollouts, rollouts / wall,
        first, last, mean_all, outer, cpu, rewards, extra, clock.times[-len(rewards):]
        if len(clock.times) >= len(rewards) else [],
    )


def run_freshroll(cfg, out_dir: Path, name: str | None = None) -> Result:
    """One freshroll run through ``run()``; ``name``: its system label (default: the
    :data:`FRESHROLL_SYSTEMS` entry of its max_staleness and runtime)."""
    c0, t0 = time.process_time(), time.perf_counter()
    from freshroll.runtime.run import run

    result = run(cfg, out_dir, stream=sys.stderr)
    outer = time.perf_counter() - t0
    cpu = time.process_time() - c0
    s = result.summary
    rows = [
        json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    rewards = [r["reward_mean"] for r in sorted(rows, key=lambda r: r["step"])]
    first, last, mean_all = edge_means(rewards)
    periods = [b["t"] - a["t"] for a, b in itertools.pairwise(rows)]
    extra = {
        "verify_ok": result.ok,
        "train_s_mean": statistics.fmean(r["train_s"] for r in rows),
        "step_period_mean": statistics.fmean(periods) if periods else math.nan,
        # the median step after the first: measured as floor.py measures the floor's step
        "step_period_median": statistics.median(periods) if periods else math.nan,
        "trainer_idle_ratio": s.get("trainer_idle_ratio"),
        "lag_mean": s.get("lag", {}).get("mean"),
        "generated_rollouts_per_s": s.get("generated_rollouts_per_s"),
        "stages": {row["stage"]: row["share"] for row in s.get("stages", [])},
        "weight_transfer_s_mean": s.get("weight_transfer_s_mean"),
        "overlap": s.get("overlap"),
        "host": s.get("host"),
        # each step's share of groups without reward variance (no learning signal): the
        # sweep's collapse check reads it (async_sweep.collapse_step)
        "zero_std": [r.get("frac_reward_zero_std") for r in sorted(rows, key=lambda r: r["step"])],
        # each step's completion tokens: a policy that learns shorter answers makes cheaper
        # steps, so rates of runs whose lengths differ are not the same work
        "tokens": [r.get("tokens") for r in sorted(rows, key=lambda r: r["step"])],
    }
    if name is None:
        name = next(n for n, sys_ in FRESHROLL_SYSTEMS.items()
                    if sys_ == (cfg.run.max_staleness, cfg.run.runtime, cfg.run.torch_threads))
    placed = (s.get("host") or {}).get("placement") or {}
    threads = placed.get("trainer_threads", cfg.run.torch_threads)
    times = [r["t"] for r in sorted(rows, key=lambda r: r["step"])]
    return Result(
        name, cfg.run.seed, threads, int(s["steps"]), float(s["wall_s"]),
        int(s["accepted_rollouts"]), float(s["accepted_rollouts_per_s"]),
        first, last, mean_all, outer, cpu, rewards, extra, times,
    )


def cpu_ratio(r: Result) -> float:
    """Process CPU seconds per wall second over the timed span: a contention gauge.

    A run that can use one core (TRL at 1 thread, freshroll sync) shows ~1.0 on a quiet
    machine; freshroll async and TRL at 2 threads up to ~2.0. Much lower means the run was
    starved of CPU by other processes. freshroll's CPU time covers the whole ``run()`` call
    (report and verify included), so its ratio uses ``outer_s``.
    """
    span = r.wall_s if r.system.startswith("trl-") else r.outer_s
    return r.cpu_s / span if span > 0 else math.nan


# --- report -----------------------------------------------------------------------------


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def aggregate(results: list[Result], level: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r.system for r in results):
        rows = [r for r in results if r.system == name]
        agg: dict[str, Any] = {"n": len(rows)}
        for key in ("wall_s", "rollouts_per_s", "reward_first", "reward_last", "reward_all"):
            agg[key], agg[key + "_sd"] = mean_sd([getattr(r, key) for r in rows])
        reached = [time_to_reward(r.rewards, r.times, level) for r in rows]
        agg["time_to_reward"] = reached
        agg["time_to_reward_mean"] = (statistics.fmean(reached)
                                      if all(math.isfinite(t) for t in reached) else math.nan)
        out[name] = agg
    return out


def best_trl(agg: dict[str, dict[str, Any]]) -> str | None:
    """The TRL system with the most accepted rollouts/s (the peer at its best)."""
    trls = [s for s in agg if s.startswith("trl-")]
    return max(trls, key=lambda s: agg[s]["rollouts_per_s"]) if trls else None


def ratios(results: list[Result], agg: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """freshroll / each TRL system, rollouts/s: ratio of the means, and per-seed min/max."""
    out = {}
    for fr in (s for s in agg if not s.startswith("trl-")):
        for trl in (s for s in agg if s.startswith("trl-")):
            paired = [
                a.rollouts_per_s / b.rollouts_per_s
                for a in results if a.system == fr
                for b in results if b.system == trl and b.seed == a.seed
            ]
            out[f"{fr} / {trl}"] = {
                "ratio_of_means": agg[fr]["rollouts_per_s"] / agg[trl]["rollouts_per_s"],
                "per_seed_min": min(paired), "per_seed_max": max(paired),
            }
    return out


def reward_check(agg: dict[str, dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """Last-10% reward of ``a`` minus ``b``, against 2 standard errors of the difference.

    ``not_worse`` (the goal) is None with fewer than 2 seeds: there is no noise estimate.
    """
    da, db = agg[a], agg[b]
    diff = da["reward_last"] - db["reward_last"]
    se = math.sqrt(da["reward_last_sd"] ** 2 / da["n"] + db["reward_last_sd"] ** 2 / db["n"])
    enough = min(da["n"], db["n"]) >= 2
    return {"diff": diff, "two_se": 2 * se,
            "within_noise": abs(diff) <= 2 * se if enough else None,
            "not_worse": diff >= -2 * se if enough else None}


def goals(agg: dict[str, dict[str, Any]], level: float) -> dict[str, Any]:
    """Each issue-25 goal that the systems run can check: value, goal, PASS/MISS/n/a."""
    best = best_trl(agg)
    out: dict[str, Any] = {"best_trl": best, "reward_level": level}
    if best is None:
        return out

    def check(name: str, value: float, goal: float, higher: bool = True) -> None:
        ok = None if not math.isfinite(value) else (value >= goal if higher else value <= goal)
        out[name] = {"value": value, "goal": goal,
                     "verdict": "n/a" if ok is None else "PASS" if ok else "MISS"}

    rate = {s: a["rollouts_per_s"] for s, a in agg.items()}
    ttr = {s: a["time_to_reward_mean"] for s, a in agg.items()}
    if "freshroll-default" in agg:
        check("default_vs_best_trl", rate["freshroll-default"] / rate[best], GOAL_DEFAULT)
        check("default_time_vs_best_trl",
              ttr["freshroll-default"] / ttr[best] if ttr[best] else math.nan, GOAL_TIME, False)
        out["default_reward_vs_best_trl"] = reward_check(agg, "freshroll-default", best)
    if "freshroll-sync" in agg:
        check("sync_vs_best_trl", rate["freshroll-sync"] / rate[best], GOAL_SYNC)
    if "freshroll-sync" in agg and "freshroll-default" in agg:
        check("default_time_vs_sync", ttr["freshroll-default"] / ttr["freshroll-sync"]
              if ttr["freshroll-sync"] else math.nan, 1.0, False)
        out["default_reward_vs_sync"] = reward_check(agg, "freshroll-default", "freshroll-sync")
    return out


HEADLINE_SHARE = 0.9  # the headline's level: this share of sync's last-10% reward


def headline(results: list[Result], agg: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The report's first figure: wall time (start of training on) to 90% of
    freshroll-sync's last-10% reward, per system (mean over seeds; NaN where a seed never
    got there, with how many did), beside accepted rollouts/s and the last-10% reward, and
    each as a ratio to sync and to the best TRL. None without a freshroll-sync run."""
    if "freshroll-sync" not in agg:
        return None
    level = HEADLINE_SHARE * agg["freshroll-sync"]["reward_last"]
    best = best_trl(agg)
    systems: dict[str, dict[str, Any]] = {}
    for name, a in agg.items():
        times = [time_to_reward(r.rewards, r.times, level) for r in results if r.system == name]
        done = [t for t in times if math.isfinite(t)]
        systems[name] = {"time_s": statistics.fmean(times) if len(done) == len(times)
                         else math.nan, "reached": len(done), "n": len(times),
                         "rollouts_per_s": a["rollouts_per_s"], "reward_last": a["reward_last"]}
    for row in systems.values():
        for base, key in (("freshroll-sync", "vs_sync"), (best, "vs_best_trl")):
            ref = systems.get(base) if base is not None else None
            row[key] = {"time": row["time_s"] / ref["time_s"] if ref and ref["time_s"]
                        else math.nan,
                        "rollouts_per_s": row["rollouts_per_s"] / ref["rollouts_per_s"]
                        if ref else math.nan}
    return {"level": level, "share": HEADLINE_SHARE, "best_trl": best, "systems": systems}


def print_headline(head: dict[str, Any] | None) -> None:
    if head is None:
        return
    print(f"\ntime to {head['share']:.0%} of freshroll-sync's last-10% reward "
          f"({head['level']:.3f}), wall s from the start of training (mean over seeds), "
          f"beside accepted rollouts/s; ratios to sync and to the best TRL ({head['best_trl']}):")
    print(f"{'system':<20}{'time s':>9}{'reached':>9}{'x sync':>8}{'x TRL':>8}"
          f"{'rollouts/s':>12}{'x sync':>8}{'x TRL':>8}{'last-10%':>10}")
    for name, r in head["systems"].items():
        vs, vt = r["vs_sync"], r["vs_best_trl"]
        print(f"{name:<20}{r['time_s']:>9.1f}{r['reached']:>5}/{r['n']:<3}{vs['time']:>8.2f}"
              f"{vt['time']:>8.2f}{r['rollouts_per_s']:>12.1f}{vs['rollouts_per_s']:>8.2f}"
              f"{vt['rollouts_per_s']:>8.2f}{r['reward_last']:>10.3f}")


def print_report(results: list[Result], agg, rat, goal) -> None:
    level = goal.get("reward_level")
    print_headline(headline(results, agg))
    print()
    print(f"{'system':<20}{'seed':>5}{'steps':>6}{'thr':>4}{'wall s':>9}{'rollouts/s':>12}"
          f"{'reward first -> last':>24}{'mean':>8}{f't->{level}':>9}{'cpu/wall':>10}")
    for r in results:
        ttr = time_to_reward(r.rewards, r.times, level) if level is not None else math.nan
        print(f"{r.system:<20}{r.seed:>5}{r.steps:>6}{r.threads!s:>4}{r.wall_s:>9.2f}"
              f"{r.rollouts_per_s:>12.1f}{r.reward_first:>13.3f} -> {r.reward_last:.3f}"
              f"{r.reward_all:>10.3f}{ttr:>9.1f}{cpu_ratio(r):>10.2f}")
    print()
    print("means over seeds (± sample std):")
    print(f"{'system':<20}{'n':>3}{'wall s':>15}{'rollouts/s':>17}{'reward first':>17}"
          f"{'reward last':>17}{'time to reward':>16}")
    for name, a in agg.items():
        print(f"{name:<20}{a['n']:>3}{a['wall_s']:>9.2f} ± {a['wall_s_sd']:<4.2f}"
              f"{a['rollouts_per_s']:>9.1f} ± {a['rollouts_per_s_sd']:<5.1f}"
              f"{a['reward_first']:>9.3f} ± {a['reward_first_sd']:<5.3f}"
              f"{a['reward_last']:>9.3f} ± {a['reward_last_sd']:<5.3f}"
              f"{a['time_to_reward_mean']:>12.1f} s")
    print()
    print("accepted rollouts/s ratios (ratio of means; per-seed range):")
    for k, v in rat.items():
        print(f"  {k:<40}{v['ratio_of_means']:6.2f}x  "
              f"[{v['per_seed_min']:.2f}, {v['per_seed_max']:.2f}]")
    if goal.get("best_trl"):
        print(f"\ngoals (issue 25), against the best TRL ({goal['best_trl']}):")
        for key, g in goal.items():
            if isinstance(g, dict) and "verdict" in g:
                print(f"  {key:<28} {g['value']:6.2f} (goal {'>=' if 'time' not in key else '<='}"
                      f" {g['goal']})  {g['verdict']}")
            elif isinstance(g, dict) and "diff" in g:
                v = "n/a (needs >= 2 seeds)" if g["not_worse"] is None else (
                    "PASS" if g["not_worse"] else "MISS")
                print(f"  {key:<28} last-10% reward diff {g['diff']:+.3f}, 2 SE "
                      f"{g['two_se']:.3f}  {v}")


# --- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="freshroll config overrides (key=value)")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS,
                    choices=["trl-1t", "trl-default", *FRESHROLL_SYSTEMS])
    ap.add_argument("--reward-level", type=float, default=0.5,
                    help="time to reward: seconds until the last 10 steps' mean reaches it")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per system first")
    ap.add_argument("--quick", action="store_true", help="5 steps, seed 0")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--workdir", type=Path, help="keep run dirs here (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds = 5, [0]

    _offline()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch
    import transformers
    import trl
    from transformers.utils import logging as hf_logging

    from freshroll.engines.tiny import save_tiny

    global TORCH_DEFAULT_THREADS
    TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before any run sets it
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="freshroll-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    # freshroll's thread probe and settled stage threads are reused by the next run of the
    # same work (freshroll.placement.probe_cache): within this invocation (a later seed reuses
    # the first one's, as a user's re-run does), never from what ran on the machine before
    os.environ.setdefault("FRESHROLL_CACHE_DIR", str(work / "probe-cache"))
    model_dir = save_tiny(work / "tiny", seed=0)
    systems = list(dict.fromkeys(args.systems))
    print(f"trl {trl.__version__}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}, {os.cpu_count()} cpus (torch's default threads "
          f"{torch.get_num_threads()}), python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"steps {args.steps}, seeds {args.seeds}, systems {systems}, work dir {work}")
    base = freshroll_config(args.steps, args.seeds[0], (0, "inline"), model_dir, args.overrides)
    trl_config = {
        k: v for k, v in trl_args(base, work / "trl-config").to_dict().items()
        if k in TRL_REPORT_KEYS
    }
    print("TRL GRPOConfig:", ", ".join(f"{k}={v}" for k, v in trl_config.items()))

    def one(name: str, steps: int, seed: int, out: Path) -> Result:
        cfg = freshroll_config(steps, seed, FRESHROLL_SYSTEMS.get(name, (0, "inline")),
                               model_dir, args.overrides)
        if name.startswith("trl-"):
            return run_trl(cfg, model_dir, out, None if name == "trl-default" else 1)
        return run_freshroll(cfg, out, name)

    results: list[Result] = []
    t_all = time.perf_counter()
    try:
        if args.warmup:  # first-call costs (lazy imports, allocator, kernels) hit no system
            for name in systems:
                one(name, args.warmup, 0, work / f"warmup-{name}")
            print(f"warmed up ({args.warmup} untimed steps per system)", flush=True)
        for i, seed in enumerate(args.seeds):
            rot = i % len(systems)
            for name in systems[rot:] + systems[:rot]:
                out = work / f"{name}-s{seed}"
                shutil.rmtree(out, ignore_errors=True)
                r = one(name, args.steps, seed, out)
                results.append(r)
                print(f"  {name:<19} seed {seed}: {r.steps} steps in {r.wall_s:6.2f}s "
                      f"({r.rollouts_per_s:7.1f} rollouts/s), reward "
                      f"{r.reward_first:.3f} -> {r.reward_last:.3f}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - t_all

    agg = aggregate(results, args.reward_level)
    rat = ratios(results, agg)
    goal = goals(agg, args.reward_level)
    print_report(results, agg, rat, goal)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    print(f"\nbenchmark wall time {total:.0f}s; load average now {load[0]:.1f} "
          f"(1 min) {load[2]:.1f} (15 min) on {os.cpu_count()} cpus")
    if args.json:
        args.json.write_text(json.dumps({
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__, "python": platform.python_version()},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "steps": args.steps, "seeds": args.seeds, "overrides": args.overrides,
            "systems": systems, "trl_config": trl_config,
            "results": [{**asdict(r), "cpu_ratio": cpu_ratio(r)} for r in results],
            "means": agg, "ratios": rat, "goals": goal, "benchmark_s": total,
            "headline": headline(results, agg),
        }, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


TRL_REPORT_KEYS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
    "generation_batch_size", "num_generations", "num_iterations", "max_completion_length",
    "temperature", "top_p", "top_k", "learning_rate", "lr_scheduler_type", "optim",
    "weight_decay", "max_grad_norm", "beta", "epsilon", "epsilon_high", "loss_type",
    "scale_rewards", "max_steps", "seed", "shuffle_dataset", "use_cpu", "bf16",
)


if __name__ == "__main__":
    sys.exit(main())

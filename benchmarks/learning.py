"""Learning under asynchrony (issue 46): reward at equal steps and time to reward, per shape.

Throughput is never read as convergence: this benchmark asks whether an asynchronous run
learns as much per step as the synchronous one, and how soon (wall time, start-up included)
it reaches a share of sync's final reward.

Shapes (:data:`SHAPES`; model built locally with ``save_pretrained``, loaded by freshroll and
TRL with ``from_pretrained``; the character tokenizer of :mod:`freshroll.engines.tiny`):
architecture (Llama, Qwen2 with grouped-query attention, GPT-2), size, task and its reward,
new tokens (8 to 48), learning rate (3e-4 to 1e-3) and steps. ``--shapes`` picks them.

Systems (:data:`SYSTEMS`): ``sync`` (``run.max_staleness=0``), ``default`` (the embedded
default: whatever the product does, sync fallback included), the asynchronous variants
under study (``async-<correction>``: ``run.max_staleness=1`` with the fallback off, so that
every step is asynchronous, and ``trainer.correction`` set), and ``trl-1t`` / ``trl-default``
(TRL's ``GRPOTrainer`` at the same settings, :mod:`vs_trl`'s mapping and runner).

Every run is its own process (``--one``), so no run inherits another's threads, caches or
allocator; seeds are interleaved (the system order rotates with the seed). A freshroll run
starts as ``freshroll run`` does: the config read first, and an async run's worker
forkserver started before the process imports torch (:mod:`freshroll.placement.forkserver`);
TRL's as its own script would (torch, then TRL).

Figures per shape and system, over seeds (mean, standard error):

- ``last10``: mean batch reward over the last 10% of steps;
- ``r@25% / r@50%``: mean reward of the 10 steps ending at 25% and 50% of the run;
- ``t50 / t75 / t90``: wall seconds from the process's start (model loading and start-up
  included) until the trailing 10-step mean reward reaches 50 / 75 / 90% of ``sync``'s
  mean last-10% reward on that shape (NaN: never; the count that reached it is shown);
- ``collapses``: runs where the product's collapse rule held (:func:`collapsed`: 20 steps
  without learning signal or with entropy under 0.05 after the 10-step reward lost half of
  what it had gained; the rule of ``summary.json``'s ``learning``). Every freshroll run is
  made with ``monitor.on_collapse=warn``, so that a collapsed run still trains its steps and
  its figures compare with the others';
- ``rollouts/s``: accepted rollouts per second (the run's summary; TRL: steps x batch / wall);
- ``mismatch_kl``, ``trunc``: mean over steps of the behaviour-vs-proximal k3 KL and of the
  fraction of tokens with importance weight above the cap (freshroll runs).

Usage::

    .venv/bin/python benchmarks/learning.py --quick                      # smoke (seconds)
    .venv/bin/python benchmarks/learning.py --shapes llama-sort-8 --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/learning.py --systems sync async-none async-tis --json out.json

Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set before any Hugging Face import.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl

SMOOTH = vs_trl.SMOOTH  # steps of the trailing reward mean
LEVELS = (0.5, 0.75, 0.9)


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: the model, the task, the lengths and the optimiser."""

    arch: str  # llama | qwen2 | gpt2
    size: dict[str, int]
    task: str
    params: dict[str, int]
    new_tokens: int
    lr: float
    steps: int
    group_size: int = 16
    batch_groups: int = 8
    extra: tuple[str, ...] = ()

    def overrides(self) -> list[str]:
        return [
            f"task.name={self.task}", f"task.params={json.dumps(self.params)}",
            f"rewards=[{{fn: {REWARDS[self.task]}}}]",
            f"rollout.max_new_tokens={self.new_tokens}", f"trainer.lr={self.lr}",
            f"rollout.group_size={self.group_size}",
            f"rollout.batch_groups={self.batch_groups}", *self.extra,
        ]


REWARDS = {"reverse": "reverse", "sort": "sort", "add": "numeric", "repeat": "repeat"}

SHAPES: dict[str, Shape] = {
    # the issue's opening shape: a 0.37M Llama, 8 new tokens, lr 1e-3
    "llama-sort-8": Shape("llama", {"hidden_size": 128, "intermediate_size": 256,
                                    "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 4},
                          "sort", {"min_len": 4, "max_len": 6}, 8, 1e-3, 300),
    # grouped-query attention, 12 new tokens, lr 5e-4
    "qwen2-reverse-12": Shape("qwen2", {"hidden_size": 128, "intermediate_size": 384,
                                        "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "num_key_value_heads": 2},
                              "reverse", {"min_len": 4, "max_len": 8}, 12, 5e-4, 300),
    # GPT-2, addition (numeric partial credit), 8 new tokens, lr 3e-4
    "gpt2-add-8": Shape("gpt2", {"n_embd": 128, "n_layer": 2, "n_head": 4},
                        "add", {"max_operand": 99}, 8, 3e-4, 300),
    # the collapse shape: 1.06M parameters, 16 new tokens, lr 1e-3
    "llama1m-reverse-16": Shape("llama", {"hidden_size": 192, "intermediate_size": 512,
                                          "num_hidden_layers": 3, "num_attention_heads": 4,
                                          "num_key_value_heads": 4},
                                "reverse", {"min_len": 5, "max_len": 10}, 16, 1e-3, 300),
    # long completions (up to 48 new tokens) whose reward keeps rising past 500 steps
    "llama-repeat-48": Shape("llama", {"hidden_size": 64, "intermediate_size": 128,
                                       "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "num_key_value_heads": 4},
                             "repeat", {"min_len": 2, "max_len": 40}, 48, 5e-4, 600,
                             group_size=8, batch_groups=8),
    # the smoke shape (--quick)
    "smoke": Shape("llama", {}, "reverse", {"min_len": 3, "max_len": 3}, 4, 1e-3, 4,
                   group_size=4, batch_groups=2),
}
DEFAULT_SHAPES = ["llama-sort-8", "qwen2-reverse-12", "gpt2-add-8", "llama1m-reverse-16"]

ASYNC = ["run.max_staleness=1", "control.fallback=false"]
SYSTEMS: dict[str, list[str]] = {
    "sync": ["run.max_staleness=0"],
    "default": [],
    "async-none": [*ASYNC, "trainer.correction=none"],
    "async-tis": [*ASYNC, "trainer.correction=tis"],
    "async-decoupled": [*ASYNC, "trainer.correction=decoupled"],
    "async-dual_clip": [*ASYNC, "trainer.correction=dual_clip"],
    "trl-1t": [],
    "trl-default": [],
}
DEFAULT_SYSTEMS = ["sync", "default", "async-none", "async-tis"]


# --- one run (its own process) -------------------------------------------------------


def build_model(shape: Shape, path: Path) -> Path:
    """``save_pretrained`` of the shape's model (seed 0) with the character tokenizer."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    from freshroll.engines.tiny import VOCAB, build_tiny, build_tokenizer, save_model_dir

    if shape.arch == "llama":
        model, tok = build_tiny(0, **shape.size)
        return save_model_dir(model, tok, path)
    tok = byte_level_tokenizer() if shape.arch == "qwen2" else build_tokenizer()
    ids = {"pad_token_id": VOCAB.index("<pad>"), "bos_token_id": VOCAB.index("<bos>"),
           "eos_token_id": VOCAB.index("<eos>")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if shape.arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(VOCAB), tie_word_embeddings=True,
                                                 max_position_embeddings=128, **ids,
                                                 **shape.size))
        elif shape.arch == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(vocab_size=len(VOCAB), n_positions=128, **ids,
                                               **shape.size))
        else:
            raise SystemExit(f"unknown arch {shape.arch!r}")
    return save_model_dir(model, tok, path)


def byte_level_tokenizer() -> Any:
    """The character tokenizer in the byte-level form a Qwen2 directory needs: transformers 5
    loads any Qwen2 directory's tokenizer as ``Qwen2Tokenizer`` (by ``model_type``), a
    byte-level BPE that drops a character its vocabulary lacks (the space of the plain
    character tokenizer: issue 48). The same ids, the space stored as ``Ġ``, no merges: one
    token per character, and ``decode(encode(text)) == text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from freshroll.engines.tiny import VOCAB

    vocab = {("\u0120" if t == " " else t): i for i, t in enumerate(VOCAB)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                   bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One run: ``job`` = {shape, system, seed, work}; returns its figures as a dict."""
    t_start = time.perf_counter()
    vs_trl._offline()
    import warnings

    warnings.filterwarnings("ignore")
    from freshroll.config import load_config

    shape, system, seed = SHAPES[job["shape"]], job["system"], job["seed"]
    work = Path(job["work"])
    model_dir = work / "models" / job["shape"].partition("@")[0]  # one model per shape
    out = work / "runs" / f"{job['shape']}-{system}-s{seed}"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    # a collapse is counted, not stopped at: every run trains its steps, so that its curve
    # and last-10% reward are comparable (the run's own verdict is kept: ``learning``)
    cfg = load_config(None, [
        *shape.overrides(), *SYSTEMS[system], f"run.steps={shape.steps}", f"run.seed={seed}",
        "run.progress=false", f"model.path={model_dir}", "monitor.on_collapse=warn",
    ])
    if not system.startswith("trl-"):  # as `freshroll run` starts (freshroll.cli): the
        # workers' forkserver imports torch beside this process, not after it
        from freshroll.placement import forkserver

        forkserver.start_for(cfg)
    import torch

    vs_trl.TORCH_DEFAULT_THREADS = torch.get_num_threads()
    build_model(shape, model_dir)
    startup = time.perf_counter() - t_start
    if system.startswith("trl-"):
        from freshroll.rewards import functions

        reward = getattr(functions, f"{REWARDS[shape.task]}_reward")
        r = vs_trl.run_trl(cfg, model_dir, out, None if system == "trl-default" else 1, reward)
        rows: list[dict[str, Any]] = []
    else:
        r = vs_trl.run_freshroll(cfg, out, system)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
        rows.sort(key=lambda row: row["step"])
    # wall from the process's start: freshroll's step times count from its measured wall's
    # start (summary.json fixed_costs.start_s before it: model, probe, workers), TRL's from
    # train() (model and trainer building before it); both get this process's set-up added
    learning: dict[str, Any] = {}
    if system.startswith("trl-"):
        offset = startup + (r.outer_s - r.wall_s)
    else:
        summary = json.loads((out / "summary.json").read_text())
        offset = startup + float((summary.get("fixed_costs") or {}).get("start_s", 0.0))
        learning = summary.get("learning") or {}
    series = {key: [row.get(key) for row in rows]
              for key in ("entropy", "mismatch_kl", "is_truncated_frac",
                          "frac_reward_zero_std", "clip_frac", "lag_mean")}
    return {
        "shape": job["shape"], "system": system, "seed": seed, "steps": r.steps,
        "wall_s": r.wall_s, "rollouts_per_s": r.rollouts_per_s, "rewards": r.rewards,
        "times": [t + offset for t in r.times], "startup_s": startup, "outer_s": r.outer_s,
        "series": series, "load": os.getloadavg()[0],
        "lag_mean": r.extra.get("lag_mean") if r.extra else None,
        "learning_verdict": learning.get("verdict"),
    }


# --- figures ---------------------------------------------------------------------------


def trailing(rewards: list[float], i: int) -> float:
    """The mean reward of the :data:`SMOOTH` steps ending at index ``i``."""
    window = rewards[max(0, i + 1 - SMOOTH): i + 1]
    return statistics.fmean(window) if window else math.nan


def time_to(run: dict[str, Any], level: float) -> float:
    """Wall s (from the process's start) until the trailing mean first reaches ``level``
    (:func:`vs_trl.time_to_reward`, the one definition)."""
    return vs_trl.time_to_reward(run["rewards"], run["times"], level, SMOOTH)


def last10(rewards: list[float]) -> float:
    """The mean reward of the last 10% of steps (:func:`vs_trl.edge_means`)."""
    return vs_trl.edge_means(rewards)[1]


def collapsed(run: dict[str, Any]) -> bool:
    """Whether the product's collapse rule (:class:`freshroll.figures.learning.CollapseWatch`,
    the one ``summary.json`` and the run's guard apply, at its default settings) held at any
    step of ``run``'s rewards, no-signal shares and entropies (TRL's runs record none of the
    last two here: never collapsed by this count)."""
    from freshroll.figures.learning import (
        COLLAPSE_DROP,
        COLLAPSE_STEPS,
        ENTROPY_FLOOR,
        CollapseWatch,
    )

    watch = CollapseWatch(COLLAPSE_STEPS, ENTROPY_FLOOR, COLLAPSE_DROP)
    series = run["series"]
    zero, ent = series.get("frac_reward_zero_std") or [], series.get("entropy") or []
    for i, reward in enumerate(run["rewards"]):
        row = {"step": i + 1, "reward_mean": reward,
               "frac_reward_zero_std": zero[i] if i < len(zero) else None,
               "entropy": ent[i] if i < len(ent) else None}
        if watch.feed(row) is not None:
            return True
    return False


def mean_se(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs))
                                  if len(xs) > 1 else math.nan)


def _mean_of(xs: list[Any]) -> float:
    vals = [float(x) for x in xs if x is not None]
    return statistics.fmean(vals) if vals else math.nan


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (shape, system): the module docstring's figures."""
    rows = []
    for shape in dict.fromkeys(r["shape"] for r in runs):
        mine = [r for r in runs if r["shape"] == shape]
        sync = [last10(r["rewards"]) for r in mine if r["system"] == "sync"]
        sync_final = statistics.fmean(sync) if sync else math.nan
        for system in dict.fromkeys(r["system"] for r in mine):
            cell = [r for r in mine if r["system"] == system]
            row: dict[str, Any] = {"shape": shape, "system": system, "n": len(cell)}
            row["last10"], row["last10_se"] = mean_se([last10(r["rewards"]) for r in cell])
            for frac in (0.25, 0.5):
                row[f"r@{frac:.0%}"] = mean_se([
                    trailing(r["rewards"], max(0, round(frac * len(r["rewards"])) - 1))
                    for r in cell])[0]
            for level in LEVELS:
                ts = [time_to(r, level * sync_final) for r in cell]
                done = [t for t in ts if math.isfinite(t)]
                row[f"t{round(level * 100)}"] = statistics.fmean(done) if done else math.nan
                row[f"t{round(level * 100)}_n"] = len(done)
            row["collapses"] = sum(collapsed(r) for r in cell)
            row["rollouts_per_s"] = mean_se([r["rollouts_per_s"] for r in cell])[0]
            row["startup_s"] = mean_se([r["startup_s"] for r in cell])[0]
            row["mismatch_kl"] = _mean_of([_mean_of(r["series"].get("mismatch_kl") or [])
                                           for r in cell])
            row["trunc"] = _mean_of([_mean_of(r["series"].get("is_truncated_frac") or [])
                                     for r in cell])
            row["lag"] = _mean_of([r.get("lag_mean") for r in cell])
            row["load"] = max(r["load"] for r in cell)
            rows.append(row)
    return rows


def diff_se(runs: list[dict[str, Any]], shape: str, a: str, b: str) -> tuple[float, float]:
    """Last-10% reward of ``a`` minus ``b`` on ``shape``, and the difference's standard error."""
    xa = [last10(r["rewards"]) for r in runs if r["shape"] == shape and r["system"] == a]
    xb = [last10(r["rewards"]) for r in runs if r["shape"] == shape and r["system"] == b]
    if len(xa) < 2 or len(xb) < 2:
        return math.nan, math.nan
    return (statistics.fmean(xa) - statistics.fmean(xb),
            math.sqrt(statistics.variance(xa) / len(xa) + statistics.variance(xb) / len(xb)))


def _f(x: float, spec: str = ".3f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def print_table(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    print("\n| shape | system | n | last-10% reward ± SE | r@25% | r@50% | t50 s | t75 s "
          "| t90 s (reached) | collapses | rollouts/s | start-up s | lag | mismatch KL "
          "| truncated | load |")
    print("|" + "---|" * 16)
    for r in rows:
        print(f"| {r['shape']} | {r['system']} | {r['n']} | {_f(r['last10'])} ± "
              f"{_f(r['last10_se'])} | {_f(r['r@25%'])} | {_f(r['r@50%'])} | "
              f"{_f(r['t50'], '.1f')} | {_f(r['t75'], '.1f')} | {_f(r['t90'], '.1f')} "
              f"({r['t90_n']}/{r['n']}) | {r['collapses']} | {_f(r['rollouts_per_s'], '.0f')} | "
              f"{_f(r['startup_s'], '.1f')} | {_f(r['lag'], '.2f')} | "
              f"{_f(r['mismatch_kl'], '.4f')} | {_f(r['trunc'], '.4f')} | {_f(r['load'], '.2f')} |")
    print("\nlast-10% reward against sync (difference ± its SE; parity: diff >= -1 SE):")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for system in dict.fromkeys(r["system"] for r in rows if r["shape"] == shape):
            if system == "sync":
                continue
            d, se = diff_se(runs, shape, system, "sync")
            verdict = "-" if not math.isfinite(se) else "PASS" if d >= -se else "MISS"
            print(f"  {shape:<22} {system:<18} {_f(d, '+.3f')} ± {_f(se)}  {verdict}")


# --- main ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    ap.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=list(SYSTEMS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, help="override every shape's steps")
    ap.add_argument("--lr", type=float, help="override every shape's learning rate (every "
                    "system, TRL included); the shape is then named <shape>@lr<lr>")
    ap.add_argument("--quick", action="store_true", help="the smoke shape, sync and "
                    "async-tis, seed 0 (seconds)")
    ap.add_argument("--json", type=Path, help="write every run's figures to this file")
    ap.add_argument("--resume-json", type=Path, help="add the runs of an earlier --json "
                    "(same work dir not needed) before running the missing ones")
    ap.add_argument("--workdir", type=Path, help="keep models and run dirs here")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        job = json.loads(args.one)
        _derive(job["shape"], job.get("steps"))
        Path(job["result"]).write_text(json.dumps(run_one(job)))
        return 0
    if args.quick:
        args.shapes, args.systems, args.seeds = ["smoke"], ["sync", "async-tis"], [0]
    if args.lr is not None:
        args.shapes = [f"{name}@lr{args.lr:g}" for name in args.shapes]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="freshroll-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FRESHROLL_CACHE_DIR": str(work / "probe-cache")}
    print(f"learning benchmark: shapes {args.shapes}, systems {args.systems}, seeds "
          f"{args.seeds}, {os.cpu_count()} cpus, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}, work dir {work}", flush=True)
    runs: list[dict[str, Any]] = []
    if args.resume_json and args.resume_json.is_file():
        runs = json.loads(args.resume_json.read_text())["runs"]
    done = {(r["shape"], r["system"], r["seed"]) for r in runs}
    t0 = time.perf_counter()
    for shape in args.shapes:
        _derive(shape, None)
        for i, seed in enumerate(args.seeds):
            rot = i % len(args.systems)
            for system in args.systems[rot:] + args.systems[:rot]:
                if (shape, system, seed) in done:
                    continue
                result = work / f"result-{shape}-{system}-s{seed}.json"
                job = {"shape": shape, "system": system, "seed": seed, "work": str(work),
                       "result": str(result), "steps": args.steps}
                t = time.perf_counter()
                log = work / f"log-{shape}-{system}-s{seed}.txt"
                with log.open("w") as err:  # a file, not a pipe: a worker's forkserver may
                    # outlive the run holding its stderr, and a pipe would wait for it
                    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                                           "--one", json.dumps(job)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=err)
                if proc.returncode != 0:
                    print(log.read_text()[-3000:], file=sys.stderr)
                    raise SystemExit(f"{shape} {system} seed {seed} failed "
                                     f"(exit {proc.returncode}); its log: {log}")
                run = json.loads(result.read_text())
                runs.append(run)
                print(f"  {shape:<20} {system:<16} seed {seed}: {run['steps']} steps, reward "
                      f"last-10% {last10(run['rewards']):.3f}, {run['rollouts_per_s']:.0f} "
                      f"rollouts/s, process {time.perf_counter() - t:.0f}s, load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"runs": runs}, default=str))
    rows = table(runs)
    print_table(rows, runs)
    print(f"\nbenchmark wall {time.perf_counter() - t0:.0f}s; load average now "
          f"{os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "table": rows}, default=str))
        print(f"wrote {args.json}")
    return 0


def _with_steps(shape: Shape, steps: int) -> Shape:
    return Shape(**{**asdict(shape), "steps": steps, "extra": tuple(shape.extra)})


def _derive(name: str, steps: int | None) -> None:
    """Put ``name`` in :data:`SHAPES`: a shape's name, or ``<shape>@lr<lr>`` (that shape at
    another learning rate); ``steps`` overrides its steps."""
    base, _, lr = name.partition("@lr")
    shape = SHAPES[base]
    if lr:
        shape = Shape(**{**asdict(shape), "lr": float(lr), "extra": tuple(shape.extra)})
    if steps:
        shape = _with_steps(shape, steps)
    SHAPES[name] = shape


if __name__ == "__main__":
    sys.exit(main())

"""Asynchrony across shapes (issue 9): sync, async (inline / process / Ray) and TRL, one table.

Model sizes (built locally with :func:`freshroll.engines.tiny.save_tiny` and shape
overrides; the exact parameter counts are printed) x completion lengths
(``rollout.max_new_tokens``) x systems x load:

- sizes: ``tiny`` (the embedded default, ~0.09M parameters), ``1m`` (~1M), ``5m`` (~5M);
  held out (asked for by name only): ``2.6m`` and ``9m``, the shapes of issue 25's opening
  measurements;
- lengths: 4 and 16 new tokens;
- systems: ``sync`` (``run.max_staleness=0`` at ``--torch-threads``, default auto: the
  thread probe's choice), ``sync-1t`` (the same at one intra-op thread), ``async-auto`` (the
  product's default: ``run.max_staleness=1``, ``run.runtime`` and ``run.torch_threads``
  auto, placement and threads settled by the run's thread probe; always run),
  ``async-inline``, ``async-process``, ``async-ray`` (``run.runtime`` inline / process /
  ray), ``async-ray-driver`` / ``async-ray-actor`` (ray with ``ray.trainer: driver`` /
  ``actor``), and
  ``trl-1t`` and ``trl-default`` (TRL's ``GRPOTrainer`` at the same settings: :mod:`vs_trl`'s
  runner and settings mapping, at one intra-op thread and at torch's default, all the
  cores, as a user runs it): every ratio to TRL is to the faster of the two (the peer at its
  best; which one is printed), and
  ``floor`` (:mod:`floor`: the leanest correct PyTorch loop for the same work, at one
  thread and at all the cores, the faster: the step this machine cannot beat);
- load: ``quiet``, or ``contended``: one fixed CPU-bound process started by the benchmark
  (a pure-Python busy loop pinned to the last core, the same for every system), stopped
  after the shape's runs.

Per shape and load, also measured:

- the **stage capacities** in isolation (:func:`freshroll.bench.parts.measure_capacities`,
  as ``freshroll bench`` measures the real default): generation alone, reward alone,
  training alone, weight transfer; per-batch stage times ``t_x = B / c_x``;
- the **stage bound** = sync seconds per step (the sync run of the table) / max ``t_x``:
  what a perfect pipeline gains over the lock-step loop;
- this machine's **parallel limit** = 2 x t_alone / t_concurrent: the same fixed
  forward+backward loop of the shape's model (one intra-op thread), timed in one process
  alone and in two processes at once (t_concurrent: their mean);
- **speedup** = async accepted rollouts/s / the fastest sync run's (``sync``, ``sync-1t``:
  a sync baseline at a thread count that does not suit the model would flatter async),
  **bound attainment** A = speedup / max(1, min(stage bound, parallel limit)), and async /
  TRL.

Goals, for the async default (``async-auto``; what each run settled on, printed), per
shape and load: never slower than sync (``not_slower``: ``speedup >= 1``; contended: or the
run says asynchrony did not pay: ``summary.json`` ``overlap.verdict``), ``A >= 0.85``
(issue 9); and, against the peer at its best (issue 25): ``trl``, the async default
``>= 1.3x`` the best TRL quiet and ``>= 1.0x`` contended; ``sync_trl``, freshroll's fastest
sync run ``>= 1.0x`` the best TRL (quiet); ``floor``, freshroll's sync step within 1.15x of
the floor's; ``outside``, the async default's seconds outside its measured wall (start-up
and end files) at most 5; with two seeds or more, reward at equal steps (last 10%) within
noise of the best TRL and of sync (:func:`vs_trl.reward_check`).

Steps per run are chosen per shape from the capacities so that a sync run takes about
``--target-s`` seconds (15) and printed. Usage::

    .venv/bin/python benchmarks/async_sweep.py                     # the whole sweep
    .venv/bin/python benchmarks/async_sweep.py --quick             # smoke run (seconds)
    .venv/bin/python benchmarks/async_sweep.py --sizes tiny 1m --lengths 16 \\
        --systems sync async-inline trl-1t trl-default floor --load quiet --seeds 0 1 2

Nothing is downloaded (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import argparse
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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # benchmarks/ is not a package: imported from beside this file
from freshroll.bench.figures import attainment  # the one definition of A

#: model shapes (save_tiny overrides); the exact parameter counts are printed
SIZES: dict[str, dict[str, int]] = {
    "tiny": {},  # the embedded default: hidden 64, MLP 128, 2 layers (~0.09M)
    "1m": {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4},
    "5m": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6},
    # held out: shapes the tables above were not tuned on (issue 25's opening measurements:
    # a user's ~2.6M model at 8 new tokens, a ~9M one at 12); not in the default --sizes
    "2.6m": {"hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 6},
    "9m": {"hidden_size": 320, "intermediate_size": 896, "num_hidden_layers": 7},
}
#: --sizes when not given: the tuned shapes (the held-out ones are asked for by name)
DEFAULT_SIZES = ("tiny", "1m", "5m")
LENGTHS = (4, 16)
#: system -> (run.max_staleness, run.runtime); "trl" is TRL's GRPOTrainer
SYSTEMS: dict[str, tuple[int, str] | None] = {
    "sync": (0, "inline"),
    "sync-1t": (0, "inline"),  # at one intra-op thread, whatever run.torch_threads says
    "async-auto": (1, "auto"),  # the product's default: placement and threads settled by it
    "async-inline": (1, "inline"),
    "async-process": (1, "process"),
    "async-ray": (1, "ray"),
    "async-ray-driver": (1, "ray"),  # ... with the trainer in the driver (SYSTEM_OVERRIDES)
    "async-ray-actor": (1, "ray"),  # ... with the trainer in an actor (SYSTEM_OVERRIDES)
    "trl-1t": None,  # TRL's GRPOTrainer at one intra-op thread
    "trl-default": None,  # ... at torch's default thread count (all the cores)
    "floor-shared": None,  # the same, each distinct prompt's positions once (floor.py)
    "floor": None,  # benchmarks/floor.py at 1 thread and at all the cores, the faster
}
#: a system's own config overrides, after the sweep's: ``async-ray`` trains where
#: ``ray.trainer``'s default (auto) puts it, ``async-ray-driver`` in the driver,
#: ``async-ray-actor`` in an actor of its own
SYSTEM_OVERRIDES: dict[str, tuple[str, ...]] = {"async-ray-driver": ("ray.trainer=driver",),
                                                 "async-ray-actor": ("ray.trainer=actor",)}
#: the TRL systems; every ratio to TRL is to the faster of those measured
TRLS = ("trl-1t", "trl-default")
#: torch's default intra-op threads in a fresh process, read before any run sets them
TRL_DEFAULT_THREADS = 0
#: the systems whose best rate is every speedup's baseline (the fastest sync run measured)
SYNCS = ("sync", "sync-1t")
#: the async default: run.runtime and run.torch_threads auto, as a user gets them
DEFAULT = "async-auto"
LOADS = ("quiet", "contended")

GOAL_A = 0.85
GOAL_TRL = 1.3  # the async default over the best TRL, quiet (issue 25)
GOAL_TRL_CONTENDED = 1.0  # ... with a core taken
GOAL_SYNC_TRL = 1.0  # freshroll sync over the best TRL, quiet
GOAL_FLOOR = 1.15  # freshroll's sync step / the floor's step, at most
GOAL_OUTSIDE_S = 5.0  # seconds of a run outside its measured wall, at most
GOAL_NOT_SLOWER = 1.0


# == pure figures (tested) ==============================================================


def stage_bound(sync_step_s: float, stage_times: Mapping[str, float]) -> float:
    """Sync seconds per step / the slowest stage's per-batch time."""
    finite = [t for t in stage_times.values() if math.isfinite(t)]
    top = max(finite, default=math.nan)
    return sync_step_s / top if top > 0 else math.nan


def parallel_limit(t_alone: float, t_concurrent: float) -> float:
    """2 x t_alone / t_concurrent: 2 on a machine where two processes do not slow each other,
    1 where they take turns."""
    return 2 * t_alone / t_concurrent if t_concurrent > 0 else math.nan


def ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b is not None and b > 0 else math.nan


def choose_steps(step_s: float, target_s: float, lo: int = 5, hi: int = 400) -> int:
    """Steps so that a run of ``step_s`` seconds per step takes about ``target_s``."""
    if not (math.isfinite(step_s) and step_s > 0):
        return lo
    return max(lo, min(hi, round(target_s / step_s)))


@dataclass
class Cell:
    """One (shape, load): what was measured, and the derived figures."""

    size: str
    params: int
    length: int
    load: str
    steps: int
    stage_times: dict[str, float] = field(default_factory=dict)
    capacities: dict[str, float] = field(default_factory=dict)
    t_alone: float = math.nan
    t_concurrent: float = math.nan
    rates: dict[str, float] = field(default_factory=dict)  # system -> mean accepted/s
    verdicts: dict[str, list[str | None]] = field(default_factory=dict)  # overlap verdicts
    sync_step_s: float = math.nan
    #: the fastest sync run's median step after its first (as floor.py times the floor's)
    sync_median_step_s: float = math.nan
    reward: dict[str, Any] = field(default_factory=dict)  # reward checks (>= 2 seeds)
    #: system -> {"outside_wall_s": run() seconds outside the measured wall (start-up: model
    #: loading, Ray; the end files), "transfer_s": seconds per weight load per worker}
    costs: dict[str, dict[str, float]] = field(default_factory=dict)
    #: system -> what each run settled on (summary.json host.placement): "inline x2", ...
    placements: dict[str, list[str]] = field(default_factory=dict)
    #: the floor at each thread count measured: threads -> {"gen_s", "train_s", "step_s"}
    floor: dict[int, dict[str, float]] = field(default_factory=dict)
    #: the floor whose rows share their prompts' positions (``floor-shared``), the same way
    floor_shared: dict[int, dict[str, float]] = field(default_factory=dict)
    #: system -> each seed's collapse step (None: none), for systems where a run collapsed
    collapsed: dict[str, list[int | None]] = field(default_factory=dict)
    #: the steps before the first collapse, and each freshroll system's rate over them
    window_steps: int = 0
    window_rates: dict[str, float] = field(default_factory=dict)
    #: system -> mean completion tokens per second of wall (:func:`token_rate`): the work
    #: done whatever lengths the policies learned
    token_rates: dict[str, float] = field(default_factory=dict)

    @property
    def bound(self) -> float:
        return stage_bound(self.sync_step_s, self.stage_times)

    @property
    def limit(self) -> float:
        return parallel_limit(self.t_alone, self.t_concurrent)

    def best_sync(self) -> float | None:
        """The fastest sync rate measured (``sync`` at the default threads, ``sync-1t``)."""
        rates = [self.rates[s] for s in SYNCS if s in self.rates]
        return max(rates) if rates else None

    def speedup(self, system: str) -> float:
        return ratio(self.rates.get(system), self.best_sync())

    def best_trl(self) -> tuple[str, float] | None:
        """The faster TRL run measured (its system name, its rate): the peer at its best."""
        measured = [(self.rates[s], s) for s in TRLS if s in self.rates]
        if not measured:
            return None
        rate, name = max(measured)
        return name, rate

    def floor_step(self) -> float:
        """The floor's step at its best thread count (NaN if not measured)."""
        steps = [f["step_s"] for f in self.floor.values()]
        return min(steps) if steps else math.nan

    def floor_ratio(self) -> float:
        """freshroll's sync step (the fastest sync run's wall / steps) / the floor's step."""
        return ratio(self.sync_step_s, self.floor_step())

    def floor_ratio_median(self) -> float:
        """The same with freshroll's step timed as the floor's is: the median step after the
        first (a whole run's wall also holds its first step and, on a short run, the stages'
        thread trials; the floor's median holds neither)."""
        return ratio(self.sync_median_step_s, self.floor_step())

    def shared_floor_ratio_median(self) -> float:
        """freshroll's median sync step over the shared-prompt floor's (NaN: not measured)."""
        steps = [f["step_s"] for f in self.floor_shared.values()]
        return ratio(self.sync_median_step_s, min(steps) if steps else math.nan)

    def a(self, system: str) -> float:
        return attainment(self.speedup(system), self.bound, self.limit)

    def vs_trl(self, system: str) -> float:
        best = self.best_trl()
        return ratio(self.rates.get(system), best[1] if best else None)


#: steps of reward 0 with every group at zero reward std, to the run's end, that make a
#: collapse (fewer: a dip the run may leave)
COLLAPSE_MIN_STEPS = 20


def collapse_step(rewards: Sequence[float], zero_std: Sequence[float | None],
                  min_steps: int = COLLAPSE_MIN_STEPS) -> int | None:
    """The first step (1-based) from which every step to the run's end has reward 0 and no
    group with reward variance, if that lasts at least ``min_steps`` steps; else None.

    Such a policy has collapsed into an absorbing state: zero advantages give no gradient,
    so it never leaves, and its completions (here: one token, then the end) make its steps
    cheaper than a healthy run's. A rate over steps after it is not the same work."""
    if len(zero_std) != len(rewards):
        return None
    k = len(rewards)
    while k > 0 and rewards[k - 1] == 0 and zero_std[k - 1] == 1:
        k -= 1
    return k + 1 if len(rewards) - k >= min_steps else None


def window_rate(r: vs_trl.Result, steps: int) -> float:
    """Accepted rollouts/s of ``r`` between the end of its first step and the end of step
    ``steps`` (NaN where its per-step times do not reach it)."""
    if steps < 2 or len(r.times) < steps or not r.steps:
        return math.nan
    span = r.times[steps - 1] - r.times[0]
    return (steps - 1) * (r.rollouts / r.steps) / span if span > 0 else math.nan


def token_rate(r: vs_trl.Result) -> float:
    """Completion tokens per second of ``r``'s measured wall (NaN without per-step tokens).

    Two runs of one config learn apart, and a completion's length (an early end, or
    ``max_new_tokens``) follows what its policy learned: rollouts/s of runs whose lengths
    differ are not the same work. Tokens/s is nearer to it (generation and the completion
    part of training scale with the tokens; a prompt's part does not)."""
    tokens = r.extra.get("tokens") or []
    if not tokens or any(not isinstance(t, int | float) for t in tokens) or r.wall_s <= 0:
        return math.nan
    return float(sum(tokens)) / r.wall_s


def healthy_window(cell: Cell, per_system: Mapping[str, Sequence[vs_trl.Result]]) -> None:
    """Where a freshroll run of the cell collapsed (:func:`collapse_step`), every freshroll
    system's rate over the steps before the first collapse (the same work for all):
    ``cell.collapsed`` and ``cell.window_steps`` / ``cell.window_rates``."""
    for system, rs in per_system.items():
        if SYSTEMS[system] is None:
            continue
        steps = [collapse_step(r.rewards, r.extra.get("zero_std") or []) for r in rs]
        if any(x is not None for x in steps):
            cell.collapsed[system] = steps
    if not cell.collapsed:
        return
    n = min(x for xs in cell.collapsed.values() for x in xs if x is not None) - 1
    if n < COLLAPSE_MIN_STEPS:
        return
    cell.window_steps = n
    cell.window_rates = {s: statistics.fmean(window_rate(r, n) for r in rs)
                         for s, rs in per_system.items() if SYSTEMS[s] is not None}


def goal_checks(cell: Cell, default: str) -> dict[str, str]:
    """PASS / MISS of each goal for the async default (``n/a``: a system not run)."""
    out: dict[str, str] = {}
    sp = cell.speedup(default)
    if not math.isfinite(sp):
        out["not_slower"] = "n/a"
    elif sp >= GOAL_NOT_SLOWER:
        out["not_slower"] = "PASS"
    else:
        told = bool(cell.verdicts.get(default)) and all(
            v == "did not pay" for v in cell.verdicts[default])
        if told and cell.load == "contended":
            out["not_slower"] = "PASS (loss detected)"
        else:
            out["not_slower"] = "MISS (loss detected)" if told else "MISS"
    a = cell.a(default)
    out["A"] = "n/a" if not math.isfinite(a) else "PASS" if a >= GOAL_A else "MISS"
    t = cell.vs_trl(default)
    goal = GOAL_TRL if cell.load == "quiet" else GOAL_TRL_CONTENDED
    out["trl"] = "n/a" if not math.isfinite(t) else "PASS" if t >= goal else "MISS"
    if cell.load == "quiet":
        s = ratio(cell.best_sync(), (cell.best_trl() or ("", None))[1])
        out["sync_trl"] = ("n/a" if not math.isfinite(s)
                           else "PASS" if s >= GOAL_SYNC_TRL else "MISS")
    f = cell.floor_ratio()
    out["floor"] = "n/a" if not math.isfinite(f) else "PASS" if f <= GOAL_FLOOR else "MISS"
    f = cell.floor_ratio_median()
    out["floor_median"] = ("n/a" if not math.isfinite(f)
                           else "PASS" if f <= GOAL_FLOOR else "MISS")
    o = cell.costs.get(default, {}).get("outside_wall_s", math.nan)
    out["outside"] = "n/a" if not math.isfinite(o) else "PASS" if o <= GOAL_OUTSIDE_S else "MISS"
    for other, check in cell.reward.items():
        ok = check.get("not_worse")
        out[f"reward_vs_{other}"] = "n/a" if ok is None else "PASS" if ok else "MISS"
    return out


def _f(x: float | None, spec: str) -> str:
    return format(x, spec) if isinstance(x, int | float) and math.isfinite(x) else "-"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e6:.3f}M"


def render_table(cells: Sequence[Cell], systems: Sequence[str], default: str) -> str:
    """The sweep's one table (markdown): a row per shape and load. "best TRL" names the
    faster TRL run, the denominator of both TRL ratios; "sync / floor" is the fastest sync
    run's step over the floor's."""
    rates = list(systems)
    head = (["params", "new tok", "load", "steps", "stage bound", "par. limit"]
            + [f"{s} /s" for s in rates]
            + ["best TRL", "sync / TRL", f"speedup {default}", "A", f"{default} / TRL",
               "sync / floor", "median / floor", "median / shared floor", "outside s",
               "verdict", "goals"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        g = goal_checks(c, default)
        goals = " ".join(f"{k} {v}" for k, v in g.items())
        verdicts = c.verdicts.get(default) or []
        best = c.best_trl()
        row = ([f"{c.size} ({_params(c.params)})", str(c.length), c.load, str(c.steps),
                _f(c.bound, ".2f"), _f(c.limit, ".2f")]
               + [_f(c.rates.get(s), ".1f") for s in rates]
               + [best[0] if best else "-", _f(ratio(c.best_sync(), best[1] if best else None),
                                                ".2f"),
                  _f(c.speedup(default), ".2f"), _f(c.a(default), ".2f"),
                  _f(c.vs_trl(default), ".2f"), _f(c.floor_ratio(), ".2f"),
                  _f(c.floor_ratio_median(), ".2f"), _f(c.shared_floor_ratio_median(), ".2f"),
                  _f(c.costs.get(default, {}).get("outside_wall_s"), ".1f"),
                  ",".join(str(v) for v in verdicts) or "-", goals])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def render_details(cells: Sequence[Cell], systems: Sequence[str]) -> str:
    """Per async system: speedup, A and vs TRL; the stage times behind the bound."""
    asyncs = [s for s in systems if s.startswith("async-")]
    lines = []
    for c in cells:
        times = " ".join(f"t_{k} {_f(v, '.4f')}" for k, v in c.stage_times.items())
        lines.append(f"{c.size} L={c.length} {c.load}: sync step {_f(c.sync_step_s, '.4f')} s "
                     f"(median after the first {_f(c.sync_median_step_s, '.4f')} s), "
                     f"{times} (s per batch); parallel probe alone {_f(c.t_alone, '.2f')} s, "
                     f"two at once {_f(c.t_concurrent, '.2f')} s")
        for n, f in sorted(c.floor.items()):
            lines.append(f"    floor at {n} thread(s): generate {_f(f['gen_s'], '.4f')} s, "
                         f"train {_f(f['train_s'], '.4f')} s, step {_f(f['step_s'], '.4f')} s")
        for s in asyncs:
            cost = c.costs.get(s, {})
            lines.append(f"    {s:<14} speedup {_f(c.speedup(s), '.2f')}  A {_f(c.a(s), '.2f')}"
                         f"  vs TRL {_f(c.vs_trl(s), '.2f')}  verdict "
                         f"{','.join(str(v) for v in c.verdicts.get(s, [])) or '-'}  "
                         f"ran {','.join(c.placements.get(s, [])) or '-'}  "
                         f"outside wall {_f(cost.get('outside_wall_s'), '.1f')} s  "
                         f"transfer {_f(cost.get('transfer_s'), '.4f')} s/version")
        lines.extend(collapse_lines(c) + token_lines(c))
    return "\n".join(lines)


def token_lines(c: Cell) -> list[str]:
    """Each freshroll system's completion tokens/s and its ratio to the default's."""
    if not any(math.isfinite(v) for v in c.token_rates.values()):
        return []
    base = c.token_rates.get(DEFAULT)
    return ["    completion tokens/s (the work done, whatever lengths the policies learned): "
            + ", ".join(f"{s} {_f(v, '.0f')} ({_f(ratio(v, base), '.2f')}x {DEFAULT})"
                        for s, v in c.token_rates.items())]


def collapse_lines(c: Cell) -> list[str]:
    """The cell's collapsed runs and the rates over the steps before the first collapse."""
    lines = [f"    COLLAPSED: {s} at step(s) {', '.join(str(x) for x in xs if x is not None)} "
             "(reward 0 and no group with reward variance to the end: no learning signal, "
             "cheaper steps; its whole-run rate is not the others' work)"
             for s, xs in c.collapsed.items()]
    if c.window_steps:
        base = c.window_rates.get(DEFAULT)
        lines.append(f"    over steps 1-{c.window_steps} (before the first collapse, the same "
                     "work for every run): " + ", ".join(
                         f"{s} {_f(v, '.1f')}/s ({_f(ratio(v, base), '.2f')}x {DEFAULT})"
                         for s, v in c.window_rates.items()))
    return lines


# == measurements ========================================================================


def count_params(model_dir: Path) -> int:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    return sum(p.numel() for p in model.parameters())


def build_model(work: Path, size: str) -> Path:
    from freshroll.engines.tiny import save_tiny

    path = work / f"model-{size}"
    if not (path / "config.json").is_file():
        save_tiny(path, seed=0, **SIZES[size])
    return path


@contextmanager
def contention(load: str) -> Iterator[subprocess.Popen[bytes] | None]:
    """``contended``: one pure-Python busy loop pinned to the last core, for the block."""
    if load != "contended":
        yield None
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def pin() -> None:
        if cores:
            os.sched_setaffinity(0, {cores[-1]})

    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin)
    try:
        time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def probe_main(model_dir: str, iters: int, batch: int, tokens: int) -> int:
    """The parallel-limit probe (a child process): forward+backward of the model on a fixed
    batch, one intra-op thread; prints ``ready``, waits for a line on stdin, runs ``iters``
    times and prints the seconds as JSON."""
    vs_trl._offline()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    model.train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (batch, tokens), generator=gen)

    def once() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    once()
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
    return 0


def _probe(model_dir: Path, iters: int, batch: int, tokens: int, n: int,
           timeout_s: float = 300.0) -> float:
    """Mean seconds of ``n`` probe processes started together."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", str(model_dir),
           str(iters), str(batch), str(tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              text=True) for _ in range(n)]
    try:
        deadline = time.monotonic() + timeout_s
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()  # ready (the child exits on any failure: EOF)
            if line.strip() != "ready" or time.monotonic() > deadline:
                raise RuntimeError(f"parallel probe did not start: {line!r}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        times = []
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            times.append(float(json.loads(out.strip().splitlines()[-1])["s"]))
        return statistics.fmean(times)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def measure_parallel(model_dir: Path, batch: int, tokens: int, train_step_s: float,
                     target_s: float) -> tuple[float, float]:
    """(t_alone, t_concurrent) of the probe, ~``target_s`` seconds of work each."""
    iters = max(3, round(target_s / train_step_s)) if train_step_s > 0 else 10
    return (_probe(model_dir, iters, batch, tokens, 1),
            _probe(model_dir, iters, batch, tokens, 2))


def measure_stages(cfg: Any, quick: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Per-batch stage times and capacities in isolation (``freshroll bench``'s measure)."""
    from freshroll.bench.figures import stage_times
    from freshroll.bench.parts import measure_capacities

    caps = measure_capacities(cfg, quick=quick)
    return stage_times(caps), {**caps.per_s(), "transfer_s": caps.transfer_s}


def settled_as(r: vs_trl.Result) -> str:
    """What a freshroll run settled on: ``process x1`` (placement x trainer threads)."""
    p = (r.extra.get("host") or {}).get("placement") or {}
    return f"{p.get('runtime', '?')} x{p.get('trainer_threads', '?')}"


def trl_threads(system: str) -> int:
    """The intra-op threads of a TRL system: one, or torch's default (all the cores)."""
    return 1 if system == "trl-1t" else (TRL_DEFAULT_THREADS or available_threads())


def available_threads() -> int:
    import torch

    return torch.get_num_threads()


def measure_floor(model_dir: Path, cfg: Any, quick: bool,
                  shared: bool = False) -> dict[int, dict[str, float]]:
    """The floor (:func:`floor.measure`; ``shared``: its shared-prompt form) at one thread
    and at all the cores."""
    import floor

    prompts, _ = vs_trl.prompt_rows(cfg)
    r = cfg.rollout
    out: dict[int, dict[str, float]] = {}
    for n in sorted({1, TRL_DEFAULT_THREADS or available_threads()}):
        f = floor.measure(model_dir, prompts, rows=r.batch_groups * r.group_size,
                          group_size=r.group_size, new_tokens=r.max_new_tokens, threads=n,
                          steps=2 if quick else 5, temperature=r.temperature or 1.0,
                          lr=cfg.trainer.lr, shared=shared)
        out[n] = {"gen_s": f.gen_s, "train_s": f.train_s, "step_s": f.step_s}
    return out


#: run each system in a process of its own (``--in-process`` turns it off; ``--quick`` too)
ISOLATE = True


def run_system(system: str, steps: int, seed: int, model_dir: Path, overrides: list[str],
               out: Path, threads: str) -> vs_trl.Result:
    """One run of ``system``: in a fresh Python process (:data:`ISOLATE`), as a user runs TRL
    or freshroll. In one long process every system after the first inherits the OpenMP
    teams of the threads that computed before it (the sweep's stage and floor measurements
    and TRL on the main thread): a freshroll run computes on threads of its own, and a
    second team in a process takes the second core's gain (docs/overlap.md, "One OpenMP team
    per process"). Measured 2026-12-05 night, 1.06M parameters, 4 new tokens, 40 steps: sync
    553 rollouts/s inside the sweep's process, 792-851 in a fresh one."""
    if not ISOLATE:
        return run_here(system, steps, seed, model_dir, overrides, out, threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = out.parent / f"{out.name}.result.json"
    result.unlink(missing_ok=True)
    job = {"system": system, "steps": steps, "seed": seed, "model_dir": str(model_dir),
           "overrides": overrides, "out": str(out), "threads": threads, "result": str(result)}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(job)],
                   check=True)
    return vs_trl.Result(**json.loads(result.read_text()))


def one_main(job_json: str) -> int:
    """``--one JOB``: one :func:`run_here` in this (fresh) process; its Result as JSON."""
    job = json.loads(job_json)
    vs_trl._offline()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    r = run_here(job["system"], job["steps"], job["seed"], Path(job["model_dir"]),
                 job["overrides"], Path(job["out"]), job["threads"])
    Path(job["result"]).write_text(json.dumps(asdict(r)))
    return 0


def run_here(system: str, steps: int, seed: int, model_dir: Path, overrides: list[str],
             out: Path, threads: str) -> vs_trl.Result:
    spec = SYSTEMS[system]
    threads = "1" if system == "sync-1t" else threads
    shutil.rmtree(out, ignore_errors=True)
    if spec is None:
        cfg = vs_trl.freshroll_config(steps, seed, (0, "inline"), model_dir, overrides)
        r = vs_trl.run_trl(cfg, model_dir, out, trl_threads(system))
        r.system = system
        return r
    cfg = vs_trl.freshroll_config(steps, seed, spec, model_dir,
                                  [*overrides, *SYSTEM_OVERRIDES.get(system, ())], threads)
    return vs_trl.run_freshroll(cfg, out, name=system)


# == main ================================================================================


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        return probe_main(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    if argv[:1] == ["--one"]:
        return one_main(argv[1])
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="freshroll config overrides (key=value)")
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(DEFAULT_SIZES))
    ap.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    ap.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--load", nargs="+", choices=LOADS, default=list(LOADS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--target-s", type=float, default=15.0, help="seconds per sync run")
    ap.add_argument("--steps", type=int, help="steps per run (default: from --target-s)")
    ap.add_argument("--torch-threads", default="auto", help="freshroll's run.torch_threads")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny, 4 tokens, sync/async-auto/trl, quiet, 3 steps")
    ap.add_argument("--in-process", action="store_true",
                    help="run every system in this process (default: each run in a fresh "
                    "process; --quick runs in this one)")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--workdir", type=Path, help="keep models and run dirs here")
    args = ap.parse_args(argv)
    given = set(a.split("=")[0] for a in argv if a.startswith("--"))
    if args.quick:
        args.sizes = args.sizes if "--sizes" in given else ["tiny"]
        args.lengths = args.lengths if "--lengths" in given else [4]
        args.systems = (args.systems if "--systems" in given
                        else ["sync", DEFAULT, *TRLS, "floor"])
        args.load = args.load if "--load" in given else ["quiet"]
        args.steps = args.steps or 3
    global ISOLATE
    ISOLATE = not (args.in_process or args.quick)
    if "sync" not in args.systems:
        args.systems = ["sync", *args.systems]  # the baseline of every ratio
    if DEFAULT not in args.systems:
        args.systems = [*args.systems, DEFAULT]  # the goals are the default's

    vs_trl._offline()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    global TRL_DEFAULT_THREADS
    TRL_DEFAULT_THREADS = torch.get_num_threads()  # before any run sets it
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from freshroll.placement.placement import available_cores

    work = args.workdir or Path(tempfile.mkdtemp(prefix="freshroll-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    # freshroll's thread probe and settled stage threads are reused by the next run of the
    # same work (freshroll.placement.probe_cache): within this invocation (a later seed reuses
    # the first one's, as a user's re-run does), never from what ran on the machine before
    os.environ.setdefault("FRESHROLL_CACHE_DIR", str(work / "probe-cache"))
    t_all = time.perf_counter()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{os.cpu_count()} cpus ({available_cores()} available), python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}; torch's "
          f"default threads {TRL_DEFAULT_THREADS} (trl-default)")
    cells: list[Cell] = []
    results: list[dict[str, Any]] = []
    default = DEFAULT
    try:
        for size in args.sizes:
            model_dir = build_model(work, size)
            params = count_params(model_dir)
            print(f"model {size}: {params:,} parameters ({SIZES[size] or 'tiny default'})",
                  flush=True)
            for length in args.lengths:
                over = [*args.overrides, f"rollout.max_new_tokens={length}"]
                steps = args.steps
                for load in args.load:
                    with contention(load) as busy:
                        cell = _measure_cell(args, size, params, length, load, model_dir, over,
                                             steps, work, results)
                        steps = steps or cell.steps  # the same steps under both loads
                        if busy is not None and busy.poll() is not None:
                            raise RuntimeError("the load process died during the block")
                    cells.append(cell)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - t_all

    print()
    print(f"async default: {default} (run.runtime and run.torch_threads auto; what each run "
          "settled on is in the details); speedups are over the fastest sync run")
    print(render_table(cells, args.systems, default))
    print()
    print(render_details(cells, args.systems))
    load = os.getloadavg()
    print(f"\nsweep wall time {total:.0f} s; load average now {load[0]:.2f} (1 min) "
          f"{load[2]:.2f} (15 min) on {available_cores()} cores")
    if args.json:
        args.json.write_text(json.dumps({
            "default": default, "systems": args.systems, "seeds": args.seeds,
            "overrides": args.overrides, "sizes": {s: SIZES[s] for s in args.sizes},
            "cells": [{**asdict(c), "bound": c.bound, "limit": c.limit,
                       "speedup": {s: c.speedup(s) for s in args.systems},
                       "A": {s: c.a(s) for s in args.systems if s.startswith("async-")},
                       "vs_trl": {s: c.vs_trl(s) for s in args.systems},
                       "goals": goal_checks(c, default)} for c in cells],
            "results": results, "benchmark_s": total,
            "trl_default_threads": TRL_DEFAULT_THREADS,
            "machine": {"cpus": os.cpu_count(), "cores": available_cores(),
                        "platform": platform.platform()},
        }, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


def _measure_cell(args: argparse.Namespace, size: str, params: int, length: int, load: str,
                  model_dir: Path, over: list[str], steps: int | None, work: Path,
                  results: list[dict[str, Any]]) -> Cell:
    """Stage capacities, the parallel limit, then every system x seed of one shape and load."""
    base = vs_trl.freshroll_config(steps or 10, args.seeds[0], (0, "inline"), model_dir, over,
                                   args.torch_threads)
    t0 = time.perf_counter()
    times, caps = measure_stages(base, args.quick)
    if steps is None:
        steps = choose_steps(sum(t for t in times.values() if math.isfinite(t)), args.target_s)
    batch = base.rollout.batch_groups * base.rollout.group_size
    tokens = 16 + length  # a prompt's length (the digit task) plus the completion
    t_alone, t_conc = measure_parallel(model_dir, batch, tokens, times["train"],
                                       0.5 if args.quick else 2.0)
    cell = Cell(size, params, length, load, steps, times, caps, t_alone, t_conc)
    print(f"  {size} L={length} {load}: stages "
          + " ".join(f"t_{k} {v:.4f}" for k, v in times.items())
          + f" s/batch; parallel limit {cell.limit:.2f}; {steps} steps per run "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    for name in ("floor", "floor-shared"):
        if name not in args.systems:
            continue
        measured = measure_floor(model_dir, base, args.quick, shared=name == "floor-shared")
        if name == "floor":
            cell.floor = measured
        else:
            cell.floor_shared = measured
        best = min(measured.values(), key=lambda f: f["step_s"])
        cell.rates[name] = batch / best["step_s"]
        print(f"    {name:<14} " + ", ".join(
            f"{n} thread(s) step {f['step_s']:.4f} s" for n, f in sorted(measured.items()))
            + f" ({cell.rates[name]:.1f} rollouts/s)", flush=True)
    per_system: dict[str, list[vs_trl.Result]] = {}
    systems = [s for s in args.systems if s not in ("floor", "floor-shared")]
    for i, seed in enumerate(args.seeds):
        rot = i % len(systems)
        for system in systems[rot:] + systems[:rot]:
            out = work / "runs" / f"{size}-L{length}-{load}" / f"{system}-s{seed}"
            r = run_system(system, steps, seed, model_dir, over, out, args.torch_threads)
            per_system.setdefault(system, []).append(r)
            verdict = (r.extra.get("overlap") or {}).get("verdict")
            results.append({"size": size, "length": length, "load": load, **asdict(r),
                            "cpu_ratio": vs_trl.cpu_ratio(r)})
            print(f"    {system:<14} seed {seed}: {r.steps} steps in {r.wall_s:6.2f} s "
                  f"({r.rollouts_per_s:7.1f} rollouts/s) reward {r.reward_first:.3f} -> "
                  f"{r.reward_last:.3f}" + (f"  [{verdict}]" if verdict else ""), flush=True)
    for system, rs in per_system.items():
        cell.rates[system] = statistics.fmean(r.rollouts_per_s for r in rs)
        if SYSTEMS[system] is not None:
            cell.verdicts[system] = [(r.extra.get("overlap") or {}).get("verdict") for r in rs]
            transfers = [float(x) for r in rs
                         if isinstance(x := r.extra.get("weight_transfer_s_mean"), int | float)]
            cell.costs[system] = {
                "outside_wall_s": statistics.fmean(r.outer_s - r.wall_s for r in rs),
                "transfer_s": statistics.fmean(transfers) if transfers else math.nan}
            cell.placements[system] = [settled_as(r) for r in rs]
    healthy_window(cell, per_system)
    cell.token_rates = {s: statistics.fmean(token_rate(r) for r in rs)
                        for s, rs in per_system.items() if SYSTEMS[s] is not None}
    for line in collapse_lines(cell) + token_lines(cell):
        print(line, flush=True)
    cell.sync_step_s = min(statistics.fmean(r.wall_s / r.steps for r in per_system[s] if r.steps)
                           for s in SYNCS if s in per_system)
    medians = [statistics.fmean(float(r.extra.get("step_period_median", math.nan))
                                for r in per_system[s]) for s in SYNCS if s in per_system]
    cell.sync_median_step_s = min((m for m in medians if math.isfinite(m)), default=math.nan)
    if len(args.seeds) >= 2:
        flat = [r for rs in per_system.values() for r in rs]
        agg = vs_trl.aggregate(flat, 0.5)  # its time to reward is not read here
        target = DEFAULT
        best = cell.best_trl()
        for other in (best[0] if best else "trl", "sync"):
            if target in agg and other in agg:
                cell.reward["trl" if other in TRLS else other] = vs_trl.reward_check(
                    agg, target, other)
    return cell


if __name__ == "__main__":
    sys.exit(main())

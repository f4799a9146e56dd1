"""Agentic rollouts against sync (issue 49): the built-in tool task with a slow tool, sync and
async, over seeds, one markdown table.

The task is ``configs/tool-smoke.yaml`` (the ``calc`` task, the ``calc_tool`` workflow: a
model turn, the calculator's answer, the model's answer) on the embedded model, every tool
call waiting a latency drawn from ``tools.latency: {dist: lognormal, median_s: 0.05, p99_s:
1.0}``. Systems (each run in a fresh process: ``python -m freshroll run``, as a user runs it;
exit status 0 means the run finished and ``verify`` held):

- ``sync``: ``run.max_staleness=0`` (the lock-step baseline: a step's episodes, then its
  training);
- ``async``: ``run.max_staleness=1``, ``rollout.on_update`` unset (finish: a worker loads a
  new version once its live episodes have ended on the old one);
- ``async-continue``: ``run.max_staleness=2``, ``rollout.on_update=continue`` (the new
  version loads beside the live episodes; each token keeps the version that sampled it).

Every run: ``rollout.worker_batch=32`` (episodes in flight per worker, more than a step's 16:
what a deeper window can use), ``control.fallback=false`` (an async run stays async, so the
table compares the modes, not the fallback's choice), ``run.runtime=inline``. Per system, the
mean over seeds (± the sample sd across seeds where there are two or more) of, each from the
run's ``summary.json`` / ``metrics.jsonl`` (docs/metrics.md):

- ``episodes/s``: ``accepted_rollouts_per_s`` (an accepted sample is one whole episode), and
  ``x sync`` its ratio to the sync row's mean;
- ``trainer idle``: ``trainer_idle_ratio``;
- ``token lag``: ``token_lag.weighted.mean``;
- ``reward``: each seed's mean ``reward_mean`` over all its steps (every system trains the
  same number of steps: reward at equal steps), then mean ± sd over the seeds; ``vs sync`` the
  difference of the means and its standard error (``sqrt(sd_a²/n_a + sd_s²/n_s)``);
- ``tool s`` / ``generation s``: the mean of the ``tool`` and ``generation`` stages
  (``summary.json`` ``stages``);
- ``CPU s``: the run's process's user + system CPU seconds (``getrusage`` of the child), and
  ``wall s`` its wall time, start-up included;
- ``load``: the 1-minute load average after each run (mean); the load before the first run is
  printed above the table. Read the table on a quiet machine only.

Usage::

    .venv/bin/python benchmarks/agents_vs_sync.py                  # 40 steps x 5 seeds
    .venv/bin/python benchmarks/agents_vs_sync.py --quick          # 2 steps, 1 seed, in process
    .venv/bin/python benchmarks/agents_vs_sync.py --steps 30 --seeds 0 1 2 tools.max_calls=1

``--quick`` runs each system in this process (``freshroll.runtime.run.run``, then ``verify``):
a smoke run of seconds, not a measurement. Nothing is downloaded (the embedded model).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli_runs import ROOT, mean_sd, num, run_cli

CONFIG = ROOT / "configs" / "tool-smoke.yaml"
LATENCY = "tools.latency={dist: lognormal, median_s: 0.05, p99_s: 1.0}"
#: system -> its overrides on top of the config
SYSTEMS: dict[str, list[str]] = {
    "sync": ["run.max_staleness=0"],
    "async": ["run.max_staleness=1"],
    "async-continue": ["run.max_staleness=2", "rollout.on_update=continue"],
}
COMMON = ["run.runtime=inline", "run.progress=false", "control.fallback=false",
          "rollout.worker_batch=32", LATENCY]
#: --quick: a few small steps of the same task
QUICK = ["rollout.batch_groups=2", "task.n_prompts=64", "run.torch_threads=1"]
COLUMNS = ("system", "seeds", "episodes/s", "x sync", "trainer idle", "token lag", "reward",
           "vs sync", "tool s", "generation s", "CPU s", "wall s", "load", "verify")


@dataclass
class Run:
    """One run's figures (read from its run directory)."""

    system: str
    seed: int
    ok: bool
    episodes_per_s: float
    idle: float
    token_lag: float
    reward: float
    tool_s: float
    generation_s: float
    cpu_s: float
    wall_s: float
    load: float


def read_run(system: str, seed: int, out: Path, ok: bool, cpu_s: float, wall_s: float,
             load: float) -> Run:
    """The figures of the finished run in ``out``."""
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    rewards = [x for r in rows if math.isfinite(x := num(r.get("reward_mean")))]
    stages = {r.get("stage"): r for r in s.get("stages") or [] if isinstance(r, dict)}
    return Run(
        system, seed, ok, num(s.get("accepted_rollouts_per_s")),
        num(s.get("trainer_idle_ratio")),
        num(((s.get("token_lag") or {}).get("weighted") or {}).get("mean")),
        statistics.fmean(rewards) if rewards else math.nan,
        num((stages.get("tool") or {}).get("mean", 0.0)),
        num((stages.get("generation") or {}).get("mean")), cpu_s, wall_s, load)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_one(system: str, seed: int, steps: int, out: Path, extra: Sequence[str],
            in_process: bool = False) -> Run:
    """One run (a fresh process: the CLI; or ``in_process``), then its figures."""
    args = [f"run.steps={steps}", f"run.seed={seed}", *COMMON, *SYSTEMS[system], *extra]
    t0 = time.perf_counter()
    if in_process:
        from freshroll.config import load_config
        from freshroll.runtime.run import run

        cpu0 = _self_cpu()
        ok = run(load_config(CONFIG, args), out, stream=io.StringIO(), report=False).ok
        cpu, load = _self_cpu() - cpu0, os.getloadavg()[0]
    else:
        cpu0 = _children_cpu()
        ok, load = run_cli(["run", str(CONFIG), "--out", str(out), *args],
                           f"{system} seed {seed}")
        cpu = _children_cpu() - cpu0
    return read_run(system, seed, out, ok, cpu, time.perf_counter() - t0, load)


def _sd(xs: Sequence[float]) -> float:
    vals = [x for x in xs if math.isfinite(x)]
    return statistics.stdev(vals) if len(vals) >= 2 else math.nan


def versus(runs: Sequence[Run], base: Sequence[Run]) -> str:
    """``+d (se s)``: the difference of the mean rewards and its standard error."""
    a = [r.reward for r in runs if math.isfinite(r.reward)]
    b = [r.reward for r in base if math.isfinite(r.reward)]
    if not a or not b:
        return "-"
    d = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return f"{d:+.3f}"
    se = math.sqrt(_sd(a) ** 2 / len(a) + _sd(b) ** 2 / len(b))
    return f"{d:+.3f} (se {se:.3f})"


def render_table(runs: Sequence[Run]) -> str:
    """One row per system (in :data:`SYSTEMS` order) over its seeds."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    base = [r for r in runs if r.system == "sync"]
    base_rate = statistics.fmean([r.episodes_per_s for r in base]) if base else math.nan
    for system in SYSTEMS:
        rs = [r for r in runs if r.system == system]
        if not rs:
            continue
        rate = statistics.fmean([r.episodes_per_s for r in rs])
        cells = [
            system, str(len(rs)), mean_sd([r.episodes_per_s for r in rs], ".1f"),
            f"{rate / base_rate:.2f}x" if base_rate > 0 else "-",
            mean_sd([r.idle for r in rs], ".1f", 100) + "%",
            mean_sd([r.token_lag for r in rs], ".2f"),
            mean_sd([r.reward for r in rs], ".3f"),
            versus(rs, base) if system != "sync" else "-",
            mean_sd([r.tool_s for r in rs], ".3f"),
            mean_sd([r.generation_s for r in rs], ".3f"),
            mean_sd([r.cpu_s for r in rs], ".1f"), mean_sd([r.wall_s for r in rs], ".1f"),
            mean_sd([r.load for r in rs], ".2f"),
            "ok" if all(r.ok for r in rs) else f"FAIL {sum(not r.ok for r in rs)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="more config overrides (key=value), all runs")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default 40; "
                    "--quick: 2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="seeds (default 0 1 2 3 4; --quick: 0)")
    ap.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--quick", action="store_true",
                    help="2 small steps, 1 seed, every run in this process: a smoke run")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: temp)")
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else 2 if args.quick else 40
    seeds = args.seeds if args.seeds is not None else [0] if args.quick else [0, 1, 2, 3, 4]
    extra = [*(QUICK if args.quick else []), *args.overrides]
    work = args.work or Path(tempfile.mkdtemp(prefix="agents-"))
    before = os.getloadavg()
    command = " ".join(["benchmarks/agents_vs_sync.py", *(argv if argv is not None
                                                          else sys.argv[1:])])
    runs = [run_one(system, seed, steps, work / f"{system}-s{seed}", extra, args.quick)
            for seed in seeds for system in args.systems]
    print(f"## Agentic rollouts ({CONFIG.name}, calc_tool, HF engine, embedded model): {steps} "
          f"steps, seeds {' '.join(map(str, seeds))}{' (quick)' if args.quick else ''}")
    print(f"command: {command}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; commit {_commit()}; "
          f"overrides: {' '.join([*COMMON, *extra])}; os.cpu_count {os.cpu_count()}; "
          f"load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}\n")
    print(render_table(runs))
    print(f"\nrun directories: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

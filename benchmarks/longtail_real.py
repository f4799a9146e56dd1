"""The real long-tailed task (issue 26): sync, async ``on_update: finish`` and async
``on_update: continue`` on the HF engine, over seeds, one markdown table.

The task is ``configs/longtail.yaml`` (the built-in ``repeat`` task with a heavy-tailed answer
length: median 3 digits, 2% at the 48 cap) on the embedded model. Systems (each run in a
fresh process: ``python -m freshroll run``, as a user runs it; the CLI's exit status 0 means
the run finished and ``verify`` held):

- ``sync``: ``run.max_staleness=0`` (the lock-step baseline);
- ``finish``: the config's ``run.max_staleness`` (1), ``rollout.on_update=finish`` (a new
  version loads between calls);
- ``continue``: the same with ``rollout.on_update=continue`` (weights swapped under running
  requests, each token's version recorded).

All three at ``run.runtime=inline`` (``continue`` on the HF engine needs it; the others use it
so that only the setting differs). Per system, the mean over seeds (± the sample sd across
seeds where there are two or more) of, each from the run's ``summary.json`` / ``metrics.jsonl``
(docs/metrics.md):

- ``accepted/s``: ``accepted_rollouts_per_s``;
- ``trainer idle``: ``trainer_idle_ratio``;
- ``stale %`` / ``cancelled %``: discards of that reason over accepted + counted discards
  (the denominator of ``discard_rate``);
- ``token lag``: the token-weighted mean lag of the accepted samples
  (``token_lag.weighted.mean``; for a one-version sample its lag);
- ``mismatch KL``: ``off_policy.mismatch_kl_mean``, and beside it per token-lag bucket
  (``off_policy.by_lag``: ``0 / 1 / 2 / 3+``, ``-`` where no token had that lag);
- ``reward (last 10%)``: each seed's mean ``reward_mean`` over its last ceil(10%) steps, then
  mean ± sd over the seeds;
- ``load``: the 1-minute load average after each run (mean), printed beside the figures; the
  load before the first run is printed above the table. Read the table on a quiet machine
  only.

Usage::

    .venv/bin/python benchmarks/longtail_real.py                 # 200 steps x 3 seeds (long)
    .venv/bin/python benchmarks/longtail_real.py --quick         # 3 steps, 1 seed (~1 min)
    .venv/bin/python benchmarks/longtail_real.py --steps 100 --seeds 0 1 2 \
        run.staleness_basis=newest_token                         # overrides for every run

Nothing is downloaded (the embedded model).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli_runs import ROOT, mean_sd, num, run_cli

CONFIG = ROOT / "configs" / "longtail.yaml"
#: system -> its overrides on top of the config
SYSTEMS: dict[str, list[str]] = {
    "sync": ["run.max_staleness=0"],
    "finish": ["rollout.on_update=finish"],
    "continue": ["rollout.on_update=continue"],
}
COMMON = ["run.runtime=inline", "run.progress=false"]
#: --quick: a few small steps of the same task
QUICK = ["rollout.batch_groups=2", "rollout.group_size=4", "task.n_prompts=64"]
BUCKETS = ("0", "1", "2", "3+")
COLUMNS = ("system", "seeds", "accepted/s", "trainer idle", "stale %", "cancelled %",
           "token lag", "mismatch KL", "KL by lag 0 / 1 / 2 / 3+", "reward (last 10%)", "load",
           "verify")


@dataclass
class Run:
    """One run's figures (read from its run directory)."""

    system: str
    seed: int
    ok: bool
    accepted_per_s: float
    idle: float
    stale: float
    cancelled: float
    token_lag: float
    mismatch_kl: float
    kl_by_lag: dict[str, float | None] = field(default_factory=dict)
    reward_last: float = math.nan
    load: float = math.nan


def last_tenth(rewards: Sequence[float]) -> float:
    """The mean of the last ceil(10%) of ``rewards`` (NaN without any)."""
    if not rewards:
        return math.nan
    k = max(1, math.ceil(len(rewards) / 10))
    return statistics.fmean(rewards[-k:])


def read_run(system: str, seed: int, out: Path, ok: bool, load: float) -> Run:
    """The figures of the finished run in ``out``."""
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    rewards = [num(r.get("reward_mean")) for r in sorted(rows, key=lambda r: r["step"])]
    discards = s.get("discards") or {}
    outcomes = num(s.get("accepted_rollouts")) + num(s.get("counted_discards"))
    off = s.get("off_policy") or {}
    by_lag = off.get("by_lag") or {}
    return Run(
        system, seed, ok, num(s.get("accepted_rollouts_per_s")),
        num(s.get("trainer_idle_ratio")),
        discards.get("stale", 0) / outcomes if outcomes else math.nan,
        discards.get("cancelled", 0) / outcomes if outcomes else math.nan,
        num(((s.get("token_lag") or {}).get("weighted") or {}).get("mean")),
        num(off.get("mismatch_kl_mean")),
        {b: (num(x["mismatch_kl_mean"]) if isinstance(x, Mapping) else None)
         for b, x in ((b, by_lag.get(b)) for b in BUCKETS)},
        last_tenth([r for r in rewards if math.isfinite(r)]), load)


def run_one(system: str, seed: int, steps: int, out: Path, extra: Sequence[str]) -> Run:
    """One run in a fresh process (the CLI), then its figures."""
    ok, load = run_cli(["run", str(CONFIG), "--out", str(out), f"run.steps={steps}",
                        f"run.seed={seed}", *COMMON, *SYSTEMS[system], *extra],
                       f"{system} seed {seed}")
    return read_run(system, seed, out, ok, load)


def _bucket(runs: Sequence[Run], b: str) -> str:
    vals = [x for r in runs if (x := r.kl_by_lag.get(b)) is not None and math.isfinite(x)]
    return format(statistics.fmean(vals), ".2e") if vals else "-"


def render_table(runs: Sequence[Run]) -> str:
    """One row per system (in :data:`SYSTEMS` order) over its seeds."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for system in SYSTEMS:
        rs = [r for r in runs if r.system == system]
        if not rs:
            continue
        cells = [
            system, str(len(rs)), mean_sd([r.accepted_per_s for r in rs], ".1f"),
            mean_sd([r.idle for r in rs], ".1f", 100) + "%",
            mean_sd([r.stale for r in rs], ".2f", 100),
            mean_sd([r.cancelled for r in rs], ".2f", 100),
            mean_sd([r.token_lag for r in rs], ".3f"),
            mean_sd([r.mismatch_kl for r in rs], ".2e"),
            " / ".join(_bucket(rs, b) for b in BUCKETS),
            mean_sd([r.reward_last for r in rs], ".3f"),
            mean_sd([r.load for r in rs], ".2f"),
            "ok" if all(r.ok for r in rs) else f"FAIL {sum(not r.ok for r in rs)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="more config overrides (key=value), all runs")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default: the "
                    "config's, 200; --quick: 3)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="seeds (default 0 1 2; --quick: 0)")
    ap.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--quick", action="store_true",
                    help="3 small steps, 1 seed: a smoke run (3 fresh processes, about a minute "
                    "on 2 cores, most of it start-up)")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: temp)")
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else 3 if args.quick else 200
    seeds = args.seeds if args.seeds is not None else [0] if args.quick else [0, 1, 2]
    extra = [*(QUICK if args.quick else []), *args.overrides]
    work = args.work or Path(tempfile.mkdtemp(prefix="longtail-"))
    before = os.getloadavg()
    runs = [run_one(system, seed, steps, work / f"{system}-s{seed}", extra)
            for seed in seeds for system in args.systems]
    print(f"## Real long-tailed task ({CONFIG.name}, HF engine, embedded model): {steps} steps,"
          f" seeds {' '.join(map(str, seeds))}{' (quick)' if args.quick else ''}")
    print(f"overrides: {' '.join([*COMMON, *extra]) or '-'}; os.cpu_count {os.cpu_count()}; "
          f"load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}\n")
    print(render_table(runs))
    print(f"\nrun directories: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

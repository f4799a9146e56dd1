"""The frontier table on P2 (issue 26): each tail lever at max_staleness η ∈ {1, 2, 4}, with
the freshness window's bound beside the efficiency it limits.

The workload is ``configs/sim-p2.yaml`` on the virtual clock (the figures do not depend on
the machine's load; only the wall seconds do). Systems, each at every η (the keys of
``freshroll bench``'s rows of the same name, :mod:`freshroll.bench.runner`):

- ``static``: ``control.mode=static`` on the whole pool (``rollout.workers=32``, bench's
  ``static-all``), no tail lever;
- ``continue-newest``: the same with ``rollout.on_update=continue`` and
  ``run.staleness_basis=newest_token`` (bench's ``static-continue-newest``);
- ``overprov``: the same with ``tail.overprovision=4`` (4 extra requests per group, the
  first 16 done kept, the rest cancelled);
- ``deadlines``: the same with ``tail.deadline=true`` (group deadlines);
- ``doomed``: the same with ``tail.drop_doomed=true`` (a running group that can no longer be
  fresh discarded stale at once, freeing its place: freshroll.kernel.freshness.doomed);
- ``all``: every lever, the controller steering (bench's ``adaptive-all``:
  ``control.mode=adaptive control.max_workers=32 tail.overprovision=auto
  rollout.on_update=continue run.staleness_basis=newest_token``, from the config's 16
  workers); ``all-doomed``: the same with ``tail.drop_doomed=true``;
- ``refresh``: ``continue-newest`` with ``tail.refresh=true`` (a finished member past the
  bound re-issued instead of its group ending stale: freshroll.kernel.refresh); ``all-refresh``:
  ``all`` with ``tail.refresh=true``;
- ``pace-static``, ``pace-deadlines``, ``pace-all``: ``static``, ``deadlines`` and ``all``
  with ``run.staleness_policy=pace`` (the trainer consumes in admission order, waiting for a
  group still running ahead: none is discarded stale; freshroll.kernel.freshness.paced_lease);
- ``wide-static``, ``wide-continue-newest``, ``wide-all``, ``wide-all-doomed``,
  ``wide-refresh``, ``wide-all-refresh``: ``static``, ``continue-newest``, ``all``,
  ``all-doomed``, ``refresh`` and ``all-refresh`` with an admission window :data:`WIDE` times
  the freshness window, ``run.admission_window = WIDE × (η + 1)`` trainer steps of groups
  (freshroll.kernel.freshness; the default is ``η + 1``), η unchanged.

Each run is ``freshroll simulate`` in a fresh process, one at a time; its figures come from
its run directory (``summary.json`` and the ledger, docs/metrics.md):

- ``accepted/s``: ``accepted_rollouts_per_s`` (per simulated second);
- ``E (own)``: accepted/s over the run's own trainer capacity, ``G × λ`` (``λ``:
  ``window_bound.trainer_groups_per_s``, B over the mean trainer step); ``E (c_train)``:
  accepted/s over ``--c-train`` (default 23.1/s: P2's trainer capacity in isolation, B = 512,
  docs/bench.md), the ``E`` of ``freshroll bench``;
- ``window bound``: ``window_bound.bound = min(1, W·B / (λ·L))`` (``W``: η + 1, or the
  wide rows' window)
  (:mod:`freshroll.figures.window`); ``L`` beside it (mean group latency, admission to ready)
  and ``held by discards``: the share of the window's mean occupancy held by groups discarded
  in the end (``occupancy_discarded / occupancy_groups``);
- ``idle``: ``trainer_idle_ratio``;
- ``stale`` / ``cancelled`` / ``deadline``: discards of that reason over the requests that
  reached an outcome (accepted + counted discards: ``freshroll bench``'s long-tail table,
  :func:`freshroll.bench.tails.tail_row`);
- ``refreshed``: attempts re-issued by ``tail.refresh`` over every attempt started
  (``summary.json``'s ``refreshed.share``), and ``refresh-s`` the worker-seconds they cost
  (``worker-s`` times their share of the tokens generated, ``refreshed.token_share``:
  :func:`freshroll.bench.tails.tail_row`);
- ``length bias``: ``sample_bias.length_bias``;
- ``worker-s``: :func:`freshroll.bench.figures.worker_seconds` (simulated seconds);
- ``verify``: the CLI's exit status (0: finished and verified).

With several seeds each cell is the mean ± the sample sd over them. The 1-minute load average
is printed before the first run and, per row, its mean after each run.

Usage::

    .venv/bin/python benchmarks/p2_frontier.py                      # 40 steps, seed 0
    .venv/bin/python benchmarks/p2_frontier.py --seeds 0 1 2
    .venv/bin/python benchmarks/p2_frontier.py --quick              # 2 steps: a smoke run
    .venv/bin/python benchmarks/p2_frontier.py --etas 1 2 --systems wide-continue-newest wide-all
    .venv/bin/python benchmarks/p2_frontier.py --config configs/sim-p3.yaml --etas 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cli_runs import ROOT, mean_sd, num, run_cli
from freshroll.bench.figures import worker_events, worker_seconds
from freshroll.bench.tails import tail_row

CONFIG = ROOT / "configs" / "sim-p2.yaml"
STATIC = ["control.mode=static", "rollout.workers=32"]
NEWEST = ["rollout.on_update=continue", "run.staleness_basis=newest_token"]
#: system -> its overrides on top of the config
SYSTEMS: dict[str, list[str]] = {
    "static": STATIC,
    "continue-newest": [*STATIC, *NEWEST],
    "overprov": [*STATIC, "tail.overprovision=4"],
    "deadlines": [*STATIC, "tail.deadline=true"],
    "doomed": [*STATIC, "tail.drop_doomed=true"],
    "all": ["control.mode=adaptive", "control.max_workers=32", "tail.overprovision=auto",
            *NEWEST],
    "all-doomed": ["control.mode=adaptive", "control.max_workers=32", "tail.overprovision=auto",
                   *NEWEST, "tail.drop_doomed=true"],
    "refresh": [*STATIC, *NEWEST, "tail.refresh=true"],
    "all-refresh": ["control.mode=adaptive", "control.max_workers=32",
                    "tail.overprovision=auto", *NEWEST, "tail.refresh=true"],
}
PACE = ["run.staleness_policy=pace"]
for _name in ("static", "deadlines", "all"):
    SYSTEMS[f"pace-{_name}"] = [*SYSTEMS[_name], *PACE]
#: the wide rows' admission window, in freshness windows (η + 1 trainer steps each)
WIDE = 3
for _name in ("static", "continue-newest", "all", "all-doomed", "refresh", "all-refresh"):
    SYSTEMS[f"wide-{_name}"] = [*SYSTEMS[_name], "run.admission_window={wide}"]
ETAS = (1, 2, 4)
COMMON = ["run.progress=false", "sim.clock=virtual"]
#: P2's trainer capacity in isolation (samples/s, B = 512: docs/bench.md)
C_TRAIN = 23.1
COLUMNS = ("η", "system", "seeds", "accepted/s", "E (own)", "E (c_train)", "window bound",
           "L (s)", "held by discards", "idle", "stale", "cancelled", "deadline",
           "refreshed", "refresh-s", "length bias", "worker-s", "load", "verify")


@dataclass
class Run:
    """One run's figures (read from its run directory)."""

    eta: int
    system: str
    seed: int
    ok: bool
    accepted_per_s: float
    e_own: float
    e_train: float
    bound: float
    latency_s: float
    held_discarded: float
    idle: float
    stale: float
    cancelled: float
    deadline: float
    length_bias: float
    worker_s: float
    load: float = math.nan
    refreshed: float = 0.0
    refresh_s: float = 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def read_run(eta: int, system: str, seed: int, out: Path, ok: bool, load: float,
             c_train: float = C_TRAIN) -> Run:
    """The figures of the finished run in ``out`` (module docstring)."""
    s = json.loads((out / "summary.json").read_text())
    w = s.get("window_bound") or {}
    tails = tail_row(out, system, [])
    group = _group_size(out)
    per_s = num(s.get("accepted_rollouts_per_s"))
    return Run(
        eta, system, seed, ok, per_s,
        _ratio(per_s, num(w.get("trainer_groups_per_s")) * group), _ratio(per_s, c_train),
        num(w.get("bound")), num(w.get("latency_s")),
        _ratio(num(w.get("occupancy_discarded")), num(w.get("occupancy_groups"))),
        num(s.get("trainer_idle_ratio")), tails["stale"], tails["cancelled"],
        tails["deadline"], num(tails["length_bias"]),
        worker_seconds(worker_events(out)), load, tails["refreshed"],
        tails["refreshed_worker_s"])


def _group_size(out: Path) -> int:
    """``rollout.group_size`` of the run (its saved config.yaml)."""
    from freshroll.config import load_config

    return load_config(out / "config.yaml").rollout.group_size


def overrides(eta: int, system: str) -> list[str]:
    """The system's overrides at ``η`` (the wide rows' window: ``WIDE × (η + 1)``)."""
    return [o.format(wide=WIDE * (eta + 1)) for o in SYSTEMS[system]]


def run_one(eta: int, system: str, seed: int, steps: int, out: Path, extra: Sequence[str],
            c_train: float = C_TRAIN, config: Path = CONFIG) -> Run:
    """One run in a fresh process (the CLI), then its figures."""
    ok, load = run_cli(["simulate", str(config), "--out", str(out), f"run.steps={steps}",
                        f"run.seed={seed}", f"run.max_staleness={eta}", *COMMON,
                        *overrides(eta, system), *extra], f"η {eta} {system} seed {seed}")
    return read_run(eta, system, seed, out, ok, load, c_train)


def render_table(runs: Sequence[Run]) -> str:
    """One row per (η, system), in :data:`ETAS` and :data:`SYSTEMS` order, over its seeds."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for eta in sorted({r.eta for r in runs}):
        for system in SYSTEMS:
            rs = [r for r in runs if r.system == system and r.eta == eta]
            if not rs:
                continue
            cells = [
                str(eta), system, str(len(rs)),
                mean_sd([r.accepted_per_s for r in rs], ".1f"),
                mean_sd([r.e_own for r in rs], ".2f"),
                mean_sd([r.e_train for r in rs], ".2f"),
                mean_sd([r.bound for r in rs], ".2f"),
                mean_sd([r.latency_s for r in rs], ".0f"),
                mean_sd([r.held_discarded for r in rs], ".0f", 100, "%"),
                *(mean_sd([getattr(r, k) for r in rs], ".1f", 100, "%")
                  for k in ("idle", "stale", "cancelled", "deadline", "refreshed")),
                mean_sd([r.refresh_s for r in rs], ".0f"),
                mean_sd([r.length_bias for r in rs], "+.3f"),
                mean_sd([r.worker_s for r in rs], ".0f"),
                mean_sd([r.load for r in rs], ".2f"),
                "ok" if all(r.ok for r in rs) else f"FAIL {sum(not r.ok for r in rs)}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="more config overrides (key=value), all runs")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default 40; "
                    "--quick: 2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--etas", type=int, nargs="+", default=list(ETAS))
    ap.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--c-train", type=float, default=C_TRAIN,
                    help=f"the trainer's capacity in isolation, samples/s (default {C_TRAIN})")
    ap.add_argument("--config", type=Path, default=CONFIG,
                    help="the workload (default configs/sim-p2.yaml; e.g. sim-p3.yaml)")
    ap.add_argument("--quick", action="store_true", help="2 steps: a smoke run")
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: temp)")
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else 2 if args.quick else 40
    work = args.work or Path(tempfile.mkdtemp(prefix="p2-frontier-"))
    before = os.getloadavg()
    t0 = time.perf_counter()
    runs = [run_one(eta, system, seed, steps, work / f"eta{eta}-{system}-s{seed}",
                    args.overrides, args.c_train, args.config)
            for seed in args.seeds for eta in args.etas for system in args.systems]
    print(f"## Frontier ({args.config.name}, virtual clock): {steps} steps, seeds "
          f"{' '.join(map(str, args.seeds))}{' (quick)' if args.quick else ''}")
    print(f"overrides: {' '.join([*COMMON, *args.overrides])}; c_train {args.c_train}/s; "
          f"load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}; "
          f"wall {time.perf_counter() - t0:.0f} s\n")
    print(render_table(runs))
    print(f"\nrun directories: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Long-tail handling on a simulated workload: the same run with and without group deadlines.

Runs ``freshroll simulate``'s recipe (:func:`freshroll.runtime.run.run`, the real pipeline
on the config's simulated cluster, in virtual time) once with ``tail.deadline: false`` and
once with ``true``, same config and seed, in one invocation, each run verified; then prints
the figures of both side by side (every figure from the run's ``summary.json``, i.e.
:mod:`freshroll.figures.metrics`): trainer idle ratio, accepted rollouts per simulated second, lag
p50/p99/max, discard rate and discards by reason; and from the ledger, the age of each
committed sample at its commit (seconds from its start), freshness in time rather than in
policy versions. Virtual time: the figures do not depend
on the machine's load (only the wall seconds do).

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/tail_deadlines.py configs/sim-p3.yaml run.steps=60
    PYTHONPATH=src .venv/bin/python benchmarks/tail_deadlines.py configs/sim-p2.yaml \\
        run.steps=60 --arm tail.deadline_factor=2
"""

from __future__ import annotations

import argparse
import io
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from freshroll.config import load_config
from freshroll.runtime.run import run


def one(config: Path, overrides: list[str], out: Path) -> dict[str, Any]:
    cfg = load_config(config, [*overrides, "rollout.engine=sim", "sim.clock=virtual",
                               "run.progress=false"])
    t0 = time.perf_counter()
    result = run(cfg, out, stream=io.StringIO())
    s = dict(result.summary)
    s["verify"] = "ok" if result.ok else "FAILED"
    s["age"] = ages(out / "ledger.sqlite")
    s["wall"] = time.perf_counter() - t0
    return s


def ages(path: Path) -> list[float]:
    """Seconds (of the run's clock) from each committed sample's start to its commit."""
    started: dict[str, float] = {}
    out: list[float] = []
    db = sqlite3.connect(path)
    try:
        query = "SELECT kind, body FROM events WHERE kind IN ('started', 'committed') ORDER BY seq"
        for kind, body in db.execute(query):
            e = json.loads(body)
            if kind == "started":
                started[e["sample"]] = e["ts"]
            else:
                out.extend(e["ts"] - started[s] for s in e["samples"])
    finally:
        db.close()
    return sorted(out)


def fmt_age(s: dict[str, Any]) -> str:
    a = s["age"]
    if not a:
        return "-"
    return f"{statistics.median(a):.0f}/{a[int(0.99 * (len(a) - 1))]:.0f}/{a[-1]:.0f}"


def fmt_discards(s: dict[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(s["discards"].items())) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("overrides", nargs="*", help="key=value for both runs")
    ap.add_argument("--arm", action="append", default=[],
                    help="key=value for the deadline run only (e.g. tail.deadline_factor=2)")
    args = ap.parse_args()
    arms = {"no handling": ["tail.deadline=false"],
            "deadlines": ["tail.deadline=true", *args.arm]}
    with tempfile.TemporaryDirectory() as tmp:
        res = {name: one(args.config, [*args.overrides, *extra], Path(tmp) / str(i))
               for i, (name, extra) in enumerate(arms.items())}
    rows = [
        ("verify", lambda s: s["verify"]),
        ("steps", lambda s: str(s["steps"])),
        ("simulated s", lambda s: f"{s['wall_s']:.1f}"),
        ("trainer idle ratio", lambda s: f"{s['trainer_idle_ratio']:.1%}"),
        ("accepted rollouts/s", lambda s: f"{s['accepted_rollouts_per_s']:.2f}"),
        ("generated rollouts/s", lambda s: f"{s['generated_rollouts_per_s']:.2f}"),
        ("lag p50/p99/max", lambda s: f"{s['lag']['p50']:g}/{s['lag']['p99']:g}/{s['lag']['max']}"),
        ("lag mean", lambda s: f"{s['lag']['mean']:.3f}"),
        ("lag histogram", lambda s: " ".join(f"{k}:{v}" for k, v in s["lag"]["histogram"].items())),
        ("age at commit p50/p99/max (s)", fmt_age),
        ("discard rate", lambda s: f"{s['discard_rate']:.1%}"),
        ("discards", fmt_discards),
        ("wall s (noisy)", lambda s: f"{s['wall']:.1f}"),
    ]
    names = list(res)
    seed = load_config(args.config, args.overrides).run.seed
    arm = f", deadline run: {' '.join(args.arm)}" if args.arm else ""
    print(f"{args.config} {' '.join(args.overrides)}  (seed {seed}{arm})")
    print(f"| figure | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(names)}")
    for label, get in rows:
        print(f"| {label} | {' | '.join(get(res[n]) for n in names)} |")


if __name__ == "__main__":
    main()

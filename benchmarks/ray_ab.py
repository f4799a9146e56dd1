"""``run.runtime: ray`` against the default, back to back: the Ray placement's gap, A/B.

Alternates, round after round (the order reversed every other round), fresh-process runs
(``async_sweep.py --one``: the sweep's own config and shape) of ``async-auto`` (the default
placement), ``async-ray``, ``async-ray-driver`` and ``async-ray-actor`` (``ray.trainer:
driver`` / ``actor``), and, with
``--ray-env KEY=VALUE ...``, ``async-ray`` with those variables in its environment as a
further variant ``ray-env`` (the private instance takes a caller's Ray variables as they
are: how Ray's own settings are tried without a code change). Prints each run's rollouts/s
with the load average before it and its fixed costs (``summary.json``: seconds outside the
measured wall, Ray's own start and stop among them; the mean weight transfer per version),
then the medians per variant with their ratio to ``async-auto``.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/ray_ab.py --steps 200 --rounds 2
    PYTHONPATH=src .venv/bin/python benchmarks/ray_ab.py --variants async-ray ray-env \
        --ray-env RAY_task_events_report_interval_ms=0 RAY_enable_metrics_collection=0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import async_sweep  # noqa: E402

#: name -> (async_sweep system, extra environment); ``ray-env``'s is ``--ray-env``
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "async-auto": ("async-auto", {}),
    "async-ray": ("async-ray", {}),
    "async-ray-driver": ("async-ray-driver", {}),
    "async-ray-actor": ("async-ray-actor", {}),
    "ray-env": ("async-ray", {}),
}


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def run_one(name: str, steps: int, seed: int, model_dir: Path, work: Path,
            overrides: list[str]) -> tuple[float, str, str]:
    system, extra = VARIANTS[name]
    out = work / f"{name}-{seed}"
    result = work / f"{name}-{seed}.result.json"
    result.unlink(missing_ok=True)
    job = {"system": system, "steps": steps, "seed": seed, "model_dir": str(model_dir),
           "overrides": overrides, "out": str(out), "threads": "auto",
           "result": str(result)}
    env = {**os.environ, **extra}
    load = loadavg()
    proc = subprocess.run([sys.executable, str(HERE / "async_sweep.py"), "--one",
                           json.dumps(job)], env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(result.read_text())
    return float(res["rollouts_per_s"]), load, costs(out, res)


def costs(out: Path, res: dict[str, Any]) -> str:
    """The run's seconds outside the measured wall (Ray's start and stop among them), its mean
    weight transfer per version (``summary.json``'s ``fixed_costs``, the Result's extra)."""
    try:
        fixed = json.loads((out / "summary.json").read_text()).get("fixed_costs", {})
    except (OSError, ValueError):
        fixed = {}
    parts = [f"{k} {v:.2f}" for k, v in sorted(fixed.items()) if isinstance(v, int | float)]
    transfer = res.get("extra", {}).get("weight_transfer_s_mean")
    if isinstance(transfer, int | float):
        parts.append(f"transfer {transfer * 1e3:.1f} ms/version")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1m", choices=sorted(async_sweep.SIZES))
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["async-auto", "async-ray"],
                    choices=list(VARIANTS))
    ap.add_argument("--ray-env", nargs="+", default=[], metavar="KEY=VALUE",
                    help="the ray-env variant's extra environment")
    args = ap.parse_args(argv)
    for item in args.ray_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--ray-env {item!r}: expected KEY=VALUE")
        VARIANTS["ray-env"][1][key] = value
    rates: dict[str, list[float]] = {v: [] for v in args.variants}
    with tempfile.TemporaryDirectory(prefix="ray-ab-") as tmp:
        work = Path(tmp)
        model_dir = async_sweep.build_model(work, args.size)
        overrides = [f"rollout.max_new_tokens={args.length}"]
        for rnd in range(args.rounds):
            order = args.variants if rnd % 2 == 0 else list(reversed(args.variants))
            for name in order:
                rate, load, cost = run_one(name, args.steps, 0, model_dir, work, overrides)
                rates[name].append(rate)
                print(f"round {rnd} {name:<13} {rate:8.1f} rollouts/s  load before {load}",
                      flush=True)
                if cost:
                    print(f"    {cost}", flush=True)
    base = statistics.median(rates["async-auto"]) if rates.get("async-auto") else None
    for name, rs in rates.items():
        med = statistics.median(rs)
        ratio = f"  {med / base:.2f}x async-auto" if base else ""
        print(f"{name:<13} median {med:8.1f} rollouts/s over {len(rs)}{ratio}")
    print(f"load average at the end {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

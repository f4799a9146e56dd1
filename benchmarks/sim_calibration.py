"""Calibration of the simulated workload profiles P1, P2, P3 (docs/simulation.md).

Draws each profile with :func:`freshroll.sim.calibrate.calibrate` (seeded) at
policy step 0, and P2/P3 also at the end of their length drift, and prints the
Markdown table that docs/simulation.md quotes (tests/sim/test_calibration.py
checks that the doc still matches). It also times the continuous-batching
simulation on one core (simulated requests per wall second).

Usage::

    .venv/bin/python benchmarks/sim_calibration.py                 # the documented table
    .venv/bin/python benchmarks/sim_calibration.py --samples 65536 --seed 3
    .venv/bin/python benchmarks/sim_calibration.py --engine P1 P2 P3    # + the engine alone
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import numpy as np

from freshroll.clock import VirtualClock
from freshroll.engines.base import Completion
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.sim import PROFILES, simulate_batch
from freshroll.sim.calibrate import Calibration, calibrate, markdown_table
from freshroll.sim.draws import completion_lengths, prompt_lengths
from freshroll.sim.engine import SimEngine
from freshroll.sim.keyed import KeyedDraws

SAMPLES = 8192
SEED = 0


def documented(
    samples: int = SAMPLES, seed: int = SEED, measure: Callable[..., Calibration] = calibrate
) -> list[Calibration]:
    """The rows of the documented table: each profile at step 0, drifting ones at drift end."""
    rows = []
    for profile in PROFILES.values():
        rows.append(measure(profile, samples=samples, seed=seed))
        if profile.lengths.drift:
            rows.append(measure(
                profile, samples=samples, seed=seed, step=profile.lengths.drift_steps
            ))
    return rows


def batching_rate(requests: int = 50_000, seed: int = SEED) -> float:
    """Simulated requests per wall second: P2 lengths, Poisson arrivals at ~90% load."""
    p = PROFILES["P2"]
    rng = np.random.default_rng(seed)
    lengths = completion_lengths(rng, p.lengths, requests // 8, 8).ravel()
    prompts = np.repeat(prompt_lengths(rng, p.lengths, requests // 8), 8)
    s = p.server
    # capacity with every slot busy: max_concurrent / (mean length x step time at full batch)
    per_request = float(lengths.mean()) * (s.step_s + s.step_s_per_seq * s.max_concurrent)
    rate = 0.9 * s.max_concurrent / per_request
    arrivals = np.cumsum(rng.exponential(1.0 / rate, len(lengths)))
    t = time.perf_counter()
    simulate_batch(s, arrivals, prompts, lengths)
    return len(lengths) / (time.perf_counter() - t)


def engine_rate(
    profile: str = "P2", workers: int = 256, samples: int = 262_144, lanes: int = 16,
    group: int = 8, seed: int = SEED,
) -> tuple[int, float, float, float]:
    """The simulated engine alone in virtual time: ``workers`` SimEngines, each kept busy by
    ``lanes`` callers that generate one group of ``group`` after another (``lanes x group``
    in flight per engine). Returns ``(samples, wall seconds, CPU seconds, simulated seconds)``
    (CPU seconds of this process: less sensitive than wall time to a busy machine)."""
    draws = KeyedDraws(PROFILES[profile], seed)
    clock = VirtualClock()
    params = SamplingParams(max_new_tokens=1)
    per_lane = max(1, samples // (workers * lanes * group))
    emitted = 0

    def emit(i: int, c: Completion) -> None:
        nonlocal emitted
        emitted += 1

    async def lane(engine: SimEngine, name: str) -> None:
        for k in range(per_lane):
            g = f"g{name}x{k}"
            requests = [GenRequest(f"{g}.{m}#0", g, g, "", 0) for m in range(group)]
            await engine.generate(requests, params, 0, emit)

    async def run() -> None:
        engines = [SimEngine(f"w{w}", draws) for w in range(workers)]
        async with asyncio.TaskGroup() as tg:
            for w, engine in enumerate(engines):
                for j in range(lanes):
                    tg.create_task(lane(engine, f"{w}_{j}"))

    t, cpu = time.perf_counter(), time.process_time()
    clock.run(run())
    return emitted, time.perf_counter() - t, time.process_time() - cpu, clock.now()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--engine", nargs="*", default=None, metavar="PROFILE",
                    help="also time the simulated engine alone (e.g. --engine P1 P2 P3)")
    ap.add_argument("--engine-samples", type=int, default=262_144)
    args = ap.parse_args()
    print(f"calibration: {args.samples} samples per row (groups of 8), seed {args.seed}\n")
    print(markdown_table(documented(args.samples, args.seed)))
    print(f"\ncontinuous batching, one core: {batching_rate(seed=args.seed):,.0f} "
          "simulated requests per wall second (P2, 256 slots, ~90% load)")
    if args.engine:
        print("\nthe simulated engine alone, virtual time, 256 engines x 128 in flight:")
        for name in args.engine:
            n, wall, cpu, simulated = engine_rate(
                name, samples=args.engine_samples, seed=args.seed
            )
            print(f"  {name}: {n:,} samples in {wall:.1f} s wall ({cpu:.1f} s CPU): "
                  f"{n / wall:,.0f} samples per wall second, {n / cpu:,.0f} per CPU second "
                  f"({simulated:,.0f} simulated seconds)")


if __name__ == "__main__":
    main()

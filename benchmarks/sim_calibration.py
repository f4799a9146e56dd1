"""Calibration of the simulated workload profiles P1, P2, P3 (docs/simulation.md).

Draws each profile with :func:`freshroll.sim.calibrate.calibrate` (seeded) at
policy step 0, and P2/P3 also at the end of their length drift, and prints the
Markdown table that docs/simulation.md quotes (tests/sim/test_calibration.py
checks that the doc still matches). It also times the continuous-batching
simulation on one core (simulated requests per wall second).

Usage::

    .venv/bin/python benchmarks/sim_calibration.py                 # the documented table
    .venv/bin/python benchmarks/sim_calibration.py --samples 65536 --seed 3
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from freshroll.sim import PROFILES, simulate_batch
from freshroll.sim.calibrate import Calibration, calibrate, markdown_table
from freshroll.sim.draws import completion_lengths, prompt_lengths

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    print(f"calibration: {args.samples} samples per row (groups of 8), seed {args.seed}\n")
    print(markdown_table(documented(args.samples, args.seed)))
    print(f"\ncontinuous batching, one core: {batching_rate(seed=args.seed):,.0f} "
          "simulated requests per wall second (P2, 256 slots, ~90% load)")


if __name__ == "__main__":
    main()

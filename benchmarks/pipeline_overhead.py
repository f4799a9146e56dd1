"""Per-sample overhead of the orchestrator: the real Pipeline in virtual time, async fakes.

Runs the real :class:`~freshroll.pipeline.pipeline.Pipeline` (worker pool, continuous
batching, reward stage, trainer, steering task) on a real durable ledger (``sync="full"``,
one fsync'd transaction per trainer commit) under a :class:`~freshroll.clock.VirtualClock`,
with fully-async fake engines, scorer and trainer (they only ``asyncio.sleep``), so what is
measured is the orchestrator plus the kernel. Side by side, interleaved round by round (a
shared machine's noise hits both alike), the kernel alone on the same workload
(``benchmarks/kernel_throughput.py``'s lean driver): the ratio is the orchestrator's cost.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/pipeline_overhead.py            # ~1 min
    PYTHONPATH=src .venv/bin/python benchmarks/pipeline_overhead.py --samples 20000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from freshroll.clock import VirtualClock
from freshroll.config import load_config
from freshroll.engines.base import Completion
from freshroll.engines.seams import Emit, GenRequest, SamplingParams
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion, RewardVersion
from freshroll.ledger.store import open_ledger
from freshroll.pipeline.pipeline import Pipeline
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import make_prompts
from kernel_throughput import Workload, drive
from kernel_throughput import open_buffer as kernel_buffer

REWARD = str(RewardVersion.of("bench", config={}))


class Engine:
    """Continuous: each request finishes ``(1 + k % 7) x 0.1`` s after the call starts
    (``instant``: all at once, without sleeping: the orchestrator alone is measured)."""

    continuous = True
    instant = False

    async def generate(self, requests: Sequence[GenRequest], params: SamplingParams, seed: int,
                       emit: Emit) -> None:
        if self.instant:
            await asyncio.sleep(0)
            for i in range(len(requests)):
                emit(i, Completion((), (), (), "", "length", 0.0, n_tokens=256))
            return
        t = 0.0
        lats = [(1 + zlib.crc32(r.sample.encode()) % 7) * 0.1 for r in requests]
        for lat, i in sorted((lat, i) for i, lat in enumerate(lats)):
            await asyncio.sleep(lat - t)
            t = lat
            emit(i, Completion((), (), (), "", "length", lat, n_tokens=256))

    async def load_weights(self, weights: Any) -> float:
        return 0.0

    async def cancel(self, samples: Sequence[str]) -> None:
        pass

    async def close(self) -> None:
        pass


async def factory(name: str) -> Engine:
    return Engine()


class Scorer:
    version = REWARD
    names = ("bench",)

    async def score(self, prompts: Any, completions: Sequence[Completion], state: Any) -> Any:
        await asyncio.sleep(0.01)
        return [Score(0.5, None, {})] * len(completions)


class Trainer:
    settings_digest = "bench-settings"

    def __init__(self) -> None:
        self.n = 0

    async def step(self, lease: Any) -> tuple[dict[str, float], str]:
        self.n += 1
        await asyncio.sleep(0.05)
        return {"train_s": 0.05}, f"{self.n:032x}"

    async def before_commit(self, version: PolicyVersion) -> None:
        pass

    def weights(self) -> Any:
        return self.n


def pipeline_run(w: Workload, steps: int, root: Path, concurrency: int) -> tuple[int, float]:
    cfg = load_config(None, [
        "run.progress=false", f"run.steps={steps}", f"run.max_staleness={w.max_staleness}",
        f"rollout.group_size={w.group_size}", f"rollout.batch_groups={w.batch_groups}",
        f"rollout.workers={w.workers}", f"rollout.worker_batch={concurrency}",
        "task.n_prompts=1024", "control.interval_s=5",
    ])
    clock = VirtualClock()
    buf = SampleBuffer.open(
        open_ledger(root), KernelConfig(w.max_staleness, w.batch_groups, w.group_size), clock,
        run_id="bench", initial_version=PolicyVersion.initial("bench-model"),
    )
    prompts = make_prompts("reverse", 1024, 0, min_len=3, max_len=3)
    pipe = Pipeline(buf, factory, Scorer(), Trainer(), {p.prompt_id: p for p in prompts},
                    [p.prompt_id for p in prompts], cfg)
    t0 = time.perf_counter()
    clock.run(pipe.run())
    buf.shutdown("done")
    wall = time.perf_counter() - t0
    n = buf.counts["committed"]
    buf.ledger.close()
    return n, wall


def kernel_run(w: Workload, steps: int, root: Path) -> tuple[int, float]:
    buf = kernel_buffer(root, w)
    t0 = time.perf_counter()
    drive(buf, w, steps)
    buf.shutdown("done")
    wall = time.perf_counter() - t0
    n = buf.counts["committed"]
    buf.ledger.close()
    return n, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100_000, help="committed samples per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--engine", choices=("sleep", "instant"), default="sleep",
                    help="instant: the fake engine emits at once (the orchestrator alone)")
    args = ap.parse_args(argv)
    Engine.instant = args.engine == "instant"
    w = Workload(group_size=16, batch_groups=32, max_staleness=2, workers=args.workers,
                 payload_bytes=0)
    steps = max(1, args.samples // w.samples_per_step)
    totals = {"pipeline": [0, 0.0], "kernel": [0, 0.0]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("pipeline", "kernel"):
                root = Path(tmp) / f"{mode}{r}"
                root.mkdir()
                n, wall = (pipeline_run(w, steps, root, args.concurrency) if mode == "pipeline"
                           else kernel_run(w, steps, root))
                totals[mode][0] += n
                totals[mode][1] += wall
                print(f"round {r} {mode:8s} {n:>8} samples {wall:6.2f} s "
                      f"{n / wall:>9,.0f} samples/s", flush=True)
    rate = {m: t[0] / t[1] for m, t in totals.items()}
    us = {m: 1e6 / r for m, r in rate.items()}
    print(f"pipeline {rate['pipeline']:,.0f} samples/s ({us['pipeline']:.1f} us/sample); "
          f"kernel alone {rate['kernel']:,.0f} samples/s ({us['kernel']:.1f} us/sample); "
          f"orchestrator overhead {us['pipeline'] - us['kernel']:.1f} us/sample "
          f"(ratio {rate['pipeline'] / rate['kernel']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

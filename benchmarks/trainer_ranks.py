"""trainer.parallel: ddp on this machine (issue 50): step time and equivalence, world size
1 against 2, on the same batches.

The learner of a run (``runtime.learner.new_learner`` on a locally built tiny Llama, the
smoke config's shape unless ``--hidden`` / ``--layers`` say otherwise), one intra-op thread
per rank, gloo on CPU. Each world size trains the same ``--steps`` batches of ``--rows``
off-policy samples; the first ``--warmup`` steps are not timed. Printed: the median and
mean step time per world size, the publication time (rank 0's ``weights()``, the copy every
placement's WeightTransfer starts from), and the largest difference of the committed
weights and of the last step's gradients between the two.

    PYTHONPATH=src .venv/bin/python benchmarks/trainer_ranks.py --steps 12 --rows 16

The machine is shared: the load average is printed beside the figures (``uptime``'s).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from freshroll.config import load_config
from freshroll.engines.tiny import save_tiny
from freshroll.runtime.learner import new_learner
from freshroll.runtime.trainer_group import start_group
from freshroll.trainer.grpo import TrainSample


def batches(steps: int, rows: int, seed: int = 7) -> list[list[TrainSample]]:
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        batch = []
        for i in range(rows):
            prompt = [rng.randrange(4, 30) for _ in range(rng.randint(4, 10))]
            comp = [rng.randrange(4, 30) for _ in range(rng.randint(3, 12))]
            batch.append(TrainSample(prompt, comp, [rng.uniform(-4.0, -2.0) for _ in comp],
                                     rng.uniform(0, 1), i // 4, i % 2))
        out.append(batch)
    return out


def train(model: Path, world: int, data: list[list[TrainSample]], warmup: int,
          accum: int) -> dict[str, Any]:
    cfg = load_config(None, [f"trainer.world_size={world}", f"trainer.grad_accum={accum}",
                             f"trainer.parallel={'ddp' if world > 1 else 'none'}"])
    learner, _ = new_learner(cfg, model)
    group = start_group(cfg, model, learner, new_learner)
    times, publish = [], []
    try:
        for i, b in enumerate(data):
            t0 = time.perf_counter()
            learner.step(b)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                learner.weights()
                publish.append(time.perf_counter() - t1)
        grads = {n: p.grad.clone() for n, p in learner.model.named_parameters()
                 if p.grad is not None}
        state = {k: v.clone() for k, v in learner.model.state_dict().items()}
    finally:
        if group is not None:
            group.close()
    return {"times": times, "publish": publish, "grads": grads, "state": state}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    shape = {k: v for k, v in (("hidden_size", a.hidden), ("intermediate_size",
             a.hidden and 2 * a.hidden), ("num_hidden_layers", a.layers)) if v}
    model = save_tiny(Path(tempfile.mkdtemp()) / "model", seed=3, **shape)
    n_params = sum(t.numel() for t in new_learner(load_config(None), model)[0].weights().values())
    data = batches(a.steps, a.rows)
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()}); "
          f"model {n_params / 1e6:.3f}M parameters, {a.rows} rows a step, "
          f"grad_accum {a.accum}, {a.steps - a.warmup} timed steps")
    runs = {w: train(model, w, data, a.warmup, a.accum) for w in (1, 2)}
    for w, r in runs.items():
        print(f"world size {w}: step median {statistics.median(r['times']) * 1e3:.1f} ms, "
              f"mean {statistics.fmean(r['times']) * 1e3:.1f} ms; publication (weights()) "
              f"median {statistics.median(r['publish']) * 1e3:.2f} ms")
    one, two = runs[1], runs[2]
    dw = max(float((one["state"][k] - two["state"][k]).abs().max()) for k in one["state"])
    dg = max(float((one["grads"][k] - two["grads"][k]).abs().max()) for k in one["grads"])
    print(f"after {a.steps} steps: committed weights max |diff| {dw:.3g}, last step's "
          f"gradient max |diff| {dg:.3g}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

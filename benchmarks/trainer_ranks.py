"""trainer.parallel on this machine (issue 50): step time and equivalence, none at world
size 1 against ddp and fsdp at world size 2, on the same batches.

The learner of a run (``runtime.learner.new_learner`` on a locally built tiny Llama, the
smoke config's shape unless ``--hidden`` / ``--layers`` say otherwise), one intra-op thread
per rank, gloo on CPU. Each mode trains the same ``--steps`` batches of ``--rows``
off-policy samples; the first ``--warmup`` steps are not timed. Printed per mode: the median
and mean step wall time, the CPU seconds a step of every rank together (rank 0's process
time and the other ranks' ``/proc`` utime + stime), the full state's gather (fsdp's
``gather_s``, once a version), the publication time (rank 0's ``weights()``, the copy every
placement's WeightTransfer starts from), and the largest difference of the committed
weights from world size 1. (``ddp`` and ``fsdp`` at world size 1 are ``none``'s path:
``start_group`` starts no group and the learner trains alone.)

    PYTHONPATH=src .venv/bin/python benchmarks/trainer_ranks.py --steps 12 --rows 16
    PYTHONPATH=src .venv/bin/python benchmarks/trainer_ranks.py --modes none,fsdp

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


def cpu_s(pids: list[int]) -> float:
    """This process's CPU seconds and those of ``pids`` (utime + stime from /proc)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def train(model: Path, mode: str, data: list[list[TrainSample]], warmup: int,
          accum: int) -> dict[str, Any]:
    world = 1 if mode == "none" else 2
    cfg = load_config(None, [f"trainer.world_size={world}", f"trainer.grad_accum={accum}",
                             f"trainer.parallel={mode}"])
    learner, _ = new_learner(cfg, model)
    group = start_group(cfg, model, learner, new_learner)
    pids = [p.pid for p in group.procs] if group is not None else []
    times, publish, gathers, cpu = [], [], [], 0.0
    try:
        for i, b in enumerate(data):
            c0, t0 = cpu_s(pids), time.perf_counter()
            metrics = learner.step(b)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                cpu += cpu_s(pids) - c0
                gathers.append(metrics.get("gather_s", 0.0))
                t1 = time.perf_counter()
                learner.weights()
                publish.append(time.perf_counter() - t1)
        state = {k: v.clone() for k, v in learner.model.state_dict().items()}
    finally:
        if group is not None:
            group.close()
    return {"times": times, "publish": publish, "gathers": gathers, "state": state,
            "cpu_per_step": cpu / max(1, len(times))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--modes", default="none,ddp,fsdp", help="none is world size 1, else 2")
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
    runs = {m: train(model, m, data, a.warmup, a.accum) for m in a.modes.split(",")}
    for m, r in runs.items():
        diff = ""
        if "none" in runs and m != "none":
            one = runs["none"]["state"]
            dw = max(float((one[k] - r["state"][k]).abs().max()) for k in one)
            diff = f"; weights max |diff| from world size 1 after {a.steps} steps {dw:.3g}"
        print(f"{m} world size {1 if m == 'none' else 2}: step median "
              f"{statistics.median(r['times']) * 1e3:.1f} ms, mean "
              f"{statistics.fmean(r['times']) * 1e3:.1f} ms, CPU {r['cpu_per_step']:.3f} s a "
              f"step (all ranks); gather median {statistics.median(r['gathers']) * 1e3:.1f} ms; "
              f"publication (weights()) median {statistics.median(r['publish']) * 1e3:.2f} ms"
              f"{diff}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

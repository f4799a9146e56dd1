"""Weights per version under ``run.runtime: ray``: one ObjectRef for all workers vs a dict each.

Two inference actors on a ~5M-parameter tiny shape (hidden 256, intermediate 1024, 4 layers).
Per version, ``before`` hands each worker the state dict itself (the driver serialises it once
per worker, as before issue 9); ``after`` puts it in the object store once (``ray_publish``:
``ray.put`` on the trainer thread) and hands every worker the same ref, which each actor
fetches itself. Reported: the driver's seconds per version (put + the loads, workers one
after the other as the pool's lanes are), the caller-side seconds per worker load (what
``weights_loaded.transfer_s`` records) and the actors' own fetch / copy seconds. Also: the
start-up cost of a private Ray instance vs joining a running one (``--join``: starts one
with ``ray start --head`` on a free port and stops it afterwards).

    PYTHONPATH=src python benchmarks/ray_weights.py [--versions 5] [--join]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

SHAPE = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--join", action="store_true")
    args = ap.parse_args()
    from freshroll.engines.tiny import save_tiny
    from freshroll.placement import ray_engine as re

    tmp = Path(tempfile.mkdtemp())
    path = save_tiny(tmp / "tiny", seed=0, **SHAPE)
    out: dict[str, Any] = {"shape": SHAPE}
    out["private_start_s"] = re.start_ray(num_cpus=3)
    try:
        t0 = time.perf_counter()
        workers = [re.RayEngine(path) for _ in range(2)]
        for w in workers:
            w.wait_ready()
        out["private_two_actors_s"] = time.perf_counter() - t0
        state = workers[0].state_dict()
        out["params"] = sum(t.numel() for t in state.values())
        out["mbytes"] = sum(t.numel() * t.element_size() for t in state.values()) / 1e6

        class _Learner:
            def weights(self) -> dict[str, torch.Tensor]:
                return {k: v.clone() for k, v in state.items()}

        pool = ThreadPoolExecutor(2)
        for mode in ("before", "after", "before", "after"):  # interleaved: load drifts
            per_version = []
            for _ in range(args.versions):
                for v in state.values():
                    v.add_(1e-4)
                t0 = time.perf_counter()
                handle = re.ray_publish(_Learner()) if mode == "after" else _Learner().weights()
                list(pool.map(lambda w, h=handle: w.load_weights(h), workers))  # two lanes
                per_version.append(time.perf_counter() - t0)
            rec = out.setdefault(mode, {"version_s": [], "caller_s": [], "fetch_s": [],
                                        "copy_s": []})
            rec["version_s"] += per_version
            for w in workers:
                loads, w.loads = w.loads, []
                rec["caller_s"] += [x.caller_s for x in loads]
                rec["fetch_s"] += [x.fetch_s for x in loads]
                rec["copy_s"] += [x.copy_s for x in loads]
        for w in workers:
            w.stop()
    finally:
        re.stop_ray()
    for mode in ("before", "after"):
        out[mode] = {k: round(statistics.median(v), 4) for k, v in out[mode].items()}
    if args.join:
        from freshroll.placement.ray_cluster import start_cluster

        cluster = start_cluster(2, pythonpath=Path(re.__file__).parents[2])
        try:
            out["cluster_start_s"] = cluster.start_s  # ray start --head (once per cluster)
            out["join_start_s"] = re.start_ray(address=cluster.address)
            t0 = time.perf_counter()
            w = re.RayEngine(path)
            w.wait_ready()
            out["join_first_actor_s"] = time.perf_counter() - t0
            w.stop()
            re.stop_ray()
        finally:
            cluster.stop()
    with open("/proc/loadavg") as f:
        out["loadavg"] = f.read().split()[:3]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

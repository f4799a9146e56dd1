"""What an actor call's round trip holds, on a private Ray instance: the trainer actor's step.

A bare actor with the shape of ``ray.trainer: actor``'s step: the call alone (a small result),
with a batch-like argument (128 rows of 32 tokens), and with the step's second return object,
the packed weights of a model of ``--params`` parameters
(:func:`~freshroll.placement.ray_engine.pack_state`, as the trainer actor returns them).
Prints the median milliseconds of ``--calls`` calls of each, with the load average.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/ray_roundtrip.py              # ~15 s
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1_056_128)
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args(argv)

    import ray
    import torch

    from freshroll.placement import ray_session
    from freshroll.placement.ray_engine import pack_state

    ray_session.start_ray(num_cpus=2)
    try:
        class Stepper:
            def __init__(self, params: int) -> None:
                self.state = {f"w{i}": torch.randn(params // 16) for i in range(16)}

            def meta(self, samples: Any) -> tuple[dict[str, float], str, float]:
                return {"loss": 0.0}, "digest", 0.0

            def both(self, samples: Any) -> tuple[tuple[dict[str, float], str, float], Any]:
                return ({"loss": 0.0}, "digest", 0.0), pack_state(self.state)

            def both_flat(self, samples: Any) -> tuple[tuple[dict[str, float], str, float],
                                                       Any]:
                # one buffer: every tensor's bytes copied into one array, then one write
                flat = torch.cat([t.reshape(-1) for t in self.state.values()])
                return ({"loss": 0.0}, "digest", 0.0), flat.view(torch.uint8).numpy()

            def weights(self) -> Any:
                return pack_state(self.state)

        actor: Any = ray.remote(num_cpus=1)(Stepper).remote(args.params)
        ray.get(actor.meta.remote(None))
        samples = [{"tokens": list(range(32)), "advantage": 0.1} for _ in range(128)]

        def median_ms(fn: Callable[[], Any]) -> float:
            times = []
            for _ in range(args.calls):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e3

        def with_weights() -> None:
            meta, _weights = actor.both.options(num_returns=2).remote(samples)
            ray.get(meta)

        def flat_weights() -> None:
            meta, _weights = actor.both_flat.options(num_returns=2).remote(samples)
            ray.get(meta)

        def split() -> None:  # the step's result, then the weights by a call of their own
            meta = actor.meta.remote(samples)
            actor.weights.remote()
            ray.get(meta)

        bare = median_ms(lambda: ray.get(actor.meta.remote(None)))
        batch = median_ms(lambda: ray.get(actor.meta.remote(samples)))
        print(f"call, small result          {bare:6.2f} ms")
        print(f"call, batch-like argument   {batch:6.2f} ms")
        print(f"... + the weights returned  {median_ms(with_weights):6.2f} ms "
              f"({args.params:,} parameters)")
        print(f"... as one flat buffer       {median_ms(flat_weights):6.2f} ms")
        print(f"... by a call of their own   {median_ms(split):6.2f} ms (the result's wait)")
        print(f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    finally:
        ray_session.stop_ray()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

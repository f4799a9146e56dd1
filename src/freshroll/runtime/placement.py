"""Where a run's compute runs, and how many intra-op threads each compute process gets.

``run.runtime`` places the inference workers (and, under Ray, the reward stage and the
trainer): ``inline`` (threads of the driver), ``process`` (one child process per worker,
weights in shared memory: :mod:`freshroll.runtime.process_engine`) or ``ray`` (actors:
:mod:`freshroll.runtime.ray_engine`). ``auto`` resolves to the placement measured best for
the run's shape (docs/overlap.md): :func:`resolve_runtime`.

``run.torch_threads: auto`` sets every compute process's intra-op threads from the cores
this process may use (its CPU affinity and the cgroup's CPU quota), shared among the
compute threads that run at once (the trainer and each worker), never below one:
:func:`thread_budget`. Oversubscribing the cores (two processes with two threads each on a
two-core machine) costs more than the threads win on the small ops of these models.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from freshroll.config import Config

Runtime = Literal["inline", "process", "ray"]


def available_cores() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def resolve_runtime(cfg: Config) -> Runtime:
    """The placement of ``cfg``'s workers: ``run.runtime``, with ``auto`` resolved
    (:func:`auto_runtime`)."""
    rt = cfg.run.runtime
    if rt != "auto":
        return rt
    return auto_runtime(cfg)[0]


def auto_runtime(cfg: Config, cores: int | None = None) -> tuple[Runtime, str]:
    """What ``run.runtime: auto`` resolves to, and why (printed in the start line)::

        process  if rollout.engine == "hf" and max_staleness > 0 and cores >= 2
                    (measured: docs/overlap.md)
        inline   otherwise (sim and vLLM engines manage their own concurrency; a sync run
                 never overlaps generation with training; one core has nothing to overlap)
    """
    if cfg.rollout.engine != "hf":
        return "inline", f"the {cfg.rollout.engine} engine manages its own concurrency"
    if cfg.run.max_staleness == 0:
        return "inline", "sync: generation and training never overlap"
    cores = available_cores() if cores is None else cores
    if cores < 2:
        return "inline", "one core: nothing to overlap"
    return "process", "async hf on >= 2 cores: generation beside the trainer, off its GIL"


def describe_runtime(cfg: Config) -> str:
    """The placement for the start line: ``process``, or ``inline (auto: why)``."""
    if cfg.run.runtime != "auto":
        return cfg.run.runtime
    rt, why = auto_runtime(cfg)
    return f"{rt}, auto: {why}"


@dataclass(frozen=True, slots=True)
class ThreadBudget:
    """Intra-op threads per compute process (or thread, inline) of a run."""

    cores: int
    runtime: Runtime
    trainer: int  # the trainer's process (inline: the whole driver: it is process-wide)
    worker: int  # each inference worker's process (inline: same as trainer)
    auto: bool

    def describe(self) -> str:
        how = "auto" if self.auto else "run.torch_threads"
        if self.runtime == "inline":
            return f"torch threads {self.trainer} ({how}, {self.cores} cores)"
        return (f"torch threads: trainer {self.trainer}, each worker {self.worker} "
                f"({how}, {self.cores} cores)")


def thread_budget(cfg: Config, cores: int | None = None) -> ThreadBudget:
    """The thread budget of ``cfg``'s run on ``cores`` (default :func:`available_cores`):
    ``run.torch_threads`` when set, else the cores shared by the trainer and the workers
    that compute at once (at least one thread each)."""
    cores = available_cores() if cores is None else cores
    rt = resolve_runtime(cfg)
    if cfg.run.torch_threads != "auto":
        n = int(cfg.run.torch_threads)
        return ThreadBudget(cores, rt, n, n, auto=False)
    share = max(1, cores // (1 + max(1, cfg.rollout.workers)))
    return ThreadBudget(cores, rt, share, share, auto=True)


__all__ = ["Runtime", "ThreadBudget", "auto_runtime", "available_cores",
           "describe_runtime", "resolve_runtime", "thread_budget"]

"""The synchronous baseline of a finished run (``freshroll run --baseline``, ``make demo``).

The same config with ``run.max_staleness: 0``, written to ``RUN_DIR/baseline``; the run's
summary and report are then rebuilt with it (reward per step and per second beside the
baseline's, and the seconds and steps each needed to reach the same rewards:
``summary.json`` ``time_to_reward``, :mod:`freshroll.figures.reward_time`).

**The baseline at its best, from its first measured second.** A sync run with
``run.torch_threads: auto`` settles each stage's intra-op threads on its own first calls
(:mod:`freshroll.stage_threads`): trials at one thread and at every core, each a whole
step's stage. On the tiny default those trials ran the baseline's first ~10 s at 2-4
steps/s against 13-15 later, so "time to reward" charged the baseline for its own tuning.
So the stages are settled first, on :data:`SETTLE_STEPS` untimed steps of the same work in a
scratch directory, and the measured baseline starts on that choice, taken from a private
probe cache (:mod:`freshroll.placement.probe_cache`, the same rule a re-run uses: same work,
whatever the load: ``FRESHROLL_PROBE_CACHE=pinned``, since other processes coming and going
between the settling and the baseline are no reason to charge the baseline a new tuning); its
start line says "reused". Where the baseline would not settle anything (its
threads fixed, another engine) nothing is run first. The settling's seconds are said on the
stream, outside the baseline's wall.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from freshroll.config import Config, read_yaml, validate
from freshroll.placement.placement import resolve_runtime, tunes_stages
from freshroll.runtime.endfiles import finish_run_dir
from freshroll.runtime.run import RunResult, run

#: untimed sync steps that settle the baseline's stages (warm-up + 3 trials each way)
SETTLE_STEPS = 8


def run_baseline(run_dir: Path, *, stream: TextIO = sys.stderr) -> RunResult:
    """The synchronous baseline of the finished run in ``run_dir`` (module doc)."""
    cfg = validate(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    sync = cfg.model_copy(update={"run": cfg.run.model_copy(
        update={"max_staleness": 0, "admission_window": "auto"})})
    stream.write("synchronous baseline (max_staleness=0):\n")
    with settled_first(sync, run_dir, stream):
        result = run(sync, run_dir / "baseline", stream=stream)
    finish_run_dir(run_dir, baseline=run_dir / "baseline")
    return result


def settles_stages(cfg: Config) -> bool:
    """Whether the sync run ``cfg`` settles its stages' threads on its own calls
    (:func:`~freshroll.placement.placement.tunes_stages`) and is longer than the settling."""
    return cfg.run.steps > SETTLE_STEPS and tunes_stages(cfg, resolve_runtime(cfg))


@contextlib.contextmanager
def settled_first(cfg: Config, run_dir: Path, stream: TextIO) -> Iterator[None]:
    """Within: a probe cache holding ``cfg``'s stages settled on untimed steps (module doc)."""
    if not settles_stages(cfg):
        yield
        return
    scratch = Path(tempfile.mkdtemp(prefix="baseline-settle-", dir=run_dir))
    saved = {k: os.environ.get(k) for k in ("FRESHROLL_CACHE_DIR", "FRESHROLL_PROBE_CACHE")}
    os.environ.update(FRESHROLL_CACHE_DIR=str(scratch / "cache"), FRESHROLL_PROBE_CACHE="pinned")
    try:
        short = cfg.model_copy(update={"run": cfg.run.model_copy(
            update={"steps": SETTLE_STEPS, "progress": False})})
        t0 = time.perf_counter()
        run(short, scratch / "run", stream=io.StringIO(), report=False)
        stream.write(f"(each stage's threads settled first on {SETTLE_STEPS} untimed steps, "
                     f"{time.perf_counter() - t0:.1f} s, outside the baseline's wall)\n")
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["SETTLE_STEPS", "run_baseline", "settled_first", "settles_stages"]

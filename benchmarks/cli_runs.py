"""What the benchmarks that run freshroll's CLI once per run share (``p2_frontier.py``,
``longtail_real.py``): one run in a fresh process, numbers read from its files, and the
table's mean ± sd cells."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def num(x: Any) -> float:
    """``x`` as a float; NaN for anything that is not a number (None, a bool, a string)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else math.nan


def mean_sd(xs: Sequence[float], spec: str, scale: float = 1.0, unit: str = "") -> str:
    """``mean ± sd`` of the finite ``xs`` (times ``scale``) in ``spec``; the mean alone for one
    value, ``-`` for none. A sign in ``spec`` (``+.3f``) is the mean's only."""
    vals = [x * scale for x in xs if math.isfinite(x)]
    if not vals:
        return "-"
    mean = format(statistics.fmean(vals), spec)
    if len(vals) < 2:
        return mean + unit
    return f"{mean} ± {format(statistics.stdev(vals), spec.lstrip('+'))}{unit}"


def run_cli(args: Sequence[str], label: str) -> tuple[bool, float]:
    """``python -m freshroll ARGS`` in a fresh process with this checkout's ``src`` first on
    the path and nothing downloaded; a line on stderr with its seconds. Returns whether the
    finished run verified (exit 0; 1: finished, verify failed, reported in the table) and the
    1-minute load average after it; any other exit raises, with the run's stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "freshroll", *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{label}: exit {proc.returncode}\n{proc.stderr}")
    sys.stderr.write(f"{label}: {time.perf_counter() - t0:.1f} s\n")
    return proc.returncode == 0, os.getloadavg()[0]

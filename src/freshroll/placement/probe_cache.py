"""A thread probe's measurement reused by the next run of the same work (issue 25, fixed costs).

The thread probe (:mod:`freshroll.placement.thread_probe`) costs 0.2-0.4 s on the tiny
default and 2-5 s at 5M parameters before a run's clock starts, and it measures the same thing
again when the same work runs again on the same machine (a seed sweep, a re-run after a
reward change). A measurement is kept in one JSON file and reused when, and only when::

    key    the initial model's digest (config and weights: what generation stops on),
           the probe's batch shape (the run's first batch of prompts: its row count, its
           shortest and longest prompt, batch_shape: another seed of the same task draws
           other prompts of the same shape), max_new_tokens,
           the cores tried, torch's version, the machine (architecture, CPU model, CPU count)
           and PROBE_VERSION (the probe's own method)       -- all equal
    age    now - measured_at <= MAX_AGE_S                   (6 hours)
    load   |busy_now - busy_then| <= BUSY_TOLERANCE         (0.5 cores)

``busy`` (:class:`BusyMeter`) is the cores that other processes keep busy, counted over the
probe itself when one runs, else over WINDOW_S (0.15 s) of sleep just before the run
starts, and only when the file holds a measurement of the same work (after the run's worker
forkserver is up; a run that finds none and has something to keep counts at its end):
the machine's busy CPU time from ``/proc/stat`` less this process's own. The load is part of
the answer, not of the work: two threads that pay on a quiet machine lose with another
process on one core (docs/overlap.md), so a measurement taken at another load is measured
again. (Not the load average: a run started right after another one sees the first one's
minute of CPU in it.) Without ``/proc/stat`` nothing is reused.

A reused measurement says so on the run's start line and in ``summary.json``
(``host.placement.probe.reused_from``: when it was measured; ``probe_s``: what the reuse cost).

Where: ``$FRESHROLL_CACHE_DIR/thread_probes.json`` (default ``$XDG_CACHE_HOME/freshroll``, or
``~/.cache/freshroll``); at most :data:`MAX_ENTRIES` measurements, the newest kept.
``FRESHROLL_PROBE_CACHE=off`` (or ``0``/``false``/``no``) neither reads nor writes it (the
test suite runs with it off); ``pinned`` reuses a measurement whatever the load (the key and
the age still hold): the synchronous baseline's private cache, settled seconds before on the
same work (:mod:`freshroll.runtime.baseline`), where another load means other processes came
and went, not another machine, and a re-measured baseline would pay its tuning on its clock.
A cache file that cannot be read or parsed is a cache miss,
never an error: the probe measures and the file is written anew; a file that cannot be
written is skipped with one warning line. A speed measurement never stops a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

#: bump when the probe's method changes: an older measurement is then never reused
#: 2: both stages timed on one thread, the advantage decides (thread_probe); 3: a group's
#: rows share their prompt's positions (engines/prefix.py), in the probe as in the run
PROBE_VERSION = 3
#: a measurement older than this is measured again
MAX_AGE_S = 6 * 3600.0
#: a measurement taken with more or fewer cores busy (other processes) than now by more than
#: this is not reused
BUSY_TOLERANCE = 0.5
#: seconds over which :func:`others_busy` counts the other processes' CPU
WINDOW_S = 0.15
#: measurements the file keeps (the newest)
MAX_ENTRIES = 64
FILE_NAME = "thread_probes.json"
_OFF = {"0", "off", "false", "no"}
_PINNED = "pinned"


def enabled() -> bool:
    """Whether runs read and write the cache (``FRESHROLL_PROBE_CACHE``; on by default)."""
    return os.environ.get("FRESHROLL_PROBE_CACHE", "on").strip().lower() not in _OFF


def pinned() -> bool:
    """Whether a measurement is reused whatever the load (``FRESHROLL_PROBE_CACHE=pinned``)."""
    return os.environ.get("FRESHROLL_PROBE_CACHE", "on").strip().lower() == _PINNED


def cache_path() -> Path:
    """The cache file: ``$FRESHROLL_CACHE_DIR``, else ``$XDG_CACHE_HOME/freshroll``, else
    ``~/.cache/freshroll``; :data:`FILE_NAME` in it."""
    root = os.environ.get("FRESHROLL_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "freshroll")
    return Path(root) / FILE_NAME


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def probe_key(model_digest: str, batch: Sequence[str], *, max_new_tokens: int,
              threads: int) -> str:
    """The key of a probe of ``batch`` on the model of ``model_digest`` (module docstring)."""
    import torch  # a probe's key is a real run's: a simulated one never asks (no torch)

    parts = {"v": PROBE_VERSION, "model": model_digest, "prompt_shape": batch_shape(batch),
             "rows": len(batch), "max_new_tokens": max_new_tokens, "threads": threads,
             "torch": torch.__version__, "machine": platform.machine(), "cpu": _cpu_model(),
             "cpu_count": os.cpu_count()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def batch_shape(batch: Sequence[str]) -> tuple[int, int]:
    """The part of a batch's prompts that decides what a probe measures, not their words:
    the shortest and the longest prompt (the longest sets the padded width a generate call
    runs at; between the two the rows' mean moves a few percent from one draw to the next,
    too little to change whether a second thread pays). Another seed of the same task draws
    prompts of the same shape; keyed by every prompt's length, each seed of a sweep probed
    again (5-10 digits drawn at random never give the same lengths twice)."""
    lengths = [len(text) for text in batch] or [0]
    return min(lengths), max(lengths)


def _busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _self_s() -> float:
    """CPU seconds this process has used (every thread of it)."""
    return sum(os.times()[:2])


class BusyMeter:
    """Counts the cores other processes keep busy from :meth:`start` to :meth:`stop`: the
    machine's busy CPU seconds from ``/proc/stat`` less this process's own (every thread),
    per second of wall. Wrapped around work of this process (the thread probe), it counts
    the others at no extra cost; :func:`others_busy` wraps a sleep."""

    def __init__(self) -> None:
        self._start: tuple[float, float, float] | None = None

    def start(self) -> BusyMeter:
        try:
            self._start = (_busy_s(), _self_s(), time.perf_counter())
        except (OSError, ValueError, IndexError):
            self._start = None
        return self

    def stop(self) -> float | None:
        """The cores busy by others since :meth:`start`; None without ``/proc/stat`` (then
        nothing is reused: the load cannot be compared)."""
        if self._start is None:
            return None
        try:
            b1, s1, w1 = _busy_s(), _self_s(), time.perf_counter()
        except (OSError, ValueError, IndexError):
            return None
        b0, s0, w0 = self._start
        return max(0.0, ((b1 - b0) - (s1 - s0)) / max(w1 - w0, 1e-9))


def others_busy(window_s: float = WINDOW_S) -> float | None:
    """Cores kept busy by other processes now, counted over ``window_s`` of sleep
    (:class:`BusyMeter`); None where ``/proc/stat`` is not there."""
    meter = BusyMeter().start()
    time.sleep(window_s)
    return meter.stop()


def holds(key: str, path: Path | None = None) -> bool:
    """Whether the cache holds any measurement of the work ``key`` names (its probe, its
    stages', its fallback's): only then is the load worth counting before the run."""
    return any(str(e.get("key", "")).startswith(key) for e in _entries(path or cache_path()))


def _entries(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def lookup(key: str, *, busy: float | None, now: float | None = None,
           path: Path | None = None) -> tuple[dict[str, Any], float] | None:
    """The cached measurement for ``key`` still valid at ``now`` and ``load``: its fields
    (a :class:`~freshroll.placement.thread_probe.ThreadProbe`'s) and when it was measured;
    else None. ``busy``: :func:`others_busy` now (None: nothing is reused)."""
    if not enabled() or busy is None:
        return None
    now = time.time() if now is None else now
    for entry in reversed(_entries(path or cache_path())):
        if entry.get("key") != key:
            continue
        try:
            at, then = float(entry["measured_at"]), float(entry["busy"])
            like = pinned() or abs(busy - then) <= BUSY_TOLERANCE
            if not (0.0 <= now - at <= MAX_AGE_S and like):
                return None
            fields = entry["probe"]
        except (KeyError, TypeError, ValueError):
            return None  # a damaged entry: measured again, and replaced
        return (fields, at) if isinstance(fields, dict) else None
    return None


def store(key: str, fields: dict[str, Any], *, busy: float | None, now: float | None = None,
          path: Path | None = None, stream: TextIO | None = None) -> bool:
    """Keep a measurement (``fields``: a probe's, taken with ``busy`` cores busy by others)
    under ``key``; False (one warning line on ``stream``) when the file cannot be written or
    ``busy`` is None. Never raises for the file's sake."""
    if not enabled() or busy is None:
        return False
    path = path or cache_path()
    entry = {"key": key, "measured_at": time.time() if now is None else now, "busy": busy,
             "probe": fields}
    entries = [e for e in _entries(path) if e.get("key") != key][-(MAX_ENTRIES - 1):]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"entries": [*entries, entry]}, indent=1) + "\n")
        os.replace(tmp, path)  # a reader sees the old file or the new one
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if stream is not None:
            stream.write(f"warning: the thread probe's cache {path} was not written ({exc}); "
                         "the next run measures again (FRESHROLL_PROBE_CACHE=off skips it)\n")
        return False
    return True


__all__ = ["BUSY_TOLERANCE", "FILE_NAME", "MAX_AGE_S", "MAX_ENTRIES", "PROBE_VERSION",
           "WINDOW_S", "BusyMeter", "batch_shape", "cache_path", "enabled", "holds", "lookup",
           "others_busy", "pinned", "probe_key", "store"]

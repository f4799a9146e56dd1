"""vLLM's engine core seen from a worker: its scheduler's figures, and its processes.

vLLM's ``AsyncLLM`` runs its engine core (scheduler and model) in processes of its own.

* Figures: :func:`stat_logger_factory` makes the stat logger vLLM calls on the frontend's
  event loop; it keeps the scheduler's newest figures in a :class:`StatSink`
  (``VLLMEngine.stats``).
* Processes: a worker that is killed, closed or abandoned leaves none behind.
  :func:`core_procs` takes psutil handles of them while the engine lives (a handle checks
  the process's start time, so a reused pid is never signalled), :func:`kill_tree` SIGKILLs
  them and all their descendants, :func:`quiet_del` keeps a shut-down ``AsyncLLM``'s
  ``__del__`` from shutting it down again at interpreter exit, and :func:`reap_abandoned`
  (a done callback of the start's future) does all three for an engine whose start timed
  out. vLLM and psutil are imported only inside the functions.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil


@dataclass
class StatSink:
    """The scheduler's newest figures (running, waiting, KV cache use; preemptions
    counted), as the stat logger last recorded them."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preemptions: int = 0
    seen: bool = False


def stat_logger_factory(sink: StatSink) -> Any:
    """A per-engine stat-logger factory ``(vllm_config, engine_index) -> logger`` filling
    ``sink`` (runs on the frontend's event loop, in the output handler)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class FreshrollStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                sink.running = int(scheduler_stats.num_running_reqs)
                sink.waiting = int(scheduler_stats.num_waiting_reqs)
                sink.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
                sink.seen = True
            if iteration_stats is not None:
                sink.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0))

        def log_engine_initialized(self) -> None:
            pass

    return FreshrollStats


def reap_abandoned(fut: Future[Any]) -> None:
    """An engine whose start was abandoned: shut it down as soon as it exists."""
    if fut.cancelled() or fut.exception() is not None:
        return
    llm = fut.result()
    with contextlib.suppress(Exception):
        llm.shutdown()
    quiet_del(llm)
    kill_tree(core_procs(llm))


def quiet_del(llm: Any) -> None:
    """An AsyncLLM shut down already: its ``__del__`` (which shuts down again) is made a no-op,
    else at interpreter exit it runs against torn-down modules and prints a TypeError."""
    with contextlib.suppress(Exception):
        llm.shutdown = lambda *a, **k: None


def core_procs(llm: Any) -> list[psutil.Process]:
    """The engine core processes of an AsyncLLM (its multiprocess client's children), as
    psutil handles (they check the process's start time: a reused pid is never signalled)."""
    import psutil

    resources = getattr(getattr(llm, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    out = []
    for p in getattr(manager, "processes", None) or []:
        pid = getattr(p, "pid", None)
        if pid:
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(pid))
    return out


def kill_tree(procs: Sequence[psutil.Process]) -> None:
    """SIGKILL these processes (still the ones we started) and all their descendants."""
    import psutil

    victims: list[psutil.Process] = []
    for p in procs:
        try:
            if p.is_running():
                victims += [*p.children(recursive=True), p]
        except psutil.Error:
            continue
    for v in victims:
        with contextlib.suppress(psutil.Error):
            v.send_signal(signal.SIGKILL)  # psutil checks the pid is still this process
    psutil.wait_procs(victims, timeout=5)


__all__ = [
    "StatSink", "core_procs", "kill_tree", "quiet_del", "reap_abandoned", "stat_logger_factory",
]

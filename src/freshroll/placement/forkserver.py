"""The worker processes' forkserver, startable before the parent imports torch.

A worker process (:mod:`freshroll.placement.process_engine`) forks from multiprocessing's
``forkserver``: a server process that imported torch, transformers and the worker's code
once, so that each child starts in milliseconds. That server's imports take seconds; begun
beside the parent's own (the command line starts it as soon as the config says a run's
workers may be processes, before the run's own imports of torch and transformers), they end
about when the parent's do, instead of after them. This module imports nothing heavy, so
the command line can call :func:`start` first.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from freshroll.config import Config

#: what the server imports before it forks any child: the worker's module (torch with it)
#: and the engine it runs (transformers)
PRELOAD = ("freshroll.placement.process_engine", "freshroll.engines.hf")


def context() -> Any:
    """The multiprocessing context that starts worker children: ``forkserver`` preloaded
    with :data:`PRELOAD`, else ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start() -> bool:
    """Start the server now (a no-op where it runs); False where there is no forkserver."""
    if context().get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    forkserver.ensure_running()
    return True


def start_for(cfg: Config) -> bool:
    """:func:`start` when ``cfg``'s workers may be processes
    (:func:`~freshroll.placement.placement.may_fork_workers`): what ``freshroll run`` does as
    soon as its config is checked, before it imports torch."""
    from freshroll.placement.placement import may_fork_workers

    return may_fork_workers(cfg) and start()


__all__ = ["PRELOAD", "context", "start", "start_for"]

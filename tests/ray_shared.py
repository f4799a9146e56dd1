"""One Ray cluster for a test module's runs: started once, joined by each run.

A private Ray instance costs every run ~4 CPU-s of its own daemons and ~5 s of wall before its
first actor (docs/testing.md); a module whose runs only need *some* Ray to place their actors
on starts one scratch cluster (``ray start --head``, :mod:`freshroll.placement.ray_cluster`)
and hands its address to each run as ``run.ray_address``: the runs join it, place their
actors, kill them at their end and disconnect, and the cluster goes on for the next test.
Tests of the private instance's own lifetime (its reaper, its watchdog, a killed driver, a
stopped instance) keep their private instances and stay out of such modules.

The cluster's processes carry their own token (``FRESHROLL_RAY_CLUSTER``), not a private
instance's, so the leak checks of Ray tests running beside it never count them; they are
stopped, exactly they, when the module ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from freshroll.placement.ray_cluster import ScratchCluster, start_cluster

SRC = Path(__file__).resolve().parents[1] / "src"


@contextlib.contextmanager
def shared_cluster(num_cpus: int, env: dict[str, str] | None = None,
                   ) -> Iterator[ScratchCluster]:
    """A scratch cluster of ``num_cpus`` logical CPUs whose workers import this checkout's
    freshroll; ``env`` is put in its processes' environment (a joined run's actors inherit
    the cluster's environment, not the driver's). Stopped, and checked gone, on exit."""
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        cluster = start_cluster(num_cpus, pythonpath=SRC)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.pids(), "the shared cluster's processes outlived it"


def joining(cluster: ScratchCluster) -> str:
    """The override that makes a run join ``cluster``."""
    return f"run.ray_address={cluster.address}"

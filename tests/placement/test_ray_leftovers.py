"""No process of a Ray instance outlives it: the private instance's and a scratch cluster's.

Issue 25, seventh session: after tests/placement/test_ray_cluster.py, ``ray::DashboardAgent``
and ``ray::RuntimeEnvAgent`` were alive (orphaned, using CPU). Their titles, set by Ray's
vendored ``setproctitle``, had written over the start of ``/proc/<pid>/environ``, token
included, so the reaper, which finds an instance's processes by that token, did not see
them. Real Ray: every process of the instance is snapshotted (pid and start time) while it
runs, and each must carry the token in its environment and be gone after the stop.
"""

from __future__ import annotations

import os
import time

import pytest

from freshroll.placement.ray_cluster import CLUSTER_ENV, start_cluster
from freshroll.placement.ray_reaper import TOKEN_ENV, alive, parents, start_time, with_descendants

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _tree_of(roots: list[int]) -> dict[int, int | None]:
    """``pid -> start time`` of ``roots`` and all their descendants, now."""
    return {p: start_time(p) for p in with_descendants(roots)}


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[0].decode(errors="replace")[:80]
    except OSError:
        return "?"


def _without(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle not in fh.read().split(b"\0")
    except OSError:
        return False  # gone meanwhile


def _wait_agents(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    """Wait until Ray's two agents run among ``pids``' descendants; the whole tree then."""
    deadline = time.monotonic() + timeout_s
    while True:
        tree = with_descendants(pids)
        titles = {_title(p) for p in tree}
        if {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= titles:
            return tree
        assert time.monotonic() < deadline, f"Ray's agents did not start: {sorted(titles)}"
        time.sleep(0.2)


def _survivors(snapshot: dict[int, int | None], timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = [f"{p} {_title(p)}" for p, t in snapshot.items()
                if alive(p) and start_time(p) == t]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_private_instance_leaves_no_process_behind():
    import ray

    from freshroll.placement import ray_session

    before = set(parents())
    ray_session.start_ray(num_cpus=1)
    try:
        assert ray_session._session is not None and ray_session._session.token is not None
        token = ray_session._session.token
        watchdog = ray_session._session.watchdog
        assert ray.get(ray.remote(lambda: os.getpid()).remote()) > 0  # a worker ran
        ours = [p for p in with_descendants([os.getpid()])
                if p not in before and p != os.getpid()
                and (watchdog is None or p != watchdog.pid)]
        tree = _wait_agents(ours)
        snapshot = _tree_of(tree)
        needle = f"{TOKEN_ENV}={token}".encode()
        wiped = [f"{p} {_title(p)}" for p in snapshot
                 if (watchdog is None or p != watchdog.pid) and _without(p, needle)]
        assert not wiped, f"processes of the instance without its token: {wiped}"
    finally:
        ray_session.stop_ray()
    assert not _survivors(snapshot), "the private instance's processes outlived stop_ray"


def test_a_scratch_cluster_leaves_no_process_behind():
    cluster = start_cluster(1)
    try:
        tree = _wait_agents(cluster.daemon_pids())
        snapshot = _tree_of(tree)
        needle = f"{CLUSTER_ENV}={cluster.token}".encode()
        wiped = [f"{p} {_title(p)}" for p in snapshot if _without(p, needle)]
        assert not wiped, f"processes of the cluster without its token: {wiped}"
    finally:
        cluster.stop()
    assert not _survivors(snapshot), "the scratch cluster's processes outlived its stop"

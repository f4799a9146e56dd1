"""A throwaway local Ray cluster (``ray start --head``) for tests and benchmarks of
``run.ray_address``: started on a free port, and stopped by reaping exactly its processes.

``ray stop`` stops every Ray process of the machine (other runs' private instances too), so
it is not used: the cluster's processes are started with a fresh token in their environment
(``FRESHROLL_RAY_CLUSTER``, not the private instances' token, so their leak checks never see
it) and :meth:`ScratchCluster.stop` signals only the processes that carry it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from freshroll.placement.ray_reaper import NOENV_ENV, alive, token_pids

CLUSTER_ENV = "FRESHROLL_RAY_CLUSTER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_pids(token: str) -> list[int]:
    """The processes started with ``CLUSTER_ENV=token``, and their descendants."""
    return token_pids(f"{CLUSTER_ENV}={token}")


_DAEMONS = (b"gcs_server", b"raylet")


def _is_daemon(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return Path(os.fsdecode(argv0)).name.encode() in _DAEMONS


@dataclass
class ScratchCluster:
    address: str
    token: str
    start_s: float  # seconds ``ray start --head`` took

    def pids(self) -> list[int]:
        return cluster_pids(self.token)

    def daemon_pids(self) -> list[int]:
        """The cluster's own daemons (``gcs_server``, ``raylet``): the processes that must
        outlive any run joining it. Its worker processes come and go (Ray reaps idle ones)."""
        return [pid for pid in self.pids() if _is_daemon(pid)]

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM, then SIGKILL, to exactly this cluster's processes, until none is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(alive(p) for p in self.pids()):
                time.sleep(0.1)
        left = [p for p in self.pids() if alive(p)]
        if left:
            raise RuntimeError(f"scratch Ray cluster processes survived: {left}")


def start_cluster(num_cpus: int = 2, timeout_s: float = 120.0,
                  pythonpath: Path | None = None) -> ScratchCluster:
    """``ray start --head --port <free> --num-cpus N --disable-usage-stats
    --include-dashboard=false``, its processes tagged (see module docstring); ``pythonpath``
    is put on the workers' path (so actors import this checkout's freshroll).

    A scratch cluster of one fixed node starts no autoscaler monitor and no log monitor
    (``--no-monitor --include-log-monitor=false``: nothing to scale, no driver reads the
    logs; ~1.5 CPU-s less a start), and its Ray client server listens on a free port, not
    Ray's fixed 10001, so two scratch clusters (two test workers) never compete for it."""
    token, port = secrets.token_hex(12), free_port()
    client_port = free_port()
    while client_port == port:
        client_port = free_port()
    env = {NOENV_ENV: "1", **os.environ, CLUSTER_ENV: token}  # the token survives titles
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])])
    ray_bin = str(Path(sys.executable).with_name("ray"))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [ray_bin, "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}",
         "--disable-usage-stats", "--include-dashboard=false", "--no-monitor",
         "--include-log-monitor=false", f"--ray-client-server-port={client_port}"],
        env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    cluster = ScratchCluster(f"127.0.0.1:{port}", token, time.perf_counter() - t0)
    if proc.returncode != 0:
        cluster.stop()
        raise RuntimeError(f"ray start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return cluster


__all__ = ["CLUSTER_ENV", "ScratchCluster", "cluster_pids", "free_port", "start_cluster"]

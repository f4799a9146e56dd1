"""The Ray instance of this process: started or joined, stopped, its actors and its gate.

Lifetime, private instance (``run.ray_address`` unset): the Ray instance is freshroll's own
(``address="local"``, never a cluster found through ``RAY_ADDRESS``) and never outlives its
run: ``stop_ray`` stops every one
of its processes, a watchdog does the same when the driver is killed (even by
``SIGKILL``), and a resume reaps what a previous incarnation recorded in
``RUN_DIR/ray.json`` left behind (:mod:`freshroll.placement.ray_reaper`). Only processes
carrying that instance's token are ever signalled.

Joined cluster (``run.ray_address``): :func:`start_ray` probes the address with a bounded
TCP connect (:class:`~freshroll.errors.ClusterUnavailable` within
:data:`CONNECT_TIMEOUT_S`, naming the address and what to check) and joins it; the
cluster's processes are not freshroll's: no watchdog, no reaper. At the end only
freshroll's own actors are killed (:func:`track`) and the driver disconnects.

Network: freshroll itself opens no socket. Ray is started locally without its
dashboard, but Ray's own gRPC servers (GCS, raylet, workers) listen on ports
Ray chooses on the node's address or all interfaces (Ray 2.60 turns a
requested 127.0.0.1 into the node's reachable IP), protected by Ray's token
authentication, and Ray serialises with pickle between its processes. That is
why ``runtime: ray`` is opt-in: the default ``inline`` runtime listens on
nothing. On a shared network, firewall the node or stay inline.

Every Ray call of freshroll (an inference actor's
:class:`~freshroll.placement.ray_engine.RayEngine`, the reward actors, the trainer actor) enters
one gate (:class:`_Gate`) and waits in slices
of :data:`POLL_S` (:func:`gated_get`), so :func:`stop_ray` never finds a thread in Ray.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshroll.errors import ClusterUnavailable, ConfigError, WorkerLost, WorkerTimeout
from freshroll.placement import ray_reaper

#: seconds a join waits for the cluster's address to answer (``run.ray_address``)
CONNECT_TIMEOUT_S = 10.0
#: Ray starts its worker processes (every actor: the inference workers, the reward actors,
#: the trainer) at this niceness, 15 by default: below the driver and every other process
#: of the machine. A private instance's actors are the run's compute, on the driver's own
#: cores: they start at 0, as the driver and a ``process`` run's workers do (issue 25: at
#: 15, any thread of the driver or of another process took an actor's core almost whole,
#: and an OpenMP team of two in a sync window waited on its descheduled thread). A caller
#: that sets the variable itself keeps its value; a joined cluster's workers keep theirs.
NICENESS_ENV = "RAY_worker_niceness"

#: the environment a private instance starts with, where the caller has not set the variable:
#: its workers at niceness 0 (above), and process titles that keep the reaper's token
#: (:data:`~freshroll.placement.ray_reaper.NOENV_ENV`). Ray's observability (task events,
#: metrics, event-loop statistics: ``RAY_task_events_report_interval_ms=0``,
#: ``RAY_enable_metrics_collection=0``, ``RAY_event_stats=0``) was switched off here and
#: measured, then not kept: no difference beyond the noise (CHANGELOG.md, 2026-12-06, "Ray
#: placement (issue 25), seventh session"); a caller may still set those variables.
_PRIVATE_ENV = {NICENESS_ENV: "0", ray_reaper.NOENV_ENV: "1"}


def start_ray(num_cpus: int | None = None, run_dir: Path | None = None,
              address: str | None = None,
              connect_timeout_s: float = CONNECT_TIMEOUT_S) -> float:
    """Start freshroll's private local Ray instance, or join the cluster at ``address``;
    returns the seconds it took (0.0 when Ray was already initialised: a no-op).

    Private (``address`` None): always a new instance (``address="local"``: never one found
    through ``RAY_ADDRESS`` or a ``ray start`` on this machine), quiet, without its dashboard,
    tagged with a token that a watchdog uses to stop every process of it when this process
    dies in any way (:mod:`.ray_reaper`). With ``run_dir``, a previous incarnation's leftovers
    are reaped first and this one is recorded in ``RUN_DIR/ray.json``.

    Joined (``run.ray_address``): ``ray.init(address=...)`` after a bounded probe of the
    address (:func:`probe_address`): a cluster that does not answer is
    :class:`~freshroll.errors.ClusterUnavailable` within ``connect_timeout_s``, naming the
    address and what to check. The cluster's processes are not ours: no watchdog, no reaper;
    :func:`stop_ray` kills only freshroll's own actors and disconnects.
    """
    import ray

    global _session
    if ray.is_initialized():
        return 0.0
    t0 = time.perf_counter()
    _gate.open()
    COSTS.clear()
    if address is not None:
        with keep_signal_handlers():
            _join(ray, address, connect_timeout_s)
        _session = _RaySession(None, None, None, address)
        COSTS["ray_start_s"] = time.perf_counter() - t0
        return COSTS["ray_start_s"]
    if run_dir is not None:
        ray_reaper.reap_previous(run_dir)
    token = ray_reaper.new_token()
    watchdog = ray_reaper.start_watchdog(token)  # before any Ray process exists
    _session = _RaySession(token, watchdog, run_dir, None)
    if run_dir is not None:
        ray_reaper.write_record(run_dir, token, watchdog.pid)
    os.environ[ray_reaper.TOKEN_ENV] = token  # inherited by every process of the instance
    ours = {k: v for k, v in _PRIVATE_ENV.items() if k not in os.environ}  # a caller's stands
    os.environ.update(ours)  # read by each process of the instance as it starts
    try:
        with keep_signal_handlers():
            ray.init(
                address="local", num_cpus=num_cpus, include_dashboard=False,
                log_to_driver=False, configure_logging=False,
            )
    except BaseException:
        stop_ray()
        raise
    finally:
        os.environ.pop(ray_reaper.TOKEN_ENV, None)
        for key in ours:
            os.environ.pop(key, None)
    COSTS["ray_start_s"] = time.perf_counter() - t0
    return COSTS["ray_start_s"]


#: the signals a run stops on gracefully (``freshroll.boundary.sigterm_as_sigint``)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """The driver's SIGTERM and SIGINT handlers as they were before ``ray.init``, put back
    after it (also when it fails).

    ``ray.init`` installs its own: a Python SIGTERM handler that kills the node's processes
    and exits 1, and, under it, the core worker's native failure-signal handler, which on
    SIGTERM prints a native stack and aborts (SIGABRT, exit 134). A ``kill`` (a container
    stop, ``systemctl stop``, a CI cancel) then left the ledger closed ``failed`` with no
    resume line. With ours back, SIGTERM stops a Ray run as Ctrl-C does: the ``interrupted
    ... resume with`` line and status 130; the instance is stopped by the run's teardown
    (:func:`stop_ray`) and, failing that, by its watchdog. Outside the main thread (where
    handlers cannot be set) nothing is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: not installed from Python; nothing to restore
                signal.signal(sig, handler)


def _hint(address: str) -> str:
    return (f"check that a Ray head runs there (`ray start --head --port PORT` on the head "
            f"node; `ray status --address {address}` from this one), that the port is the "
            "head's GCS port (default 6379; a ray:// address: its client server, default "
            "10001) and that no firewall is in the way; or unset run.ray_address for a "
            "private local instance")


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``, ``[v6]:port`` or ``ray://host:port``."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise ConfigError(f"run.ray_address {address!r}: expected host:port, ray://host:port "
                          "or auto")
    return host.strip("[]"), int(port)


def probe_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ClusterUnavailable` unless ``address`` (``host:port`` or
    ``ray://host:port``) accepts a TCP connection within ``timeout_s`` (``auto``: Ray looks
    the address up itself and fails fast when there is none; not probed here)."""
    if address == "auto":
        return
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ClusterUnavailable(
            f"run.ray_address {address!r}: nothing answers at {host}:{port} within "
            f"{timeout_s:g} s ({why}); {_hint(address)}") from exc


def _join(ray: Any, address: str, timeout_s: float) -> None:
    probe_address(address, timeout_s)
    _token_auth_if_available()
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        text = str(exc)
        auth = "auth" in text.lower() and "token" in text.lower()
        why = ("the cluster refused this driver's Ray auth token: make the cluster's token "
               "available here (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN; "
               "`ray get-auth-token` on the head prints it)" if auth else
               f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}")
        raise ClusterUnavailable(
            f"run.ray_address {address!r}: joining the cluster failed ({why}); "
            f"{_hint(address)}") from exc


def _token_auth_if_available() -> None:
    """Use Ray's token authentication when a token is available and ``RAY_AUTH_MODE`` is
    unset, as ``ray start`` does (a driver that joins does not by itself in Ray 2.60, and a
    cluster started with a token then refuses it)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray version: its own defaults apply
        return
    with contextlib.suppress(Exception):
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def joined() -> bool:
    """Whether this process is connected to a cluster it did not start."""
    return _session is not None and _session.address is not None


def stop_ray() -> None:
    """Private instance: shut it down and make sure none of its processes outlive this call.
    Joined cluster: kill freshroll's own actors (:func:`track`) and disconnect."""
    import ray

    global _session
    t0 = time.perf_counter()
    _gate.close(CLOSE_WAIT_S)  # no thread may touch Ray once it is shut down
    if ray.is_initialized():
        for actor in list(_actors.values()):
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        ray.shutdown()
    _actors.clear()
    session, _session = _session, None
    if session is not None and session.token is not None:
        ray_reaper.reap(session.token)
        if session.watchdog is not None:  # its own reap only if something is left
            ray_reaper.stop_watchdog(session.watchdog,
                                     reaped=not ray_reaper.session_pids(session.token))
        if session.run_dir is not None:
            ray_reaper.remove_record(session.run_dir, session.token)
    if "ray_start_s" in COSTS:
        COSTS["ray_stop_s"] = time.perf_counter() - t0


#: the seconds Ray's own start and stop took, of the last instance this process started or
#: joined (``ray_start_s``: ``ray.init``; ``ray_stop_s``: :func:`stop_ray`); a run's
#: ``summary.json`` reports them beside its seconds outside the measured wall
COSTS: dict[str, float] = {}


@dataclass
class _RaySession:
    """The Ray instance this process started (token, watchdog, run directory), or the
    cluster it joined (address)."""

    token: str | None  # None: a joined cluster (not ours to reap)
    watchdog: subprocess.Popen[bytes] | None
    run_dir: Path | None
    address: str | None  # run.ray_address of a joined cluster


_session: _RaySession | None = None

#: freshroll's live actors (inference, reward), by id: killed by :func:`stop_ray`
_actors: dict[int, Any] = {}


def track(actor: Any) -> Any:
    """Record one of freshroll's actors (killed at the end even on a joined cluster)."""
    _actors[id(actor)] = actor
    return actor


def untrack(actor: Any) -> None:
    _actors.pop(id(actor), None)


def live_actors() -> int:
    """freshroll's actors this process has started and not killed."""
    return len(_actors)


#: how long one ``ray.get`` waits before it looks whether the instance is stopping
POLL_S = 0.25
#: how long :func:`stop_ray` waits for the calls in flight to leave
CLOSE_WAIT_S = 5.0


class _Gate:
    """The Ray calls of this process in flight, on any thread (abandoned ones too).

    Ray ends the whole process when a thread touches its core worker after ``ray.shutdown``
    ("The core worker has already been shutdown ... The process will exit"), and a thread
    the run walked away from (a timed-out call, a restart cut short by the run's end) may
    still be in ``ray.get``: fatal for a process that runs many runs (the chaos harness,
    tests). So every call of a :class:`RayEngine` enters the gate and waits in slices of
    :data:`POLL_S`; :func:`stop_ray` closes the gate first, the calls in flight leave within
    a slice (:class:`WorkerLost`), later ones are refused, and only then is Ray shut down.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inflight = 0
        self.closed = False

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise WorkerLost("the run's Ray instance is shut down")
            self._inflight += 1
        try:
            yield
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def check(self) -> None:
        if self.closed:
            raise WorkerLost("the run's Ray instance is shutting down")

    def open(self) -> None:
        with self._cond:
            self.closed = False

    def close(self, wait_s: float) -> None:
        with self._cond:
            self.closed = True
            self._cond.wait_for(lambda: self._inflight == 0, timeout=wait_s)


_gate = _Gate()


def gated_get(ref: Any, timeout_s: float, who: str, late: str) -> Any:
    """``ray.get(ref)`` within ``timeout_s``, waited in slices of :data:`POLL_S` inside the
    :class:`_Gate` (so :func:`stop_ray` never finds a thread in Ray): a dead actor is
    :class:`WorkerLost` ("WHO died: ..."), no answer in time :class:`WorkerTimeout` ("WHO
    LATE"), a stopping instance WorkerLost; an error raised in the actor propagates."""
    import ray

    deadline = time.monotonic() + timeout_s
    with _gate.entered():
        while True:
            left = deadline - time.monotonic()
            try:
                return ray.get(ref, timeout=max(0.0, min(POLL_S, left)))
            except ray.exceptions.GetTimeoutError as exc:
                if time.monotonic() >= deadline:
                    raise WorkerTimeout(f"{who} {late}") from exc
                _gate.check()
            except ray.exceptions.RayActorError as exc:
                raise WorkerLost(f"{who} died: {exc}"[:500]) from exc


__all__ = ["CLOSE_WAIT_S", "CONNECT_TIMEOUT_S", "COSTS", "NICENESS_ENV", "POLL_S", "gated_get",
           "joined", "live_actors", "probe_address", "split_address", "start_ray",
           "stop_ray", "track", "untrack"]

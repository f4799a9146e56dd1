"""``run.runtime: ray``: inference engines as Ray actors, one process each.

:class:`RayEngine` is a blocking proxy with the same methods as
:class:`~freshroll.engines.base.InferenceEngine`, so the orchestrator does not
care where a worker runs: its worker thread calls ``generate`` and waits on
``ray.get`` (the GIL is released while it waits), and the actor generates in
its own process. This matters on small models, where generation is mostly
Python overhead: threads in one process take turns on the GIL, processes run
side by side with the trainer.

A dead actor surfaces as :class:`~freshroll.errors.WorkerLost`, an actor that
does not answer in time (stopped, hung, swapping) as
:class:`~freshroll.errors.WorkerTimeout`: every ``ray.get`` has a timeout
(``generate_timeout_s``, ``weights_timeout_s``, ``start_timeout_s``, from the
config's ``limits``). Either way the pipeline fences that worker epoch (its
running attempts are re-issued, late results rejected), calls
:meth:`RayEngine.restart` (which kills the old actor, stuck or not) and
re-sends the current weights.

Weights travel through Ray's object store; ``load_weights`` returns the
caller-side wall time (serialisation + transfer + copy), which the pipeline
records as ``weights_loaded.transfer_s``.

Lifetime: the Ray instance is freshroll's own (``address="local"``, never a cluster
found through ``RAY_ADDRESS``) and never outlives its run: ``stop_ray`` stops every one
of its processes, a watchdog does the same when the driver is killed (even by
``SIGKILL``), and a resume reaps what a previous incarnation recorded in
``RUN_DIR/ray.json`` left behind (:mod:`freshroll.runtime.ray_reaper`). Only processes
carrying that instance's token are ever signalled.

Network: freshroll itself opens no socket. Ray is started locally without its
dashboard, but Ray's own gRPC servers (GCS, raylet, workers) listen on ports
Ray chooses on the node's address or all interfaces (Ray 2.60 turns a
requested 127.0.0.1 into the node's reachable IP), protected by Ray's token
authentication, and Ray serialises with pickle between its processes. That is
why ``runtime: ray`` is opt-in: the default ``inline`` runtime listens on
nothing. On a shared network, firewall the node or stay inline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from freshroll.engines.base import Completion
from freshroll.errors import WorkerLost, WorkerTimeout
from freshroll.runtime import ray_reaper


def start_ray(num_cpus: int | None = None, run_dir: Path | None = None) -> None:
    """Start freshroll's private local Ray instance, quietly and without its dashboard.

    Always a new instance (``address="local"``: never one found through ``RAY_ADDRESS``
    or a ``ray start`` on this machine), tagged with a token that a watchdog uses to stop
    every process of it when this process dies in any way (:mod:`.ray_reaper`). With
    ``run_dir``, a previous incarnation's leftovers are reaped first and this one is
    recorded in ``RUN_DIR/ray.json``. A no-op when Ray is already initialised.
    """
    import ray

    global _session
    if ray.is_initialized():
        return
    _gate.open()
    if run_dir is not None:
        ray_reaper.reap_previous(run_dir)
    token = ray_reaper.new_token()
    watchdog = ray_reaper.start_watchdog(token)  # before any Ray process exists
    _session = _RaySession(token, watchdog, run_dir)
    if run_dir is not None:
        ray_reaper.write_record(run_dir, token, watchdog.pid)
    os.environ[ray_reaper.TOKEN_ENV] = token  # inherited by every process of the instance
    try:
        ray.init(
            address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
            configure_logging=False,
        )
    except BaseException:
        stop_ray()
        raise
    finally:
        os.environ.pop(ray_reaper.TOKEN_ENV, None)


def stop_ray() -> None:
    """Shut the instance down and make sure none of its processes outlive this call."""
    import ray

    global _session
    _gate.close(CLOSE_WAIT_S)  # no thread may touch Ray once it is shut down
    if ray.is_initialized():
        ray.shutdown()
    session, _session = _session, None
    if session is not None:
        ray_reaper.reap(session.token)
        ray_reaper.stop_watchdog(session.watchdog)
        if session.run_dir is not None:
            ray_reaper.remove_record(session.run_dir, session.token)


@dataclass
class _RaySession:
    """The Ray instance this process started: its token, watchdog and run directory."""

    token: str
    watchdog: subprocess.Popen[bytes]
    run_dir: Path | None


_session: _RaySession | None = None

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


class _EngineActor:
    """Lives in a Ray worker process: one HFEngine on a local model directory."""

    def __init__(self, path: str, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)
        from transformers.utils import logging as hf_logging

        from freshroll.engines.hf import HFEngine

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.engine = HFEngine.from_pretrained(path)

    def generate(self, prompts: Sequence[str], kwargs: dict[str, Any]) -> list[Completion]:
        return self.engine.generate(prompts, **kwargs)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        return self.engine.load_weights(state_dict)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()

    def ready(self) -> bool:
        return True


class RayEngine:
    """A blocking proxy to an engine in a Ray actor (see module docstring)."""

    def __init__(
        self, path: Path, *, torch_threads: int = 1, generate_timeout_s: float = 600.0,
        weights_timeout_s: float = 300.0, start_timeout_s: float = 300.0,
    ) -> None:
        import ray

        self._ray, self._path, self._threads = ray, str(path), torch_threads
        self.generate_timeout_s, self.weights_timeout_s = generate_timeout_s, weights_timeout_s
        self.start_timeout_s = start_timeout_s
        self._actor = self._spawn()

    def _spawn(self) -> Any:
        actor_cls = self._ray.remote(num_cpus=1, max_restarts=0)(_EngineActor)
        with _gate.entered():
            return actor_cls.remote(self._path, self._threads)

    def _call(self, method: str, *args: Any, timeout_s: float, what: str) -> Any:
        """Call the actor's ``method`` and wait for it with a timeout: a dead actor is
        :class:`WorkerLost`, one that does not answer within ``timeout_s`` is
        :class:`WorkerTimeout` (both retryable); waits in slices of :data:`POLL_S`, and
        leaves with WorkerLost once :func:`stop_ray` began (:class:`_Gate`)."""
        ray = self._ray
        deadline = time.monotonic() + timeout_s
        with _gate.entered():
            ref = getattr(self._actor, method).remote(*args)
            while True:
                left = deadline - time.monotonic()
                try:
                    return ray.get(ref, timeout=max(0.0, min(POLL_S, left)))
                except ray.exceptions.GetTimeoutError as exc:
                    if time.monotonic() >= deadline:
                        raise WorkerTimeout(
                            f"inference actor did not answer {what} within {timeout_s:g} s"
                        ) from exc
                    _gate.check()
                except ray.exceptions.RayActorError as exc:
                    raise WorkerLost(f"inference actor died: {exc}"[:500]) from exc

    def _kill_actor(self) -> None:
        with _gate.entered():
            self._ray.kill(self._actor, no_restart=True)

    def kill(self) -> None:
        """Kill the actor's process, as a crash would (``ray.kill``, no restart), and return
        once Ray reports it dead: a call in flight (unless it finished first) and every later
        one fail with :class:`WorkerLost`, until :meth:`restart`. The chaos harness's real
        ``kill_worker`` fault (:mod:`freshroll.chaos`)."""
        self._kill_actor()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:  # the kill travels through Ray's control plane
            try:
                self._call("ready", timeout_s=1.0, what="ready")
            except WorkerLost:
                return
            except WorkerTimeout:
                pass
            time.sleep(0.02)
        raise WorkerTimeout(f"inference actor still answers {self.start_timeout_s:g} s after "
                            "ray.kill")

    def restart(self) -> None:
        """A fresh actor on the initial model (the caller re-sends the current weights)."""
        self._kill_actor()
        self._actor = self._spawn()
        self.wait_ready()

    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 1.0,
        top_p: float = 1.0, seed: int | None = None,
    ) -> list[Completion]:
        kwargs = {"max_new_tokens": max_new_tokens, "temperature": temperature,
                  "top_p": top_p, "seed": seed}
        result: list[Completion] = self._call(
            "generate", list(prompts), kwargs, timeout_s=self.generate_timeout_s, what="generate")
        return result

    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Any) -> float:
        """A mapping, or a ``ray.ObjectRef`` to one (resolved by Ray in the actor)."""
        t0 = time.perf_counter()
        weights = state_dict if isinstance(state_dict, self._ray.ObjectRef) else dict(state_dict)
        self._call("load_weights", weights, timeout_s=self.weights_timeout_s,
                   what="load_weights")
        return time.perf_counter() - t0

    def state_dict(self) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self._call(
            "state_dict", timeout_s=self.weights_timeout_s, what="state_dict")
        return result

    def wait_ready(self) -> None:
        """Block until the actor has started and loaded its model (setup is not run time)."""
        self._call("ready", timeout_s=self.start_timeout_s, what="ready (model load)")

    def stop(self) -> None:
        with _gate.entered():
            self._ray.kill(self._actor)

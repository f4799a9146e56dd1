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

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
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
        return actor_cls.remote(self._path, self._threads)

    def _get(self, ref: Any, timeout_s: float, what: str) -> Any:
        """``ray.get`` with a timeout: a dead actor is :class:`WorkerLost`, one that does not
        answer within ``timeout_s`` is :class:`WorkerTimeout` (both retryable)."""
        try:
            return self._ray.get(ref, timeout=timeout_s)
        except self._ray.exceptions.GetTimeoutError as exc:
            raise WorkerTimeout(
                f"inference actor did not answer {what} within {timeout_s:g} s"
            ) from exc
        except self._ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"inference actor died: {exc}"[:500]) from exc

    def kill(self) -> None:
        """Kill the actor's process, as a crash would (``ray.kill``, no restart), and return
        once Ray reports it dead: a call in flight (unless it finished first) and every later
        one fail with :class:`WorkerLost`, until :meth:`restart`. The chaos harness's real
        ``kill_worker`` fault (:mod:`freshroll.chaos`)."""
        ray = self._ray
        ray.kill(self._actor, no_restart=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:  # the kill travels through Ray's control plane
            try:
                ray.get(self._actor.ready.remote(), timeout=1.0)
            except ray.exceptions.RayActorError:
                return
            except ray.exceptions.GetTimeoutError:
                pass
            time.sleep(0.02)
        raise WorkerTimeout(f"inference actor still answers {self.start_timeout_s:g} s after "
                            "ray.kill")

    def restart(self) -> None:
        """A fresh actor on the initial model (the caller re-sends the current weights)."""
        self._ray.kill(self._actor, no_restart=True)
        self._actor = self._spawn()
        self.wait_ready()

    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 1.0,
        top_p: float = 1.0, seed: int | None = None,
    ) -> list[Completion]:
        kwargs = {"max_new_tokens": max_new_tokens, "temperature": temperature,
                  "top_p": top_p, "seed": seed}
        result: list[Completion] = self._get(
            self._actor.generate.remote(list(prompts), kwargs), self.generate_timeout_s, "generate"
        )
        return result

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> float:
        t0 = time.perf_counter()
        self._get(self._actor.load_weights.remote(dict(state_dict)), self.weights_timeout_s,
                  "load_weights")
        return time.perf_counter() - t0

    def state_dict(self) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self._get(
            self._actor.state_dict.remote(), self.weights_timeout_s, "state_dict"
        )
        return result

    def wait_ready(self) -> None:
        """Block until the actor has started and loaded its model (setup is not run time)."""
        self._get(self._actor.ready.remote(), self.start_timeout_s, "ready (model load)")

    def stop(self) -> None:
        self._ray.kill(self._actor)

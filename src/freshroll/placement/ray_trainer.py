"""``ray.trainer: actor``: the GRPO learner in a Ray actor of its own.

:class:`RayTrainer` is the :class:`~freshroll.ports.seams.AsyncTrainer` of a
``run.runtime: ray`` run (the default there). The driver builds the learner at the
ledger's version as every run does (:func:`freshroll.runtime.learner.build_learner`:
checkpoint + digest-checked replay), ships it (model and optimizer, pickled by Ray) to a
new actor declared with ``ray.trainer_cpus`` / ``ray.trainer_gpus`` and drops its own
copy. Then, per step:

* the batch is read from the buffer on the event loop
  (:func:`~freshroll.trainer.replay.train_samples`) and sent to the actor;
* the actor steps, computes the weights digest and returns the new weights as a second
  return object of the same call (``num_returns=2``): written once into the object store by
  the actor's process, **owned by the driver**, and never fetched by it; the driver waits
  only for the small first object (metrics, digest). :meth:`RayTrainer.weights` hands the
  second one's ``ray.ObjectRef`` (to a state dict packed as numpy byte views:
  :func:`~freshroll.placement.ray_engine.pack_state`) to every inference
  worker's ``load_weights``. A ``ray.put`` inside the actor would make the actor the
  owner, and its objects die with it: a worker loading the current version after a trainer
  loss would fail. A task's return object survives its actor.

Checkpoints (:meth:`RayTrainer.before_commit`): only when the Checkpointer's checkpoint is due
(every ``trainer.checkpoint_every`` steps and at the last step) are the model and optimizer
state fetched from the actor, and saved by the driver, so the run directory needs no file
system shared with the actor's node.

Intra-op threads: the actor starts at the placement's share of the cores; given ``threads``
(an async run's :class:`~freshroll.stage_threads.ModeThreads`, on a private Ray instance),
each step carries the count of the sync fallback's mode (a share while the stages overlap,
1 or every core in the sync windows, settled on the steps' own times in the actor) and the
actor sets it when it differs.

Losing the trainer actor resumes from the last durable commit: when the actor dies, or
does not answer within ``limits.train_timeout_s``, during a step (or while its state is
fetched for a checkpoint), it is killed (a hung one too), the learner is rebuilt in the
driver from the ledger (``build_learner`` at ``buf.version``: nothing of the step in
flight was committed, its lease is still open), a new actor is started with it, its
weights digest is checked against the durable version's, and the same lease is trained
again; each restart is recorded as a ``trainer_restarted`` event (summary
``trainer_restarts``; ``freshroll verify`` checks it names an open lease and the current
version). After :data:`MAX_RESTARTS` restarts in one incarnation the run fails with
:class:`~freshroll.errors.RunFailed` naming the cause (it is resumable as any failed run).
The rebuild runs on the event loop, as the buffer and the ledger it reads are the loop's:
a rare recovery path; the workers' calls in flight go on in their actors meanwhile.

Every wait is bounded and polled in slices of :data:`~freshroll.placement.ray_session.POLL_S`
inside :data:`~freshroll.placement.ray_session._gate` (the discipline of ``RayEngine``), so a
call the run walked away from leaves once ``stop_ray`` begins and never touches a Ray that
is shut down. Timeouts: a step and a state fetch ``limits.train_timeout_s`` (a step is a
forward and backward pass over the whole batch, a different cost from one generate call of
a worker, hence a bound of its own); an actor's start (shipping the learner, loading it)
``limits.worker_start_timeout_s``; kill ``limits.worker_start_timeout_s``. Each of these
is its own wait in the pipeline's :class:`~freshroll.ports.waits.Waits`
(:class:`~freshroll.ports.seams.SaysItsWaits`): ``trainer step 3``, ``trainer actor
restart 1: kill``, ``... : start``, ``trainer step 3 (after restart 1)``, so a heartbeat line
never names a limit that a restart lets the wait run past. The learner's rebuild holds the
event loop (no heartbeat line from the pipeline then); a long replay says its step itself
(:class:`~freshroll.runtime.learner.Heartbeat`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from freshroll.config import Config
from freshroll.engines.weights import RayRef
from freshroll.errors import LineageError, NonFiniteStep, RunFailed, WorkerLost, WorkerTimeout
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.placement.placement import thread_budget
from freshroll.placement.ray_engine import PackedState, pack_state, set_threads
from freshroll.placement.ray_session import _gate, gated_get
from freshroll.ports.seams import TrainerState
from freshroll.ports.threads import AbandonableExecutor
from freshroll.ports.waits import Waits
from freshroll.stage_threads import ThreadCounts
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.replay import train_samples, weights_digest

#: trainer actor restarts per incarnation before the run fails
MAX_RESTARTS = 3


class _TrainerActor:
    """Lives in a Ray worker process: the run's GRPO learner."""

    def __init__(self, learner: GRPOLearner, torch_threads: int) -> None:
        torch.set_num_threads(torch_threads)
        self.learner = learner

    def ready(self) -> tuple[str, int, int]:
        """The weights digest, the process id and the intra-op threads of this actor."""
        return weights_digest(self.learner.model), os.getpid(), torch.get_num_threads()

    def weights(self) -> PackedState:
        return _detached(self.learner)

    def step(self, samples: list[TrainSample], step: int, threads: int | None = None
             ) -> tuple[tuple[dict[str, float], str, float], PackedState]:
        """Step number ``step``: ``((metrics, weights digest, seconds in here), new
        weights)``; the weights are the call's second return object (serialised once, as
        it returns). ``threads``: the step's intra-op threads (None: as they are)."""
        set_threads(threads)
        t0 = time.perf_counter()
        metrics = self.learner.step(samples, step)
        digest = weights_digest(self.learner.model)
        return (metrics, digest, time.perf_counter() - t0), _detached(self.learner)

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.learner.model_state(), self.learner.optimizer.state_dict()


def _detached(learner: GRPOLearner) -> PackedState:
    """The weights to publish, packed as views (:func:`~freshroll.placement.ray_engine.
    pack_state`): serialised as the call returns, before the next step runs (an actor runs
    one call at a time), so no copy is needed."""
    return pack_state(learner.published_state())


@dataclass
class TrainerTimings:
    """What the actor placement costs, measured in the driver (seconds)."""

    step_wall_s: list[float] = field(default_factory=list)  # step() as the driver waits it
    step_actor_s: list[float] = field(default_factory=list)  # the same step inside the actor
    fetch_s: list[float] = field(default_factory=list)  # checkpoint state fetches
    start_s: list[float] = field(default_factory=list)  # ship the learner, actor ready
    rebuild_s: list[float] = field(default_factory=list)  # kill .. new actor ready (restarts)
    rebuild_learner_s: list[float] = field(default_factory=list)  # of which build_learner


#: ``() -> learner at the ledger's durable version`` (build_learner: checkpoint + replay)
Rebuild = Callable[[], GRPOLearner]


class RayTrainer:
    """The GRPO learner in a Ray actor, as an :class:`~freshroll.ports.seams.AsyncTrainer`
    (see module docstring). ``learner`` is shipped to the actor and not used afterwards."""

    def __init__(
        self, learner: GRPOLearner, buf: SampleBuffer, cfg: Config, rebuild: Rebuild,
        before_commit: Callable[[PolicyVersion, TrainerState], None] = lambda v, s: None,
        stream: TextIO = sys.stderr, threads: ThreadCounts | None = None,
    ) -> None:
        import ray

        self._ray, self.buf, self.cfg, self._rebuild = ray, buf, cfg, rebuild
        self._before_commit, self.stream = before_commit, stream
        self.settings_digest = learner.settings_digest
        self.threads = thread_budget(cfg).trainer  # the actor's at its start
        #: each step's intra-op threads (an async run's ModeThreads: the fallback's mode), or
        #: None: the actor's own
        self.counts = threads
        self.timings = TrainerTimings()
        self.restarts = 0
        self.pid = 0  # the actor's process id
        self._pool = AbandonableExecutor("trainer")
        self._actor: Any = None
        self._weights: RayRef | None = None  # the newest version's weights
        self._lease: tuple[Lease, list[TrainSample]] | None = None  # the step just trained
        self._ready: tuple[Any, str, float] | None = None  # (ready ref, digest, t0) of a start
        #: the pipeline's waits (seams.SaysItsWaits): each of this trainer's waits with its bound
        self.waits: Waits | None = None
        self._spawn(learner, wait=False)

    def _waiting(self, what: str, limit_s: float | None) -> AbstractContextManager[None]:
        return self.waits.waiting(what, limit_s) if self.waits is not None else nullcontext()

    # -- the actor ---------------------------------------------------------------------------
    def _spawn(self, learner: GRPOLearner, *, wait: bool = True) -> None:
        """Start an actor with ``learner``; with ``wait``, wait until it answers (else the
        next call waits: the first actor starts while the inference actors do)."""
        ray, rc = self._ray, self.cfg.ray
        t0 = time.perf_counter()
        cls = ray.remote(num_cpus=rc.trainer_cpus, num_gpus=rc.trainer_gpus,
                         max_restarts=0)(_TrainerActor)
        expected = weights_digest(learner.model)
        with _gate.entered():
            self._actor = cls.remote(learner, self.threads)
            self._ready = (self._actor.ready.remote(), expected, t0)
        if wait:
            self._await_ready()

    def _await_ready(self) -> None:
        """Wait for the newest actor's first answer, and check the weights it holds."""
        if self._ready is None:
            return
        ref, expected, t0 = self._ready
        digest, self.pid, _ = self._wait(ref, self.cfg.limits.worker_start_timeout_s,
                                         "ready (learner shipped)", "worker_start_timeout_s")
        self._ready = None
        if digest != expected:
            raise LineageError(f"the trainer actor holds weights {digest}, the driver shipped "
                               f"{expected}")
        self.timings.start_s.append(time.perf_counter() - t0)

    def _wait(self, ref: Any, timeout_s: float, what: str, key: str) -> Any:
        """``ray.get(ref)`` within ``timeout_s``, in slices of POLL_S inside the gate: a dead
        actor is :class:`WorkerLost`, a silent one :class:`WorkerTimeout`; an error raised
        in the actor is raised here (a :class:`NonFiniteStep` as itself)."""
        ray = self._ray
        try:
            return gated_get(ref, timeout_s, "the trainer actor",
                             f"did not answer {what} within {timeout_s:g} s (limits.{key})")
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, NonFiniteStep):
                raise NonFiniteStep(str(cause), recoverable=cause.recoverable) from None
            raise

    def _kill_actor(self) -> None:
        if self._actor is not None:
            with _gate.entered():
                self._ray.kill(self._actor, no_restart=True)

    def _kill(self) -> None:
        """Kill the actor's process as a crash would, and return once Ray reports it dead."""
        actor = self._actor
        self._kill_actor()
        timeout = self.cfg.limits.worker_start_timeout_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the kill travels through Ray's control plane
            try:
                with _gate.entered():
                    ref = actor.ready.remote()
                self._wait(ref, 1.0, "ready", "worker_start_timeout_s")
            except WorkerLost:
                return
            except WorkerTimeout:
                pass
            time.sleep(0.02)
        raise WorkerTimeout(f"the trainer actor still answers {timeout:g} s after ray.kill")

    async def kill(self) -> None:
        """Kill the trainer actor (tests, the chaos harness): the step in flight, or the
        next one, finds it dead and the trainer is rebuilt from the last durable commit."""
        await self._call(self._kill)

    # -- the seam ----------------------------------------------------------------------------
    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        fut = self._pool.submit(fn, *args)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:  # the run ended: the thread leaves within its bound
            self._pool.abandon()
            raise

    def _step(self, samples: list[TrainSample]) -> tuple[dict[str, float], str]:
        self._await_ready()
        threads, timed = self.counts.take() if self.counts is not None else (None, False)
        t0 = time.perf_counter()
        with _gate.entered():
            meta, weights = self._actor.step.options(num_returns=2).remote(
                samples, self._step_no(), threads)
        metrics, digest, inside = self._wait(meta, self.cfg.limits.train_timeout_s,
                                             "a step", "train_timeout_s")
        self._weights = weights  # never fetched here: the workers fetch it
        self.timings.step_wall_s.append(time.perf_counter() - t0)
        self.timings.step_actor_s.append(inside)
        if timed and self.counts is not None and threads is not None:
            self.counts.record(threads, inside, len(samples))
        return metrics, digest

    async def _trained(self, samples: list[TrainSample], what: str) -> tuple[dict[str, float],
                                                                              str]:
        """The actor's start (when one is pending), then the step: each its own wait."""
        lim = self.cfg.limits
        if self._ready is not None:
            with self._waiting("trainer actor start", lim.worker_start_timeout_s):
                await self._call(self._await_ready)
        with self._waiting(what, lim.train_timeout_s):
            result: tuple[dict[str, float], str] = await self._call(self._step, samples)
        return result

    def _step_no(self) -> int:
        return (self.buf.version.step if self.buf.version is not None else 0) + 1

    async def step(self, lease: Lease) -> tuple[dict[str, float], str]:
        samples = train_samples(self.buf, lease.samples, lease.version)
        lost: WorkerLost | WorkerTimeout | None = None
        what = f"trainer step {self._step_no()}"
        while True:
            try:
                if lost is not None:  # a failed restart (the new actor lost too) counts
                    await self._restart(lease, lost)
                    what = f"trainer step {self._step_no()} (after restart {self.restarts})"
                result = await self._trained(samples, what)
            except (WorkerLost, WorkerTimeout) as exc:
                if _gate.closed:  # the run's Ray is shutting down: nothing to restart
                    raise
                lost = exc
                continue
            self._lease = (lease, samples)
            return result

    async def _restart(self, lease: Lease, exc: WorkerLost | WorkerTimeout) -> None:
        """A new actor with the learner at the last durable commit (see module docstring)."""
        reason = "timeout" if isinstance(exc, WorkerTimeout) else "lost"
        if self.restarts >= MAX_RESTARTS:
            raise RunFailed(f"trainer actor {reason} during the step of lease {lease.id}: "
                            f"{exc}; it was restarted {MAX_RESTARTS} times already") from exc
        self.restarts += 1
        version = self.buf.version
        assert version is not None
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.stream.write(
            f"warning: trainer actor {reason} ({first_line}); rebuilding it at the last durable "
            f"commit (step {version.step}) and retrying lease {lease.id} (restart "
            f"{self.restarts} of at most {MAX_RESTARTS})\n")
        self.stream.flush()
        t0 = time.perf_counter()
        lim, k = self.cfg.limits, self.restarts
        with self._waiting(f"trainer actor restart {k}: kill", lim.worker_start_timeout_s):
            await self._call(self._kill_actor)  # a hung actor too
        t1 = time.perf_counter()
        # the buffer and the ledger are the loop's: the loop waits here, and a long replay
        # says its step itself (learner.Heartbeat)
        learner = self._rebuild()
        self.timings.rebuild_learner_s.append(time.perf_counter() - t1)
        if learner.settings_digest != self.settings_digest:
            raise LineageError(f"the rebuilt learner's settings {learner.settings_digest} are "
                               f"not the run's {self.settings_digest}")
        if version.weights_digest is not None:
            got = weights_digest(learner.model)
            if got != version.weights_digest:
                raise LineageError(f"the trainer rebuilt at {version} holds weights {got}")
        with self._waiting(f"trainer actor restart {k}: start", lim.worker_start_timeout_s):
            await self._call(self._spawn, learner)
        del learner
        self._weights = None  # the durable version's weights: the new actor publishes them
        rebuild_s = time.perf_counter() - t0
        self.timings.rebuild_s.append(rebuild_s)
        self.buf.record(ev.TrainerRestarted(
            ts=self.buf.clock.now(), lease=lease.id, version=str(version),
            restart=self.restarts, reason=reason, rebuild_s=rebuild_s, detail=str(exc)[:500]))

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        self._await_ready()
        t0 = time.perf_counter()
        with _gate.entered():
            ref = self._actor.state.remote()
        state: tuple[dict[str, Any], dict[str, Any]] = self._wait(
            ref, self.cfg.limits.train_timeout_s, "its state (checkpoint)", "train_timeout_s")
        self.timings.fetch_s.append(time.perf_counter() - t0)
        return state

    async def before_commit(self, version: PolicyVersion) -> None:
        """The Checkpointer's checkpoint; the state is fetched from the actor only when one is
        due. An actor lost here is rebuilt and the step trained again (same digest)."""
        lost: WorkerLost | WorkerTimeout | None = None
        while True:
            try:
                if lost is not None:
                    assert self._lease is not None
                    lease, samples = self._lease
                    await self._restart(lease, lost)
                    _, digest = await self._trained(
                        samples, f"trainer step {version.step} (again, after restart "
                        f"{self.restarts})")
                    if digest != version.weights_digest:
                        raise LineageError(f"the step of lease {lease.id} trained again gave "
                                           f"weights {digest}, not {version.weights_digest}")
                    lost = None
                with self._waiting(f"evaluation and checkpoint of step {version.step}",
                                   self.cfg.limits.train_timeout_s):
                    await self._call(self._before_commit, version, self._state)
                return
            except (WorkerLost, WorkerTimeout) as exc:
                if _gate.closed:
                    raise
                lost = exc

    def weights(self) -> RayRef:
        """The ``ray.ObjectRef`` of the newest version's weights (a packed state dict:
        :func:`~freshroll.placement.ray_engine.pack_state`)."""
        if self._weights is None:
            with _gate.entered():
                self._weights = self._actor.weights.remote()
        return self._weights

    def close(self) -> None:
        """Stop the actor (before the run's Ray is shut down) and the executor."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._actor is not None and not _gate.closed:
            with contextlib.suppress(WorkerLost):
                self._kill_actor()
            self._actor = None

    def describe(self) -> str:
        """The measured costs of the actor placement, one line (stderr at the run's end)."""
        t = self.timings
        n = len(t.step_wall_s)

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        return (f"trainer actor: {n} steps, step {mean(t.step_wall_s) * 1e3:.1f} ms in the "
                f"driver vs {mean(t.step_actor_s) * 1e3:.1f} ms in the actor, "
                f"{len(t.fetch_s)} checkpoint fetches {mean(t.fetch_s) * 1e3:.1f} ms, start "
                f"{mean(t.start_s):.2f} s, {self.restarts} restarts "
                f"({mean(t.rebuild_s):.2f} s each)")


__all__ = ["MAX_RESTARTS", "RayTrainer", "Rebuild", "TrainerTimings"]

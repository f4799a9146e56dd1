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

Weights travel through Ray's object store once per version: the trainer publishes a
``ray.ObjectRef`` to its state dict, packed as numpy byte views (:func:`pack_state`: written
and read without a pickled copy of each tensor), by ``ray.put`` on the trainer thread
(:func:`ray_publish`) or as the trainer actor's return object; the pipeline hands that same
ref to every worker, and each actor fetches it itself (:meth:`RayEngine.load_weights`; a
plain dict is still accepted and serialised for that call). ``load_weights`` returns the
caller-side wall time, which the pipeline records as ``weights_loaded.transfer_s``; the
actor's own fetch and copy times are kept in :attr:`RayEngine.loads`.

Intra-op threads: an actor starts at ``torch_threads`` (the placement's share of the cores);
with ``follow_threads`` each generate carries its calling thread's count, which the actor
sets before the call when it differs: an async run on a private Ray instance follows the
sync fallback's mode (:func:`~freshroll.placement.placement.follows_mode`), a share of the
cores while the stages overlap, 1 or every core in the sync windows, where the stages take
turns (issue 25: one thread per actor there left a core idle in every stage).

Resources: each inference actor declares ``ray.worker_cpus`` / ``ray.worker_gpus``. A
retired worker's actor is killed and waited for (:meth:`RayEngine.stop`), so its CPUs are
free for the next scale-up.

The Ray instance itself (starting, joining, stopping, the actors freshroll owns and the gate
every Ray call passes) is :mod:`freshroll.placement.ray_session`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freshroll.engines.base import Completion
from freshroll.engines.weights import Publishing, RayRef, StateDict, Weights, state_dict_of
from freshroll.errors import WorkerLost, WorkerTimeout
from freshroll.placement.ray_session import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from freshroll.placement.ray_session import POLL_S as POLL_S
from freshroll.placement.ray_session import _gate, track, untrack
from freshroll.placement.ray_session import gated_get as gated_get
from freshroll.placement.ray_session import joined as joined
from freshroll.placement.ray_session import live_actors as live_actors
from freshroll.placement.ray_session import probe_address as probe_address
from freshroll.placement.ray_session import split_address as split_address
from freshroll.placement.ray_session import start_ray as start_ray
from freshroll.placement.ray_session import stop_ray as stop_ray

if TYPE_CHECKING:  # reward actors import this module and need no torch (seconds of import)
    import torch

class _EngineActor:
    """Lives in a Ray worker process: one HFEngine on a local model directory."""

    def __init__(self, path: str, torch_threads: int) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        from freshroll.engines.hf import HFEngine
        from freshroll.engines.model_dir import quiet_transformers

        quiet_transformers()
        self.engine = HFEngine.from_pretrained(path)

    def generate(self, prompts: Sequence[str], kwargs: dict[str, Any],
                 threads: int | None = None) -> list[Completion]:
        """One lock-step call; ``threads``: the call's intra-op threads (None: as they are),
        set only on a change (:class:`RayEngine`'s ``follow_threads``)."""
        set_threads(threads)
        return self.engine.generate(prompts, **kwargs)

    def load_weights(self, weights: list[RayRef | StateDict]) -> tuple[float, float]:
        """``weights``: ``[ObjectRef]`` (fetched here from the object store: wrapped in a
        list so that Ray does not resolve it before the call and the fetch is timed here) or
        ``[dict]``; returns this actor's ``(fetch_s, copy_s)``."""
        import ray

        t0 = time.perf_counter()
        (state,) = weights
        if isinstance(state, ray.ObjectRef):
            state = unpack_state(ray.get(state))
        fetch_s = time.perf_counter() - t0
        return fetch_s, self.engine.load_weights(state)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()

    def ready(self) -> bool:
        return True


def set_threads(threads: int | None) -> None:
    """In an actor: ``torch.set_num_threads(threads)`` when it differs (None: unchanged)."""
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


#: a state dict as the object store holds it (:func:`pack_state`): name -> (dtype, shape,
#: the tensor's bytes as a flat uint8 numpy array)
PackedState = dict[str, tuple[str, tuple[int, ...], Any]]


def pack_state(state: StateDict) -> PackedState:
    """``state``'s tensors as numpy byte views (no copy of a contiguous CPU tensor), which
    Ray writes into the object store as out-of-band buffers and a reader maps without a
    copy (:func:`unpack_state`). Pickled as tensors, the 1.06M-parameter model's 4.2 MB took
    about twice as long to write and to read (measured: 9.7 against 4.3 ms to return from an
    actor, 4.7 against 2.2 ms to load, on the 2-core machine). Any dtype (bfloat16 has no
    numpy type): its name travels beside the bytes."""
    import torch

    packed: PackedState = {}
    for name, t in state.items():
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        packed[name] = (str(t.dtype).removeprefix("torch."), tuple(t.shape),
                        flat.view(torch.uint8).numpy())
    return packed


def unpack_state(packed: PackedState) -> StateDict:
    """The tensors of :func:`pack_state`, as read-only views of the object store's memory
    (the engine copies them into its model)."""
    import warnings

    import torch

    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # read-only: the engine only copies from them
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, (dtype, shape, data) in packed.items():
            out[name] = torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
    return out


def ray_publish(learner: Publishing) -> RayRef:
    """``ray.trainer: driver``: the learner's weights put in the object store once per
    version (on the trainer thread, by :class:`RayPut`; ``ray.put`` copies them there, so
    the learner's own tensors are packed: :func:`pack_state`); every worker's
    :meth:`RayEngine.load_weights` gets the same ref."""
    import ray

    with _gate.entered():
        return ray.put(pack_state(learner.published_state()))


class RayPut:
    """``ray.trainer: driver``'s :class:`~freshroll.engines.weights.WeightTransfer`."""

    def publish(self, learner: Publishing) -> RayRef:
        return ray_publish(learner)


@dataclass(frozen=True, slots=True)
class LoadStats:
    """One weight load of a :class:`RayEngine`: the caller's wall time, and the actor's own
    fetch (object store -> its process) and copy (into the model) times."""

    caller_s: float
    fetch_s: float
    copy_s: float


class RayEngine:
    """A blocking proxy to an engine in a Ray actor (see module docstring)."""

    #: it loads the Ray placement's publication (an ObjectRef) itself
    #: (:class:`~freshroll.engines.weights.TakesPublication`)
    takes_publication = True

    def __init__(
        self, path: Path, *, torch_threads: int = 1, generate_timeout_s: float = 600.0,
        weights_timeout_s: float = 300.0, start_timeout_s: float = 300.0,
        num_cpus: float = 1.0, num_gpus: float = 0.0, follow_threads: bool = False,
    ) -> None:
        import ray

        self._ray, self._path, self._threads = ray, str(path), torch_threads
        #: each generate at its calling thread's intra-op count, which
        #: :func:`~freshroll.placement.adapters.tuned` set for the call (an async run's
        #: :class:`~freshroll.stage_threads.ModeThreads`: a share while async, 1 or every
        #: core in the sync fallback's windows); the actor sets it when it differs
        self.follow_threads = follow_threads
        self.generate_timeout_s, self.weights_timeout_s = generate_timeout_s, weights_timeout_s
        self.start_timeout_s = start_timeout_s
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.incarnation = 0  # +1 per restart: a late close of an older one must not stop it
        self.loads: list[LoadStats] = []  # every weight load through this proxy, in order
        #: each generate call's seconds in the caller beyond the actor's own generation
        self.round_trips: list[float] = []
        self._actor = self._spawn()

    def _spawn(self) -> Any:
        actor_cls = self._ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                     max_restarts=0)(_EngineActor)
        with _gate.entered():
            return track(actor_cls.remote(self._path, self._threads))

    @property
    def actor_id(self) -> str:
        """The Ray id of the current actor (as ``ray.util.state.list_actors`` shows it)."""
        return str(self._actor._actor_id.hex())

    def _call(self, method: str, *args: Any, timeout_s: float, what: str) -> Any:
        """Call the actor's ``method`` and wait for it with a timeout: a dead actor is
        :class:`WorkerLost`, one that does not answer within ``timeout_s`` is
        :class:`WorkerTimeout` (both retryable); waits in slices of :data:`POLL_S`, and
        leaves with WorkerLost once :func:`stop_ray` began (:class:`_Gate`)."""
        ray = self._ray
        with _gate.entered():
            ref = getattr(self._actor, method).remote(*args)
            try:
                return gated_get(ref, timeout_s, "inference actor",
                                 f"did not answer {what} within {timeout_s:g} s")
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, ray.exceptions.ObjectLostError):
                    raise WorkerLost(  # e.g. the trainer actor that put them died
                        "the published weights are gone from Ray's object store (their "
                        f"owner died?): {exc.cause}"[:500]) from exc
                raise

    def _kill_actor(self) -> None:
        untrack(self._actor)
        with _gate.entered():
            self._ray.kill(self._actor, no_restart=True)

    def kill(self) -> None:
        """Kill the actor's process, as a crash would (``ray.kill``, no restart), and return
        once Ray reports it dead: a call in flight (unless it finished first) and every later
        one fail with :class:`WorkerLost`, until :meth:`restart`. The chaos harness's real
        ``kill_worker`` fault (:mod:`freshroll.chaos`)."""
        self._kill_actor()
        self._wait_dead(self.start_timeout_s)

    def _wait_dead(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # the kill travels through Ray's control plane
            try:
                self._call("ready", timeout_s=1.0, what="ready")
            except WorkerLost:
                return
            except WorkerTimeout:
                pass
            time.sleep(0.02)
        raise WorkerTimeout(f"inference actor still answers {timeout_s:g} s after ray.kill")

    def restart(self) -> None:
        """A fresh actor on the initial model (the caller re-sends the current weights)."""
        self.incarnation += 1
        self._kill_actor()
        self._actor = self._spawn()
        self.wait_ready()

    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 1.0,
        top_p: float = 1.0, seed: int | None = None, **sampling: float,
    ) -> list[Completion]:
        """``sampling``: TRL's knobs where set, passed on to the actor's engine."""
        kwargs = {"max_new_tokens": max_new_tokens, "temperature": temperature,
                  "top_p": top_p, "seed": seed, **sampling}
        threads = _calling_threads() if self.follow_threads else None
        t0 = time.perf_counter()
        result: list[Completion] = self._call(
            "generate", list(prompts), kwargs, threads, timeout_s=self.generate_timeout_s,
            what="generate")
        if result:  # the round trip: the caller's seconds beyond the actor's generation
            self.round_trips.append(time.perf_counter() - t0 - result[0].gen_s)
        return result

    def load_weights(self, weights: Weights) -> float:
        """Install ``weights``: a ``ray.ObjectRef`` to a state dict (the run's publication:
        put once per version, fetched by the actor itself) or a plain mapping (serialised
        for this call); returns the caller-side seconds (the pool records them as
        ``weights_loaded.transfer_s``), the actor's own times in :attr:`loads`."""
        from ray import ObjectRef

        t0 = time.perf_counter()
        sent: RayRef | StateDict = (weights if isinstance(weights, ObjectRef)
                                    else dict(state_dict_of(weights, "a Ray worker")))
        fetch_s, copy_s = self._call("load_weights", [sent],
                                     timeout_s=self.weights_timeout_s, what="load_weights")
        caller_s = time.perf_counter() - t0
        self.loads.append(LoadStats(caller_s, float(fetch_s), float(copy_s)))
        return caller_s

    def state_dict(self) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self._call(
            "state_dict", timeout_s=self.weights_timeout_s, what="state_dict")
        return result

    def wait_ready(self) -> None:
        """Block until the actor has started and loaded its model (setup is not run time)."""
        self._call("ready", timeout_s=self.start_timeout_s, what="ready (model load)")

    def stop(self) -> None:
        """End the actor (a retired or closed worker) and return once Ray reports it dead,
        so its CPUs are free for the next actor (waits at most :data:`STOP_WAIT_S`)."""
        self._kill_actor()
        with contextlib.suppress(WorkerTimeout, WorkerLost):
            self._wait_dead(STOP_WAIT_S)


def costs_line(engines: Sequence[object], trainer: object) -> str:
    """What the Ray placement cost per step beyond the compute, measured by the proxies
    (a run's last lines on one machine, where Ray has only costs: issue 25): each generate
    call's round trip, each weight load, the trainer actor's step in the driver against
    in the actor; "" when nothing was measured."""
    import statistics

    trips = [x for e in engines if isinstance(e, RayEngine) for x in e.round_trips]
    loads = [x for e in engines if isinstance(e, RayEngine) for x in e.loads]
    parts = []
    if trips:
        parts.append(f"generate round trip {statistics.median(trips) * 1e3:.1f} ms")
    if loads:
        parts.append(f"weights {statistics.median(x.caller_s for x in loads) * 1e3:.1f} ms a "
                     f"load (fetch {statistics.median(x.fetch_s for x in loads) * 1e3:.1f}, "
                     f"copy {statistics.median(x.copy_s for x in loads) * 1e3:.1f} in the "
                     "actor)")
    timings = getattr(trainer, "timings", None)
    walls, inside = getattr(timings, "step_wall_s", []), getattr(timings, "step_actor_s", [])
    if walls and inside:
        wall, actor = statistics.median(walls), statistics.median(inside)
        parts.append(f"trainer step {wall * 1e3:.1f} ms in the driver, {actor * 1e3:.1f} in "
                     f"its actor ({(wall - actor) * 1e3:.1f} ms round trip)")
    if not parts:
        return ""
    return "ray placement, per step (medians): " + "; ".join(parts)


def _calling_threads() -> int:
    import torch

    return torch.get_num_threads()


#: how long :meth:`RayEngine.stop` waits for Ray to report the killed actor dead
STOP_WAIT_S = 8.0

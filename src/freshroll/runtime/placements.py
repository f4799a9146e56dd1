"""Placements as a registry: what a run builds for its ``(rollout.engine, run.runtime)``.

:func:`build_components` looks the pair up in :data:`PLACEMENTS` (``run.runtime`` resolved
first: :func:`engine_runtime`) and calls its builder, which returns what the pipeline awaits
(:mod:`freshroll.ports.seams`: the engine factory, the scorer, the trainer) and pushes
every release it owes onto the run's one :class:`contextlib.ExitStack`, in the order it
acquired them. :attr:`Components.close` unwinds that stack: the last thing acquired is
released first, and a builder that fails part-way releases what it had (no scattered
``stop_ray()``, no hand-written close per pairing)::

    (sim,  inline)    freshroll.sim's latency model: engines, scorer and trainer on the
                      run's clock, no model
    (hf,   inline)    HF engines on threads of this process, weights published as a copy
    (hf,   process)   each worker an HF engine in a child process, weights once per version
                      in a shared-memory slot (:class:`~freshroll.placement.shm_weights.
                      WeightChannel`, unlinked at the end)
    (hf,   ray)       engines (and the trainer, the reward actors) as Ray actors on a private
                      Ray instance (or ``run.ray_address``), weights once per version in the
                      object store; Ray stopped at the end
    (vllm, inline)    one vLLM engine per worker (it manages its own concurrency)

The hf and vLLM placements share the learner (at the ledger's version: checkpoint + replay,
:mod:`freshroll.runtime.learner`), the reward set behind a thread adapter and the trainer
(:func:`build_trainer`). A new placement is a builder and one :func:`register_placement`
(docs/architecture.md, "Adding a placement").
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from freshroll.clock import Clock
from freshroll.config import Config
from freshroll.engines.base import InferenceEngine, Stoppable
from freshroll.engines.seams import EngineFactory
from freshroll.engines.specs import engine_spec, register_engine
from freshroll.errors import ConfigError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.hooks import Hooks
from freshroll.placement.placement import (
    Placement,
    Runtime,
    ray_trainer,
    resolve_runtime,
    thread_budget,
)
from freshroll.ports.seams import AsyncScorer, AsyncTrainer, TrainerState
from freshroll.runtime.prepare import Prepared
from freshroll.stage_threads import ThreadCounts

if TYPE_CHECKING:  # imported where a model's placement is built: a simulated run has no torch
    from freshroll.placement.adapters import (
        Publish,
        ThreadEngineFactory,
        ThreadScorer,
        ThreadTrainer,
    )
    from freshroll.placement.ray_scorer import RayScorer
    from freshroll.placement.ray_trainer import RayTrainer
    from freshroll.placement.shm_weights import WeightChannel
    from freshroll.runtime.trainer_group import RestartingTrainer
    from freshroll.trainer.checkpoint import WriteShards
    from freshroll.trainer.grpo import GRPOLearner


@dataclass
class Components:
    """What the pipeline awaits (:mod:`freshroll.ports.seams`), and how to release it."""

    engine_factory: EngineFactory
    scorer: AsyncScorer
    trainer: AsyncTrainer
    close: Callable[[], None]


class ChaosSession(Protocol):
    """What :func:`freshroll.runtime.run.run` accepts as ``chaos``: it wraps the run's parts
    (once, after the buffer is open) and gives the pipeline its hooks
    (:class:`~freshroll.pipeline.hooks.Hooks`)."""

    hooks: Hooks

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        ...


#: ``(cfg, model path, worker name) -> engine``: what the hf engine factory calls on a thread
MakeEngine = Callable[[Config, Path, str], InferenceEngine]


@dataclass(frozen=True)
class Build:
    """What a placement's builder builds from."""

    prep: Prepared
    buf: SampleBuffer
    out: Path
    before_commit: Callable[[PolicyVersion, TrainerState], None]
    clock: Clock
    make_engine: MakeEngine | None = None  # an injected in-process engine (tests' fakes)
    placement: Placement | None = None  # threads per stage, the compute thread, modes

    @property
    def cfg(self) -> Config:
        return self.prep.cfg


#: a builder: the engine factory, scorer and trainer; each release pushed onto the stack
Builder = Callable[[Build, ExitStack], tuple[EngineFactory, AsyncScorer, AsyncTrainer]]

#: ``(rollout.engine, run.runtime) -> builder`` (module docstring)
PLACEMENTS: dict[tuple[str, Runtime], Builder] = {}


def register_placement(engine: str, runtime: Runtime) -> Callable[[Builder], Builder]:
    """Register ``builder`` as the placement of ``(engine, runtime)`` (decorator)."""
    def register(builder: Builder) -> Builder:
        if (engine, runtime) in PLACEMENTS:
            raise ValueError(f"placement ({engine}, {runtime}) is registered already")
        PLACEMENTS[(engine, runtime)] = builder
        register_engine(engine, runtime)  # rollout.engine may name it (its spec)
        return builder
    return register


def engine_runtime(cfg: Config, injected: bool = False) -> Runtime:
    """Where the workers' engines run: :func:`resolve_runtime` for an engine freshroll places
    (hf), its one place for the engines that manage their own concurrency (engine spec); an
    injected ``make_engine`` is an in-process engine, so ``auto`` resolves to inline for it
    and an explicit other placement is refused."""
    spec = engine_spec(cfg.rollout.engine)
    runtime = spec.placements[0] if spec.own_concurrency else resolve_runtime(cfg)
    if injected and runtime != "inline":
        if cfg.run.runtime != "auto":
            raise ConfigError(f"run.runtime: {cfg.run.runtime} places engines itself; an "
                              "injected make_engine runs in this process (inline or auto)")
        runtime = "inline"
    return runtime


def build_components(
    prep: Prepared, buf: SampleBuffer, out: Path,
    before_commit: Callable[[PolicyVersion, TrainerState], None], clock: Clock,
    make_engine: MakeEngine | None = None, placement: Placement | None = None,
) -> Components:
    """The components of ``prep``'s run from its registered placement (module docstring);
    ``close`` releases everything the builder acquired, last first."""
    key = (prep.cfg.rollout.engine, engine_runtime(prep.cfg, injected=make_engine is not None))
    builder = PLACEMENTS.get(key)
    if builder is None:
        raise ConfigError(f"rollout.engine {key[0]} with run.runtime {key[1]}: no such "
                          f"placement (registered: {', '.join(map(str, sorted(PLACEMENTS)))})")
    stack = ExitStack()
    with contextlib.ExitStack() as on_error:
        on_error.callback(stack.close)  # a builder that fails releases what it had
        factory, scorer, trainer = builder(
            Build(prep, buf, out, before_commit, clock, make_engine, placement), stack)
        on_error.pop_all()
    return Components(factory, scorer, trainer, stack.close)


# -- the placements --------------------------------------------------------------------------

@register_placement("sim", "inline")
def _sim(b: Build, stack: ExitStack) -> tuple[EngineFactory, AsyncScorer, AsyncTrainer]:
    from freshroll.sim.components import build_sim

    parts = build_sim(b.cfg, b.clock, b.buf)
    close = getattr(parts, "close", None)
    if callable(close):
        stack.callback(close)
    return parts.engine_factory, parts.scorer, parts.trainer


@register_placement("hf", "inline")
def _hf_inline(b: Build, stack: ExitStack) -> tuple[EngineFactory, AsyncScorer, AsyncTrainer]:
    from freshroll.placement.adapters import CloneTransfer
    from freshroll.runtime.learner import build_learner

    learner = build_learner(b.cfg, b.prep.model_path, b.buf, b.out, b.prep.history)
    scorer = _scorer(b, stack)
    trainer = _trainer(b, stack, learner, CloneTransfer())
    return _engines(b, "inline", None), scorer, trainer


@register_placement("hf", "process")
def _hf_process(b: Build, stack: ExitStack) -> tuple[EngineFactory, AsyncScorer, AsyncTrainer]:
    from freshroll.placement.shm_weights import WeightChannel
    from freshroll.runtime.learner import build_learner

    learner = build_learner(b.cfg, b.prep.model_path, b.buf, b.out, b.prep.history)
    # weights once per version into shared memory (unlinked at close)
    channel = WeightChannel.create(learner.published_state(),
                                   wait_s=b.cfg.limits.weights_timeout_s + 5.0, run_dir=b.out)
    stack.callback(channel.close)
    scorer = _scorer(b, stack)
    trainer = _trainer(b, stack, learner, channel)
    factory = _engines(b, "process", channel)

    def stop_children() -> None:  # the pool stopped them; a crashed run may not have
        for engine in factory.engines.values():
            if isinstance(engine, Stoppable):
                with contextlib.suppress(Exception):
                    engine.stop()

    stack.callback(stop_children)
    return factory, scorer, trainer


@register_placement("hf", "ray")
def _hf_ray(b: Build, stack: ExitStack) -> tuple[EngineFactory, AsyncScorer, AsyncTrainer]:
    from freshroll.placement.ray_engine import RayPut
    from freshroll.placement.ray_session import start_ray, stop_ray
    from freshroll.runtime.learner import build_learner

    learner = build_learner(b.cfg, b.prep.model_path, b.buf, b.out, b.prep.history)
    # private: in RUN_DIR/ray.json
    start_ray(num_cpus=ray_cpus(b.cfg), run_dir=b.out, address=b.cfg.run.ray_address)
    stack.callback(stop_ray)
    scorer = _scorer(b, stack, ray=True)  # e.g. a node's reward version differs: Ray stopped
    # once per version in the object store, one ref for all
    trainer = _trainer(b, stack, learner, RayPut())
    factory = _engines(b, "ray", None)
    if b.cfg.run.progress:  # what Ray cost per step, said as the run closes (before Ray stops)
        stack.callback(_say_ray_costs, factory, trainer)
    return factory, scorer, trainer


def _say_ray_costs(factory: ThreadEngineFactory, trainer: object) -> None:
    from freshroll.placement.ray_engine import costs_line

    line = costs_line(list(factory.engines.values()), trainer)
    if line:
        sys.stderr.write(line + "\n")


@register_placement("vllm", "inline")
def _vllm(b: Build, stack: ExitStack) -> tuple[EngineFactory, AsyncScorer, AsyncTrainer]:
    from freshroll.engines.vllm_args import in_force
    from freshroll.engines.vllm_engine import VLLMEngineFactory
    from freshroll.placement.adapters import CloneTransfer
    from freshroll.runtime.learner import build_learner

    learner = build_learner(b.cfg, b.prep.model_path, b.buf, b.out, b.prep.history)
    scorer = _scorer(b, stack)
    trainer = _trainer(b, stack, learner, CloneTransfer())
    engines = VLLMEngineFactory(b.prep.model_path, in_force(b.cfg), seed=b.cfg.run.seed)
    stack.callback(engines.kill_all)  # the pool closed them; a run that crashed may not have
    return engines, scorer, trainer


# -- shared parts ----------------------------------------------------------------------------

def _scorer(b: Build, stack: ExitStack, ray: bool = False) -> ThreadScorer | RayScorer:
    """The reward set on a thread; under Ray ``ray.reward_actors`` reward actors (each its
    own RewardSet, built from the config), or the driver's with ``reward_actors: 0``."""
    if ray and b.cfg.ray.reward_actors > 0:
        from freshroll.placement.ray_scorer import RayScorer

        actors = RayScorer(b.cfg, b.prep.rewards)
        stack.callback(actors.close)
        return actors
    from freshroll.placement.adapters import ThreadScorer

    inline = ThreadScorer(b.prep.rewards)
    stack.callback(inline.close)
    return inline


def _trainer(b: Build, stack: ExitStack, learner: GRPOLearner,
             publish: Publish) -> ThreadTrainer | RayTrainer | RestartingTrainer:
    from freshroll.runtime.trainer_group import restarting

    stack.callback(learner.ranks.close)  # trainer.parallel's other ranks, after the trainer
    trainer = build_trainer(b.prep, b.buf, b.out, learner, b.before_commit, publish,
                            b.placement)
    stack.callback(trainer.close)
    return restarting(trainer, learner, b.buf)  # a group's lost rank: restarted, bounded


def _engines(b: Build, runtime: Runtime, channel: WeightChannel | None) -> ThreadEngineFactory:
    """The hf workers' engine factory: ``make_engine`` (injected) or :func:`build_engine`,
    with the placement's thread counts, compute thread and modes."""
    from freshroll.placement.adapters import ThreadEngineFactory

    cfg, path, p = b.cfg, b.prep.model_path, b.placement

    def default_make(c: Config, mp: Path, n: str) -> InferenceEngine:  # looked up at call time
        return build_engine(c, mp, n, channel, p.stage("generate") if p else None)

    make = b.make_engine or default_make
    return ThreadEngineFactory(
        lambda name: make(cfg, path, name), cfg.limits, serial=runtime == "inline",
        threads=p.stage("generate") if p is not None else None,
        pool=p.compute if p is not None and p.modes is None else None,
        modes=p.modes if p is not None else None)


def build_engine(cfg: Config, path: Path, name: str, channel: WeightChannel | None = None,
                 threads: ThreadCounts | None = None) -> InferenceEngine:
    """The blocking engine of worker ``name``: in this process (inline), in a child process
    reading weights from ``channel`` (process) or in a Ray actor (ray). Called on a thread by
    the engine factory, once per worker (a replacement restarts it instead)."""
    runtime = resolve_runtime(cfg)
    if runtime == "process":
        from freshroll.placement.process_engine import ProcessEngine

        lim = cfg.limits
        child = ProcessEngine(path, channel=channel, torch_threads=thread_budget(cfg).worker,
                              follow_threads=threads is not None,
                              generate_timeout_s=lim.generate_timeout_s,
                              weights_timeout_s=lim.weights_timeout_s,
                              start_timeout_s=lim.worker_start_timeout_s)
        try:
            child.wait_ready()
        except BaseException:
            child.stop()
            raise
        return child  # type: ignore[return-value]  # the engine protocol, duck-typed
    if runtime == "ray":
        from freshroll.placement.ray_engine import RayEngine
        from freshroll.placement.ray_session import start_ray

        start_ray(num_cpus=ray_cpus(cfg), address=cfg.run.ray_address)  # no-op if started
        lim = cfg.limits
        actor = RayEngine(path, torch_threads=thread_budget(cfg).worker,
                          generate_timeout_s=lim.generate_timeout_s,
                          weights_timeout_s=lim.weights_timeout_s,
                          start_timeout_s=lim.worker_start_timeout_s,
                          num_cpus=cfg.ray.worker_cpus, num_gpus=cfg.ray.worker_gpus,
                          follow_threads=threads is not None)
        actor.wait_ready()
        return actor
    from freshroll.engines.hf import HFEngine  # transformers: only when a model is loaded

    return HFEngine.from_pretrained(path, on_update=cfg.rollout.on_update)


def ray_cpus(cfg: Config) -> int:
    """The logical CPUs of a private Ray instance: enough for every actor the run may have
    at once (the most workers, the reward actors, the trainer actor), at least 2."""
    r = cfg.ray
    workers = max(cfg.rollout.workers, cfg.control.max_workers or 0)
    need = workers * r.worker_cpus + r.reward_actors * r.reward_cpus
    place = ray_trainer(cfg, "ray")
    if place is not None and place[0] == "actor":
        need += r.trainer_cpus
    return max(2, math.ceil(need))


class LearnerState:
    """The checkpoint state of a learner in this process (a :data:`TrainerState`); its
    ``shards``: under ``trainer.parallel: fsdp`` what writes every rank's shard of a sharded
    checkpoint (trainer/fsdp.py), else None (a whole checkpoint from the state)."""

    def __init__(self, learner: GRPOLearner) -> None:
        self.learner = learner

    def __call__(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.learner.model_state(), self.learner.optimizer.state_dict()

    @property
    def shards(self) -> WriteShards | None:
        from freshroll.trainer.fsdp import Sharded

        learner, ranks = self.learner, self.learner.ranks
        if not isinstance(ranks, Sharded):
            return None
        return lambda path: ranks.write_shards(learner, path)


def learner_state(learner: GRPOLearner) -> TrainerState:
    """The checkpoint state of a learner in this process (:class:`LearnerState`)."""
    return LearnerState(learner)


def build_trainer(
    prep: Prepared, buf: SampleBuffer, out: Path, learner: GRPOLearner,
    before_commit: Callable[[PolicyVersion, TrainerState], None], publish: Publish,
    stages: Placement | None = None,
) -> ThreadTrainer | RayTrainer:
    """The trainer of an hf or vLLM run: under ``run.runtime: ray`` where ``ray.trainer``
    puts it in an actor (:func:`~freshroll.placement.placement.ray_trainer`) a
    :class:`~freshroll.placement.ray_trainer.RayTrainer` (``learner`` is shipped to its
    actor; rebuilt at the last durable commit if the actor is lost); in the driver a
    ThreadTrainer publishing each version once into Ray's object store; else a
    ThreadTrainer publishing with the placement's ``publish`` (a copy inline, a shared-memory
    slot for process workers)."""
    from freshroll.placement.adapters import ThreadTrainer
    from freshroll.placement.ray_trainer import RayTrainer
    from freshroll.runtime.learner import build_learner

    cfg = prep.cfg
    place = ray_trainer(cfg, resolve_runtime(cfg))
    if place is not None and place[0] == "actor":
        def rebuild() -> GRPOLearner:
            return build_learner(cfg, prep.model_path, buf, out, prep.history, quiet=True)

        return RayTrainer(learner, buf, cfg, rebuild, before_commit,
                          threads=stages.stage("train") if stages is not None else None)
    state = learner_state(learner)
    return ThreadTrainer(learner, buf, lambda v: before_commit(v, state), transfer=publish,
                         timeout_s=cfg.limits.train_timeout_s,
                         threads=stages.stage("train") if stages is not None else None,
                         pool=stages.compute if stages is not None else None)


__all__ = [
    "PLACEMENTS",
    "Build",
    "Builder",
    "ChaosSession",
    "Components",
    "MakeEngine",
    "build_components",
    "build_engine",
    "build_trainer",
    "engine_runtime",
    "learner_state",
    "ray_cpus",
    "register_placement",
]

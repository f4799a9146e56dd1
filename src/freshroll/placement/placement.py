"""Where a run's compute runs, and how many intra-op threads each compute process gets.

``run.runtime`` places the inference workers (and, under Ray, the reward stage and the
trainer): ``inline`` (threads of the driver), ``process`` (one child process per worker,
weights in shared memory: :mod:`freshroll.placement.process_engine`) or ``ray`` (actors:
:mod:`freshroll.placement.ray_engine`). ``auto`` resolves to the placement measured best for
the run's shape (docs/overlap.md): :func:`resolve_runtime`.

``run.torch_threads: auto`` sets every compute process's intra-op threads from the cores
this process may use (its CPU affinity and the cgroup's CPU quota), shared among the
compute threads that run at once (the trainer and each worker), never below one:
:func:`thread_budget`. Oversubscribing the cores (two processes with two threads each on a
two-core machine) costs more than the threads win on the small ops of these models.

Whether intra-op threads pay at all depends on the model and the load, so a run whose
``run.torch_threads`` is ``auto`` measures it first (:mod:`freshroll.placement.thread_probe`)
and :func:`plan` settles both ``auto`` settings on the measurement: where threads pay, every
stage runs in one process on all the cores (sync and async alike); where they do not, one
thread per compute process, generation in a process of its own for an async run.
:func:`settled` is the config with both settings made explicit, which the run then uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from freshroll.config import Config
from freshroll.engines.specs import engine_spec
from freshroll.errors import ConfigError
from freshroll.ports.threads import ModeGroup, SharedExecutor
from freshroll.procs import available_cores
from freshroll.stage_threads import ModeThreads, StageThreads, ThreadCounts

if TYPE_CHECKING:
    from freshroll.placement.thread_probe import ThreadProbe

Runtime = Literal["inline", "process", "ray"]


def resolve_runtime(cfg: Config) -> Runtime:
    """The placement of ``cfg``'s workers: ``run.runtime``, with ``auto`` resolved
    (:func:`auto_runtime`)."""
    rt = cfg.run.runtime
    if rt != "auto":
        return rt
    return auto_runtime(cfg)[0]


def auto_runtime(cfg: Config, cores: int | None = None) -> tuple[Runtime, str]:
    """What ``run.runtime: auto`` resolves to, and why (printed in the start line)::

        process  if rollout.engine == "hf" and max_staleness > 0 and cores >= 2
                    (measured: docs/overlap.md)
        inline   otherwise (sim and vLLM engines manage their own concurrency; a sync run
                 never overlaps generation with training; one core has nothing to overlap)
    """
    spec = engine_spec(cfg.rollout.engine)
    if spec.own_concurrency:
        return spec.placements[0], f"the {spec.name} engine manages its own concurrency"
    if cfg.run.max_staleness == 0:
        return "inline", "sync: generation and training never overlap"
    cores = available_cores() if cores is None else cores
    if cores < 2:
        return "inline", "one core: nothing to overlap"
    return "process", "async hf on >= 2 cores: generation beside the trainer, off its GIL"


TrainerPlace = Literal["actor", "driver"]


def trainer_place(cfg: Config) -> tuple[TrainerPlace, str]:
    """Where a ``run.runtime: ray`` run's trainer runs, and why (the start line)::

        ray.trainer                     when actor or driver
        actor   if run.ray_address is set or ray.trainer_gpus > 0     (auto)
        driver  otherwise: a private Ray instance on this machine      (auto)

    A trainer actor costs a round trip a step on the trainer's critical path (the batch in,
    the new weights out) and buys an in-run restart when its process alone dies. On a
    private instance it shares this machine with the driver, so it isolates no machine loss,
    and a crash of the driver's trainer resumes from the last durable commit (``--resume``)
    like any crash; there the trainer in the driver measured closer to the best placement
    than the actor (docs/ray.md, "Where the trainer runs"; docs/benchmarks.md,
    "`run.runtime: ray` against the best placement"). On a cluster the trainer's resources
    are the scheduler's to place (a GPU, another node), so there it is an actor.
    """
    if cfg.ray.trainer != "auto":
        return cfg.ray.trainer, "ray.trainer"
    if cfg.run.ray_address is not None:
        return "actor", "auto: a Ray cluster places it (run.ray_address)"
    if cfg.ray.trainer_gpus > 0:
        return "actor", "auto: it declares GPUs (ray.trainer_gpus)"
    return "driver", "auto: a private Ray instance, where an actor's round trip buys nothing"


def ray_trainer(cfg: Config, runtime: Runtime) -> tuple[TrainerPlace, str] | None:
    """Where the trainer of a run placed on ``runtime`` runs under Ray (:func:`trainer_place`),
    or None: not a Ray run, or a vLLM one (its engines are Ray's; its trainer the driver's)."""
    if runtime != "ray" or engine_spec(cfg.rollout.engine).own_concurrency:
        return None
    return trainer_place(cfg)


def check_world_size(cfg: Config, cores: int | None = None) -> None:
    """``trainer.world_size`` ranks must fit where the trainer is placed: one process and
    one core each on this machine (gloo on CPU, one intra-op thread per rank), beside a
    trainer in this process (not a Ray trainer actor, which holds one learner), with a model
    to train (not the simulated cluster). A :class:`ConfigError` naming the field, before
    any write."""
    world = cfg.trainer.world_size
    if world == 1:
        return
    if not engine_spec(cfg.rollout.engine).trains:
        raise ConfigError(f"trainer.world_size: {world} needs a model to train; the simulated "
                          "cluster (rollout.engine: sim) trains nothing: set "
                          "trainer.world_size=1")
    place = ray_trainer(cfg, resolve_runtime(cfg))
    if place is not None and place[0] == "actor":
        raise ConfigError(f"trainer.world_size: {world} ranks run beside the driver; a Ray "
                          f"trainer actor ({place[1]}) holds one learner: set ray.trainer="
                          "driver or trainer.world_size=1")
    cores = available_cores() if cores is None else cores
    if world > cores:
        raise ConfigError(f"trainer.world_size: {world} ranks need a core each, and this "
                          f"process may use {cores}: set trainer.world_size <= {cores}")


@dataclass(frozen=True, slots=True)
class ThreadBudget:
    """Intra-op threads per compute process (or thread, inline) of a run."""

    cores: int
    runtime: Runtime
    trainer: int  # the trainer's process (inline: the whole driver: it is process-wide)
    worker: int  # each inference worker's process (inline: same as trainer)
    auto: bool

    def describe(self) -> str:
        how = "auto" if self.auto else "run.torch_threads"
        if self.runtime == "inline":
            return f"torch threads {self.trainer} ({how}, {self.cores} cores)"
        return (f"torch threads: trainer {self.trainer}, each worker {self.worker} "
                f"({how}, {self.cores} cores)")


def thread_budget(cfg: Config, cores: int | None = None) -> ThreadBudget:
    """The thread budget of ``cfg``'s run on ``cores`` (default :func:`available_cores`):
    ``run.torch_threads`` when set, else the cores shared by the trainer and the workers
    that compute at once (at least one thread each)."""
    cores = available_cores() if cores is None else cores
    return _budget(cfg, cores, resolve_runtime(cfg))


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a run's compute runs and with how many threads, and why (the start line)."""

    runtime: Runtime
    budget: ThreadBudget
    reason: str  # why, for the settings that were auto; "" when both were set
    probe: ThreadProbe | None = None
    #: a sync run's stages (generate, train), each settling its threads on its own calls
    stages: tuple[StageThreads, ...] = ()
    #: a sync run's one compute thread for both stages (one OpenMP team: threads.py)
    compute: SharedExecutor | None = None
    #: an async inline run's: its engines' calls on the compute thread in sync windows
    modes: ModeGroup | None = None
    #: an async process run's stages (generate, train): in sync windows each settles 1 or
    #: all the cores on its own calls, a share while async (:func:`follows_mode`)
    follow: tuple[ModeThreads, ...] = ()
    #: the probe cache's key of this run's work and the cores busy by others when it was
    #: placed (freshroll.placement.thread_probe.remember_settled); None: nothing to keep
    reuse: tuple[str, float | None] | None = None
    #: an earlier run's sync-fallback choice for the same work at a like load: (mode,
    #: async_per_s, sync_per_s, measured_at) (freshroll.pipeline.fallback.EarlierChoice)
    earlier_mode: tuple[str, float, float, float] | None = None
    #: why an async run starts in the sync fallback's sync mode ("": it starts async): the
    #: probe measured that intra-op threads pay, so the stages take turns on all the cores
    #: until the fallback's first probe measures async against that (issue 25, item 5)
    start_sync: str = ""
    #: the start is held as a choice until the fallback's ``every_s`` (the probe timed this
    #: placement's own compute: inline), or checked at its first probe right after the
    #: warm-up (False: Ray's actors, whose round trips the probe never saw; their sync
    #: windows ran slower than their async mode where the probe read sync faster, docs/ray.md)
    start_held: bool = True
    #: a Ray run's trainer: where it runs and why (:func:`trainer_place`); None: not Ray
    trainer: tuple[TrainerPlace, str] | None = None

    def stage(self, name: str) -> ThreadCounts | None:
        """The thread counts of a stage's calls: a sync run's settling stage, else an async
        process run's mode-following one, else None (the process's own)."""
        counts: list[StageThreads | ModeThreads] = [*self.stages, *self.follow]
        return next((s for s in counts if s.stage == name), None)

    def describe(self) -> str:
        why = f"; auto: {self.reason}" if self.reason else ""
        if self.stages:
            why += (f"; generation and training on one compute thread, each stage's threads "
                    f"(1 or {self.budget.cores}) settled on its own first calls")
        elif self.modes is not None:
            why += "; the sync fallback's windows on one compute thread"
        elif self.follow:
            why += (f"; in the sync fallback's windows each stage's threads (1 or "
                    f"{self.budget.cores}) settled on its own calls")
        elif self.compute is not None:
            why += "; generation and training on one compute thread"
        if self.trainer is not None:
            where = "an actor" if self.trainer[0] == "actor" else "the driver"
            why += f"; the trainer in {where} ({self.trainer[1]})"
        return f"{self.runtime}, {self.budget.describe()}{why}"

    def settled_stages(self) -> str:
        """What the stages settled on, for the run's last lines ("" without stages)."""
        return "; ".join(s.describe() for s in (*self.stages, *(f.sync for f in self.follow)))

    def as_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "trainer_threads": self.budget.trainer,
                "worker_threads": self.budget.worker, "cores": self.budget.cores,
                "reason": self.reason,
                "trainer": self.trainer[0] if self.trainer is not None else None,
                "probe": self.probe.as_dict() if self.probe is not None else None,
                "stages": {s.stage: s.as_dict() for s in self.stages},
                "sync_window_stages": {f.stage: f.sync.as_dict() for f in self.follow}}


def wants_probe(cfg: Config, *, injected: bool = False, cores: int | None = None) -> bool:
    """Whether :func:`plan` needs a :class:`ThreadProbe`: an async run with
    ``run.torch_threads: auto``, the hf engine in this process or beside it (``run.runtime``
    auto or inline), or in actors of a private Ray instance on this machine (whether they
    start in the sync fallback's sync mode, on all the cores: :func:`plan`), two cores or
    more. A sync run needs none: it settles each stage's threads on its own first steps
    (:func:`tunes_stages`). An injected engine (tests' fakes) keeps the fixed rule."""
    cores = available_cores() if cores is None else cores
    return (cfg.run.max_staleness > 0 and _auto_hf(cfg, injected, cores)
            and (cfg.run.runtime in ("auto", "inline") or _private_ray(cfg)))


def _private_ray(cfg: Config) -> bool:
    """``run.runtime: ray`` on freshroll's own Ray instance: its actors share this machine's
    cores (a joined cluster's actors run on cores this process cannot count)."""
    return cfg.run.runtime == "ray" and cfg.run.ray_address is None


def may_fork_workers(cfg: Config, *, injected: bool = False, cores: int | None = None) -> bool:
    """Whether a run's inference workers may be processes of their own (``run.runtime``
    process, or auto that :func:`plan` may settle on process): an async run of the hf engine,
    not injected, on two cores or more. Such a run pre-starts the processes' forkserver
    (:func:`~freshroll.placement.process_engine.prestart_workers`)."""
    cores = available_cores() if cores is None else cores
    return (cfg.run.max_staleness > 0 and "process" in engine_spec(cfg.rollout.engine).placements
            and not injected and cfg.run.runtime in ("auto", "process") and cores >= 2)


def tunes_stages(cfg: Config, runtime: Runtime, *, injected: bool = False,
                 cores: int | None = None) -> bool:
    """Whether a run settles its stages' intra-op threads on its own calls
    (:mod:`freshroll.stage_threads`): a sync run (its steps repeat the same work, taking
    turns) with ``run.torch_threads: auto``, the hf engine inline, two cores or more."""
    cores = available_cores() if cores is None else cores
    return cfg.run.max_staleness == 0 and runtime == "inline" and _auto_hf(cfg, injected, cores)


def sync_windows_shared(cfg: Config, runtime: Runtime, threads: int,
                        injected: bool = False) -> bool:
    """Whether an async run's sync fallback windows run generation on the trainer's thread
    (:class:`~freshroll.ports.threads.ModeGroup`): the hf engine inline, more than one
    intra-op thread (one thread keeps no OpenMP team), the fallback on. Its async windows
    keep a thread each (they overlap)."""
    return (cfg.run.max_staleness > 0 and runtime == "inline" and _tunes(cfg)
            and not injected and threads > 1 and cfg.control.fallback is not False)


def one_compute_thread(cfg: Config, runtime: Runtime, injected: bool = False) -> bool:
    """Whether a run generates and trains on one thread (:class:`SharedExecutor`): a sync
    run of the hf engine inline, whose stages take turns. Each thread that computes keeps an
    OpenMP team, and two teams in one process take the second core's gain from both."""
    return (cfg.run.max_staleness == 0 and runtime == "inline" and _tunes(cfg)
            and not injected)


def follows_mode(cfg: Config, runtime: Runtime, budget: ThreadBudget,
                 injected: bool = False) -> bool:
    """Whether an async run's calls take every core in the sync fallback's windows
    (:class:`~freshroll.stage_threads.ModeThreads`): the hf engine in worker processes or in
    the actors of a private Ray instance (the trainer's too), ``run.torch_threads: auto``
    sharing the cores among them, the fallback on. Its stages take turns in those windows,
    as a sync run's do."""
    placed = runtime == "process" or (runtime == "ray" and _private_ray(cfg))
    return (cfg.run.max_staleness > 0 and placed and budget.auto
            and budget.worker < budget.cores and _auto_hf(cfg, injected, budget.cores)
            and cfg.control.fallback is not False)


def _auto_hf(cfg: Config, injected: bool, cores: int) -> bool:
    return (cfg.run.torch_threads == "auto" and _tunes(cfg) and not injected
            and cores >= 2)


def _tunes(cfg: Config) -> bool:
    """The engine's intra-op threads are freshroll's to settle (engine spec: hf)."""
    return engine_spec(cfg.rollout.engine).tunes_threads


def plan(cfg: Config, probe: ThreadProbe | None = None, *, injected: bool = False,
         cores: int | None = None) -> Placement:
    """The placement and thread budget of ``cfg``'s run, ``auto`` settled on ``probe``::

        threads pay (probe, async)   inline, all the cores (a sync step on them beats an
                                     async step on a core per stage: thread_probe)
        ... under run.runtime: ray   the actors, starting in the sync fallback's sync mode
                                     with every call on all the cores (follows_mode)
        otherwise                    the fixed rule: auto_runtime, thread_budget
        a sync run (tunes_stages)    also each stage's threads, 1 or all the cores,
                                     settled on its own first calls

    An injected ``make_engine`` runs in this process: ``auto`` is inline for it."""
    cores = available_cores() if cores is None else cores
    rt_auto, th_auto = cfg.run.runtime == "auto", cfg.run.torch_threads == "auto"
    runtime: Runtime
    if cfg.run.runtime != "auto":
        runtime, why = cfg.run.runtime, ""
    elif injected:
        runtime, why = "inline", "an injected engine runs in this process"
    else:
        runtime, why = auto_runtime(cfg, cores)
    pays = probe is not None and probe.pays and wants_probe(cfg, injected=injected,
                                                            cores=cores)
    if probe is not None and pays and runtime != "ray":
        budget = ThreadBudget(cores, "inline", cores, cores, auto=True)
        why = f"intra-op threads pay here ({probe.describe()}): one process, all {cores} cores"
        start = ("" if probe.skipped or cfg.control.fallback is False else
                 f"the thread probe: a sync step on all {cores} cores is {probe.advantage:.2f}x "
                 "an async one on a core per stage, so the stages take turns on all of them "
                 "until the fallback measures async against it")
        placed = Placement("inline", budget, why, probe, start_sync=start)
        return _with_modes(cfg, placed, injected)
    budget = _budget(cfg, cores, runtime)
    if probe is not None:
        why = f"{why}; {probe.describe()}" if why else probe.describe()
    stages: tuple[StageThreads, ...] = ()
    if tunes_stages(cfg, runtime, injected=injected, cores=cores):
        stages = (StageThreads("generate", cores), StageThreads("train", cores))
    compute = SharedExecutor("compute") if one_compute_thread(cfg, runtime, injected) else None
    follow = (tuple(ModeThreads(budget.worker, StageThreads(name, cores))
                    for name in ("generate", "train"))
              if follows_mode(cfg, runtime, budget, injected) else ())
    start = ""
    if probe is not None and pays and follow and not probe.skipped:  # Ray's actors
        start = (f"the thread probe: a sync step on all {cores} cores is "
                 f"{probe.advantage:.2f}x an async one on a core per stage, so the actors "
                 "take turns on all of them until the fallback measures async against it")
        for f in follow:  # settled by the probe, as the inline placement's sync windows are:
            _settle_on(f.sync, probe)  # no trials (timed through a round trip, a short
            # generate call's 1 / n trials misjudged what the probe measured: docs/ray.md)
    return _with_modes(cfg, Placement(runtime, budget, why if rt_auto or th_auto else "", probe,
                                      stages, compute, follow=follow, start_sync=start,
                                      start_held=not start,
                                      trainer=ray_trainer(cfg, runtime)),
                       injected)


def _settle_on(stage: StageThreads, probe: ThreadProbe) -> None:
    """``stage`` settled on all its cores by ``probe``'s measurement (its seconds per row
    at 1 and n threads kept as the stage's timings)."""
    one, many = ((probe.gen_1, probe.gen_n) if stage.stage == "generate"
                 else (probe.train_1, probe.train_n))
    rows = max(1, probe.rows)
    stage.timed = {1: [one / rows], stage.many: [many / rows]}
    stage.settled = stage.many


def _with_modes(cfg: Config, p: Placement, injected: bool) -> Placement:
    """``p`` with the sync windows on one compute thread where :func:`sync_windows_shared`."""
    if not sync_windows_shared(cfg, p.runtime, p.budget.trainer, injected):
        return p
    compute = SharedExecutor("compute")
    return replace(p, compute=compute, modes=ModeGroup(compute))


def _budget(cfg: Config, cores: int, runtime: Runtime) -> ThreadBudget:
    if cfg.run.torch_threads != "auto":
        n = int(cfg.run.torch_threads)
        return ThreadBudget(cores, runtime, n, n, auto=False)
    share = max(1, cores // (1 + max(1, cfg.rollout.workers)))
    return ThreadBudget(cores, runtime, share, share, auto=True)


def settled(cfg: Config, placement: Placement) -> Config:
    """``cfg`` with ``run.runtime`` and ``run.torch_threads`` made explicit (what runs)."""
    run = cfg.run.model_copy(update={"runtime": placement.runtime,
                                     "torch_threads": placement.budget.trainer})
    return cfg.model_copy(update={"run": run})


__all__ = [
    "Placement",
    "Runtime",
    "ThreadBudget",
    "auto_runtime",
    "available_cores",
    "check_world_size",
    "follows_mode",
    "one_compute_thread",
    "plan",
    "resolve_runtime",
    "settled",
    "sync_windows_shared",
    "thread_budget",
    "tunes_stages",
    "wants_probe",
]

"""``freshroll run``: build a run's components from its config and drive them.

A recipe of plain components (torchtune style)::

    config -> run dir (config.yaml) -> model (tiny, or a local from_pretrained path)
           -> prompts + rewards -> ledger + sample buffer (fresh, or recovered on --resume)
           -> placement (run.runtime and threads settled: placement/placement.py) -> its
              components from the registry of runtime/placements.py, by (rollout.engine,
              run.runtime): engines, reward set, trainer, and one exit stack to release them
           -> pipeline.run() on the run's clock -> drain -> counts, then summary, verify and
              report from one read of the ledger (:mod:`freshroll.runtime.endfiles`)

The clock: ``rollout.engine: sim`` with ``sim.clock: virtual`` runs the pipeline on a
:class:`~freshroll.clock.VirtualClock` started at the ledger's last timestamp (time never goes
back on resume); everything else runs in real time.

Exactly-once across crashes: the ledger is the truth. Every ``committed`` event
names its batch and the digest of the weights it produced; a checkpoint is
written (atomically, before that step's commit) every ``checkpoint_every`` steps
and at the last step. On resume, the newest checkpoint on the committed chain is
loaded and the later committed steps are trained again from the ledger, each
checked against its committed weights digest (:mod:`freshroll.trainer.replay`).
A checkpoint newer than the ledger (crash between the two) is ignored, and its
lease, released by recovery, is trained again.

The run directory: every input is checked before anything is written
(:mod:`freshroll.runtime.prepare`), the directory is locked for the whole run
(:mod:`freshroll.runtime.rundir`), and a resume compares the config in force and the model
with what the ledger recorded (:mod:`freshroll.runtime.resume`); each start and resume records
its config in the ledger (``run_config``, and ``settings_changed`` on a change). The learner
is rebuilt at the ledger's version by :mod:`freshroll.runtime.learner`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from freshroll.clock import Clock, RealClock, VirtualClock
from freshroll.config import Config
from freshroll.engines.specs import engine_spec
from freshroll.errors import ConfigError, Interrupted
from freshroll.figures.overlap import host_now
from freshroll.figures.overlap import render as render_overlap
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.freshness import window_note
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import RESERVE_BYTES, Ledger, open_ledger
from freshroll.observe.fit import width, wrap
from freshroll.observe.monitors import build_monitors, start_endpoint
from freshroll.observe.prometheus import PrometheusExporter
from freshroll.pipeline.fallback import EarlierChoice
from freshroll.pipeline.observers import FollowMode, RunObserver
from freshroll.pipeline.pipeline import Pipeline, run_pipeline
from freshroll.placement.placement import Placement, may_fork_workers, settled
from freshroll.placement.thread_probe import (
    remember_choice,
    remember_settled,
    settle_placement,
)
from freshroll.runtime.endfiles import Finished, finish_run_dir, record_fixed_costs
from freshroll.runtime.evaluation import build_evaluator
from freshroll.runtime.kernel_settings import kernel_config
from freshroll.runtime.leftovers import sweep_leftovers, undo_start
from freshroll.runtime.placements import ChaosSession, Components, MakeEngine, build_components
from freshroll.runtime.prepare import Prepared, prepare_run_dir
from freshroll.runtime.recording import Recording
from freshroll.runtime.resume import announce
from freshroll.runtime.rundir import finished_run, resume_config, write_text_atomic


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    ok: bool


def run_clock(cfg: Config, ledger: Ledger) -> Clock:
    """``sim.clock: virtual`` (with ``rollout.engine: sim``): a virtual clock that starts where
    the ledger ends (time never goes back on resume); otherwise the real clock."""
    if not engine_spec(cfg.rollout.engine).simulated or cfg.sim.clock == "real":
        return RealClock()
    last = 0.0
    if ledger.last_seq > 0:
        for _, event in ledger.events(after=ledger.last_seq - 1):
            last = event.ts
    return VirtualClock(start=last)


def drive(pipe: Pipeline, clock: Clock) -> None:
    """Run the pipeline on its clock's event loop."""
    if isinstance(clock, VirtualClock):
        clock.run(pipe.run())
    else:
        run_pipeline(pipe)


def run(
    cfg: Config | None, out: Path, *, resume: bool = False, allow_change: tuple[str, ...] = (),
    stream: TextIO = sys.stderr, make_engine: MakeEngine | None = None,
    chaos: ChaosSession | None = None, report: bool = True,
    observers: Sequence[RunObserver] = (),
) -> RunResult:
    """Run (or resume) a training run in ``out``; returns the summary and verify result.

    ``cfg``: the config in force (on resume, None: the run's saved config.yaml; see
    :func:`freshroll.runtime.rundir.resume_config`). ``allow_change``: keys a resume may
    change that change training (README, "Resume rules"). ``make_engine``: the blocking
    engine of a worker for ``rollout.engine: hf`` (default :func:`build_engine`). ``chaos``: a
    fault-injection session (:mod:`freshroll.chaos`) that wraps the run's parts and hooks its
    hand-offs (:mod:`freshroll.pipeline.hooks`). ``report``: False skips ``report.html`` (its
    plots take seconds; the chaos harness runs hundreds of runs). ``observers``: watch the run
    after its own (metrics rows, progress line, checkpointer; :mod:`freshroll.pipeline.observers`
    states the contract), e.g. :class:`~freshroll.observe.exporters.JsonLinesExporter`; each
    is closed when the run ends. The run directory is locked for the whole call.
    """
    called_at = time.time()  # fixed_costs.start_s counts from here
    sweep_leftovers(out, stream)  # what killed runs on this machine left, whatever runs now
    if resume:
        done = nothing_to_do(out, cfg, allow_change, stream)
        if done is not None:
            return done
    if cfg is not None and may_fork_workers(cfg, injected=make_engine is not None):
        from freshroll.placement.process_engine import prestart_workers

        prestart_workers()  # its imports beside the run's start, not after it
    prep = prepare_run_dir(cfg, out, resume, allow_change)
    prom = None
    try:
        prom = start_endpoint(prep.cfg, out, stream)  # live metrics through the start-up too
        return _run(prep, out, stream, make_engine, chaos, report, called_at, observers, prom)
    finally:
        if prom is not None:  # closed with the run's observers, or here if it failed first
            prom.close()
        prep.lock.release()


def nothing_to_do(out: Path, cfg: Config | None, allow_change: tuple[str, ...],
                  stream: TextIO) -> RunResult | None:
    """A resume of a finished run with nothing left to train (:func:`finished_run`) whose
    directory verifies: said, and answered from the run directory, which is left as it is
    (no lock taken, no config, event or row written). None: a run to resume (one whose
    files fail verify is resumed as before: the resume rebuilds them from the ledger)."""
    from freshroll.harness.verify import verify_run

    if cfg is None:
        cfg = resume_config(out)
    summary = finished_run(out, cfg, allow_change)
    if summary is None:
        return None
    if not verify_run(out).ok:  # files to rebuild from the ledger (metrics rows...): resumed
        return None
    stream.write(f"freshroll: {out}: finished at step {summary['steps']} (run.steps "
                 f"{cfg.run.steps}): nothing to do; to train on, resume with a larger "
                 f"run.steps (freshroll run --resume {out} run.steps=N)\n")
    stream.flush()
    return RunResult(out, summary, True)


def _run(prep: Prepared, out: Path, stream: TextIO, make_engine: MakeEngine | None,
         chaos: ChaosSession | None = None, report: bool = True,
         called_at: float | None = None, observers: Sequence[RunObserver] = (),
         prom: PrometheusExporter | None = None) -> RunResult:
    """The run in ``out``: its placement settled, ledger, clock and buffer opened, its parts
    assembled (:func:`_assemble`), the pipeline driven to its end (:func:`_drive`), then the
    end files (a stopped run's too, before its typed error is raised)."""
    asked = prep.cfg
    placement = settle_placement(asked, prep.prompts, prep.model_path,
                                 model_digest=prep.model_digest,
                                 injected=make_engine is not None, stream=stream)
    prep = replace(prep, cfg=settled(asked, placement))
    cfg = prep.cfg  # run.runtime and run.torch_threads explicit; the ledger records `asked`
    if engine_spec(cfg.rollout.engine).trains:  # a simulated run never imports torch
        import torch

        torch.set_num_threads(placement.budget.trainer)
        torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    kernel = kernel_config(cfg)
    if note := window_note(
            max_staleness=cfg.run.max_staleness, admission_window=cfg.run.window_steps,
            basis=cfg.run.staleness_basis, continues=_continues(cfg)):
        stream.write(note + "\n")
    ledger = open_ledger(out, reserve=RESERVE_BYTES)  # closes even on a full disk
    clock = run_clock(cfg, ledger)
    buf = _open_buffer(prep, asked, ledger, kernel, clock, out.name, stream)
    order = [p.prompt_id for p in prep.prompts]
    random.Random(cfg.run.seed).shuffle(order)
    try:
        parts, rec = _assemble(prep, buf, out, clock, placement, stream, make_engine, chaos,
                               observers, prom)
    except ConfigError:
        if prep.history is None:  # a new run: left as if it never started (re-runnable)
            undo_start(buf.ledger, out)
        raise
    stop = _drive(prep, order, buf, clock, parts, rec, chaos, out, placement, stream)
    if stop is not None:
        failure, stopped = stop
        # a run that stopped still says what it trained and why it stopped (summary.json's
        # verdict, the report's banner); best effort: the error that stopped it comes first
        with contextlib.suppress(Exception):
            _write_end_files(out, buf, report, placement, cfg)
        if stopped is failure:
            raise failure
        raise stopped from failure
    done = _write_end_files(out, buf, report, placement, cfg)
    remember_settled(placement, stream)  # the stages' thread counts, for the next such run
    if called_at is not None and done.span is not None and isinstance(clock, RealClock):
        record_fixed_costs(out, done.summary, done.span, called_at, time.time(),
                           ray_costs(placement))
    if isinstance(done.verified, Exception):
        raise done.verified
    _last_lines(stream, cfg, placement, done.summary)
    return RunResult(out, done.summary, done.verified.ok)


def _assemble(prep: Prepared, buf: SampleBuffer, out: Path, clock: Clock, placement: Placement,
              stream: TextIO, make_engine: MakeEngine | None, chaos: ChaosSession | None,
              observers: Sequence[RunObserver], prom: PrometheusExporter | None = None
              ) -> tuple[Components, Recording]:
    """The run's parts from the placements' registry (wrapped by ``chaos``), its evaluator,
    the start line, and the recording of the run with its own watchers and the caller's
    observers; a failure here releases what was built (watchers, parts, the ledger)."""
    cfg = prep.cfg
    parts = build_components(prep, buf, out, lambda v, lr: rec.before_commit(v, lr), clock,
                             make_engine, placement)
    watch: list[RunObserver] = []  # the run's own watchers beside the caller's observers
    try:  # a failure before the pipeline still releases the parts (worker processes, shm)
        evaluator = build_evaluator(cfg, prep.eval_prompts, prep.model_path, out, parts.trainer)
        if chaos is not None:
            parts = chaos.wrap(parts, buf)
        if cfg.run.progress:
            start = _start_line(cfg, out, prep.model_path, len(prep.prompts), buf, placement)
            stream.write(wrap(start, width(stream)) + "\n")  # whole in a log file
            stream.flush()
        watch += own_watchers(cfg, placement, out, stream, prom)
        rec = Recording(out, cfg, buf, stream, evaluator, extra=[*watch, *observers])
    except BaseException:
        for w in watch:  # a bound port is given back
            with contextlib.suppress(Exception):
                w.close()
        parts.close()
        buf.ledger.close()
        raise
    return parts, rec


def _drive(prep: Prepared, order: list[str], buf: SampleBuffer, clock: Clock,
           parts: Components, rec: Recording, chaos: ChaosSession | None,
           out: Path, placement: Placement, stream: TextIO
           ) -> tuple[BaseException, BaseException] | None:
    """The pipeline driven to its end; then the parts released, every observer closed and the
    ledger closed, whatever happened. None: the run ran to its end; else the error that
    stopped it and the typed error to raise for it (:func:`_stopped`; the same one, or the
    typed one raised from it)."""
    cfg = prep.cfg
    stop: tuple[BaseException, BaseException] | None = None
    try:
        pipe = Pipeline(
            buf, parts.engine_factory, parts.scorer, parts.trainer,
            {p.prompt_id: p for p in prep.prompts}, order, cfg, observers=rec.observers,
        )
        if chaos is not None:
            pipe.hooks = chaos.hooks
        else:
            pipe.earlier = start_choice(placement)
        drive(pipe, clock)
        buf.shutdown("done")
        chose = pipe.fallback.last_choice if pipe.fallback is not None else None
        if (chose is not None and chaos is None and chose.async_per_s is not None
                and chose.sync_per_s is not None):  # kept for the next run of the same work
            remember_choice(placement, chose.mode, chose.async_per_s, chose.sync_per_s, stream)
    except BaseException as exc:  # one typed error; the ledger closed first (resumable)
        stop = exc, _stopped(exc, buf, cfg, out)
        with contextlib.suppress(Exception):  # best effort: the next start writes them too
            rec.catch_up()
    finally:
        parts.close()
        try:
            rec.close()  # every observer, even past one whose close failed
        except Exception as exc:  # raised, unless the run already failed: that error says why
            if stop is None:
                raise
            stop[0].add_note(f"an observer's close failed too: {type(exc).__name__}: {exc}")
        finally:  # the ledger closes whatever an observer's close raised
            buf.ledger.close()
    return stop


def ray_costs(placement: Placement) -> dict[str, float]:
    """A Ray run's seconds of Ray's own start and stop (its instance's, or joining and
    leaving a cluster), for ``summary.json``'s ``fixed_costs``; empty for other placements."""
    if placement.runtime != "ray":
        return {}
    from freshroll.placement.ray_session import COSTS

    return dict(COSTS)


def _last_lines(stream: TextIO, cfg: Config, placement: Placement,
                summary: dict[str, Any]) -> None:
    """What the run says after its summary: the intra-op threads its stages settled on (a
    sync run's; an async run's sync windows', when they ran, before the overlap line), and
    whether asynchrony paid (a loss is always said)."""
    settled = f"settled on their own calls: {placement.settled_stages()}\n"
    if cfg.run.progress and any(f.sync.calls for f in placement.follow):  # windows ran
        stream.write(f"intra-op threads in the sync fallback's windows, {settled}")
    line = overlap_line(summary)
    if line and (cfg.run.progress or "did not pay" in line):
        stream.write(line + "\n")
    if placement.stages and cfg.run.progress:
        stream.write(f"intra-op threads, {settled}")
    stream.flush()


def _continues(cfg: Config) -> bool:
    """Do running requests take new weights (``rollout.on_update`` continue; unset: the sim
    engine's swap, or vllm's ``vllm.on_update``)?"""
    mode = cfg.rollout.on_update
    if mode is None:
        return engine_spec(cfg.rollout.engine).swaps_by_default or (
            cfg.rollout.engine == "vllm" and cfg.vllm.on_update == "continue")
    return mode == "continue"


def _open_buffer(prep: Prepared, asked: Config, ledger: Ledger, kernel: KernelConfig,
                 clock: Clock, run_id: str, stream: TextIO) -> SampleBuffer:
    """The run's sample buffer on its ledger (fresh, or replayed and recovered on resume),
    the config ``asked`` and each resume change announced (and said) in the ledger."""
    step = prep.history.step if prep.history else 0
    for change in prep.changes:
        stream.write(f"resume: {change.render()} from step {step} on (recorded in the ledger)\n")
    return SampleBuffer.open(
        ledger, kernel, clock, run_id=run_id,
        initial_version=PolicyVersion.initial(prep.model_digest),
        announce=announce(
            asked.model_dump(mode="json"), prep.changes, prep.allow_change, step=step,
            model_digest=prep.model_digest, ts=clock.now(),
            reward_version=str(prep.rewards.version), input_files=prep.input_files,
        ),
    )


def start_choice(placement: Placement) -> EarlierChoice | None:
    """The mode a run starts in, where it is not async: the same work's choice at a like
    load (held, as a choice), or the thread probe's (threads pay: the stages take turns on
    all the cores), held or checked at once as the placement says (``start_held``)."""
    if placement.earlier_mode is not None:
        mode, ra, rs, at = placement.earlier_mode
        return EarlierChoice("sync" if mode == "sync" else "async", ra, rs, at)
    if placement.start_sync:
        return EarlierChoice("sync", None, None, time.time(), placement.start_sync,
                             hold=placement.start_held)
    return None


def own_watchers(cfg: Config, placement: Placement, out: Path, stream: TextIO,
                 prom: PrometheusExporter | None = None) -> list[RunObserver]:
    """The observers a run adds for itself (closed with the others at its end): the engines'
    calls following the sync fallback's mode (an async inline run on many threads), and the
    watchers of ``monitor.*`` (:func:`~freshroll.observe.monitors.build_monitors`: the
    Prometheus endpoint, bound here, a taken port a ConfigError; TensorBoard; W&B)."""
    found: list[RunObserver] = []
    for follow in (placement.modes, *placement.follow):  # each mode_decided moves the calls
        if follow is not None:
            found.append(FollowMode(follow))
    return found + build_monitors(cfg, out, stream, prom)


def _start_line(cfg: Config, out: Path, model: Path, n_prompts: int, buf: SampleBuffer,
                placement: Placement) -> str:
    """What is about to run, printed once before the first step."""
    step = buf.version.step if buf.version is not None else 0
    where = f"from step {step} to {cfg.run.steps}" if step else f"{cfg.run.steps} steps"
    eta = cfg.run.max_staleness
    mode = "sync" if eta == 0 else f"async (max_staleness {eta})"
    if engine_spec(cfg.rollout.engine).simulated:
        what = (f"simulated cluster {cfg.sim.profile} ({cfg.sim.clock} clock), "
                f"{cfg.rollout.workers} worker(s)")
    elif cfg.rollout.engine == "vllm":
        what = (f"model {model}, {cfg.rollout.workers} vLLM engine(s) ({cfg.vllm.device}, "
                f"{cfg.vllm.dtype}, on_update {cfg.rollout.on_update or cfg.vllm.on_update}), "
                f"torch threads {_torch_threads()}")
    else:
        what = f"model {model}, {cfg.rollout.workers} worker(s) ({placement.describe()})"
        if (group := _ranks(cfg)) is not None:
            what += (f", trainer {group['world_size']} ranks ({group['parallel']}, "
                     f"{group['backend']}, batch split {group['split']})")
    return (f"freshroll: {out}: {where}, {mode}, {what}, {n_prompts} prompts, "
            f"{cfg.rollout.batch_groups}x{cfg.rollout.group_size} rollouts per step, "
            f"control {cfg.control.mode}")


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _ranks(cfg: Config) -> dict[str, object] | None:
    """:func:`~freshroll.trainer.ranks.ranks_record` of ``cfg``'s trainer; imported only for a
    trainer group (the ranks' module is torch's)."""
    if cfg.trainer.parallel == "none":
        return None
    from freshroll.trainer.ranks import ranks_record

    return ranks_record(cfg.trainer.parallel, cfg.trainer.world_size)


def _write_end_files(out: Path, buf: SampleBuffer, report: bool = True,
                     placement: Placement | None = None, cfg: Config | None = None) -> Finished:
    """``counts.json``, then ``summary.json``, the verify report and ``report.html`` of a
    closed run, from one read of its ledger (:mod:`freshroll.runtime.endfiles`)."""
    write_text_atomic(out / "counts.json", json.dumps(dict(buf.counts), sort_keys=True, indent=1))
    host = host_now()
    if placement is not None:
        host["placement"] = placement.as_dict()
    group = _ranks(cfg) if cfg else None
    if group is not None:  # trainer.parallel: the ranks and the rule that split each batch
        host["trainer_ranks"] = group
    return finish_run_dir(out, report=report, host=host)


def overlap_line(summary: dict[str, Any]) -> str:
    """The one line an async run's end prints: did asynchrony pay
    (:mod:`freshroll.figures.overlap`); empty for a sync run. A run that lost workers says
    that its figures include the recovery (a verdict over crashes is not one on asynchrony)."""
    line = render_overlap(summary.get("overlap"), summary.get("host"))
    losses = summary.get("worker_losses") or 0
    if line and losses:
        line += (f" (these figures include {losses} inference worker "
                 f"loss{'es' if losses != 1 else ''} and their replacement)")
    return line


def _stopped(exc: BaseException, buf: SampleBuffer, cfg: Config, out: Path) -> BaseException:
    """What a run that did not finish raises, after closing its ledger (verifiable).

    An operator's interrupt (SIGINT, SIGTERM, or ``KeyboardInterrupt`` from the run's own
    code) becomes :class:`Interrupted` naming the resume command; any other error is typed
    by :func:`freshroll.boundary.typed` (an exception group's leaf, ``OSError`` by errno).
    """
    from freshroll import boundary

    exc = boundary.typed(exc)
    interrupted = isinstance(exc, KeyboardInterrupt | Interrupted)
    with contextlib.suppress(Exception):  # disk full...: the ledger keeps its durable prefix
        buf.shutdown("interrupted" if interrupted else "failed")
    if not interrupted:
        return exc
    _drop_abandoned_interrupt_logs()
    step = buf.version.step if buf.version is not None else 0
    why = f" ({exc})" if isinstance(exc, Interrupted) and str(exc) else ""
    return Interrupted(f"run stopped at step {step} of {cfg.run.steps}{why}; "
                       f"resume with: freshroll run --resume {out}")


class _AbandonedInterrupt(logging.Filter):
    """A KeyboardInterrupt raised in a worker thread ends ``asyncio.run`` without the
    pipeline task's exception being retrieved; asyncio then logs it with a traceback when
    the task is collected. The run has already reported it as :class:`Interrupted`."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt)


def _drop_abandoned_interrupt_logs() -> None:
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, _AbandonedInterrupt) for f in log.filters):
        log.addFilter(_AbandonedInterrupt())


__all__ = ["RunResult", "run"]

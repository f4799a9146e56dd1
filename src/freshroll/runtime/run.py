"""``freshroll run``: build a run's components from its config and drive them.

A recipe of plain components (torchtune style)::

    config -> run dir (config.yaml) -> model (tiny, or a local from_pretrained path)
           -> prompts + rewards -> ledger + sample buffer (fresh, or recovered on --resume)
           -> learner (+ checkpoint matching the ledger's version on resume)
           -> engines -> pipeline.run() -> drain -> counts, summary, report, verify

Exactly-once across crashes: the ledger is the truth. Every ``committed`` event
names its batch and the digest of the weights it produced; a checkpoint is
written (atomically, before that step's commit) every ``checkpoint_every`` steps
and at the last step. On resume, the newest checkpoint on the committed chain is
loaded and the later committed steps are trained again from the ledger, each
checked against its committed weights digest (:mod:`freshroll.trainer.replay`).
A checkpoint newer than the ledger (crash between the two) is ignored, and its
lease, released by recovery, is trained again.

The run directory: every input is checked before anything is written, the
directory is locked for the whole run (:mod:`freshroll.runtime.rundir`), and a
resume compares the config in force and the model with what the ledger
recorded (:mod:`freshroll.runtime.resume`); each start and resume records its
config in the ledger (``run_config``, and ``settings_changed`` on a change).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from freshroll.buffer import KernelConfig, SampleBuffer
from freshroll.clock import RealClock
from freshroll.config import Config, read_yaml, validate
from freshroll.engines.base import InferenceEngine
from freshroll.engines.hf import HFEngine
from freshroll.engines.model_dir import check_model_dir, loading_model
from freshroll.engines.tiny import build_tiny, model_digest, save_model_dir
from freshroll.errors import (
    ConfigError,
    Interrupted,
    LedgerError,
    LineageError,
    ResumeError,
    StorageError,
)
from freshroll.ledger import LEDGER_FILE, Ledger, open_ledger
from freshroll.lineage import PolicyVersion
from freshroll.metrics import Tally
from freshroll.rewards.calling import reward_columns
from freshroll.rewards.data import chat_renderer, check_vocabulary, load_prompts
from freshroll.rewards.scoring import RewardSet, build_reward_set
from freshroll.rewards.tasks import Prompt, make_prompts
from freshroll.runtime.metrics_log import METRICS_FILE, RowLog, reconcile
from freshroll.runtime.pipeline import Pipeline, StepReport, run_pipeline
from freshroll.runtime.resume import (
    Change,
    History,
    announce,
    canonical,
    check,
    check_model,
    diff,
    flatten,
    history,
)
from freshroll.runtime.rundir import (
    RunDirLock,
    check_out_dir,
    lock_run_dir,
    resume_config,
    write_text_atomic,
)
from freshroll.runtime.summary import write_summary
from freshroll.trainer.checkpoint import (
    checkpoint_dir,
    load_checkpoint,
    save_checkpoint,
)
from freshroll.trainer.grpo import GRPOLearner
from freshroll.trainer.replay import CommittedStep, committed_chain, replay


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    ok: bool


@dataclass
class Prepared:
    """A run directory checked, locked and written (config.yaml, model/), ready to open."""

    cfg: Config
    lock: RunDirLock
    prompts: list[Prompt]
    rewards: RewardSet
    model_path: Path
    model_digest: str
    history: History | None = None  # what the ledger recorded (on resume)
    changes: list[Change] = field(default_factory=list)  # accepted on resume
    allow_change: tuple[str, ...] = ()


def prepare_run_dir(
    cfg: Config | None, out: Path, resume: bool, allow_change: tuple[str, ...] = ()
) -> Prepared:
    """Check everything that can be checked, lock ``out``, then write its first files.

    Before any write: the directory (new, or holding a run to resume), the rewards
    (importable), the prompts (loadable), the model (``model.path``'s config.json and
    weights, or the embedded model built in memory) and, on resume, the config in force
    against the ledger's (:mod:`freshroll.runtime.resume`). Only then ``config.yaml`` and
    ``model/`` are written, each atomically. A resume locks the directory first (it
    reads the ledger); a new run locks it once every check passed.
    """
    if allow_change and not resume:
        raise ConfigError("--allow-change applies only with --resume")
    check_out_dir(out, resume=resume)
    lock = lock_run_dir(out) if resume else None
    try:
        if cfg is None:
            cfg = resume_config(out)
        _quiet_transformers()
        rewards = build_reward_set([e.model_dump(exclude_none=True) for e in cfg.rewards])
        path, digest, pending = _initial_model(cfg, out, resume)
        prompts = load_task_prompts(cfg, path, pending[1] if pending is not None else None)
        rewards.check_columns(reward_columns(prompts[:1]))
        hist: History | None = None
        changes: list[Change] = []
        if resume:
            hist, changes = _check_resume(cfg, out, digest, allow_change)
        if lock is None:
            lock = lock_run_dir(out)
            check_out_dir(out, resume=False)  # another process may have started it meanwhile
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
        if pending is not None:
            save_model_dir(*pending, path)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return Prepared(cfg, lock, prompts, rewards, path, digest, hist, changes, allow_change)


def _initial_model(
    cfg: Config, run_dir: Path, resume: bool
) -> tuple[Path, str, tuple[Any, Any] | None]:
    """The initial model's dir, its digest, and the embedded model still to save there.

    A user's ``model.path`` is read in place; the embedded tiny model is built in memory
    (a new run always builds it; a resume reuses the run's ``model/`` when present).
    """
    if cfg.model.path is not None:
        path = Path(cfg.model.path)
        check_model_dir(path)
        try:
            return path, model_digest(path), None
        except ConfigError:
            raise
        except Exception as exc:  # safetensors raises its own errors for garbage weights
            raise ConfigError(f"model.path: {path}: weights do not load: {exc}"[:500]) from None
    path = run_dir / "model"
    if resume and (path / "config.json").is_file():
        return path, model_digest(path), None
    try:
        model, tokenizer = build_tiny(cfg.model.tiny_seed, **cfg.model.tiny.overrides())
    except Exception as exc:  # a bad override of the tiny config
        raise ConfigError(f"model.tiny: {exc}"[:500]) from None
    return path, model_digest(model), (model, tokenizer)


def _check_resume(
    cfg: Config, out: Path, digest: str, allow: tuple[str, ...]
) -> tuple[History, list[Change]]:
    """Compare the config in force and the model with what the ledger recorded."""
    try:
        with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
            hist = history(e for _, e in ledger.events())
    except LedgerError as exc:  # nothing recoverable to continue: refused, nothing written
        raise ResumeError(f"{out}: cannot resume: {exc}") from exc
    now = flatten(cfg.model_dump(mode="json"))
    recorded = hist.recorded()
    compared = now if hist.config is not None else {k: now[k] for k in recorded}
    changes = diff(recorded, compared, flatten(Config().model_dump(mode="json")))
    accepted = check(changes, set(allow), known=set(now), step=hist.step, where=str(out))
    model = cfg.model.path or str(out / "model")
    check_model(hist.initial_version, str(PolicyVersion.initial(digest)), model, str(out))
    return hist, accepted


def load_task_prompts(cfg: Config, model: Path, tok: Any = None) -> list[Prompt]:
    """The run's prompts, chat prompts rendered and all checked against ``model``'s tokenizer
    (``tok``, when it is already in memory: the embedded model before it is saved).

    The embedded tiny model has no chat template: its chat prompts are the messages'
    contents joined by a space (:func:`~freshroll.rewards.data.plain_chat_text`).
    """
    from transformers import AutoTokenizer

    if tok is None:
        try:
            tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        except Exception as exc:  # transformers raises many types for a folder without one
            raise ConfigError(f"model {model}: cannot load its tokenizer "
                              f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    t = cfg.task
    if t.file is not None:
        render = chat_renderer(tok, model=str(model), plain_fallback=cfg.model.path is None)
        prompts = load_prompts(t.file, t.prompt_field, t.answer_field, t.id_field,
                               split=t.split, render=render)
    else:
        prompts = make_prompts(t.name, t.n_prompts, cfg.run.seed, **t.params)
    check_vocabulary(prompts, tok, model=str(model))
    return prompts


class Recorder:
    """metrics.jsonl, the live progress line, and checkpoints (write-ahead of commits).

    Rows are derived from the ledger, never from in-memory state: at start (and on
    ``--resume``) the file is reconciled with the ledger (:mod:`freshroll.runtime.metrics_log`),
    and after each commit the events the ledger made durable since are folded into a
    :class:`freshroll.metrics.Tally`, whose row for the ``committed`` event is written. So a
    kill between the durable commit and the row's write costs nothing: the next start
    writes the row.
    """

    def __init__(self, run_dir: Path, cfg: Config, buf: SampleBuffer, stream: TextIO) -> None:
        self.run_dir, self.cfg, self.buf, self.stream = run_dir, cfg, buf, stream
        self.tally, self.seq = Tally(), 0
        expected = self._fold()
        path = run_dir / METRICS_FILE
        done = reconcile(path, expected)
        if done.changed:
            stream.write(f"{path}: {done.describe()}\n")
        self.metrics = RowLog(path)

    def _fold(self) -> list[dict[str, Any]]:
        """Fold the ledger's durable events since the last fold; the rows of its commits."""
        out = []
        for seq, event in self.buf.ledger.events(after=self.seq):
            self.seq = seq
            row = self.tally.feed(event)
            if row is not None:
                out.append(row)
        return out

    def before_commit(self, version: PolicyVersion, learner: GRPOLearner) -> None:
        """Every ``checkpoint_every`` steps and at the last step (resume replays the rest)."""
        every = self.cfg.trainer.checkpoint_every
        if version.step % every and version.step < self.cfg.run.steps:
            return
        root = self.run_dir / "checkpoints"
        target = checkpoint_dir(root, version.step)
        try:
            save_checkpoint(
                target, model_state=learner.model.state_dict(),
                optimizer=learner.optimizer, meta={"step": version.step, "version": str(version)},
            )
        except OSError as exc:  # disk full, read-only, ...: the step is not committed
            raise StorageError(f"checkpoint {target}: {exc.strerror or exc}") from exc
        keep = self.cfg.trainer.keep_checkpoints
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def on_step(self, r: StepReport) -> None:
        for row in self._fold():
            self.metrics.write(row)
            if self.cfg.run.progress:
                self._progress(row)

    def _progress(self, row: dict[str, Any]) -> None:
        """One line per step on a terminal (redrawn in place); every ~2.5% of the run in logs."""
        step, total = row["step"], self.cfg.run.steps
        tty = self.stream.isatty()
        if not tty and step % max(1, total // 40) and step != total:
            return
        line = (
            f"step {step:>4}/{total}  reward {_fmt(row.get('reward_mean'), '.3f')}  "
            f"accepted/s {_fmt(row['accepted_per_s'], '7.1f')}  "
            f"lag {_fmt(row.get('lag_mean'), '.2f')} "
            f"(max {_fmt(row.get('lag_max'), '.0f')}/{self.cfg.run.max_staleness})  "
            f"idle {_fmt(row['trainer_idle_ratio'], '5.1%')}  "
            f"discards {row['discards']} ({_fmt(row['discard_rate'], '.1%')})  "
            f"t {_fmt(row['t'], '6.1f')}s"
        )
        end = "\n" if not tty or step == total else ""
        self.stream.write(("\r" if tty else "") + line + end)
        self.stream.flush()

    def close(self) -> None:
        self.metrics.close()


def _fmt(value: Any, spec: str) -> str:
    """A row value for the progress line; a missing or non-finite one as ``-``."""
    return format(value, spec) if isinstance(value, int | float) else "-"


def build_engines(cfg: Config, path: Path) -> list[InferenceEngine]:
    """One engine per worker: in this process (inline) or each in a Ray actor (ray)."""
    if cfg.run.runtime == "ray":
        from freshroll.runtime.ray_engine import RayEngine, start_ray

        start_ray(num_cpus=ray_cpus(cfg))  # a no-op when run() started it for its run dir
        lim = cfg.limits
        actors = [RayEngine(path, torch_threads=cfg.run.torch_threads,
                            generate_timeout_s=lim.generate_timeout_s,
                            weights_timeout_s=lim.weights_timeout_s,
                            start_timeout_s=lim.worker_start_timeout_s)
                  for _ in range(cfg.rollout.workers)]
        for actor in actors:  # they start in parallel; wait for all before the clock runs
            actor.wait_ready()
        return list(actors)
    return [HFEngine.from_pretrained(path) for _ in range(cfg.rollout.workers)]


def ray_cpus(cfg: Config) -> int:
    return max(2, cfg.rollout.workers)

def _resume_point(run_dir: Path, chain: dict[int, CommittedStep], step: int) -> tuple[Path, int]:
    """The newest checkpoint on the committed chain at or before ``step``, and its step."""
    for path in sorted((run_dir / "checkpoints").glob("step-*"), reverse=True):
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            continue
        meta = json.loads(meta_file.read_text())
        s = int(meta.get("step", -1))
        if 0 < s <= step and str(chain[s].version) == meta.get("version"):
            return path, s
    return Path(), 0


def new_learner(cfg: Config, path: Path) -> tuple[GRPOLearner, Any]:
    """A learner on the initial model at ``path``, and that model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with loading_model(path):
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    learner = GRPOLearner(
        model, cfg.trainer, temperature=cfg.rollout.temperature, pad_id=int(pad),
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    return learner, tok


def build_learner(
    cfg: Config, path: Path, buf: SampleBuffer, run_dir: Path, hist: History | None = None,
    *, to_step: int | None = None, quiet: bool = False,
) -> GRPOLearner:
    """The learner at the ledger's version (or committed step ``to_step``): checkpoint, then
    a digest-checked replay.

    Each replayed step is trained under the settings the ledger recorded for it (the last
    ``run_config`` before its ``committed`` event; without one, the config in force), and
    its settings digest must be the one committed. Afterwards the config in force applies.
    """
    learner, _ = new_learner(cfg, path)
    model = learner.model
    assert buf.version is not None
    target = buf.version.step if to_step is None else to_step
    if target == 0:
        return learner
    recorded = _recorded_configs(hist)
    if learner.ref is None and any(c.trainer.kl_coef > 0 for c in recorded.values()):
        learner.ref = copy.deepcopy(model).eval()  # type: ignore[no-untyped-call]  # initial model
    chain = committed_chain(buf.ledger)
    ckpt_path, ckpt_step = _resume_point(run_dir, chain, target)
    if ckpt_step > 0:
        ckpt = load_checkpoint(ckpt_path)
        model.load_state_dict(ckpt.model_state)
        if ckpt.optimizer_state is not None:
            learner.optimizer.load_state_dict(ckpt.optimizer_state)

    def before_step(step: int) -> None:
        config, committed = hist.steps.get(step, (None, "")) if hist else (None, "")
        apply_settings(learner, recorded[canonical(config)] if config is not None else cfg)
        if config is not None and learner.settings_digest != committed:
            raise LineageError(
                f"step {step} was committed under settings {committed}, but the config the "
                f"ledger recorded for it gives {learner.settings_digest}"
            )

    try:
        n = replay(learner, buf, chain, ckpt_step, to_step=target, before_step=before_step)
    except LineageError as exc:  # the ledger's steps cannot be rebuilt: resume refused
        raise ResumeError(str(exc)) from exc
    apply_settings(learner, cfg)
    if n and not quiet:
        sys.stderr.write(f"resume: checkpoint at step {ckpt_step}, replayed {n} committed "
                         f"steps from the ledger; weights digests match\n")
    return learner


def _recorded_configs(hist: History | None) -> dict[str, Config]:
    """Every config the ledger recorded for a committed step, by its canonical JSON."""
    out: dict[str, Config] = {}
    for config, _ in (hist.steps.values() if hist else ()):
        if config is not None:
            text = canonical(config)
            if text not in out:
                out[text] = validate(config, "the ledger's run_config")
    return out


def apply_settings(learner: GRPOLearner, cfg: Config) -> None:
    """Put ``cfg``'s trainer settings in force on ``learner``, as a learner built with them
    would have them: its settings, loss config, temperature and settings digest (taken from
    such a learner, built on a stand-in module), and the optimizer's lr and weight decay,
    which a loaded checkpoint set to the values of its own step."""
    t = cfg.trainer
    fresh = GRPOLearner(
        torch.nn.Linear(1, 1), t, temperature=cfg.rollout.temperature, pad_id=learner.pad_id,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    learner.cfg, learner.loss_cfg = fresh.cfg, fresh.loss_cfg
    learner.temperature, learner.settings_digest = fresh.temperature, fresh.settings_digest
    for group in learner.optimizer.param_groups:
        group["lr"], group["weight_decay"] = t.lr, t.weight_decay


def run(
    cfg: Config | None, out: Path, *, resume: bool = False, allow_change: tuple[str, ...] = (),
    stream: TextIO = sys.stderr,
) -> RunResult:
    """Run (or resume) a training run in ``out``; returns the summary and verify result.

    ``cfg``: the config in force (on resume, None: the run's saved config.yaml; see
    :func:`resume_config`). ``allow_change``: keys a resume may change that change
    training (README, "Resume rules"). The run directory is locked for the whole call.
    """
    prep = prepare_run_dir(cfg, out, resume, allow_change)
    try:
        return _run(prep, out, stream)
    finally:
        prep.lock.release()


def _run(prep: Prepared, out: Path, stream: TextIO) -> RunResult:
    from freshroll.harness.verify import verify_run

    cfg = prep.cfg
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    path, prompts, rewards = prep.model_path, prep.prompts, prep.rewards
    kernel = KernelConfig(
        cfg.run.max_staleness, cfg.rollout.batch_groups, cfg.rollout.group_size,
        cfg.rollout.max_inflight_groups,
    )
    clock = RealClock()
    step = prep.history.step if prep.history else 0
    for change in prep.changes:
        stream.write(f"resume: {change.render()} from step {step} on (recorded in the ledger)\n")
    buf = SampleBuffer.open(
        open_ledger(out), kernel, clock, run_id=out.name,
        initial_version=PolicyVersion.initial(prep.model_digest),
        announce=announce(
            cfg.model_dump(mode="json"), prep.changes, prep.allow_change, step=step,
            model_digest=prep.model_digest, ts=clock.now(),
        ),
    )
    learner = build_learner(cfg, path, buf, out, prep.history)
    if cfg.run.runtime == "ray":  # recorded in RUN_DIR/ray.json: never outlives the run
        from freshroll.runtime.ray_engine import start_ray

        start_ray(num_cpus=ray_cpus(cfg), run_dir=out)
    engines = build_engines(cfg, path)
    if buf.version is not None and buf.version.step > 0:
        for engine in engines:
            engine.load_weights(learner.weights())
    order = [p.prompt_id for p in prompts]
    random.Random(cfg.run.seed).shuffle(order)
    if cfg.run.progress:
        stream.write(_start_line(cfg, out, path, len(prompts), buf) + "\n")
        stream.flush()
    rec = Recorder(out, cfg, buf, stream)
    pipe = Pipeline(
        buf, engines, learner, rewards, {p.prompt_id: p for p in prompts}, order, cfg,
        on_step=rec.on_step, before_commit=rec.before_commit,
    )
    failure: BaseException | None = None
    try:
        run_pipeline(pipe)
        buf.shutdown("done")
    except BaseException as exc:  # one typed error; the ledger closed first (resumable)
        failure, stopped = exc, _stopped(exc, buf, cfg, out)
    finally:
        rec.close()
        buf.ledger.close()
        if cfg.run.runtime == "ray":
            from freshroll.runtime.ray_engine import stop_ray

            stop_ray()
    if failure is not None:
        # a run that stopped still says what it trained and why it stopped (summary.json's
        # verdict, the report's banner); best effort: the error that stopped it comes first
        with contextlib.suppress(Exception):
            _write_end_files(out, buf)
        if stopped is failure:
            raise failure
        raise stopped from failure
    summary = _write_end_files(out, buf)
    report = verify_run(out)
    return RunResult(out, summary, report.ok)


def _start_line(cfg: Config, out: Path, model: Path, n_prompts: int, buf: SampleBuffer) -> str:
    """What is about to run, printed once before the first step."""
    step = buf.version.step if buf.version is not None else 0
    where = f"from step {step} to {cfg.run.steps}" if step else f"{cfg.run.steps} steps"
    eta = cfg.run.max_staleness
    mode = "sync" if eta == 0 else f"async (max_staleness {eta})"
    return (f"freshroll: {out}: {where}, {mode}, model {model}, {n_prompts} prompts, "
            f"{cfg.rollout.workers} worker(s) ({cfg.run.runtime}), "
            f"{cfg.rollout.batch_groups}x{cfg.rollout.group_size} rollouts per step, "
            f"torch threads {torch.get_num_threads()}")


def _write_end_files(out: Path, buf: SampleBuffer) -> dict[str, Any]:
    """``counts.json``, ``summary.json`` and ``report.html`` of a closed run."""
    write_text_atomic(out / "counts.json", json.dumps(dict(buf.counts), sort_keys=True, indent=1))
    summary = write_summary(out)
    _write_report(out)
    return summary


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


def _write_report(run_dir: Path, baseline: Path | None = None) -> None:
    from freshroll.report.html import write_report

    write_report(run_dir, baseline=baseline)


def run_baseline(run_dir: Path, *, stream: TextIO = sys.stderr) -> RunResult:
    """The synchronous baseline of a finished run: same config, max_staleness 0.

    Written to ``RUN_DIR/baseline``; the run's report is rebuilt with it overlaid,
    so reward per step and per second are always shown beside the baseline.
    """
    cfg = validate(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    sync = cfg.model_copy(update={"run": cfg.run.model_copy(update={"max_staleness": 0})})
    stream.write("synchronous baseline (max_staleness=0):\n")
    result = run(sync, run_dir / "baseline", stream=stream)
    _write_report(run_dir, baseline=run_dir / "baseline")
    return result


def _quiet_transformers() -> None:
    """No download/loading progress bars: our own progress line is the display."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


__all__ = ["RunResult", "apply_settings", "resume_config", "run", "run_baseline"]

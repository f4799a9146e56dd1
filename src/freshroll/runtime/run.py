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
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from freshroll.buffer import KernelConfig, SampleBuffer
from freshroll.clock import RealClock
from freshroll.config import Config, read_yaml, validate
from freshroll.engines.base import InferenceEngine
from freshroll.engines.hf import HFEngine, check_model_dir, loading_model
from freshroll.engines.tiny import model_digest, save_tiny
from freshroll.errors import (
    ConfigError,
    Interrupted,
    LineageError,
    ResumeError,
    StorageError,
)
from freshroll.ledger import LEDGER_FILE, open_ledger
from freshroll.lineage import PolicyVersion
from freshroll.rewards.scoring import build_reward_set
from freshroll.rewards.tasks import Prompt, load_prompts, make_prompts
from freshroll.runtime.pipeline import Pipeline, StepReport, run_pipeline
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


def prepare_run_dir(cfg: Config | None, out: Path, resume: bool) -> Config:
    """Create ``out`` (or check it for ``--resume``) and return the config in force."""
    if resume:
        if not (out / LEDGER_FILE).is_file():
            raise ConfigError(f"{out}: nothing to resume (no {LEDGER_FILE})")
        saved = validate(read_yaml(out / "config.yaml"), str(out / "config.yaml"))
        if cfg is not None and cfg.run.steps != saved.run.steps:
            saved = saved.model_copy(update={"run": saved.run.model_copy(
                update={"steps": cfg.run.steps})})
        (out / "config.yaml").write_text(saved.to_yaml())
        return saved
    assert cfg is not None
    if (out / LEDGER_FILE).exists():
        raise ConfigError(f"{out}: already holds a run; use --resume or another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(cfg.to_yaml())
    return cfg


def model_path(cfg: Config, run_dir: Path) -> Path:
    """The initial model: the user's local path, or the embedded tiny model saved in the run."""
    if cfg.model.path is not None:
        path = Path(cfg.model.path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path: {path} has no config.json (a local model dir)")
        check_model_dir(path)
        return path
    path = run_dir / "model"
    if not (path / "config.json").is_file():
        save_tiny(path, seed=cfg.model.tiny_seed, **cfg.model.tiny)
    return path


def load_task_prompts(cfg: Config) -> list[Prompt]:
    t = cfg.task
    if t.file is not None:
        return load_prompts(t.file, t.prompt_field, t.answer_field)
    return make_prompts(t.name, t.n_prompts, cfg.run.seed, **t.params)


class Recorder:
    """metrics.jsonl, the live progress line, and checkpoints (write-ahead of commits)."""

    def __init__(self, run_dir: Path, cfg: Config, buf: SampleBuffer, stream: TextIO) -> None:
        self.run_dir, self.cfg, self.buf, self.stream = run_dir, cfg, buf, stream
        self.t0 = time.time()
        self.accepted0 = buf.counts["committed"]
        self.wait_total = 0.0
        self.metrics = _open_for_append(run_dir / "metrics.jsonl")

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
        elapsed = time.time() - self.t0
        self.wait_total += r.wait_s
        accepted = self.buf.counts["committed"] - self.accepted0
        row = {
            "step": r.step, "t": elapsed, "version": str(r.version), **r.metrics,
            "trainer_wait_s": r.wait_s, "accepted_total": self.buf.counts["committed"],
            "accepted_per_s": accepted / elapsed if elapsed > 0 else 0.0,
            "trainer_idle_ratio": self.wait_total / elapsed if elapsed > 0 else 0.0,
        }
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()
        if self.cfg.run.progress:
            self._progress(r.step, row, elapsed)

    def _progress(self, step: int, row: dict[str, Any], elapsed: float) -> None:
        """One line per step on a terminal (redrawn in place); every ~2.5% of the run in logs."""
        total = self.cfg.run.steps
        tty = self.stream.isatty()
        if not tty and step % max(1, total // 40) and step != total:
            return
        discards = sum(v for k, v in self.buf.counts.items() if k.startswith("discarded_"))
        line = (
            f"step {step:>4}/{total}  reward {row['reward_mean']:.3f}  "
            f"accepted/s {row['accepted_per_s']:7.1f}  lag {row['lag_mean']:.2f} "
            f"(max {row['lag_max']:.0f}/{self.cfg.run.max_staleness})  "
            f"idle {row['trainer_idle_ratio']:5.1%}  discards {discards}  t {elapsed:6.1f}s"
        )
        end = "\n" if not tty or step == total else ""
        self.stream.write(("\r" if tty else "") + line + end)
        self.stream.flush()

    def close(self) -> None:
        self.metrics.close()


def build_engines(cfg: Config, path: Path) -> list[InferenceEngine]:
    """One engine per worker: in this process (inline) or each in a Ray actor (ray)."""
    if cfg.run.runtime == "ray":
        from freshroll.runtime.ray_engine import RayEngine, start_ray

        start_ray(num_cpus=ray_cpus(cfg))  # a no-op when run() started it for its run dir
        actors = [RayEngine(path, torch_threads=cfg.run.torch_threads)
                  for _ in range(cfg.rollout.workers)]
        for actor in actors:  # they start in parallel; wait for all before the clock runs
            actor.wait_ready()
        return list(actors)
    return [HFEngine.from_pretrained(path) for _ in range(cfg.rollout.workers)]


def ray_cpus(cfg: Config) -> int:
    return max(2, cfg.rollout.workers)


def _open_for_append(path: Path) -> TextIO:
    """Open a JSON-lines file for appending, first cutting a torn last line (a kill can
    interrupt a write), so that the next row starts on a line of its own."""
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])
    return path.open("a")


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


def build_learner(cfg: Config, path: Path, buf: SampleBuffer, run_dir: Path) -> GRPOLearner:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with loading_model(path):
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    learner = GRPOLearner(
        model, cfg.trainer, temperature=cfg.rollout.temperature, pad_id=int(pad),
        max_new_tokens=cfg.rollout.max_new_tokens,
    )
    assert buf.version is not None
    if buf.version.step > 0:
        chain = committed_chain(buf.ledger)
        ckpt_path, ckpt_step = _resume_point(run_dir, chain, buf.version.step)
        if ckpt_step > 0:
            ckpt = load_checkpoint(ckpt_path)
            model.load_state_dict(ckpt.model_state)
            if ckpt.optimizer_state is not None:
                learner.optimizer.load_state_dict(ckpt.optimizer_state)
        try:
            n = replay(learner, buf, chain, ckpt_step)
        except LineageError as exc:  # the ledger's steps cannot be rebuilt: resume refused
            raise ResumeError(str(exc)) from exc
        if n:
            sys.stderr.write(f"resume: checkpoint at step {ckpt_step}, replayed {n} committed "
                             f"steps from the ledger; weights digests match\n")
    return learner


def run(
    cfg: Config | None, out: Path, *, resume: bool = False, stream: TextIO = sys.stderr
) -> RunResult:
    """Run (or resume) a training run in ``out``; returns the summary and verify result."""
    from freshroll.harness.verify import verify_run

    cfg = prepare_run_dir(cfg, out, resume)
    _quiet_transformers()
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    path = model_path(cfg, out)
    prompts = load_task_prompts(cfg)
    rewards = build_reward_set([e.model_dump(exclude_none=True) for e in cfg.rewards])
    kernel = KernelConfig(
        cfg.run.max_staleness, cfg.rollout.batch_groups, cfg.rollout.group_size,
        cfg.rollout.max_inflight_groups,
    )
    buf = SampleBuffer.open(
        open_ledger(out), kernel, RealClock(), run_id=out.name,
        initial_version=PolicyVersion.initial(model_digest(path)),
    )
    learner = build_learner(cfg, path, buf, out)
    if cfg.run.runtime == "ray":  # recorded in RUN_DIR/ray.json: never outlives the run
        from freshroll.runtime.ray_engine import start_ray

        start_ray(num_cpus=ray_cpus(cfg), run_dir=out)
    engines = build_engines(cfg, path)
    if buf.version is not None and buf.version.step > 0:
        for engine in engines:
            engine.load_weights(learner.weights())
    order = [p.prompt_id for p in prompts]
    random.Random(cfg.run.seed).shuffle(order)
    rec = Recorder(out, cfg, buf, stream)
    pipe = Pipeline(
        buf, engines, learner, rewards, {p.prompt_id: p for p in prompts}, order, cfg,
        on_step=rec.on_step, before_commit=rec.before_commit,
    )
    try:
        run_pipeline(pipe)
        buf.shutdown("done")
    except BaseException as exc:  # one typed error; the ledger closed first (resumable)
        stopped = _stopped(exc, buf, cfg, out)
        if stopped is exc:
            raise
        raise stopped from exc
    finally:
        rec.close()
        buf.ledger.close()
        if cfg.run.runtime == "ray":
            from freshroll.runtime.ray_engine import stop_ray

            stop_ray()
    (out / "counts.json").write_text(json.dumps(dict(buf.counts), sort_keys=True, indent=1))
    summary = write_summary(out)
    _write_report(out)
    report = verify_run(out)
    return RunResult(out, summary, report.ok)


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


__all__ = ["RunResult", "run", "run_baseline"]

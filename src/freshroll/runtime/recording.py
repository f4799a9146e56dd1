"""A run's own observers (:mod:`freshroll.pipeline.observers`): metrics rows, the progress
line, the checkpointer, and :class:`Recording`, the list of them a run hands its pipeline.

::

    Evaluations    before_commit (trainer thread): the due evaluation of a step (eval.jsonl),
                   before its commit; checkpointed (loop): its ``evaluated`` record
    Checkpointer   before_commit (trainer thread): the due checkpoint of a step, written
                   before its commit; checkpointed (loop): its ``checkpoint_saved`` record
    MetricsRows    on_step: the ledger's durable events since the last fold, folded into
                   metrics.jsonl rows (reconciled with the ledger at every start); each row
                   then goes to every observer's on_row
    ProgressLine   on_row: one line per step (redrawn in place on a terminal, cut to its
                   width: :mod:`freshroll.observe.fit`); on_wait: the heartbeat, joined to
                   that line on a terminal
    Notes          a skipped step, the sync fallback's choice (stderr)
    ...            what the caller added (``run(..., observers=[...])``), in its order

Rows are derived from the ledger, never from in-memory state: at start (and on
``--resume``) ``metrics.jsonl`` is reconciled with the ledger
(:mod:`freshroll.figures.metrics_log`), and after each commit the events the ledger made
durable since are folded into a :class:`freshroll.figures.metrics.Tally`, whose row for the
``committed`` event is written. So a kill between the durable commit and the row's write
costs nothing: the next start writes the row.

Checkpoints are written ahead of the commit (every ``trainer.checkpoint_every`` steps and at
the last step): the files first, atomically, then their ``checkpoint_saved`` record, which
the pipeline makes durable in the commit's own flush. A crash before the commit leaves a
checkpoint newer than the ledger, which a resume ignores (:mod:`freshroll.runtime.learner`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from freshroll.config import Config
from freshroll.errors import StorageError
from freshroll.figures.metrics import Tally
from freshroll.figures.metrics_log import METRICS_FILE, RowLog, reconcile
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.events import CheckpointSaved, Evaluated
from freshroll.ledger.lineage import PolicyVersion, file_digests
from freshroll.observe.completions import CompletionsLog
from freshroll.observe.fit import fit, fit_with, width
from freshroll.observe.pace import Pace
from freshroll.pipeline.fallback import Switch
from freshroll.pipeline.observers import (
    Notes,
    Observer,
    Row,
    RunObserver,
    StepReport,
    close_all,
)
from freshroll.ports.seams import TrainerState
from freshroll.report.samples import tokenizer_decode
from freshroll.runtime.evaluation import Evaluator, evals_by_step, with_eval
from freshroll.runtime.evaluation import trim as trim_evals

Evals = dict[int, list[dict[str, Any]]]  # step -> its eval.jsonl records


class MetricsRows(Observer):
    """``metrics.jsonl``: reconciled with the ledger when built; after each commit, the rows
    of the commits the ledger made durable since, each then given to ``observers``'
    ``on_row`` (this module's docstring)."""

    def __init__(self, run_dir: Path, buf: SampleBuffer, stream: TextIO, evals: Evals,
                 observers: Sequence[RunObserver] = ()) -> None:
        self.buf, self.evals, self.observers = buf, evals, observers
        self.tally, self.seq = Tally(), 0
        expected = with_eval(self._fold(), evals)
        path = run_dir / METRICS_FILE
        done = reconcile(path, expected)
        if done.changed:
            stream.write(f"{path}: {done.describe()}\n")
        self.metrics = RowLog(path)

    def _fold(self) -> list[Row]:
        """Fold the ledger's durable events since the last fold; the rows of its commits."""
        out = []
        for seq, event in self.buf.ledger.events(after=self.seq):
            self.seq = seq
            row = self.tally.feed(event)
            if row is not None:
                out.append(row)
        return out

    def _write(self, live: bool) -> None:
        for row in with_eval(self._fold(), self.evals):
            self.metrics.write(row)
            for o in self.observers:
                o.on_row(row, live)

    def on_step(self, report: StepReport) -> None:
        self._write(live=True)

    def catch_up(self) -> None:
        """Write the rows of the commits that became durable after the last step's rows (a
        run stopped by a full disk closes its ledger with the commit whose flush failed)."""
        self._write(live=False)

    def close(self) -> None:
        self.metrics.close()


class ProgressLine(Observer):
    """The live progress line (``run.progress``) and the heartbeat.

    On a terminal the line is redrawn in place and cut to its width
    (:mod:`freshroll.observe.fit`: its fields go most important first, so a narrow terminal
    keeps step, reward, accepted/s, lag and idle); in a log file every field is written."""

    def __init__(self, cfg: Config, stream: TextIO) -> None:
        self.cfg, self.stream = cfg, stream
        self._fields: list[str] = []  # the progress line drawn in place on a terminal, if any
        self.pace = Pace(cfg.run.steps)  # steps/s and the time left
        self._eval: tuple[int, float] | None = None  # the last evaluation: step, reward

    def on_row(self, row: Row, live: bool) -> None:
        """One line per step on a terminal (redrawn in place); every ~2.5% of the run in logs,
        and each step with an evaluation. The rows a stopped run catches up on are not drawn."""
        if not live or not self.cfg.run.progress:
            return
        step, total = row["step"], self.cfg.run.steps
        self.pace.feed(step, row["t"])
        evaluated = row.get("eval/reward")
        if isinstance(evaluated, int | float):
            self._eval = (step, float(evaluated))
        tty = self.stream.isatty()
        if not tty and step % max(1, total // 40) and step != total and evaluated is None:
            return
        fields = self._fields_of(row)
        end = "\n" if not tty or step == total else ""
        line = fit(fields, width(self.stream))
        self.stream.write(("\r" if tty else "") + line + (_CLEAR if tty else "") + end)
        self.stream.flush()
        self._fields = fields if tty and not end else []

    def _fields_of(self, row: Row) -> list[str]:
        """The progress line's fields, most important first."""
        return [
            f"step {row['step']:>4}/{self.cfg.run.steps}",
            f"reward {_fmt(row.get('reward_mean'), '.3f')}",
            *([f"eval {self._eval[1]:.3f}@{self._eval[0]}"] if self._eval else []),
            f"accepted/s {_fmt(row['accepted_per_s'], '7.1f')}",
            f"lag {_fmt(row.get('lag_mean'), '.2f')} "
            f"(max {_fmt(row.get('lag_max'), '.0f')}/{self.cfg.run.max_staleness})",
            f"idle {_fmt(row['trainer_idle_ratio'], '5.1%')}",
            f"discards {row['discards']} ({_fmt(row['discard_rate'], '.1%')})",
            f"t {_fmt(row['t'], '6.1f')}s",
            self.pace.render(),
            *_reward_details(row),
        ]

    def on_wait(self, line: str) -> None:
        """A heartbeat (:mod:`freshroll.ports.waits`): ``waiting 60 s on w0 generate,
        limit 600 s``. On a terminal it is added to the progress line drawn in place (the
        next step redraws it; the line's last fields give way to it on a narrow terminal);
        otherwise, and with ``run.progress`` off, a line of its own."""
        if self._fields:
            self.stream.write("\r" + fit_with(self._fields, line, width(self.stream)) + _CLEAR)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


class Evaluations(Observer):
    """The write-ahead of a commit's due evaluation: ``eval.jsonl``'s lines (their columns
    into ``evals``), and their ``evaluated`` record, durable with the step's commit, which
    binds eval.jsonl, the eval columns and summary.json's ``eval`` to the ledger (verify)."""

    def __init__(self, buf: SampleBuffer, evals: Evals, evaluator: Evaluator | None) -> None:
        self.buf, self.evals, self.evaluator = buf, evals, evaluator
        self._done: dict[int, Evaluated] = {}  # step -> its evaluation's record

    def before_commit(self, version: PolicyVersion, state: TrainerState) -> None:
        """Evaluate the policy after the step, before its commit, when it is due (on the
        trainer's thread)."""
        ev = self.evaluator
        if ev is None or not ev.due(version.step):
            return
        lines = ev.evaluate(version.step, ev.policy(state))
        self.evals[version.step] = lines
        self._done[version.step] = Evaluated(ts=self.buf.clock.now(), step=version.step,
                                             lines=lines)

    def checkpointed(self, step: int) -> Evaluated | None:
        return self._done.pop(step, None)


class Checkpointer(Observer):
    """The write-ahead of a commit's checkpoint, before the step's commit (this module's
    docstring)."""

    def __init__(self, run_dir: Path, cfg: Config, buf: SampleBuffer) -> None:
        self.run_dir, self.cfg, self.buf = run_dir, cfg, buf
        self._saved: dict[int, CheckpointSaved] = {}  # step -> its checkpoint's record

    def before_commit(self, version: PolicyVersion, state: TrainerState) -> None:
        """Every ``checkpoint_every`` steps and at the last step (resume replays the rest).
        Runs on the trainer's thread, before the step's commit.

        ``state()``: the learner's model and optimizer state, asked for only when a
        checkpoint is due (a trainer actor's are fetched from its process then)."""
        every = self.cfg.trainer.checkpoint_every
        if version.step % every and version.step < self.cfg.run.steps:
            return
        from freshroll.trainer.checkpoint import checkpoint_dir, save_checkpoint

        root = self.run_dir / "checkpoints"
        target = checkpoint_dir(root, version.step)
        model_state, optimizer_state = state()
        try:
            save_checkpoint(  # shards: trainer.parallel: fsdp's ranks each write theirs
                target, model_state=model_state, optimizer=optimizer_state,
                meta={"step": version.step, "version": str(version)},
                shards=getattr(state, "shards", None),
            )
        except OSError as exc:  # disk full, read-only, ...: the step is not committed
            raise checkpoint_error(target, exc) from exc
        # recorded by the pipeline, on its loop (this runs on the trainer's thread), before
        # the step's commit: durable with it; verify binds the files to the ledger with it
        self._saved[version.step] = CheckpointSaved(
            ts=self.buf.clock.now(), step=version.step, version=str(version),
            files=file_digests(target))
        keep = self.cfg.trainer.keep_checkpoints
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def checkpointed(self, step: int) -> CheckpointSaved | None:
        """The record of the checkpoint :meth:`before_commit` wrote for ``step``, if any."""
        return self._saved.pop(step, None)


class Recording(Observer):
    """A run's observers: :class:`Checkpointer`, :class:`MetricsRows` (reconciled now),
    :class:`ProgressLine`, :class:`~freshroll.pipeline.observers.Notes`, then ``extra`` in its
    order. :attr:`observers` is the list the run's pipeline takes; called itself, it passes
    each callback to every one of them (as the pipeline does)."""

    def __init__(self, run_dir: Path, cfg: Config, buf: SampleBuffer, stream: TextIO,
                 evaluator: Evaluator | None = None, extra: Sequence[RunObserver] = ()) -> None:
        # eval.jsonl (freshroll.runtime.evaluation): its columns join their steps' rows
        trim_evals(run_dir, buf.version.step if buf.version is not None else 0)
        evals = evals_by_step(run_dir)
        self.observers: list[RunObserver] = []
        self.evaluations = Evaluations(buf, evals, evaluator)
        self.checkpointer = Checkpointer(run_dir, cfg, buf)
        self.rows = MetricsRows(run_dir, buf, stream, evals, self.observers)
        self.progress = ProgressLine(cfg, stream)
        self.observers += [self.evaluations, self.checkpointer, self.rows, self.progress,
                           Notes()]
        mon = cfg.monitor
        if mon.log_completions:  # after the progress line: the table under the step's line
            self.observers.append(CompletionsLog(
                buf.ledger, mon.log_completions, mon.completions_to_print, stream,
                lambda: tokenizer_decode(run_dir)))
        self.observers += extra

    def before_commit(self, version: PolicyVersion, state: TrainerState) -> None:
        self.evaluations.before_commit(version, state)
        self.checkpointer.before_commit(version, state)

    def on_step(self, report: StepReport) -> None:
        for o in self.observers:
            o.on_step(report)

    def on_skip(self, step: int, detail: str) -> None:
        for o in self.observers:
            o.on_skip(step, detail)

    def on_mode(self, switch: Switch) -> None:
        for o in self.observers:
            o.on_mode(switch)

    def on_wait(self, line: str) -> None:
        for o in self.observers:
            o.on_wait(line)

    def catch_up(self) -> None:
        self.rows.catch_up()

    def close(self) -> None:
        close_all(self.observers)


def _reward_details(row: Row) -> list[str]:
    """The progress line's reward details: the share of groups without learning signal and,
    for more than one reward function, each one's mean (``metrics.jsonl``'s columns)."""
    out = []
    zero = row.get("frac_reward_zero_std")
    if zero is not None:
        out.append(f"zero-std groups {_fmt(zero, '.0%')}")
    means = {k[len("rewards/"):-len("/mean")]: v for k, v in row.items()
             if k.startswith("rewards/") and k.endswith("/mean")}
    if len(means) > 1:
        out.append("[" + ", ".join(f"{n} {_fmt(v, '.3f')}" for n, v in means.items()) + "]")
    return out


_CLEAR = "\x1b[K"  # erase to the end of the line: a shorter redraw leaves nothing behind


def checkpoint_error(target: Path, exc: OSError) -> StorageError:
    """A checkpoint write's failure as one line naming the checkpoint and the file that
    failed (``exc.filename``: safetensors' own errors come as OSError, see
    :func:`freshroll.trainer.checkpoint.save_tensors`)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return StorageError(f"checkpoint {target}: {reason}")
    return StorageError(f"checkpoint {target}: cannot write {exc.filename}: {reason}")


def _fmt(value: Any, spec: str) -> str:
    """A row value for the progress line; a missing or non-finite one as ``-``."""
    return format(value, spec) if isinstance(value, int | float) else "-"


__all__ = ["Checkpointer", "Evaluations", "MetricsRows", "ProgressLine", "Recording",
           "checkpoint_error"]

"""``freshroll replay RUN_DIR [--from A] [--to B]``: rebuild a run's policy from its ledger and
prove that every committed version is the one its recorded inputs produce.

From the newest checkpoint on the committed chain at or before ``A`` (step 0: the initial
model), each committed step ``A+1 .. B`` is trained again on its recorded batch, under the
settings the ledger recorded for it, on the CPU with the run's trainer thread count; after
each, the weights digest and the policy-version digest (parent, batch, settings digest:
:meth:`~freshroll.ledger.lineage.PolicyVersion.child`) are recomputed and compared with the ledger's
``committed`` event. The first step that differs stops the replay with its cause:

=========  ==============================================================================
cause      meaning
=========  ==============================================================================
inputs     a file of the run directory's ``model/`` or ``inputs/`` does not have the sha256
           the ledger's ``run_config`` recorded, or (a replay from step 0) the initial
           model's digest is not the one the run started from: a tampered input, named,
           before any training
samples    a stored sample of the replayed steps does not match the digest its
           ``generated`` event recorded (altered data: ``verify`` names every file)
checkpoint the checkpoint replayed from does not hold the committed weights of its step
settings   the config the ledger recorded for the step gives another settings digest than
           the one committed (different code, or an edited ledger)
weights    every input matches its record, the output does not: a non-deterministic kernel,
           another torch build or another thread count than the run's
version    the recomputed policy version differs from the committed one (its batch or
           settings digest does not chain)
=========  ==============================================================================

A replayed step is a full trainer step; the replay's seconds per step are reported beside
the run's own (the ``train_s`` of its commits).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from freshroll.clock import RealClock
from freshroll.config import Config, read_yaml, validate
from freshroll.engines.model_dir import quiet_transformers
from freshroll.engines.specs import engine_spec
from freshroll.errors import ConfigError, RunDirError
from freshroll.kernel.buffer import SampleBuffer, replay_ledger
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import input_digests, policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.runtime.kernel_settings import kernel_config
from freshroll.runtime.learner import (
    Heartbeat,
    initial_model_dir,
    new_learner,
    recorded_configs,
    restore,
    resume_point,
    step_settings,
    with_reference,
)
from freshroll.runtime.resume import History, history
from freshroll.runtime.trainer_group import start_group
from freshroll.trainer.ranks import Gloo
from freshroll.trainer.replay import (
    CommittedStep,
    altered_payloads,
    committed_chain,
    train_samples,
    weights_digest,
)


@dataclass(frozen=True)
class Divergence:
    step: int
    cause: str  # inputs | samples | checkpoint | settings | weights | version
    message: str


@dataclass(frozen=True)
class ReplayResult:
    from_step: int  # the step the replay started from (a checkpoint's, or 0)
    to_step: int
    steps: int  # steps trained again and matched
    replay_s_per_step: float | None
    train_s_per_step: float | None  # the run's own, over the same steps
    threads: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def render(self) -> str:
        start = f"the checkpoint at step {self.from_step}" if self.from_step else \
            "the initial model"
        pace = ""
        if self.replay_s_per_step is not None:
            pace = f"; {self.replay_s_per_step:.3f} s per replayed step"
            if self.train_s_per_step is not None:
                pace += f" (the run trained them at {self.train_s_per_step:.3f} s per step)"
        if self.divergence is None:
            return (f"replay: steps {self.from_step + 1}-{self.to_step} from {start}, "
                    f"{self.threads} thread(s): every weights and policy-version digest "
                    f"matches the ledger ({self.steps} steps{pace})")
        d = self.divergence
        if not self.steps:  # the first step (or an input) diverged: nothing matched yet
            return (f"replay: DIVERGED at step {d.step} ({d.cause}): {d.message}\n"
                    f"replay: no step from {start} was matched before it")
        return (f"replay: DIVERGED at step {d.step} ({d.cause}): {d.message}\n"
                f"replay: steps {self.from_step + 1}-{d.step - 1} from {start} matched "
                f"({self.steps} steps{pace})")

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "from_step": self.from_step, "to_step": self.to_step,
                "steps": self.steps, "replay_s_per_step": self.replay_s_per_step,
                "train_s_per_step": self.train_s_per_step, "threads": self.threads,
                "divergence": None if self.divergence is None else self.divergence.__dict__}


def _run_threads(run_dir: Path) -> int | None:
    """The trainer's intra-op threads the run recorded (summary.json's host placement)."""
    try:
        host = json.loads((run_dir / "summary.json").read_text()).get("host") or {}
        threads = (host.get("placement") or {}).get("trainer_threads")
    except (OSError, ValueError, AttributeError):
        return None
    return threads if isinstance(threads, int) and threads > 0 else None


def _inputs(run_dir: Path) -> tuple[Config, Path]:
    """The run's config and initial model; a typed error for a directory with nothing to
    replay."""
    if not (run_dir / LEDGER_FILE).is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no {LEDGER_FILE})")
    cfg = validate(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    if not engine_spec(cfg.rollout.engine).trains:
        raise ConfigError(f"{run_dir}: a simulated run (rollout.engine sim) trains no model: "
                          "there is nothing to replay")
    return cfg, initial_model_dir(cfg, run_dir)


def replay_run(run_dir: Path, from_step: int = 0, to_step: int | None = None,
               say: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay ``run_dir``'s committed steps (module docstring)."""
    run_dir = Path(run_dir)
    cfg, source = _inputs(run_dir)
    quiet_transformers()
    threads = _run_threads(run_dir) or torch.get_num_threads()
    torch.set_num_threads(threads)
    kernel = kernel_config(cfg)
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        buf = replay_ledger(ledger, kernel, RealClock())
        assert buf.version is not None
        last = buf.version.step
        to = last if to_step is None else to_step
        if not 0 <= from_step <= to <= last:
            raise ConfigError(f"--from {from_step} --to {to}: the run committed steps 0..{last} "
                              "(0 <= FROM <= TO)")
        events = [e for _, e in ledger.events()]
        chain = committed_chain(ledger)
        ckpt_path, start = resume_point(run_dir, chain, from_step)
        tampered = _tampered_input(run_dir, source, events, start)
        if tampered is not None:  # before the model is loaded: a tampered one may not load
            return ReplayResult(start, to, 0, None, None, threads, tampered)
        r = _Replay(cfg, source, buf, chain, history(events), threads, to)
        try:  # trainer.parallel: the run's ranks replay it, stopped at the end
            r.train_s = {policy_step(e.version): e.train_s for e in events
                         if isinstance(e, ev.Committed)}
            r.start = start
            if r.start > 0:
                bad = r.restore(ckpt_path, ckpt_path.relative_to(run_dir))
                if bad is not None:
                    return r.result(bad)
            altered = {s.split(":")[0] for s in altered_payloads(
                ledger, [s for k in range(r.start + 1, to + 1) for s in chain[k].samples])}
            heartbeat = Heartbeat(cfg.limits.heartbeat_s, r.start, to)
            for step in range(r.start + 1, to + 1):
                heartbeat.before(step)
                bad = r.step(step, altered)
                if bad is not None:
                    return r.result(bad)
                if say is not None:
                    say(f"step {step}: weights and version {chain[step].version.digest} match")
        finally:
            r.learner.ranks.close()
    return r.result(None)


def _tampered_input(run_dir: Path, source: Path, events: Sequence[ev.Event],
                    start: int) -> Divergence | None:
    """The run's recorded inputs re-read (module docstring, cause ``inputs``): a tampered
    starting model is named as such, never blamed on the kernels."""
    configs = [e for e in events if isinstance(e, ev.RunConfig)]
    recorded = next((e.input_files for e in reversed(configs) if e.input_files is not None),
                    None)
    if recorded is not None:
        have = input_digests(run_dir)
        for name, want in sorted(recorded.items()):
            got = have.get(name)
            if got != want:
                how = "missing" if got is None else f"sha256 {got}"
                return Divergence(start + 1, "inputs", (
                    f"{name}: {how}, the ledger recorded sha256 {want}: an input of the run "
                    "was altered after the run read it, not the kernels (freshroll verify "
                    "names every file)"))
    if start > 0 or not configs:  # from step 0: the model itself (a model.path outside too)
        return None
    from freshroll.engines.tiny import model_digest

    try:
        got = model_digest(source)
    except Exception as exc:  # garbage weights do not load at all
        got = f"unreadable ({type(exc).__name__})"
    want = configs[0].model_digest
    if got == want:
        return None
    return Divergence(1, "inputs", (
        f"the initial model {source} has digest {got}, the run started from {want}: it was "
        "altered after the run read it, not the kernels"))


class _Replay:
    """One replay's learner and what it is checked against; :meth:`step` trains one
    committed step again and names its divergence, if any."""

    def __init__(self, cfg: Config, source: Path, buf: SampleBuffer,
                 chain: dict[int, CommittedStep], hist: History, threads: int,
                 to: int) -> None:
        self.cfg, self.buf, self.chain, self.hist = cfg, buf, chain, hist
        self.threads, self.to, self.start, self.steps, self.spent = threads, to, 0, 0, 0.0
        self.train_s: dict[int, float] = {}
        self.learner, _ = new_learner(cfg, source)
        start_group(cfg, source, self.learner, new_learner)  # the run's ranks, if it had some
        self.recorded = recorded_configs(hist)
        with_reference(self.learner, self.recorded)
        if isinstance(self.learner.ranks, Gloo):  # the reference on every rank
            self.learner.ranks.sync(self.learner)

    def restore(self, path: Path, shown: Path) -> Divergence | None:
        """Load the checkpoint at ``path``; a divergence if it lacks its committed weights."""
        restore(self.learner, path, self.start)
        if isinstance(self.learner.ranks, Gloo):
            self.learner.ranks.sync(self.learner)
        got = weights_digest(self.learner.model)
        want = self.chain[self.start].version.weights_digest
        if want is None or got == want:
            return None
        return Divergence(self.start, "checkpoint", (
            f"{shown} holds weights {got}, the ledger committed {want} at step {self.start}: "
            "the checkpoint was altered (freshroll verify names its files)"))

    def step(self, step: int, altered: set[str]) -> Divergence | None:
        c = self.chain[step]
        bad = [s for s in c.samples if s in altered]
        if bad:
            return Divergence(step, "samples", (
                f"{len(bad)} stored sample(s) of its batch do not match the digests their "
                f"generated events recorded ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}): altered data, not the kernels"))
        wrong = step_settings(self.learner, self.cfg, self.hist, self.recorded, step)
        if wrong is not None:
            return Divergence(step, "settings", f"{wrong} (another freshroll, or an edited "
                                                "ledger)")
        t0 = time.perf_counter()
        self.learner.step(train_samples(self.buf, c.samples, c.parent.step), step)
        self.spent += time.perf_counter() - t0
        got = weights_digest(self.learner.model)
        want = c.version.weights_digest
        if want is not None and got != want:
            return Divergence(step, "weights", (
                f"trained again it gives weights {got}, the ledger committed {want}; its "
                "samples and settings match their records: a non-deterministic kernel, "
                f"another torch build (here {torch.__version__}) or another thread count "
                f"(here {self.threads})"))
        again = c.parent.child(c.samples, self.learner.settings_digest, got)
        if again.digest != c.version.digest:
            return Divergence(step, "version", (
                f"its batch and settings give version {again}, the ledger committed "
                f"{c.version}"))
        self.steps += 1
        return None

    def result(self, divergence: Divergence | None) -> ReplayResult:
        known = [self.train_s[k] for k in range(self.start + 1, self.start + self.steps + 1)
                 if self.train_s.get(k)]
        return ReplayResult(self.start, self.to, self.steps,
                            self.spent / self.steps if self.steps else None,
                            sum(known) / len(known) if known else None, self.threads,
                            divergence)


__all__ = ["Divergence", "ReplayResult", "replay_run"]

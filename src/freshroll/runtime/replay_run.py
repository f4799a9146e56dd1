"""``freshroll replay RUN_DIR [--from A] [--to B]``: rebuild a run's policy from its ledger and
prove that every committed version is the one its recorded inputs produce.

From the newest checkpoint on the committed chain at or before ``A`` (step 0: the initial
model), each committed step ``A+1 .. B`` is trained again on its recorded batch, under the
settings the ledger recorded for it, on the CPU with the run's trainer thread count; after
each, the weights digest and the policy-version digest (parent, batch, settings digest:
:meth:`~freshroll.lineage.PolicyVersion.child`) are recomputed and compared with the ledger's
``committed`` event. The first step that differs stops the replay with its cause:

=========  ==============================================================================
cause      meaning
=========  ==============================================================================
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

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from freshroll import events as ev
from freshroll.buffer import KernelConfig, replay_ledger
from freshroll.clock import RealClock
from freshroll.config import read_yaml, validate
from freshroll.errors import ConfigError, RunDirError
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.lineage import policy_step
from freshroll.runtime.learner import (
    Heartbeat,
    apply_settings,
    initial_model_dir,
    new_learner,
    recorded_configs,
    restore,
    resume_point,
)
from freshroll.runtime.resume import canonical, history
from freshroll.trainer.replay import (
    altered_payloads,
    committed_chain,
    train_samples,
    weights_digest,
)


@dataclass(frozen=True)
class Divergence:
    step: int
    cause: str  # samples | checkpoint | settings | weights | version
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


def replay_run(run_dir: Path, from_step: int = 0, to_step: int | None = None,
               say: Callable[[str], None] | None = None) -> ReplayResult:
    """Replay ``run_dir``'s committed steps (module docstring)."""
    run_dir = Path(run_dir)
    if not (run_dir / LEDGER_FILE).is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no {LEDGER_FILE})")
    cfg = validate(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    if cfg.rollout.engine == "sim":
        raise ConfigError(f"{run_dir}: a simulated run (rollout.engine sim) trains no model: "
                          "there is nothing to replay")
    source = initial_model_dir(cfg, run_dir)
    from freshroll.engines.model_dir import quiet_transformers

    quiet_transformers()
    threads = _run_threads(run_dir) or torch.get_num_threads()
    torch.set_num_threads(threads)
    kernel = KernelConfig(cfg.run.max_staleness, cfg.rollout.batch_groups, cfg.rollout.group_size)
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        buf = replay_ledger(ledger, kernel, RealClock())
        assert buf.version is not None
        last = buf.version.step
        to = last if to_step is None else to_step
        if not 0 <= from_step <= to <= last:
            raise ConfigError(f"--from {from_step} --to {to}: the run committed steps 0..{last} "
                              "(0 <= FROM <= TO)")
        chain = committed_chain(ledger)
        hist = history(e for _, e in ledger.events())
        train_s = {policy_step(e.version): e.train_s for _, e in ledger.events()
                   if isinstance(e, ev.Committed)}
        learner, _ = new_learner(cfg, source)
        recorded = recorded_configs(hist)
        if learner.ref is None and any(c.trainer.kl_coef > 0 for c in recorded.values()):
            learner.ref = copy.deepcopy(learner.model).eval()
        ckpt_path, start = resume_point(run_dir, chain, from_step)

        def result(steps: int, spent: float, divergence: Divergence | None) -> ReplayResult:
            known = [train_s[k] for k in range(start + 1, start + steps + 1)
                     if train_s.get(k)]
            return ReplayResult(start, to, steps, spent / steps if steps else None,
                                sum(known) / len(known) if known else None, threads,
                                divergence)

        if start > 0:
            restore(learner, ckpt_path, start)
            got, want = weights_digest(learner.model), chain[start].version.weights_digest
            if want is not None and got != want:
                return result(0, 0.0, Divergence(start, "checkpoint", (
                    f"{ckpt_path.relative_to(run_dir)} holds weights {got}, the ledger "
                    f"committed {want} at step {start}: the checkpoint was altered "
                    "(freshroll verify names its files)")))
        altered = {s.split(":")[0] for s in altered_payloads(
            ledger, [s for k in range(start + 1, to + 1) for s in chain[k].samples])}
        heartbeat = Heartbeat(cfg.limits.heartbeat_s, start, to)
        spent, steps = 0.0, 0
        for step in range(start + 1, to + 1):
            c = chain[step]
            bad = [s for s in c.samples if s in altered]
            if bad:
                return result(steps, spent, Divergence(step, "samples", (
                    f"{len(bad)} stored sample(s) of its batch do not match the digests "
                    f"their generated events recorded ({', '.join(bad[:3])}"
                    f"{', ...' if len(bad) > 3 else ''}): altered data, not the kernels")))
            heartbeat.before(step)
            config, committed = hist.steps.get(step, (None, ""))
            apply_settings(learner, recorded[canonical(config)] if config is not None else cfg)
            if config is not None and learner.settings_digest != committed:
                return result(steps, spent, Divergence(step, "settings", (
                    f"committed under settings {committed}; the config the ledger recorded "
                    f"for it gives {learner.settings_digest} here (another freshroll or an "
                    "edited ledger)")))
            t0 = time.perf_counter()
            learner.step(train_samples(buf, c.samples, c.parent.step), step)
            spent += time.perf_counter() - t0
            got = weights_digest(learner.model)
            want = c.version.weights_digest
            if want is not None and got != want:
                return result(steps, spent, Divergence(step, "weights", (
                    f"trained again it gives weights {got}, the ledger committed {want}; its "
                    "samples and settings match their records: a non-deterministic kernel, "
                    f"another torch build (here {torch.__version__}) or another thread count "
                    f"(here {threads})")))
            again = c.parent.child(c.samples, learner.settings_digest, got)
            if again.digest != c.version.digest:
                return result(steps, spent, Divergence(step, "version", (
                    f"its batch and settings give version {again}, the ledger committed "
                    f"{c.version}")))
            steps += 1
            if say is not None:
                say(f"step {step}: weights {got} and version {c.version.digest} match")
    return result(steps, spent, None)


__all__ = ["Divergence", "ReplayResult", "replay_run"]

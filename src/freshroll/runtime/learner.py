"""The learner at a committed step: the newest checkpoint on the committed chain, then the
later committed steps trained again from the ledger, each under the settings the ledger
recorded for it and checked against its committed weights digest
(:mod:`freshroll.trainer.replay`). Used by ``--resume`` and ``export-model``.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from freshroll.config import Config, validate
from freshroll.engines.model_dir import loading_model
from freshroll.errors import LineageError, ResumeError, RunDirError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ports.waits import seconds
from freshroll.runtime.resume import History, canonical
from freshroll.runtime.trainer_group import start_group
from freshroll.trainer.checkpoint import load_checkpoint
from freshroll.trainer.fsdp import by_index
from freshroll.trainer.grpo import GRPOLearner, use_kernel
from freshroll.trainer.lora import wrap
from freshroll.trainer.ranks import Gloo
from freshroll.trainer.replay import CommittedStep, committed_chain, replay


def resume_point(run_dir: Path, chain: dict[int, CommittedStep], step: int) -> tuple[Path, int]:
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


def ranks_of(trainer: dict[str, Any]) -> int:
    """The ranks a (recorded) trainer section trained with: ``world_size`` under a
    ``parallel`` mode, else 1 (a config from before ``trainer.parallel`` included)."""
    if trainer.get("parallel", "none") == "none":
        return 1
    return int(trainer.get("world_size", 1))


def check_replay_ranks(cfg: Config, run_dir: Path, hist: History) -> None:
    """A resume whose learner must replay committed steps trained at another world size
    than ``cfg``'s is refused before any write (:class:`ResumeError` naming the field): the
    same gradient summed in another order gives other bits than the committed digests."""
    from freshroll.ledger.store import LEDGER_FILE, Ledger

    if hist.step == 0:
        return
    want = ranks_of(cfg.trainer.model_dump())
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        chain = committed_chain(ledger)
    _, ckpt = resume_point(run_dir, chain, hist.step)
    for step in range(ckpt + 1, hist.step + 1):
        config = hist.steps.get(step, (None, ""))[0]
        had = ranks_of(config.get("trainer", {})) if config is not None else want
        if had != want:
            raise ResumeError(
                f"trainer.world_size: {want} rank(s), but committed step {step} was trained by "
                f"{had} and would be replayed (the newest checkpoint on the chain is of step "
                f"{ckpt}): resume at the world size that trained it, or from a checkpoint of "
                f"step {hist.step} (docs/parallel.md)")


def initial_model_dir(cfg: Config, run_dir: Path) -> Path:
    """The run's initial model: ``model.path``, or the embedded one saved in ``run_dir``;
    :class:`RunDirError` when it is gone."""
    source = Path(cfg.model.path) if cfg.model.path is not None else run_dir / "model"
    if not (source / "config.json").is_file():
        raise RunDirError(f"{source}: the run's initial model is missing (no config.json)")
    return source


def restore(learner: GRPOLearner, path: Path, step: int) -> None:
    """Load the checkpoint at ``path`` (of committed step ``step``) into ``learner``."""
    ckpt = load_checkpoint(path)
    learner.load_model_state(ckpt.model_state)
    if ckpt.optimizer_state is not None:
        learner.optimizer.load_state_dict(  # a sharded checkpoint's is keyed by name
            ckpt.optimizer_state if ckpt.sharded is None
            else by_index(learner.model, ckpt.optimizer_state))
        use_kernel(learner.optimizer, learner.cfg.optim)
    learner.steps = step


def new_learner(cfg: Config, path: Path) -> tuple[GRPOLearner, Any]:
    """A learner on the initial model at ``path``, and that model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with loading_model(path):
        base = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    lora = cfg.trainer.lora  # adapters on the model; only they train
    model: torch.nn.Module = base if lora is None else wrap(base, lora)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    learner = GRPOLearner(
        model, cfg.trainer, temperature=cfg.rollout.temperature, pad_id=int(pad),
        max_new_tokens=cfg.rollout.max_new_tokens, total_steps=cfg.run.steps,
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
    start_group(cfg, path, learner, new_learner)  # trainer.parallel's ranks: learner.ranks
    assert buf.version is not None
    target = buf.version.step if to_step is None else to_step
    if target == 0:
        return learner
    recorded = recorded_configs(hist)
    with_reference(learner, recorded)
    chain = committed_chain(buf.ledger)
    ckpt_path, ckpt_step = resume_point(run_dir, chain, target)
    if ckpt_step > 0:
        restore(learner, ckpt_path, ckpt_step)
    if isinstance(learner.ranks, Gloo):  # every rank at rank 0's state before the replay
        learner.ranks.sync(learner)

    said = Heartbeat(cfg.limits.heartbeat_s, ckpt_step, target)

    def before_step(step: int) -> None:
        said.before(step)
        wrong = step_settings(learner, cfg, hist, recorded, step)
        if wrong is not None:
            raise LineageError(wrong)

    try:
        n = replay(learner, buf, chain, ckpt_step, to_step=target, before_step=before_step)
    except LineageError as exc:  # the ledger's steps cannot be rebuilt: resume refused
        raise ResumeError(str(exc)) from exc
    apply_settings(learner, cfg)
    if n and not quiet:
        sys.stderr.write(f"resume: checkpoint at step {ckpt_step}, replayed {n} committed "
                         f"steps from the ledger; weights digests match\n")
    return learner


def with_reference(learner: GRPOLearner, recorded: dict[str, Config]) -> None:
    """Give ``learner`` its KL reference, the initial model (call before any step), when a
    config the ledger recorded trains with ``trainer.kl_coef`` > 0."""
    if learner.ref is None and any(c.trainer.kl_coef > 0 for c in recorded.values()):
        learner.ref = copy.deepcopy(learner.model).eval()


def step_settings(learner: GRPOLearner, cfg: Config, hist: History | None,
                  recorded: dict[str, Config], step: int) -> str | None:
    """Put in force the settings committed ``step`` was trained under (the ledger's config
    for it, :func:`recorded_configs`; without one, ``cfg``). Returns why they cannot be the
    committed ones (their settings digest differs), or None."""
    config, committed = hist.steps.get(step, (None, "")) if hist else (None, "")
    in_force = recorded[canonical(config)] if config is not None else cfg
    ranks = ranks_of(in_force.trainer.model_dump())
    if ranks != learner.ranks.world:  # the same gradient, another float sum: other bits
        return (f"step {step} was trained by {ranks} rank(s) (trainer.world_size), this "
                f"learner has {learner.ranks.world}: a run's steps are rebuilt at the world "
                "size that trained them (docs/parallel.md)")
    apply_settings(learner, in_force)
    if config is not None and learner.settings_digest != committed:
        return (f"step {step} was committed under settings {committed}, but the config the "
                f"ledger recorded for it gives {learner.settings_digest}")
    return None


class Heartbeat:
    """A replay longer than ``limits.heartbeat_s`` says where it is, before a step once per
    interval, on stderr (``replaying committed step 12 of 40 (from the checkpoint at step
    0), 31 s so far``): a resume, a Ray trainer actor's rebuild and ``export-model`` replay
    before anything else runs, and each replayed step is a full trainer step."""

    def __init__(self, heartbeat_s: float, from_step: int, to_step: int) -> None:
        self.heartbeat_s, self.from_step, self.to_step = heartbeat_s, from_step, to_step
        self.t0 = self.last = time.monotonic()

    def before(self, step: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.heartbeat_s:
            self.last = now
            sys.stderr.write(f"replaying committed step {step} of {self.to_step} (from the "
                             f"checkpoint at step {self.from_step}), {seconds(now - self.t0)} s "
                             "so far\n")
            sys.stderr.flush()


def recorded_configs(hist: History | None) -> dict[str, Config]:
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
    such a learner, built on a stand-in module), the run's total steps (an lr schedule's
    end), and the optimizer's lr and weight decay, which a loaded checkpoint set to the
    values of its own step (each step sets its own lr again: ``trainer.lr_schedule``)."""
    t = cfg.trainer
    fresh = GRPOLearner(
        torch.nn.Linear(1, 1), t, temperature=cfg.rollout.temperature, pad_id=learner.pad_id,
        max_new_tokens=cfg.rollout.max_new_tokens, total_steps=cfg.run.steps,
    )
    learner.cfg, learner.loss_cfg = fresh.cfg, fresh.loss_cfg
    learner.total_steps = fresh.total_steps
    learner.temperature, learner.settings_digest = fresh.temperature, fresh.settings_digest
    use_kernel(learner.optimizer, t.optim)
    for group in learner.optimizer.param_groups:
        group["lr"], group["weight_decay"] = t.lr, t.weight_decay

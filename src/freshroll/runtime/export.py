"""``freshroll export-model``: a trained policy as an ordinary Hugging Face model directory.

The weights of committed step ``N`` are rebuilt the way ``--resume`` rebuilds them
(:func:`freshroll.runtime.learner.build_learner`): the newest checkpoint on the committed chain
at or before ``N`` (or the initial model for ``N = 0``), then the committed steps after it
trained again from the ledger under the settings recorded for each, each checked against its
committed weights digest. The result is written with ``save_pretrained`` beside
the initial model's config and tokenizer, so ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load it, plus ``freshroll_export.json`` naming the run, the
step, its policy version and weights digest (the lineage of the exported weights).

Where a checkpoint's config and tokenizer live (the documented pointer): checkpoints hold
weights and optimizer state only; the config and tokenizer are those of the run's initial
model, ``RUN_DIR/model`` for the embedded tiny model, or ``model.path`` of the run's
``config.yaml`` for a user's model (training changes neither).

The output directory is written atomically (:func:`freshroll.atomic.replace_dir`) and an
existing one is never replaced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from freshroll.atomic import replace_dir
from freshroll.errors import ConfigError, LineageError, RunDirError
from freshroll.ledger.lineage import PolicyVersion

if TYPE_CHECKING:
    from freshroll.config import Config
    from freshroll.trainer.grpo import GRPOLearner


@dataclass(frozen=True)
class Exported:
    out: Path
    step: int
    version: str
    weights_digest: str
    replayed: int


def export_model(run_dir: Path, out: Path, step: int | None = None, *,
                 adapter_only: bool = False) -> Exported:
    """Write the policy of committed ``step`` (default: the last) of ``run_dir`` to ``out``.

    A LoRA run (``trainer.lora``) is written merged (a plain model directory) or, with
    ``adapter_only``, as its peft adapter directory (``adapter_config.json`` and
    ``adapter_model.safetensors``, for ``PeftModel.from_pretrained`` on the initial model).
    """
    from transformers import AutoTokenizer

    from freshroll.config import read_yaml, validate
    from freshroll.engines.model_dir import quiet_transformers
    from freshroll.ledger.store import LEDGER_FILE
    from freshroll.runtime.learner import initial_model_dir
    from freshroll.trainer.lora import is_lora, merged_copy
    from freshroll.trainer.replay import weights_digest

    if not (run_dir / LEDGER_FILE).is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no {LEDGER_FILE})")
    if out.exists():
        raise RunDirError(f"{out}: already exists; choose a new output directory")
    cfg = validate(read_yaml(run_dir / "config.yaml"), str(run_dir / "config.yaml"))
    if adapter_only and cfg.trainer.lora is None:
        raise ConfigError(f"--adapter-only (adapter_only=True): {run_dir} trained every weight "
                          "(no trainer.lora); export it whole")
    quiet_transformers()
    source = initial_model_dir(cfg, run_dir)
    learner, want, version, replayed = _rebuilt(cfg, run_dir, source, step)
    learner.ranks.close()  # trainer.parallel's ranks replayed with rank 0; its weights suffice
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    digest = weights_digest(learner.model)
    committed = version.weights_digest
    if committed is not None and digest != committed:
        raise LineageError(f"step {want}: rebuilt weights {digest} differ from the committed "
                           f"{committed}")
    learner.model.eval()
    lora = is_lora(learner.model)
    record = {
        "run_dir": str(run_dir.resolve()), "step": want, "policy_version": str(version),
        "weights_digest": digest, "source_model": str(source.resolve()),
    }
    if lora:
        record["lora"] = "adapter" if adapter_only else "merged"
    model = learner.model if adapter_only or not lora else merged_copy(learner.model)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]  # a HF model's method, typed as nn.Module
        tokenizer.save_pretrained(tmp)
        (tmp / "freshroll_export.json").write_text(json.dumps(record, indent=1) + "\n")

    replace_dir(out, fill)
    return Exported(out, want, str(version), digest, replayed)


def _rebuilt(cfg: Config, run_dir: Path, source: Path,
             step: int | None) -> tuple[GRPOLearner, int, PolicyVersion, int]:
    """The learner at committed ``step`` (default: the last), rebuilt as ``--resume`` does;
    with that step, its policy version and how many steps were trained again."""
    from freshroll.clock import RealClock
    from freshroll.engines.tiny import model_digest
    from freshroll.kernel.buffer import replay_ledger
    from freshroll.ledger.store import LEDGER_FILE, Ledger
    from freshroll.runtime.kernel_settings import kernel_config
    from freshroll.runtime.learner import build_learner, resume_point
    from freshroll.runtime.resume import history
    from freshroll.trainer.replay import committed_chain

    kernel = kernel_config(cfg)
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        buf = replay_ledger(ledger, kernel, RealClock())
        assert buf.version is not None
        last = buf.version.step
        want = last if step is None else step
        if not 0 <= want <= last:
            raise ConfigError(f"--step {want}: the run committed steps 0..{last}")
        chain = committed_chain(ledger)
        hist = history(e for _, e in ledger.events())
        learner = build_learner(cfg, source, buf, run_dir, hist, to_step=want, quiet=True)
        replayed = want - resume_point(run_dir, chain, want)[1] if want > 0 else 0
        version = chain[want].version if want > 0 else PolicyVersion.initial(model_digest(source))
    return learner, want, version, replayed

"""The settings a trainer step is trained under: their digest, which every commit records
(:func:`settings_digest`), and the advantage scaling in force (:func:`scale_of`).

A key that does not change the training math (``on_nonfinite``: what happens to a step never
applied; ``gradient_checkpointing``: the same gradients, recomputed; ``parallel`` and
``world_size``: the same gradient summed across ranks, so a policy version means the same
whatever the world size, docs/parallel.md) is not digested. A key
added after runs had recorded digests is left out at the value those runs trained with
(:data:`_OMITTED_AT`), so an earlier run's steps still match on ``--resume`` and replay.
"""

from __future__ import annotations

from freshroll.config.train import TRAINER_BEFORE, TrainerSection
from freshroll.ledger.lineage import digest_json

_NOT_TRAINING_MATH = {"on_nonfinite", "gradient_checkpointing", "parallel", "world_size"}
#: trainer keys added after runs had recorded settings digests: at the value every earlier
#: run trained with they are left out of the digest, so the steps of an earlier run still
#: match theirs on --resume and replay (where that is not the default: TRAINER_BEFORE)
_OMITTED_AT: dict[str, object] = {"lr_schedule": "constant", "warmup_steps": 0, "grad_accum": 1,
                                  "bf16": False, "lora": None, "warmup_ratio": 0.0,
                                  "scale_rewards": "auto", "ratio_level": "token",
                                  "mask_truncated": False, "num_iterations": 1,
                                  **TRAINER_BEFORE}


def settings_digest(cfg: TrainerSection, temperature: float, total_steps: int | None) -> str:
    """The digest of the settings a step is trained under (every commit records it): the
    trainer's training math, the sampling temperature, and the run's total steps when the
    lr schedule decays towards them or the warmup is a share of them (they then set every
    step's lr)."""
    trainer = cfg.model_dump(mode="json", exclude=_NOT_TRAINING_MATH)
    for key, value in _OMITTED_AT.items():
        if trainer[key] == value:
            del trainer[key]
    doc: dict[str, object] = {"trainer": trainer, "temperature": temperature}
    if cfg.lr_schedule != "constant" or cfg.warmup_ratio:
        doc["total_steps"] = total_steps
    return digest_json(doc)


def scale_of(cfg: TrainerSection) -> str:
    """``trainer.scale_rewards`` in force: ``auto`` is ``group``, or ``none`` under
    ``dr_grpo`` (Dr. GRPO does not divide by the std)."""
    if cfg.scale_rewards != "auto":
        return cfg.scale_rewards
    return "none" if cfg.aggregation == "dr_grpo" else "group"


__all__ = ["scale_of", "settings_digest"]

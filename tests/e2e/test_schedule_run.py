"""A run with an lr schedule and gradient accumulation: each step's lr in metrics.jsonl, and
a replay from the ledger (export-model, --resume) rebuilds the committed weights exactly
(issue 28, build 4)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from e2e_helpers import freshroll, metrics

from freshroll.runtime.export import export_model
from freshroll.trainer.schedule import lr_at

pytestmark = pytest.mark.slow

SETTINGS = ["trainer.lr_schedule=cosine", "trainer.warmup_steps=2", "trainer.grad_accum=3",
            "trainer.lr=0.002", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=1"]


def test_schedule_and_accumulation_survive_replay_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=5", "run.progress=false", *SETTINGS,
              "--out", str(out))
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["lr"] for r in rows] == [lr_at(n, 0.002, "cosine", 2, 5) for n in range(1, 6)]
    assert rows[0]["lr"] == 0.0 and rows[2]["lr"] == 0.002

    # only step 4's checkpoint is kept: step 3 is trained again from step 0, and each
    # replayed step's weights must be the committed ones (export_model checks the digest)
    assert export_model(out, tmp_path / "m3", step=3).replayed == 3

    # run.steps may grow on resume: the replayed steps keep their lr (the recorded
    # run.steps=5), the new steps decay to the new end
    for ckpt in (out / "checkpoints").iterdir():  # the run's last: replay all five steps
        shutil.rmtree(ckpt)
    res = freshroll("run", "--resume", str(out), "run.steps=7")
    assert "verify: ok" in res.stdout and "weights digests match" in res.stderr
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 8))
    assert [r["lr"] for r in rows[5:]] == [lr_at(n, 0.002, "cosine", 2, 7) for n in (6, 7)]


def test_bf16_steps_replay_to_the_committed_weights(tmp_path: Path) -> None:
    """trainer.bf16: a replayed step (export-model from the step-2 checkpoint) gives the
    committed weights digest again: bfloat16 autocast is deterministic here too."""
    out = tmp_path / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=4", "run.progress=false",
              "trainer.bf16=true", "trainer.checkpoint_every=2", "--out", str(out))
    assert export_model(out, tmp_path / "m3", step=3).replayed == 1

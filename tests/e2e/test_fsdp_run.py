"""trainer.parallel: fsdp end to end (issue 50): a run whose trainer is 2 sharded gloo ranks
passes verify, records its ranks, writes sharded checkpoints with a manifest, and its
committed digests (over the full state gathered to rank 0 once per version) are rebuilt by
the same group (freshroll replay) and by resumes from a sharded checkpoint (2 -> 2, 2 -> 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import freshroll

from freshroll.runtime.replay_run import replay_run

pytestmark = pytest.mark.slow

FSDP = ["trainer.parallel=fsdp", "trainer.world_size=2"]


def test_a_sharded_run_verifies_replays_and_resumes_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = freshroll("run", "configs/smoke.yaml", "run.steps=3", "run.progress=false",
                    "trainer.checkpoint_every=3", *FSDP, "--out", str(out))
    assert "verify: ok" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["host"]["trainer_ranks"] == {
        "parallel": "fsdp", "world_size": 2, "backend": "gloo", "split": "contiguous"}
    # weights out of a sharded trainer: each version's full state gathered, then published
    assert summary["weights_gather_s_mean"] > 0 and summary["weight_loads"] >= 1
    replayed = replay_run(out)
    assert replayed.ok and replayed.steps == 3, replayed.render()
    manifest = json.loads((out / "checkpoints" / "step-000003" / "manifest.json").read_text())
    assert manifest["sharded"]["world_size"] == 2 and "__1_0.distcp" in manifest["files"]
    # from the sharded checkpoint: 2 -> 2 (its digest checked), then 2 -> 1
    res = freshroll("run", "--resume", str(out), "run.steps=4", "trainer.checkpoint_every=1")
    assert "verify: ok" in res.stdout
    one = ["trainer.parallel=none", "trainer.world_size=1", "--allow-change",
           "trainer.parallel", "--allow-change", "trainer.world_size"]
    res = freshroll("run", "--resume", str(out), "run.steps=5", *one)
    assert "verify: ok" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 5 and "trainer_ranks" not in summary["host"]

"""trainer.parallel: ddp end to end (issue 50): a run whose trainer is 2 gloo ranks passes
verify, records its ranks and split rule, and its committed weights are rebuilt exactly by
the same group (export-model from a checkpoint, freshroll replay); a world size the placement
cannot hold is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import freshroll

from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.placement.placement import check_world_size
from freshroll.runtime.export import export_model
from freshroll.runtime.replay_run import replay_run

pytestmark = pytest.mark.slow

DDP = ["trainer.parallel=ddp", "trainer.world_size=2"]


def test_a_two_rank_run_verifies_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = freshroll("run", "configs/smoke.yaml", "run.steps=4", "run.progress=false",
                    "trainer.checkpoint_every=2", *DDP, "--out", str(out))
    assert "verify: ok" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["host"]["trainer_ranks"] == {
        "parallel": "ddp", "world_size": 2, "backend": "gloo", "split": "contiguous"}
    assert summary["steps"] == 4
    # step 3 trained again by a new group from the step-2 checkpoint: the committed digest
    assert export_model(out, tmp_path / "m3", step=3).replayed == 1
    replayed = replay_run(out)
    assert replayed.ok and replayed.steps == 4, replayed.render()


def test_a_world_size_the_machine_cannot_hold_is_refused_before_any_write(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = freshroll("run", "configs/smoke.yaml", "trainer.parallel=ddp",
                    "trainer.world_size=512", "--out", str(out), check=False)
    assert res.returncode == 2
    assert "trainer.world_size: 512 ranks need a core each" in res.stderr
    assert not out.exists()


def test_the_placements_a_group_cannot_use() -> None:
    check_world_size(load_config(None, DDP), cores=2)
    with pytest.raises(ConfigError, match=r"trainer\.world_size: 3 ranks need a core each"):
        check_world_size(load_config(None, ["trainer.parallel=ddp", "trainer.world_size=3"]),
                         cores=2)
    with pytest.raises(ConfigError, match=r"trainer\.world_size: 2 needs a model"):
        check_world_size(load_config(None, [*DDP, "rollout.engine=sim"]), cores=2)
    with pytest.raises(ConfigError, match=r"trainer\.world_size: 2 ranks run beside the driver"):
        check_world_size(load_config(None, [*DDP, "run.runtime=ray", "ray.trainer=actor"]),
                         cores=2)

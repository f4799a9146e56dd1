"""trainer.parallel: ddp end to end (issue 50): a run whose trainer is 2 gloo ranks passes
verify, records its ranks and split rule, and its committed weights are rebuilt exactly by
the same group (export-model from a checkpoint, freshroll replay); a killed rank costs one
bounded restart of the group and nothing of the ledger; a world size the placement cannot
hold is refused before anything is written."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
from pathlib import Path

import pytest
from e2e_helpers import freshroll

from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.hooks import Hooks
from freshroll.placement.placement import check_world_size
from freshroll.runtime.export import export_model
from freshroll.runtime.placements import Components
from freshroll.runtime.replay_run import replay_run
from freshroll.runtime.run import run

pytestmark = pytest.mark.slow

DDP = ["trainer.parallel=ddp", "trainer.world_size=2"]


def test_a_two_rank_run_verifies_replays_and_resumes(tmp_path: Path) -> None:
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
    # without step 4's checkpoint a resume replays steps 3-4: in one process it cannot, and
    # says why before anything is written; a new group of 2 replays them to their digests
    shutil.rmtree(out / "checkpoints" / "step-000004")
    one = ["trainer.parallel=none", "trainer.world_size=1", "--allow-change",
           "trainer.parallel", "--allow-change", "trainer.world_size"]
    res = freshroll("run", "--resume", str(out), *one, check=False)
    assert res.returncode == 2
    assert "trainer.world_size: 1 rank(s), but committed step 3 was trained by 2" in res.stderr
    assert "world_size: 1" not in (out / "config.yaml").read_text()  # nothing written
    res = freshroll("run", "--resume", str(out), "run.steps=6", "trainer.checkpoint_every=1")
    assert "verify: ok" in res.stdout and "weights digests match" in res.stderr
    # from the checkpoint of its last step (6), the run goes on in one process (2 -> 1)
    res = freshroll("run", "--resume", str(out), "run.steps=7", *one)
    assert "verify: ok" in res.stdout
    assert "trainer_ranks" not in json.loads((out / "summary.json").read_text())["host"]


def test_a_one_process_run_resumes_with_two_ranks(tmp_path: Path) -> None:
    """A checkpoint is rank 0's full state, the same at any world size: 1 -> 2."""
    out = tmp_path / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=2", "run.progress=false",
              "trainer.checkpoint_every=2", "--out", str(out))
    res = freshroll("run", "--resume", str(out), "run.steps=4", *DDP, "--allow-change",
                    "trainer.parallel", "--allow-change", "trainer.world_size")
    assert "verify: ok" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["host"]["trainer_ranks"]["world_size"] == 2


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


class _KillRank1(Hooks):
    """SIGKILL rank 1 of the trainer's group as step 2 is committed (in the commit's own
    callback, so the kill lands before step 3 whatever the machine's speed)."""

    def __init__(self) -> None:
        self.killed = False

    def committed(self, version: PolicyVersion) -> None:
        if version.step != 2 or self.killed:
            return
        self.killed = True
        ranks = [p for p in mp.active_children() if p.name == "freshroll-rank-1"]
        assert len(ranks) == 1
        os.kill(ranks[0].pid, signal.SIGKILL)


class _Session:  # a ChaosSession: wraps no part, kills a rank
    hooks = _KillRank1()

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        return parts


def test_a_killed_rank_is_restarted_once_and_the_run_verifies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = load_config("configs/smoke.yaml", ["run.steps=5", "run.progress=false",
                                             "run.max_staleness=0", *DDP])
    run(cfg, out, chaos=_Session())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["trainer_restarts"] == 1
    res = freshroll("verify", str(out))
    assert res.returncode == 0, res.stdout
    assert replay_run(out).ok  # the restarted group's steps replay to their digests too

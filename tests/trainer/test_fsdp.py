"""trainer.parallel: fsdp (issue 50): 2 sharded gloo ranks train as 2 ddp ranks and 1 process.

The group is real: rank 1 is a forked process, both ranks on a gloo default process group
with the model sharded by FSDP2's ``fully_shard`` over a CPU mesh, one intra-op thread each.
Rank 0's model is the full state gathered after each step, so the committed weights digest
is taken over it as at any world size."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ranks import _batches

from freshroll.config import load_config
from freshroll.engines.tiny import save_tiny
from freshroll.errors import ConfigError
from freshroll.runtime.learner import new_learner
from freshroll.runtime.trainer_group import start_group
from freshroll.trainer.fsdp import FILLER, Sharded
from freshroll.trainer.ranks import SOLO, RankLost, rank_slices
from freshroll.trainer.replay import weights_digest

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _run(model: Path, parallel: str, world: int, accum: int, rows: int = 7,
         ) -> tuple[dict[str, torch.Tensor], str, list[dict[str, float]]]:
    cfg = load_config(None, [f"trainer.grad_accum={accum}", "trainer.lr=0.01",
                             f"trainer.world_size={world}", f"trainer.parallel={parallel}"])
    learner, _ = new_learner(cfg, model)
    group = start_group(cfg, model, learner, new_learner)
    try:
        metrics = [learner.step(b) for b in _batches(3, rows)]
        state = {k: v.clone() for k, v in learner.model.state_dict().items()}
        digest = weights_digest(learner.model)
    finally:
        if group is not None:
            group.close()
    assert learner.ranks is SOLO
    return state, digest, metrics


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_fillers_even_out_the_micro_batches() -> None:
    """Every rank runs as many micro-batches as the rank with the most, its own first."""
    ranks = Sharded(None, 1, 2)
    assert rank_slices(3, 2, 2, 1) == [slice(2, 3)]
    assert ranks.slices(3, 2) == [slice(2, 3), FILLER]
    assert Sharded(None, 1, 2).slices(1, 1) == [FILLER]  # past a short batch's rows
    assert Sharded(None, 0, 2).slices(8, 2) == rank_slices(8, 2, 2, 0)


def test_fsdp_with_lora_is_refused() -> None:
    with pytest.raises(ConfigError, match="lora with parallel: fsdp"):
        load_config(None, ["trainer.world_size=2", "trainer.parallel=fsdp", "trainer.lora={}"])


@pytest.mark.slow  # starts three groups (one rank process each)
def test_fsdp_trains_the_weights_ddp_and_one_process_do(tmp_path: Path) -> None:
    """FSDP at world size 2 against DDP at world size 2 and one process, 3 steps of 7 rows
    at lr 1e-2. Measured (2026-12-07, torch 2.13 CPU, one thread a rank): FSDP's committed
    digest is DDP's (each rank's micro-batch gradients, then one sum of two terms), and both
    are within 1.2e-6 of one process (AdamW's first-step noise: tests/trainer/test_ranks.py).
    Asserted: FSDP within 1e-5 of DDP, within 1e-3 (a tenth of the lr) of one process."""
    model = save_tiny(tmp_path / "m", seed=4)
    one, _, m1 = _run(model, "none", 1, 1)
    ddp, ddp_digest, _ = _run(model, "ddp", 2, 1)
    fsdp, fsdp_digest, m3 = _run(model, "fsdp", 2, 1)
    assert _max_diff(fsdp, ddp) < 1e-5
    assert _max_diff(fsdp, one) < 1e-3
    assert _max_diff(fsdp, _initial(model)) > 1e-3  # the steps moved the weights
    for a, b in zip(m1, m3, strict=True):  # the whole batch's figures
        for key in ("loss", "entropy", "grad_norm", "samples", "tokens"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
        assert b["gather_s"] > 0 and "gather_s" not in a
    assert len(fsdp_digest) == len(ddp_digest) == 32


@pytest.mark.slow  # two groups
def test_fsdp_with_grad_accum_and_fillers_matches_one_process(tmp_path: Path) -> None:
    """3 rows, grad_accum 2 at world size 2: rank 0 trains rows 0-1 as two micro-batches,
    rank 1 row 2 and one filler. Measured max difference 8.3e-7 (AdamW's first steps on
    gradients near its epsilon); asserted < 1e-3."""
    model = save_tiny(tmp_path / "m", seed=4)
    one, _, m1 = _run(model, "none", 1, 2, rows=3)
    fsdp, _, m2 = _run(model, "fsdp", 2, 2, rows=3)
    assert _max_diff(fsdp, one) < 1e-3
    for a, b in zip(m1, m2, strict=True):  # the filler adds no rows, tokens or loss
        for key in ("loss", "samples", "tokens"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow  # two groups and a restart
def test_fsdp_lost_rank_restarts_to_the_same_weights(tmp_path: Path) -> None:
    """Rank 1 killed between steps: the next step raises RankLost with rank 0's full state
    still the last step's, and a restarted group trains on to an uninterrupted group's
    digest."""
    model = save_tiny(tmp_path / "m", seed=4)
    cfg = load_config(None, ["trainer.lr=0.01", "trainer.world_size=2", "trainer.parallel=fsdp"])
    batches = _batches()
    digests: list[str] = []
    for kill in (False, True):
        learner, _ = new_learner(cfg, model)
        group = start_group(cfg, model, learner, new_learner)
        assert group is not None
        try:
            learner.step(batches[0])
            if kill:
                before = weights_digest(learner.model)
                os.kill(group.procs[0].pid, signal.SIGKILL)
                group.procs[0].join(30)
                with pytest.raises(RankLost, match="lost a rank"):
                    learner.step(batches[1])
                assert weights_digest(learner.model) == before and learner.steps == 1
                group.restart()
            for b in batches[1:]:
                learner.step(b)
            digests.append(weights_digest(learner.model))
        finally:
            group.close()
    assert digests[0] == digests[1]


def _initial(model: Path) -> dict[str, torch.Tensor]:
    learner, _ = new_learner(load_config(None, []), model)
    return {k: v.clone() for k, v in learner.model.state_dict().items()}


@pytest.mark.slow  # three groups
def test_a_sharded_checkpoint_round_trips_at_two_world_sizes(tmp_path: Path) -> None:
    """2 fsdp ranks train 2 steps and write a sharded checkpoint (each rank its shard, a
    manifest naming the mode, world size, version and digest). Loaded by a new group of 2 it
    is the same full state: step 3 commits the uninterrupted group's very digest. Loaded in
    one process (2 -> 1) it is the same weights digest; and a whole checkpoint of one
    process loads into a group of 2 (1 -> 2) to that process's digest."""
    from freshroll.runtime.learner import restore
    from freshroll.runtime.placements import LearnerState
    from freshroll.trainer.checkpoint import load_checkpoint, save_checkpoint

    model = save_tiny(tmp_path / "m", seed=4)
    batches = _batches()
    fsdp = load_config(None, ["trainer.lr=0.01", "trainer.world_size=2", "trainer.parallel=fsdp"])
    solo = load_config(None, ["trainer.lr=0.01"])

    def group_of(cfg: Any, ckpt: Path | None) -> tuple[Any, Any]:
        learner, _ = new_learner(cfg, model)
        group = start_group(cfg, model, learner, new_learner)
        if ckpt is not None:
            restore(learner, ckpt, 2)
            if group is not None:
                learner.ranks.sync(learner)
        return learner, group

    learner, group = group_of(fsdp, None)
    try:
        for b in batches[:2]:
            learner.step(b)
        two = weights_digest(learner.model)
        state = LearnerState(learner)
        model_state, optim = state()
        save_checkpoint(tmp_path / "c2", model_state=model_state, optimizer=optim,
                        meta={"step": 2, "version": "p2-x"}, shards=state.shards)
        learner.step(batches[2])
        three = weights_digest(learner.model)
    finally:
        group.close()
    manifest = json.loads((tmp_path / "c2" / "manifest.json").read_text())
    assert manifest["sharded"] == {"parallel": "fsdp", "world_size": 2, "digest": two,
                                   "step": 2, "version": "p2-x"}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(manifest["files"])
    assert not (tmp_path / "c2" / "model.safetensors").exists()
    learner, group = group_of(fsdp, tmp_path / "c2")  # 2 -> 2
    try:
        assert weights_digest(learner.model) == two
        learner.step(batches[2])
        assert weights_digest(learner.model) == three
    finally:
        group.close()
    learner, _ = group_of(solo, tmp_path / "c2")  # 2 -> 1
    assert weights_digest(learner.model) == two
    assert load_checkpoint(tmp_path / "c2").sharded is not None
    save_checkpoint(tmp_path / "c1", model_state=learner.model_state(),
                    optimizer=learner.optimizer, meta={"step": 2})
    learner.step(batches[2])
    solo_three = {k: v.clone() for k, v in learner.model.state_dict().items()}
    learner, group = group_of(fsdp, tmp_path / "c1")  # 1 -> 2
    try:
        assert weights_digest(learner.model) == two
        learner.step(batches[2])
        assert _max_diff(learner.model.state_dict(), solo_three) < 1e-3
    finally:
        group.close()


@pytest.mark.slow  # one group
def test_a_non_finite_loss_on_one_rank_fails_the_step_on_every_rank(tmp_path: Path) -> None:
    """A NaN reward in rank 1's first micro-batch (grad_accum 2): rank 1 still runs its
    second micro-batch (rank 0 waits in its collectives), every rank refuses the step with
    nothing applied, and the group trains the next batch."""
    from freshroll.errors import NonFiniteStep

    model = save_tiny(tmp_path / "m", seed=4)
    cfg = load_config(None, ["trainer.lr=0.01", "trainer.world_size=2", "trainer.grad_accum=2",
                             "trainer.parallel=fsdp", "limits.train_timeout_s=30"])
    good, other = _batches(2)
    bad = [*good[:4], replace(good[4], reward=float("nan")), *good[5:]]
    learner, _ = new_learner(cfg, model)
    group = start_group(cfg, model, learner, new_learner)
    try:
        before = weights_digest(learner.model)
        with pytest.raises(NonFiniteStep, match="rewards not finite"):
            learner.step(bad)
        assert weights_digest(learner.model) == before and learner.steps == 0
        learner.step(other)
        assert weights_digest(learner.model) != before and learner.steps == 1
    finally:
        group.close()

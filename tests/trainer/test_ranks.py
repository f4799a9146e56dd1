"""trainer.parallel: ddp (issue 50): the rank split, and 2 gloo ranks train as 1 does.

The group is real: rank 1 is a forked process on a gloo process group, each rank one
intra-op thread. The weights after three steps (grad_accum 1 and 2, an odd batch cut
through a group) match one process's within float tolerance (the gradient is the same
sum in another order), and the step's metrics are the whole batch's."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from freshroll.config import load_config
from freshroll.engines.tiny import save_tiny
from freshroll.errors import ConfigError
from freshroll.runtime.learner import new_learner
from freshroll.runtime.trainer_group import start_group
from freshroll.trainer.accum import micro_slices
from freshroll.trainer.grpo import TrainSample
from freshroll.trainer.ranks import SOLO, rank_slices
from freshroll.trainer.replay import weights_digest

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _batches(steps: int = 3, n: int = 7) -> list[list[TrainSample]]:
    """Off-policy samples of uneven lengths in groups of two (``n`` odd: a group is cut)."""
    rng = random.Random(3)
    out = []
    for _ in range(steps):
        batch = []
        for i in range(n):
            prompt = [rng.randrange(4, 30) for _ in range(rng.randint(2, 5))]
            comp = [rng.randrange(4, 30) for _ in range(rng.randint(1, 6))]
            batch.append(TrainSample(prompt, comp, [rng.uniform(-4.0, -2.0) for _ in comp],
                                     rng.uniform(0, 1), i // 2, i % 2))
        out.append(batch)
    return out


def _train(tmp_path: Path, world: int, accum: int, **over: Any) -> tuple[dict[str, Any], list]:
    model = save_tiny(tmp_path / f"m{world}{accum}", seed=4)
    pairs = [f"trainer.{k}={v}" for k, v in over.items()]
    cfg = load_config(None, [f"trainer.grad_accum={accum}", "trainer.lr=0.01",
                             f"trainer.world_size={world}",
                             f"trainer.parallel={'ddp' if world > 1 else 'none'}", *pairs])
    learner, _ = new_learner(cfg, model)
    initial = {k: v.clone() for k, v in learner.model.state_dict().items()}
    group = start_group(cfg, model, learner, new_learner)
    try:
        metrics, grads = [], []
        for b in _batches():
            metrics.append(learner.step(b))
            grads.append({n: q.grad.clone() for n, q in learner.model.named_parameters()
                          if q.grad is not None})
        digest = weights_digest(learner.model)
        state = {k: v.clone() for k, v in learner.model.state_dict().items()}
    finally:
        if group is not None:
            group.close()
    assert learner.ranks is SOLO
    return {"state": state, "digest": digest, "grads": grads,
            "initial": initial}, metrics


def test_rank_slices_cover_the_batch_once_in_order() -> None:
    for n in range(1, 12):
        for world in (1, 2, 3):
            for k in (1, 2, 3):
                rows = [i for r in range(world) for sl in rank_slices(n, k, world, r)
                        for i in range(sl.start, sl.stop)]
                assert rows == list(range(n))
                if world == 1:
                    assert rank_slices(n, k, 1, 0) == micro_slices(n, k)
    assert rank_slices(7, 1, 2, 0) == [slice(0, 4)]
    assert rank_slices(7, 2, 2, 1) == [slice(4, 6), slice(6, 7)]
    assert rank_slices(1, 1, 2, 1) == []  # fewer rows than ranks: rank 1 trains none


@pytest.mark.slow  # starts a group: a rank process on a gloo process group
@pytest.mark.parametrize("accum", [1, 2])
def test_two_gloo_ranks_train_the_weights_one_process_does(tmp_path: Path, accum: int) -> None:
    """Each step's gradient (rank 0's, after the all-reduce) is one process's within 1e-6;
    the weights after three steps within 1e-4 where every step's gradient is well above
    AdamW's epsilon, and within 1e-3 (a tenth of the lr) anywhere: AdamW's first steps move
    a weight by lr x g / (|g| + 1e-8), so float noise on a gradient near 1e-8 moves it by
    up to the lr (tests/trainer/test_grad_accum.py compares micro-batches the same way)."""
    one, m1 = _train(tmp_path, 1, accum)
    two, m2 = _train(tmp_path, 2, accum)
    for g1, g2 in zip(one["grads"], two["grads"], strict=True):
        assert g1.keys() == g2.keys()
        for name, g in g1.items():
            torch.testing.assert_close(g2[name], g, rtol=1e-4, atol=1e-6, msg=name)
    firm = {n: torch.stack([g[n].abs() > 1e-5 for g in one["grads"]]).all(0)
            for n in one["grads"][0]}
    assert sum(int(f.sum()) for f in firm.values()) > 10_000
    for name, w in one["state"].items():
        v = two["state"][name]
        assert float((v - w).abs().max()) < 1e-3, name
        if name in firm:
            assert torch.all((v - w)[firm[name]].abs() < 1e-4), name
    assert not all(torch.equal(w, one["initial"][k]) for k, w in one["state"].items())
    for a, b in zip(m1, m2, strict=True):  # the whole batch's figures, not rank 0's half
        assert a.keys() == b.keys()
        for key in ("loss", "entropy", "grad_norm", "samples", "tokens", "mismatch_kl"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_world_size_needs_parallel_ddp() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        load_config(None, ["trainer.world_size=2"])


@pytest.mark.slow  # three groups started
def test_a_lost_rank_fails_the_step_and_a_restarted_group_trains_it_again(
        tmp_path: Path) -> None:
    """Rank 1 killed between steps: rank 0's next step raises RankLost having applied
    nothing (its weights are still the last step's), and a restarted group (rank 0's state
    sent to a new rank 1) trains the same steps to the very weights of an uninterrupted
    group: gloo's sum over two ranks is deterministic."""
    import os
    import signal

    from freshroll.trainer.ranks import RankLost

    model = save_tiny(tmp_path / "m", seed=4)
    cfg = load_config(None, ["trainer.lr=0.01", "trainer.world_size=2",
                             "trainer.parallel=ddp"])
    batches = _batches()
    digests = []
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
                assert group.restarts == 1 and group.procs[0].is_alive()
            for b in batches[1:]:
                learner.step(b)
            digests.append(weights_digest(learner.model))
        finally:
            group.close()
    assert digests[0] == digests[1]

"""The one table of live names: unique names, each documented in docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

from freshroll.observe.live_names import NAMES, scalars
from freshroll.observe.prometheus import GAUGES

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_name_is_unique_and_prometheus_uses_the_table():
    tags = [n.tag for n in NAMES if n.tag is not None]
    gauges = [n.gauge for n in NAMES if n.gauge is not None]
    assert len(set(tags)) == len(tags) and len(set(gauges)) == len(gauges)
    assert len({n.field for n in NAMES}) == len(NAMES)
    assert {n.gauge: (n.field, n.help) for n in NAMES if n.gauge is not None} == GAUGES


def test_every_name_has_its_row_in_the_docs_table():
    section = DOC.read_text().split("## Live metrics", 1)[1]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_/]+)` \|.*$", section,
                                                         flags=re.M)}
    for n in NAMES:
        assert n.field in rows, n.field
        cells = [c.strip() for c in rows[n.field].strip("|").split("|")]
        assert cells[1] == (f"`{n.gauge}`" if n.gauge else "-"), n.field
        if n.tag is not None:
            assert cells[2] == f"`{n.tag}`", n.field


def test_scalars_take_every_finite_number_of_the_row_as_it_is():
    row = {"step": 3, "version": "p3-ab", "lag_mean": 0.5, "loss": 1, "ok": True,
           "reward_mean": None, "grad_norm": float("inf"), "eval/reward": 0.25}
    assert scalars(row) == {"async/staleness_mean": 0.5, "loss": 1.0, "eval/reward": 0.25}


def test_tags_keep_trl_names_and_one_namespace_per_concern():
    row = {"step": 2, "is_weight_min": 0.5, "is_weight_max/lag_1": 1.5, "tokens/lag_0": 12,
           "mismatch_kl/lag_2": 0.01, "lag_histogram/1": 8, "discards/stale": 3,
           "tokens": 96, "samples": 16, "reward_mean": 0.25, "rewards/reverse/mean": 0.25,
           "clip_frac": 0.1, "logged/mine": 7}
    assert scalars(row) == {
        "async/is_weight_min": 0.5, "async/is_weight_max/lag_1": 1.5,
        "async/tokens/lag_0": 12.0, "async/mismatch_kl/lag_2": 0.01,
        "async/staleness_histogram/1": 8.0, "rollout/discards/stale": 3.0,
        "rollout/tokens": 96.0, "rollout/samples": 16.0, "completions/mean_length": 6.0,
        "reward": 0.25, "rewards/reverse/mean": 0.25, "clip_ratio/region_mean": 0.1,
        "logged/mine": 7.0}
    # no rows trained: no length (never a division by zero)
    assert "completions/mean_length" not in scalars({"tokens": 0, "samples": 0})


def test_a_real_rows_tags_have_no_stray_top_level_name():
    # every tag of a row the trainer writes is TRL's own top-level name or in a namespace
    trl_top = {"reward", "reward_std", "loss", "entropy", "grad_norm", "learning_rate",
               "frac_reward_zero_std"}
    row = {"is_weight_mean": 1.0, "is_weight_max": 1.2, "is_weight_min": 0.8,
           "is_truncated_frac": 0.0, "mismatch_kl": 0.0, "tokens/lag_1": 96.0,
           "mismatch_kl/lag_1": 0.0, "is_weight_mean/lag_1": 1.0, "is_weight_max/lag_1": 1.2,
           "loss": 0.0, "clip_frac": 0.0, "ratio_mean": 1.0, "entropy": 3.9, "grad_norm": 0.0,
           "lr": 0.001, "reward_mean": 0.0, "reward_std": 0.0, "adv_abs_mean": 0.0,
           "lag_mean": 1.0, "lag_max": 1.0, "samples": 16.0, "tokens": 96.0, "train_s": 0.02,
           "weights_bytes": 1.0, "lag_newest_mean": 1.0, "lag_weighted_mean": 1.0,
           "trainer_wait_s": 0.0, "step_idle_ratio": 0.0, "accepted_total": 48,
           "accepted_per_s": 378.0, "trainer_idle_ratio": 0.18, "discards": 0,
           "discard_rate": 0.0, "frac_reward_zero_std": 1.0, "no_signal_steps": 1,
           "weight_loads": 2, "weight_transfer_s_mean": 0.0065, "lag_histogram/0": 16,
           "lag_newest_histogram/0": 16, "lag_weighted_histogram/0": 16, "t": 0.1}
    stray = [t for t in scalars(row) if "/" not in t and t not in trl_top]
    assert stray == []

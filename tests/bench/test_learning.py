"""benchmarks/learning.py: its figures on synthetic runs (time to a share of sync's reward,
collapses, parity against sync), each shape's model through ``from_pretrained``, and one
``--quick`` invocation of the real thing."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "learning.py"
lb = load_script("learning")


def _run(system: str, seed: int, rewards: list[float], *, zero: list[float] | None = None,
         shape: str = "s") -> dict[str, Any]:
    return {"shape": shape, "system": system, "seed": seed, "steps": len(rewards),
            "rewards": rewards, "times": [float(i + 1) for i in range(len(rewards))],
            "rollouts_per_s": 100.0, "startup_s": 2.0, "load": 0.5, "lag_mean": 0.5,
            "series": {"frac_reward_zero_std": zero or [0.0] * len(rewards),
                       "entropy": [1.0] * len(rewards), "mismatch_kl": [0.01] * len(rewards),
                       "is_truncated_frac": [0.0] * len(rewards)}}


def test_time_to_a_share_of_syncs_reward_and_the_last_tenth() -> None:
    rising = [i / 100 for i in range(100)]
    run = _run("a", 0, rising)
    assert lb.last10(rising) == pytest.approx(statistics.fmean(rising[-10:]))
    # the trailing 10-step mean first reaches 0.5 at index 55 (0.46..0.55), whose time is 56
    assert lb.time_to(run, 0.5) == pytest.approx(56.0)
    assert math.isnan(lb.time_to(run, 2.0))


def test_table_parity_and_collapses_over_seeds() -> None:
    runs = [_run("sync", s, [0.1] * 20 + [0.5] * 80) for s in range(3)]
    runs += [_run("async-x", s, [0.1] * 20 + [0.5 - 0.01 * s] * 80) for s in range(3)]
    dead = [0.1] * 20 + [0.5] * 30 + [0.0] * 50
    runs += [_run("async-bad", s, dead, zero=[0.0] * 50 + [1.0] * 50) for s in range(3)]
    rows = {r["system"]: r for r in lb.table(runs)}
    assert rows["sync"]["last10"] == pytest.approx(0.5) and rows["sync"]["collapses"] == 0
    assert rows["async-x"]["t90_n"] == 3 and rows["async-x"]["collapses"] == 0
    assert rows["async-bad"]["collapses"] == 3 and rows["async-bad"]["t90_n"] == 3
    d, se = lb.diff_se(runs, "s", "async-x", "sync")
    assert d == pytest.approx(-0.01) and se > 0
    d_bad, _ = lb.diff_se(runs, "s", "async-bad", "sync")
    assert d_bad == pytest.approx(-0.5)


@pytest.mark.parametrize("shape", ["qwen2-reverse-12", "gpt2-add-8"])
def test_each_architecture_loads_through_from_pretrained(tmp_path: Path, shape: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from freshroll.engines.tiny import CHARS

    path = lb.build_model(lb.SHAPES[shape], tmp_path / shape)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert model.config.model_type == lb.SHAPES[shape].arch
    text = "rev 12 34=" + CHARS[:10]
    assert tok.decode(tok(text)["input_ids"]) == text  # the character tokenizer, not Qwen2's


def test_quick_run_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--workdir",
                           str(tmp_path / "w"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| smoke | sync | 1 |" in done.stdout and "| smoke | async-tis | 1 |" in done.stdout
    saved = json.loads(out.read_text())
    assert {r["system"] for r in saved["runs"]} == {"sync", "async-tis"}
    assert all(len(r["rewards"]) == 4 == len(r["times"]) for r in saved["runs"])


def test_a_shape_at_another_learning_rate_keeps_everything_else() -> None:
    lb._derive("llama-sort-8@lr0.002", 40)
    base, derived = lb.SHAPES["llama-sort-8"], lb.SHAPES["llama-sort-8@lr0.002"]
    assert derived.lr == 0.002 and derived.steps == 40
    assert (derived.arch, derived.size, derived.task, derived.new_tokens) == (
        base.arch, base.size, base.task, base.new_tokens)
    assert "trainer.lr=0.002" in derived.overrides()

"""benchmarks/stage_vs_floor.py: the profile tables (pure) and one real profiled round."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_script

svf = load_script("stage_vs_floor")


def test_profile_table_ranks_our_ops_beside_the_floors():
    profiles = {"engine gen": {"aten::mm": (5.0, 10), "aten::mul": (9.0, 4),
                               "aten::cat": (1.0, 2), "(wall, profiled)": (20.0, 1)},
                "floor gen": {"aten::mm": (4.0, 10), "(wall, profiled)": (12.0, 1)}}
    rows = svf.profile_table(profiles, "engine gen", "floor gen", top=2)
    assert rows[0] == "| op | floor gen ms (calls) | engine gen ms (calls) |"
    assert rows[2:] == ["| `aten::mul` | 0.00 (0) | 9.00 (4) |",
                        "| `aten::mm` | 4.00 (10) | 5.00 (10) |",
                        "| `(wall, profiled)` | 12.00 (1) | 20.00 (1) |"]


@pytest.mark.slow  # three model loads and two profiled rounds: ~5 s
def test_a_profiled_round_of_the_tiny_model(tmp_path: Path):
    from freshroll.engines.tiny import save_tiny

    model = save_tiny(tmp_path / "tiny", seed=0)
    profiles: dict = {}
    times = svf.measure(model, ["rev 123="] * 8, 2, 1, 1, profiles)
    assert set(times) == set(profiles) == {"floor gen", "engine gen", "floor train",
                                           "learner step"}
    assert all(t > 0 for t in times.values())
    for ops in profiles.values():
        assert ops["(wall, profiled)"][0] > 0 and any(k.startswith("aten::") for k in ops)

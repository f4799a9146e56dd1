"""Rendering of the bench table: every row and the verdict line, in text, markdown and JSON."""

from __future__ import annotations

import json

from freshroll.bench import figures as f
from freshroll.bench.table import make_table, render_json, render_markdown, render_text

CAPS = f.Capacities(batch=64, gen_per_s=32.0, reward_per_s=128.0, train_per_s=64.0,
                    transfer_s=0.5)


def _run(label: str, per_s: float) -> f.RunFigures:
    return f.RunFigures(label, per_s, 0.25, 0.0, 1.0, 2.0, 2, 40.0, 10, 640, 20.0)


def _table(per_s: float, adaptive: float = 11.0) -> dict[str, object]:
    rows = f.table_rows([_run("sync", 10.0), _run("static-a", per_s), _run("adaptive", adaptive)],
                        "sync", CAPS)
    return make_table("P2", "virtual", CAPS, rows)


def test_text_table_has_every_run_and_the_capacities() -> None:
    text = render_text(_table(19.0))
    lines = text.splitlines()
    assert lines[0] == "== P2 (virtual clock)"
    assert "binding: gen" in lines[1] and "async bound 2.00x" in lines[1]
    assert lines[2].split()[:3] == ["run", "accepted/s", "E"]
    assert [line.split()[0] for line in lines[3:6]] == ["sync", "static-a", "adaptive"]
    assert "1.90" in lines[4] and "25.0%" in lines[4] and "1/2/2" in lines[4]
    assert lines[-1] == "best: static-a at 1.90x the synchronous baseline."


def test_the_table_says_when_asynchrony_does_not_pay() -> None:
    t = _table(10.2, adaptive=10.4)
    assert t["async_pays"] is False and t["best"] == "adaptive"
    assert "asynchrony does not pay on this workload" in render_text(t).splitlines()[-1]


def test_the_title_names_steps_and_time_scale() -> None:
    t = {**_table(19.0), "steps": 12, "time_scale": 0.009}
    assert render_text(t).splitlines()[0] == "== P2 (virtual clock, 12 steps, sim.time_scale 0.009)"
    assert render_markdown({**t, "time_scale": 1.0}).startswith("### P2 (virtual clock, 12 steps)")


def test_markdown_and_json() -> None:
    t = _table(19.0)
    md = render_markdown(t)
    assert "| run | accepted/s | E | window bound | speedup | A |" in md
    assert md.count("\n| ") == 4  # header + 3 rows
    assert "| sync | 10.0 | 0.31 | - | 1.00 |" in md  # no window bound known: "-"
    t["rows"][0]["window_bound"] = 0.45
    assert "| sync | 10.0 | 0.31 | 0.45 | 1.00 |" in render_markdown(t)
    data = json.loads(render_json([t]))
    assert data[0]["rows"][1]["speedup"] == 1.9
    assert data[0]["capacities_per_s"]["sync"] == 128.0


def test_several_seeds_average_each_figure_and_verify_only_if_every_seed_did() -> None:
    seed0 = f.table_rows([_run("sync", 10.0), _run("static-a", 20.0)], "sync", CAPS)
    seed1 = f.table_rows([_run("sync", 10.0), _run("static-a", 16.0)], "sync", CAPS)
    seed1[1]["verify"] = False
    rows = f.aggregate_rows({0: seed0, 1: seed1})
    assert [r["run"] for r in rows] == ["sync", "static-a"]
    assert rows[1]["accepted_per_s"] == 18.0 and rows[1]["speedup"] == 1.8
    assert abs(rows[1]["sd"]["accepted_per_s"] - 2.8284271) < 1e-6
    assert rows[0]["verify"] is True and rows[1]["verify"] is False
    assert [r["seed"] for r in rows[1]["per_seed"]] == [0, 1]
    t = {**make_table("P2", "virtual", CAPS, rows), "steps": 4, "seeds": [0, 1]}
    text = render_text(t)
    assert text.splitlines()[0] == "== P2 (virtual clock, 4 steps, 2 seeds)"
    assert "18.0 ± 2.8" in text and "FAILED (1 of 2)" in text
    assert "seeds 0 1: each cell the mean ± sample sd" in text
    assert t["best"] == "static-a"


def test_seeds_must_list_the_same_runs() -> None:
    import pytest

    seed0 = f.table_rows([_run("sync", 10.0), _run("static-a", 20.0)], "sync", CAPS)
    seed1 = f.table_rows([_run("sync", 10.0), _run("static-b", 16.0)], "sync", CAPS)
    with pytest.raises(ValueError, match="seed 1"):
        f.aggregate_rows({0: seed0, 1: seed1})

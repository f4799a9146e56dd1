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

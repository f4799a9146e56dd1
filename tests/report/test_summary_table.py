"""The report's Summary section: summary.json as an index of collapsible blocks (issue 48:
"half the report is a raw table")."""

from __future__ import annotations

import re
from pathlib import Path

from freshroll.report.rundata import RunData
from freshroll.report.summary_table import TOP, blocks, summary_section

SUMMARY = {"mode": "async", "accepted_rollouts_per_s": 812.5, "config": {"run": {"steps": 3}},
           "overlap": {"ratio": 1.2, "fallback": {"switches": 1, "learning": []}},
           "host": {"cores": 2, "placement": {"stages": {"generate": {"many": 2}}}},
           "stages": [{"stage": "generate"}, {"stage": "train"}]}


def _run(summary: dict, label: str = "run") -> RunData:
    run = RunData(Path("/nonexistent"))
    run.summary, run.label = summary, label
    return run


def test_blocks_group_by_top_level_key_with_the_plain_figures_first():
    got = blocks(SUMMARY)
    assert list(got) == [TOP, "overlap", "host"]  # config left out; stages is a plain table
    assert got[TOP] == {"mode": "async", "accepted_rollouts_per_s": 812.5,
                        "stages": SUMMARY["stages"]}
    # nested blocks are dotted keys down to a block of plain values
    assert list(got["overlap"]) == ["overlap.ratio", "overlap.fallback.switches",
                                    "overlap.fallback.learning"]
    assert list(got["host"]) == ["host.cores", "host.placement.stages.generate"]


def test_every_block_is_a_closed_details_but_the_first_and_nothing_is_lost():
    html = summary_section(_run(SUMMARY), None, "NODATA")
    opened = re.findall(r"<details class='block'( open)?>", html)
    assert opened == [" open", "", ""]
    assert "<code>overlap</code> (3 figures)" in html and "<code>host</code> (2 figures)" in html
    for key in ("mode", "overlap.ratio", "overlap.fallback.switches",
                "host.placement.stages.generate"):
        assert f"<code>{key}</code>" in html
    assert "2 rows (shown in Time per stage)" in html
    assert summary_section(_run({}), None, "NODATA") == "NODATA"


def test_a_baseline_gets_its_column_and_its_own_blocks():
    base = {"mode": "sync", "eval": {"reward": 0.5, "by_mode": {"greedy": 0.5}}}
    html = summary_section(_run(SUMMARY, "async run"), _run(base, "baseline"), "NODATA")
    assert re.search(r"<th[^>]*>async run</th>\s*<th[^>]*>baseline</th>", html), html[:400]
    assert "<code>eval</code> (2 figures)" in html  # a block only the baseline has

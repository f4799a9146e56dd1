"""The report says how much of each trained sample came from which policy version (issue 26's
"done when"), and the learner's mismatch KL and importance weights per token-lag bucket."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec

from freshroll.figures.metrics import rows
from freshroll.figures.metrics_log import reconcile
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.report.html import write_report
from freshroll.report.samples import sample_rows
from freshroll.report.token_mix import off_policy_by_lag, token_mix
from freshroll.runtime.endfiles import write_summary
from kernel.test_staleness_basis import spanning_then_consumed
from report.test_report import make_run


def _cells(html: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    m = re.search(rf"<tr><td>{re.escape(first)}</td>(.*?)</tr>", html)
    assert m, first
    return re.findall(r"<td>(.*?)</td>", m.group(1))


def test_token_mix_tables() -> None:
    html = token_mix({"tokens_by_lag": {"0": 30, "2": 10},
                      "older_share": {"0%": 3, "<=50%": 1}})
    assert _cells(html, "0") == ["30", "75.0%"] and _cells(html, "2") == ["10", "25.0%"]
    assert "<tr><td>1</td>" not in html  # a lag no token had is not a row
    assert _cells(html, "0%") == ["3", "75.0%"] and _cells(html, "&lt;=50%") == ["1", "25.0%"]
    assert token_mix({"tokens_by_lag": {}, "older_share": {}}) == ""


def test_off_policy_by_lag_table() -> None:
    one = {"tokens": 40.0, "mismatch_kl_mean": 0.0125, "is_weight_mean": 1.25,
           "is_weight_max": 2.5}
    html = off_policy_by_lag({"0": None, "1": one, "2": None, "3+": None})
    assert _cells(html, "1") == ["40", "0.0125", "1.25", "2.5"]
    assert _cells(html, "0") == ["—"] * 4  # no token of that lag: a dash, never 0
    assert off_policy_by_lag(dict.fromkeys(("0", "1", "2", "3+"))) == ""
    assert off_policy_by_lag(None) == ""


def test_the_report_of_a_run_shows_both(tmp_path: Path) -> None:
    """A run whose learner reported bucket figures: the off-policy section has their table,
    the lag section the trained tokens by lag and the samples by version mix, all from
    the ledger."""
    run = make_run(tmp_path / "run", max_staleness=2)
    path = run / "ledger.sqlite"
    with Ledger(path, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    path.unlink()
    with Ledger(path, sync="off") as ledger:
        for e in events:
            if isinstance(e, ev.Committed):
                e = msgspec.structs.replace(e, metrics={
                    **e.metrics, "tokens/lag_1": 12.0, "mismatch_kl/lag_1": 0.02,
                    "is_weight_mean/lag_1": 1.1, "is_weight_max/lag_1": 1.7})
            ledger.append(e)
    reconcile(run / "metrics.jsonl", rows(events))
    write_summary(run)
    html = write_report(run).read_text()
    steps = sum(isinstance(e, ev.Committed) for e in events)
    off_policy = html[html.index('<section id="offpolicy">'):]
    assert _cells(off_policy, "1")[:4] == [f"{12 * steps:,}", "0.02", "1.1", "1.7"]
    assert _cells(off_policy, "0") == ["—"] * 4
    lag = html[html.index('<section id="lag">'):]
    assert "<th>trained tokens</th>" in lag and "<th>tokens from older versions</th>" in lag
    assert int(_cells(lag, "1")[0].replace(",", "")) > 0  # the simulator's samples at lag 1


def test_export_samples_lists_each_samples_token_versions(tmp_path: Path) -> None:
    buf, sid = spanning_then_consumed(tmp_path / LEDGER_FILE, "newest_token")
    buf.ledger.close()
    rows = {r["sample"]: r for r in sample_rows(tmp_path, decode=lambda ids: "")}
    ranges = json.loads(rows[sid]["token_versions"])
    assert [n for _, n in ranges] == [5, 3, 2] and ranges[0][0] == rows[sid]["policy_version"]
    assert ranges[-1][0] == rows[sid]["last_version"]
    assert all(r["token_versions"] is None for s, r in rows.items() if s != sid)

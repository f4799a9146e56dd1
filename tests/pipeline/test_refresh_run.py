"""``tail.refresh`` on a simulated P2 run (virtual clock): under ``continue`` + ``newest_token``
at η = 1 the short members that age while their group's long member runs are re-issued, the
run verifies, no refreshed attempt is trained on, and the stale share is below the same run
without the lever (docs/bench.md "Refreshing stale members (issue 26)")."""

from __future__ import annotations

import io
import json
from pathlib import Path

from freshroll.bench.tails import tail_row
from freshroll.config import load_config
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger
from freshroll.runtime.run import run

ROOT = Path(__file__).resolve().parents[2]
P2 = ["run.steps=6", "run.progress=false", "run.max_staleness=1", "control.mode=static",
      "rollout.workers=32", "rollout.on_update=continue", "run.staleness_basis=newest_token"]


def _run(out: Path, *more: str) -> tuple[dict[str, int], list[ev.Event]]:
    cfg = load_config(ROOT / "configs" / "sim-p2.yaml", [*P2, *more])
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok
    summary = json.loads((out / "summary.json").read_text())
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    return summary["discards"], events


def _stale_share(discards: dict[str, int], events: list[ev.Event]) -> float:
    accepted = sum(len(e.samples) for e in events if isinstance(e, ev.Committed))
    return discards.get("stale", 0) / (accepted + discards.get("stale", 0))


def test_refresh_on_p2_verifies_and_cuts_the_stale_share(tmp_path: Path) -> None:
    base, base_events = _run(tmp_path / "base")
    fresh, events = _run(tmp_path / "refresh", "tail.refresh=true")
    refreshed = {e.sample for e in events if isinstance(e, ev.Discarded)
                 and e.reason == "refreshed"}
    assert refreshed and fresh["refreshed"] == len(refreshed)
    trained = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    assert not refreshed & trained
    assert all(e.detail.startswith("refresh ") and "(newest_token)" in e.detail
               for e in events if isinstance(e, ev.Discarded) and e.reason == "refreshed")
    assert _stale_share(fresh, events) < _stale_share(base, base_events)
    assert "refreshed" not in base
    # counted apart: summary.json's refreshed figures and the bench's long-tail row
    summary = json.loads((tmp_path / "refresh" / "summary.json").read_text())
    started = sum(1 for e in events if isinstance(e, ev.Started))
    assert summary["refreshed"]["attempts"] == len(refreshed)
    assert summary["refreshed"]["share"] == len(refreshed) / started
    assert 0 < summary["refreshed"]["token_share"] < 1
    row = tail_row(tmp_path / "refresh", "refresh", [])
    assert row["refreshed"] == summary["refreshed"]["share"] and row["refreshed_worker_s"] > 0
    assert tail_row(tmp_path / "base", "base", [])["refreshed"] == 0.0
    (config,) = [json.loads(e.config) for e in events if isinstance(e, ev.RunConfig)]
    assert config["tail"]["refresh"] is True and config["tail"]["max_refreshes"] == 3

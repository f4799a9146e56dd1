"""configs/longtail.yaml: the long-tailed ``repeat`` task on the real model (issue 26)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from e2e_helpers import freshroll

pytestmark = pytest.mark.slow


def test_the_long_tailed_config_trains_on_the_real_model(tmp_path: Path) -> None:
    out = tmp_path / "lt"
    proc = freshroll("run", "configs/longtail.yaml", "run.steps=3", "run.progress=false",
                     "--out", str(out))
    assert "verify: ok" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and 0 <= summary["reward_last"] <= 1
    db = sqlite3.connect(out / "ledger.sqlite")
    tokens = [n for (n,) in db.execute(
        "SELECT json_extract(body, '$.tokens') FROM events WHERE kind='generated'")]
    assert len(tokens) >= 3 * 64 and max(tokens) <= 52 and len(set(tokens)) > 1
    prompts = [t for (t,) in db.execute(
        "SELECT json_extract(body, '$.prompt_id') FROM events WHERE kind='requested'")]
    assert all(p.startswith("repeat-s0-") for p in prompts)

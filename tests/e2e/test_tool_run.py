"""The built-in tool task end to end through the real CLI (issue 49): ``freshroll run
configs/tool-smoke.yaml`` trains calculator episodes on the embedded model and ``freshroll
verify`` passes on the run directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import REPO, freshroll, summary

pytestmark = pytest.mark.slow


def test_the_tool_smoke_config_trains_and_verifies(tmp_path: Path) -> None:
    out = tmp_path / "tool"
    proc = freshroll("run", str(REPO / "configs" / "tool-smoke.yaml"), "run.progress=false",
                     "run.torch_threads=1", "--out", str(out))
    assert "verify: ok" in proc.stdout
    s = summary(out)
    assert s["steps"] == 4 and s["accepted_rollouts"] == 4 * 16
    assert freshroll("verify", str(out)).returncode == 0
    samples = freshroll("export-samples", str(out), "--output", str(tmp_path / "s.jsonl"),
                        check=False)
    assert samples.returncode == 0, samples.stderr
    config = (out / "config.yaml").read_text()
    assert "fn: numeric" in config and "workflow: calc_tool" in config

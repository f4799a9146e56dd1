"""``freshroll run --baseline``: the synchronous baseline beside the run, and the two compared in
time to reward (summary.json, report.html, the terminal), on the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import freshroll

from freshroll.figures.reward_time import BLOCK, compare_dirs
from freshroll.harness.verify import verify_run
from freshroll.procs import available_cores

pytestmark = pytest.mark.slow


def test_a_run_with_its_baseline_reports_time_to_reward(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = freshroll("run", "configs/smoke.yaml", "run.steps=10", "run.progress=false",
                     "--out", str(out), "--baseline")
    base = out / "baseline"
    summary = json.loads((base / "summary.json").read_text())
    assert summary["mode"] == "sync"
    # the baseline's stages were settled on untimed steps first, then reused (issue 46);
    # with one core there is nothing to settle
    if available_cores() >= 2:
        assert "settled first on 8 untimed steps" in proc.stderr
        stages = summary["host"]["placement"]["stages"]
        assert stages and all(s["reused_from"] > 0 for s in stages.values())
    assert not list(out.glob("baseline-settle-*"))  # the scratch directory is gone
    asynchrony = json.loads((out / "summary.json").read_text())["asynchrony"]
    assert asynchrony["source"] == "baseline"  # one answer, from the most direct reading
    assert asynchrony["sync_per_s"] == summary["accepted_rollouts_per_s"]
    assert "source: the synchronous baseline run of the same work" in proc.stderr
    block = json.loads((out / "summary.json").read_text())[BLOCK]
    assert block["baseline"] == "baseline"  # relative: the baseline lies inside the run
    want = compare_dirs(out, base)
    assert block["levels"] == json.loads(json.dumps(want["levels"]))
    assert block["equal_steps"]["steps"] == 10 and block["window"] == 1
    assert ("time to reward (async vs sync" in proc.stderr
            or "time to reward: not compared" in proc.stderr), proc.stderr
    html = (out / "report.html").read_text()
    assert "<h3>Time to reward</h3>" in html
    assert "baseline: async vs sync accepted rollouts/s" in html  # the header card's source
    # what the model wrote: the best, worst and a random sample of each step range
    section = html[html.index('<section id="completions">'):]
    section = section[:section.index("</section>")]
    assert section.count("<td>best</td>") == 3 and "<code>rev " in section  # decoded prompts
    assert verify_run(out).ok and verify_run(base).ok

"""A reward function edited between a run and its resume (issue 29, item 5): a new reward
version mid-run is said at the resume, recorded in the ledger, shown by the end line,
summary.json, the report and ``lineage``; under ``run.reward_versions: single`` the resume
is refused with one clear line and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from e2e_helpers import freshroll, summary

from freshroll.report.provenance import lineage

pytestmark = pytest.mark.slow

REWARD = ("def f(prompts, completions, target, **kw):\n"
          "    return [float(c.strip() == t) for c, t in zip(completions, target)]\n")
#: the same reward, edited: partial credit for the first character
EDITED = ("def f(prompts, completions, target, **kw):\n"
          "    return [float(c.strip() == t) + 0.5 * float(c[:1] == t[:1])\n"
          "            for c, t in zip(completions, target)]\n")


def _project(root: Path) -> Path:
    root.mkdir()
    rows = [json.dumps({"prompt": f"rev {n}=", "target": str(n)[::-1]}) for n in range(100, 132)]
    (root / "data.jsonl").write_text("\n".join(rows) + "\n")
    (root / "my_rewards.py").write_text(REWARD)
    (root / "config.yaml").write_text(
        f"task:\n  file: {root / 'data.jsonl'}\nrewards:\n  - fn: {root / 'my_rewards.py'}:f\n"
        "run:\n  steps: 3\n  progress: false\nrollout:\n  group_size: 4\n  batch_groups: 2\n")
    return root


def test_an_edited_reward_is_recorded_shown_and_refusable(tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj")
    run = proj / "run"
    freshroll("run", str(proj / "config.yaml"), "--out", str(run))
    (proj / "my_rewards.py").write_text(EDITED)
    refused_copy = tmp_path / "refused"
    shutil.copytree(run, refused_copy)

    # single: refused before anything is written
    before = (refused_copy / "ledger.sqlite").read_bytes()
    res = freshroll("run", "--resume", str(refused_copy), "run.steps=5",
                    "run.reward_versions=single", check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "the reward functions changed since the run's last start (reward version r:" \
        in res.stderr and "run.reward_versions is single" in res.stderr, res.stderr
    assert (refused_copy / "ledger.sqlite").read_bytes() == before

    # allow_change (the default): said, recorded, and seen everywhere
    res = freshroll("run", "--resume", str(run), "run.steps=5")
    assert 'resume: rewards.version "r:f:' in res.stderr
    assert "(recorded in the ledger)" in res.stderr
    assert "reward versions: 2, the reward functions changed within the run" in res.stderr
    versions = summary(run)["reward_versions"]
    (old, a), (new, b) = versions.items()
    assert old != new
    assert (a["first_step"], a["last_step"]) == (1, 3) and a["samples"] == 3 * 8
    assert (b["first_step"], b["last_step"]) == (4, 5) and b["samples"] == 2 * 8
    assert "reward versions: 2" in (run / "report.html").read_text()
    assert set(lineage(run, "2")["reward_versions"]) == {old}
    assert set(lineage(run, "5")["reward_versions"]) == {new}
    assert freshroll("verify", str(run)).returncode == 0

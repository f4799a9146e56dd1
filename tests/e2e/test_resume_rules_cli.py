"""``freshroll run --resume`` against the ledger it continues, through the real CLI.

Each test copies one finished 3-step run and resumes the copy (README, "Resume rules").
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import freshroll, summary

SMALL = ["run.progress=false", "task.n_prompts=256", "rollout.group_size=4",
         "rollout.batch_groups=4"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "run"
    freshroll("run", *SMALL, "run.steps=3", "--out", str(out))
    return out


@pytest.fixture
def run_copy(base_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out


def _events(out: Path, kind: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        rows = db.execute("SELECT body FROM events WHERE kind=? ORDER BY seq", (kind,)).fetchall()
    finally:
        db.close()
    return [json.loads(r[0]) for r in rows]


def _n_events(out: Path) -> int:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        db.close()


def test_a_run_records_its_config_and_model_in_the_ledger(base_run: Path):
    (rc,) = _events(base_run, "run_config")
    assert rc["step"] == 0
    config = json.loads(rc["config"])
    assert config["rollout"]["group_size"] == 4 and config["run"]["steps"] == 3
    assert config == yaml.safe_load((base_run / "config.yaml").read_text())
    (p0,) = [e for e in _events(base_run, "policy_published") if e["parent"] is None]
    assert rc["model_digest"] and p0["version"].startswith("p0-")


@pytest.mark.slow
def test_overrides_apply_on_top_of_the_saved_config(run_copy: Path):
    """Before: every override but run.steps was dropped (and config.yaml rewritten)."""
    res = freshroll("run", "--resume", str(run_copy), "run.steps=4",
                    "trainer.checkpoint_every=2")
    assert "verify: ok" in res.stdout
    saved = yaml.safe_load((run_copy / "config.yaml").read_text())
    assert saved["run"]["steps"] == 4
    assert saved["trainer"]["checkpoint_every"] == 2
    assert saved["rollout"]["group_size"] == 4  # the saved value, not the default 16
    assert summary(run_copy)["steps"] == 4
    (change,) = _events(run_copy, "settings_changed")
    assert change["keys"] == ["run.steps", "trainer.checkpoint_every"]
    assert change["allowed"] == [] and change["step"] == 3
    assert json.loads(change["new"]) == {"run.steps": 4, "trainer.checkpoint_every": 2}
    assert [e["step"] for e in _events(run_copy, "run_config")] == [0, 3]


def test_a_config_file_given_with_resume_is_validated(run_copy: Path, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  stepz: 5\n")
    before = _n_events(run_copy)
    res = freshroll("run", str(bad), "--resume", str(run_copy), check=False)
    assert res.returncode == 2
    assert "run.stepz: unknown key" in res.stderr and str(bad) in res.stderr
    assert _n_events(run_copy) == before


def test_a_config_file_given_with_resume_is_compared(run_copy: Path, tmp_path: Path):
    other = tmp_path / "other.yaml"  # group_size 16 (the default) instead of the run's 4
    other.write_text("run:\n  steps: 5\n")
    res = freshroll("run", str(other), "--resume", str(run_copy), check=False)
    assert res.returncode == 2
    assert "rollout.group_size" in res.stderr and "rollout.batch_groups" in res.stderr
    assert "start a new run" in res.stderr


def test_keys_that_can_never_change_are_refused_by_name(run_copy: Path):
    before, config = _n_events(run_copy), (run_copy / "config.yaml").read_text()
    res = freshroll("run", "--resume", str(run_copy), "rollout.group_size=8",
                    "task.n_prompts=64", "trainer.lr=0.002", "--allow-change", "trainer.lr",
                    check=False)
    assert res.returncode == 2
    assert "rollout.group_size, task.n_prompts cannot change within a run" in res.stderr
    assert "rollout.group_size 4 -> 8" in res.stderr and "start a new run" in res.stderr
    assert _n_events(run_copy) == before  # nothing was written: not the ledger...
    assert (run_copy / "config.yaml").read_text() == config  # ...nor config.yaml


def test_another_model_is_refused_by_its_step0_digest(run_copy: Path):
    """Before: a different model under the same path was accepted silently."""
    from freshroll.engines.tiny import save_tiny

    save_tiny(run_copy / "model", seed=5)  # same config keys, other weights
    res = freshroll("run", "--resume", str(run_copy), "run.steps=4", check=False)
    assert res.returncode == 2
    assert "model:" in res.stderr and "step-0 policy version" in res.stderr
    (p0,) = [e for e in _events(run_copy, "policy_published") if e["parent"] is None]
    assert p0["version"] in res.stderr


@pytest.mark.slow
def test_an_edited_lr_is_refused_then_applied_in_full_when_allowed(run_copy: Path):
    """Before: the new lr went into the settings digest while the restored optimizer kept
    the old one (or the replay failed, blaming non-determinism)."""
    cfg = run_copy / "config.yaml"
    cfg.write_text(cfg.read_text().replace("lr: 0.001", "lr: 0.002"))
    before = _n_events(run_copy)
    res = freshroll("run", "--resume", str(run_copy), "run.steps=4", check=False)
    assert res.returncode == 2
    assert "trainer.lr 0.001 -> 0.002" in res.stderr
    assert "--allow-change trainer.lr" in res.stderr
    assert _n_events(run_copy) == before

    res = freshroll("run", "--resume", str(run_copy), "run.steps=4", "run.max_staleness=2",
                    "--allow-change", "trainer.lr", "--allow-change", "run.max_staleness")
    assert "verify: ok" in res.stdout
    (change,) = _events(run_copy, "settings_changed")
    assert change["allowed"] == ["run.max_staleness", "trainer.lr"]
    assert json.loads(change["old"])["trainer.lr"] == 0.001
    assert json.loads(change["new"])["trainer.lr"] == 0.002
    assert [e["max_staleness"] for e in _events(run_copy, "opened")] == [1, 2]  # the kernel
    digests = [e["settings_digest"] for e in _events(run_copy, "committed")]
    assert len(set(digests[:3])) == 1 and digests[3] != digests[0]
    # the optimizer that trained step 4 ran at the new lr (its checkpoint says so)
    doc = json.loads((run_copy / "checkpoints" / "step-000004" / "optimizer.json").read_text())
    assert {g["lr"] for g in doc["param_groups"]} == {0.002}

    # a later replay from the initial model trains steps 1-3 at 0.001 and step 4 at 0.002
    shutil.rmtree(run_copy / "checkpoints")
    res = freshroll("run", "--resume", str(run_copy), "run.steps=5")
    assert "replayed 4 committed steps" in res.stderr and "verify: ok" in res.stdout


def test_allow_change_names_only_keys_that_need_it(run_copy: Path):
    for extra, msg in [
        (["--allow-change", "trainer.lr_rate"], "not a config key"),
        (["--allow-change", "trainer.lr"], "trainer.lr is unchanged"),
        (["--allow-change", "run.steps"], "may change on resume without it"),
    ]:
        res = freshroll("run", "--resume", str(run_copy), *extra, check=False)
        assert res.returncode == 2 and msg in res.stderr, res.stderr


@pytest.mark.slow
def test_the_runs_own_relative_config_file_resumes_it_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Issue 28, defect 1: a config with relative paths (task.file, a reward file), given
    again with --resume, was refused ("task.file, rewards cannot change": the relative paths
    were compared with the absolute ones recorded), and from another directory failed with
    "file my_rewards.py does not exist"."""
    proj = tmp_path / "proj"
    proj.mkdir()
    rows = [json.dumps({"prompt": f"rev {n}=", "target": str(n)[::-1]}) for n in range(100, 132)]
    (proj / "data.jsonl").write_text("\n".join(rows) + "\n")
    (proj / "my_rewards.py").write_text(
        "def f(prompts, completions, target, **kw):\n"
        "    return [float(c.strip() == t) for c, t in zip(completions, target)]\n")
    (proj / "config.yaml").write_text(
        "task:\n  file: data.jsonl\nrewards:\n  - fn: my_rewards.py:f\n"
        "run:\n  steps: 2\n  progress: false\nrollout:\n  group_size: 4\n  batch_groups: 2\n")
    from click.testing import CliRunner

    from freshroll.cli import main

    def here(*args: str) -> Any:  # in this test's working directory (freshroll() uses REPO)
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    monkeypatch.chdir(proj)
    res = here("run", "config.yaml", "--out", "run")
    assert res.exit_code == 0, res.output
    res = here("run", "--resume", "run", "config.yaml", "run.steps=3")
    assert res.exit_code == 0 and "verify: ok" in res.stdout, res.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    res = here("run", "--resume", str(proj / "run"), str(proj / "config.yaml"), "run.steps=4")
    assert res.exit_code == 0 and "verify: ok" in res.stdout, res.output
    assert summary(proj / "run")["steps"] == 4


def test_a_resumed_run_is_described_segment_by_segment(run_copy: Path):
    """Issue 28 defect 6: a resume in another mode ended with the first segment's figures."""
    res = freshroll("run", "--resume", str(run_copy), "run.steps=5", "run.max_staleness=0",
                    "--allow-change", "run.max_staleness")
    assert "verify: ok" in res.stdout
    s = summary(run_copy)
    first, second = s["segments"]
    assert (first["from_step"], first["to_step"], first["mode"]) == (0, 3, "async")
    assert (second["from_step"], second["to_step"], second["mode"]) == (3, 5, "sync")
    assert first["stopped"] == second["stopped"] == "done"
    assert first["accepted_rollouts"] + second["accepted_rollouts"] == s["accepted_rollouts"]
    assert second["overlap"]["verdict"] == "sync"  # not the async segment's verdict
    assert "this run in 2 segments (a start and 1 resume):" in res.stderr
    assert re.search(r"  1: steps 1-3, async \(max_staleness 1\): [\d.]+ accepted rollouts/s"
                     r".*; ended: done\n  2: steps 4-5, sync: [\d.]+ accepted rollouts/s",
                     res.stderr), res.stderr
    assert "this run in 2 segments" in (run_copy / "report.html").read_text()


def test_a_run_never_resumed_has_one_segment_and_no_segment_lines(base_run: Path):
    (only,) = summary(base_run)["segments"]
    s = summary(base_run)
    assert (only["from_step"], only["to_step"], only["steps"]) == (0, 3, 3)
    assert only["accepted_rollouts_per_s"] == s["accepted_rollouts_per_s"]
    assert only["overlap"]["verdict"] == s["overlap"]["verdict"]

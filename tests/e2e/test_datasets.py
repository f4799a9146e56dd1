"""The real CLI with a TRL user's pieces: a chat dataset beside the config, own and TRL rewards."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from e2e_helpers import freshroll, summary

from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

USER_REWARD = textwrap.dedent("""
    def match_target(prompts, completions, completion_ids, target, level, trainer_state,
                     **kwargs):
        # TRL's convention: chat prompts and completions are lists of messages; every column
        # arrives by its own name; a wrong shape raises, which the test would see as discards
        assert all(p[0]["role"] == "user" for p in prompts), prompts
        assert all(c[0]["role"] == "assistant" for c in completions), completions
        assert all(isinstance(i, int) for ids in completion_ids for i in ids)
        assert all(isinstance(x, int) for x in level)
        assert trainer_state.max_steps == 2
        return [1.0 if c[0]["content"].strip() == t else None for c, t in
                zip(completions, target)]
""")


def _project(root: Path, reward_lines: str) -> Path:
    """A user's folder: config, data/ and a reward file, all referenced relatively."""
    (root / "data").mkdir(parents=True)
    rows = [{"uid": f"q{n}", "prompt": [{"role": "user", "content": f"rev {n:03d}="}],
             "target": str(n).zfill(3)[::-1], "level": n % 3} for n in range(40)]
    (root / "data" / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "my_rewards.py").write_text(USER_REWARD)
    cfg = root / "config.yaml"
    cfg.write_text(
        "task: {file: data/chat.jsonl, id_field: uid}\n"
        "run: {steps: 2, progress: false}\n"
        "rollout: {group_size: 4, batch_groups: 4}\n"
        f"rewards:\n{reward_lines}"
    )
    return cfg


@pytest.mark.slow
def test_chat_dataset_with_own_and_trl_rewards_beside_the_config(tmp_path: Path):
    cfg = _project(tmp_path / "project", (
        "  - {fn: my_rewards.py:match_target}\n"
        "  - {fn: trl.rewards:get_soft_overlong_punishment, weight: 0.1,"
        " args: {max_completion_len: 4, soft_punish_cache: 2}}\n"
    ))
    out = tmp_path / "run"
    proc = freshroll("run", str(cfg), "--out", str(out))  # cwd is the repo, not the project
    assert "verify: ok" in proc.stdout
    # the terminal holds freshroll's lines only: no datasets progress bar (issue 28 defect 7)
    assert "Generating train split" not in proc.stderr and "it/s]" not in proc.stderr, proc.stderr
    s = summary(out)
    assert s["steps"] == 2
    assert "reward_error" not in s["discards"], s["discards"]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["task"]["file"] == str(tmp_path / "project" / "data" / "chat.jsonl")
    # the built-in task's keys are recorded as unused, here and in the ledger (issue 48)
    assert {k: saved["task"][k] for k in ("name", "n_prompts", "params")} == dict.fromkeys(
        ("name", "n_prompts", "params"))
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
        recorded = [json.loads(e.config) for _, e in ledger.events()
                    if isinstance(e, ev.RunConfig)]
    assert recorded and recorded[-1]["task"]["name"] is None
    assert saved["rewards"][0]["fn"] == f"{tmp_path / 'project' / 'my_rewards.py'}:match_target"


def test_a_reward_asking_for_a_missing_column_stops_before_the_run(tmp_path: Path):
    cfg = _project(tmp_path / "p", "  - {fn: reverse}\n")
    proc = freshroll("run", str(cfg), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert "'reverse' needs dataset column(s) ['answer']" in proc.stderr
    assert "['level', 'target', 'uid']" in proc.stderr and "task.answer_field" in proc.stderr
    assert not (tmp_path / "run" / "ledger.sqlite").exists()


LOGGING_REWARDS = textwrap.dedent("""
    def exact(completions, target, log_metric, log_extra, **kwargs):
        log_metric("batch_size", float(len(completions)))
        log_extra("first_word", [c[0]["content"][:4] for c in completions])
        return [float(c[0]["content"].strip() == t) for c, t in zip(completions, target)]

    def short(completions, level, **kwargs):  # not applicable to level-0 prompts
        return [None if lv == 0 else -len(c[0]["content"]) / 8 for c, lv in
                zip(completions, level)]
""")


@pytest.mark.slow
def test_per_reward_figures_equal_a_recomputation_from_the_ledger(tmp_path: Path):
    """Issue 28 build 5: each reward's mean and std per step, the share of groups with zero
    reward std and TRL's log_metric / log_extra values, persisted and recomputed."""
    import math
    import sqlite3
    import statistics

    cfg = _project(tmp_path / "project", "  - {fn: my_rewards.py:exact}\n"
                   "  - {fn: my_rewards.py:short, weight: 0.5}\n")
    (tmp_path / "project" / "my_rewards.py").write_text(LOGGING_REWARDS)
    out = tmp_path / "run"
    proc = freshroll("run", str(cfg), "run.steps=3", "--out", str(out))
    assert "verify: ok" in proc.stdout
    db = sqlite3.connect(out / "ledger.sqlite")
    bodies = [json.loads(b) for (b,) in db.execute("SELECT body FROM events ORDER BY seq")]
    db.close()
    rewarded = {e["sample"]: e for e in bodies if e["kind"] == "rewarded"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    commits = [e for e in bodies if e["kind"] == "committed"]
    assert len(rows) == len(commits) == 3
    groups_all, zero_all, n_short, n_none = 0, 0, 0, 0
    for row, commit in zip(rows, commits, strict=True):
        scored = [rewarded[s] for s in commit["samples"]]
        for name in ("exact", "short"):
            vals = [r["components"][name] for r in scored if name in r["components"]]
            if not vals:  # every sample of the batch had None from it: no column
                assert f"rewards/{name}/mean" not in row
                continue
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            assert row[f"rewards/{name}/mean"] == pytest.approx(statistics.fmean(vals))
            assert row[f"rewards/{name}/std"] == pytest.approx(std)
        n_short += sum(1 for r in scored if "short" in r["components"])
        n_none += sum(1 for r in scored if "short" not in r["components"])
        groups: dict[str, list[float]] = {}
        for r in scored:
            groups.setdefault(r["sample"].split(".")[0], []).append(r["reward"])
        zero = sum(1 for v in groups.values() if len(v) < 2 or statistics.stdev(v) <= 1e-8)
        assert row["frac_reward_zero_std"] == pytest.approx(zero / len(groups))
        groups_all, zero_all = groups_all + len(groups), zero_all + zero
        assert row["logged/batch_size"] > 0 and math.isfinite(row["logged/batch_size"])
        assert all(isinstance(r["extras"]["first_word"], str) for r in scored)
    assert n_short and n_none  # the None of a reward is left out of its figures
    assert summary(out)["frac_reward_zero_std"] == pytest.approx(zero_all / groups_all)

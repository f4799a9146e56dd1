"""The real CLI with a TRL user's pieces: a chat dataset beside the config, own and TRL rewards."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from e2e_helpers import freshroll, summary

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
    assert saved["rewards"][0]["fn"] == f"{tmp_path / 'project' / 'my_rewards.py'}:match_target"


def test_a_reward_asking_for_a_missing_column_stops_before_the_run(tmp_path: Path):
    cfg = _project(tmp_path / "p", "  - {fn: reverse}\n")
    proc = freshroll("run", str(cfg), "--out", str(tmp_path / "run"), check=False)
    assert proc.returncode == 2
    assert "'reverse' needs dataset column(s) ['answer']" in proc.stderr
    assert "['level', 'target', 'uid']" in proc.stderr and "task.answer_field" in proc.stderr
    assert not (tmp_path / "run" / "ledger.sqlite").exists()

"""Tests for the task and reward sections of the config: new keys and relative paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from freshroll.config import load_config, read_yaml, validate
from freshroll.errors import ConfigError


def test_paths_in_a_config_file_resolve_from_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    cfg_file = folder / "run.yaml"
    cfg_file.write_text(
        "task: {file: data/prompts.jsonl, id_field: uid, split: train}\n"
        "model: {path: ../models/mine}\n"
        "rewards:\n"
        "  - {fn: my_rewards.py:score}\n"
        "  - {fn: trl.rewards:get_soft_overlong_punishment,"
        " args: {max_completion_len: 16, soft_punish_cache: 4}}\n"
        "  - {fn: reverse}\n"
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: the file's folder decides, not the cwd
    cfg = load_config(cfg_file)
    assert cfg.task.file == str(folder / "data" / "prompts.jsonl")
    assert (cfg.task.id_field, cfg.task.split) == ("uid", "train")
    assert cfg.model.path == str(tmp_path / "models" / "mine")
    assert [r.fn for r in cfg.rewards] == [
        f"{folder / 'my_rewards.py'}:score", "trl.rewards:get_soft_overlong_punishment", "reverse"]
    assert cfg.rewards[1].args == {"max_completion_len": 16, "soft_punish_cache": 4}
    saved = tmp_path / "saved.yaml"  # what the run dir keeps, read back on --resume
    saved.write_text(cfg.to_yaml())
    monkeypatch.chdir(folder)
    assert validate(read_yaml(saved)) == cfg


def test_override_paths_resolve_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_file = tmp_path / "sub" / "c.yaml"
    cfg_file.parent.mkdir()
    cfg_file.write_text("task: {file: in_file.jsonl}\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(cfg_file).task.file == str(tmp_path / "sub" / "in_file.jsonl")
    cfg = load_config(cfg_file, ["task.file=given.jsonl"])
    assert cfg.task.file == str(tmp_path / "given.jsonl")
    assert load_config(None, ["task.file=/abs/p.jsonl"]).task.file == "/abs/p.jsonl"


def test_reward_entry_args_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"rewards\.0\.args"):
        load_config(None, ["rewards=[{fn: reverse, args: [1]}]"])
    with pytest.raises(ConfigError, match=r"task\.id_feld: unknown key"):
        load_config(None, ["task.id_feld=uid"])

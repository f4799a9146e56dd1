"""A user's model directory: each first mistake is one clear ConfigError naming the dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freshroll.engines.model_dir import check_model_dir
from freshroll.engines.tiny import save_tiny
from freshroll.errors import ConfigError


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save_tiny(tmp_path / "m")


def test_a_saved_tiny_model_passes(model: Path) -> None:
    check_model_dir(model)


def test_missing_dir_and_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        check_model_dir(tmp_path)


def test_garbage_config_json(model: Path) -> None:
    (model / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json is not valid JSON"):
        check_model_dir(model)


def test_no_tokenizer(model: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="has no tokenizer"):
        check_model_dir(model)


def test_vocabulary_smaller_than_the_tokenizer(model: Path) -> None:
    cfg = json.loads((model / "config.json").read_text())
    cfg["vocab_size"] = 10
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"has \d+ tokens but the model's vocabulary .* 10"):
        check_model_dir(model)


def test_the_cli_stops_on_a_vocabulary_mismatch_before_writing_anything(
    model: Path, tmp_path: Path
) -> None:
    """The first mistake ends at once with what to change, not a silent endless run."""
    from click.testing import CliRunner

    from freshroll.cli import main

    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "vocab_size": 10}))
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", f"model.path={model}", "run.progress=false",
                                    "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "vocabulary (config.json vocab_size) holds 10" in res.output
    assert "resize_token_embeddings" in res.output
    assert not (out / "ledger.sqlite").exists()

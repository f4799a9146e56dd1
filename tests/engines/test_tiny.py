"""Tests for the embedded tiny model: tokenizer exactness, reproducible weights, real save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from freshroll.engines.tiny import (
    CHARS,
    VOCAB,
    build_tiny,
    build_tokenizer,
    ensure_tiny,
    model_digest,
    save_tiny,
)
from freshroll.errors import ConfigError


def test_special_token_ids_and_vocab_order() -> None:
    tok = build_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == len(VOCAB) == len(set(VOCAB))
    assert [tok.convert_tokens_to_ids(c) for c in CHARS] == [VOCAB.index(c) for c in CHARS]
    assert VOCAB.index("0") < VOCAB.index("a") < VOCAB.index("z")


def test_one_token_per_character_and_no_bos_added() -> None:
    tok = build_tokenizer()
    ids = tok.encode("rev 123=")
    assert ids == [VOCAB.index(c) for c in "rev 123="]
    assert tok("rev 123=", add_special_tokens=True)["input_ids"] == ids


@pytest.mark.parametrize("text", ["rev 12 34=", "  a  b ", CHARS, "x|y:1,2<3>4*5-6+7"])
def test_decode_round_trips_exactly(text: str) -> None:
    tok = build_tokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_decode_skips_special_tokens_and_unknown_chars_encode() -> None:
    tok = build_tokenizer()
    ids = [tok.bos_token_id, *tok.encode("rev 12"), tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "rev 12"
    assert tok.encode("A\n") == [VOCAB.index("<unk>")] * 2


def test_same_seed_same_weights_different_seed_different() -> None:
    a, _ = build_tiny(seed=3)
    b, _ = build_tiny(seed=3)
    c, _ = build_tiny(seed=4)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert model_digest(a) == model_digest(b) != model_digest(c)


def test_build_does_not_disturb_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny(seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_overrides_reach_the_config_and_the_digest() -> None:
    model, _ = build_tiny(seed=0, num_hidden_layers=1, hidden_size=32)
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 32
    assert model_digest(model) != model_digest(build_tiny(seed=0)[0])


def test_saved_dir_loads_with_auto_classes_and_keeps_digest(tmp_path: Path) -> None:
    path = save_tiny(tmp_path / "m", seed=7)
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert tok.encode("rev 12 34=") == build_tokenizer().encode("rev 12 34=")
    assert tok.decode(tok.encode("rev 12 34=")) == "rev 12 34="
    rebuilt, _ = build_tiny(seed=7)
    for name, tensor in rebuilt.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    assert model_digest(path) == model_digest(rebuilt) == model_digest(model)
    assert model_digest(path) != model_digest(build_tiny(seed=8)[0])


def test_digest_sees_a_single_changed_weight(tmp_path: Path) -> None:
    model, _ = build_tiny(seed=0)
    before = model_digest(model)
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3
    assert model_digest(model) != before


def test_ensure_tiny_builds_once_and_reuses(tmp_path: Path) -> None:
    first = ensure_tiny(tmp_path, seed=2)
    assert first == tmp_path / "tiny-2"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny(tmp_path, seed=2)
    assert again == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-2"]  # no temp dirs left
    assert model_digest(first) == model_digest(build_tiny(seed=2)[0])


def test_digest_of_a_path_without_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        model_digest(tmp_path / "nowhere")

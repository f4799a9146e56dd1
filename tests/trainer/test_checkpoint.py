"""Tests for freshroll.trainer.checkpoint: round trips, tied weights, atomicity, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from freshroll.errors import ConfigError
from freshroll.trainer.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def _adam_step(model: nn.Linear, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 4, generator=gen)
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def _trained() -> tuple[nn.Linear, torch.optim.Adam]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.05, betas=(0.8, 0.95), weight_decay=0.01)
    _adam_step(model, opt, seed=1)
    return model, opt


def test_round_trip_optimizer_continues_identically(tmp_path: Path) -> None:
    model, opt = _trained()
    target = checkpoint_dir(tmp_path, 1)
    meta = {"step": 1, "policy_version": "v000001"}
    assert save_checkpoint(target, model_state=model.state_dict(), optimizer=opt, meta=meta) == (
        tmp_path / "step-000001"
    )
    ckpt = load_checkpoint(target)
    assert ckpt.meta == meta
    assert set(ckpt.model_state) == {"weight", "bias"}
    assert torch.equal(ckpt.model_state["weight"], model.weight.detach())
    assert ckpt.optimizer_state is not None
    assert ckpt.optimizer_state["param_groups"][0]["betas"] == (0.8, 0.95)

    torch.manual_seed(123)  # different init: everything must come from the checkpoint
    clone = nn.Linear(4, 3)
    clone.load_state_dict(ckpt.model_state)
    clone_opt = torch.optim.Adam(clone.parameters(), lr=0.3)
    clone_opt.load_state_dict(ckpt.optimizer_state)
    assert clone_opt.param_groups[0]["lr"] == 0.05

    _adam_step(model, opt, seed=2)
    _adam_step(clone, clone_opt, seed=2)
    assert torch.equal(clone.weight, model.weight)
    assert torch.equal(clone.bias, model.bias)
    assert float(clone_opt.state[clone.weight]["step"]) == 2.0


def test_model_only_checkpoint_has_no_optimizer(tmp_path: Path) -> None:
    model, _ = _trained()
    target = save_checkpoint(
        tmp_path / "step-000004", model_state=model.state_dict(), optimizer=None, meta={}
    )
    assert not (target / "optimizer.safetensors").exists()
    assert load_checkpoint(target).optimizer_state is None


def test_tied_weights_save_and_load(tmp_path: Path) -> None:
    emb = nn.Embedding(6, 4)
    head = nn.Linear(4, 6, bias=False)
    head.weight = emb.weight  # tied: two state-dict keys, one storage
    state = {"emb.weight": emb.weight, "head.weight": head.weight}
    assert state["emb.weight"].data_ptr() == state["head.weight"].data_ptr()
    target = save_checkpoint(
        tmp_path / "step-000002", model_state=state, optimizer=None, meta={"step": 2}
    )
    loaded = load_checkpoint(target).model_state
    assert torch.equal(loaded["emb.weight"], emb.weight.detach())
    assert torch.equal(loaded["head.weight"], emb.weight.detach())


def test_views_and_non_contiguous_tensors_are_saved(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    state = {"t": base.t(), "row": base[1], "full": base}
    target = save_checkpoint(tmp_path / "step-000003", model_state=state, optimizer=None, meta={})
    loaded = load_checkpoint(target).model_state
    for name, value in state.items():
        assert torch.equal(loaded[name], value)


def test_atomic_write_leaves_no_tmp_and_replaces_stale(tmp_path: Path) -> None:
    model, opt = _trained()
    target = tmp_path / "step-000007"
    stale = tmp_path / "step-000007.tmp"
    stale.mkdir()
    (stale / "junk").write_text("half-written")
    save_checkpoint(target, model_state=model.state_dict(), optimizer=opt, meta={"step": 7})
    save_checkpoint(target, model_state=model.state_dict(), optimizer=opt, meta={"step": 8})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000007"]
    assert sorted(p.name for p in target.iterdir()) == [
        "manifest.json",
        "meta.json",
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
    ]
    assert json.loads((target / "meta.json").read_text()) == {"step": 8}
    assert b"pickle" not in (target / "optimizer.json").read_bytes()


@pytest.mark.parametrize(
    "missing",
    ["model.safetensors", "optimizer.safetensors", "optimizer.json", "meta.json", "manifest.json"],
)
def test_missing_file_raises_config_error_naming_it(tmp_path: Path, missing: str) -> None:
    model, opt = _trained()
    target = save_checkpoint(
        tmp_path / "step-000001", model_state=model.state_dict(), optimizer=opt, meta={"step": 1}
    )
    (target / missing).unlink()
    with pytest.raises(ConfigError, match=re.escape(missing)) as info:
        load_checkpoint(target)
    assert str(target) in str(info.value)


def test_missing_directory_and_corrupt_file_raise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="step-000009"):
        load_checkpoint(tmp_path / "step-000009")
    model, _ = _trained()
    target = save_checkpoint(
        tmp_path / "step-000001", model_state=model.state_dict(), optimizer=None, meta={}
    )
    (target / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(ConfigError, match=r"model\.safetensors"):
        load_checkpoint(target)


def test_latest_checkpoint_picks_highest_step(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None
    for name in ["step-000009", "step-000123", "step-000010", "step-000999.tmp", "other"]:
        (tmp_path / name).mkdir()
    (tmp_path / "step-005000").write_text("a file, not a checkpoint")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000123"
    assert checkpoint_dir(tmp_path, 1234567) == tmp_path / "step-1234567"
    (tmp_path / "step-1234567").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-1234567"


# -- write failures: issue 23, defect 6 -------------------------------------------------------
def _failing_save_file(message: str):  # type: ignore[no-untyped-def]
    from safetensors import SafetensorError

    def save_file(tensors, filename, *a, **kw):  # type: ignore[no-untyped-def]
        raise SafetensorError(message)

    return save_file


def test_a_safetensors_write_failure_is_the_os_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors writes a temp file of its own and quotes the OS error in a
    SafetensorError; the checkpoint raises the OSError it is, naming the file asked for."""
    import errno

    from freshroll.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "save_file", _failing_save_file(
        "Error while serializing: I/O error: No space left on device (os error 28) at path "
        f'"{tmp_path}/.tmpAbC123"'))
    target = tmp_path / "step-000001"
    with pytest.raises(OSError) as info:
        checkpoint.save_checkpoint(target, model_state={"w": torch.zeros(3)}, optimizer=None,
                                   meta={"step": 1})
    assert info.value.errno == errno.ENOSPC
    assert info.value.strerror == "No space left on device"
    assert info.value.filename == str(tmp_path / "step-000001.tmp" / "model.safetensors")
    assert not target.exists() and not (tmp_path / "step-000001.tmp").exists()


def test_a_safetensors_error_that_is_not_an_os_error_passes_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors import SafetensorError

    from freshroll.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "save_file",
                        _failing_save_file("Error while serializing: header too large"))
    with pytest.raises(SafetensorError, match="header too large"):
        checkpoint.save_tensors({"w": torch.zeros(3)}, tmp_path / "x.safetensors")

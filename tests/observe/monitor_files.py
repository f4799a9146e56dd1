"""Reading back what the live-metrics watchers wrote (TensorBoard event files, an offline
W&B run's records), and the W&B tests' fixture: offline, inside tmp_path, torn down."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_board(logdir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every scalar under ``logdir``."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


BLOCK = 32 * 1024  # the .wandb file: a LevelDB-style log of protobuf records in 32 KiB blocks


@contextlib.contextmanager
def wandb_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No network, nothing outside ``tmp_path``; W&B's service process ended after each
    test (it is shared by the process's W&B runs and would otherwise live on to its exit)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()
    assert not wandb_core_children()


def wandb_core_children() -> list[str]:
    """This process's child processes running ``wandb-core``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and "wandb-core" in (
                    stat.parent / "cmdline").read_bytes().decode(errors="replace"):
                out.append(stat.parent.name)
    return out


def read_wandb(run_dir: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """The logged history ({step: {key: value}}) and config of the one offline W&B run in
    ``run_dir/wandb``, decoded from its ``.wandb`` record file."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, records, part = path.read_bytes(), 7, [], b""  # 7: the file's header
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # full, first
            part = chunk
        elif kind in (3, 4):  # middle, last
            part += chunk
        else:
            break
        if kind in (1, 4):
            records.append(part)
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
            history[rec.history.step.num] = {
                k: json.loads(v) for k, v in items.items() if not k.startswith("_")}
        elif rec.WhichOneof("record_type") == "run":  # the config given to wandb.init
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    return history, config

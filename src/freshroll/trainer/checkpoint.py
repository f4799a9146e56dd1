"""Atomic, pickle-free training checkpoints (safetensors + JSON).

Layout of one checkpoint directory (``root/step-000123``)::

    model.safetensors      every model tensor, contiguous; shared storage (tied weights) cloned
    optimizer.safetensors  every tensor of optimizer.state_dict(): "state.<param_idx>.<name>",
                           and tensor-valued hyper-parameters: "param_groups.<gi>.<name>"
    optimizer.json         {"param_groups": [...], "state": {idx: {name: scalar}}} (non-tensors)
    meta.json              caller metadata (step, policy version, ...)
    manifest.json          {"format": 1, "files": [...]} written last; names what load needs

The two ``optimizer.*`` files exist only when an optimizer was given. Tuples in the optimizer
state (e.g. Adam's ``betas``) are stored as ``{"__tuple__": [...]}`` and restored as tuples.

A *sharded* checkpoint (``trainer.parallel: fsdp``: ``save_checkpoint(shards=...)``) holds,
instead of the model and optimizer files, what each rank wrote of its shard with
``torch.distributed.checkpoint`` (``__<rank>_0.distcp`` and the plan, ``.metadata``: the
model and the optimizer keyed by parameter name), and its manifest says so:
``"sharded": {"parallel", "world_size", "step", "version", "digest"}`` (the digest of the
full weights). :func:`load_checkpoint` reads it in one process into the full state (torch's
planner reassembles the shards), so it resumes at any world size; its ``optimizer_state``
is then keyed by parameter name (``Checkpoint.by_name``). The non-tensor entries of that
format (the param groups) are torch-serialised, not JSON.

Atomicity: everything is written into ``<dir>.tmp`` (a stale one is removed first), each file
and the tmp directory are fsynced, then ``os.replace(<dir>.tmp, <dir>)``. An existing
``<dir>`` is first renamed to ``<dir>.old`` and deleted after the swap, so a reader sees
either the old or the new checkpoint, never a mix. ``step-NNNNNN`` directories are the only
ones :func:`latest_checkpoint` considers; the step is ``int(NNNNNN)``.

Write failures: :func:`save_checkpoint` raises ``OSError`` (errno, and the file it was
writing) for every failed write, also where safetensors raises its own ``SafetensorError``
quoting the OS error ("No space left on device (os error 28)"), so the run's error boundary
reports a full disk as a disk-full error naming the file, not as a bug.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from freshroll.atomic import fsync_path, replace_dir
from freshroll.errors import ConfigError

__all__ = [
    "Checkpoint",
    "checkpoint_dir",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

MODEL_FILE = "model.safetensors"
OPTIM_TENSORS_FILE = "optimizer.safetensors"
OPTIM_JSON_FILE = "optimizer.json"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d+)$")
_OS_ERROR_RE = re.compile(r"\(os error (\d+)\)")


@dataclass
class Checkpoint:
    """A loaded checkpoint; ``optimizer_state`` feeds ``optimizer.load_state_dict``."""

    model_state: dict[str, Tensor]
    optimizer_state: dict[str, Any] | None
    meta: dict[str, Any]
    #: a sharded checkpoint's manifest entry (module docstring); None: a whole one
    sharded: dict[str, Any] | None = None


#: ``(directory) -> manifest entry``: every rank's shard written into ``directory``
WriteShards = Callable[[Path], dict[str, Any]]


def checkpoint_dir(root: Path, step: int) -> Path:
    """``root / "step-000123"`` for ``step=123`` (zero-padded to six digits)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return Path(root) / f"step-{step:06d}"


def _plain_tensors(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Detached, CPU, contiguous tensors; any storage seen before is cloned (tied weights)."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, value in tensors.items():
        t = value.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()  # shared with an earlier tensor, or a view into a larger buffer
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _to_json(value: Any) -> Any:
    """JSON-ready copy of ``value``: tuples tagged, dict keys stringified."""
    if isinstance(value, tuple):
        return {"__tuple__": [_to_json(v) for v in value]}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint JSON file")


def _from_json(value: Any) -> Any:
    """Inverse of :func:`_to_json` (dict keys stay strings)."""
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_from_json(v) for v in value["__tuple__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _split_optimizer(sd: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into safetensors-able tensors and JSON-able rest."""
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, param_state in sd["state"].items():
        for name, value in param_state.items():
            if isinstance(value, Tensor):
                tensors[f"state.{idx}.{name}"] = value
            else:
                scalars.setdefault(str(idx), {})[name] = _to_json(value)
    groups: list[dict[str, Any]] = []
    for gi, group in enumerate(sd["param_groups"]):
        plain: dict[str, Any] = {}
        for name, value in group.items():
            if isinstance(value, Tensor):
                tensors[f"param_groups.{gi}.{name}"] = value
            else:
                plain[name] = _to_json(value)
        groups.append(plain)
    return tensors, {"param_groups": groups, "state": scalars}


def _join_optimizer(tensors: Mapping[str, Tensor], doc: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`_split_optimizer`; parameter indices come back as ``int``."""
    state: dict[int, dict[str, Any]] = {
        int(idx): dict(_from_json(values)) for idx, values in doc["state"].items()
    }
    groups: list[dict[str, Any]] = [dict(_from_json(g)) for g in doc["param_groups"]]
    for key, value in tensors.items():
        kind, index, name = key.split(".", 2)
        if kind == "state":
            state.setdefault(int(index), {})[name] = value
        else:
            groups[int(index)][name] = value
    return {"state": state, "param_groups": groups}


def _write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` as indented, key-sorted JSON and fsync it."""
    with path.open("w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def save_tensors(tensors: Mapping[str, Tensor], path: Path) -> None:
    """``safetensors.torch.save_file`` whose write failures raise ``OSError(errno, strerror,
    path)``: safetensors quotes the OS error ("... (os error 28) at path ...tmpXYZ") in a
    ``SafetensorError`` of its own. Its other errors (bad tensors) pass unchanged."""
    try:
        save_file(dict(tensors), str(path))
    except SafetensorError as exc:
        found = _OS_ERROR_RE.search(str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from exc


def _write_all(
    tmp: Path,
    model_state: Mapping[str, Tensor],
    optimizer: torch.optim.Optimizer | Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    shards: WriteShards | None = None,
) -> None:
    """Write every checkpoint file into ``tmp`` (manifest last) and fsync them."""
    if shards is not None:
        entry = {**shards(tmp), "step": meta.get("step"), "version": meta.get("version")}
        _write_json(tmp / META_FILE, _to_json(dict(meta)))
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        for name in files:
            fsync_path(tmp / name)
        _write_json(tmp / MANIFEST_FILE, {"format": FORMAT_VERSION, "files": files,
                                          "sharded": entry})
        fsync_path(tmp)
        return
    files = [MODEL_FILE, META_FILE]
    save_tensors(_plain_tensors(model_state), tmp / MODEL_FILE)
    fsync_path(tmp / MODEL_FILE)
    if optimizer is not None:
        sd = optimizer if isinstance(optimizer, Mapping) else optimizer.state_dict()
        tensors, doc = _split_optimizer(sd)
        save_tensors(_plain_tensors(tensors), tmp / OPTIM_TENSORS_FILE)
        fsync_path(tmp / OPTIM_TENSORS_FILE)
        _write_json(tmp / OPTIM_JSON_FILE, doc)
        files += [OPTIM_TENSORS_FILE, OPTIM_JSON_FILE]
    _write_json(tmp / META_FILE, _to_json(dict(meta)))
    _write_json(tmp / MANIFEST_FILE, {"format": FORMAT_VERSION, "files": sorted(files)})
    fsync_path(tmp)


def save_checkpoint(
    directory: Path,
    *,
    model_state: Mapping[str, Tensor],
    optimizer: torch.optim.Optimizer | Mapping[str, Any] | None,
    meta: Mapping[str, Any],
    shards: WriteShards | None = None,
) -> Path:
    """Atomically write a checkpoint to ``directory`` (layout in the module docstring).

    ``optimizer``: the optimizer, or its ``state_dict()`` (fetched from a trainer elsewhere).
    ``shards``: a sharded checkpoint, written by it (``model_state`` and ``optimizer`` unused).

    ``meta`` must be JSON-serialisable (tuples are tagged and restored). Returns
    ``directory``. An existing checkpoint at ``directory`` is replaced.
    """
    return replace_dir(
        Path(directory), lambda tmp: _write_all(tmp, model_state, optimizer, meta, shards),
        crash_point="checkpoint",
    )


def _read_json(path: Path) -> Any:
    """Parse a JSON file; unreadable or malformed files raise ``ConfigError`` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint file {path} is unreadable: {exc}") from exc


def _read_tensors(path: Path) -> dict[str, Tensor]:
    """Load a safetensors file; failures raise ``ConfigError`` naming it."""
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise ConfigError(f"checkpoint file {path} is unreadable: {exc}") from exc


def _required_files(directory: Path) -> tuple[list[str], dict[str, Any] | None]:
    """Files the manifest lists, and its sharded entry; raise ``ConfigError`` naming the
    first one missing."""
    if not directory.is_dir():
        raise ConfigError(f"checkpoint directory {directory} does not exist")
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ConfigError(f"checkpoint {directory} is incomplete: missing {MANIFEST_FILE}")
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise ConfigError(f"checkpoint {manifest_path}: unsupported format {manifest!r}")
    files = [str(f) for f in manifest.get("files", [])]
    sharded = manifest.get("sharded")
    for name in [*([] if sharded else [MODEL_FILE]), META_FILE, *files]:
        if not (directory / name).is_file():
            raise ConfigError(f"checkpoint {directory} is incomplete: missing {name}")
    return files, sharded


def load_checkpoint(directory: Path) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint` (tensors on CPU).

    Raises ``ConfigError`` naming the path and the missing or unreadable file.
    """
    directory = Path(directory)
    files, sharded = _required_files(directory)
    meta = _read_json(directory / META_FILE)
    if not isinstance(meta, dict):
        raise ConfigError(f"checkpoint file {directory / META_FILE} is not a JSON object")
    if sharded is not None:
        state = read_shards(directory)
        return Checkpoint(model_state=state["model"], optimizer_state=state.get("optim"),
                          meta=_from_json(meta), sharded=sharded)
    model_state = _read_tensors(directory / MODEL_FILE)
    optimizer_state = None
    if OPTIM_JSON_FILE in files or OPTIM_TENSORS_FILE in files:
        tensors = _read_tensors(directory / OPTIM_TENSORS_FILE)
        doc = _read_json(directory / OPTIM_JSON_FILE)
        optimizer_state = _join_optimizer(tensors, doc)
    return Checkpoint(
        model_state=model_state, optimizer_state=optimizer_state, meta=_from_json(meta)
    )


def read_shards(directory: Path) -> dict[str, Any]:
    """A sharded checkpoint's full state, read in this process whatever process group it
    is in (torch's public ``_load_state_dict_from_keys`` coordinates over an initialised
    default group, which the trainer's other ranks are not reading with)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, FileSystemReader(str(directory)), no_dist=True,
                         planner=_EmptyStateDictLoadPlanner())  # type: ignore[no-untyped-call]  # torch: unannotated
    except Exception as exc:  # torch's CheckpointException and the OS errors under it
        raise ConfigError(f"sharded checkpoint {directory} is unreadable: "
                          f"{str(exc).splitlines()[0][:300] if str(exc) else exc!r}") from exc
    return state


def latest_checkpoint(root: Path) -> Path | None:
    """The ``root/step-NNNNNN`` directory with the highest step, or ``None``.

    ``.tmp`` / ``.old`` directories and anything not named ``step-<digits>`` are ignored.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        match = _STEP_RE.match(child.name)
        if match is None or not child.is_dir():
            continue
        step = int(match.group(1))
        if best is None or step > best[0]:
            best = (step, child)
    return None if best is None else best[1]

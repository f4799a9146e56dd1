"""The input checks a run makes before its heavy imports, so a wrong path fails in a second.

A run's full checks (:func:`freshroll.runtime.prepare.check_inputs`) need torch,
transformers and datasets loaded (tokenizers, the prompts rendered against them): seconds
of imports before the first error (issue 48: a missing model path took 34-47 s on a loaded
2-core machine). What needs none of them is checked here first, with the same messages the
full checks give: ``model.path`` is a model directory (``config.json`` with a
``model_type``), and ``task.file`` / ``eval.file`` exist, are readable files or directories,
and, for a JSON-lines file, hold the prompt column in their first row. Nothing here is
skipped later: the full checks run as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from freshroll.config import Config
from freshroll.engines.model_dir import read_config_json
from freshroll.errors import ConfigError
from freshroll.rewards.data import missing_column


def precheck(cfg: Config) -> None:
    """Raise the first input error findable without heavy imports (module doc)."""
    if cfg.model.path is not None:
        read_config_json(Path(cfg.model.path))
    field = cfg.task.prompt_field
    for key, name in (("task.file", cfg.task.file), ("eval.file", cfg.eval.file)):
        if name is not None:
            _prompt_file(key, Path(name), field)


def _prompt_file(key: str, path: Path, field: str) -> None:
    if not path.exists():
        raise ConfigError(f"{key}: prompt file {path} does not exist")
    if path.is_dir() or path.suffix.lower() not in (".jsonl", ".ndjson"):
        return  # a saved dataset, Parquet, CSV, JSON: read by datasets, checked then
    if not path.is_file():
        return  # a FIFO or a device: the full checks refuse it without reading it
    try:
        with path.open(encoding="utf-8") as fh:
            first = next((ln for ln in fh if ln.strip()), None)
        row = json.loads(first) if first is not None else None
    except (OSError, UnicodeDecodeError, ValueError):
        return  # the full checks say what is wrong with it, in their own words
    if isinstance(row, dict) and field not in row:
        raise missing_column(path, field, list(row))


__all__ = ["precheck"]

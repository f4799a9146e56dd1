"""Checks of a user's model directory before a run writes anything (``model.path``).

A model directory must hold what both ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` need; otherwise the first thing a user sees is a long
traceback from deep inside transformers. :func:`check_model_dir` turns each first mistake into
one :class:`~freshroll.errors.ConfigError` naming the directory and what to change:

* no directory, or no ``config.json``, or one that is not JSON, names no ``model_type`` or
  does not load with ``AutoConfig``;
* no tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, or a vocabulary file);
* a ``*.safetensors`` file whose header does not parse (garbage or truncated weights);
* a tokenizer with more tokens than the model's vocabulary (``vocab_size``): ids past the
  embedding would be generated or fed, which fails at the first step or, worse, reads garbage.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
    "spiece.model",
)


def read_config_json(path: Path) -> dict[str, Any]:
    """``config.json`` of ``path`` read as JSON, with no transformers import (checked before
    any heavy import: :mod:`freshroll.runtime.precheck`): a ConfigError naming the file when
    ``path`` is not a model directory."""
    if not path.is_dir():
        raise ConfigError(f"model.path: {path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"model.path: {path} has no config.json (a local transformers "
                          "model directory, as save_pretrained writes it)")
    try:
        data = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model.path: {cfg_file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ConfigError(f"model.path: {cfg_file} has no model_type (not a transformers "
                          "config)")
    return data


def read_model_config(path: Path) -> dict[str, Any]:
    """``config.json`` of ``path`` as a dict, or a ConfigError naming the file."""
    data = read_config_json(path)
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError, ...
        raise ConfigError(f"model.path: {path / 'config.json'} does not load: "
                          f"{exc}"[:500]) from None
    return data


# transformers' loaders patch process-wide state while they build a model (the meta-device
# init contexts swap ``nn.Module.register_parameter`` and the default device), so two threads
# loading at once can hand one of them meta tensors ("Cannot copy out of meta tensor"): seen
# in CI with two inline workers starting together. One load at a time per process.
_LOAD_LOCK = threading.RLock()


def takes_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward (under a PEFT wrapper, its base model's) names
    ``logits_to_keep`` (every causal LM of transformers >= 4.45): the engines project only
    the last position, the learner only the completion positions."""
    import inspect

    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def quiet_transformers() -> None:
    """No download/loading progress bars: our own progress line is the display."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers: unannotated
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated


@contextmanager
def loading_model(root: Path) -> Iterator[None]:
    """Serialise ``from_pretrained`` calls in this process (see ``_LOAD_LOCK``) and report
    their failures (garbage config, weights, tokenizer) as a :class:`ConfigError` naming the
    directory, instead of a transformers traceback."""
    try:
        with _LOAD_LOCK:
            yield
    except ConfigError:
        raise
    except Exception as exc:  # any failure of a third-party loader becomes one line
        raise ConfigError(f"model: cannot load {root}: {type(exc).__name__}: "
                          f"{str(exc).strip()[:300]}") from exc


def check_model_dir(path: Path) -> None:
    """Raise ConfigError naming ``path`` if it cannot serve as a freshroll policy."""
    config = read_model_config(path)
    from safetensors import safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except Exception as exc:  # safetensors raises its own error types
            raise ConfigError(f"model.path: {weights} is not a valid safetensors file: "
                              f"{type(exc).__name__}: {exc}"[:500]) from None
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"model.path: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "save it beside the model with tokenizer.save_pretrained(path)"
        )
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    if not isinstance(vocab, int):
        return  # an architecture that names it differently: transformers will check
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # any failure of a third-party loader becomes one line
        raise ConfigError(f"model.path: the tokenizer in {path} does not load: "
                          f"{type(exc).__name__}: {exc}"[:500]) from None
    if len(tok) > vocab:
        raise ConfigError(
            f"model.path: the tokenizer in {path} has {len(tok)} tokens but the model's "
            f"vocabulary (config.json vocab_size) holds {vocab}: token ids >= {vocab} have no "
            "embedding. Use the tokenizer the model was trained with, or resize the model's "
            "embeddings (model.resize_token_embeddings(len(tokenizer))) and save it again"
        )

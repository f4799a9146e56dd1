"""The embedded default model: a character-level tokenizer and a tiny random Llama, built locally.

freshroll ships no weights and never downloads any. This module builds a small causal LM from a
``transformers`` config and a character tokenizer from the ``tokenizers`` library, and saves them
as an ordinary Hugging Face directory (``config.json``, ``model.safetensors``, ``tokenizer.json``)
so that the default model goes through exactly the loading path users take for their own models
(``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``).

Guarantees:

* The vocabulary is fixed and ordered: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3),
  then :data:`CHARS` in order. ``<unk>`` exists so that text outside the alphabet encodes instead
  of raising.
* Encoding gives exactly one token per character, and **no** ``<bos>``/``<eos>`` is added
  automatically (``add_special_tokens`` has no effect). Decoding concatenates tokens, so
  ``decode(encode(text)) == text`` for any text over :data:`CHARS`.
* :func:`build_tiny` with the same seed and overrides gives bit-identical weights, and
  :func:`model_digest` of such models (or of their saved directories) is identical.
* :func:`save_tiny` and :func:`ensure_tiny` write their directory atomically (temp dir, then
  rename), so a reader never sees a half-written model, also after a kill mid-save.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from freshroll.atomic import replace_dir
from freshroll.errors import ConfigError
from freshroll.ledger.lineage import digest_of

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
CHARS = "0123456789+-*=<>|:, abcdefghijklmnopqrstuvwxyz"
VOCAB: tuple[str, ...] = (*SPECIAL_TOKENS, *CHARS)

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

# Config keys that describe where/how a model was saved, not what it computes.
_VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "_commit_hash")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (see the module docstring for its guarantees)."""
    vocab = {token: i for i, token in enumerate(VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S], not ".", so that a newline is its own (unknown) token rather than dropped.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # concatenate: no spaces between characters
    make: Callable[..., PreTrainedTokenizerFast] = PreTrainedTokenizerFast  # untyped __init__
    return make(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )


def tiny_config(vocab_size: int = len(VOCAB), **overrides: Any) -> LlamaConfig:
    """The tiny Llama config: :data:`TINY_DEFAULTS` updated with ``overrides``."""
    settings = {**TINY_DEFAULTS, **overrides}
    return LlamaConfig(
        vocab_size=vocab_size,
        pad_token_id=VOCAB.index(PAD),
        bos_token_id=VOCAB.index(BOS),
        eos_token_id=VOCAB.index(EOS),
        **settings,
    )


def build_tiny(
    seed: int = 0, **overrides: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A freshly initialised tiny causal LM (eval mode, float32) and its tokenizer.

    The weights depend only on ``seed`` and ``overrides`` (the global torch RNG state is saved and
    restored, so calling this does not disturb the caller's randomness).
    """
    tokenizer = build_tokenizer()
    config = tiny_config(len(tokenizer), **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # unannotated __init__
    torch.nn.Module.eval(model)
    return model, tokenizer


def save_tiny(path: str | os.PathLike[str], seed: int = 0, **overrides: Any) -> Path:
    """Build the tiny model and save it (safetensors) with its tokenizer into ``path``.

    Atomic (see :func:`save_model_dir`): a kill mid-save never leaves a half-written ``path``.
    """
    model, tokenizer = build_tiny(seed, **overrides)
    return save_model_dir(model, tokenizer, path)


def save_model_dir(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: str | os.PathLike[str]
) -> Path:
    """``save_pretrained`` of ``model`` and ``tokenizer`` into ``path``, atomically.

    Everything is written into ``<path>.tmp`` beside it (a stale one, left by a kill, is
    removed first), fsynced, and renamed into place; an existing ``path`` is moved aside
    first and deleted after the swap. A reader sees no ``path``, the old one or the new one.
    """
    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return replace_dir(Path(path), fill, crash_point="model")


def ensure_tiny(cache_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """``cache_dir/tiny-<seed>``, built and saved on first use and reused afterwards.

    The directory is written under a temporary name in ``cache_dir`` and renamed into place, so
    concurrent callers either see the finished directory or build their own copy; a loser of the
    rename race discards its copy and uses the winner's.
    """
    root = Path(cache_dir)
    final = root / f"tiny-{seed}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{seed}-", dir=root))
    try:
        save_tiny(tmp, seed)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def model_digest(path_or_model: str | os.PathLike[str] | PreTrainedModel) -> str:
    """A stable hex digest of a model's config and weights.

    Accepts an in-memory model or a saved directory; a model and its ``save_pretrained`` output
    have the same digest. The config part is the canonical JSON of ``config.to_dict()`` without
    keys that only describe provenance (path, transformers version); the weights part hashes every
    stored tensor (tied aliases such as ``lm_head.weight`` once, as safetensors stores them) in
    sorted name order by name, dtype, shape and raw bytes.
    """
    if isinstance(path_or_model, PreTrainedModel):
        config = _model_config_dict(path_or_model)
        tensors = _model_tensors(path_or_model)
    else:
        path = Path(path_or_model)
        if not (path / "config.json").is_file():
            raise ConfigError(f"model path {str(path)!r} has no config.json")
        config = _canonical_config(
            AutoConfig.from_pretrained(path, local_files_only=True).to_dict()
        )
        tensors = _file_tensors(path)
    parts = [_tensor_digest(name, t) for name, t in tensors]
    if not parts:
        raise ConfigError(f"model {path_or_model!r} has no weights to digest")
    return digest_of(json.dumps(config, sort_keys=True, separators=(",", ":"), default=str), *parts)


def _canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _VOLATILE_CONFIG_KEYS}


def _model_config_dict(model: PreTrainedModel) -> dict[str, Any]:
    """The config as ``save_pretrained`` would write it (it fills architectures and dtype)."""
    config = model.config.to_dict()
    if not config.get("architectures"):
        config["architectures"] = [type(model).__name__]
    if config.get("dtype") is None:
        config["dtype"] = str(model.dtype).removeprefix("torch.")
    return _canonical_config(config)


def _model_tensors(model: PreTrainedModel) -> Iterable[tuple[str, torch.Tensor]]:
    """The state dict minus tied aliases (which ``save_pretrained`` does not store)."""
    state = model.state_dict()
    # transformers 5: {target: source}; 4.x: [target, ...] on ``_tied_weights_keys``.
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(
        model, "_tied_weights_keys", None
    ) or ()
    for target in list(tied):
        ptr = state[target].data_ptr() if target in state else None
        if ptr is not None and any(
            n != target and t.data_ptr() == ptr for n, t in state.items()
        ):
            del state[target]
    return sorted(state.items())


def _file_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model path {str(path)!r} has no *.safetensors weights")
    with ExitStack() as stack:
        where: dict[str, Any] = {}
        for file in files:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
            where.update((name, handle) for name in handle.keys())  # noqa: SIM118
        for name in sorted(where):
            yield name, where[name].get_tensor(name)


def _tensor_digest(name: str, tensor: torch.Tensor) -> str:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes()
    shape = ",".join(str(d) for d in tensor.shape)
    return digest_of(name, str(tensor.dtype), shape, raw)

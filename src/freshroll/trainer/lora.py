"""``trainer.lora``: the learner's model as a peft LoRA model, and what it publishes.

:func:`wrap` puts LoRA adapters (peft ``LoraConfig``: ``r``, ``lora_alpha``,
``lora_dropout``, ``target_modules``, which may be peft's ``"all-linear"``) on the model
and freezes everything else, so the optimizer holds the adapters alone. The adapters'
initial ``A`` comes from a fixed seed (peft draws it from torch's global generator): a
learner rebuilt for ``--resume`` or ``export-model`` starts from the same adapters, so
replayed steps give the committed digests.

:func:`adapter_state` is the per-version publication (the format of
:mod:`freshroll.engines.lora_merge`); :func:`checkpoint_state` the adapters' tensors a
checkpoint stores (the base weights are the initial model's, never trained);
:func:`load_checkpoint_state` puts them back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from freshroll.config.train import ALL_LINEAR, LoraSection
from freshroll.engines.lora_merge import PREFIX, SCALE_KEY
from freshroll.errors import ConfigError

#: the seed of the adapters' initial A (B starts at zero: the initial policy is the base)
INIT_SEED = 0
_ADAPTER = "default"


def is_lora(model: torch.nn.Module) -> bool:
    """True for a model :func:`wrap` made (a peft model)."""
    return hasattr(model, "peft_config")


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last name parts of the model's linear layers (target candidates)."""
    return sorted({n.rpartition(".")[2] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n})


def targets(cfg: LoraSection) -> list[str] | str:
    """``target_modules`` as peft's ``LoraConfig`` takes it (``"all-linear"``: peft puts an
    adapter on every linear layer but the output head)."""
    return cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)


def check_targets(model: torch.nn.Module, cfg: LoraSection) -> None:
    """Every ``target_modules`` entry must name (or end) some linear layer's name;
    ``all-linear`` needs a linear layer besides the output head."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n]
    if cfg.target_modules == ALL_LINEAR:
        head = getattr(model, "get_output_embeddings", lambda: None)()
        if not any(m is not head for _, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear)):
            raise ConfigError("trainer.lora.target_modules: all-linear: the model has no "
                              "linear layer besides its output head")
        return
    missing = [t for t in cfg.target_modules
               if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise ConfigError(
            f"trainer.lora.target_modules: {', '.join(map(repr, missing))} "
            f"match{'es' if len(missing) == 1 else ''} no linear layer of the model; its "
            f"linear layers: {', '.join(linear_names(model))}")


def check_on_skeleton(model_config: Any, cfg: LoraSection) -> None:
    """``cfg`` put on the model's skeleton (built from its config on the meta device: no
    weights read, nothing allocated), as :func:`wrap` puts it on the learner's model: a
    target that matches nothing, or anything else peft refuses, is a
    :class:`~freshroll.errors.ConfigError` naming ``trainer.lora`` before the run directory
    is written (found at the learner's build, it left a directory that could neither be
    re-run nor resumed)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(model_config)  # type: ignore[no-untyped-call]  # transformers: unannotated
    except Exception:  # the model's own checks report an unloadable config elsewhere
        return
    check_targets(skeleton, cfg)
    try:
        get_peft_model(skeleton, LoraConfig(
            r=cfg.r, lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # a float works
            lora_dropout=cfg.dropout, target_modules=targets(cfg), bias="none",
            task_type="CAUSAL_LM"))
    except Exception as exc:  # peft raises ValueError, TypeError, its own errors...
        raise ConfigError(f"trainer.lora: {type(exc).__name__}: {exc}"[:500]) from None


def wrap(model: torch.nn.Module, cfg: LoraSection) -> torch.nn.Module:
    """``model`` with LoRA adapters on ``cfg.target_modules``; only they are trainable."""
    from peft import LoraConfig, get_peft_model

    check_targets(model, cfg)
    config = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # a float works
                        lora_dropout=cfg.dropout, target_modules=targets(cfg), bias="none",
                        task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        peft_model: torch.nn.Module = get_peft_model(model, config)
    return peft_model


def _lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    inner: torch.nn.Module = model.base_model.model  # type: ignore[union-attr, assignment]  # peft: a Module at run time
    return [(n, m) for n, m in inner.named_modules()
            if isinstance(m, LoraLayer) and _ADAPTER in m.lora_A]


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters as a publication (detached views, not copies)."""
    out: dict[str, torch.Tensor] = {}
    scale = None
    for name, layer in _lora_layers(model):
        out[f"{PREFIX}{name}.A"] = layer.lora_A[_ADAPTER].weight.detach()
        out[f"{PREFIX}{name}.B"] = layer.lora_B[_ADAPTER].weight.detach()
        scale = float(layer.scaling[_ADAPTER])
    out[SCALE_KEY] = torch.tensor([1.0 if scale is None else scale], dtype=torch.float32)
    return out


def checkpoint_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable (adapter) tensors of the model's state dict, by their own keys."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k in trainable}


def load_checkpoint_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Put a :func:`checkpoint_state` back; every adapter tensor must be in it."""
    want = {n for n, p in model.named_parameters() if p.requires_grad}
    extra, missing = set(state) - want, want - set(state)
    if extra or missing:
        raise ValueError(f"the checkpoint's adapter does not fit trainer.lora (missing "
                         f"{sorted(missing)[:3]}, unexpected {sorted(extra)[:3]})")
    model.load_state_dict(dict(state), strict=False)


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapters merged in (the model itself is left as it is)."""
    out: torch.nn.Module = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]  # peft's method, typed as nn.Module
    return out

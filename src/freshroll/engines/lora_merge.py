"""The adapter publication of a LoRA run (``trainer.lora``), and its merge on the worker side.

A LoRA trainer publishes, each version, only its adapters: one flat dict of tensors, so it
travels through every transport a full state dict does (a copy inline, a shared-memory slot,
a Ray object) unchanged::

    "lora::scale"                            float32 [1]: alpha / r
    "lora::model.layers.0.self_attn.q_proj.A" [r, in]
    "lora::model.layers.0.self_attn.q_proj.B" [out, r]
    ...

The module names are the plain model's (``<name>.weight`` is the weight the adapter
updates); the ``lora::`` prefix cannot clash with a model's state-dict key. A worker keeps
its own copy of each target module's base weight ``W0`` (taken at the first adapter load:
the initial model's, which a LoRA run never trains) and installs ``W = W0 + scale * B @ A``
(computed in float32, stored in the weight's dtype): what peft's ``merge_and_unload`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

PREFIX = "lora::"
SCALE_KEY = PREFIX + "scale"


def is_adapter(weights: Mapping[str, torch.Tensor]) -> bool:
    """True for an adapter publication (it holds :data:`SCALE_KEY`)."""
    return SCALE_KEY in weights


def adapter_modules(adapter: Mapping[str, torch.Tensor]) -> list[str]:
    """The plain-model names of the modules an adapter publication updates, sorted."""
    return sorted(k[len(PREFIX):-2] for k in adapter if k.startswith(PREFIX) and k.endswith(".A"))


def adapter_bytes(weights: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a publication's tensors (what moves to the workers per version)."""
    return sum(t.numel() * t.element_size() for t in weights.values())


def delta(adapter: Mapping[str, torch.Tensor], module: str) -> torch.Tensor:
    """``scale * B @ A`` of ``module``, in float32 on the adapter's device."""
    a = adapter[f"{PREFIX}{module}.A"].float()
    b = adapter[f"{PREFIX}{module}.B"].float()
    return float(adapter[SCALE_KEY].reshape(-1)[0]) * (b @ a)


def merged(base: torch.Tensor, adapter: Mapping[str, torch.Tensor], module: str) -> torch.Tensor:
    """``base + scale * B @ A`` in ``base``'s dtype and device."""
    d = delta(adapter, module).to(base.device)
    return (base.float() + d).to(base.dtype)


class AdapterMerger:
    """Installs adapter publications into a model in place, keeping each target's base."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}  # weight key -> W0 (a copy)

    def reset(self) -> None:
        """Forget the base weights (a full state dict was loaded: it is the new base)."""
        self.base.clear()

    def apply(self, model: torch.nn.Module, adapter: Mapping[str, torch.Tensor]) -> None:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for module in adapter_modules(adapter):
                key = f"{module}.weight"
                param = params.get(key)
                if param is None:
                    raise ValueError(f"the adapter updates {key}, which the model lacks")
                base = self.base.get(key)
                if base is None:
                    base = self.base[key] = param.detach().clone()
                param.copy_(merged(base, adapter, module))


def merge_state(base: Mapping[str, torch.Tensor],
                adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict: ``base`` with every adapter target merged (vLLM's reload)."""
    out = dict(base)
    for module in adapter_modules(adapter):
        key = f"{module}.weight"
        if key not in out:
            raise ValueError(f"the adapter updates {key}, which the model lacks")
        out[key] = merged(out[key], adapter, module)
    return out

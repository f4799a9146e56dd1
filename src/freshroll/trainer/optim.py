"""The optimizer's kernel and the finiteness check of a step (the learner's, trainer/grpo.py).

:func:`use_kernel` puts ``trainer.optim``'s AdamW kernel in force on an optimizer (again after
a loaded state brought another's); :func:`all_finite` says whether tensors are all finite in
one fused pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def use_kernel(optimizer: torch.optim.Optimizer, optim: str) -> None:
    """Run ``optimizer``'s next steps on ``optim``'s kernel (``trainer.optim``): fused, or
    torch's per-parameter loop. A loaded optimizer state brings the kernel of the run that
    saved it in its param groups: a learner sets its own again after loading one."""
    for group in optimizer.param_groups:
        group["fused"] = True if optim == "adamw_torch_fused" else None


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite, in one pass and one host sync.

    The L2 norm of each tensor (``torch._foreach_norm``: one fused kernel, where the max-abs
    norm has none on CPU: CHANGELOG.md, 2026-12-06, fifth session) is NaN or inf when any
    element is; a finite norm proves its tensor finite. A non-finite norm can also be the
    overflow of a sum of large finite squares, so those tensors alone are then checked element
    by element: the answer is exact either way."""
    ts = [t.detach() for t in tensors if t.numel()]
    if not ts:
        return True
    finite = torch.isfinite(torch.stack(torch._foreach_norm(ts)))
    if bool(finite.all()):
        return True
    return all(bool(torch.isfinite(ts[i]).all()) for i in (~finite).nonzero().flatten().tolist())


__all__ = ["all_finite", "use_kernel"]

"""freshroll: fast and trustworthy asynchronous rollouts for RL post-training.

``from freshroll import GRPOTrainer`` is the Python API (:mod:`freshroll.api`).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["GRPOTrainer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":  # imported on first use: ``import freshroll.x`` stays light
        from freshroll.api import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'freshroll' has no attribute {name!r}")

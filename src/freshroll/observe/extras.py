"""Optional extras: a module a config option needs, or one error naming the option.

``monitor.tensorboard`` needs the ``tensorboard`` package and ``monitor.wandb_project`` the
``wandb`` package; neither is a dependency of freshroll. :func:`require` imports such a
module, and when it is missing raises the one :class:`~freshroll.errors.ConfigError` that
names the option and the pip extra installing it (``pip install 'freshroll[wandb]'``).
``config check`` and a run's checks call it before anything is written.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from freshroll.errors import ConfigError


def require(module: str, key: str, extra: str) -> ModuleType:
    """``import module``, or the ConfigError naming ``key`` and the extra ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{key}: needs the {extra!r} package, which is not installed "
                          f"({exc}); install it with pip install 'freshroll[{extra}]', "
                          "or unset the option") from None


__all__ = ["require"]

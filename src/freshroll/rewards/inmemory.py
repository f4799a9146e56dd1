"""Reward functions given as Python objects (the Python API's ``reward_funcs``).

A config names each reward by a reference a fresh process can resolve: a built-in name,
``module:function`` or ``path/to/file.py:function``. A function the API is given is
recorded by such a reference whenever it has one (:func:`reference_of`: defined at the top
level of an importable module or of a reward file; a top-level module that no installed
package provides, such as a ``rewards.py`` beside the script, by its file's absolute path, so
that ``freshroll run --resume`` finds it from any directory); one defined in a notebook or script
(``__main__``), a lambda or a closure has none, and is recorded as ``python:<name>``,
resolved from this process's registry (:func:`register`, :func:`resolve`).

A ``python:`` reward lives only in the process that registered it: a run with one resumes
through the API given the same ``reward_funcs``, and cannot score on Ray reward actors
(``ray.reward_actors`` > 0 is refused). Its code still enters the reward version (its
digest, as every reward's), so a resume with changed code is seen in the ledger.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from freshroll.errors import ConfigError

PREFIX: Final = "python:"
#: the module names freshroll gives reward files it loads (scoring._file_module_name)
FILE_MODULE_PREFIX: Final = "freshroll_user_reward_"

_REGISTRY: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def name_of(fn: Callable[..., Any]) -> str:
    """A reward name for ``fn`` (``[A-Za-z0-9_.-]+``): its ``__name__`` (a callable
    object's class name), other characters dropped (a lambda is ``lambda``)."""
    raw = getattr(fn, "__name__", None) or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_.\-]", "", str(raw)) or "reward"


def reference_of(fn: Callable[..., Any]) -> str | None:
    """A reference that resolves to ``fn`` itself in a fresh process, or None."""
    module_name = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        return None
    if module_name == "__main__" or "<" in qualname or "." in qualname:
        return None  # a script's or notebook's, a lambda, a closure or a method
    module = sys.modules.get(module_name)
    if module is None or getattr(module, qualname, None) is not fn:
        return None
    if module_name.startswith(FILE_MODULE_PREFIX):
        path = getattr(module, "__file__", None)
        return f"{path}:{qualname}" if isinstance(path, str) else None
    local = _local_file(module_name, module)
    if local is not None:  # found on this process's path only: by its file (module doc)
        return f"{local}:{qualname}"
    try:
        if getattr(importlib.import_module(module_name), qualname, None) is not fn:
            return None
    except Exception:
        return None
    return f"{module_name}:{qualname}"


def _local_file(module_name: str, module: Any) -> str | None:
    """The absolute path of a top-level module that no installed distribution provides (a
    ``rewards.py`` beside the script or in the working directory), else None: a reference
    ``rewards:f`` resolves only from that directory, so ``freshroll run --resume`` started
    elsewhere would not find it; its file's path resolves from anywhere."""
    path = getattr(module, "__file__", None)
    if "." in module_name or not isinstance(path, str) or not path.endswith(".py") \
            or module_name in _installed_top_levels():
        return None
    return str(Path(path).resolve())


@functools.cache
def _installed_top_levels() -> frozenset[str]:
    """The top-level import names installed distributions provide (editable ones included),
    and the standard library's."""
    names = set(importlib.metadata.packages_distributions())
    return frozenset(names | set(sys.stdlib_module_names))


def register(fn: Callable[..., Any], name: str | None = None) -> str:
    """``fn``'s reference: its own when it has one, else ``python:<name>`` registered in
    this process (a later function under the same name replaces it: a notebook's cell run
    again)."""
    if not callable(fn):
        raise ConfigError(f"reward_funcs: {fn!r} is not callable (a function, a reference "
                          "string such as 'my_rewards.py:f', or a built-in name)")
    ref = reference_of(fn)
    if ref is not None:
        return ref
    ref = f"{PREFIX}{name or name_of(fn)}"
    with _LOCK:
        _REGISTRY[ref] = fn
    return ref


def resolve(ref: str) -> Callable[..., Any]:
    """The function registered as ``ref``; a ConfigError saying how to give it again."""
    with _LOCK:
        fn = _REGISTRY.get(ref)
    if fn is None:
        raise ConfigError(
            f"reward {ref!r} was a Python function given to freshroll.GRPOTrainer "
            "(reward_funcs) and exists only in that process: run or resume it from Python "
            "with the same reward_funcs, or name it by a reference a config can hold "
            f"('my_rewards.py:{ref.removeprefix(PREFIX)}' or 'package.module:function')")
    return fn


def is_in_memory(ref: Any) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)

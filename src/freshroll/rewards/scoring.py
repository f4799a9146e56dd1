"""Combine, version and safely evaluate reward functions.

Guarantees:

* :meth:`RewardSet.score` never raises because of a user's reward function. A
  function that raises, returns a non-list, the wrong number of values or a
  non-numeric value fails every sample of that call; a ``None``/NaN/inf entry
  fails only its own sample. A failed sample gets ``Score(None, "reward_error:
  ...", {})`` naming the reward (and the index for per-sample failures).
* A successful sample's value is ``sum(weight * raw)`` over all rewards, and
  ``components`` holds each reward's raw (unweighted) value by name.
* :attr:`RewardSet.version` depends only on each reward's name, code digest,
  config and weight; it is independent of spec order, so two identical sets
  built anywhere get the same version.
* Reward references that cannot be loaded and bad entries raise
  :class:`~freshroll.errors.ConfigError` naming the reference or the field.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from freshroll.errors import ConfigError, Interrupted
from freshroll.lineage import RewardVersion, digest_of
from freshroll.rewards.functions import REWARDS

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_MAX_MSG = 300  # characters of an exception message kept in a reward error
_ENTRY_KEYS = frozenset({"fn", "weight", "name"})


@dataclass(frozen=True)
class RewardSpec:
    """One reward in a set. ``config`` is recorded in the version, not passed to ``fn``."""

    name: str
    fn: Callable[..., list[float]]
    weight: float = 1.0
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"reward name {self.name!r} must match [A-Za-z0-9_.-]+")
        if not _is_number(self.weight) or not math.isfinite(self.weight):
            raise ConfigError(f"reward {self.name!r}: weight must be a finite number")
        if not callable(self.fn):
            raise ConfigError(f"reward {self.name!r}: fn must be callable")


@dataclass(frozen=True, slots=True)
class Score:
    """The reward of one sample; ``value is None`` means discard it (see ``error``)."""

    value: float | None
    error: str | None
    components: Mapping[str, float]


class RewardSet:
    """A weighted sum of reward functions with one :class:`RewardVersion`."""

    def __init__(self, specs: Sequence[RewardSpec]) -> None:
        if not specs:
            raise ConfigError("rewards: at least one reward is required")
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"rewards: duplicate reward names {dupes}; set 'name' to tell apart")
        self.specs: tuple[RewardSpec, ...] = tuple(specs)
        self.version: RewardVersion = _combined_version(self.specs)

    def score(
        self, prompts: Sequence[str], completions: Sequence[Any], **kwargs: Sequence[Any]
    ) -> list[Score]:
        """One :class:`Score` per completion; see the module docstring for failures."""
        n = _check_lengths(prompts, completions, kwargs)
        raws: dict[str, list[float | None]] = {}
        errors: list[list[str]] = [[] for _ in range(n)]
        for spec in self.specs:
            raws[spec.name] = _call(spec, n, errors, prompts, completions, kwargs)
        return [self._combine(i, raws, errors[i]) for i in range(n)]

    def _combine(
        self, i: int, raws: Mapping[str, list[float | None]], errors: list[str]
    ) -> Score:
        if errors:
            return Score(None, "reward_error: " + "; ".join(errors), {})
        components = {name: v for name, values in raws.items() if (v := values[i]) is not None}
        total = sum(s.weight * components[s.name] for s in self.specs)
        if not math.isfinite(total):
            return Score(None, f"reward_error: weighted total {total} is not finite", {})
        return Score(total, None, components)


def _combined_version(specs: Sequence[RewardSpec]) -> RewardVersion:
    parts = sorted(
        f"{RewardVersion.of(s.name, s.fn, dict(s.config))}|{float(s.weight)!r}" for s in specs
    )
    name = specs[0].name if len(specs) == 1 else "combined"
    return RewardVersion(name, digest_of("reward-set", *parts))


def _check_lengths(
    prompts: Sequence[Any], completions: Sequence[Any], kwargs: Mapping[str, Sequence[Any]]
) -> int:
    n = len(completions)
    for what, values in [("prompts", prompts), *kwargs.items()]:
        if len(values) != n:
            raise ValueError(f"{what} has {len(values)} entries for {n} completions")
    return n


def _call(
    spec: RewardSpec,
    n: int,
    errors: list[list[str]],
    prompts: Sequence[str],
    completions: Sequence[Any],
    kwargs: Mapping[str, Sequence[Any]],
) -> list[float | None]:
    """Call one reward fn; record failures in ``errors``; return its per-sample values."""
    try:
        out = spec.fn(list(prompts), list(completions), **{k: list(v) for k, v in kwargs.items()})
    except KeyboardInterrupt as exc:  # not a failure of this sample: the run stops (resumable)
        raise Interrupted(f"reward {spec.name} raised KeyboardInterrupt") from exc
    except (Exception, SystemExit) as exc:  # the user's code: anything may go wrong
        return _fail_all(errors, f"{spec.name} raised {type(exc).__name__}: {_short(exc)}")
    problem = _shape_problem(out, n)
    if problem:
        return _fail_all(errors, f"{spec.name} {problem}")
    values: list[float | None] = []
    for i, v in enumerate(out):
        if v is None or not math.isfinite(v):
            errors[i].append(f"{spec.name} returned {v!r} at index {i}")
            values.append(None)
        else:
            values.append(float(v))
    return values


def _shape_problem(out: Any, n: int) -> str | None:
    if not isinstance(out, list | tuple):
        return f"returned {type(out).__name__}, expected a list of {n} floats"
    if len(out) != n:
        return f"returned {len(out)} values for {n} completions"
    for i, v in enumerate(out):
        if v is not None and not _is_number(v):
            return f"returned non-numeric {type(v).__name__} {_short(v)} at index {i}"
    return None


def _fail_all(errors: list[list[str]], message: str) -> list[float | None]:
    for sample_errors in errors:
        sample_errors.append(message)
    return [None] * len(errors)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real)


def _short(obj: Any) -> str:
    text = str(obj)
    return text if len(text) <= _MAX_MSG else text[:_MAX_MSG] + "..."


# --- loading user rewards ----------------------------------------------------------------


def load_reward_fn(ref: str) -> Callable[..., list[float]]:
    """A built-in reward name, ``"module.path:function"`` or ``"path/to/file.py:function"``."""
    if ref in REWARDS:
        return REWARDS[ref]
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(
            f"reward {ref!r}: expected a built-in name ({', '.join(sorted(REWARDS))}), "
            "'module.path:function' or 'path/to/file.py:function'"
        )
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _load_file(ref, Path(target)) if is_file else _import(ref, target)
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"reward {ref!r}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"reward {ref!r}: {attr!r} is not callable")
    return fn  # type: ignore[no-any-return]


def _import(ref: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"reward {ref!r}: cannot import {module_name!r} ({exc})") from exc


def _load_file(ref: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise ConfigError(f"reward {ref!r}: file {path} does not exist")
    module_name = f"freshroll_user_reward_{digest_of(str(path.resolve()))[:16]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"reward {ref!r}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so pickling and dataclasses in the file work
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(f"reward {ref!r}: {path} failed to load ({exc!r})") from exc
    return module


def build_reward_set(entries: Sequence[Mapping[str, Any]]) -> RewardSet:
    """A :class:`RewardSet` from config entries ``{"fn": ref, "weight": 1.0, "name": ...}``."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ConfigError("rewards: expected a list of {fn, weight, name} entries")
    return RewardSet([_entry_spec(i, entry) for i, entry in enumerate(entries)])


def _entry_spec(i: int, entry: Mapping[str, Any]) -> RewardSpec:
    where = f"rewards[{i}]"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'fn', got {entry!r}")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {sorted(_ENTRY_KEYS)}")
    ref = entry.get("fn")
    if not isinstance(ref, str):
        raise ConfigError(f"{where}.fn: expected a reward reference string, got {ref!r}")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not _is_number(weight) or not math.isfinite(weight):
        raise ConfigError(f"{where}.weight: expected a finite number, got {weight!r}")
    name = entry.get("name", ref if ref in REWARDS else ref.rpartition(":")[2])
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.name: {name!r} must match [A-Za-z0-9_.-]+")
    try:
        fn = load_reward_fn(ref)
    except ConfigError as exc:
        raise ConfigError(f"{where}.fn: {exc}") from exc
    return RewardSpec(name, fn, float(weight))

"""Combine, version and safely evaluate reward functions, with TRL's semantics.

Each reward is called as TRL's ``GRPOTrainer`` calls it (see
:mod:`freshroll.rewards.calling`). Per sample, with ``r_f`` the raw value of reward
``f`` and ``w_f`` its weight::

    value = sum(w_f * r_f  for f whose r_f is not None/NaN)        (TRL: nansum)

Guarantees:

* :meth:`RewardSet.score` never raises because of a user's reward function. A
  function that raises (``sys.exit`` and ``os._exit`` too: :mod:`.exit_guard`), returns a
  non-list, the wrong number of values or a
  non-numeric value fails every sample of that call; an infinite entry fails
  only its own sample. A failed sample gets ``Score(None, "reward_error: ...", {})``
  naming the reward (and the index for per-sample failures); for a missing
  column the message names the columns asked for and the columns the dataset has.
* ``None`` (or NaN) from a reward means "not applicable to this sample", as in TRL:
  it is left out of the sum and of ``components``. A sample for which *every*
  reward returned None is unscorable: TRL keeps it with zero advantage, freshroll
  discards it (``Score(None, "reward_error: no reward applies to this sample ...")``),
  which likewise leaves it out of its group's baseline and of the update.
* ``components`` holds each applicable reward's raw (unweighted) value by name;
  ``extras`` the values a reward gave ``log_extra`` for that sample; ``logged`` the values
  the rewards gave ``log_metric`` during the call that scored it (the ledger keeps all
  three with the sample's ``rewarded`` event: per-reward figures are read from there).
* :attr:`RewardSet.version` depends only on each reward's name, code digest,
  config (a factory's digest and arguments; a callable object's JSON-plain
  attributes) and weight; it is independent of spec
  order, so two identical sets built anywhere get the same version.
* Reward references that cannot be loaded and bad entries raise
  :class:`~freshroll.errors.ConfigError` naming the reference or the field.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import re
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from freshroll.errors import ConfigError, Interrupted
from freshroll.ledger.lineage import RewardVersion, digest_callable, digest_of
from freshroll.rewards import inmemory
from freshroll.rewards.calling import (
    RESERVED,
    STANDARD,
    RewardState,
    Signature,
    explain,
    reward_columns,
    select,
    signature_of,
    trl_completions,
)
from freshroll.rewards.exit_guard import guarded
from freshroll.rewards.functions import REWARDS
from freshroll.rewards.importing import ImportTimeout, bounded
from freshroll.rewards.tasks import Prompt

#: the largest float32: a total beyond it is finite here but infinite in the trainer's loss
FLOAT32_MAX = 3.4028234663852886e38
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_MAX_MSG = 300  # characters of an exception message kept in a reward error
_ENTRY_KEYS = frozenset({"fn", "weight", "name", "args"})


@dataclass(frozen=True)
class RewardSpec:
    """One reward in a set. ``config`` is recorded in the version, not passed to ``fn``."""

    name: str
    fn: Callable[..., list[float]]
    weight: float = 1.0
    config: Mapping[str, Any] = field(default_factory=dict)
    signature: Signature = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"reward name {self.name!r} must match [A-Za-z0-9_.-]+")
        if not _is_number(self.weight) or not math.isfinite(self.weight):
            raise ConfigError(f"reward {self.name!r}: weight must be a finite number")
        if not callable(self.fn):
            raise ConfigError(f"reward {self.name!r}: fn must be callable")
        sig = signature_of(self.fn)
        if sig.looks_like_factory:
            raise ConfigError(
                f"reward {self.name!r}: {getattr(self.fn, '__name__', self.fn)!r} takes "
                f"({', '.join(sorted(sig.accepts or ()))}), none of TRL's reward arguments "
                f"({', '.join(STANDARD)}, **kwargs); if it is a reward factory such as "
                "trl.rewards:get_soft_overlong_punishment, give its arguments: "
                "{fn: ..., args: {...}}"
            )
        object.__setattr__(self, "signature", sig)


@dataclass(frozen=True, slots=True)
class Score:
    """The reward of one sample; ``value is None`` means discard it (see ``error``)."""

    value: float | None
    error: str | None
    components: Mapping[str, float]
    extras: Mapping[str, Any] = field(default_factory=dict)
    logged: Mapping[str, float] = field(default_factory=dict)


class RewardSet:
    """A weighted sum of reward functions with one :class:`RewardVersion`.

    ``logged_metrics`` holds the last value each reward gave ``log_metric`` per name.
    """

    def __init__(self, specs: Sequence[RewardSpec]) -> None:
        if not specs:
            raise ConfigError("rewards: at least one reward is required")
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"rewards: duplicate reward names {dupes}; set 'name' to tell apart")
        self.specs: tuple[RewardSpec, ...] = tuple(specs)
        self.version: RewardVersion = _combined_version(self.specs)
        self.logged_metrics: dict[str, float] = {}

    def check_columns(self, columns: Collection[str]) -> None:
        """Refuse, before a run starts, columns the rewards need but the dataset lacks."""
        have = sorted(columns)
        clash = sorted(RESERVED & set(columns))
        if clash:
            raise ConfigError(
                f"dataset column(s) {clash} clash with the keywords rewards are called with "
                f"({', '.join(sorted(RESERVED))}); rename them"
            )
        for spec in self.specs:
            missing = sorted(spec.signature.needed_columns - set(columns))
            if missing:
                hint = " (or set task.answer_field to the column)" if "answer" in missing else ""
                raise ConfigError(
                    f"reward {spec.name!r} needs dataset column(s) {missing}, which the "
                    f"dataset does not have; its columns: {have}{hint}"
                )

    def score_prompts(
        self,
        prompts: Sequence[Prompt],
        texts: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        trainer_state: RewardState | None = None,
    ) -> list[Score]:
        """Score completions of ``prompts`` (one each), passing every dataset column."""
        return self.score(
            [p.reward_prompt() for p in prompts], trl_completions(prompts, texts),
            [list(ids) for ids in completion_ids], trainer_state, **reward_columns(prompts),
        )

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: RewardState | None = None,
        **columns: Sequence[Any],
    ) -> list[Score]:
        """One :class:`Score` per completion; see the module docstring for failures."""
        n = _check_lengths(prompts, completions, completion_ids, columns)
        extras: dict[str, list[Any]] = {}
        logged: dict[str, float] = {}

        def log_extra(column: str, values: Sequence[Any]) -> None:
            if len(values) == n:
                extras[str(column)] = list(values)

        def log_metric(name: str, value: float) -> None:
            self.logged_metrics[str(name)] = logged[str(name)] = float(value)

        kwargs: dict[str, Any] = {
            "prompts": list(prompts), "completions": list(completions),
            "completion_ids": None if completion_ids is None else [list(c) for c in completion_ids],
            **{k: list(v) for k, v in columns.items()},
            "trainer_state": trainer_state, "log_extra": log_extra, "log_metric": log_metric,
        }
        conversational = bool(completions) and not isinstance(completions[0], str)
        raws: dict[str, list[float | None]] = {}
        errors: list[list[str]] = [[] for _ in range(n)]
        for spec in self.specs:
            raws[spec.name] = _call(spec, n, errors, kwargs, list(columns), conversational)
        scores = [self._combine(i, raws, errors[i], extras) for i in range(n)]
        finite = {k: v for k, v in logged.items() if math.isfinite(v)}
        return [replace(sc, logged=finite) if sc.value is not None and finite else sc
                for sc in scores]

    def _combine(
        self,
        i: int,
        raws: Mapping[str, list[float | None]],
        errors: list[str],
        extras: Mapping[str, list[Any]],
    ) -> Score:
        if errors:
            return Score(None, "reward_error: " + "; ".join(errors), {})
        components = {name: v for name, values in raws.items() if (v := values[i]) is not None}
        if not components:
            return Score(None, "reward_error: no reward applies to this sample (every reward "
                         f"returned None or nan): {', '.join(raws)}", {})
        total = sum(s.weight * components[s.name] for s in self.specs if s.name in components)
        if not math.isfinite(total) or abs(total) > FLOAT32_MAX:
            return Score(None, f"reward_error: weighted total {total!r} is not finite in "
                         "float32 (the trainer's precision)", {})
        return Score(total, None, components, {k: v[i] for k, v in extras.items()})


def _combined_version(specs: Sequence[RewardSpec]) -> RewardVersion:
    parts = sorted(
        f"{RewardVersion.of(s.name, s.fn, dict(s.config))}|{float(s.weight)!r}" for s in specs
    )
    name = specs[0].name if len(specs) == 1 else "combined"
    return RewardVersion(name, digest_of("reward-set", *parts))


def _check_lengths(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Any] | None,
    columns: Mapping[str, Sequence[Any]],
) -> int:
    n = len(completions)
    clash = sorted(RESERVED & set(columns))
    if clash:
        raise ValueError(f"columns {clash} clash with reward keywords")
    ids = [] if completion_ids is None else [("completion_ids", completion_ids)]
    for what, values in [("prompts", prompts), *ids, *columns.items()]:
        if len(values) != n:
            raise ValueError(f"{what} has {len(values)} entries for {n} completions")
    return n


def _call(
    spec: RewardSpec,
    n: int,
    errors: list[list[str]],
    kwargs: Mapping[str, Any],
    columns: Collection[str],
    conversational: bool,
) -> list[float | None]:
    """Call one reward fn; record failures in ``errors``; return its per-sample values.

    None and NaN come back as None (not applicable); inf fails its sample.
    """
    try:
        with guarded():  # os._exit in the reward: a failure of this call, not the run's end
            out = spec.fn(**select(kwargs, spec.signature))
            if inspect.isawaitable(out):  # an async reward (TRL gathers them; here: one by one)
                out = asyncio.run(_awaited(out))
    except KeyboardInterrupt as exc:  # not a failure of this sample: the run stops (resumable)
        raise Interrupted(f"reward {spec.name} raised KeyboardInterrupt") from exc
    except (Exception, SystemExit) as exc:  # the user's code: anything may go wrong
        hint = explain(exc, columns, conversational)
        return _fail_all(errors, f"{spec.name} raised {type(exc).__name__}: {_short(exc)}{hint}")
    problem = _shape_problem(out, n)
    if problem:
        return _fail_all(errors, f"{spec.name} {problem}")
    values: list[float | None] = []
    for i, v in enumerate(out):
        if v is None or math.isnan(v):
            values.append(None)
        elif not math.isfinite(v):
            errors[i].append(f"{spec.name} returned {v!r} at index {i}")
            values.append(None)
        else:
            values.append(float(v))
    return values


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


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


@dataclass(frozen=True)
class ImportBound:
    """How long a reward module's import may take (``limits.reward_import_timeout_s``; None:
    unbounded, on the calling thread) and how often a long one is said
    (:mod:`freshroll.rewards.importing`)."""

    timeout_s: float | None = None
    heartbeat_s: float = 30.0


def load_reward_fn(ref: str, bound: ImportBound = ImportBound()) -> Callable[..., list[float]]:
    """A built-in reward name, ``"module.path:function"`` or ``"path/to/file.py:function"``;
    a module's import within ``bound`` (a ConfigError naming the file past it)."""
    if ref in REWARDS:
        return REWARDS[ref]
    if inmemory.is_in_memory(ref):
        return inmemory.resolve(ref)
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(
            f"reward {ref!r}: expected a built-in name ({', '.join(sorted(REWARDS))}), "
            "'module.path:function' or 'path/to/file.py:function'"
        )
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    try:
        module = bounded(
            (lambda: _load_file(ref, Path(target))) if is_file else (lambda: _import(ref, target)),
            f"reward import {target}", bound.timeout_s, bound.heartbeat_s)
    except ImportTimeout as exc:
        if is_file:
            sys.modules.pop(_file_module_name(Path(target)), None)
        raise ConfigError(f"reward {ref!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"reward {ref!r}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"reward {ref!r}: {attr!r} is not callable")
    return fn  # type: ignore[no-any-return]  # a user's callable, found by name


def _import(ref: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"reward {ref!r}: cannot import {module_name!r} ({exc})") from exc


def _load_file(ref: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise ConfigError(f"reward {ref!r}: file {path} does not exist")
    module_name = _file_module_name(path)
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


def _file_module_name(path: Path) -> str:
    return f"{inmemory.FILE_MODULE_PREFIX}{digest_of(str(path.resolve()))[:16]}"


def build_reward_set(entries: Sequence[Mapping[str, Any]],
                     bound: ImportBound = ImportBound()) -> RewardSet:
    """A :class:`RewardSet` from config entries ``{fn, weight, name, args}``.

    Without ``args``, ``fn`` names the reward function itself. With ``args`` (a
    mapping, possibly empty), ``fn`` names a reward *factory*, called once as
    ``factory(**args)`` to make the reward (TRL's ``get_soft_overlong_punishment``
    and friends); the factory's code digest and the arguments enter the version.
    The default name is the reference's attribute (a factory's: the made
    function's ``__name__``, as TRL names it in its logs).
    """
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ConfigError("rewards: expected a list of {fn, weight, name, args} entries")
    return RewardSet([_entry_spec(i, entry, bound) for i, entry in enumerate(entries)])


def _entry_spec(i: int, entry: Mapping[str, Any], bound: ImportBound) -> RewardSpec:
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
    args = entry.get("args")
    if args is not None and not isinstance(args, Mapping):
        raise ConfigError(f"{where}.args: expected a mapping of keyword arguments, got {args!r}")
    try:
        fn = load_reward_fn(ref, bound)
    except ConfigError as exc:
        raise ConfigError(f"{where}.fn: {exc}") from exc
    config: dict[str, Any] = {}
    default_name = ref if ref in REWARDS else ref.rpartition(":")[2]
    if args is not None:
        fn, config = _from_factory(where, ref, fn, dict(args))
        made = getattr(fn, "__name__", None)
        default_name = made if isinstance(made, str) and _NAME.match(made) else default_name
    elif (state := _instance_state(fn)) is not None:
        config = {"state": state}  # e.g. a module-level get_repetition_penalty_reward(4)
    name = entry.get("name", default_name)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.name: {name!r} must match [A-Za-z0-9_.-]+")
    try:
        return RewardSpec(name, fn, float(weight), config)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _instance_state(fn: Any) -> dict[str, Any] | None:
    """A callable object's attributes, when they are plain JSON values (else None)."""
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn):
        return None
    state = getattr(fn, "__dict__", None)
    if not state:
        return None
    try:
        json.dumps(state, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return dict(state)


def _from_factory(
    where: str, ref: str, factory: Callable[..., Any], args: dict[str, Any]
) -> tuple[Callable[..., list[float]], dict[str, Any]]:
    try:
        json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.args: must be plain YAML values ({exc})") from exc
    try:
        fn = factory(**args)
    except Exception as exc:  # the user's factory: report what it said
        raise ConfigError(
            f"{where}: {ref}(**{args}) raised {type(exc).__name__}: {_short(exc)}"
        ) from exc
    if not callable(fn):
        raise ConfigError(
            f"{where}: {ref}(**{args}) returned {type(fn).__name__}, not a reward function; "
            "drop 'args' if fn is the reward itself"
        )
    return fn, {"factory": digest_callable(factory), "args": args}

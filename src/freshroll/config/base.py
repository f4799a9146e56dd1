"""The base of every config section: unknown keys refused, frozen, no NaN, no boolean for a
number (:class:`Section`), and the check behind the last (:func:`bool_for_number`); one line
per bad key (:func:`key_errors`): a key whose type is a union (``int | "auto"``) gets
pydantic's one error per branch (``run.admission_window.constrained-int: ...;
run.admission_window.literal['auto']: ...``) folded into ``expected an integer from 1 to
1001 or "auto" (got "abc")``.

:mod:`freshroll.config` builds the run's schema on it; the chaos plan and the acceptance files
use it for their own schemas.
"""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

#: bounds shared by several fields: a seed torch, numpy and ``random`` all accept
SEED_MAX = 2**32 - 1


class _Section(BaseModel):
    """The base of every config section (and, as :data:`Section`, of the chaos plan and
    acceptance schemas): unknown keys refused, frozen, no NaN or infinity, no boolean for
    a number."""

    # allow_inf_nan=False: no float setting may be NaN or infinite (``lr: .inf`` passes gt=0)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """``steps: true`` is refused: pydantic's lax mode would take it for 1."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and bool_for_number(field.annotation, value):
            raise ValueError(f"expected a number, got a boolean ({json.dumps(value)})")
        return value


Section = _Section


def bool_for_number(ann: Any, value: Any) -> bool:
    """``value`` is a boolean (or a list/tuple holding one) where ``ann`` wants a number."""
    if isinstance(value, bool):
        return _admits(ann, (int, float)) and not _admits(ann, (bool,))
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return bool_for_number(args[0], value)
    if origin not in (list, tuple) or not isinstance(value, list | tuple) or not args:
        return False
    if origin is tuple and Ellipsis not in args:
        return any(bool_for_number(a, v) for a, v in zip(args, value, strict=False))
    return any(bool_for_number(args[0], v) for v in value)


def _admits(ann: Any, kinds: tuple[type, ...]) -> bool:
    """The annotation accepts a value of one of ``kinds`` as it is (unions, Annotated and
    Literal looked into; ``Any`` admits everything)."""
    if ann is Any or ann in kinds:
        return True
    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return any(type(a) in kinds for a in args)
    if origin is Annotated:
        return _admits(args[0], kinds)
    if origin is Union or origin is types.UnionType:
        return any(_admits(a, kinds) for a in args)
    return False


def key_errors(model: type[BaseModel], exc: ValidationError) -> list[tuple[tuple[int | str, ...],
                                                                     str, str]]:
    """Every error of ``exc`` (``model``'s validation) as ``(loc, type, message)``, one per
    key: the errors pydantic gives per branch of a union-typed key (their ``loc`` ends in a
    branch name such as ``constrained-int``) become one, at the key, saying what it accepts."""
    out: list[tuple[tuple[int | str, ...], str, str]] = []
    folded: set[tuple[int | str, ...]] = set()
    for err in exc.errors():
        loc = tuple(err["loc"])
        cut, ann = _branch_point(model, loc)
        if cut is None:
            out.append((loc, err["type"], err["msg"].removeprefix("Value error, ")))
        elif loc[:cut] not in folded:
            folded.add(loc[:cut])
            got = json.dumps(err["input"], default=str)
            out.append((loc[:cut], "union", f"expected {accepts(ann)} (got {got})"))
    return out


def _branch_point(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[int | None, Any]:
    """Where ``loc`` leaves the schema for a union's branch name: (its index, the union), or
    (None, None) when every part of ``loc`` is a key or an index."""
    ann: Any = model
    for i, part in enumerate(loc):
        ann = _strip(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(str(part))
            if field is None:
                return None, None
            ann = field.annotation
        elif get_origin(ann) in (list, tuple, dict):
            ann = get_args(ann)[-1] if get_args(ann) else Any
        elif get_origin(ann) in (Union, types.UnionType):
            return i, ann
        else:
            return None, None
    return None, None


def _strip(ann: Any) -> Any:
    """``X | None`` as ``X`` (pydantic names no branch for it), Annotated unwrapped."""
    if get_origin(ann) is Annotated:
        return _strip(get_args(ann)[0])
    if get_origin(ann) in (Union, types.UnionType):
        rest = [a for a in get_args(ann) if a is not type(None)]
        if len(rest) == 1:
            return _strip(rest[0])
    return ann


def accepts(ann: Any) -> str:
    """What ``ann`` accepts, in words: ``an integer from 1 to 1001 or "auto"``."""
    origin, args = get_origin(ann), get_args(ann)
    if origin in (Union, types.UnionType):
        return " or ".join(accepts(a) for a in args)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin is Annotated:
        base, bounds = args[0], [m for a in args[1:] for m in getattr(a, "metadata", [a])]
        return accepts(base) + _bounds(bounds)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             type(None): "null"}
    if ann in names:
        return names[ann]
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "a mapping of keys"
    return "a list" if origin in (list, tuple) else str(ann)


def _bounds(metadata: list[Any]) -> str:
    low = next((m.ge for m in metadata if isinstance(m, Ge)), None)
    high = next((m.le for m in metadata if isinstance(m, Le)), None)
    if low is not None and high is not None:
        return f" from {low} to {high}"
    words = [f" > {m.gt}" for m in metadata if isinstance(m, Gt)]
    words += [f" >= {low}"] if low is not None else []
    words += [f" < {m.lt}" for m in metadata if isinstance(m, Lt)]
    words += [f" <= {high}"] if high is not None else []
    return ",".join(words)


__all__ = ["Section", "accepts", "bool_for_number", "key_errors"]

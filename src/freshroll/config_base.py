"""The base of every config section: unknown keys refused, frozen, no NaN, no boolean for a
number (:class:`Section`), and the check behind the last (:func:`bool_for_number`); TRL's
names for freshroll's keys (:data:`TRL_NAMES`), which an unknown key is answered with.

:mod:`freshroll.config` builds the run's schema on it; the chaos plan and the acceptance files
use it for their own schemas.
"""

from __future__ import annotations

import json
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

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


__all__ = ["Section", "bool_for_number"]

"""The config reference, generated from the schema in :mod:`freshroll.config`.

One source for every key's type, default, bounds and description: ``freshroll config show``
prints a resolved config annotated with them, and ``docs/config.md`` is :func:`reference`'s
output (a test regenerates it and compares, so the page cannot drift from the schema).

Importing this module is light (pydantic and yaml only), so config errors surface before the
heavy imports of a run (torch, transformers).
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from freshroll.config import Config


@dataclass(frozen=True)
class Key:
    """One leaf key of the config schema."""

    path: str  # dotted, e.g. "trainer.lr"; list entries as "rewards[].fn"
    type: str
    default: Any
    bounds: str
    description: str


def _type_name(ann: Any) -> str:
    """A field's type as the reference prints it: ``int (>= 1, <= 1024) | Literal['auto']``
    for a bounded number or a word."""
    if get_origin(ann) in (Union, types.UnionType) and any(
            get_origin(a) is Annotated for a in get_args(ann)):
        return " | ".join(_type_name(a) for a in get_args(ann))
    if get_origin(ann) is Annotated:
        base, *meta = get_args(ann)
        marks = _bounds_of([m for f in meta for m in getattr(f, "metadata", [f])])
        return f"{_type_name(base)} ({marks})" if marks else _type_name(base)
    text = getattr(ann, "__name__", None) if not getattr(ann, "__args__", None) else None
    return text or str(ann).replace("typing.", "")


def _section_of(ann: Any) -> tuple[type[BaseModel] | None, bool]:
    """The pydantic model a field holds (and whether as a list), or None for a leaf."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann, False
    for arg in getattr(ann, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, getattr(ann, "__origin__", None) is list
    return None, False


def _bounds(info: FieldInfo) -> str:
    return _bounds_of(info.metadata)


def _bounds_of(metadata: Any) -> str:
    marks = []
    for m in metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None:
                marks.append(f"{sym} {value}")
    return ", ".join(marks)


def _default(info: FieldInfo) -> Any:
    if info.default is not PydanticUndefined:
        value = info.default
    elif info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]  # ours take no argument
    else:
        return "(required)"
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def keys(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[Key]:
    """Every leaf key of ``model`` in declaration order (sections are walked into). A key's
    default is its value in a section built with no key set (a section's validator may fill
    it: ``task.name`` is ``reverse`` unless ``task.file`` is set)."""
    try:
        built: dict[str, Any] = model().model_dump(mode="json")
    except ValidationError:  # a section with a required key (a rewards entry's fn)
        built = {}
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        section, is_list = _section_of(info.annotation)
        if section is not None:
            yield from keys(section, f"{path}[]." if is_list else f"{path}.")
            continue
        default = built[name] if name in built else _default(info)
        yield Key(path, _type_name(info.annotation), default, _bounds(info),
                  info.description or "")


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def reference() -> str:
    """docs/config.md: every key, its type, default, bounds and meaning."""
    out = [
        "# Config reference",
        "",
        "Generated from the schema (`src/freshroll/config.py`) by "
        "`freshroll config reference`; a test checks that this page matches it. "
        "Unknown keys are rejected (with a \"did you mean\"). `freshroll config show [CONFIG] "
        "[key=value ...]` prints a resolved config with these notes; `freshroll config check` "
        "runs every check a run makes before it trains (model, data, rewards), writing "
        "nothing.",
        "",
    ]
    section = None
    for k in keys():
        top = k.path.split(".", 1)[0].removesuffix("[]")
        if top != section:
            if section is not None:
                out.append("")
            section = top
            doc = (Config.model_fields[top].description or "").strip()
            out += [f"## `{top}`", "", *([doc, ""] if doc else []),
                    "| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        desc = k.description.replace("|", "\\|")
        out.append(f"| `{k.path}` | {k.type.replace('|', '∣')} | `{_fmt(k.default)}` | "
                   f"{k.bounds} | {desc} |")
    out.append("")
    return "\n".join(out)


def show(cfg: Config) -> str:
    """``cfg`` as YAML, each leaf annotated with its default (where it differs) and meaning."""
    data = cfg.model_dump(mode="json")
    notes = {k.path: k for k in keys()}
    lines: list[str] = []
    unused = unused_keys(cfg)
    for path in unused:
        section, _, name = path.partition(".")
        data[section].pop(name)

    def emit(node: Any, path: str, indent: int) -> None:
        pad = "  " * indent
        if isinstance(node, dict):
            for name, value in node.items():
                sub = f"{path}{name}"
                key = notes.get(sub)
                if key is None and isinstance(value, dict | list) and value:
                    lines.append(f"{pad}{name}:")
                    emit(value, f"{sub}.", indent + 1)
                    continue
                lines.append(f"{pad}{name}: {json.dumps(value)}{_note(key, value)}")
        elif isinstance(node, list):
            for item in node:
                lines.append(f"{pad}-")
                emit(item, path.removesuffix(".") + "[].", indent + 1)

    emit(data, "", 0)
    for why, paths in _unused_why(cfg, unused).items():
        lines.append(f"# not shown, not used {why}: {', '.join(paths)}")
    return "\n".join(lines) + "\n"


#: keys that a setting makes moot, when set: (its section, its key, the moot keys)
_MOOT: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("task", "file", ("task.name", "task.n_prompts", "task.params")),
    ("model", "path", ("model.tiny_seed", "model.tiny")),
)


def unused_keys(cfg: Config) -> list[str]:
    """The keys ``show`` leaves out: the built-in task's when ``task.file`` is set, the
    embedded model's when ``model.path`` is (they stay in the config, its digest and the
    resume rules: a run's settings are recorded whole)."""
    data = cfg.model_dump(mode="json")
    return [k for section, key, moot in _MOOT if data[section][key] is not None for k in moot]


def _unused_why(cfg: Config, unused: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for section, key, moot in _MOOT:
        hidden = [k for k in moot if k in unused]
        if hidden:
            out[f"with {section}.{key} set"] = hidden
    return out


def _note(key: Key | None, value: Any) -> str:
    if key is None:
        return ""
    parts = []
    if key.default != value and key.default != "(required)":
        parts.append(f"default {_fmt(key.default)}")
    if key.description:
        parts.append(key.description)
    return f"  # {'; '.join(parts)}" if parts else ""

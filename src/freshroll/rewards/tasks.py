"""Verifiable tasks: prompts with ground-truth answers, generated or loaded from a file.

Guarantees:

* Built-in tasks (``reverse``, ``sort``, ``add``) are generated from a private
  ``random.Random(seed)``: the same ``(task, n, seed, params)`` always gives the
  same prompts, in the same order, and global random state is never touched.
* Generated texts and answers use only :data:`VOCAB` (digits, ``+-*=<>|:,``,
  space and lowercase ``a-z``), the vocabulary of the embedded tokenizer.
* Generated prompt ids are ``"{task}-s{seed}-{index:06d}"``; loaded ones are the
  id column's value or ``"{file stem}-{row index}"``; ids within a list are unique.
* Every bad input raises :class:`~freshroll.errors.ConfigError` naming the task,
  parameter, file, column or row at fault.
"""

from __future__ import annotations

import inspect
import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from freshroll.errors import ConfigError

VOCAB: frozenset[str] = frozenset("0123456789+-*=<>|:, " + string.ascii_lowercase)

#: A prompt generator: ``(rng, **params) -> (text, answer)``; params are keyword-only ints.
Generator = Callable[..., tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One verifiable prompt: what the policy sees and the answer it is checked against."""

    prompt_id: str
    text: str
    answer: str


class Task(NamedTuple):
    """A built-in task: its prompt generator and the name of its default reward."""

    generate: Generator
    reward: str


# --- built-in generators -------------------------------------------------------------


def _digits(rng: random.Random, min_len: int, max_len: int) -> str:
    _check_range("min_len", min_len, 1, "max_len", max_len)
    return "".join(rng.choice(string.digits) for _ in range(rng.randint(min_len, max_len)))


def _reverse(rng: random.Random, *, min_len: int = 3, max_len: int = 5) -> tuple[str, str]:
    digits = _digits(rng, min_len, max_len)
    return f"rev {digits}=", digits[::-1]


def _sort(rng: random.Random, *, min_len: int = 3, max_len: int = 5) -> tuple[str, str]:
    digits = _digits(rng, min_len, max_len)
    return f"sort {digits}=", "".join(sorted(digits))


def _add(rng: random.Random, *, max_operand: int = 50) -> tuple[str, str]:
    _check_range("max_operand", max_operand, 0)
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return f"{a}+{b}=", str(a + b)


def _check_range(
    name: str, value: int, low: int, upper_name: str | None = None, upper: int | None = None
) -> None:
    if value < low:
        raise ConfigError(f"task param {name}={value} must be >= {low}")
    if upper is not None and value > upper:
        raise ConfigError(f"task param {name}={value} must be <= {upper_name}={upper}")


TASKS: dict[str, Task] = {
    "reverse": Task(_reverse, "reverse"),
    "sort": Task(_sort, "sort"),
    "add": Task(_add, "numeric"),
}


def task_params(task: str) -> dict[str, int]:
    """The parameters ``task`` accepts, with their defaults."""
    sig = inspect.signature(_task(task).generate)
    return {
        p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY
    }


def make_prompts(task: str, n: int, seed: int, **params: Any) -> list[Prompt]:
    """``n`` prompts of built-in ``task``, deterministic in ``seed`` and ``params``."""
    generate = _task(task).generate
    _check_params(task, params)
    generate(random.Random(0), **params)  # range checks fire even when n == 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"task {task!r}: n must be an int >= 0, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"task {task!r}: seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        text, answer = generate(rng, **params)
        prompts.append(Prompt(f"{task}-s{seed}-{i:06d}", text, answer))
    return prompts


def _task(task: str) -> Task:
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[task]


def _check_params(task: str, params: Mapping[str, Any]) -> None:
    known = task_params(task)
    for name, value in params.items():
        if name not in known:
            raise ConfigError(
                f"task {task!r}: unknown param {name!r}; known params: {', '.join(sorted(known))}"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"task {task!r}: param {name} must be an int, got {value!r}")


# --- loading from a file ---------------------------------------------------------------

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_prompts(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    id_field: str | None = None,
) -> list[Prompt]:
    """Prompts from a local JSONL/JSON or Parquet file, one per row, in file order.

    ``prompt_field`` and ``answer_field`` must hold strings; ``id_field`` (if given)
    strings or ints, unique. Without it, ids are ``"{file stem}-{row index}"``.
    """
    path = Path(path)
    rows = _read_rows(path)
    for column in (prompt_field, answer_field, id_field):
        if column is not None and column not in rows[0]:
            raise ConfigError(
                f"prompt file {path}: missing column {column!r}; columns: {sorted(rows[0])}"
            )
    prompts = [
        _row_prompt(path, i, row, prompt_field, answer_field, id_field)
        for i, row in enumerate(rows)
    ]
    _check_unique_ids(path, prompts)
    return prompts


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    builder = _FORMATS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"prompt file {path}: unsupported extension {path.suffix!r}; "
            f"use one of {', '.join(_FORMATS)}"
        )
    if path.stat().st_size == 0 or (builder == "parquet" and _parquet_rows(path) == 0):
        raise ConfigError(f"prompt file {path} is empty")
    import datasets  # heavy import, only needed here

    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for unreadable files
        cause = exc.__cause__ or exc
        raise ConfigError(
            f"prompt file {path}: cannot read it ({type(cause).__name__}: {cause})"
        ) from exc
    if len(ds) == 0:
        raise ConfigError(f"prompt file {path} has no rows")
    return list(ds.to_list())


def _parquet_rows(path: Path) -> int | None:
    """Row count from the Parquet footer; None if unreadable (load_dataset will say why)."""
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:
        return None


def _row_prompt(
    path: Path,
    index: int,
    row: Mapping[str, Any],
    prompt_field: str,
    answer_field: str,
    id_field: str | None,
) -> Prompt:
    for column in (prompt_field, answer_field):
        if not isinstance(row[column], str):
            raise ConfigError(
                f"prompt file {path}, row {index}: column {column!r} must be a string, "
                f"got {type(row[column]).__name__} {row[column]!r} (quote values in the file)"
            )
    if id_field is None:
        return Prompt(f"{path.stem}-{index}", row[prompt_field], row[answer_field])
    raw_id = row[id_field]
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        raise ConfigError(
            f"prompt file {path}, row {index}: column {id_field!r} must be a string or int, "
            f"got {raw_id!r}"
        )
    return Prompt(str(raw_id), row[prompt_field], row[answer_field])


def _check_unique_ids(path: Path, prompts: list[Prompt]) -> None:
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p.prompt_id in seen:
            raise ConfigError(
                f"prompt file {path}, row {i}: duplicate prompt id {p.prompt_id!r} "
                f"(first at row {seen[p.prompt_id]})"
            )
        seen[p.prompt_id] = i

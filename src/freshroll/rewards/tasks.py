"""Verifiable tasks: prompts with ground-truth answers, and the :class:`Prompt` record.

Prompts from a user's dataset are loaded by :mod:`freshroll.rewards.data`.

Guarantees:

* Built-in tasks (``reverse``, ``sort``, ``add``, ``repeat``: long-tailed lengths; ``calc``:
  a tool task; ``guess``: a multi-turn game) are
  generated from a private ``random.Random(seed)``: the same ``(task, n, seed, params)``
  always gives the same prompts, in the same order, and global random state is never
  touched.
* Generated texts and answers use only :data:`VOCAB` (digits, ``+-*=<>|:,``,
  space and lowercase ``a-z``), the vocabulary of the embedded tokenizer.
* Generated prompt ids are ``"{task}-s{seed}-{index:06d}"``, unique within a list;
  each generated prompt has one column, ``answer`` (a string).
* Every bad input raises :class:`~freshroll.errors.ConfigError` naming the task,
  parameter, file, column or row at fault.
"""

from __future__ import annotations

import inspect
import random
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from freshroll.errors import ConfigError
from freshroll.rewards.reasoning_gym import PREFIX as RG_PREFIX
from freshroll.rewards.reasoning_gym import rg_prompts

VOCAB: frozenset[str] = frozenset("0123456789+-*=<>|:, " + string.ascii_lowercase)

#: A prompt generator: ``(rng, **params) -> (text, answer)``; params are keyword-only ints.
Generator = Callable[..., tuple[str, str]]


Message = Mapping[str, Any]
"""One chat message: ``{"role": str, "content": str}`` (TRL's conversational format)."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: what the policy is given, and the dataset row rewards are given.

    ``text`` is what the engine tokenizes (for a chat prompt, the chat template's
    rendering of ``messages``). ``columns`` holds every column of the dataset row by
    its own name (generated tasks: ``answer``); rewards receive them as keyword lists.
    ``messages`` is set for a chat-format prompt: rewards then get it as ``prompts``
    and their completions as ``[{"role": "assistant", "content": text}]``, as in TRL.
    """

    prompt_id: str
    text: str
    columns: Mapping[str, Any] = field(default_factory=dict)
    messages: Sequence[Message] | None = None

    @property
    def answer(self) -> Any:
        """The ``answer`` column (None if the dataset has none)."""
        return self.columns.get("answer")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def reward_prompt(self) -> str | list[dict[str, Any]]:
        """The prompt as TRL hands it to rewards: the text, or a copy of the messages."""
        if self.messages is None:
            return self.text
        return [dict(m) for m in self.messages]


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


def _repeat(rng: random.Random, *, min_len: int = 2, max_len: int = 48,
            tail: int = 12) -> tuple[str, str]:
    """A long-tailed task: ``"rep 7x13="`` -> ``"7777777777777"``. The count is heavy-tailed,
    ``n = min(max_len, floor(min_len * pareto(tail / 10)))`` (Pareto with shape
    ``tail / 10``: most answers a few digits, a few up to ``max_len``; a smaller ``tail``
    means a heavier one), so generation lengths vary as a reasoning workload's do."""
    _check_range("min_len", min_len, 1, "max_len", max_len)
    _check_range("tail", tail, 1)
    n = min(max_len, int(min_len * rng.paretovariate(tail / 10)))
    digit = rng.choice(string.digits)
    return f"rep {digit}x{n}=", digit * n


def _calc(rng: random.Random, *, max_operand: int = 99) -> tuple[str, str]:
    """A tool task (docs/agents.md): ``"calc 23*41 c:"`` -> ``"943"``. The prompt opens a
    calculator call (``c:``), which the ``calc_tool`` workflow answers; the answer is scored
    as ``add``'s (``numeric``)."""
    _check_range("max_operand", max_operand, 0)
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return f"calc {a}*{b} c:", str(a * b)


def _guess(rng: random.Random, *, max_number: int = 9) -> tuple[str, str]:
    """A multi-turn game (docs/agents.md): ``"guess 0-9:"``; the secret is the answer, which
    the ``guess_game`` workflow's environment reads and the policy never sees."""
    _check_range("max_number", max_number, 1)
    return f"guess 0-{max_number}:", str(rng.randint(0, max_number))


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
    "repeat": Task(_repeat, "repeat"),
    "calc": Task(_calc, "numeric"),
    "guess": Task(_guess, "numeric"),
}


def task_params(task: str) -> dict[str, int]:
    """The parameters ``task`` accepts, with their defaults."""
    sig = inspect.signature(_task(task).generate)
    return {
        p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY
    }


def make_prompts(task: str, n: int, seed: int, **params: Any) -> list[Prompt]:
    """``n`` prompts of built-in ``task``, deterministic in ``seed`` and ``params``; a
    ``rg:<dataset>`` task is reasoning-gym's (:mod:`freshroll.rewards.reasoning_gym`)."""
    if task.startswith(RG_PREFIX):
        prompts: list[Prompt] = rg_prompts(task, n, seed, params)
        return prompts
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
        prompts.append(Prompt(f"{task}-s{seed}-{i:06d}", text, {"answer": answer}))
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

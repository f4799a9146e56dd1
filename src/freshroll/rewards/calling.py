"""How a reward function is called: TRL ``GRPOTrainer``'s convention, by keyword.

Every reward is called as (TRL 1.16, ``GRPOTrainer._calculate_rewards``)::

    fn(prompts=[...], completions=[...], completion_ids=[[int, ...], ...],
       <every dataset column by its own name>=[...],
       trainer_state=RewardState(...), log_extra=..., log_metric=...)

* ``prompts``: the prompt column, a string or (chat datasets) a list of messages.
* ``completions``: the decoded texts; for chat prompts each is one assistant
  message, ``[{"role": "assistant", "content": text}]``.
* ``completion_ids``: the generated token ids (up to and including a final eos).
* columns: every column of the row except ``prompt``, ``completion`` and
  ``completion_ids`` (TRL's rule: those arrive as the arguments above, or not at all).
* ``trainer_state``: a :class:`RewardState` (the fields of TRL's ``TrainerState``
  that a schedule-shaped reward reads); ``log_extra(column, values)`` and
  ``log_metric(name, value)`` are accepted and kept by the
  :class:`~freshroll.rewards.scoring.RewardSet`.

An ``async def`` reward is awaited (in the reward thread, one at a time; TRL
gathers them concurrently). A function that takes ``**kwargs`` (TRL requires it)
gets all of these. A function without ``**kwargs`` gets only the keywords it
names, so an older freshroll reward ``fn(prompts, completions, answer)`` keeps
working; one that names none of ``prompts``/``completions``/``completion_ids`` is
a factory given without its arguments, and is refused when the set is built.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from freshroll.rewards.tasks import Prompt

STANDARD = ("prompts", "completions", "completion_ids")
HOOKS = ("trainer_state", "log_extra", "log_metric")
#: keyword names freshroll fills itself; a dataset column may not use them
RESERVED: frozenset[str] = frozenset(STANDARD + HOOKS)
#: columns TRL does not pass as keywords (they are the prompt and completion themselves)
DROPPED_COLUMNS: frozenset[str] = frozenset({"prompt", "completion", "completion_ids"})

_MISSING_ARGS = re.compile(r"missing \d+ required (?:positional|keyword-only) arguments?: (.+)")
_STR_INDEXED = ("string indices must be integers", "'str' object has no attribute")


@dataclass(frozen=True, slots=True)
class RewardState:
    """What a reward sees of training progress, named like TRL's ``TrainerState``.

    ``global_step`` is the trainer's committed step when the sample is scored;
    ``max_steps`` is ``run.steps``.
    """

    global_step: int = 0
    max_steps: int = 0


@dataclass(frozen=True, slots=True)
class Signature:
    """The keywords a reward takes: ``accepts`` None means it takes ``**kwargs``."""

    accepts: frozenset[str] | None
    required: frozenset[str]

    @property
    def needed_columns(self) -> frozenset[str]:
        """Required parameters that only a dataset column can fill."""
        return self.required - RESERVED

    @property
    def looks_like_factory(self) -> bool:
        return self.accepts is not None and not self.accepts & set(STANDARD)


def signature_of(fn: Callable[..., Any]) -> Signature:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: pass everything
        return Signature(None, frozenset())
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
    required = frozenset(p.name for p in named if p.default is p.empty)
    return Signature(None if takes_all else frozenset(p.name for p in named), required)


def select(kwargs: Mapping[str, Any], sig: Signature) -> dict[str, Any]:
    """The keywords to pass: all of them, or those the function names."""
    if sig.accepts is None:
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in sig.accepts}


def reward_columns(prompts: Sequence[Prompt]) -> dict[str, list[Any]]:
    """The dataset columns of ``prompts`` as keyword lists (a column a row lacks is None)."""
    names: dict[str, None] = {}
    for p in prompts:
        names.update(dict.fromkeys(k for k in p.columns if k not in DROPPED_COLUMNS))
    return {k: [p.columns.get(k) for p in prompts] for k in names}


def trl_completions(prompts: Sequence[Prompt], texts: Sequence[str]) -> list[Any]:
    """Completions as TRL passes them: text, or one assistant message for a chat prompt."""
    return [
        [{"role": "assistant", "content": t}] if p.is_chat else t
        for p, t in zip(prompts, texts, strict=True)
    ]


def explain(exc: BaseException, columns: Collection[str], conversational: bool) -> str:
    """A hint for the user after a reward raised ``exc`` ("" if there is none to give)."""
    have = sorted(columns)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        key = exc.args[0]
        if key not in columns:
            return f" (the reward asked for column {key!r}; the dataset has columns {have})"
    if isinstance(exc, TypeError):
        m = _MISSING_ARGS.search(str(exc))
        if m:
            names = re.findall(r"'(\w+)'", m.group(1))
            return (f" (the reward needs column(s) {names}; the dataset has columns {have}; "
                    "rename a column, or set task.answer_field for 'answer')")
    if not conversational and any(s in str(exc) for s in _STR_INDEXED):
        return (" (it may expect conversational completions, lists of messages: rewards get "
                "those only for chat-format prompts, [{role, content}] in the prompt column)")
    return ""

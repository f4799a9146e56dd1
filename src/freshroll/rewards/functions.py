"""Built-in reward functions with TRL's reward-function signature.

Every function here is called by keyword, exactly like TRL's ``GRPOTrainer`` calls
``reward_funcs`` (see :mod:`freshroll.rewards.calling`): ``prompts=``, ``completions=``,
every dataset column as a keyword list (the task rewards read ``answer``; non-string
answers are compared as ``str(answer)``), and the rest (``completion_ids``,
``trainer_state``, ...) is taken by ``**kwargs`` and ignored.

Guarantees:

* Pure and deterministic: the same inputs always give the same rewards.
* One float per completion, in input order. Task rewards lie in ``[0, 1]`` and
  are ``1.0`` exactly when the stripped completion equals the answer.
* A completion may be a string or a TRL conversational completion (a list of
  ``{"role", "content"}`` messages; the last message's content is scored).
* Mismatched ``completions`` / ``answer`` lengths raise ``ValueError``
  (:class:`~freshroll.rewards.scoring.RewardSet` turns that into reward errors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

EXTRA_CHAR_PENALTY = 0.1  # subtracted per character beyond the answer's length
NUMERIC_PARTIAL_CAP = 0.9  # the most a wrong answer can earn from numeric_reward
LENGTH_PENALTY_PER_CHAR = 0.01

RewardFn = Callable[..., list[float]]


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of a completion: the string itself, or the last message's content."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def positional_score(completion: str, answer: str) -> float:
    """Per-position partial credit of a stripped ``completion`` against ``answer``.

    With ``c = completion.strip()``, ``a = answer`` and ``extra = max(0, len(c) - len(a))``::

        score = max(0, matches / len(a) - 0.1 * extra)
        matches = #{ i < min(len(c), len(a)) : c[i] == a[i] }

    An empty answer scores 1.0 for an empty completion, else 0.0.
    Example: answer ``"4321"``, completion ``"4301"`` -> 3/4 = 0.75.
    """
    c = completion.strip()
    if not answer:
        return 1.0 if not c else 0.0
    matches = sum(x == y for x, y in zip(c, answer, strict=False))
    extra = max(0, len(c) - len(answer))
    return max(0.0, matches / len(answer) - EXTRA_CHAR_PENALTY * extra)


def numeric_score(completion: str, answer: str) -> float:
    """1.0 for an exact (stripped) match, else right-aligned digit credit, at most 0.9.

    With ``c = completion.strip()``, ``a = answer`` and ``extra = max(0, len(c) - len(a))``::

        score = max(0, 0.9 * matches / len(a) - 0.1 * extra)
        matches = #{ i < min(len(c), len(a)) : c[-1 - i] == a[-1 - i] }

    so the ones digit is compared with the ones digit, tens with tens, and so on.
    Example: answer ``"57"``, completion ``"47"`` -> 0.9 * 1/2 = 0.45.
    """
    c = completion.strip()
    if c == answer:
        return 1.0
    if not answer:
        return 0.0
    matches = sum(x == y for x, y in zip(reversed(c), reversed(answer), strict=False))
    extra = max(0, len(c) - len(answer))
    return max(0.0, NUMERIC_PARTIAL_CAP * matches / len(answer) - EXTRA_CHAR_PENALTY * extra)


def _per_answer(
    score: Callable[[str, str], float], completions: Sequence[Any], answer: Sequence[str]
) -> list[float]:
    pairs = zip(completions, answer, strict=True)  # length mismatch -> ValueError
    return [score(completion_text(c), str(a)) for c, a in pairs]


def reverse_reward(
    prompts: list[str], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """Reward for ``reverse``: :func:`positional_score` of each completion vs its answer."""
    return _per_answer(positional_score, completions, answer)


def sort_reward(
    prompts: list[str], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """Reward for ``sort``: :func:`positional_score` of each completion vs its answer."""
    return _per_answer(positional_score, completions, answer)


def length_score(completion: str, answer: str) -> float:
    """Half for the length, half for the digits in place, both over the longer of the two::

        score = 0.5 * (1 - |len(c) - len(a)| / m) + 0.5 * matches / m
        m = max(len(c), len(a)),  matches = #{ i : c[i] == a[i] },  c = completion.strip()

    An empty answer scores 1.0 for an empty completion. A run-on completion still earns a
    little and a shorter one more, so a model that has not learnt to stop has a signal to
    learn it from. ``"777"`` vs ``"7777"`` -> 0.5 * 0.75 + 0.5 * 0.75 = 0.75.
    """
    c = completion.strip()
    if not answer:
        return 1.0 if not c else 0.0
    m = max(len(c), len(answer))
    matches = sum(x == y for x, y in zip(c, answer, strict=False))
    return 0.5 * (1 - abs(len(c) - len(answer)) / m) + 0.5 * matches / m


def repeat_reward(
    prompts: list[str], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """Reward for ``repeat``: :func:`length_score` (stopping at the right length is the task)."""
    return _per_answer(length_score, completions, answer)


def exact_match_reward(
    prompts: list[str], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """1.0 when ``completion.strip() == answer``, else 0.0."""
    return _per_answer(lambda c, a: float(c.strip() == a), completions, answer)


def numeric_reward(
    prompts: list[str], completions: list[Any], answer: list[str], **kwargs: Any
) -> list[float]:
    """Reward for ``add``: :func:`numeric_score` of each completion vs its answer."""
    return _per_answer(numeric_score, completions, answer)


def reasoning_gym_reward(
    prompts: list[str], completions: list[Any], rg_entry: list[str], **kwargs: Any
) -> list[float]:
    """Reward for a reasoning-gym task (``task.name: rg:<dataset>``): the dataset's own
    ``score_answer`` of each completion (:mod:`freshroll.rewards.reasoning_gym`)."""
    from freshroll.rewards.reasoning_gym import score_entries

    return score_entries([completion_text(c) for c in completions], rg_entry)


def length_penalty(prompts: list[str], completions: list[Any], **kwargs: Any) -> list[float]:
    """``-0.01 * len(completion)`` (raw text, whitespace included): combine with a weight."""
    return [-LENGTH_PENALTY_PER_CHAR * len(completion_text(c)) for c in completions]


REWARDS: dict[str, RewardFn] = {
    "reverse": reverse_reward,
    "sort": sort_reward,
    "repeat": repeat_reward,
    "exact_match": exact_match_reward,
    "numeric": numeric_reward,
    "reasoning_gym": reasoning_gym_reward,
    "length_penalty": length_penalty,
}

"""reasoning-gym tasks as prompts, and their own scorers as the reward (issue 49).

``task.name: rg:<dataset>`` (e.g. ``rg:basic_arithmetic``) takes ``task.n_prompts`` entries of
reasoning-gym's procedural dataset ``<dataset>`` (``create_dataset(name, size, seed)``, the
run's seed; ``task.params`` are the dataset's own config keys); the reward ``reasoning_gym``
scores each completion with the dataset's ``score_answer`` (through
``get_score_answer_fn``), as reasoning-gym defines it, unchanged.

Each prompt keeps its whole entry (question, answer, metadata) as JSON in the ``rg_entry``
column, so the score needs nothing but the row, also on resume. reasoning-gym is an optional
extra: without it, a ConfigError names it (``pip install 'freshroll[reasoning-gym]'``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from freshroll.errors import ConfigError

#: ``task.name`` prefix of a reasoning-gym dataset
PREFIX: Final = "rg:"
EXTRA: Final = "reasoning-gym"


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigError(f"reasoning-gym tasks (task.name: {PREFIX}<dataset>) need the "
                          f"{EXTRA} extra: pip install 'freshroll[{EXTRA}]'") from exc
    return reasoning_gym


def rg_prompts(task: str, n: int, seed: int, params: Mapping[str, Any]) -> list[Any]:
    """``n`` prompts of the reasoning-gym dataset ``task`` names (``rg:<dataset>``)."""
    from freshroll.rewards.tasks import Prompt

    name = task[len(PREFIX):]
    rg = _rg()
    try:
        data = rg.create_dataset(name, size=n, seed=seed, **dict(params))
    except Exception as exc:  # an unknown dataset or config key: reasoning-gym's own words
        raise ConfigError(f"task {task!r}: reasoning-gym refused it ({type(exc).__name__}: "
                          f"{str(exc)[:300]})") from exc
    prompts = []
    for i, entry in enumerate(data):
        prompts.append(Prompt(
            f"rg-{name}-s{seed}-{i:06d}", str(entry["question"]),
            {"answer": str(entry["answer"]), "rg_entry": json.dumps(entry, default=str)},
        ))
    return prompts


def score_entries(texts: Sequence[str], entries: Sequence[str]) -> list[float]:
    """Each completion text scored by its entry's dataset (``score_answer``)."""
    rg = _rg()
    out = []
    for text, raw in zip(texts, entries, strict=True):
        entry = json.loads(raw)
        score = rg.get_score_answer_fn(entry["metadata"]["source_dataset"])
        out.append(float(score(answer=text, entry=entry)))
    return out


__all__ = ["EXTRA", "PREFIX", "rg_prompts", "score_entries"]

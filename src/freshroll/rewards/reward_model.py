"""A reward model as a reward: TRL's ``reward_funcs=["path/to/reward-model"]``.

A local sequence-classification model directory (``save_pretrained``) scores each completion
as TRL scores one: the prompt and the completion joined (chat messages rendered by the
tokenizer's chat template), tokenized by the directory's own tokenizer (TRL's default
``reward_processing_class``) right-padded with no special tokens added, and the first logit
of each row is the reward (``logits[:, 0]``). In a config::

    rewards:
      - {fn: "freshroll.rewards.reward_model:reward_model",
         args: {path: models/my-rm, digest: <model digest>}}

``freshroll.GRPOTrainer`` writes that entry for a directory given in ``reward_funcs``, with
``digest`` the model's digest (config and weights, :func:`~freshroll.engines.tiny.model_digest`)
as it was then: the reward version (a factory's code and arguments) so names the weights, and
a directory whose weights changed since is refused at load instead of scoring under another
reward unnoticed. Without ``digest`` the path alone is versioned.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError

#: the reference a config names the factory by
REF = "freshroll.rewards.reward_model:reward_model"


def is_model_dir(ref: str) -> bool:
    """``ref`` names a local model directory (a reward model), not a reward reference."""
    path = Path(ref).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


def entry(path: str | Path) -> dict[str, Any]:
    """The config entry of the reward model in ``path`` (its digest taken now)."""
    from freshroll.engines.tiny import model_digest

    where = Path(path).expanduser().resolve()
    return {"fn": REF, "args": {"path": str(where), "digest": model_digest(where)}}


def reward_model(path: str, digest: str | None = None,
                 batch_size: int = 16) -> Callable[..., list[float]]:
    """The reward function of the model in ``path`` (the module's rule), scoring
    ``batch_size`` completions per forward pass; refused when ``digest`` is given and the
    directory's model no longer has it."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from freshroll.engines.model_dir import loading_model, quiet_transformers
    from freshroll.engines.tiny import model_digest

    if not is_model_dir(path):
        raise ConfigError(f"reward model {path!r}: not a model directory (no config.json)")
    if digest is not None and model_digest(path) != digest:
        raise ConfigError(f"reward model {path!r}: its weights or config changed since the run "
                          "was configured (digest differs): restore them, or start a new run")
    quiet_transformers()  # no loading bars: the run's progress line is the display
    with loading_model(Path(path)):
        model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def score(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = [_joined(p, c, tokenizer) for p, c in zip(prompts, completions, strict=True)]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                enc = tokenizer(text=texts[i:i + batch_size], return_tensors="pt",
                                padding=True, padding_side="right", add_special_tokens=False)
                out.extend(float(x) for x in model(**enc).logits[:, 0])
        return out

    score.__name__ = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).name) or "reward_model"
    return score


def _joined(prompt: Any, completion: Any, tokenizer: Any) -> str:
    """TRL's reward-model input: ``prompt + completion``, chat messages rendered."""
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt + completion
    messages = _messages(prompt) + _messages(completion)
    text: str = tokenizer.apply_chat_template(messages, tokenize=False)
    return text


def _messages(part: Any) -> list[Mapping[str, Any]]:
    if isinstance(part, str):
        return [{"role": "assistant", "content": part}]
    return list(part)


__all__ = ["REF", "entry", "is_model_dir", "reward_model"]

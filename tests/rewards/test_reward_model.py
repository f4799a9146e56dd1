"""A reward model directory as a reward (TRL's ``reward_funcs=["path"]``;
:mod:`freshroll.rewards.reward_model`): scored as TRL scores one, versioned by its digest,
refused when its weights changed (issue 48, "reward models as reward_funcs")."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaForSequenceClassification,
)

from freshroll.engines.tiny import build_tokenizer, tiny_config
from freshroll.errors import ConfigError
from freshroll.rewards.reward_model import REF, entry, is_model_dir, reward_model

PROMPTS = ["rev 123=", "rev 45=", "rev 6789="]
COMPLETIONS = ["321", "5", "98761 extra"]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rm") / "my-rm"
    tokenizer = build_tokenizer()
    config = tiny_config(len(tokenizer), num_labels=1)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(out)  # type: ignore[no-untyped-call]  # unannotated __init__
    tokenizer.save_pretrained(out)
    return out


def _trl_scores(path: Path, prompts: list[str], completions: list[str]) -> list[float]:
    """TRL's ``_calculate_rewards`` for a reward model, transcribed (trl 1.16)."""
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    inputs = tok(text=texts, return_tensors="pt", padding=True, padding_side="right",
                 add_special_tokens=False)
    with torch.inference_mode():
        return [float(x) for x in model(**inputs).logits[:, 0]]


def test_a_reward_model_scores_as_trl_scores_it(rm_dir: Path) -> None:
    want = _trl_scores(rm_dir, PROMPTS, COMPLETIONS)
    for batch in (16, 1):  # padding does not move a row's score
        got = reward_model(str(rm_dir), batch_size=batch)(PROMPTS, COMPLETIONS)
        assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(w, 6) for w in want)) == 3  # three different scores


def test_its_digest_pins_the_weights(rm_dir: Path, tmp_path: Path) -> None:
    made = entry(rm_dir)
    assert made["fn"] == REF and made["args"]["path"] == str(rm_dir.resolve())
    assert reward_model(**made["args"]).__name__ == "my-rm"
    import shutil

    moved = tmp_path / "rm"
    shutil.copytree(rm_dir, moved)
    model = AutoModelForSequenceClassification.from_pretrained(moved)
    with torch.no_grad():
        next(iter(model.parameters())).add_(1.0)
    model.save_pretrained(moved)
    with pytest.raises(ConfigError, match="its weights or config changed"):
        reward_model(str(moved), digest=made["args"]["digest"])


def test_the_python_api_takes_a_reward_model_directory(rm_dir: Path, tmp_path: Path) -> None:
    from freshroll import GRPOTrainer

    assert is_model_dir(str(rm_dir)) and not is_model_dir("reverse")
    trainer = GRPOTrainer(
        reward_funcs=["reverse", str(rm_dir)], reward_weights=[1.0, 0.5],
        output_dir=tmp_path / "run",
        args={"run": {"progress": False, "steps": 2}, "run.runtime": "inline",
              "task.n_prompts": 64,
              "rollout": {"group_size": 4, "batch_groups": 2, "max_new_tokens": 4}})
    fns = [(r.fn, r.weight) for r in trainer.config.rewards]
    assert fns == [("reverse", 1.0), (REF, 0.5)]
    result = trainer.train(stream=io.StringIO())
    assert result.ok
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("rewards/my-rm/mean" in r for r in rows) and len(rows) == 2

"""``trainer.lora``: only the adapters train, only they are published, and a worker's merge
is peft's own ``merge_and_unload``."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from freshroll.config import load_config
from freshroll.config.train import LoraSection, TrainerSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.lora_merge import SCALE_KEY, adapter_bytes, is_adapter, merge_state
from freshroll.engines.tiny import build_tiny
from freshroll.errors import ConfigError
from freshroll.runtime.resume import flatten, rule_of
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.lora import adapter_state, merged_copy, wrap
from freshroll.trainer.replay import weights_digest

LORA = LoraSection(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/trainer/conftest.py


def _learner(lora: LoraSection | None = LORA, lr: float = 1e-2) -> tuple[GRPOLearner, HFEngine]:
    model, tok = build_tiny(seed=3)
    engine = HFEngine(build_tiny(seed=3)[0], tok)
    net = model if lora is None else wrap(model, lora)
    cfg = TrainerSection(lr=lr, lora=lora)
    return GRPOLearner(net, cfg, temperature=1.0, pad_id=tok.pad_token_id,
                       max_new_tokens=5), engine


def _samples(engine: HFEngine) -> list[TrainSample]:
    comps = engine.generate(["rev 123=", "rev 98765=", "sort 31=", "rev 4="],
                            max_new_tokens=5, temperature=1.0, seed=7)
    return [TrainSample(c.prompt_token_ids, c.token_ids, c.logprobs, float(i % 2), i // 2, 0)
            for i, c in enumerate(comps)]


def test_config_bounds_and_unknown_keys() -> None:
    assert TrainerSection().lora is None
    assert TrainerSection(lora={}).lora == LoraSection()  # type: ignore[arg-type]
    for bad in ({"r": 0}, {"r": 2048}, {"dropout": 1.0}, {"target_modules": []}, {"rank": 4}):
        with pytest.raises(ValidationError):
            LoraSection(**bad)  # type: ignore[arg-type]


def test_a_target_matching_no_linear_layer_is_one_clear_error() -> None:
    model, _ = build_tiny()
    with pytest.raises(ConfigError, match=r"trainer\.lora\.target_modules: 'qkv' matches no "
                       r"linear layer.*down_proj, gate_proj, k_proj.*q_proj"):
        wrap(model, LoraSection(target_modules=["q_proj", "qkv"]))


def test_all_linear_puts_an_adapter_on_every_linear_layer_but_the_head() -> None:
    """Issue 48, item 10: peft's ``target_modules="all-linear"`` was refused."""
    lora = LoraSection(target_modules="all-linear")
    model = wrap(build_tiny()[0], lora)
    adapted = {k.split(".")[-2] for k in adapter_state(model) if k.endswith(".A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj"}
    assert not any("lm_head" in n for n, p in model.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match=r'trainer\.lora\.target_modules: expected a list or '
                       r'"all-linear" \(got "all"\)'):
        load_config(None, ["trainer.lora.target_modules=all"])


def test_the_adapters_dropout_is_applied() -> None:
    """``trainer.lora.dropout`` reached peft only in the skeleton check, never the learner's
    model (a type-ignore comment had swallowed the argument)."""
    model = wrap(build_tiny()[0], LoraSection(dropout=0.25))
    drops = [m.p for n, m in model.named_modules()
             if n.endswith("lora_dropout.default") and isinstance(m, torch.nn.Dropout)]
    assert drops and set(drops) == {0.25}


def test_changing_lora_on_resume_is_refused() -> None:
    assert "trainer.lora" in flatten({"trainer": {"lora": {"r": 4}}})
    assert rule_of("trainer.lora") == "never"


def test_the_adapters_init_is_fixed() -> None:
    torch.manual_seed(123)
    a = weights_digest(wrap(build_tiny(seed=3)[0], LORA))
    torch.manual_seed(456)
    assert weights_digest(wrap(build_tiny(seed=3)[0], LORA)) == a


def test_a_step_changes_only_the_adapters() -> None:
    learner, engine = _learner()
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.step(_samples(engine))
    assert metrics["grad_norm"] > 0
    after = learner.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_B." in k or ".lora_A." in k for k in changed)
    base = [k for k in before if "lora_" not in k]
    assert all(torch.equal(before[k], after[k]) for k in base)  # bit-identical
    # the optimizer holds the adapters alone: 3 modules x 2 layers x (A, B)
    assert len(learner.optimizer.state) == 12
    assert all(p.requires_grad == ("lora_" in n) for n, p in learner.model.named_parameters())


def test_only_the_adapter_is_published_and_it_is_much_smaller() -> None:
    learner, engine = _learner()
    full, _ = _learner(None)
    pub = learner.weights()
    assert is_adapter(pub) and not is_adapter(full.weights())
    assert len(pub) == 12 + 1 and float(pub[SCALE_KEY][0]) == pytest.approx(8 / 4)
    assert adapter_bytes(pub) * 10 < adapter_bytes(full.weights())
    metrics = learner.step(_samples(engine))
    assert metrics["weights_bytes"] == adapter_bytes(pub)


def test_the_engines_merge_is_peft_merge_and_unload() -> None:
    learner, engine = _learner()
    for _ in range(2):
        learner.step(_samples(engine))
    assert any(float(v.abs().max()) > 0 for k, v in learner.model.state_dict().items()
               if ".lora_B." in k)
    merged = merged_copy(learner.model).state_dict()
    engine.load_weights(learner.weights())
    got = engine.model.state_dict()
    assert set(got) == set(merged)
    for k in merged:
        torch.testing.assert_close(got[k], merged[k], rtol=0, atol=1e-6)
    # a second version merges into the kept base, not into the first merge
    learner.step(_samples(engine))
    engine.load_weights(learner.weights())
    merged = merged_copy(learner.model).state_dict()
    for k in merged:
        torch.testing.assert_close(engine.model.state_dict()[k], merged[k], rtol=0, atol=1e-6)
    # the driver-side merge (vLLM) is the same
    base = build_tiny(seed=3)[0].state_dict()
    for k, v in merge_state(base, learner.weights()).items():
        torch.testing.assert_close(v, merged[k], rtol=0, atol=1e-6)
    # and the merged weights give the trainer's logits
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        learner.model.eval()
        want = learner.model(input_ids=ids).logits
        torch.testing.assert_close(engine.model(input_ids=ids).logits, want, atol=1e-5, rtol=0)


def test_a_full_load_after_an_adapter_resets_the_base() -> None:
    learner, engine = _learner()
    learner.step(_samples(engine))
    engine.load_weights(learner.weights())
    fresh = build_tiny(seed=3)[0].state_dict()
    engine.load_weights(fresh)  # a full state dict: the new base
    assert not engine._merger.base
    assert weights_digest(engine.model) == weights_digest(build_tiny(seed=3)[0])


def test_the_checkpoint_state_is_the_adapter_and_restores_the_digest() -> None:
    learner, engine = _learner()
    learner.step(_samples(engine))
    state = learner.model_state()
    assert state and all("lora_" in k for k in state)
    other, _ = _learner()
    assert weights_digest(other.model) != weights_digest(learner.model)
    other.load_model_state(state)
    other.optimizer.load_state_dict(learner.optimizer.state_dict())
    assert weights_digest(other.model) == weights_digest(learner.model)
    with pytest.raises(ValueError, match=r"does not fit trainer\.lora"):
        other.load_model_state({k: v for k, v in list(state.items())[1:]})

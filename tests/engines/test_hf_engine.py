"""Tests for HFEngine: behaviour log-probs under left padding, sampling, stopping, weight swaps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from freshroll.engines.base import Completion, InferenceEngine
from freshroll.engines.hf import HFEngine, nucleus_logprobs
from freshroll.engines.tiny import CHARS, build_tiny, save_tiny
from freshroll.errors import ConfigError

# Different lengths (1 to 17 tokens), so left padding is exercised for every row but one.
PROMPTS = ["a", "rev 12=", "rev 12345 678=", "add 1+2+3+4+5+6+7=", "z:", "x|y"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Tiny per-step ops: extra intra-op threads only add sync cost (and spin if a core is busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _engine(seed: int = 0) -> HFEngine:
    model, tokenizer = build_tiny(seed=seed)
    return HFEngine(model, tokenizer)


def _teacher_forced(
    model: PreTrainedModel, c: Completion, temperature: float, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probs of ``c.token_ids`` from one unpadded forward pass over prompt + completion."""
    ids = torch.tensor([[*c.prompt_token_ids, *c.token_ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(c.prompt_token_ids) - 1
    step_logits = logits[start : start + len(c.token_ids)]
    logp = torch.log_softmax(step_logits / (temperature or 1.0), dim=-1)
    if top_p < 1.0:
        logp = nucleus_logprobs(logp, top_p)
    return logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)


def test_engine_satisfies_the_protocol() -> None:
    assert isinstance(_engine(), InferenceEngine)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_behaviour_logprobs_match_unpadded_teacher_forcing(
    temperature: float, top_p: float
) -> None:
    engine = _engine()
    out = engine.generate(
        PROMPTS, max_new_tokens=12, temperature=temperature, top_p=top_p, seed=11
    )
    assert len({len(c.prompt_token_ids) for c in out}) == len(PROMPTS)
    assert [len(c.prompt_token_ids) for c in out] == [len(p) for p in PROMPTS]
    for c in out:
        ref = _teacher_forced(engine.model, c, temperature, top_p)
        assert torch.isfinite(ref).all()
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=0)


def test_greedy_is_argmax_with_untempered_logprobs() -> None:
    engine = _engine()
    for c in engine.generate(PROMPTS, max_new_tokens=8, temperature=0.0):
        ids = torch.tensor([[*c.prompt_token_ids, *c.token_ids]])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0].float()
        start = len(c.prompt_token_ids) - 1
        step_logits = logits[start : start + len(c.token_ids)]
        assert list(c.token_ids) == step_logits.argmax(-1).tolist()
        torch.testing.assert_close(
            torch.tensor(c.logprobs), _teacher_forced(engine.model, c, 1.0), atol=1e-4, rtol=0
        )
        assert all(lp < 0 for lp in c.logprobs)  # not a point mass


def test_same_seed_same_tokens_different_seed_different() -> None:
    engine = _engine()
    prompts = [f"rev {i}=" for i in range(8)]
    a = engine.generate(prompts, max_new_tokens=16, seed=5)
    b = engine.generate(prompts, max_new_tokens=16, seed=5)
    c = engine.generate(prompts, max_new_tokens=16, seed=6)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.logprobs for x in a] == [x.logprobs for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_each_row_stops_at_its_own_eos() -> None:
    """Adding a token to the eos set truncates exactly the rows that emit it, nothing else."""
    model, tokenizer = build_tiny(seed=0)
    engine = HFEngine(model, tokenizer)
    before = engine.generate(PROMPTS, max_new_tokens=10, temperature=0.0)
    stop = before[0].token_ids[0]
    assert any(stop not in c.token_ids for c in before), "pick prompts with varied outputs"
    model.config.eos_token_id = [tokenizer.eos_token_id, stop]
    after = HFEngine(model, tokenizer).generate(PROMPTS, max_new_tokens=10, temperature=0.0)
    for old, new in zip(before, after, strict=True):
        if stop in old.token_ids:
            end = old.token_ids.index(stop) + 1
            assert new.token_ids == old.token_ids[:end]
            assert new.logprobs == pytest.approx(old.logprobs[:end], abs=1e-5)
            assert new.finish_reason == "stop"
            assert new.text == tokenizer.decode(list(old.token_ids[: end - 1]))
        else:
            assert new.token_ids == old.token_ids
            assert new.finish_reason == "length"


def test_sampled_completions_respect_limits_and_strip_special_tokens() -> None:
    engine = _engine()
    eos = engine.tokenizer.eos_token_id
    prompts = [f"rev {i}{i * 7}=" for i in range(16)]
    out = engine.generate(prompts, max_new_tokens=24, temperature=1.0, seed=0)
    assert len(out) == 16
    assert any(c.finish_reason == "stop" for c in out)
    for c in out:
        assert 1 <= len(c.token_ids) == len(c.logprobs) <= 24
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == eos)
        assert eos not in c.token_ids[:-1]
        if c.finish_reason == "length":
            assert len(c.token_ids) == 24
        assert set(c.text) <= set(CHARS)
        assert len(c.text) == sum(t >= 4 for t in c.token_ids)  # ids 0-3 are special
        assert c.gen_s == out[0].gen_s > 0
    assert all(len(c.token_ids) == 1 for c in engine.generate(prompts, max_new_tokens=1, seed=0))


def test_model_sees_real_positions_and_pad_after_eos() -> None:
    """Spy on the forward calls: positions count real tokens only; finished rows get masked pad.

    (Llama's RoPE is invariant to a constant position shift, so the log-prob test alone would
    not catch positions that ignore left padding; models with absolute positions would break.)
    """
    engine = _engine()
    calls: list[dict[str, torch.Tensor]] = []

    def spy(_module: object, _args: object, kwargs: dict[str, object]) -> None:
        names = ("input_ids", "attention_mask", "position_ids")
        tensors = {k: kwargs.get(k) for k in names}
        calls.append({k: v.clone() for k, v in tensors.items() if isinstance(v, torch.Tensor)})

    handle = engine.model.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        prompts = [f"rev {i}{i * 7}=" for i in range(16)]
        out = engine.generate(prompts, max_new_tokens=24, seed=0)
    finally:
        handle.remove()
    prefill, steps = calls[0], calls[1:]
    assert len(steps) == max(len(c.token_ids) for c in out) - 1
    for row, c in enumerate(out):
        n = len(c.prompt_token_ids)
        real = prefill["attention_mask"][row].bool()
        assert prefill["position_ids"][row][real].tolist() == list(range(n))
        assert prefill["input_ids"][row][real].tolist() == list(c.prompt_token_ids)
        for k, call in enumerate(steps, start=1):
            assert call["position_ids"][row, 0].item() == n + k - 1
            fed_real = k <= len(c.token_ids)
            assert call["attention_mask"][row, -1].item() == int(fed_real)
            expected = c.token_ids[k - 1] if fed_real else engine.pad_id
            assert call["input_ids"][row, 0].item() == expected
    assert any(len(c.token_ids) < len(steps) for c in out), "some row must finish early"


def test_load_weights_changes_outputs_and_state_dict_round_trips() -> None:
    engine = _engine(seed=0)
    original = engine.state_dict()
    greedy0 = engine.generate(PROMPTS, max_new_tokens=8, temperature=0.0)
    other_model, _ = build_tiny(seed=1)
    reference = HFEngine(other_model, engine.tokenizer).generate(
        PROMPTS, max_new_tokens=8, temperature=0.0
    )

    seconds = engine.load_weights(other_model.state_dict())
    assert isinstance(seconds, float) and seconds >= 0
    greedy1 = engine.generate(PROMPTS, max_new_tokens=8, temperature=0.0)
    assert [c.logprobs for c in greedy1] != [c.logprobs for c in greedy0]
    assert [c.token_ids for c in greedy1] == [c.token_ids for c in reference]

    engine.load_weights(original)
    restored = engine.generate(PROMPTS, max_new_tokens=8, temperature=0.0)
    assert [c.token_ids for c in restored] == [c.token_ids for c in greedy0]
    assert [c.logprobs for c in restored] == [c.logprobs for c in greedy0]


def test_state_dict_is_a_detached_copy() -> None:
    engine = _engine()
    sd = engine.state_dict()
    assert set(sd) == set(engine.model.state_dict())
    sd["model.norm.weight"].add_(1.0)
    assert not torch.equal(sd["model.norm.weight"], engine.model.model.norm.weight)
    assert all(not t.requires_grad for t in sd.values())


def test_load_weights_is_strict() -> None:
    engine = _engine()
    sd = engine.state_dict()
    del sd["model.norm.weight"]
    with pytest.raises(RuntimeError, match=r"model\.norm\.weight"):
        engine.load_weights(sd)


def test_from_pretrained_matches_in_memory_model(tmp_path: Path) -> None:
    path = save_tiny(tmp_path / "tiny", seed=3)
    loaded = HFEngine.from_pretrained(path)
    direct = HFEngine(*build_tiny(seed=3))
    a = loaded.generate(PROMPTS, max_new_tokens=8, seed=1)
    b = direct.generate(PROMPTS, max_new_tokens=8, seed=1)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.text for c in a] == [c.text for c in b]
    assert HFEngine.from_pretrained(path, dtype=torch.bfloat16).model.dtype == torch.bfloat16


def test_from_pretrained_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="no-such-model"):
        HFEngine.from_pretrained(missing)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"empty-model.*config\.json"):
        HFEngine.from_pretrained(empty)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_new_tokens": 0}, {"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float]) -> None:
    settings: dict[str, float] = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ConfigError):
        _engine().generate(["a"], **settings)  # type: ignore[arg-type]


def test_empty_batch_and_empty_prompt() -> None:
    engine = _engine()
    assert engine.generate([], max_new_tokens=4) == []
    (c,) = engine.generate([""], max_new_tokens=4, seed=0)
    assert c.prompt_token_ids == (engine.tokenizer.bos_token_id,)


def test_nucleus_keeps_smallest_prefix_reaching_top_p() -> None:
    logp = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    kept = nucleus_logprobs(logp, 0.75).exp()
    torch.testing.assert_close(kept, torch.tensor([[0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]]))
    only_top = nucleus_logprobs(logp, 0.45).exp()
    torch.testing.assert_close(only_top, torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(nucleus_logprobs(logp, 1.0).exp(), logp.exp())


def test_engines_loaded_from_several_threads_at_once_are_all_whole(tmp_path: Path) -> None:
    """Inline workers start together, each loading the model in its own thread: transformers'
    loaders patch process-wide state (meta-device init), so unserialised loads raced (CI:
    "Cannot copy out of meta tensor"; or, silently, a tied ``lm_head`` left newly initialised).
    Every engine must hold exactly the saved weights."""
    import threading

    path = save_tiny(tmp_path / "m")
    want = HFEngine.from_pretrained(path).state_dict()
    engines: list[HFEngine] = []
    errors: list[BaseException] = []

    def load() -> None:
        for _ in range(3):
            try:
                engines.append(HFEngine.from_pretrained(path))
            except BaseException as exc:  # collected: a thread's failure must fail the test
                errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(engines) == 12
    for engine in engines:
        got = engine.state_dict()
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_calls_rows_that_share_a_prompt_encode_it_once() -> None:
    """A group's rows carry one prompt: it is encoded once per call, and every row gets the
    same ids, left-padded as an encode per row would give them."""
    engine = _engine()
    calls: list[str] = []
    encode = engine.tokenizer.encode

    def counting(text: str, *args: object, **kwargs: object) -> list[int]:
        calls.append(text)
        return list(encode(text, *args, **kwargs))

    engine.tokenizer.encode = counting
    prompts = [p for p in PROMPTS[:3] for _ in range(4)]
    out = engine.generate(prompts, max_new_tokens=3, seed=5)
    assert sorted(calls) == sorted(PROMPTS[:3])
    assert [c.prompt_token_ids for c in out] == [tuple(encode(p)) for p in prompts]
    ids, mask = engine._left_pad([list(encode(p)) for p in PROMPTS])
    width = max(len(encode(p)) for p in PROMPTS)
    for row, p in enumerate(PROMPTS):
        n = len(encode(p))
        assert ids[row, width - n:].tolist() == list(encode(p))
        assert set(ids[row, : width - n].tolist()) <= {engine.pad_id}
        assert mask[row].tolist() == [0] * (width - n) + [1] * n

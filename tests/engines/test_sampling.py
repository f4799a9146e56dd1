"""TRL's sampling knobs in the HF engine (:mod:`freshroll.engines.sampling`): ``top_k``,
``min_p`` and ``repetition_penalty``, against transformers' own logits processors (what TRL's
HF generation path applies, in ``generate``'s order), and through a real engine call."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from freshroll.engines.hf import HFEngine, sample_next
from freshroll.engines.sampling import Cuts, seen_tokens
from freshroll.errors import ConfigError

VOCAB = 50


def _hf_logp(logits: torch.Tensor, ids: torch.Tensor, temperature: float, top_k: int,
             top_p: float, min_p: float, penalty: float) -> torch.Tensor:
    procs = LogitsProcessorList()
    if penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(penalty))
    procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p:
        procs.append(MinPLogitsWarper(min_p))
    return torch.log_softmax(procs(ids, logits.clone()), dim=-1)


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p", "penalty"), [
    (1.0, 5, 1.0, 0.0, 1.0), (0.7, 0, 1.0, 0.1, 1.0), (1.0, 0, 1.0, 0.0, 1.3),
    (0.9, 10, 1.0, 0.05, 1.2), (1.0, 3, 1.0, 0.0, 0.8), (1.0, 8, 0.8, 0.05, 1.1),
])
def test_the_distribution_is_transformers(temperature: float, top_k: int, top_p: float,
                                          min_p: float, penalty: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB) * 3
    ids = torch.randint(0, VOCAB, (4, 7))
    seen = seen_tokens(ids.tolist(), VOCAB, torch.device("cpu"))
    theirs = _hf_logp(logits, ids, temperature, top_k, top_p, min_p, penalty)
    gen = torch.Generator().manual_seed(1)
    cuts = Cuts(top_k, min_p, penalty)
    for _ in range(20):  # every token it draws is one transformers keeps, at its log-prob
        tok, lp = sample_next(logits, temperature, top_p, gen, cuts,
                              seen if cuts.penalises else None)
        want = theirs.gather(-1, tok[:, None]).squeeze(-1)
        assert torch.isfinite(want).all()
        torch.testing.assert_close(lp, want, atol=1e-5, rtol=1e-5)
    kept = torch.isfinite(theirs)
    if top_k:
        assert (kept.sum(-1) <= max(top_k, 1) + 1).all()  # the cut is load-bearing


def test_bad_knobs_are_refused() -> None:
    for kw in ({"top_k": -1}, {"min_p": 1.5}, {"repetition_penalty": 0.0}):
        with pytest.raises(ConfigError):
            Cuts(**kw)


def test_the_engine_samples_within_top_k_and_reports_its_logprobs() -> None:
    from freshroll.engines.tiny import build_tiny

    model, tokenizer = build_tiny(1)
    engine = HFEngine(model, tokenizer, device="cpu")
    plain = engine.generate(["rev 123="] * 4, max_new_tokens=6, seed=3)
    cut = engine.generate(["rev 123="] * 4, max_new_tokens=6, seed=3, top_k=1)
    assert [c.token_ids for c in cut] == [cut[0].token_ids] * 4  # k=1: one path
    assert all(lp == pytest.approx(0.0, abs=1e-6) for c in cut for lp in c.logprobs)
    assert any(lp < -1e-3 for c in plain for lp in c.logprobs)
    penalised = engine.generate(["rev 123="] * 2, max_new_tokens=6, seed=3,
                                repetition_penalty=100.0, top_k=1)
    for c in penalised:  # a huge penalty on what the row holds: no completion token repeats
        body = [t for t in c.token_ids if t not in engine.eos_ids]
        assert len(body) == len(set(body))

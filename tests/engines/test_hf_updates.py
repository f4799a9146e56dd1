"""rollout.on_update on the HF engine: a weight load between two decode steps of a running
call (continue: later tokens from the new weights, each token's log-prob from the weights
that sampled it, Completion.version_spans; abort: Superseded), and through the thread
adapter and the worker pool, recorded in the ledger and checked by verify."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from freshroll.config import load_config
from freshroll.engines import payload as pl
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import build_tiny
from freshroll.errors import Superseded
from freshroll.figures.off_policy import LAG_BUCKETS
from freshroll.harness.verify import verify_run
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger

PROMPTS = ["rev 12=", "add 1+2=", "z:", "sort 3 1 2="]
SWAP_AT = 3  # the load comes between decode steps 3 and 4: tokens 0..3 are the old weights'


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _generate(mode: str | None, load: bool) -> list:
    model, tok = build_tiny(seed=0)
    engine = HFEngine(model, tok)
    engine.on_update = mode
    other = {k: v + 0.05 * torch.randn_like(v)
             for k, v in build_tiny(seed=1)[0].state_dict().items()}

    def between(step: int) -> None:
        if load and step == SWAP_AT:
            engine.load_weights(other)

    engine.between_steps = between
    return engine.generate(PROMPTS, max_new_tokens=16, temperature=1.0, seed=7)


def test_continue_swaps_between_steps_and_each_token_keeps_its_weights_logprob() -> None:
    base = _generate("continue", load=False)
    swapped = _generate("continue", load=True)
    long = [(b, s) for b, s in zip(base, swapped, strict=True) if len(s.token_ids) > SWAP_AT + 1]
    assert long, "no completion outlived the swap"
    for b, s in long:
        assert s.version_spans == ((0, SWAP_AT + 1), (1, len(s.token_ids) - SWAP_AT - 1))
        assert b.version_spans == ((0, len(b.token_ids)),)  # one weight set, said anyway
        # the same seed: the old weights' tokens and log-probs are the unswapped run's
        assert s.token_ids[:SWAP_AT + 1] == b.token_ids[:SWAP_AT + 1]
        assert s.logprobs[:SWAP_AT + 1] == pytest.approx(b.logprobs[:SWAP_AT + 1])
    # the new weights' log-probs are not the old ones' (first token after the swap)
    assert any(s.logprobs[SWAP_AT + 1] != pytest.approx(b.logprobs[SWAP_AT + 1], abs=1e-6)
               for b, s in long)


def test_no_in_flight_mode_reports_no_spans() -> None:
    assert all(c.version_spans == () for c in _generate(None, load=False))


def test_abort_ends_the_call_superseded_at_its_next_step() -> None:
    with pytest.raises(Superseded):
        _generate("abort", load=True)


@pytest.mark.slow  # a real run of the embedded model: make test runs it
def test_a_continue_run_on_the_embedded_model_verifies(tmp_path: Path) -> None:
    """The worker pool loads each new version beside a running lock-step call; whatever the
    timing, every spanning sample's ranges are in its payload and verify holds."""
    from freshroll.runtime import run as run_mod

    out = tmp_path / "run"
    cfg = load_config(None, ["run.steps=3", "run.progress=false", "run.max_staleness=2",
                             "rollout.on_update=continue", "run.staleness_basis=newest_token",
                             "rollout.batch_groups=2", "rollout.group_size=2",
                             "rollout.max_new_tokens=24", "run.runtime=inline"])
    run_mod.run(cfg, out, stream=io.StringIO())
    report = verify_run(out)
    assert report.ok, report.violations
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        for _, e in ledger.events():
            if isinstance(e, ev.Generated) and e.token_versions:
                data = ledger.payload(e.sample)
                assert data is not None
                assert [tuple(r) for r in pl.decode(data).versions] == \
                    [tuple(r) for r in e.token_versions]
    # the learner's mismatch KL and importance weights per token-lag bucket: its token counts
    # are the ledger's (each token's lag from its payload range), and tokens of an older
    # version than the consuming step's were trained on
    summary = json.loads((out / "summary.json").read_text())
    ledger_tokens = summary["token_lag"]["tokens_by_lag"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    learner_tokens = {b: sum(r.get(f"tokens/lag_{b}", 0) for r in rows) for b in LAG_BUCKETS}
    assert {b: n for b, n in learner_tokens.items() if n} == ledger_tokens
    by_lag = summary["off_policy"]["by_lag"]
    older = [b for b in LAG_BUCKETS if b != "0" and by_lag[b] is not None]
    assert older and all(by_lag[b]["tokens"] > 0 and by_lag[b]["mismatch_kl_mean"] >= 0
                         for b in older), by_lag
    assert all((by_lag[b] is None) == (b not in ledger_tokens) for b in LAG_BUCKETS)

"""The engine conformance suite: the rules every real engine behind the async seam obeys.

One set of rules, written against :class:`freshroll.engines.seams.AsyncEngine` only
(``generate(requests, params, seed, emit)``, ``load_weights``, ``cancel``, ``close``), run on
every model engine: an engine's test module subclasses :class:`Conformance` and provides a
module-scoped ``eut`` fixture, an :class:`EngineUnderTest` (the engine, started once, on an
event loop of its own that lives as long as the module, and what the suite needs to know
about it). A third engine is one more such module (the sim engine is a latency model, not a
model: it has no log-probs to check and is not run here).

The rules (each a test):

* **shape**: one completion emitted per request, each index exactly once, on the loop's
  thread; ``1 <= len(token_ids) == len(logprobs) <= max_new_tokens``; log-probs finite and
  ``<= 0``; ``finish_reason`` is ``"stop"`` exactly when the last token is an eos id (and no
  eos comes earlier), else ``"length"``; ``text`` decodes the tokens without special tokens;
  ``prompt_token_ids`` is the tokenizer's encoding of the prompt.
* **log-probs**: each reported log-prob equals, within the engine's ``logprob_tol``, the
  teacher-forced log-prob of the same token under the same weights (transformers, float32)
  of ``softmax(logits / T)``, truncated to the top-p nucleus and renormalised when
  ``top_p < 1`` (an oracle of its own: it shares no code with freshroll's sampler). The
  mismatch KL (the trainer's k3 estimator, ``mean exp(p - b) - (p - b) - 1`` with ``p`` the
  teacher-forced and ``b`` the engine's log-prob) is bounded too.
* **stats** (engines that report them, :class:`~freshroll.engines.seams.ReportsStats`):
  after a call, an :class:`~freshroll.engines.seams.EngineStats` with sane figures.
* **seeds**: the same seed and requests give the same tokens; another seed changes some.
* **weights**: loading other weights of the same shape changes the outputs of one seed, and
  the engine's log-probs then match the new weights; loading the original back gives the
  first outputs again; ``load_weights`` returns seconds > 0.
* **cancel**: requests cancelled while a call runs are never emitted, the others are, and
  the call returns; cancelling unknown samples is harmless; the engine goes on working.
* **errors**: a prompt longer than the model's max positions fails the call with an
  ordinary exception (not :class:`~freshroll.errors.WorkerLost`), never emits that request,
  and the engine goes on working (an engine with ``isolates_bad_requests`` also emits the
  call's good requests first); when the engine's process dies (the module's ``kill``: a
  crash behind the engine's back) the call in flight and the next one raise ``WorkerLost``,
  and ``close`` still works. That rule runs last; a later test would start a fresh engine.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from freshroll.engines.base import FINISH_LENGTH, FINISH_STOP, Completion
from freshroll.engines.seams import (
    AsyncEngine,
    EngineStats,
    GenRequest,
    ReportsStats,
    SamplingParams,
)
from freshroll.engines.tiny import build_tiny, save_tiny
from freshroll.errors import RetryableError, Superseded, WorkerLost

T = TypeVar("T")

#: the tiny model every engine here can run: head_dim 32 (vLLM's CPU backend refuses 16)
TINY_SHAPE: dict[str, Any] = {"num_attention_heads": 2, "num_key_value_heads": 2}
PROMPTS = ("rev 123=", "add 4+5=", "hello world", "a", "sort 3,1,2:", "x*y=", "q", "99-7=")
CALL_TIMEOUT_S = 120.0  # one generate call, at most (a wedged engine fails, never hangs)


def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, seed: int = 0) -> Path:
    """A saved tiny model of :data:`TINY_SHAPE` in a fresh temporary directory."""
    return save_tiny(tmp_path_factory.mktemp("conformance") / "tiny", seed, **TINY_SHAPE)


class Reference:
    """The oracle: the saved model in transformers, float32, scored by teacher forcing."""

    def __init__(self, path: Path) -> None:
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch.float32)
        self.model.eval()
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, self.model.config.eos_token_id):
            ids.update(source if isinstance(source, list | tuple) else
                       [] if source is None else [source])
        self.eos_ids = frozenset(int(i) for i in ids)
        self.max_positions = int(self.model.config.max_position_embeddings)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def other_weights(self, seed: int) -> dict[str, torch.Tensor]:
        """The weights of a differently seeded tiny model of the same shape."""
        model, _ = build_tiny(seed, **TINY_SHAPE)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    @contextmanager
    def weights(self, state: Mapping[str, torch.Tensor]) -> Iterator[None]:
        """Score under ``state`` for a while, then the saved weights again."""
        saved = self.state_dict()
        self.model.load_state_dict(dict(state), strict=True)
        try:
            yield
        finally:
            self.model.load_state_dict(saved, strict=True)

    @torch.no_grad()
    def logprobs(self, comp: Completion, temperature: float, top_p: float) -> list[float]:
        """Teacher-forced log-prob of each generated token under the sampled distribution."""
        prompt, gen = list(comp.prompt_token_ids), list(comp.token_ids)
        ids = torch.tensor([prompt + gen])
        logits = self.model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) + len(gen) - 1]
        logp = torch.log_softmax(logits.double() / temperature, dim=-1)
        if top_p < 1.0:
            logp = _nucleus(logp, top_p)
        return [float(logp[i, t]) for i, t in enumerate(gen)]


def _nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep, per row, the most likely tokens until their mass reaches ``top_p`` (at least
    one), drop the rest (``-inf``), renormalise."""
    out = torch.full_like(logp, float("-inf"))
    for row in range(logp.shape[0]):
        order = sorted(range(logp.shape[1]), key=lambda j: -float(logp[row, j]))
        mass, keep = 0.0, []
        for j in order:
            keep.append(j)
            mass += math.exp(float(logp[row, j]))
            if mass >= top_p:
                break
        kept = logp[row, keep]
        out[row, keep] = kept - torch.logsumexp(kept, dim=0)
    return out


@dataclass
class EngineUnderTest:
    """One engine for the suite, with what the rules need to know about it."""

    name: str
    loop: asyncio.AbstractEventLoop  # the engine's loop: every call runs on it
    start: Callable[[], Awaitable[AsyncEngine]]  # a fresh engine (also after a kill)
    reference: Reference
    logprob_tol: float  # max |engine - teacher-forced| log-prob per token
    mismatch_kl_tol: float  # max mismatch KL of one call
    kill: Callable[[AsyncEngine], Awaitable[None]] | None = None  # its process dies
    no_kill_reason: str = ""  # why there is no kill (the rule is then skipped)
    isolates_bad_requests: bool = False  # a bad request fails only itself
    engine: AsyncEngine | None = None
    dead: bool = False
    measured: dict[str, float] = field(default_factory=dict)  # figures the rules saw

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def live(self) -> AsyncEngine:
        """The engine, (re)started if a kill left it dead."""
        if self.engine is None or self.dead:
            if self.engine is not None:
                self.run(self.engine.close())
            self.engine = self.run(self.start())
            self.dead = False
        return self.engine

    def close(self) -> None:
        try:
            if self.engine is not None:
                self.run(self.engine.close())
        finally:
            self.loop.close()


@contextmanager
def engine_under_test(**kw: Any) -> Iterator[EngineUnderTest]:
    """An :class:`EngineUnderTest` on a new event loop, started now, closed at the end."""
    eut = EngineUnderTest(loop=asyncio.new_event_loop(), **kw)
    try:
        eut.live()
        yield eut
    finally:
        eut.close()
        if eut.measured:
            print(f"\n[conformance {eut.name}] " + ", ".join(
                f"{k}={v:.3g}" for k, v in sorted(eut.measured.items())))


def requests(n: int, tag: str, texts: Sequence[str] = PROMPTS) -> list[GenRequest]:
    return [GenRequest(f"{tag}{i}.0#0", f"{tag}{i}", f"p{i}", texts[i % len(texts)], 0)
            for i in range(n)]


class Emitted:
    """An ``emit`` that records completions and every breach of the emit contract."""

    def __init__(self, loop_thread: int) -> None:
        self.thread = loop_thread
        self.by_index: dict[int, Completion] = {}
        self.order: list[int] = []
        self.problems: list[str] = []

    def __call__(self, i: int, comp: Completion) -> None:
        if threading.get_ident() != self.thread:
            self.problems.append(f"request {i} emitted off the event loop's thread")
        if i in self.by_index:
            self.problems.append(f"request {i} emitted twice")
        self.by_index[i] = comp
        self.order.append(i)


async def _generate(engine: AsyncEngine, reqs: Sequence[GenRequest], params: SamplingParams,
                    seed: int, emitted: Emitted) -> None:
    async with asyncio.timeout(CALL_TIMEOUT_S):
        await engine.generate(reqs, params, seed, emitted)


def generate(eut: EngineUnderTest, reqs: Sequence[GenRequest], params: SamplingParams,
             seed: int) -> list[Completion]:
    """One call; every request emitted exactly once, on the loop: the completions in order."""
    emitted = Emitted(threading.get_ident())
    eut.run(_generate(eut.live(), reqs, params, seed, emitted))
    assert not emitted.problems, emitted.problems
    assert sorted(emitted.by_index) == list(range(len(reqs))), sorted(emitted.by_index)
    return [emitted.by_index[i] for i in range(len(reqs))]


def logprob_gap(eut: EngineUnderTest, comps: Sequence[Completion], params: SamplingParams,
                key: str) -> tuple[float, float]:
    """(max abs diff, mismatch KL) of the engine's log-probs against teacher forcing."""
    diffs: list[float] = []
    k3: list[float] = []
    for comp in comps:
        ref = eut.reference.logprobs(comp, params.temperature, params.top_p)
        for b, p in zip(comp.logprobs, ref, strict=True):
            diffs.append(abs(b - p) if math.isfinite(p) else math.inf)
            d = p - b
            k3.append(math.exp(d) - d - 1.0 if math.isfinite(p) else math.inf)
    assert diffs, "no tokens to compare"
    gap, kl = max(diffs), sum(k3) / len(k3)
    eut.measured[f"{key}_max_abs_diff"] = gap
    eut.measured[f"{key}_mismatch_kl"] = kl
    return gap, kl


def tokens(comps: Sequence[Completion]) -> list[tuple[int, ...]]:
    return [c.token_ids for c in comps]


class Conformance:
    """The rules; a test module subclasses this (``class TestX(Conformance)``) and provides
    a module-scoped ``eut`` fixture. The dead-engine rule is last (methods run in order)."""

    def test_one_completion_per_request_with_consistent_fields(self, eut: EngineUnderTest):
        params = SamplingParams(max_new_tokens=24, temperature=1.0)
        reqs = requests(24, "shape")
        comps = generate(eut, reqs, params, seed=1)
        tok, eos = eut.reference.tokenizer, eut.reference.eos_ids
        for req, c in zip(reqs, comps, strict=True):
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= params.max_new_tokens, c
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in c.logprobs), c.logprobs
            assert c.prompt_token_ids == tuple(tok.encode(req.text)), (req.text, c)
            assert not eos & set(c.token_ids[:-1]), f"generation went on past an eos: {c}"
            stopped = c.token_ids[-1] in eos
            assert c.finish_reason == (FINISH_STOP if stopped else FINISH_LENGTH), c
            visible = list(c.token_ids[:-1] if stopped else c.token_ids)
            assert c.text == tok.decode(visible, skip_special_tokens=True), c
            assert math.isfinite(c.gen_s) and c.gen_s >= 0.0
        reasons = {c.finish_reason for c in comps}
        assert reasons == {FINISH_STOP, FINISH_LENGTH}, f"both reasons expected: {reasons}"

    def test_stats_when_reported(self, eut: EngineUnderTest):
        engine = eut.live()
        if not isinstance(engine, ReportsStats):
            pytest.skip(f"the {eut.name} engine reports no stats (optional)")
        generate(eut, requests(8, "stats"), SamplingParams(max_new_tokens=8), seed=9)
        stats = engine.stats()
        assert isinstance(stats, EngineStats), stats  # seen after a call
        assert stats.running >= 0 and stats.waiting >= 0 and stats.preemptions >= 0, stats
        assert 0.0 <= stats.kv_cache_usage <= 1.0, stats

    @pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
    def test_logprobs_match_teacher_forcing(self, eut: EngineUnderTest, temperature: float,
                                            top_p: float):
        params = SamplingParams(max_new_tokens=16, temperature=temperature, top_p=top_p)
        comps = generate(eut, requests(16, "lp"), params, seed=2)
        gap, kl = logprob_gap(eut, comps, params, f"T{temperature}_p{top_p}")
        assert gap <= eut.logprob_tol, f"max |engine - teacher forcing| = {gap:.3g}"
        assert kl <= eut.mismatch_kl_tol, f"mismatch KL = {kl:.3g}"

    def test_same_seed_same_tokens_other_seed_other_tokens(self, eut: EngineUnderTest):
        params = SamplingParams(max_new_tokens=16, temperature=1.0)
        reqs = requests(8, "seed")
        first = tokens(generate(eut, reqs, params, seed=7))
        assert tokens(generate(eut, reqs, params, seed=7)) == first
        other = tokens(generate(eut, reqs, params, seed=8))
        assert other != first, "another seed gave the very same tokens for every request"

    def test_weight_update_changes_outputs_and_back(self, eut: EngineUnderTest):
        # sampled at T=1 under one seed, not greedy: greedy decoding of the tied tiny model
        # repeats the prompt's last character under any random weights
        params = SamplingParams(max_new_tokens=16, temperature=1.0)
        reqs, ref = requests(8, "w"), eut.reference
        original, other = ref.state_dict(), ref.other_weights(seed=1)
        engine = eut.live()
        base = tokens(generate(eut, reqs, params, seed=3))
        try:
            secs = eut.run(engine.load_weights(other))
            assert math.isfinite(secs) and secs > 0.0, secs
            eut.measured["load_weights_s"] = secs
            changed = generate(eut, reqs, params, seed=3)
            assert tokens(changed) != base, "outputs did not change with new weights"
            with ref.weights(other):
                gap, _ = logprob_gap(eut, changed, params, "new_weights")
            assert gap <= eut.logprob_tol, f"log-probs do not follow the new weights: {gap:.3g}"
        finally:
            secs = eut.run(engine.load_weights(original))
        assert math.isfinite(secs) and secs > 0.0, secs
        assert tokens(generate(eut, reqs, params, seed=3)) == base

    def test_cancelled_requests_are_never_emitted(self, eut: EngineUnderTest):
        params = SamplingParams(max_new_tokens=100, temperature=1.0)
        reqs = requests(12, "cut")
        engine = eut.live()
        emitted = Emitted(threading.get_ident())
        cut: list[int] = []

        async def scenario() -> None:
            call = asyncio.ensure_future(_generate(engine, reqs, params, 4, emitted))
            await asyncio.sleep(0.02)  # under way: nothing of 12 x 100 tokens can be done
            cut.extend(i for i in range(4, len(reqs)) if i not in emitted.by_index)
            seen = len(emitted.order)
            eut.measured["cancelled_in_flight"] = len(cut)
            await engine.cancel([reqs[i].sample for i in cut])
            await engine.cancel(["never.0#0"])  # unknown: harmless
            await call  # the call returns although some requests were never emitted
            late = set(emitted.order[seen:]) & set(cut)
            assert not late, f"cancelled requests emitted: {sorted(late)}"

        eut.run(scenario())
        assert cut, "every request finished within 20 ms: nothing was left to cancel"
        assert not emitted.problems, emitted.problems
        assert set(range(4)) <= set(emitted.by_index), sorted(emitted.by_index)
        assert not set(cut) & set(emitted.by_index)
        generate(eut, requests(4, "after-cut"), SamplingParams(max_new_tokens=4), seed=4)

    def test_bad_request_fails_the_call_not_the_engine(self, eut: EngineUnderTest):
        params = SamplingParams(max_new_tokens=4, temperature=1.0)
        long = "a" * (2 * eut.reference.max_positions)
        reqs = requests(4, "bad", texts=(PROMPTS[0], long, PROMPTS[1], PROMPTS[2]))
        emitted = Emitted(threading.get_ident())
        with pytest.raises(Exception) as info:
            eut.run(_generate(eut.live(), reqs, params, 5, emitted))
        assert not isinstance(info.value, RetryableError | Superseded), info.value
        assert not isinstance(info.value, TimeoutError), "the call hung"
        assert 1 not in emitted.by_index and not emitted.problems, emitted.problems
        if eut.isolates_bad_requests:
            assert sorted(emitted.by_index) == [0, 2, 3], sorted(emitted.by_index)
        generate(eut, requests(4, "after-bad"), params, seed=5)  # the engine goes on

    def test_dead_engine_raises_worker_lost(self, eut: EngineUnderTest):
        if eut.kill is None:
            pytest.skip(eut.no_kill_reason)
        kill = eut.kill
        engine = eut.live()
        params = SamplingParams(max_new_tokens=100, temperature=1.0)
        emitted = Emitted(threading.get_ident())

        async def scenario() -> None:
            call = asyncio.ensure_future(_generate(engine, requests(8, "dying"), params, 6,
                                                   emitted))
            await asyncio.sleep(0.05)
            finished = call.done()
            eut.measured["killed_in_flight"] = float(not finished)
            await kill(engine)
            if finished:  # too fast to be caught: then only the next call is checked
                await call
            else:
                with pytest.raises(WorkerLost):
                    await call  # the call in flight
            with pytest.raises(WorkerLost):
                await _generate(engine, requests(2, "dead"), SamplingParams(max_new_tokens=2),
                                6, Emitted(threading.get_ident()))
            await engine.close()
            await engine.close()  # idempotent, also on a dead engine

        eut.dead = True  # whatever happens next, a later test gets a fresh engine
        eut.run(scenario())
        assert not emitted.problems, emitted.problems

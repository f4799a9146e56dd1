"""rollout.on_update on the simulated engine: where the swap comes, what it costs (continue:
running sequences re-prefill), and the tokens each weight set made (Completion.version_spans)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from freshroll.clock import VirtualClock
from freshroll.engines.base import Completion
from freshroll.engines.seams import GenRequest, SamplingParams
from freshroll.errors import Superseded
from freshroll.sim.engine import SimEngine
from freshroll.sim.keyed import KeyedDraws
from freshroll.sim.profiles import P2, ServerModel

PROFILE = replace(P2, lengths=replace(P2.lengths, median_tokens=200.0),
                  server=ServerModel(step_s=0.02, step_s_per_seq=0.005,
                                     prefill_s_per_token=1e-3, max_concurrent=4))
REQS = [GenRequest(f"g0.{i}#1", "g0", "p0", "", 0) for i in range(3)]


def run(mode: str | None, load_at: float = 0.5) -> tuple[dict[str, Completion], float,
                                                          BaseException | None]:
    """Three requests at t=0, a weight load at ``load_at``: the completions, when the load
    returned, and what the generate call raised."""
    engine = SimEngine("w0", KeyedDraws(PROFILE, seed=1), on_update=mode)
    out: dict[str, Completion] = {}
    clock = VirtualClock()

    async def main() -> tuple[float, BaseException | None]:
        gen = asyncio.ensure_future(engine.generate(
            REQS, SamplingParams(1), 0, lambda i, c: out.__setitem__(REQS[i].sample, c)))
        await asyncio.sleep(load_at)
        await engine.load_weights("v1")
        loaded = clock.now()
        try:
            await gen
        except Superseded as exc:
            return loaded, exc
        return loaded, None

    loaded, raised = clock.run(main())
    return out, loaded, raised


def test_continue_splits_each_running_request_at_the_swap_and_re_prefill_costs_time() -> None:
    free, _, _ = run(None)
    cont, loaded, raised = run("continue")
    assert raised is None and loaded == pytest.approx(0.5) and set(cont) == set(free)
    for sample, c in cont.items():
        (k0, n0), (k1, n1) = c.version_spans
        assert (k0, k1) == (0, 1) and n0 > 0 and n1 > 0 and n0 + n1 == c.tokens
        assert free[sample].version_spans == c.version_spans  # the same tokens by the swap
        assert c.gen_s > free[sample].gen_s  # the re-prefill of prompt + the tokens made


def test_a_request_that_ends_before_the_swap_reports_no_spans() -> None:
    out, _, _ = run("continue", load_at=1e6)
    assert all(c.version_spans == () for c in out.values())


def test_finish_waits_for_the_running_requests_then_swaps() -> None:
    out, loaded, raised = run("finish")
    assert raised is None
    assert all(c.version_spans == () for c in out.values())
    assert loaded == pytest.approx(max(c.gen_s for c in out.values()))


def test_abort_ends_the_open_requests_superseded() -> None:
    out, loaded, raised = run("abort")
    assert isinstance(raised, Superseded) and out == {} and loaded == pytest.approx(0.5)

"""tools.latency (freshroll.envs.latency): the distribution by its median and p99, its
bounds, seeded draws per request, and the asyncio sleep it puts before a tool's answer."""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest
from pydantic import ValidationError

from freshroll.config import load_config
from freshroll.config.rollout import ToolLatency, ToolsSection
from freshroll.envs.latency import Lognormal, call_rng, latency_of, sigma_for
from freshroll.errors import ConfigError


def test_the_lognormal_puts_its_median_and_p99_where_asked() -> None:
    lat = latency_of(ToolsSection(latency=ToolLatency(dist="lognormal", median_s=0.05,
                                                      p99_s=1.0)))
    assert lat.median == 0.05
    assert lat.quantile(0.5) == pytest.approx(0.05)
    assert lat.quantile(0.99) == pytest.approx(1.0)
    draws = sorted(lat.draw(call_rng(7, f"g{i}.0#1", 0)) for i in range(4000))
    assert statistics.median(draws) == pytest.approx(0.05, rel=0.1)
    assert draws[int(0.99 * len(draws))] == pytest.approx(1.0, rel=0.35)
    assert all(d > 0 for d in draws)


def test_fixed_none_and_the_older_keys() -> None:
    rng = call_rng(1, "g0.0#1", 0)
    assert latency_of(ToolsSection(latency=ToolLatency(dist="fixed", median_s=0.2))).draw(
        rng) == 0.2
    assert latency_of(ToolsSection()).draw(rng) == 0.0
    old = latency_of(ToolsSection(latency_s=0.1, latency_sigma=0.5))
    assert old == Lognormal(0.1, 0.5)
    assert sigma_for(0.05, 0.05) == 0.0 and sigma_for(0.0, 1.0) == 0.0
    assert sigma_for(1.0, math.e) == pytest.approx(1 / 2.3263478740408408)


def test_a_draw_is_fixed_by_seed_sample_and_turn_alone() -> None:
    lat = Lognormal(0.05, 1.2)
    a = [lat.draw(call_rng(3, s, t)) for s in ("g1.0#1", "g1.1#1") for t in (0, 1)]
    b = [lat.draw(call_rng(3, s, t)) for s in ("g1.0#1", "g1.1#1") for t in (0, 1)]
    assert a == b and len(set(a)) == 4
    assert lat.draw(call_rng(4, "g1.0#1", 0)) != a[0]


@pytest.mark.parametrize("override", [
    "tools.latency.dist=gamma", "tools.latency.median_s=-1", "tools.latency.median_s=601",
    "tools.latency.p99_s=3601", "tools.latency.mean_s=1",
])
def test_keys_are_bounded_and_unknown_keys_refused(override: str) -> None:
    with pytest.raises(ConfigError, match=r"tools\.latency"):
        load_config(None, [override])


def test_p99_below_the_median_and_both_forms_at_once_are_refused() -> None:
    with pytest.raises(ValidationError, match="below median_s"):
        ToolLatency(dist="lognormal", median_s=0.5, p99_s=0.1)
    with pytest.raises(ValidationError, match="both set"):
        ToolsSection(latency_s=0.1, latency=ToolLatency(dist="fixed"))
    cfg = load_config(None, ["tools.latency.dist=lognormal", "tools.latency.p99_s=2"])
    assert cfg.tools.latency == ToolLatency(dist="lognormal", median_s=0.05, p99_s=2.0)


def test_the_tool_sleeps_its_draw_on_the_loop() -> None:
    """The calc workflow's tool call waits the drawn latency with asyncio.sleep: a coroutine
    beside it runs meanwhile (the loop is never blocked)."""
    from freshroll.engines.episodes import WorkflowSetup
    from freshroll.envs.tool_use import ToolUse

    tools = ToolsSection(latency=ToolLatency(dist="fixed", median_s=0.05))
    wf = ToolUse(WorkflowSetup(tools=tools))
    ticks: list[int] = []

    async def main() -> None:
        async def ticker() -> None:
            for i in range(3):
                ticks.append(i)
                await asyncio.sleep(0)

        answer, _ = await asyncio.gather(wf._call("3*4", call_rng(0, "g0.0#1", 0)), ticker())
        assert answer.result is not None and answer.result.text == "=12|"
        assert answer.seconds >= 0.05

    asyncio.run(main())
    assert ticks == [0, 1, 2]

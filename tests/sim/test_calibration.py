"""Each profile against its documentation (docs/simulation.md, "Calibration"), two seeds.

The ranges are the documented ones; the theory column of the doc says where they
come from (lognormal quantiles), and the measured table in the doc is checked
against ``benchmarks/sim_calibration.py`` so it cannot drift from the code.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

from freshroll.sim.calibrate import Calibration, calibrate, markdown_table, phase_tail, tail_share
from freshroll.sim.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (0, 1)


@functools.cache
def cal(name: str, seed: int, step: int = 0) -> Calibration:
    return calibrate(PROFILES[name], samples=8192, seed=seed, step=step)


def within(value: float, lo: float, hi: float) -> bool:
    return lo <= value <= hi


@pytest.mark.parametrize("seed", SEEDS)
def test_p1_low_tail(seed):
    c = cal("P1", seed)
    assert within(c.length_p99_p50, 2.2, 2.9)  # exp(2.326 x 0.4) = 2.54
    assert within(c.latency_p99_p50, 2.2, 2.9)
    assert c.cap_hit_rate <= 1e-3  # 8 x median is 5.2 sigma away
    assert within(c.tail_share, 0.15, 0.23)  # 1 - Phi(1.2816 - 0.4) = 0.19
    assert within(c.phase_tail, 0.20, 0.40)
    assert c.tool_timeout_rate == 0.0


@pytest.mark.parametrize("seed", SEEDS)
def test_p2_reasoning_long_tail(seed):
    c = cal("P2", seed)
    assert within(c.length_p99_p50, 7.5, 12.5)  # exp(2.326 x 1.0) = 10.2
    assert within(c.latency_p99_p50, 7.5, 12.5)
    assert within(c.cap_hit_rate, 0.0005, 0.006)  # P(Z > ln 16) = 0.28%
    assert within(c.tail_share, 0.32, 0.42)  # 1 - Phi(1.2816 - 1.0) = 0.39, less the cap
    assert within(c.phase_tail, 0.50, 0.75)  # the slowest 10% take over half of a phase


def test_p2_length_drift():
    start, end = cal("P2", 0), cal("P2", 0, step=PROFILES["P2"].lengths.drift_steps)
    assert within(end.length_p50 / start.length_p50, 1.45, 1.55)  # +50% over drift_steps
    assert end.cap_hit_rate > start.cap_hit_rate  # the cap (max_new_tokens) stays put
    assert within(end.cap_hit_rate, 0.003, 0.015)  # P(Z > ln(16 / 1.5)) = 0.9%


@pytest.mark.parametrize("seed", SEEDS)
def test_p3_agentic(seed):
    c, p2 = cal("P3", seed), cal("P2", seed)
    assert within(c.tool_timeout_rate, 0.04, 0.06)  # 5% of tool calls time out
    assert c.length_p99_p50 == p2.length_p99_p50  # P2's lengths
    assert c.latency_p50 > p2.latency_p50  # plus tool time
    assert within(c.latency_p99_p50, 5.0, 9.0)  # tool time thins the relative tail
    assert within(c.tail_share, 0.27, 0.38)
    assert within(c.phase_tail, 0.50, 0.75)


@pytest.mark.parametrize("seed", SEEDS)
def test_p1_tail_much_lower_than_p2(seed):
    p1, p2 = cal("P1", seed), cal("P2", seed)
    assert p1.tail_share < 0.6 * p2.tail_share
    assert p1.phase_tail < p2.phase_tail - 0.2


def test_same_seed_same_figures():
    assert calibrate(PROFILES["P3"], samples=512, seed=4) == calibrate(
        PROFILES["P3"], samples=512, seed=4
    )
    assert calibrate(PROFILES["P3"], samples=512, seed=4) != calibrate(
        PROFILES["P3"], samples=512, seed=5
    )


def test_tail_figures_hand_computed():
    import numpy as np

    x = np.array([1.0] * 9 + [11.0])  # the slowest 10% is one request of 11 out of 20
    assert tail_share(x) == pytest.approx(11 / 20)
    assert phase_tail(np.array([1.0] * 9 + [4.0])) == pytest.approx(3 / 4)  # T_90 = 1, T_100 = 4
    assert phase_tail(np.ones(10)) == 0.0


def test_documented_table_matches_the_benchmark():
    spec = importlib.util.spec_from_file_location(
        "sim_calibration", ROOT / "benchmarks" / "sim_calibration.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def measure(profile, *, samples, seed, step=0):  # the same draws, cached across this file
        assert samples == 8192
        return cal(profile.name, seed, step)

    rows = bench.documented(measure=measure)
    assert [(c.profile, c.step) for c in rows] == [
        ("P1", 0), ("P2", 0), ("P2", 100), ("P3", 0), ("P3", 100)
    ]
    doc = (ROOT / "docs" / "simulation.md").read_text()
    assert markdown_table(rows) in doc, "docs/simulation.md: rerun benchmarks/sim_calibration.py"


#: the documented ranges (docs/simulation.md, "Calibration") the simulated engine must meet
DOCUMENTED = {
    "P1": {"length_p99_p50": (2.2, 2.9), "latency_p99_p50": (2.2, 2.9),
           "tail_share": (0.15, 0.23), "phase_tail": (0.20, 0.40)},
    "P2": {"length_p99_p50": (7.5, 12.5), "latency_p99_p50": (7.5, 12.5),
           "tail_share": (0.32, 0.42), "phase_tail": (0.50, 0.75)},
    "P3": {"length_p99_p50": (7.5, 12.5), "latency_p99_p50": (5.0, 9.0),
           "tail_share": (0.27, 0.38), "phase_tail": (0.50, 0.75)},
}


def engine_figures(name: str, samples: int = 8192, phases: int = 6) -> dict[str, float]:
    """The calibration figures of what the simulated engine generates (keyed draws, not the
    generator draws of calibrate()): lengths and service latency over ``samples``, the phase
    tail of ``phases`` synchronous phases of one server's slots run through a SimEngine."""

    import numpy as np

    from freshroll.clock import VirtualClock
    from freshroll.engines.seams import GenRequest, SamplingParams
    from freshroll.sim.engine import SimEngine
    from freshroll.sim.keyed import KeyedDraws

    profile = PROFILES[name]
    draws = KeyedDraws(profile, seed=0)
    s = profile.server
    shapes = [draws.shape(f"g{i // 8}", f"g{i // 8}.{i % 8}#0", 0) for i in range(samples)]
    lengths = np.array([x.length for x in shapes])
    latency = np.array([
        (x.prompt_tokens + x.tool_tokens) * s.prefill_s_per_token
        + x.length * (s.step_s + s.step_s_per_seq) + sum(x.tool_s) for x in shapes
    ])
    slots = s.max_concurrent

    async def phase(k: int) -> list[float]:
        engine = SimEngine("w0", draws)
        finish: list[float] = []
        requests = [GenRequest(f"g{k * slots + i}.0#9", f"g{(k * slots + i) // 8}", "p", "", 0)
                    for i in range(slots)]
        await engine.generate(requests, SamplingParams(1), 0, lambda i, c: finish.append(c.gen_s))
        return finish

    tails = [phase_tail(np.array(VirtualClock().run(phase(k)))) for k in range(phases)]
    l50, l99 = np.quantile(lengths, [0.5, 0.99])
    t50, t99 = np.quantile(latency, [0.5, 0.99])
    return {"length_p99_p50": l99 / l50, "latency_p99_p50": t99 / t50,
            "tail_share": tail_share(latency), "phase_tail": float(np.mean(tails))}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_simulated_engine_meets_each_profile_documentation(name):
    figures = engine_figures(name)
    for key, (lo, hi) in DOCUMENTED[name].items():
        assert within(figures[key], lo, hi), f"{name} {key} = {figures[key]:.3f}"

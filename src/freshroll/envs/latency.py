"""A tool call's simulated latency: one draw per call from ``tools.latency`` (docs/agents.md).

``tools.latency: {dist: lognormal, median_s: m, p99_s: q}`` is the lognormal whose median is
``m`` and whose 99th percentile is ``q``::

    latency = m * exp(sigma * z),   z ~ N(0, 1),   sigma = ln(q / m) / z_0.99   (z_0.99 = 2.326)

``fixed`` is ``m`` on every call (sigma 0), ``none`` is 0. The older keys
``tools.latency_s`` / ``tools.latency_sigma`` are the same lognormal given by its median and
sigma. Each draw comes from :func:`call_rng`: a generator seeded by the call's sampling seed,
the request's sample id and the turn, so a run's latencies are the same whichever requests
were batched together and in whatever order their tools were called.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Final, NamedTuple

from freshroll.config.rollout import ToolsSection

#: the standard normal's 99th percentile
Z99: Final = NormalDist().inv_cdf(0.99)


class Lognormal(NamedTuple):
    """``median * exp(sigma * z)``; a median of 0 is no latency."""

    median: float
    sigma: float

    def draw(self, rng: random.Random) -> float:
        """One latency in seconds (0.0 without a median, the median without a sigma)."""
        if self.median <= 0:
            return 0.0
        if self.sigma <= 0:
            return self.median
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def quantile(self, p: float) -> float:
        """The ``p`` quantile (0 < p < 1) of the distribution."""
        if self.median <= 0:
            return 0.0
        return self.median * math.exp(self.sigma * NormalDist().inv_cdf(p))


def sigma_for(median_s: float, p99_s: float) -> float:
    """The sigma that puts the 99th percentile at ``p99_s`` for the median ``median_s``."""
    if median_s <= 0 or p99_s <= median_s:
        return 0.0
    return math.log(p99_s / median_s) / Z99


def latency_of(tools: ToolsSection) -> Lognormal:
    """The distribution ``tools`` configures (``tools.latency``, else the older keys)."""
    lat = tools.latency
    if lat.dist == "lognormal":
        return Lognormal(lat.median_s, sigma_for(lat.median_s, lat.p99_s))
    if lat.dist == "fixed":
        return Lognormal(lat.median_s, 0.0)
    return Lognormal(tools.latency_s, tools.latency_sigma if tools.latency_s > 0 else 0.0)


def call_rng(seed: int, sample: str, turn: int) -> random.Random:
    """The generator of one tool call's draw: fixed by the call's seed, the request's sample
    id and the turn (string seeds are hashed by ``random`` itself: stable across runs)."""
    return random.Random(f"{seed}/{sample}/{turn}")


__all__ = ["Z99", "Lognormal", "call_rng", "latency_of", "sigma_for"]

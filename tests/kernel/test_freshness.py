"""The staleness policy: admission capacity formula, lag and is_stale (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freshroll.kernel.freshness import admission_capacity, is_stale, lag


def cap(eta: int, v: int, b: int, accepted: int = 0, running: int = 0, free: int | None = None):
    return admission_capacity(
        max_staleness=eta, version=v, batch_groups=b, accepted=accepted, running=running,
        free_slots=free,
    )


@pytest.mark.parametrize(
    ("eta", "v", "b", "accepted", "running", "expected"),
    [
        (0, 0, 4, 0, 0, 4),   # synchronous: exactly one batch ahead
        (1, 0, 4, 0, 0, 8),   # one step of staleness: two batches
        (3, 0, 1, 0, 0, 4),
        (0, 1, 4, 4, 0, 4),   # after one commit of B groups: B more
        (0, 1, 4, 3, 1, 4),   # running counts like accepted
        (2, 3, 2, 7, 2, 3),   # (2 + 3 + 1) * 2 - (7 + 2) = 3
        (1, 5, 3, 10, 5, 6),  # (1 + 5 + 1) * 3 - (10 + 5) = 21 - 15
        (0, 0, 4, 4, 0, 0),   # window full
        (0, 0, 4, 2, 2, 0),
    ],
)
def test_formula_hand_computed(eta, v, b, accepted, running, expected):
    assert cap(eta, v, b, accepted, running) == expected


def test_never_negative_when_over_admitted():
    # e.g. a resume with a smaller max_staleness: more groups are in flight than allowed
    assert cap(0, 0, 2, accepted=1, running=5) == 0
    assert cap(0, 0, 2, accepted=0, running=0, free=-3) == 0


def test_free_slots_caps():
    assert cap(1, 0, 4, free=3) == 3          # min(8, 3)
    assert cap(1, 0, 4, free=100) == 8        # formula binds
    assert cap(1, 0, 4, free=0) == 0
    assert cap(1, 0, 4, free=None) == 8       # no cap
    assert cap(0, 0, 4, accepted=4, free=10) == 0


def test_capacity_grows_by_one_batch_per_version():
    base = cap(1, 0, 3, accepted=2, running=1)
    assert [cap(1, v, 3, accepted=2, running=1) - base for v in range(4)] == [0, 3, 6, 9]


@given(
    eta=st.integers(0, 8), v=st.integers(0, 1000), b=st.integers(1, 64),
    accepted=st.integers(0, 10**5), running=st.integers(0, 10**4),
    free=st.none() | st.integers(-10, 10**4),
)
def test_formula_properties(eta, v, b, accepted, running, free):
    got = cap(eta, v, b, accepted, running, free)
    window = (eta + v + 1) * b - (accepted + running)
    assert got >= 0
    assert got == max(0, window if free is None else min(window, free))
    # admitting everything it allows never overfills the window
    assert accepted + running + got <= max((eta + v + 1) * b, accepted + running)
    # more staleness or a newer version never admits less; more in flight never admits more
    assert cap(eta + 1, v, b, accepted, running, free) >= got
    assert cap(eta, v + 1, b, accepted, running, free) >= got
    assert cap(eta, v, b, accepted + 1, running, free) <= got
    assert cap(eta, v, b, accepted, running + 1, free) <= got


def test_lag():
    assert lag(5, 3) == 2
    assert lag(3, 3) == 0
    assert lag(3, 5) == -2  # a sample from a newer policy than the trainer's (never stale)


@pytest.mark.parametrize(
    ("consumer", "oldest", "eta", "stale"),
    [
        (0, 0, 0, False),
        (1, 0, 0, True),    # synchronous: any lag is stale
        (1, 1, 0, False),
        (5, 3, 2, False),   # lag == eta is allowed
        (5, 2, 2, True),    # lag == eta + 1 is not
        (2, 5, 0, False),   # negative lag
        (10, 0, 10, False),
        (11, 0, 10, True),
    ],
)
def test_is_stale_edges(consumer, oldest, eta, stale):
    assert is_stale(consumer, oldest, eta) is stale


@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 10))
def test_is_stale_is_lag_over_eta(consumer, oldest, eta):
    assert is_stale(consumer, oldest, eta) == (lag(consumer, oldest) > eta)

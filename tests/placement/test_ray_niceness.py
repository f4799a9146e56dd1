"""A private Ray instance's actors compute at the driver's priority (issue 25).

Ray starts its worker processes at niceness 15 (``RAY_worker_niceness``): below the driver
and every other process of the machine. A private instance's actors are the run's compute
on the driver's own cores, so ``start_ray`` starts them at 0; a value the caller set stands.
"""

from __future__ import annotations

import os

import pytest

from freshroll.placement.ray_session import NICENESS_ENV, start_ray, stop_ray

pytestmark = pytest.mark.ray


def _actor_niceness() -> int:
    """The niceness of a Ray worker process of the instance (a task's: an actor's process is
    a worker process started the same way); a lambda travels by value (this test module is
    not importable in the worker)."""
    import ray

    niceness = ray.remote(num_cpus=1)(lambda: __import__("os").nice(0))
    return int(ray.get(niceness.remote(), timeout=120))


@pytest.fixture
def no_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NICENESS_ENV, raising=False)


def test_a_private_instances_actors_run_at_the_drivers_niceness(no_setting: None):
    start_ray(num_cpus=2)
    try:
        assert NICENESS_ENV not in os.environ  # set for Ray's start only
        assert _actor_niceness() == os.nice(0) == 0
    finally:
        stop_ray()


def test_the_callers_own_niceness_setting_stands(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(NICENESS_ENV, "7")
    start_ray(num_cpus=2)
    try:
        assert os.environ[NICENESS_ENV] == "7"
        assert _actor_niceness() == 7
    finally:
        stop_ray()

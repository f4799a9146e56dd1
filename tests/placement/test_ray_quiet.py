"""A private Ray instance starts without Ray's observability (issue 25, seventh session).

freshroll reads none of Ray's task events, metrics or event-loop statistics, which cost
per-call work on the run's own cores: ``start_ray`` sets ``QUIET_ENV`` (and ``SPT_NOENV``, so
process titles keep the reaper's token) for the instance's start only; a variable the
caller set stands. Real Ray: what a worker process of the instance sees.
"""

from __future__ import annotations

import os

import pytest

from freshroll.placement.ray_reaper import NOENV_ENV
from freshroll.placement.ray_session import QUIET_ENV, start_ray, stop_ray

pytestmark = pytest.mark.ray

#: a caller's own setting, for one of the variables
CALLERS = ("RAY_event_stats", "1")


def _worker_env(keys: list[str]) -> dict[str, str | None]:
    import ray

    read = ray.remote(num_cpus=1)(lambda ks: {k: __import__("os").environ.get(k) for k in ks})
    return dict(ray.get(read.remote(keys), timeout=120))


def test_ray_observability_is_off_in_a_private_instance_and_a_callers_setting_stands(
        monkeypatch: pytest.MonkeyPatch):
    assert QUIET_ENV["RAY_task_events_report_interval_ms"] == "0"
    for key in [*QUIET_ENV, NOENV_ENV]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(*CALLERS)
    start_ray(num_cpus=1)
    try:
        keys = [*QUIET_ENV, NOENV_ENV]
        assert not any(k in os.environ for k in keys if k != CALLERS[0])  # for the start only
        assert os.environ[CALLERS[0]] == CALLERS[1]
        seen = _worker_env(keys)
    finally:
        stop_ray()
    want = {**QUIET_ENV, NOENV_ENV: "1", CALLERS[0]: CALLERS[1]}
    assert seen == want

"""A private Ray instance's processes start with ``SPT_NOENV=1`` (issue 25, seventh session).

Ray's processes set their titles with a vendored ``setproctitle`` that, by default, writes
over ``/proc/<pid>/environ``, where the reaper finds the instance's token: ``start_ray`` puts
``SPT_NOENV=1`` in the instance's environment for its start only, and a value the caller
set stands (as ``RAY_worker_niceness`` does). (Ray's raylet gives its worker processes
``SPT_NOENV=1`` itself; its agents, which it starts with its own environment, lost the token.)
Real Ray: the environment the instance's raylet started with, which its agents inherit.
tests/placement/test_ray_leftovers.py checks the token itself and the stop.
"""

from __future__ import annotations

import os

import pytest

from freshroll.placement import ray_session
from freshroll.placement.ray_reaper import NOENV_ENV, TOKEN_ENV, session_pids
from freshroll.placement.ray_session import NICENESS_ENV, start_ray, stop_ray

pytestmark = pytest.mark.ray


def _raylet_env(token: str, keys: list[str]) -> dict[str, str | None]:
    """``keys`` in the start environment of the instance's raylet (``/proc/<pid>/environ``)."""
    for pid in session_pids(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0")[0]
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = dict(e.decode().partition("=")[::2] for e in fh.read().split(b"\0") if e)
        except OSError:
            continue
        if os.path.basename(argv0) == b"raylet":
            return {k: env.get(k) for k in keys}
    raise AssertionError("no raylet of the instance found")


@pytest.mark.parametrize("callers", [None, "0"])
def test_a_private_instance_starts_with_spt_noenv_and_a_callers_value_stands(
        monkeypatch: pytest.MonkeyPatch, callers: str | None):
    monkeypatch.delenv(NICENESS_ENV, raising=False)
    if callers is None:
        monkeypatch.delenv(NOENV_ENV, raising=False)
    else:
        monkeypatch.setenv(NOENV_ENV, callers)
    start_ray(num_cpus=1)
    try:
        assert os.environ.get(NOENV_ENV) == callers  # set for Ray's start only
        assert TOKEN_ENV not in os.environ and NICENESS_ENV not in os.environ
        assert ray_session._session is not None and ray_session._session.token is not None
        seen = _raylet_env(ray_session._session.token, [NOENV_ENV, NICENESS_ENV])
    finally:
        stop_ray()
    assert seen == {NOENV_ENV: callers or "1", NICENESS_ENV: "0"}

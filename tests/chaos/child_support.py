"""What the chaos tests that run cases in child processes share: the injector they name and
the ``PYTHONPATH`` their children import from (this checkout's freshroll and the stand-in).

A test module imports :func:`child_path` (an autouse fixture: active in the importing module)
and :data:`INJECTOR`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from freshroll.chaos import runner

HERE = Path(__file__).parent
#: the real Injector (chaos/inject.py) where it exists; else the stand-in of these tests
try:
    import freshroll.chaos.inject  # noqa: F401

    INJECTOR = runner.INJECTOR
except ImportError:
    INJECTOR = "standin:Injector"


@pytest.fixture(autouse=True)
def child_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children import the stand-in too (and this checkout's freshroll)."""
    src = str(Path(runner.__file__).parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, str(HERE),
                                                      os.environ.get("PYTHONPATH", "")]))

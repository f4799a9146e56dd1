"""``run.runtime: auto``: the placement rule, and the start line that says what it chose."""

from __future__ import annotations

from typing import Any

import pytest

from freshroll.config import validate
from freshroll.runtime import placement
from freshroll.runtime.placement import auto_runtime, describe_runtime, resolve_runtime


def _cfg(**run: Any) -> Any:
    engine = run.pop("engine", "hf")
    return validate({"run": run, "rollout": {"engine": engine}}, "test")


def test_auto_is_process_only_for_async_hf_on_two_cores():
    assert auto_runtime(_cfg(max_staleness=1), cores=2)[0] == "process"
    assert auto_runtime(_cfg(max_staleness=1), cores=1) == ("inline",
                                                            "one core: nothing to overlap")
    assert auto_runtime(_cfg(max_staleness=0), cores=8)[0] == "inline"
    assert auto_runtime(_cfg(max_staleness=2, engine="sim"), cores=8)[0] == "inline"
    assert auto_runtime(_cfg(max_staleness=2, engine="vllm"), cores=8)[0] == "inline"


def test_an_explicit_runtime_is_kept_and_auto_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement, "available_cores", lambda: 2)
    assert resolve_runtime(_cfg(runtime="process", max_staleness=0)) == "process"
    assert describe_runtime(_cfg(runtime="inline")) == "inline"
    rt, why = auto_runtime(_cfg())
    assert describe_runtime(_cfg()) == f"{rt}, auto: {why}"
    assert resolve_runtime(_cfg()) == rt

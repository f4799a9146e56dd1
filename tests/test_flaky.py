"""tests/flaky.py tells a flaky test (failed, then passed when run again) from a broken one."""

from __future__ import annotations

import json
from pathlib import Path

import flaky


def test_a_failure_that_passes_again_is_flaky_and_one_that_fails_again_is_not() -> None:
    before = {"tests/a.py::test_x", "tests/b.py::test_y", "tests/c.py"}
    groups = flaky.classify(before, {"tests/b.py::test_y", "tests/c.py"})
    assert groups == {"flaky": ["tests/a.py::test_x"],
                      "failed": ["tests/b.py::test_y", "tests/c.py"]}
    text = flaky.render(groups)
    assert text.splitlines()[0].startswith("flaky check: 1 flaky")
    assert "FLAKY   tests/a.py::test_x" in text and "FAILED  tests/c.py" in text
    assert "fails the run all the same" in text
    assert "pin what it" not in flaky.render(flaky.classify(before, before))


def test_the_failures_are_read_from_pytests_cache(tmp_path: Path) -> None:
    cache = tmp_path / "lastfailed"
    assert flaky.last_failed(cache) == set()  # no cache: nothing to rerun
    cache.write_text(json.dumps({"tests/a.py::test_x": True, "tests/b.py::test_y": False}))
    assert flaky.last_failed(cache) == {"tests/a.py::test_x"}
    cache.write_text("{not json")
    assert flaky.last_failed(cache) == set()

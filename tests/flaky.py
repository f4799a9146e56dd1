"""Tell a flaky test from a broken one: ``make test`` runs this after a red suite.

    python tests/flaky.py [PYTEST ARGS...]

Reads the failures pytest recorded (``.pytest_cache``: ``lastfailed``), runs them once more
(``pytest --last-failed -n 0``, one process), and prints each as

    FLAKY   failed, then passed when run again: its outcome depends on something the test
            does not pin (load, threads, a clock, an order): fix it, do not retry it
    FAILED  failed both times

The suite's exit status is not changed by this script (``make test`` keeps the first run's):
a flaky test fails the run all the same, so it is seen and fixed rather than retried into
green. Exit status: 0 when the rerun ran, 2 when there was nothing recorded to rerun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(".pytest_cache") / "v" / "cache" / "lastfailed"


def last_failed(cache: Path = CACHE) -> set[str]:
    """The node ids pytest's cache records as failed (empty when there is no cache)."""
    try:
        return {k for k, v in json.loads(cache.read_text()).items() if v}
    except (OSError, ValueError):
        return set()


def classify(before: set[str], after: set[str]) -> dict[str, list[str]]:
    """``before``: failed in the suite's run; ``after``: still failed when run again.
    A file-level entry (a collection error) counts as failed again when it is still there."""
    return {"flaky": sorted(before - after), "failed": sorted(before & after)}


def render(groups: dict[str, list[str]]) -> str:
    lines = [f"FLAKY   {n}" for n in groups["flaky"]]
    lines += [f"FAILED  {n}" for n in groups["failed"]]
    head = (f"flaky check: {len(groups['flaky'])} flaky (failed, then passed when run again), "
            f"{len(groups['failed'])} failed twice")
    tail = ("a flaky test fails the run all the same: pin what it depends on "
            "(docs/testing.md, 'A loop that stays green')") if groups["flaky"] else ""
    return "\n".join([head, *lines, *([tail] if tail else [])])


def main(argv: list[str]) -> int:
    before = last_failed()
    if not before:
        print("flaky check: no failure recorded to run again")
        return 2
    print(f"flaky check: running the {len(before)} failure(s) once more, one process")
    env = {k: v for k, v in os.environ.items() if k != "FRESHROLL_TEST_COSTS"}  # not costs
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "--last-failed",
                    "--last-failed-no-failures", "none", *argv], check=False, env=env)
    print(render(classify(before, last_failed())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

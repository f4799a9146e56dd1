"""How ``make test`` shares the suite out between its pytest-xdist workers.

``--dist loadfile`` alone hands out files in collection order, so the slow files arrive
last and one worker finishes minutes before the other; and the tests that build a vLLM
engine hold a machine-wide lock (``tests/conftest.py``), so whenever two of them landed on
two workers one worker sat waiting on the lock (up to 194 s in one setup, measured
2026-12-03). This scheduler, used when ``--dist loadfile`` is asked for:

* puts every test marked ``vllm`` in one work unit (a mark on the module's ``pytestmark``
  takes the whole file, a mark on a test function takes that test), so the lock is never
  waited on: one worker runs them in turn while the others run the rest (the Ray tests
  were one unit too, about 900 s on one worker under load, until they could run side by
  side: tests/ray_owner.py);
* hands out the units longest first, by the seconds each file took in a recorded run
  (``tests/costs.json``; a file not in it counts as :data:`UNKNOWN_S`), so that every
  worker is busy to the end (the longest-processing-time rule).

``tests/costs.json`` is rewritten by ``make test-costs`` (``FRESHROLL_TEST_COSTS=1``): the
controller sums each file's setup, call and teardown durations as its workers report them.
The marks are read from the test files' source (the controller collects nothing itself),
with :mod:`ast`: a decorator ``pytest.mark.vllm`` or a module-level ``pytestmark`` naming
it.
"""

from __future__ import annotations

import ast
import functools
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
COSTS = Path(__file__).with_name("costs.json")
#: marks whose tests share one work unit each (they hold a machine-wide lock; the Ray tests
#: did until their leak checks counted only their own instances: tests/ray_owner.py)
SERIAL = ("vllm",)
#: the cost of a file that tests/costs.json does not know (a new file: a few seconds)
UNKNOWN_S = 5.0


def _mark_names(node: ast.expr) -> set[str]:
    """The SERIAL marks named in a decorator or a ``pytestmark`` value."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in SERIAL:
            inner = sub.value
            if isinstance(inner, ast.Attribute) and inner.attr == "mark":
                found.add(sub.attr)
    return found


@functools.cache
def serial_marks(path: str) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """A test file's SERIAL marks: (the module's, {test function or class: its own})."""
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError, ValueError):
        return frozenset(), {}
    module: set[str] = set()
    per_test: dict[str, frozenset[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ):
            module |= _mark_names(stmt.value)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            marks = set().union(*(_mark_names(d) for d in stmt.decorator_list))
            if marks:
                per_test[stmt.name] = frozenset(marks)
    return frozenset(module), per_test


def unit_of(nodeid: str) -> str:
    """The work unit of a test: ``serial:<mark>`` for a SERIAL one, else its file."""
    path, _, rest = nodeid.partition("::")
    module, per_test = serial_marks(path)
    name = rest.split("::", 1)[0].split("[", 1)[0]
    marks = module | per_test.get(name, frozenset())
    if marks:
        return "serial:" + sorted(marks)[0]
    return path


def load_costs() -> dict[str, float]:
    try:
        data = json.loads(COSTS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("seconds_by_file", {}).items()}


def unit_costs(units: dict[str, list[str]], costs: dict[str, float]) -> dict[str, float]:
    """Each unit's expected seconds: its files' recorded seconds, shared out by test count
    where a file's tests sit in two units (its serial tests and the rest)."""
    tests_per_file: dict[str, int] = defaultdict(int)
    for nodeids in units.values():
        for nodeid in nodeids:
            tests_per_file[nodeid.partition("::")[0]] += 1
    out: dict[str, float] = {}
    for unit, nodeids in units.items():
        total = 0.0
        for nodeid in nodeids:
            path = nodeid.partition("::")[0]
            total += costs.get(path, UNKNOWN_S) / tests_per_file[path]
        out[unit] = total
    return out


def make_scheduler(base: type) -> type:
    """A subclass of xdist's LoadScopeScheduling with our units and order."""

    class LongestFirstScheduling(base):  # type: ignore[misc, valid-type]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # schedule() fills self.workqueue in collection order, then hands out units
            # through here: the first hand-out reorders the whole queue, longest first
            if not getattr(self, "_ordered", False):
                self._ordered = True
                self._reorder()
            super()._assign_work_unit(node)

        def _reorder(self) -> None:
            units = {u: list(w) for u, w in self.workqueue.items()}
            cost = unit_costs(units, load_costs())
            order = sorted(units, key=lambda u: -cost[u])
            pending = dict(self.workqueue)
            self.workqueue.clear()
            for unit in order:
                self.workqueue[unit] = pending[unit]

    return LongestFirstScheduling


class Costs:
    """Controller-side: sum each file's phase durations; write tests/costs.json at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.partition("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        data = {"written_by": "make test-costs (tests/scheduling.py)",
                "seconds_by_file": {k: round(v, 1) for k, v in sorted(self.seconds.items())}}
        COSTS.write_text(json.dumps(data, indent=1) + "\n")


def configure(config: pytest.Config) -> None:
    """Register the cost recorder on the controller when asked (``FRESHROLL_TEST_COSTS=1``)."""
    if os.environ.get("FRESHROLL_TEST_COSTS") and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(Costs(), "freshroll-test-costs")


def xdist_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    return make_scheduler(LoadScopeScheduling)(config, log)

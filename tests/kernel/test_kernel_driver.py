"""The seeded kernel driver (``kernel_driver.py``) that the kernel tests write their ledgers with.

It used to be ``freshroll simulate``; these are that command's tests, kept on the driver
(the product's ``simulate`` now runs the real pipeline: tests/cli/test_simulate.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernel_driver import SimConfig, main, simulate

from freshroll.errors import ConfigError
from freshroll.harness.verify import INVARIANTS, verify_run
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger


def test_driver_counts_and_invariants(tmp_path: Path) -> None:
    run = tmp_path / "run"
    buf = simulate(run, KernelConfig(1, 4, 4), SimConfig(steps=10, faults=True))
    counts = dict(buf.counts)
    assert counts["steps"] == 10
    assert counts["committed"] > 0
    report = verify_run(run)
    text = report.render()
    assert report.ok
    assert "10 steps, closed" in text
    for name in INVARIANTS:
        assert f"ok   {name}" in text
    assert json.loads((run / "counts.json").read_text()) == counts


def test_driver_options_reach_the_kernel(tmp_path: Path) -> None:
    run = tmp_path / "run"
    simulate(run, KernelConfig(0, 2, 3), SimConfig(steps=3, faults=False))
    assert verify_run(run).ok
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    opened = events[0]
    assert isinstance(opened, ev.Opened)
    assert (opened.max_staleness, opened.batch_groups, opened.group_size) == (0, 2, 3)
    assert not any(isinstance(e, ev.WorkerFenced | ev.Rejected) for e in events)
    commits = [e for e in events if isinstance(e, ev.Committed)]
    assert len(commits) == 3 and all(len(c.samples) == 6 for c in commits)


def test_driver_script_again_resumes_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    main([str(run), "--steps", "4", "--faults"])
    capsys.readouterr()
    main([str(run), "--steps", "6", "--faults"])
    assert json.loads(capsys.readouterr().out.splitlines()[0])["counts"]["steps"] == 6
    assert verify_run(run).ok
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        opened = [e for _, e in ledger.events() if isinstance(e, ev.Opened)]
    assert [o.incarnation for o in opened] == [0, 1]


def test_driver_bad_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="group_size"):
        main([str(tmp_path / "r"), "--group-size", "0"])

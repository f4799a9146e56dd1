"""Real workers stopped with SIGSTOP (alive, never answering) in a real ``freshroll run``:
the waits on them are said past ``limits.heartbeat_s`` ("waiting 2.0 s on w1 generate, limit
6 s") and end at their bound, the workers are fenced ``timeout`` and replaced, and the run ends
with every step and a ledger that verifies (issue 23, defect 3).

Before: a SIGSTOPped worker process printed nothing for 60 s under the default limits, and a
SIGSTOPped Ray actor caught in a weight load produced no event for 200 s. The in-process
tests of the same code (tests/pipeline/test_timeouts.py) stall fakes; these stop the real
process: a process-placement worker forked by the forkserver, a Ray actor.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import psutil
import pytest
from e2e_helpers import freshroll, metrics

BOUND_S = 6
#: enough steps after the first that the stop lands while the run trains, not as it closes
STEPS = 12


def _workers(run: psutil.Process, runtime: str) -> list[psutil.Process]:
    """The run's inference worker processes: the forkserver's children (process), or the
    ``ray::_EngineActor`` processes under the run's raylet (ray)."""
    out = []
    for p in run.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if runtime == "process":
                mine = "forkserver" in " ".join(p.parent().cmdline())
            else:
                mine = " ".join(p.cmdline()).startswith("ray::_EngineActor")
            if mine:
                out.append(p)
    return out


def _fenced(out: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return db.execute("SELECT json_extract(body, '$.worker'), json_extract(body, '$.reason')"
                          " FROM events WHERE kind='worker_fenced'").fetchall()
    finally:
        db.close()


def _stop_when_training(out: Path, runtime: str, stopped: list[psutil.Process],
                       done: threading.Event) -> None:
    """SIGSTOP the run's two workers the moment its first step commits. They are found
    once they are up: a step of this run takes a fraction of a second, so a search for them
    after the first step (slow under load) could find the run already closing."""
    found: list[psutil.Process] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not done.is_set():
        if len(found) < 2:
            found = _workers(psutil.Process(), runtime)
        elif (out / "metrics.jsonl").is_file() and _committed(out):
            for p in found:  # every worker: the run waits on them, bounded
                p.send_signal(signal.SIGSTOP)  # as `kill -STOP`
            stopped.extend(found)
            return
        time.sleep(0.02)


def _committed(out: Path) -> bool:
    with contextlib.suppress(ValueError):  # a line half written
        return bool(metrics(out))
    return False


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["process", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_stopped_worker_is_said_bounded_and_replaced(tmp_path: Path, small: list[str],
                                                       runtime: str):
    """The run in this process (its workers are its children, as in ``freshroll run``'s:
    the forkserver's, or the actors under its Ray instance's raylet), stopped from a thread."""
    out = tmp_path / "run"
    stopped: list[psutil.Process] = []
    done = threading.Event()
    watch = threading.Thread(target=_stop_when_training, args=(out, runtime, stopped, done),
                             daemon=True)
    watch.start()
    try:
        proc = freshroll("run", *small, f"run.steps={STEPS}", f"run.runtime={runtime}",
                         "rollout.workers=2", f"limits.generate_timeout_s={BOUND_S}",
                         f"limits.weights_timeout_s={BOUND_S}", "limits.heartbeat_s=1",
                         "--out", str(out), check=False)
    finally:
        done.set()
        watch.join()
        for p in stopped:
            with contextlib.suppress(psutil.Error):
                p.kill()
    err = proc.stderr
    assert len(stopped) == 2, f"not two worker processes while training: {stopped}\n{err}"
    assert proc.returncode == 0, err
    said = re.findall(rf"waiting [\d.]+ s on (w\d+) (generate|load weights), limit {BOUND_S} s",
                      err)
    assert said, err  # the stopped workers' waits were said before their bound ended them
    assert {(w, "timeout") for w, _ in said} <= set(_fenced(out)), (_fenced(out), err)
    assert "Traceback" not in err, err
    # the end says what the run recovered from, and summary.json counts it (issue 28 defect 3)
    losses = sum(1 for _, reason in _fenced(out) if reason == "timeout")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["worker_losses"] == losses >= 2
    assert summary["worker_losses_by_reason"] == {"timeout": losses}
    assert re.search(rf"recovered from {losses} inference worker losses \({losses} timeout\), "
                     rf"replaced; {summary['reissued_attempts']} attempts re-issued; first "
                     r"loss: w\d epoch \d+ timeout: WorkerTimeout: ", err), err
    assert len(metrics(out)) == STEPS
    verified = freshroll("verify", str(out))
    assert verified.returncode == 0 and "closed" in verified.stdout

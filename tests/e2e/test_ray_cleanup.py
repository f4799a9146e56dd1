"""freshroll's private Ray instance never outlives its run (issue 6, item 11).

Fast tests drive the reaper and its watchdog with stand-in processes (no Ray); the slow
ones SIGKILL the driver of a real ``run.runtime: ray`` run and check, by pid, that no
process of that Ray instance survives. Their drivers are real processes forked from one
zygote of the module (tests/e2e/cli_zygote.py: torch and the CLI imported once, not a
Python start-up per run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cli_zygote import Forked, Zygote
from e2e_helpers import REPO, metrics, summary

from freshroll.placement import ray_reaper
from freshroll.placement.ray_reaper import TOKEN_ENV, alive, session_pids
from ray_owner import OWNER_ENV, live_tokens_of, owned

pytestmark = pytest.mark.ray


def _tagged_sleeper(token: str) -> subprocess.Popen[bytes]:
    """A stand-in for a Ray process: carries the token, in a session of its own.

    Returned once ``/proc/<pid>/environ`` shows the token: ``Popen`` returns when the exec has
    begun, and the kernel sets up the new environment a moment later (on a loaded machine the
    scan could otherwise read an empty environment, as it did once in CI).
    """
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, TOKEN_ENV: token},
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while proc.pid not in session_pids(token):
        assert time.monotonic() < deadline, "the stand-in never showed its environment"
        time.sleep(0.01)
    return proc


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_session_pids_finds_exactly_the_token():
    ours, other = ray_reaper.new_token(), ray_reaper.new_token()
    a, b = _tagged_sleeper(ours), _tagged_sleeper(other)
    try:
        assert session_pids(ours) == [a.pid]
        assert session_pids(other) == [b.pid]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


_DRIVER = """
import subprocess, sys, time, os
from freshroll.placement import ray_reaper
token = sys.argv[1]
dog = ray_reaper.start_watchdog(token)
child = subprocess.Popen(["sleep", "300"], env={**os.environ, ray_reaper.TOKEN_ENV: token},
                         start_new_session=True)
print(child.pid, dog.pid, flush=True)
time.sleep(300)
"""


def test_watchdog_reaps_the_session_when_the_driver_is_sigkilled():
    token, bystander_token = ray_reaper.new_token(), ray_reaper.new_token()
    bystander = _tagged_sleeper(bystander_token)  # another instance: never touched
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, token], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        assert driver.stdout is not None
        child, dog = map(int, driver.stdout.readline().split())
        assert alive(child) and alive(dog)
        time.sleep(0.5)
        assert alive(child)  # the watchdog waits while the driver lives
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert _gone([child, dog], timeout=20), "the watchdog did not reap the session"
        assert alive(bystander.pid)
    finally:
        driver.kill()
        bystander.kill()
        bystander.wait()


def test_a_watchdog_told_reaped_exits_at_once_and_a_plain_close_still_reaps():
    """``stop_ray`` tells its watchdog that its own reap found the instance gone
    (``stop_watchdog(reaped=True)``): the watchdog exits without a second reap (0.57 s of
    every Ray run's stop before, issue 25's seventh session). Only that message skips it: a
    pipe closed without it (a driver that died, or did not reap) is reaped as before. A
    token process is left alive on purpose here to tell the two apart."""
    token = ray_reaper.new_token()
    sleeper = _tagged_sleeper(token)
    try:
        dog = ray_reaper.start_watchdog(token)
        t0 = time.monotonic()
        ray_reaper.stop_watchdog(dog, reaped=True)
        assert dog.returncode == 0 and time.monotonic() - t0 < 5.0
        assert alive(sleeper.pid)  # no reap: the message was the driver's word
        dog = ray_reaper.start_watchdog(token)
        ray_reaper.stop_watchdog(dog)
        assert _gone([sleeper.pid], timeout=20), "a plain close must still reap"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_reap_previous_stops_a_dead_drivers_leftovers(tmp_path: Path):
    token = ray_reaper.new_token()
    leftover = _tagged_sleeper(token)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "ray.json").write_text(json.dumps(
        {"token": token, "driver_pid": dead.pid, "driver_start": 0, "watchdog_pid": None}))
    try:
        assert ray_reaper.reap_previous(tmp_path) == [leftover.pid]
        leftover.wait(timeout=10)
        assert not (tmp_path / "ray.json").exists()
    finally:
        leftover.kill()


def test_reap_previous_leaves_a_live_drivers_instance_alone(tmp_path: Path):
    token = ray_reaper.new_token()
    process = _tagged_sleeper(token)
    driver = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / "ray.json").write_text(json.dumps(
            {"token": token, "driver_pid": driver.pid,
             "driver_start": ray_reaper.start_time(driver.pid)}))
        assert ray_reaper.reap_previous(tmp_path) == []
        assert alive(process.pid)
    finally:
        for p in (process, driver):
            p.kill()
            p.wait()


def test_any_start_removes_a_dead_drivers_token_and_leftovers(tmp_path: Path):
    """Issue 48: after a SIGKILL of driver and watchdog, ``ray.json`` (the instance's token)
    stayed in the run directory until a resume of that directory. Any run's start on the
    machine now reaps such an instance and removes its record
    (:func:`ray_reaper.sweep_dead_drivers`: its own run's at once, another's once a minute
    old); a live driver's record stays."""
    dead_dir, live_dir = tmp_path / "dead", tmp_path / "live"
    dead_dir.mkdir()
    live_dir.mkdir()
    token = ray_reaper.new_token()
    leftover = _tagged_sleeper(token)  # a process of the dead driver's instance
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from freshroll.placement.ray_reaper import write_record; "
                    "write_record(Path(sys.argv[1]), sys.argv[2], None)",
                    str(dead_dir), token], env=env, check=True, timeout=60)
    ray_reaper.write_record(live_dir, ray_reaper.new_token(), None)  # this process: alive
    try:
        assert (dead_dir / "ray.json").is_file()
        assert dead_dir not in ray_reaper.sweep_dead_drivers()  # laid a moment ago: left
        assert dead_dir in ray_reaper.sweep_dead_drivers(dead_dir)  # its own run: at once
        assert not (dead_dir / "ray.json").exists()
        assert leftover.wait(timeout=30) is not None  # reaped
        assert (live_dir / "ray.json").is_file()
        assert live_dir not in ray_reaper.sweep_dead_drivers(live_dir, grace_s=0.0)
    finally:
        ray_reaper.remove_record(live_dir, json.loads((live_dir / "ray.json").read_text())[
            "token"])
        if leftover.poll() is None:
            leftover.kill()


# -- real ray runs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """The runs' drivers are real processes, forked from one that imported torch once."""
    z = Zygote()
    yield z
    z.close()


def _start_ray_run(out: Path, small: list[str], steps: int, zygote: Zygote,
                   ) -> tuple[Forked, int, str]:
    """A ray-runtime run of ``steps`` steps in a forked process, returned once its first step
    is committed (killed then, it is far from its end) with its driver's pid and its Ray
    token. One inference actor: a second one would cost ~12 CPU-s per start and show nothing
    more (every process of the instance, actors included, carries its token: what the checks
    count)."""
    env = {OWNER_ENV: os.environ[OWNER_ENV]} if OWNER_ENV in os.environ else {}
    run = zygote.fork(["run", *small, f"run.steps={steps}", "run.runtime=ray",
                       "rollout.workers=1", "rollout.worker_batch=4",
                       "trainer.checkpoint_every=5", "--out", str(out)],
                      out.parent / f"{out.name}.log", env=env, timeout_s=400)
    deadline = time.time() + 240
    while time.time() < deadline:
        if (out / "metrics.jsonl").is_file() and metrics(out):
            break
        if not run.running():
            pytest.fail("the ray run ended before it could be killed")
        time.sleep(0.05)
    else:
        pytest.fail("the ray run committed no step in time")
    record = json.loads((out / "ray.json").read_text())
    driver = record["driver_pid"]
    assert psutil.Process(driver).ppid() == zygote.proc.pid  # the run's own forked process
    return run, driver, record["token"]


@pytest.mark.slow
def test_driver_sigkill_leaves_no_ray_process(tmp_path: Path, small: list[str],
                                              zygote: Zygote):
    """Guard 2: the watchdog stops the instance of a SIGKILLed driver."""
    out = tmp_path / "ray"
    run, driver, token = _start_ray_run(out, small, steps=40, zygote=zygote)
    pids = session_pids(token)
    assert len(pids) >= 5  # gcs, raylet, agents, the actor...
    os.kill(driver, signal.SIGKILL)
    assert run.wait() == -9
    assert _gone(pids, timeout=30), f"still alive: {[p for p in pids if alive(p)]}"
    assert session_pids(token) == []


@pytest.mark.slow
def test_resume_reaps_what_a_killed_driver_and_watchdog_left(tmp_path: Path, small: list[str],
                                                             zygote: Zygote):
    """Guard 3: driver and watchdog both SIGKILLed; the resume stops the leftovers, then
    finishes the run, and its own instance is gone when it exits."""
    out = tmp_path / "ray"
    with owned() as tag:  # other tests' Ray instances may run beside this one
        # 12 steps: the resume trains the 11 or so left (at ~0.3 CPU-s a step)
        run, driver, token = _start_ray_run(out, small, steps=12, zygote=zygote)
        assert live_tokens_of(tag) == {token}  # the tag reaches the instance's processes
        record = json.loads((out / "ray.json").read_text())
        pids = session_pids(token)
        os.kill(record["watchdog_pid"], signal.SIGKILL)
        os.kill(driver, signal.SIGKILL)
        assert run.wait() == -9
        assert not (out / "summary.json").exists()  # killed mid-run: the resume has work left
        log = tmp_path / "resume.log"
        resume = zygote.fork(["run", "--resume", str(out)], log, env={OWNER_ENV: tag},
                             timeout_s=400)
        assert resume.wait(400) == 0, log.read_text()
        assert "verify: ok" in log.read_text()
        assert summary(out)["steps"] == 12
        assert not any(alive(p) for p in pids), f"still alive: {[p for p in pids if alive(p)]}"
        assert live_tokens_of(tag) == set()  # neither the old nor the resumed instance remains
    assert not (out / "ray.json").exists()


@pytest.mark.slow
def test_driver_sigterm_stops_the_run_as_ctrl_c_does(tmp_path: Path, small: list[str],
                                                     zygote: Zygote):
    """Issue 48: ``ray.init`` installed Ray's own SIGTERM handlers (a native one that printed
    a stack and aborted: status 134, the ledger closed ``failed``). A SIGTERM of the driver
    (a container stop, a CI cancel) now ends the run as Ctrl-C does: the resume line, status
    130, the ledger closed ``interrupted``, and no process of its instance left."""
    import sqlite3

    out = tmp_path / "ray"
    run, driver, token = _start_ray_run(out, small, steps=200, zygote=zygote)
    pids = session_pids(token)
    os.kill(driver, signal.SIGTERM)
    status = run.wait(180)
    log = (out.parent / f"{out.name}.log").read_text()
    assert status == 130, log
    assert "interrupted" in log and f"resume with: freshroll run --resume {out}" in log, log
    assert "Traceback" not in log and "SIGABRT" not in log and "*** " not in log, log
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        (body,), = db.execute("SELECT body FROM events ORDER BY seq DESC LIMIT 1").fetchall()
    finally:
        db.close()
    assert json.loads(body) == {**json.loads(body), "kind": "closed", "reason": "interrupted"}
    assert _gone(pids, timeout=30), f"still alive: {[p for p in pids if alive(p)]}"

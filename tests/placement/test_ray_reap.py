"""The reaper leaves no process of its token alive, one started while it reaps included.

Issue 23, defect 4: after a driver's SIGKILL, Ray's agents were alive 13 s later in one
trial of two. Before, ``reap`` made three passes (SIGTERM, SIGKILL, SIGKILL) and returned:
a process started after its last scan (a raylet or an agent starting one while the others
were stopped) was left behind. It now scans until nothing is found for ``settle`` seconds.
Real processes carrying a token, as Ray's do (no Ray here: the reaper is stdlib only).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from freshroll.placement.ray_reaper import TOKEN_ENV, alive, new_token, reap, session_pids

#: a process that ignores SIGTERM (as a busy raylet may), so only SIGKILL ends it
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)")


def _start(token: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-S", "-c", STUBBORN],
                            env={**os.environ, TOKEN_ENV: token}, stdout=subprocess.PIPE)


def test_a_process_started_while_the_reaper_runs_is_reaped_too():
    token = new_token()
    first = _start(token)
    assert first.stdout is not None and first.stdout.readline() == b"ready\n"  # ignores TERM
    late: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()

    def start_late() -> None:  # after the old reaper's last pass (grace 1 s: ~1.1 s)
        time.sleep(1.25)
        late.append(_start(token))

    thread = threading.Thread(target=start_late)
    thread.start()
    try:
        pids = reap(token, grace=1.0, settle=0.5)
        thread.join()
        for p in (first, *late):
            p.wait(timeout=5)  # dead (reaped by us: the test is their parent)
        assert first.pid in pids and late[0].pid in pids
        assert session_pids(token) == [] and not any(alive(p.pid) for p in (first, *late))
        assert time.monotonic() - t0 < 10
    finally:
        thread.join()
        for p in (first, *late):
            p.kill()
            p.wait()


def test_descendants_are_live_children_only_and_no_roots_scan_nothing(monkeypatch):
    from freshroll.placement import ray_reaper

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while alive(done.pid) and time.monotonic() < deadline:  # exits, unwaited: a zombie
            time.sleep(0.02)
        assert not alive(done.pid) and os.path.exists(f"/proc/{done.pid}")
        found = ray_reaper.with_descendants([os.getpid()])
        assert sleeper.pid in found and done.pid not in found
        assert ray_reaper.start_time(sleeper.pid) == ray_reaper.start_time(sleeper.pid) > 0
        assert ray_reaper.start_time(done.pid + 10**7) is None  # no such process

        def no_scan() -> dict[int, int]:
            raise AssertionError("/proc scanned for descendants of no root")

        monkeypatch.setattr(ray_reaper, "parents", no_scan)
        assert ray_reaper.with_descendants([]) == []
    finally:
        sleeper.kill()
        sleeper.wait()
        done.wait()

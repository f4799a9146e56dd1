"""freshroll's private Ray instance must not outlive its run: a token, a watchdog, a reaper.

Stdlib only (this file also runs as the watchdog script, without importing freshroll).

Which processes are ours: :func:`freshroll.placement.ray_session.start_ray` puts a fresh
random token in the environment (``FRESHROLL_RAY_SESSION=<token>``) only while
``ray.init`` starts the instance. Every process of that instance inherits it — GCS,
raylet, dashboard and runtime-env agents, log monitor, workers and actors — and no
other process has it, so a Ray instance that freshroll did not start is never touched.
They are found by reading ``/proc/<pid>/environ`` (Linux; processes of the same user), with
every descendant of such a process (:func:`session_pids`).

A process title must not wipe the token: Ray's agents set their title
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) with a vendored ``setproctitle``, which by
default writes over the environment's memory too, and so over ``/proc/<pid>/environ``: which
entries survive depends on their order, which the raylet does not keep (it starts its worker
processes with ``SPT_NOENV=1`` itself, not its agents). Before, the agents of a scratch
cluster and of a private instance lost their token that way, and a scratch cluster's
outlived it (issue 25, seventh session).
:data:`NOENV_ENV` (``SPT_NOENV=1``, set for the instance's start by ``start_ray`` and by
:func:`~freshroll.placement.ray_cluster.start_cluster`) keeps a title within the
argument list's memory; a process whose token was wiped anyway is still found through its
parent while that lives.

Three guards, each enough on its own for the case it covers:

1. ``stop_ray`` (a run that ends, however it ends, in-process): ``ray.shutdown()``, then
   :func:`reap` of the token (Ray's agents otherwise linger).
2. The driver dies without running ``stop_ray`` (``SIGKILL``, OOM kill): a watchdog
   process (:func:`start_watchdog`, this file as a script, in its own session) holds the
   read end of a pipe whose only write end the driver holds. When the driver dies in any
   way, the read returns end-of-file and the watchdog reaps the token.
3. Both were killed: ``RUN_DIR/ray.json`` records the token and the driver's pid and start
   time; the next ``start_ray`` in that run directory (``--resume``) first reaps a previous
   incarnation whose driver is gone (:func:`reap_previous`).

Reaping sends ``SIGTERM``, then ``SIGKILL`` to a process that outlived ``grace`` seconds,
and repeats the scan until it has found nothing with the token for half a second (a
process started meanwhile is found too), for at most a minute.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOKEN_ENV = "FRESHROLL_RAY_SESSION"
#: ``setproctitle``'s switch (Ray vendors it) that keeps a process title off the environment's
#: memory, so ``/proc/<pid>/environ`` keeps the token (see the module docstring)
NOENV_ENV = "SPT_NOENV"
RECORD_FILE = "ray.json"


def new_token() -> str:
    return secrets.token_hex(12)


def _environs() -> Iterator[tuple[int, list[bytes]]]:
    """``(pid, environment entries)`` of every process we may read, except this one."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone, or not ours to read
            continue
        yield int(entry), env.split(b"\0")


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...; the
    name may hold spaces and parentheses, so the fields start after its last ``)``), or
    None for a process gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def parents() -> dict[int, int]:
    """``pid -> parent pid`` of every live (non-zombie) process of this machine we may read."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (f := _stat(entry)) is not None and f[0] not in _DEAD:
            out[int(entry)] = int(f[1])
    return out


def with_descendants(roots: list[int]) -> list[int]:
    """``roots`` and every live descendant of them (children, their children, ...)."""
    if not roots:  # reap's polling loop, once the instance is gone: no scan of /proc
        return []
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():  # a zombie is not waited for: not in parents()
        children.setdefault(ppid, []).append(pid)
    found, todo = dict.fromkeys(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = None
                todo.append(child)
    return list(found)


def token_pids(entry: str) -> list[int]:
    """Processes whose ``/proc/<pid>/environ`` holds ``entry`` (``KEY=token``) and their
    descendants (a process whose title wiped its token), except this one."""
    needle, me = entry.encode(), os.getpid()
    roots = [pid for pid, env in _environs() if needle in env]
    return [p for p in with_descendants(roots) if p != me]


def session_pids(token: str) -> list[int]:
    """The processes of the private instance that carries ``token`` (:func:`token_pids`)."""
    return token_pids(f"{TOKEN_ENV}={token}")


#: a process's states in ``/proc/<pid>/stat`` once it has exited (zombie, dead)
_DEAD = (b"Z", b"X")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    f = _stat(pid)
    return f is not None and f[0] not in _DEAD


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    f = _stat(pid)
    return int(f[19]) if f is not None else None


def reap(token: str, grace: float = 3.0, settle: float = 0.5, limit_s: float = 60.0) -> list[int]:
    """Stop every process of the Ray instance that carries ``token``; returns their pids.

    Each process found gets ``SIGTERM``, then ``SIGKILL`` once it outlived ``grace``. The scan
    repeats until it has found nothing for ``settle`` seconds (a raylet or an agent may
    start a process while the others are being stopped: a fixed number of passes could
    leave that one behind), for at most ``limit_s``."""
    seen: dict[int, float] = {}  # pid -> when it was sent SIGTERM
    end = time.monotonic() + limit_s
    empty_since: float | None = None
    while (now := time.monotonic()) < end:
        pids = session_pids(token)
        if not pids:
            if empty_since is None:
                empty_since = now
            elif now - empty_since >= settle:
                break
        else:
            empty_since = None
        for pid in pids:
            first = pid not in seen
            if first:
                seen[pid] = now
            with contextlib.suppress(OSError):  # already gone
                if first:
                    os.kill(pid, signal.SIGTERM)
                elif now - seen[pid] >= grace:
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return list(seen)


def write_record(run_dir: Path, token: str, watchdog_pid: int | None) -> None:
    """``RUN_DIR/ray.json``: which Ray instance this run's driver started (atomically).

    The file names the instance's token, which tells its processes apart from any other's:
    it is created readable by its owner only (mode 0600 from ``open``, never widened, not
    a chmod after the write), whatever the umask and however readable the run directory.
    """
    me = os.getpid()
    record = {"token": token, "driver_pid": me, "driver_start": start_time(me),
              "watchdog_pid": watchdog_pid}
    tmp = run_dir / (RECORD_FILE + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover keeps its own mode: start from a new file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(record) + "\n")
    os.replace(tmp, run_dir / RECORD_FILE)
    entry = _index_entry(me, run_dir)
    with contextlib.suppress(OSError):  # best effort: the resume of run_dir still reaps
        fd = os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(str(run_dir.resolve()))


#: the machine-wide index of the run directories that hold a ``ray.json``: one file per
#: driver and run directory, ``<shm>/freshroll-ray-<driver pid>-<12 hex of the path>``,
#: holding the directory's path (never the token). Gone with a reboot, as the processes are.
INDEX_PREFIX = "freshroll-ray-"


def _index_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")


def _index_entry(pid: int, run_dir: Path) -> Path:
    key = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
    return _index_dir() / f"{INDEX_PREFIX}{pid}-{key}"


#: a dead driver's entry of another run directory is swept once it is this old (seconds):
#: a start on a shared machine leaves alone what was laid a moment ago (a test's)
GRACE_S = 60.0


def sweep_dead_drivers(own: Path | None = None, *, grace_s: float = GRACE_S) -> list[Path]:
    """Every run directory of the index whose driver is dead: its Ray instance's leftovers
    reaped and its ``ray.json`` (the instance's token, a credential) removed
    (:func:`reap_previous`), at the start of any run on the machine, resumed or not; a
    driver SIGKILLed with its watchdog otherwise left the token in its run directory until
    a resume of that very directory. ``own``: the starting run's directory, swept whatever
    the entry's age; another's once its entry is ``grace_s`` old. Returns the directories
    cleaned. A live driver's entry and directory are kept."""
    cleaned, now = [], time.time()
    mine = own.resolve() if own is not None else None
    for entry in sorted(_index_dir().glob(INDEX_PREFIX + "*")):
        pid = entry.name.removeprefix(INDEX_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or alive(int(pid)):
            continue
        try:
            run_dir: Path | None = Path(entry.read_text().strip())
            young = now - entry.stat().st_mtime < grace_s
        except (OSError, UnicodeDecodeError):
            run_dir, young = None, False
        if young and run_dir != mine:
            continue
        if run_dir is not None and run_dir.is_dir():
            record = read_record(run_dir)
            if record is not None and record.get("driver_pid") == int(pid):
                reap_previous(run_dir)
                cleaned.append(run_dir)
        entry.unlink(missing_ok=True)
    return cleaned


def read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((run_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("token"), str) else None


def remove_record(run_dir: Path, token: str) -> None:
    record = read_record(run_dir)
    if record is not None and record["token"] == token:
        (run_dir / RECORD_FILE).unlink(missing_ok=True)
    _index_entry(os.getpid(), run_dir).unlink(missing_ok=True)


def reap_previous(run_dir: Path) -> list[int]:
    """Reap the Ray instance a previous, dead driver of ``run_dir`` left behind."""
    record = read_record(run_dir)
    if record is None:
        return []
    pid, started = record.get("driver_pid"), record.get("driver_start")
    if isinstance(pid, int) and pid != os.getpid() and alive(pid) and start_time(pid) == started:
        return []  # that driver still runs: its instance is not ours to stop
    pids = reap(record["token"])
    (run_dir / RECORD_FILE).unlink(missing_ok=True)
    if isinstance(pid, int):
        _index_entry(pid, run_dir).unlink(missing_ok=True)
    return pids


def start_watchdog(token: str) -> subprocess.Popen[bytes]:
    """A process that reaps ``token`` once this process (the driver) is gone."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.Popen(
        [sys.executable, "-S", "-u", str(Path(__file__).resolve()), token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True, close_fds=True,
    )


#: what the driver writes to its watchdog once its own :func:`reap` has found the instance
#: gone: the watchdog then exits without a second reap (its settle alone was 0.57 s of every
#: Ray run's stop, measured; issue 25, seventh session)
REAPED = b"reaped\n"


def stop_watchdog(proc: subprocess.Popen[bytes], timeout: float = 20.0,
                  reaped: bool = False) -> None:
    """Close the pipe (the watchdog reaps, then exits; with ``reaped``, the caller's own
    :func:`reap` found the instance gone, and it exits at once) and wait for it."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # a watchdog gone already reads nothing
            if reaped:
                proc.stdin.write(REAPED)
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _watch(token: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the driver's death ends the watch
    tail = b""
    while chunk := sys.stdin.buffer.read(4096):
        tail = (tail + chunk)[-len(REAPED):]
    if tail != REAPED:  # the driver died, or stopped without reaping itself
        reap(token)


if __name__ == "__main__":
    _watch(sys.argv[1])

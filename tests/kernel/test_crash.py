"""Crash safety: SIGKILL the simulated run anywhere, resume it, and the invariants still hold.

Three layers:

- real processes: ``python tests/kernel/kernel_driver.py`` is SIGKILLed after a seeded
  delay (spread from before the ledger exists to the end of the run), then the same
  command resumes and drains the run; ``verify`` must pass and exactly ``STEPS`` steps
  must be committed, no sample twice;
- ledger prefixes, in process: any prefix of a run's history (what a crash leaves,
  since the ledger may flush at any append) must resume to a clean run;
- ledger creation: a crash at any SQL statement while a ledger file is being created
  must leave no file or a whole one, that a reader and the restart can open; a hot
  journal that a kill inside an unprotected creation leaves is recovered by a reader
  (issue 23, defect 1).
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from kernel_driver import SimConfig, Simulator, open_buffer, simulate
from killed import kill_inside_ledger_creation

from freshroll.clock import VirtualClock
from freshroll.errors import LedgerError, StateError
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, SampleId, request_of
from freshroll.ledger.store import LEDGER_FILE, Ledger, decode_event, holds_events

STEPS = 12
SEEDS = range(20)
FLUSH_EVERY = (1, 4, 16, 64)
SIM = [sys.executable, str(Path(__file__).with_name("kernel_driver.py"))]
TIMEOUT = 60


def _cmd(run: Path, seed: int, flush_every: int) -> list[str]:
    return [*SIM, str(run), "--faults", "--steps", str(STEPS), "--seed", str(seed),
            "--flush-every", str(flush_every)]


def _events(run: Path) -> list[ev.Event]:
    """The durable events of a run (as a second reader: the run may be live)."""
    return [e for _, e in _events_of_rows(_rows(run))]


def _events_of_rows(rows: list[tuple[int, str, bytes]]) -> list[tuple[int, ev.Event]]:
    return [(seq, decode_event(body, where=f"seq {seq}")) for seq, _, body in rows]


def _rows(run: Path) -> list[tuple[int, str, bytes]]:
    """Durable rows; none when the kill came before the ledger file was initialised."""
    path = run / LEDGER_FILE
    if not path.is_file():
        return []
    with Ledger(path, readonly=True) as ledger:  # recovers what the kill left beside it
        return list(ledger.rows())


def _count(events: list[ev.Event], kind: type[ev.Event]) -> int:
    return sum(isinstance(e, kind) for e in events)


def _phase(events: list[ev.Event]) -> str:
    """Where a kill landed, judged from what the killed process made durable."""
    if not any(isinstance(e, ev.Opened) for e in events):
        return "before_open"
    if not any(isinstance(e, ev.Committed) for e in events):
        return "before_first_commit"
    if not isinstance(events[-1], ev.Closed):
        return "mid_run"
    return "finished"


def _assert_clean(run: Path, events: list[ev.Event]) -> None:
    report = verify_run(run)
    assert report.ok, report.render()
    assert report.closed
    committed = [e for e in events if isinstance(e, ev.Committed)]
    assert len(committed) == STEPS
    samples = [s for e in committed for s in e.samples]
    assert len(samples) == len(set(samples)), "a sample was committed twice"
    requests = [request_of(s) for s in samples]
    assert len(requests) == len(set(requests)), "a request was committed twice"
    versions = [e.version for e in committed]
    assert len(set(versions)) == STEPS
    assert [int(v[1 : v.index("-")]) for v in versions] == list(range(1, STEPS + 1))


# -- real processes, SIGKILL ------------------------------------------------------------
def _durable_kinds(path: Path) -> Counter[str]:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            return Counter(dict(db.execute("SELECT kind, count(*) FROM events GROUP BY kind")))
        finally:
            db.close()
    except sqlite3.Error:  # not created yet
        return Counter()


@cache
def _timeline(flush_every: int, scratch: Path) -> tuple[float, float, float]:
    """When an uninterrupted run first has an ``opened`` and a ``committed`` event durable,
    and when it ends (wall seconds after the spawn; the fastest of two runs, watched by a
    polling reader): the kill delays are drawn inside these phases."""
    best = (float("inf"),) * 3
    for attempt in range(2):
        run = scratch / f"measure-k{flush_every}-{attempt}"
        run.mkdir(parents=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(_cmd(run, 999, flush_every), stdout=subprocess.DEVNULL)
        t_open = t_commit = None
        while proc.poll() is None:
            kinds = _durable_kinds(run / LEDGER_FILE)
            now = time.perf_counter() - t0
            if t_open is None and kinds["opened"]:
                t_open = now
            if t_commit is None and kinds["committed"]:
                t_commit = now
            time.sleep(0.0005)
        t_end = time.perf_counter() - t0
        assert proc.returncode == 0
        t_open = t_end if t_open is None else t_open
        t_commit = t_end if t_commit is None else t_commit
        best = (min(best[0], t_open), min(best[1], t_commit), min(best[2], t_end))
    return best


@dataclass
class KillResult:
    seed: int
    flush_every: int
    anchor: str | None
    delay: float
    phase: str
    killed_rc: int
    opened: int
    resumed_stderr: str


def _kill_at(cmd: list[str], delay: float, run: Path, anchor: str | None) -> int:
    """SIGKILL ``delay`` seconds after the spawn, or after the first ``anchor`` event."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if anchor is not None:
        deadline = time.monotonic() + TIMEOUT
        while (proc.poll() is None and time.monotonic() < deadline
               and not _durable_kinds(run / LEDGER_FILE)[anchor]):
            time.sleep(0.0005)
    time.sleep(delay)
    proc.kill()  # SIGKILL: no cleanup, no flush, no atexit
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode in (0, -9), err.decode()
    return proc.returncode


def _resume(cmd: list[str], run: Path) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("timing")


@pytest.fixture(scope="module")
def kill_results() -> dict[int, KillResult]:
    return {}


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_then_resume(
    seed: int, tmp_path: Path, scratch: Path, kill_results: dict[int, KillResult]
) -> None:
    rng = random.Random(seed)
    flush_every = rng.choice(FLUSH_EVERY)
    t_open, t_commit, t_end = _timeline(flush_every, scratch)
    # A quarter of the kills aim at the start-up (no ledger yet: a delay after the spawn),
    # a quarter between the first event and the first commit (a delay after ``opened`` is
    # durable), half at the rest of the run (a delay after the first ``committed``).
    # Anchoring on the run's own progress keeps the spread when start-up time varies.
    anchor, lo, hi = [
        (None, 0.0, t_open),
        ("opened", 0.0, t_commit - t_open),
        ("committed", 0.0, 0.8 * (t_end - t_commit)),
        ("committed", 0.0, t_end - t_commit),
    ][seed % 4]
    delay = rng.uniform(lo, hi)
    run = tmp_path / "run"
    cmd = _cmd(run, seed, flush_every)
    rc = _kill_at(cmd, delay, run, anchor)
    before = _rows(run)
    phase = _phase([e for _, e in _events_of_rows(before)])
    proc = _resume(cmd, run)

    after = _rows(run)
    assert after[: len(before)] == before, "the resume rewrote durable history"
    events = _events(run)
    opened = _count(events, ev.Opened)
    kill_results[seed] = KillResult(seed, flush_every, anchor, delay, phase, rc, opened,
                                    proc.stderr.decode())
    _assert_clean(run, events)
    if phase in ("before_first_commit", "mid_run", "finished"):
        assert opened >= 2, phase  # the killed incarnation and the resume
        incarnations = [e.incarnation for e in events if isinstance(e, ev.Opened)]
        assert incarnations == list(range(len(incarnations)))
    else:
        assert opened == 1  # nothing was durable: the resume started afresh


def test_kills_landed_in_every_phase(kill_results: dict[int, KillResult]) -> None:
    """The seeded delays really exercise crashes before the first commit and mid-run."""
    if len(kill_results) < len(SEEDS):
        pytest.skip("run together with test_sigkill_then_resume")
    phases = Counter(r.phase for r in kill_results.values())
    for r in sorted(kill_results.values(), key=lambda r: r.seed):
        print(f"seed {r.seed:2d} flush_every {r.flush_every:2d} "
              f"{r.delay:.3f}s after {r.anchor or 'spawn'} "
              f"-> {r.phase} (rc {r.killed_rc}, {r.opened} opened)")
    print("kill phases:", dict(phases))
    assert phases["before_open"] + phases["before_first_commit"] >= 2, phases
    assert phases["mid_run"] >= 3, phases


def _wait_for(run: Path, done: object, proc: subprocess.Popen[bytes]) -> list[ev.Event]:
    """Poll the ledger (as a second reader) until ``done(events)`` holds."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            events = _events(run)
        except LedgerError:  # the file is being created right now
            events = []
        if done(events):  # type: ignore[operator]
            return events
        assert proc.poll() is None, "the run ended before the kill point"
        time.sleep(0.001)
    raise AssertionError("kill point never reached")


def test_killed_twice_in_a_row_then_completed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = _cmd(run, 4242, 1)  # flush every event: the longest run, the finest kill points
    # kill 1: mid-run, right after the first committed step is durable
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = _wait_for(run, lambda es: _count(es, ev.Committed) >= 1, proc)
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    assert _count(first, ev.Opened) == 1
    # kill 2: the resumed process dies during its own recovery / first round
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for(run, lambda es: _count(es, ev.Opened) >= 2, proc)
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    second = _events(run)
    assert not isinstance(second[-1], ev.Closed)
    # a third process completes the run
    _resume(cmd, run)
    events = _events(run)
    assert _count(events, ev.Opened) == 3
    assert _count(events, ev.Closed) == 1
    _assert_clean(run, events)


def test_resume_of_a_finished_run_adds_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = _cmd(run, 7, 64)
    subprocess.run(cmd, check=True, capture_output=True, timeout=TIMEOUT)
    once = _events(run)
    _assert_clean(run, once)
    subprocess.run(cmd, check=True, capture_output=True, timeout=TIMEOUT)
    twice = _events(run)
    assert twice[: len(once)] == once
    _assert_clean(run, twice)
    new = Counter(type(e).__name__ for e in twice[len(once):])
    assert not (set(new) & {"Requested", "Started", "Committed", "Leased"}), new


# -- ledger prefixes, in process ------------------------------------------------------------
KERNEL = KernelConfig(max_staleness=1, batch_groups=4, group_size=4)


def _sim(seed: int) -> SimConfig:
    return SimConfig(steps=STEPS, seed=seed, faults=True, sync="off")


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> list[ev.Event]:
    run = tmp_path_factory.mktemp("full") / "run"
    simulate(run, KERNEL, _sim(11), VirtualClock()).ledger.close()
    events = _events(run)
    _assert_clean(run, events)
    return events


def _fence_windows(events: list[ev.Event]) -> set[int]:
    """Prefix lengths that end after a ``worker_fenced`` but before all of its discards."""
    inside: set[int] = set()
    for i, e in enumerate(events):
        if isinstance(e, ev.WorkerFenced):
            j = i + 1
            while (j < len(events) and isinstance(events[j], ev.Discarded)
                   and events[j].reason == "fenced"):  # type: ignore[attr-defined]
                j += 1
            inside.update(range(i + 1, j))  # prefix holds the fence, not every discard
    return inside


def _resume_prefix(events: list[ev.Event], n: int, run: Path) -> list[ev.Event]:
    with Ledger(run / LEDGER_FILE, sync="off") as ledger:
        for e in events[:n]:
            ledger.append(e)
    start = max((e.ts for e in events[:n]), default=0.0) + 1.0
    simulate(run, KERNEL, _sim(11), VirtualClock(start)).ledger.close()
    return _events(run)


def test_every_sampled_prefix_resumes_cleanly(history: list[ev.Event], tmp_path: Path) -> None:
    window = _fence_windows(history)
    cuts = [n for n in range(len(history) + 1) if n not in window]
    sample = sorted({0, 1, 2, len(history) - 1, len(history),
                     *random.Random(0).sample(cuts, 40)} & set(cuts))
    for n in sample:
        run = tmp_path / f"cut{n}"
        events = _resume_prefix(history, n, run)
        assert events[:n] == history[:n]
        _assert_clean(run, events)


def test_prefix_cut_inside_a_fence_resumes_cleanly(
    history: list[ev.Event], tmp_path: Path
) -> None:
    window = sorted(_fence_windows(history))
    assert window
    for n in window:
        run = tmp_path / f"cut{n}"
        events = _resume_prefix(history, n, run)
        _assert_clean(run, events)


def test_recovery_after_crash_between_fence_and_its_discards(tmp_path: Path) -> None:
    """Minimal reproducer: a worker is lost, the process dies after ``worker_fenced``."""
    path = tmp_path / LEDGER_FILE
    clock = VirtualClock()
    kernel = KernelConfig(max_staleness=1, batch_groups=1, group_size=2)
    led = Ledger(path)
    buf = SampleBuffer.open(led, kernel, clock, run_id="r",
                            initial_version=PolicyVersion.initial("m"))
    epoch = buf.register_worker("w0")
    buf.admit("prompt")
    for rid in buf.take_requests(2):
        buf.start(rid, "w0", epoch, buf.version)  # type: ignore[arg-type]
    led.flush()
    led.flush_every = 1  # the ledger may flush after ANY append: here right after the fence
    led.append(ev.WorkerFenced(ts=clock.now(), worker="w0", epoch=epoch, reason="lost"))
    del buf, led  # SIGKILL before fence_worker emitted its discarded(fenced) events

    led = Ledger(path)
    buf = SampleBuffer.open(led, kernel, clock, run_id="r",
                            initial_version=PolicyVersion.initial("m"))
    # both requests must be re-issued (queued again), not left running on a fenced epoch
    assert buf.in_flight() == 2
    assert len(buf.take_requests(10)) == 2, buf.stats()


# -- ledger creation -------------------------------------------------------------------
_CREATE = textwrap.dedent("""
    import os, sqlite3, sys
    path, crash_at = sys.argv[1], int(sys.argv[2])
    seen = [0]
    real_connect = sqlite3.connect

    def connect(*args, **kwargs):
        db = real_connect(*args, **kwargs)

        def trace(statement):
            seen[0] += 1
            if seen[0] == crash_at:
                os._exit(9)  # dies before this statement runs, like a SIGKILL

        db.set_trace_callback(trace)
        return db

    sqlite3.connect = connect
    from freshroll.ledger import events as ev
    from freshroll.ledger.store import Ledger
    led = Ledger(path)
    led.append(ev.Closed(ts=1.0))
    led.close()
    print(seen[0])
""")


def test_crash_at_any_statement_of_ledger_creation_leaves_an_openable_file(
    tmp_path: Path,
) -> None:
    total = None
    crash_at = 1
    while total is None or crash_at <= total:
        path = tmp_path / f"c{crash_at}" / LEDGER_FILE
        path.parent.mkdir()
        proc = subprocess.run([sys.executable, "-c", _CREATE, str(path), str(crash_at)],
                              capture_output=True, timeout=TIMEOUT)
        if proc.returncode == 0:
            total = int(proc.stdout)
            if crash_at > total:
                break
        else:
            assert proc.returncode == 9, proc.stderr.decode()
        if path.exists():
            with Ledger(path) as ledger:  # the restart opens what the crash left
                n = len(list(ledger.events()))
                assert n in (0, 1)
                if n == 0:
                    ledger.append(ev.Closed(ts=2.0))
            with Ledger(path, readonly=True) as ledger:
                assert len(list(ledger.events())) == 1
        crash_at += 1
    assert total is not None and total >= 5


def test_readers_open_what_a_crash_at_any_statement_of_creation_leaves(
    tmp_path: Path,
) -> None:
    """Issue 23, defect 1: the ledger appears whole or not at all; a reader (verify, export,
    resume's check) opens it before any writer did, and no journal is left beside it."""
    crash_at, total = 1, None
    while total is None or crash_at <= total:
        path = tmp_path / f"r{crash_at}" / LEDGER_FILE
        path.parent.mkdir()
        proc = subprocess.run([sys.executable, "-c", _CREATE, str(path), str(crash_at)],
                              capture_output=True, timeout=TIMEOUT)
        if proc.returncode == 0:
            total = int(proc.stdout)
        else:
            assert proc.returncode == 9, proc.stderr.decode()
        if path.exists():
            with Ledger(path, readonly=True) as ledger:
                assert len(list(ledger.events())) in (0, 1)
            # never a rollback journal: the file was whole when it appeared (a WAL may be
            # there: a writer killed after it opened the whole file)
            assert not path.with_name(LEDGER_FILE + "-journal").exists()
        assert holds_events(path) == (proc.returncode == 0)
        with Ledger(path) as ledger:  # the restart takes what the crash left (and its .tmp-)
            pass
        assert sorted(p.name for p in path.parent.iterdir()) == [LEDGER_FILE]
        crash_at += 1
    assert total is not None and total >= 5


def test_a_hot_journal_left_by_a_kill_in_creation_is_recovered_by_a_reader(
    tmp_path: Path,
) -> None:
    """Issue 23, defect 1: a read-only open cannot roll a hot journal back ("attempt to
    write a readonly database"); the reader recovers it first and sees an empty ledger."""
    path = tmp_path / LEDGER_FILE
    journal = kill_inside_ledger_creation(path)
    with Ledger(path, readonly=True) as ledger:
        assert list(ledger.events()) == [] and ledger.last_seq == 0
    assert not journal.exists()
    assert not holds_events(path)  # a new run may start here
    with Ledger(path) as ledger:  # and a writer makes it a whole ledger
        ledger.append(ev.Closed(ts=1.0))
    with Ledger(path, readonly=True) as ledger:
        assert len(list(ledger.events())) == 1
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name='half'").fetchone()[0] == 0
    db.close()


def test_a_hot_journal_in_a_read_only_directory_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ro" / LEDGER_FILE
    kill_inside_ledger_creation(path)
    real_connect = sqlite3.connect

    def no_writes(target: str, *args: object, **kwargs: object) -> sqlite3.Connection:
        if "mode=rw" in str(target):  # as if the directory were read-only (root ignores modes)
            raise sqlite3.OperationalError("attempt to write a readonly database")
        return real_connect(target, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", no_writes)
    with pytest.raises(LedgerError) as info:
        Ledger(path, readonly=True)
    msg = str(info.value)
    assert str(path) in msg and LEDGER_FILE + "-journal" in msg and "writable" in msg
    assert "\n" not in msg


def test_stalled_simulation_raises_instead_of_spinning(tmp_path: Path) -> None:
    """A run that can make no progress fails loudly instead of hanging the crash tests."""

    class NoWorkers(Simulator):  # admits, but never starts anything
        def _start_all(self) -> list[tuple[SampleId, str]]:
            return []

    sim = SimConfig(steps=2, seed=0)
    buf = open_buffer(tmp_path / "run", KERNEL, sim, VirtualClock())
    with pytest.raises(StateError, match="stalled at step 0/2"):
        NoWorkers(buf, sim).run()
    buf.ledger.close()

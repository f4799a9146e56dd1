"""Throughput of the lifecycle kernel on the durable ledger, and the time to rebuild state.

Drives the whole lifecycle of every sample (admit -> start -> complete ->
reward -> ready -> lease -> commit) through a real :class:`SampleBuffer` on a
real SQLite ledger, from one Python thread, with a lean driver (no fault logic,
no random numbers, no models) so that the kernel is what is measured. Three
ledger settings run side by side, interleaved round by round so that noise on a
shared machine hits them alike:

- ``durable``: ``sync="full"``, default ``flush_every``; the buffer flushes (one
  fsync'd transaction) at every trainer commit, as in a real run;
- ``normal``:  ``sync="normal"`` (WAL not fsync'd at each commit; survives a
  process crash, not a power cut);
- ``off``:     ``sync="off"`` (the OS decides when to write: the in-memory-ish
  baseline, so the cost of durability is visible).

Then it times the rebuild of state from an existing ledger of exactly
``--rebuild-events`` events (default 100,000), cut mid-flight as a SIGKILL
would leave it: ``Ledger(...)`` + ``SampleBuffer.open`` = replay + recovery,
median of ``--rebuild-repeats``.

Goals (from the issue): >= 20,000 committed samples/s sustained with durable
commits; rebuild <= 2 s. The script prints PASS/MISS per goal and always the
figures it measured.

Usage::

    .venv/bin/python benchmarks/kernel_throughput.py            # full run (~1-2 min)
    .venv/bin/python benchmarks/kernel_throughput.py --quick    # smoke run (seconds)
    .venv/bin/python benchmarks/kernel_throughput.py --json out.json
    .venv/bin/python benchmarks/kernel_throughput.py --profile durable   # + cProfile top 30
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from freshroll.clock import RealClock
from freshroll.kernel.buffer import SampleBuffer, replay_ledger
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion, RewardVersion
from freshroll.ledger.store import LEDGER_FILE, Ledger, open_ledger

GOAL_SAMPLES_PER_S = 20_000.0
GOAL_REBUILD_S = 2.0
REWARD = str(RewardVersion.of("bench", config={"kind": "constant"}))
SETTINGS = "bench-settings"
INITIAL = PolicyVersion.initial("bench-model")

#: name -> Ledger keyword arguments (flush_every left at its default: commits flush)
MODES: dict[str, dict[str, Any]] = {
    "durable": {"sync": "full"},
    "normal": {"sync": "normal"},
    "off": {"sync": "off"},
}


@dataclass(frozen=True)
class Workload:
    group_size: int = 8
    batch_groups: int = 32
    max_staleness: int = 1
    workers: int = 8
    payload_bytes: int = 200
    tokens: int = 256

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.batch_groups


@dataclass
class RunResult:
    mode: str
    samples: int  # committed
    steps: int
    events: int  # appended during the timed window
    flushes: int
    wall_s: float
    cpu_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def us_per_sample(self) -> float:
        return 1e6 * self.wall_s / self.samples

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s


def open_buffer(run_dir: Path, w: Workload, **ledger_kw: Any) -> SampleBuffer:
    ledger = open_ledger(run_dir, **ledger_kw)
    kernel = KernelConfig(w.max_staleness, w.batch_groups, w.group_size)
    return SampleBuffer.open(ledger, kernel, RealClock(), run_id=run_dir.name,
                             initial_version=INITIAL)


def drive(buf: SampleBuffer, w: Workload, steps: int, stop_at_events: int | None = None) -> None:
    """The lean driver: ``steps`` more trainer steps, every sample through every stage.

    Requests are started in admission order, round-robin over the workers,
    with the current policy; each is completed (with a payload) and rewarded
    at once. The trainer leases and commits whenever a batch is ready.
    """
    workers = [(f"w{i}", buf.register_worker(f"w{i}")) for i in range(w.workers)]
    n_workers = len(workers)
    payload = b"x" * w.payload_bytes or None
    tokens = w.tokens
    target = buf.counts["steps"] + steps
    start, complete, reward = buf.start, buf.complete, buf.reward
    ledger = buf.ledger
    prompt = 0
    while buf.counts["steps"] < target:
        for _ in range(buf.capacity()):
            buf.admit(f"prompt-{prompt}")
            prompt += 1
        version = str(buf.version)
        for i, rid in enumerate(buf.take_requests(1 << 30)):
            wid, epoch = workers[i % n_workers]
            sid = start(rid, wid, epoch, version)
            complete(sid, tokens=tokens, gen_s=0.0, payload=payload)
            reward(sid, 0.5, REWARD)
            if stop_at_events is not None and ledger.last_seq >= stop_at_events:
                return
        while buf.counts["steps"] < target and (lease := buf.lease()) is not None:
            buf.commit(lease.id, SETTINGS)


def run_mode(mode: str, w: Workload, samples: int, root: Path, warmup_steps: int = 2) -> RunResult:
    """One timed run of ``mode`` on a fresh ledger (opening and warm-up not timed)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root))
    buf = open_buffer(run_dir, w, **MODES[mode])
    try:
        drive(buf, w, warmup_steps)
        steps = max(1, -(-samples // w.samples_per_step))
        seq0, flushes0 = buf.ledger.last_seq, buf.ledger.flushes
        committed0, steps0 = buf.counts["committed"], buf.counts["steps"]
        c0, t0 = time.process_time(), time.perf_counter()
        drive(buf, w, steps)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        result = RunResult(
            mode, buf.counts["committed"] - committed0, buf.counts["steps"] - steps0,
            buf.ledger.last_seq - seq0, buf.ledger.flushes - flushes0, wall, cpu,
        )
        buf.shutdown("done")
    finally:
        buf.ledger.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


# == rebuild ===========================================================================

def build_crashed_ledger(w: Workload, n_events: int, root: Path) -> Path:
    """A ledger of exactly ``n_events`` events, cut mid-flight as a crash leaves it.

    Written with ``sync="off"`` for speed (the file format does not depend on
    it), then every event after ``n_events`` is deleted: what a SIGKILL leaves
    is a prefix of the history, and recovery must rebuild a state from any
    prefix (open leases released, running attempts fenced and re-issued).
    """
    run_dir = root / "rebuild-master"
    buf = open_buffer(run_dir, w, sync="off")
    drive(buf, w, steps=1 << 30, stop_at_events=n_events)
    buf.ledger.close()
    db = sqlite3.connect(run_dir / LEDGER_FILE)
    db.execute("DELETE FROM events WHERE seq > ?", (n_events,))
    db.commit()
    (count,) = db.execute("SELECT count(*) FROM events").fetchone()
    db.execute("VACUUM")
    db.close()
    if count != n_events:
        raise SystemExit(f"rebuild ledger has {count} events, wanted {n_events}")
    return run_dir


def time_rebuild(master: Path, w: Workload, repeats: int, root: Path) -> dict[str, Any]:
    """Median of ``repeats`` reopen+recover runs, each on a fresh copy of ``master``."""
    opens, replays = [], []
    recovered = {}
    for i in range(repeats):
        run_dir = root / f"rebuild-{i}"
        shutil.copytree(master, run_dir)
        t0 = time.perf_counter()
        buf = open_buffer(run_dir, w, sync="full")  # connect + replay + recover + flush
        opens.append(time.perf_counter() - t0)
        recovered = {
            "events_after_open": buf.ledger.last_seq, "steps": buf.counts["steps"],
            "committed": buf.counts["committed"], "in_flight": buf.in_flight(),
            "ready_groups": buf.ready_groups(),
        }
        buf.ledger.close()
        shutil.rmtree(run_dir)
        # replay alone (read-only, no recovery): what verify/report pay to read a ledger
        with Ledger(master / LEDGER_FILE, readonly=True) as ledger:
            t0 = time.perf_counter()
            replay_ledger(ledger, KernelConfig(w.max_staleness, w.batch_groups, w.group_size),
                          RealClock())
            replays.append(time.perf_counter() - t0)
    return {
        "open_s": opens, "open_median_s": statistics.median(opens),
        "replay_only_s": replays, "replay_only_median_s": statistics.median(replays),
        "recovered_state": recovered,
    }


# == reporting =========================================================================

def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "sqlite": sqlite3.sqlite_version,
        "msgspec": msgspec.__version__,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def fsync_latency(root: Path, n: int = 50) -> float:
    """Median seconds of one fsync after a 64 KiB write in ``root``: the price of a durable
    commit on this disk, paid once per trainer step."""
    path = root / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(n):
            os.write(fd, b"x" * 65536)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def summarize(results: list[RunResult]) -> dict[str, Any]:
    rates = [r.samples_per_s for r in results]
    med = statistics.median(rates)
    best = min(results, key=lambda r: abs(r.samples_per_s - med))
    return {
        "samples_per_s": med, "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
        "us_per_sample": statistics.median(r.us_per_sample for r in results),
        "cpu_us_per_sample": statistics.median(1e6 * r.cpu_s / r.samples for r in results),
        "events_per_s": statistics.median(r.events_per_s for r in results),
        "events_per_sample": best.events / best.samples,
        "samples": best.samples, "steps": best.steps, "flushes": best.flushes,
        "runs": [asdict(r) for r in results],
    }


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    head = (f"{'mode':8} {'samples/s':>10} {'(min..max)':>17} {'us/sample':>10} "
            f"{'cpu us/s.':>10} {'events/s':>10} {'ev/sample':>9} {'flushes':>7}")
    print(head)
    print("-" * len(head))
    for mode, s in summary.items():
        spread = f"{s['samples_per_s_min']:,.0f}..{s['samples_per_s_max']:,.0f}"
        print(f"{mode:8} {s['samples_per_s']:>10,.0f} {spread:>17} {s['us_per_sample']:>10.1f} "
              f"{s['cpu_us_per_sample']:>10.1f} {s['events_per_s']:>10,.0f} "
              f"{s['events_per_sample']:>9.2f} {s['flushes']:>7}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run")
    p.add_argument("--samples", type=int, default=120_000,
                   help="committed samples per timed run (rounded up to whole steps)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per mode")
    p.add_argument("--rebuild-events", type=int, default=100_000)
    p.add_argument("--rebuild-repeats", type=int, default=3)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-groups", type=int, default=32)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--payload-bytes", type=int, default=200)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    p.add_argument("--dir", type=Path, default=None,
                   help="where ledgers are written (default: a temp dir; pick a real disk)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--profile", choices=list(MODES), default=None,
                   help="also run this mode once under cProfile and print the top functions")
    a = p.parse_args(argv)
    if a.quick:
        a.samples, a.repeats, a.rebuild_events, a.rebuild_repeats = 10_240, 1, 20_000, 1
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    w = Workload(a.group_size, a.batch_groups, a.max_staleness, payload_bytes=a.payload_bytes)

    root = Path(tempfile.mkdtemp(prefix="freshroll-bench-", dir=a.dir))
    try:
        print(f"workload: group_size={w.group_size} batch_groups={w.batch_groups} "
              f"({w.samples_per_step} samples/step) max_staleness={w.max_staleness} "
              f"payload={w.payload_bytes} B/sample, {a.samples:,} samples x {a.repeats} "
              f"rounds per mode; ledgers in {root}")
        host = machine()
        print("machine:", ", ".join(f"{k}={v}" for k, v in host.items()))
        fsync_s = fsync_latency(root)
        print(f"fsync latency (64 KiB write, median of 50): {fsync_s * 1e3:.2f} ms")
        results: dict[str, list[RunResult]] = {m: [] for m in modes}
        for _round in range(a.repeats):
            for m in modes:
                results[m].append(run_mode(m, w, a.samples, root))
        summary = {m: summarize(rs) for m, rs in results.items()}
        print()
        print_table(summary)
        if "durable" in summary and "off" in summary:
            extra = summary["durable"]["us_per_sample"] - summary["off"]["us_per_sample"]
            print(f"durability costs {extra:.1f} us/sample = {extra * w.samples_per_step / 1e3:.2f}"
                  f" ms per trainer commit ({w.samples_per_step} samples/commit)")

        print(f"\nrebuild: ledger of {a.rebuild_events:,} events, cut mid-flight; "
              f"open = connect + replay + recovery, {a.rebuild_repeats} runs")
        master = build_crashed_ledger(w, a.rebuild_events, root)
        size = (master / LEDGER_FILE).stat().st_size
        rebuild = time_rebuild(master, w, a.rebuild_repeats, root)
        rebuild["events"], rebuild["file_bytes"] = a.rebuild_events, size
        print(f"  open+recover median {rebuild['open_median_s']:.3f} s "
              f"(runs: {', '.join(f'{t:.3f}' for t in rebuild['open_s'])}); "
              f"replay only median {rebuild['replay_only_median_s']:.3f} s; "
              f"file {size / 1e6:.1f} MB")
        print(f"  recovered: {rebuild['recovered_state']}")

        goals = {}
        if "durable" in summary:
            got = summary["durable"]["samples_per_s"]
            goals["durable_samples_per_s"] = {"goal": GOAL_SAMPLES_PER_S, "measured": got,
                                              "pass": got >= GOAL_SAMPLES_PER_S}
        got = rebuild["open_median_s"]
        scaled = got * 100_000 / a.rebuild_events
        goals["rebuild_100k_s"] = {"goal": GOAL_REBUILD_S, "measured": scaled,
                                   "pass": scaled <= GOAL_REBUILD_S,
                                   "extrapolated": a.rebuild_events != 100_000}
        print("\ngoals:")
        for name, g in goals.items():
            note = " (extrapolated linearly from a smaller ledger)" if g.get("extrapolated") else ""
            cmp = ">=" if name.endswith("per_s") else "<="
            print(f"  {'PASS' if g['pass'] else 'MISS'}  {name}: measured {g['measured']:,.3f} "
                  f"{cmp} goal {g['goal']:,.0f}{note}")

        if a.profile:
            profile(a.profile, w, a.samples, root)

        if a.json:
            a.json.write_text(json.dumps({
                "workload": asdict(w), "samples_per_run": a.samples, "repeats": a.repeats,
                "machine": host, "loadavg_1m_end": round(os.getloadavg()[0], 2),
                "fsync_median_s": fsync_s, "throughput": summary,
                "rebuild": rebuild,
                "goals": goals, "argv": sys.argv[1:],
            }, indent=1))
            print(f"\nwrote {a.json}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def profile(mode: str, w: Workload, samples: int, root: Path) -> None:
    prof = cProfile.Profile()
    prof.enable()
    r = run_mode(mode, w, samples, root)
    prof.disable()
    print(f"\ncProfile of {mode} ({r.samples:,} samples; timings inflated by the profiler):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    sys.exit(main())

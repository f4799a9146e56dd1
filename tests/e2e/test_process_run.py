"""Real runs under ``run.runtime: process``: workers in child processes, weights in /dev/shm.

The CLI run is checked by ``freshroll verify``; a worker SIGKILLed mid-run is survived (fenced,
its attempts re-issued, a new child synced to the current version before it generates); and
a worker whose weights arrive late never generates on a version older than max_staleness
allows (all read back from the ledger)."""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import freshroll, summary

from freshroll.config import Config, validate
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.hooks import Hooks
from freshroll.placement.adapters import KillableThreadEngine
from freshroll.placement.process_engine import ProcessEngine
from freshroll.placement.shm_segments import PREFIX, segment_owner, shm_dir
from freshroll.runtime.placements import Components
from freshroll.runtime.run import run

pytestmark = pytest.mark.slow

#: a short real workload: 2 worker processes, tiny model
WORKLOAD: dict[str, Any] = {
    "run": {"steps": 8, "max_staleness": 1, "progress": False, "runtime": "process"},
    "task": {"name": "reverse", "n_prompts": 64},
    "rollout": {"engine": "hf", "group_size": 4, "batch_groups": 4, "max_new_tokens": 6,
                "workers": 2, "worker_batch": 8},
    "control": {"mode": "static"},
    "limits": {"weights_timeout_s": 60.0, "worker_start_timeout_s": 240.0},
}


def _cfg(**run: Any) -> Config:
    data = {**WORKLOAD, "run": {**WORKLOAD["run"], **run}}
    return validate(data, "test")


def _leaked_segments(since: float) -> list[str]:
    """Weight segments in /dev/shm made since ``since`` (this test's) whose driver is gone
    (a segment another process leaked earlier is not this test's)."""
    out = []
    for p in shm_dir().glob(PREFIX + "*"):
        if p.stat().st_mtime < since - 1.0:
            continue
        owner = segment_owner(p.name)  # PREFIX<run key>-<pid>-<tag>
        assert owner is not None, f"a weight segment of an unknown form: {p.name}"
        pid = owner[1]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            out.append(p.name)
    return out


def _rows(out: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return [tuple(r) for r in db.execute(sql)]
    finally:
        db.close()


def _events(out: Path) -> list[tuple[str, dict[str, Any]]]:
    import json

    return [(k, json.loads(b)) for k, b in
            _rows(out, "SELECT kind, body FROM events ORDER BY seq")]


def _step(version: str) -> int:
    return PolicyVersion.parse(version).step


def test_a_cli_run_under_process_placement_verifies_and_leaves_no_segment(tmp_path: Path):
    t0 = time.time()
    out = tmp_path / "run"
    proc = freshroll("run", "configs/default.yaml", "--out", str(out), "run.steps=6",
                     "run.runtime=process", "rollout.workers=2", timeout=600)
    start = next(line for line in proc.stderr.splitlines() if line.startswith(f"freshroll: {out}:"))
    # an explicit placement: nothing to probe, the fixed thread budget, and no "auto: why"
    assert "2 worker(s) (process, torch threads: trainer 1, each worker 1 (auto" in start, start
    assert "auto:" not in start and summary(out)["host"]["placement"]["probe"] is None
    assert summary(out)["steps"] == 6
    assert freshroll("verify", str(out)).returncode == 0
    loads = _rows(out, "SELECT json_extract(body,'$.worker'), json_extract(body,'$.version'), "
                       "json_extract(body,'$.transfer_s') FROM events "
                       "WHERE kind='weights_loaded'")
    assert {w for w, _, _ in loads} == {"w0", "w1"}  # both children were sent every version
    assert all(0 < s < 60 for _, _, s in loads)
    assert _leaked_segments(t0) == []


class KillOnce(Hooks):
    """SIGKILLs w0's child (``KillableThreadEngine.kill``, the chaos harness's real
    ``kill_worker``) as its first generate call after step ``step`` begins; later steps wait
    until the replacement serves, so the new child surely generates before the run ends."""

    def __init__(self, step: int) -> None:
        self.step, self.hooks = step, self
        self.go, self.replaced = asyncio.Event(), asyncio.Event()
        self.pids: list[int] = []

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        inner, self.buf = parts.engine_factory, buf
        session = self

        async def factory(name: str) -> Any:
            engine = await inner(name)
            if name != "w0":
                return engine
            session.pids.append(engine.engine.pid)
            if len(session.pids) > 1:
                session.replaced.set()
            real = engine.generate

            async def generate(requests: Any, params: Any, seed: int, emit: Any) -> None:
                if session.go.is_set() and len(session.pids) == 1 and not session.killed:
                    session.killed = True
                    assert isinstance(engine, KillableThreadEngine)
                    buf.record(ev.FaultInjected(ts=buf.clock.now(), fault="kill_worker",
                                                target="w0", detail="SIGKILL of the child"))
                    await engine.kill()
                await real(requests, params, seed, emit)

            engine.generate = generate  # type: ignore[method-assign]
            return engine

        trainer = parts.trainer
        real_step = trainer.step

        async def step(lease: Any) -> Any:
            if session.killed:
                await session.replaced.wait()
            return await real_step(lease)

        trainer.step = step  # type: ignore[method-assign]
        return Components(factory, parts.scorer, trainer, parts.close)

    killed = False

    def committed(self, version: PolicyVersion) -> None:
        if version.step == self.step:
            self.go.set()


def test_a_killed_worker_process_is_replaced_and_synced_before_it_generates(tmp_path: Path):
    t0 = time.time()
    out = tmp_path / "kill"
    session = KillOnce(step=2)
    result = run(_cfg(steps=10), out, chaos=session, stream=io.StringIO(), report=False)
    assert result.ok, verify_run(out).render()
    assert session.killed and len(session.pids) == 2 and session.pids[0] != session.pids[1]
    events = _events(out)
    assert ("w0", 0, "lost") in {(b["worker"], b["epoch"], b["reason"]) for k, b in events
                                 if k == "worker_fenced"}
    reissued = {b["sample"] for k, b in events if k == "discarded" and b["reason"] == "fenced"}
    assert reissued, "the killed call's attempts were not re-issued"
    # the new child (epoch 1) loads the current version before its first attempt starts
    current, synced, first = None, None, None
    for k, b in events:
        if k in ("policy_published", "committed"):  # the trainer's version from here on
            current = b["version"]
        elif k == "weights_loaded" and b["worker"] == "w0" and b["epoch"] == 1:
            synced = (b["version"], current)
        elif k == "started" and b["worker"] == "w0" and b["epoch"] == 1 and first is None:
            first = b["version"]
            break
    assert synced is not None and first is not None, "w0's new epoch never served"
    assert synced[0] == synced[1] == first
    assert _leaked_segments(t0) == []


class SlowLoad(ProcessEngine):
    """A worker whose weights arrive late: each load takes ``DELAY_S`` more."""

    DELAY_S = 1.0

    def load_weights(self, handle: Any) -> float:
        t0 = time.perf_counter()
        time.sleep(self.DELAY_S)
        super().load_weights(handle)
        return time.perf_counter() - t0


def test_weights_arriving_late_never_let_a_worker_generate_too_stale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import freshroll.runtime.placements as placements_mod

    out = tmp_path / "late"
    cfg = _cfg(steps=8, max_staleness=1)
    real_build = placements_mod.build_engine

    def slow(c: Config, p: Path, n: str, channel: Any = None, threads: Any = None) -> Any:
        engine = real_build(c, p, n, channel, threads)
        engine.__class__ = SlowLoad
        return engine

    monkeypatch.setattr(placements_mod, "build_engine", slow)
    result = run(cfg, out, stream=io.StringIO(), report=False)
    assert result.ok, verify_run(out).render()
    eta = cfg.run.max_staleness
    current, worst_start, starts = 0, 0, 0
    started: dict[str, int] = {}
    slow_loads = 0
    for k, b in _events(out):
        if k in ("policy_published", "committed"):
            current = max(current, _step(b["version"]))
        elif k == "started":
            started[b["sample"]] = _step(b["version"])
            worst_start = max(worst_start, current - started[b["sample"]])
            starts += 1
        elif k == "weights_loaded":
            slow_loads += b["transfer_s"] >= SlowLoad.DELAY_S
        if k == "committed":
            trainer = _step(b["parent"])
            for s in b["samples"]:
                assert trainer - started[s] <= eta, f"{s} consumed at lag > {eta}"
    assert slow_loads > 0 and starts > 0  # the loads really were late
    assert worst_start <= eta, f"an attempt started {worst_start} versions behind"

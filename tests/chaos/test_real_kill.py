"""The real worker-kill fault: ``ray.kill`` of a worker's actor in a real Ray run.

Driven by a minimal chaos session of this file (not the Injector), so it checks the runtime's
part alone: the adapter's ``kill`` really kills the actor, the call in flight (or the next)
fails as a dead actor does, and the pool fences the epoch, re-issues its attempts and starts
a new actor; the run finishes with every invariant holding, and its Ray instance is gone.
"""

from __future__ import annotations

import asyncio
import io
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from freshroll.chaos.plan import Plan, Scenario
from freshroll.chaos.real import real_workload
from freshroll.config import validate
from freshroll.engines.hf import HFEngine
from freshroll.errors import RunFailed, WorkerLost
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.hooks import Hooks
from freshroll.placement.adapters import KillableThreadEngine, ThreadEngine, adapt
from freshroll.runtime.placements import Components
from freshroll.runtime.run import run


class KillAfterStep(Hooks):
    """Kills worker ``w0``'s actor (its engine's ``kill``) as its first generate call after
    step ``step`` is committed begins: the call's attempts are started, its actor is dead."""

    def __init__(self, step: int) -> None:
        self.step, self.engines = step, dict[str, list[Any]]()
        self.go, self.replaced = asyncio.Event(), asyncio.Event()
        self.killed: list[tuple[str, int]] = []  # (actor id, pid) of the killed actor
        self.restarted: list[tuple[str, int]] = []  # and of its replacement
        self.hooks = self

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        inner, self.buf = parts.engine_factory, buf

        async def factory(name: str) -> Any:
            engine = await inner(name)
            if name in self.engines:  # a restart: which actor serves now
                self.restarted.append(await asyncio.to_thread(actor_of, engine))
                self.replaced.set()
            self.engines.setdefault(name, []).append(engine)
            return _Watched(engine, self) if name == "w0" else engine

        return Components(factory, parts.scorer, _WaitForReplacement(parts.trainer, self),
                          parts.close)

    def committed(self, version: PolicyVersion) -> None:
        if version.step == self.step:
            self.go.set()

    async def kill(self, engine: Any) -> None:
        assert isinstance(engine, KillableThreadEngine)
        self.killed.append(await asyncio.to_thread(actor_of, engine))
        self.buf.record(ev.FaultInjected(ts=self.buf.clock.now(), fault="kill_worker",
                                         target="w0", detail="#0 ray.kill"))
        await engine.kill()


class _Watched:
    """w0's engine: its first call after the session's step kills its actor, then goes on."""

    def __init__(self, inner: Any, session: KillAfterStep) -> None:
        self.inner, self.session, self.continuous = inner, session, inner.continuous

    async def generate(self, requests: Any, params: Any, seed: int, emit: Any) -> None:
        if self.session.go.is_set() and not self.session.killed:
            await self.session.kill(self.inner)
        await self.inner.generate(requests, params, seed, emit)

    async def load_weights(self, weights: Any) -> float:
        return float(await self.inner.load_weights(weights))

    async def cancel(self, samples: Any) -> None:
        await self.inner.cancel(samples)

    async def close(self) -> None:
        await self.inner.close()


class _WaitForReplacement:
    """The run's trainer, whose steps after the kill wait until the killed worker is back
    (a Ray actor starts in seconds; this tiny run's steps take a tenth of one), so the new
    actor surely serves before the run ends."""

    def __init__(self, inner: Any, session: KillAfterStep) -> None:
        self.inner, self.session = inner, session
        self.settings_digest = inner.settings_digest

    async def step(self, lease: Any) -> Any:
        if self.session.killed:
            await self.session.replaced.wait()
        return await self.inner.step(lease)

    async def before_commit(self, version: PolicyVersion) -> None:
        await self.inner.before_commit(version)

    def weights(self) -> Any:
        return self.inner.weights()


def actor_of(engine: ThreadEngine) -> tuple[str, int]:
    import ray

    actor = engine.engine._actor  # type: ignore[attr-defined]
    pid = ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=60)
    return actor._actor_id.hex(), pid


def test_an_inline_engine_gets_no_kill(tmp_path: Path):
    from freshroll.engines.tiny import save_tiny

    engine = HFEngine.from_pretrained(save_tiny(tmp_path / "tiny", seed=0))
    cfg = validate(real_workload(_plan(), _plan().scenarios[0], 0, "inline"), "test")
    adapted = adapt(engine, "w0", cfg.limits)
    assert type(adapted) is ThreadEngine and not hasattr(adapted, "kill")


def _plan(steps: int = 24) -> Plan:
    return Plan(real_workload={"run": {"steps": steps}}, scenarios=[Scenario(name="kill", faults=[
        {"kind": "kill_worker", "at": {"step": 1}, "target": "w0"}], real=True)])


@pytest.mark.slow
@pytest.mark.ray
def test_ray_kill_really_kills_the_actor_and_the_pool_restarts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from freshroll.placement import ray_reaper
    from freshroll.placement.ray_reaper import alive, session_pids

    # 6 steps: the kill comes with w0's first call after step 1, and every step after it
    # waits for the new actor (_WaitForReplacement), so the new actor serves in step 2
    plan = _plan(steps=6)
    cfg = validate(real_workload(plan, plan.scenarios[0], 0, "ray"), "test")
    assert cfg.run.runtime == "ray" and cfg.rollout.workers == 2
    session = KillAfterStep(1)
    out = tmp_path / "ray"
    tokens: list[str] = []
    new_token = ray_reaper.new_token
    monkeypatch.setattr(ray_reaper, "new_token", lambda: tokens.append(new_token()) or tokens[-1])
    result = run(cfg, out, chaos=session, stream=io.StringIO(), report=False)
    assert result.ok, verify_run(out).render()
    (actor_id, pid), = session.killed
    (new_id, new_pid), = session.restarted
    assert new_id != actor_id and new_pid != pid  # a new actor, in a new process
    assert not alive(pid), "the killed actor's process is still alive"
    db = sqlite3.connect(out / "ledger.sqlite")
    fenced = [tuple(r) for r in db.execute(
        "SELECT json_extract(body,'$.worker'), json_extract(body,'$.epoch'), "
        "json_extract(body,'$.reason') FROM events WHERE kind='worker_fenced'")]
    assert ("w0", 0, "lost") in fenced
    epochs = {r[0] for r in db.execute(
        "SELECT json_extract(body,'$.epoch') FROM events WHERE kind='started' "
        "AND json_extract(body,'$.worker')='w0'")}
    assert 1 in epochs  # w0 served again, on a new epoch (the new actor)
    reissued = {r[0].partition("#")[0] for r in db.execute(
        "SELECT json_extract(body,'$.sample') FROM events WHERE kind='discarded' "
        "AND json_extract(body,'$.reason')='fenced'")}
    assert reissued  # the killed call's attempts were re-issued, and each one committed once
    assert len(session.engines["w0"]) == 2
    faults = db.execute("SELECT count(*) FROM events WHERE kind='fault_injected'").fetchone()
    assert faults == (1,)
    # the Ray instance of the run is gone with it
    assert tokens and session_pids(tokens[0]) == []



class LoseInline(Hooks):
    """A synthetic loss (what the Injector raises for an engine without ``kill``): w0's first
    generate call after step 1 raises WorkerLost."""

    def __init__(self) -> None:
        self.hooks, self.armed, self.lost = self, False, 0

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        inner = parts.engine_factory

        async def factory(name: str) -> Any:
            engine = await inner(name)
            real = engine.generate

            async def generate(requests: Any, params: Any, seed: int, emit: Any) -> None:
                if self.armed and not self.lost:
                    self.lost += 1
                    raise WorkerLost("synthetic loss of an inline engine")
                await real(requests, params, seed, emit)

            engine.generate = generate
            return engine

        return Components(factory, parts.scorer, parts.trainer, parts.close)

    def committed(self, version: PolicyVersion) -> None:
        self.armed = version.step >= 1


@pytest.mark.slow
def test_a_lost_inline_engine_stops_the_run_clearly_and_a_resume_finishes_it(tmp_path: Path):
    """Why kill_worker / stall_worker are skipped inline (chaos/real.py): an inline engine
    cannot be restarted, so its loss ends the run at once, naming the worker; the ledger
    holds and ``--resume`` (a new engine in a new process) finishes the run."""
    plan = _plan(steps=6)
    cfg = validate(real_workload(plan, plan.scenarios[0], 0, "inline"), "test")
    out = tmp_path / "inline"
    session = LoseInline()
    with pytest.raises(RunFailed, match=r"inference worker 'w0' lost: WorkerLost: synthetic "
                                        r"loss .*; its engine cannot be restarted"):
        run(cfg, out, chaos=session, stream=io.StringIO(), report=False)
    assert session.lost == 1
    assert verify_run(out).ok, verify_run(out).render()
    result = run(None, out, resume=True, stream=io.StringIO(), report=False)
    assert result.ok and result.summary["steps"] == 6


@pytest.mark.slow
@pytest.mark.ray
def test_a_thread_still_in_a_ray_call_leaves_when_ray_stops(tmp_path: Path):
    """An abandoned call (here: to a stopped actor) must not touch Ray after its shutdown:
    Ray would end this whole process. It leaves with WorkerLost when ``stop_ray`` begins."""
    import signal
    import threading

    from freshroll.engines.tiny import save_tiny
    from freshroll.placement.ray_engine import RayEngine, start_ray, stop_ray

    start_ray(num_cpus=2)
    pid = None
    try:
        engine = RayEngine(save_tiny(tmp_path / "tiny", seed=0), generate_timeout_s=120.0)
        engine.wait_ready()
        pid = actor_of(adapt(engine, "w0", validate({}, "t").limits))[1]
        os.kill(pid, signal.SIGSTOP)  # alive, never answers
        errors: list[BaseException] = []

        def call() -> None:
            try:
                engine.generate(["rev 123="], max_new_tokens=3, seed=1)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive()  # stuck in the call
    finally:
        stop_ray()
    thread.join(10.0)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], WorkerLost)
    assert "shutting down" in str(errors[0])
    with pytest.raises(WorkerLost, match="shut down"):  # and later calls never reach Ray
        engine.generate(["rev 123="], max_new_tokens=3, seed=1)

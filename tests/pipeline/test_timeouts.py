"""Every hand-off has a timeout: a stuck engine is fenced and restarted, its late results are
rejected; a stuck reward discards as reward_timeout; repeated timeouts end the run.

Before the limits, each of these runs waited forever on the stuck call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from freshroll.errors import (
    FailureBudgetExceeded,
    Interrupted,
    NoProgress,
    RunFailed,
    WorkerTimeout,
    exit_status,
)
from freshroll.ledger import events as ev
from freshroll.pipeline.observers import Callbacks
from freshroll.pipeline.workers import MAX_RESTARTS
from freshroll.ports.threads import AbandonableExecutor, CallAborted
from pipeline_fakes import FakeEngine, FakeLearner, Harness, blocker, ok_reward

# -- the executor that can walk away ------------------------------------------------------


def test_abandoned_call_does_not_block_the_next_one_and_threads_are_daemons():
    gate = threading.Event()
    pool = AbandonableExecutor("t")
    stuck = pool.submit(gate.wait, 30)
    time.sleep(0.05)
    assert not stuck.done()
    pool.abandon()
    assert pool.submit(lambda: 42).result(timeout=5) == 42
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-"))
    gate.set()
    assert stuck.result(timeout=5) is True
    pool.shutdown(wait=True, timeout=5)


def test_keyboard_interrupt_and_system_exit_arrive_as_exceptions():
    pool = AbandonableExecutor("t")

    def ctrl_c() -> None:
        raise KeyboardInterrupt("inside user code")

    with pytest.raises(Interrupted, match="KeyboardInterrupt inside user code"):
        pool.submit(ctrl_c).result(timeout=5)  # the operator's stop: the run stops, resumable
    with pytest.raises(CallAborted, match="SystemExit"):
        pool.submit(lambda: exit(2)).result(timeout=5)
    assert pool.submit(lambda: "still works").result(timeout=5) == "still works"
    pool.shutdown()


# -- inference workers --------------------------------------------------------------------


def test_a_stuck_generate_is_fenced_reissued_restarted_and_its_late_results_rejected(
    tmp_path: Path,
):
    gate, behaviour = blocker()
    engine = FakeEngine(behaviour)
    engine.restart = lambda: (setattr(engine, "restarts", engine.restarts + 1), gate.set())
    h = Harness(tmp_path, engines=[engine], overrides=["limits.generate_timeout_s=0.3",
                                                       "run.steps=4"])
    t0 = time.monotonic()
    assert h.run() is None
    assert time.monotonic() - t0 < 30
    assert len(h.steps) == 4 and engine.restarts == 1
    fenced = h.events(ev.WorkerFenced)
    assert [(f.worker, f.epoch, f.reason) for f in fenced] == [("w0", 0, "timeout")]
    first_batch = [s.sample for s in h.events(ev.Started) if s.epoch == 0]
    assert first_batch  # the stuck call's attempts
    reissued = {d.sample for d in h.events(ev.Discarded) if d.reason == "fenced"}
    assert reissued == set(first_batch)
    # the abandoned call returned once the gate opened: each result was offered, none applied
    rejected = {r.sample: r.reason for r in h.events(ev.Rejected)}
    assert rejected == {s: "fenced" for s in first_batch}
    generated = {g.sample for g in h.events(ev.Generated)}
    assert not generated & set(first_batch)
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()


def test_a_stuck_weight_load_is_a_timeout_too(tmp_path: Path):
    gate = threading.Event()

    class SlowLoad(FakeEngine):
        def load_weights(self, state: Any) -> float:
            self.loads += 1
            if self.loads == 1:
                gate.wait(30)
            return 0.0

        def restart(self) -> None:
            self.restarts += 1
            gate.set()

    engine = SlowLoad()
    h = Harness(tmp_path, engines=[engine], overrides=["limits.weights_timeout_s=0.3"])
    assert h.run() is None
    assert len(h.steps) == 3 and engine.restarts == 1
    assert [f.reason for f in h.events(ev.WorkerFenced)] == ["timeout"]


def test_a_stuck_engine_that_cannot_restart_ends_the_run_naming_the_worker(tmp_path: Path):
    gate, behaviour = blocker()
    h = Harness(tmp_path, engines=[FakeEngine(behaviour, can_restart=False)],
                overrides=["limits.generate_timeout_s=0.3"])
    err = h.run()
    gate.set()
    assert type(err) is RunFailed
    assert "inference worker 'w0' timeout" in str(err)
    assert "did not return within 0.3 s" in str(err) and "cannot be restarted" in str(err)
    assert isinstance(err.__cause__, WorkerTimeout)
    assert h.buf.closed and h.verify().ok


def test_restarts_are_capped_per_worker(tmp_path: Path):
    def always_stuck(call: int) -> None:
        time.sleep(2)

    engine = FakeEngine(always_stuck)
    h = Harness(tmp_path, engines=[engine], overrides=["limits.generate_timeout_s=0.1"])
    err = h.run()
    assert type(err) is RunFailed and f"restarted {MAX_RESTARTS} times" in str(err)
    assert engine.restarts == MAX_RESTARTS
    assert [f.reason for f in h.events(ev.WorkerFenced)] == ["timeout"] * (MAX_RESTARTS + 1)
    assert h.verify().ok


# -- rewards ------------------------------------------------------------------------------


def test_a_reward_stuck_once_discards_its_batch_as_reward_timeout_and_the_run_goes_on(
    tmp_path: Path,
):
    gate = threading.Event()
    calls = 0

    def stuck_once(prompts: Any, completions: list[str], **kw: Any) -> list[float]:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(30)  # time.sleep(10**6) in real life; the gate lets the test clean up
        return ok_reward(prompts, completions)

    h = Harness(tmp_path, rewards=[("stuck_once", stuck_once)],
                overrides=["limits.reward_timeout_s=0.3"])
    try:
        assert h.run() is None
    finally:
        gate.set()
    assert len(h.steps) == 3
    timeouts = [d for d in h.events(ev.Discarded) if d.reason == "reward_timeout"]
    assert timeouts and all("limits.reward_timeout_s" in d.detail for d in timeouts)
    h.buf.shutdown("done")
    assert h.verify().ok


def test_a_reward_that_always_hangs_ends_the_run_after_max_consecutive_timeouts(
    tmp_path: Path,
):
    gate = threading.Event()

    def sleeps(prompts: Any, completions: list[str], **kw: Any) -> list[float]:
        gate.wait(60)
        return ok_reward(prompts, completions)

    h = Harness(tmp_path, rewards=[("sleeps", sleeps)],
                overrides=["limits.reward_timeout_s=0.2", "limits.max_consecutive_timeouts=3"])
    t0 = time.monotonic()
    err = h.run()
    elapsed = time.monotonic() - t0
    gate.set()
    assert type(err) is FailureBudgetExceeded
    assert str(err).startswith("reward function 'sleeps' (timeouts) failed 3 calls in a row")
    assert "did not return within 0.2 s" in str(err)
    assert elapsed < 30  # the stuck threads were abandoned, not joined
    assert h.buf.counts["discarded_reward_timeout"] > 0
    assert h.verify().ok


# -- stalls: the heartbeat, the no-progress guard, the trainer step's bound ----------------


def test_a_stalled_generate_is_said_past_the_heartbeat(tmp_path: Path):
    gate, behaviour = blocker()
    engine = FakeEngine(behaviour)
    engine.restart = lambda: (setattr(engine, "restarts", engine.restarts + 1), gate.set())
    h = Harness(tmp_path, engines=[engine], overrides=[
        "limits.generate_timeout_s=0.6", "limits.heartbeat_s=0.2", "run.steps=1"])
    lines: list[str] = []
    h.pipe.observers.append(Callbacks(on_wait=lines.append))
    assert h.run(timeout_s=10) is None
    said = [line for line in lines if line.endswith("on w0 generate, limit 0.6 s")]
    assert said and said[0].startswith("waiting 0.") and said[0] != said[-1], lines
    assert engine.restarts == 1  # the bound still ends the wait: fenced, restarted


def test_a_run_that_commits_nothing_stops_naming_what_it_waited_on(tmp_path: Path):
    gate = threading.Event()

    def stuck(prompts: Any, completions: list[str], **kw: Any) -> list[float]:
        gate.wait(30)
        return ok_reward(prompts, completions)

    h = Harness(tmp_path, rewards=[("stuck", stuck)], overrides=[
        "limits.reward_timeout_s=60", "limits.max_no_progress_s=0.6", "limits.heartbeat_s=0.2"])
    lines: list[str] = []
    h.pipe.observers.append(Callbacks(on_wait=lines.append))
    t0 = time.monotonic()
    try:
        err = h.run(timeout_s=10)
    finally:
        gate.set()
    assert time.monotonic() - t0 < 15  # stuck for 30 s
    assert type(err) is NoProgress and exit_status(err) == 3
    assert str(err).startswith("no trainer step committed for 0.") and "after step 0" in str(err)
    assert "(limits.max_no_progress_s=0.6)" in str(err)
    assert "s on reward function 'stuck', limit 60 s" in str(err)
    assert any("on reward function 'stuck', limit 60 s" in line for line in lines)
    assert h.buf.closed and h.verify().ok  # closed "failed": resumable


def test_a_stalled_generate_stops_the_run_and_its_engine_waits_for_it_out_loud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
):
    """The guard names the worker; closing its engine waits for the stuck call until the
    call's own bound (its thread may hold the model), saying so past the heartbeat."""
    gate, behaviour = blocker()
    # the guard (0.9 s from the run's start) leaves the wait (from the call's start, later)
    # 0.6 s past its heartbeat to be said in: with 0.4, a loaded machine (load 9) started the
    # call or ran a watch tick late enough that the guard fired first and nothing was said
    h = Harness(tmp_path, engines=[FakeEngine(behaviour)], overrides=[
        "limits.generate_timeout_s=1.2", "limits.max_no_progress_s=0.9", "limits.heartbeat_s=0.3"])
    lines: list[str] = []
    h.pipe.observers.append(Callbacks(on_wait=lines.append))
    try:
        err = h.run(timeout_s=10)
    finally:
        gate.set()
    assert type(err) is NoProgress and "s on w0 generate, limit 1.2 s" in str(err)
    assert any(line.endswith("on w0 generate, limit 1.2 s") for line in lines), lines
    closing = "s on w0 generate to return before its engine closes, limit 1.2 s"
    assert closing in capsys.readouterr().err
    assert h.buf.closed and h.verify().ok


def test_a_stuck_in_process_trainer_step_is_bounded_and_said(tmp_path: Path):
    gate = threading.Event()
    learner = FakeLearner(lambda call: gate.wait(30) if call == 2 else None)
    h = Harness(tmp_path, learner=learner, overrides=[
        "limits.train_timeout_s=0.6", "limits.heartbeat_s=0.2"])
    lines: list[str] = []
    h.pipe.observers.append(Callbacks(on_wait=lines.append))
    t0 = time.monotonic()
    try:
        err = h.run(timeout_s=10)  # its close does not wait for the abandoned step
    finally:
        gate.set()
    assert time.monotonic() - t0 < 15  # stuck for 30 s
    assert type(err) is RunFailed and isinstance(err.__cause__, WorkerTimeout)
    assert "the trainer's step did not return within 0.6 s (limits.train_timeout_s)" in str(err)
    assert any(line.endswith("on trainer step 2, limit 0.6 s") for line in lines), lines
    assert len(h.steps) == 1 and h.buf.closed and h.verify().ok


def test_limits_reject_unknown_keys_and_out_of_bounds_values():
    from freshroll.config import load_config
    from freshroll.errors import ConfigError

    with pytest.raises(ConfigError, match=r"limits.reward_timeout: unknown key"):
        load_config(None, ["limits.reward_timeout=3"])
    with pytest.raises(ConfigError, match=r"limits.generate_timeout_s"):
        load_config(None, ["limits.generate_timeout_s=0"])
    with pytest.raises(ConfigError, match=r"limits.max_failure_ratio"):
        load_config(None, ["limits.max_failure_ratio=1.5"])


# -- Ray: a stopped actor process ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
def test_a_stopped_ray_actor_times_out_and_restarts(tmp_path: Path):
    import os
    import signal

    import ray

    from freshroll.engines.tiny import save_tiny
    from freshroll.placement.ray_engine import RayEngine, start_ray, stop_ray

    path = save_tiny(tmp_path / "tiny", seed=0)
    start_ray(num_cpus=2)
    pid = None
    try:
        engine = RayEngine(path, generate_timeout_s=3.0, weights_timeout_s=3.0)
        engine.wait_ready()
        pid = ray.get(engine._actor.__ray_call__.remote(lambda actor: os.getpid()))
        os.kill(pid, signal.SIGSTOP)  # as `kill -STOP`: alive, never answers
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeout, match="did not answer generate within 3 s"):
            engine.generate(["rev 123="], max_new_tokens=3, seed=1)
        assert time.monotonic() - t0 < 30
        with pytest.raises(WorkerTimeout, match="load_weights"):
            engine.load_weights(engine_state(path))
        engine.restart()  # kills the stopped actor, starts a fresh one
        assert len(engine.generate(["rev 123="], max_new_tokens=3, seed=1)) == 1
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_ray()


def engine_state(path: Path) -> dict[str, Any]:
    from freshroll.engines.hf import HFEngine

    return HFEngine.from_pretrained(path).state_dict()


def test_a_trainer_that_says_its_own_waits_is_not_wrapped_in_one_step_bound(tmp_path: Path):
    """A Ray trainer actor lost in a step is killed, rebuilt, started and steps again: more
    than one ``limits.train_timeout_s``. Before, the pipeline's one ``trainer step N, limit
    600 s`` wait then ran past its limit; such a trainer (seams.SaysItsWaits) now says each of
    its waits with the bound that ends it."""
    h = Harness(tmp_path, overrides=["limits.train_timeout_s=0.3", "limits.heartbeat_s=0.1",
                                     "run.steps=1"])
    inner = h.trainer

    class Restarting:
        settings_digest = inner.settings_digest
        waits: Any = None

        async def step(self, lease: Any) -> Any:
            with self.waits.waiting("trainer actor restart 1: start", 5.0):
                await asyncio.sleep(0.6)  # past train_timeout_s: its own bound holds
            return await inner.step(lease)

        async def before_commit(self, version: Any) -> None:
            await inner.before_commit(version)

        def weights(self) -> Any:
            return inner.weights()

    h.pipe.trainer = Restarting()  # type: ignore[assignment]
    lines: list[str] = []
    h.pipe.observers.append(Callbacks(on_wait=lines.append))
    assert h.run(timeout_s=20) is None
    assert any(line.endswith("on trainer actor restart 1: start, limit 5 s") for line in lines)
    assert not any("on trainer step" in line for line in lines), lines
    assert len(h.steps) == 1

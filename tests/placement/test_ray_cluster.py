"""``run.runtime: ray`` on a cluster (issue 9): joining one, a cluster that does not answer,
reward actors (and one lost mid-run), and elastic workers as real actors.

The fast tests need no Ray process; the slow ones share one real Ray cluster of the module
(``ray start --head``, 2 CPUs, tests/ray_shared.py: its processes are reaped by its own token,
never ``ray stop``, which would stop every Ray process on the machine), which each run joins
with ``run.ray_address``: one cluster's start-up instead of one private instance per run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config, validate
from freshroll.errors import ClusterUnavailable, ConfigError
from freshroll.harness.verify import verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.pipeline.hooks import HookContext, Hooks
from freshroll.placement.ray_cluster import ScratchCluster, free_port
from freshroll.runtime import run as run_mod
from freshroll.runtime.placements import ray_cpus
from ray_shared import joining, shared_cluster

pytestmark = pytest.mark.ray

SMALL = ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
         "rollout.batch_groups=2", "rollout.worker_batch=4", "run.runtime=ray",
         "ray.trainer=driver"]


@pytest.mark.parametrize("address", ["garbage", "http://h:1", "h:", "h:0", "h:70000", ":6379",
                                     "a b:1", "ray://:1"])
def test_a_malformed_ray_address_is_a_config_error(address: str):
    with pytest.raises(ConfigError, match=r"ray_address"):
        load_config(None, [f"run.ray_address={address}"])


@pytest.mark.parametrize("address", ["10.0.0.5:6379", "head-node.local:6379",
                                     "ray://head:10001", "[::1]:6379", "auto"])
def test_a_ray_address_is_accepted(address: str):
    cfg = validate({"run": {"ray_address": address}}, "test")  # "[::1]:.." is YAML on a CLI
    assert cfg.run.ray_address == address


def test_an_address_that_does_not_answer_fails_fast_and_clearly():
    """A closed port: ClusterUnavailable within seconds, naming the address and what to
    check; nothing of Ray was started (a run says the same: the next test)."""
    import ray

    from freshroll.placement.ray_engine import start_ray

    address = f"127.0.0.1:{free_port()}"  # bound once, closed again: nothing listens
    t0 = time.monotonic()
    with pytest.raises(ClusterUnavailable) as err:
        start_ray(address=address, connect_timeout_s=3.0)
    assert time.monotonic() - t0 < 5.0
    msg = str(err.value)
    assert address in msg and "ray start --head" in msg and "ray status" in msg
    assert "port" in msg and not ray.is_initialized()


@pytest.mark.slow
def test_a_run_against_an_address_that_does_not_answer_stops_clearly(tmp_path: Path):
    import ray

    address = f"127.0.0.1:{free_port()}"
    cfg = load_config(None, [*SMALL, "run.steps=1", f"run.ray_address={address}"])
    t0 = time.monotonic()
    with pytest.raises(ClusterUnavailable, match=address.replace(".", r"\.")):
        run_mod.run(cfg, tmp_path / "run")
    assert time.monotonic() - t0 < 60.0  # the model and learner are built first
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the hanging reward of ``reward_run`` marks its one hang (a path the cluster's
    workers know from their environment: a joined run's actors inherit the cluster's)."""
    return tmp_path_factory.mktemp("marker") / "marker"


@pytest.fixture(scope="module")
def cluster(marker: Path) -> Iterator[ScratchCluster]:
    """The module's one Ray cluster (2 CPUs: the resize test counts them), joined by every
    run and direct Ray call of its slow tests, stopped (every process of it) at the end."""
    with shared_cluster(2, env={"FRESHROLL_TEST_MARKER": str(marker)}) as c:
        yield c


def _ledger(out: Path, sql: str) -> list[Any]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return list(db.execute(sql))
    finally:
        db.close()


def _wait_cpus(ray: Any, want: float, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        cpus = float(ray.available_resources().get("CPU", 0.0))
        if cpus == want or time.monotonic() > deadline:
            return cpus
        time.sleep(0.2)


@pytest.mark.slow
def test_a_run_joins_a_running_cluster_and_leaves_it_running(reward_run: _RewardRun,
                                                             cluster: ScratchCluster):
    """``ray start --head`` (2 CPUs), a short real run against it (one inference actor,
    one reward actor: ``reward_run``'s, whose faults leave the cluster as any run does),
    verify passes; afterwards the cluster still runs, freshroll's actors are gone (all its
    CPUs free again) and this process is disconnected. (The cluster is the module's,
    stopped and checked gone when the module ends.)"""
    import ray

    out, daemons = reward_run.out, reward_run.daemons
    assert len(daemons) == 2, daemons  # gcs_server and raylet
    assert reward_run.result.ok, verify_run(out).render()
    assert not reward_run.connected_after  # disconnected
    assert not (out / "ray.json").exists()  # no reaper record: not our cluster
    pids = cluster.pids()
    assert pids, "the cluster's processes must outlive the run"
    loads = _ledger(out, "SELECT json_extract(body, '$.transfer_s') FROM events "
                         "WHERE kind='weights_loaded'")
    assert loads and all(t >= 0 for (t,) in loads)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        assert _wait_cpus(ray, 2.0) == 2.0  # our actors were killed, the CPUs are free
    finally:
        ray.shutdown()
    assert set(cluster.daemon_pids()) == set(daemons)  # the same daemons, still running


class _Session:
    """A chaos session of the tests: keeps the run's parts, runs ``script`` as a hook."""

    def __init__(self, script: Any) -> None:
        self.parts: Any = None
        self.script = script
        session = self

        class _H(Hooks):
            async def run(self, ctx: HookContext) -> None:
                await session.script(ctx, session)

        self.hooks = _H()

    def wrap(self, parts: Any, buf: SampleBuffer) -> Any:
        self.parts = parts
        return parts


class _HeldTrainer:
    """The run's trainer, whose steps after the first wait until ``done`` is set: the run
    lasts as long as a script needs, however fast the machine is."""

    def __init__(self, inner: Any, done: asyncio.Event) -> None:
        self.inner, self.done = inner, done
        self.settings_digest = inner.settings_digest

    async def step(self, lease: Any) -> Any:
        if lease.version >= 1:
            await asyncio.wait_for(self.done.wait(), 300)
        return await self.inner.step(lease)

    async def before_commit(self, version: Any) -> None:
        await self.inner.before_commit(version)

    def weights(self) -> Any:
        return self.inner.weights()


async def _until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.mark.slow
def test_resize_adds_and_retires_real_actors(tmp_path: Path, cluster: ScratchCluster):
    """Workers added and retired during a real Ray run are real actors: a retired actor is
    gone and its CPU free (the cluster has exactly 2), so a later scale-up places a
    new one; the ledger shows the additions and the retirement, verify passes."""
    import ray

    from freshroll.placement import ray_engine

    seen: list[tuple[str, int, float]] = []

    async def snapshot(what: str) -> None:
        cpus = await asyncio.to_thread(lambda: float(ray.available_resources().get("CPU", 0)))
        seen.append((what, ray_engine.live_actors(), cpus))

    def two_ready(ctx: HookContext) -> bool:
        w = ctx.workers()
        return len(w.live) == 2 and w.ready == w.live

    async def script(ctx: HookContext, s: _Session) -> None:
        await _until(lambda: ctx.buffer.step >= 1, 120, "the first commit")
        await snapshot("one")
        ctx.resize(2)
        await _until(lambda: two_ready(ctx), 120, "a second worker")
        await snapshot("two")
        ctx.resize(1)
        await _until(lambda: not ctx.workers().leaving and ray_engine.live_actors() == 1, 60,
                     "the retired actor to end")
        # Ray's resource view follows a kill within a moment (the GCS is told asynchronously)
        await asyncio.to_thread(_wait_cpus, ray, 1.0)
        await snapshot("retired")
        ctx.resize(2)  # needs the retired actor's CPU
        await _until(lambda: two_ready(ctx), 120, "a third worker")
        await snapshot("again")
        done.set()

    done = asyncio.Event()
    session = _Session(script)
    wrap = session.wrap
    session.wrap = lambda parts, buf: dataclasses.replace(  # type: ignore[method-assign]
        wrap(parts, buf), trainer=_HeldTrainer(parts.trainer, done))
    cfg = load_config(None, [*SMALL, "run.steps=6", "rollout.workers=1",
                             "ray.reward_actors=0", joining(cluster)])
    assert ray_cpus(cfg) == 2
    out = tmp_path / "run"
    result = run_mod.run(cfg, out, chaos=session)
    assert result.ok, verify_run(out).render()
    assert [w for w, _, _ in seen] == ["one", "two", "retired", "again"], seen
    by = {w: (n, cpus) for w, n, cpus in seen}
    assert by["one"] == (1, 1.0) and by["two"] == (2, 0.0)
    assert by["retired"] == (1, 1.0) and by["again"] == (2, 0.0)
    ready = _ledger(out, "SELECT json_extract(body, '$.worker') FROM events "
                         "WHERE kind='worker_ready'")
    assert len({w for (w,) in ready}) == 3  # w0, then two added
    retired = _ledger(out, "SELECT json_extract(body, '$.worker') FROM events "
                           "WHERE kind='worker_fenced' AND json_extract(body, '$.reason')"
                           "='retired'")
    assert len(retired) == 1


_HANGS_ONCE = '''
import os, time
from pathlib import Path

def hangs_once(prompts, completions, **kw):
    marker = Path(os.environ["FRESHROLL_TEST_MARKER"])
    if not marker.exists():
        marker.write_text("hung")
        time.sleep(60)
    return [0.5 for _ in completions]
'''


@dataclasses.dataclass
class _RewardRun:
    out: Path
    result: Any
    session: _Session
    killed: list[str]  # the reward actor killed after the first commit
    marker: Path  # written by the reward's one hanging call
    daemons: list[int]  # the cluster's daemons before the run
    connected_after: bool  # ray.is_initialized() as the run returned


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory: pytest.TempPathFactory, cluster: ScratchCluster,
               marker: Path) -> _RewardRun:
    """One real run with one reward actor, shared by the three tests that read it (a Ray
    run costs ~15 CPU-s before its first step): its first reward call hangs past
    limits.reward_timeout_s (the actor is abandoned and replaced), then, after the first
    commit, its actor is killed (the call fails WorkerLost and is retried on a fresh one)."""
    from freshroll.placement.ray_scorer import RayScorer

    tmp = tmp_path_factory.mktemp("reward-run")
    reward = tmp / "hangs.py"
    reward.write_text(_HANGS_ONCE)
    killed: list[str] = []

    async def script(ctx: HookContext, s: _Session) -> None:
        await _until(lambda: ctx.buffer.step >= 1, 120, "the first commit")
        scorer = s.parts.scorer
        assert isinstance(scorer, RayScorer) and scorer.concurrency == 1
        killed.append(scorer.actor_ids()[0])
        await asyncio.to_thread(scorer.kill, 0)

    session = _Session(script)
    cfg = validate({
        # 6 steps: reward calls still follow the kill when the first commit is seen late (a
        # loaded machine; with 4 the last batch was once scored before it: 1 restart, not 2)
        "run": {"progress": False, "steps": 6, "runtime": "ray",
                "ray_address": cluster.address},
        "task": {"n_prompts": 64}, "rollout": {"group_size": 4, "batch_groups": 2,
                                              "worker_batch": 4, "workers": 1},
        "ray": {"trainer": "driver", "reward_actors": 1},
        "limits": {"reward_timeout_s": 10},
        "rewards": [{"fn": f"{reward}:hangs_once"}]}, "test")
    out = tmp / "run"
    daemons = cluster.daemon_pids()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRESHROLL_TEST_MARKER", str(marker))  # the cluster's actors have it too
        result = run_mod.run(cfg, out, chaos=session)
    import ray

    return _RewardRun(out, result, session, killed, marker, daemons, ray.is_initialized())


@pytest.mark.slow
def test_a_reward_actor_lost_mid_run_is_retried_and_restarted(reward_run: _RewardRun):
    """The reward actor is killed after the first commit: its call fails WorkerLost, the
    samples are scored again on a fresh actor (same reward version), verify passes."""
    out = reward_run.out
    assert reward_run.result.ok, verify_run(out).render()
    scorer, killed = reward_run.session.parts.scorer, reward_run.killed
    # restarted twice: after the stuck call (the other test) and after the kill
    assert killed and scorer.restarts >= 2 and killed[0] not in scorer.actor_ids()
    counts = json.loads((out / "counts.json").read_text())
    assert "discarded_reward_error" not in counts  # retried, not failed
    versions = {v for (v,) in _ledger(out, "SELECT DISTINCT json_extract(body, "
                                           "'$.reward_version') FROM events WHERE kind='rewarded'")}
    assert versions == {scorer.version}


@pytest.mark.slow
def test_a_stuck_reward_call_is_abandoned_and_its_actor_replaced(reward_run: _RewardRun):
    """A reward actor stuck past limits.reward_timeout_s: its samples are discarded
    reward_timeout (as a stuck thread's are), the actor is killed and replaced, and the
    next calls score on the fresh one; verify passes."""
    out = reward_run.out
    assert reward_run.result.ok, verify_run(out).render()
    counts = json.loads((out / "counts.json").read_text())
    assert counts.get("discarded_reward_timeout", 0) >= 1
    assert reward_run.session.parts.scorer.restarts >= 1
    assert reward_run.marker.read_text() == "hung"  # the first call did hang


@pytest.fixture(scope="class")
def _joined(cluster: ScratchCluster) -> Iterator[None]:
    """The tests of a class that call Ray directly (no run: a run joins and leaves on its
    own) joined to the module's cluster; at the end their actors are killed and this process
    disconnects (``stop_ray`` on a joined cluster)."""
    from freshroll.placement.ray_engine import start_ray, stop_ray

    start_ray(address=cluster.address)
    try:
        yield
    finally:
        stop_ray()


@pytest.mark.usefixtures("_joined")
class TestOnTheModulesCluster:
    """Reward actors and inference actors driven directly, on the module's cluster (the
    reward test's actors are closed before the next test's start: its 2 CPUs suffice)."""

    @pytest.mark.slow
    def test_reward_actors_must_build_the_drivers_reward_version(self):
        """Each reward actor builds the RewardSet from the config; a driver whose set differs
        (here: another weight) is refused before any sample is scored, naming both digests.
        (The refused scorer has one actor, not two: one actor's version is what is compared,
        and each actor is a Ray worker process's start-up.)"""
        from freshroll.errors import RunFailed
        from freshroll.placement.ray_scorer import RayScorer
        from freshroll.rewards.scoring import build_reward_set

        cfg = load_config(None, ["ray.reward_actors=2"])
        same = build_reward_set([e.model_dump(exclude_none=True) for e in cfg.rewards])
        other = build_reward_set([{"fn": "reverse", "weight": 2.0}])
        scorer = RayScorer(cfg, same)  # the same version: accepted
        assert scorer.concurrency == 2 and len(set(scorer.actor_ids())) == 2
        scorer.close()
        with pytest.raises(RunFailed, match=f"driver {other.version}"):
            RayScorer(load_config(None, ["ray.reward_actors=1"]), other)

    @pytest.mark.slow
    def test_load_weights_takes_a_ref_or_a_dict_and_a_lost_ref_is_worker_lost(
            self, tmp_path: Path):
        """One ``ray_publish`` ref loads into two actors (each fetching it itself, timed there),
        a plain dict still loads, and weights whose owner died are WorkerLost (the pool then
        fences and restarts the worker), never an untyped error."""
        import ray

        from freshroll.engines.tiny import save_tiny
        from freshroll.errors import WorkerLost
        from freshroll.placement.ray_engine import RayEngine, pack_state, ray_publish

        path = save_tiny(tmp_path / "tiny", seed=0)
        a, b = RayEngine(path), RayEngine(path)
        a.wait_ready()
        b.wait_ready()
        state = a.state_dict()
        moved = {k: v + 0.01 for k, v in state.items()}

        class _Learner:
            def published_state(self) -> dict[str, Any]:
                return moved

        ref = ray_publish(_Learner())
        assert isinstance(ref, ray.ObjectRef)
        for engine in (a, b):
            assert engine.load_weights(ref) > 0
            (load,) = engine.loads
            assert load.fetch_s > 0 and load.copy_s > 0 and load.caller_s >= load.fetch_s
            got = engine.state_dict()
            assert all(bool((got[k] == moved[k]).all()) for k in moved)
        assert a.load_weights(state) > 0  # a plain dict (tests, the first load)
        assert all(bool((a.state_dict()[k] == state[k]).all()) for k in state)

        @ray.remote(num_cpus=0)
        class _Owner:
            def put(self, value: Any) -> list[Any]:
                return [ray.put(value)]

        owner = _Owner.remote()  # type: ignore[attr-defined]
        (orphan,) = ray.get(owner.put.remote(pack_state(moved)), timeout=60)
        ray.kill(owner, no_restart=True)
        # the owner's death reaches the object store in its own time (over a second on a
        # loaded machine, the load then still succeeding): every load until then either
        # loads or is WorkerLost, never an untyped error
        deadline = time.monotonic() + 60
        while True:
            try:
                b.load_weights(orphan)
            except WorkerLost as exc:
                assert "object store" in str(exc)
                break
            assert time.monotonic() < deadline, "weights whose owner died still load after 60 s"
            time.sleep(0.5)

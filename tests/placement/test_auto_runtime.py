"""``run.runtime`` and ``run.torch_threads: auto``: the placement rule, the thread probe it
settles on, and the start line that says what it chose."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, cast

import pytest

from freshroll.config import validate
from freshroll.pipeline.fallback import Mode, Switch
from freshroll.placement import placement
from freshroll.placement.placement import auto_runtime, resolve_runtime


def _cfg(**run: Any) -> Any:
    engine = run.pop("engine", "hf")
    return validate({"run": run, "rollout": {"engine": engine}}, "test")


def test_auto_is_process_only_for_async_hf_on_two_cores():
    assert auto_runtime(_cfg(max_staleness=1), cores=2)[0] == "process"
    assert auto_runtime(_cfg(max_staleness=1), cores=1) == ("inline",
                                                            "one core: nothing to overlap")
    assert auto_runtime(_cfg(max_staleness=0), cores=8)[0] == "inline"
    assert auto_runtime(_cfg(max_staleness=2, engine="sim"), cores=8)[0] == "inline"
    assert auto_runtime(_cfg(max_staleness=2, engine="vllm"), cores=8)[0] == "inline"


def test_an_explicit_runtime_is_kept_and_auto_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(placement, "available_cores", lambda: 2)
    assert resolve_runtime(_cfg(runtime="process", max_staleness=0)) == "process"
    rt, why = auto_runtime(_cfg())
    assert resolve_runtime(_cfg()) == rt
    # the start line's words: what runs, its threads, and why for what was auto
    p = placement.plan(_cfg(), cores=2)
    assert p.describe() == (f"{rt}, {p.budget.describe()}; auto: {why}; in the sync "
                            "fallback's windows each stage's threads (1 or 2) settled on its "
                            "own calls")
    assert placement.plan(_cfg(runtime="inline", torch_threads=1), cores=2).describe() == \
        "inline, torch threads 1 (run.torch_threads, 2 cores)"


# -- auto settled on a thread probe ----------------------------------------------------------


def _probe(advantage: float, skipped: str = "") -> Any:
    from freshroll.placement.thread_probe import STEP_OVERHEAD_S_PER_ROW, ThreadProbe

    # generate 0.4 s and train 0.6 s on one thread (an async step on a core per stage: 0.6 s);
    # a sync step on two threads 0.6 / advantage s, its serial work (128 rows) included
    many = 0.6 / advantage - STEP_OVERHEAD_S_PER_ROW * 128
    return ThreadProbe(2, 128, 12, 0.4, 0.6, 0.4 * many, 0.6 * many, 0.5, skipped)


def test_the_probe_says_whether_threads_pay():
    from freshroll.placement.thread_probe import PAYS, ThreadProbe

    assert _probe(1.6).advantage == pytest.approx(1.6) and _probe(1.6).pays
    assert not _probe(PAYS - 0.01).pays and _probe(PAYS + 1e-9).pays
    assert "does not pay" in _probe(0.7).describe()
    assert _probe(0.5, skipped="large").pays  # a model too large to probe: long ops
    assert _probe(1.6).as_dict()["pays"] is True
    assert _probe(1.6).as_dict()["advantage"] == pytest.approx(1.6)
    # threads that speed a step up 1.5x do not pay where the stages are balanced: an async
    # step on a core per stage (0.5 s) beats a sync step on both cores (0.667 s) ...
    balanced = ThreadProbe(2, 1, 12, 0.5, 0.5, 1 / 3, 1 / 3, 0.5)
    assert balanced.gain == pytest.approx(1.5) and not balanced.pays
    # ... and pay where one stage is most of the step (0.9 s against 0.667 s)
    lopsided = ThreadProbe(2, 1, 12, 0.1, 0.9, 1 / 15, 0.6, 0.5)
    assert lopsided.gain == pytest.approx(1.5) and lopsided.pays
    # a step's serial work counts against sync: at the tiny default's shape (128 rows, 19 and
    # 34 ms on one thread, 16 and 21 ms on two) async wins by it (runs measured 1.27x)
    tiny = ThreadProbe(2, 128, 12, 0.019, 0.034, 0.016, 0.021, 0.1)
    assert tiny.gain > 1.4 and 0.7 < tiny.advantage < 0.8 and not tiny.pays


def test_a_short_run_counts_the_pipelines_fill_against_async():
    from dataclasses import replace

    from freshroll.placement.thread_probe import STEP_OVERHEAD_S_PER_ROW, ThreadProbe

    # 5.13M parameters / 16 new tokens, measured (issue 25): 327 and 636 ms a stage on one
    # thread, 231 and 381 ms on two. The overlap alone (636 ms) against a sync step of
    # 621 ms reads a near-tie (1.02x) that a probe's noise may tip to async; a 7-step async
    # run also pays the fill (one generate before the first step): 683 ms a step
    probe = ThreadProbe(2, 128, 24, 0.327, 0.636, 0.231, 0.381, 1.0)
    sync_s = 0.231 + 0.381 + STEP_OVERHEAD_S_PER_ROW * 128
    assert probe.advantage == pytest.approx(0.636 / sync_s)
    short = replace(probe, steps=7)
    assert short.advantage == pytest.approx((0.636 + 0.327 / 7) / sync_s)
    assert short.advantage > 1.09 and short.pays
    assert "the pipeline's fill over 7 steps included" in short.describe()
    # over a long run the fill fades: the overlap alone decides
    assert replace(probe, steps=10_000).advantage == pytest.approx(probe.advantage, rel=1e-3)
    # at the tiny default (400 steps) async keeps its lead (runs measured 1.27x)
    tiny = ThreadProbe(2, 128, 12, 0.019, 0.034, 0.016, 0.021, 0.1, steps=400)
    assert not tiny.pays


def test_settle_placement_gives_the_probe_the_runs_length(monkeypatch: pytest.MonkeyPatch):
    from freshroll.placement import thread_probe
    from freshroll.placement.thread_probe import ThreadProbe
    from freshroll.rewards.tasks import make_prompts

    seen: dict[str, int] = {}

    def fake_probe(model_path: Path, batch: Any, *, max_new_tokens: int, threads: int,
                   steps: int = 0) -> ThreadProbe:
        seen["steps"] = steps
        return ThreadProbe(2, 128, 24, 0.327, 0.636, 0.231, 0.381, 1.0, steps=steps)

    monkeypatch.setattr(thread_probe, "probe_threads", fake_probe)
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    from freshroll.placement import process_engine  # imported by the probe's call

    monkeypatch.setattr(process_engine, "workers_ready", lambda *a: None)
    monkeypatch.setattr(thread_probe.probe_cache, "enabled", lambda: False)
    cfg = _cfg(runtime="auto", torch_threads="auto", steps=7, max_staleness=1, progress=False)
    prompts = make_prompts("reverse", 64, 0, min_len=3, max_len=3)
    placed = thread_probe.settle_placement(cfg, prompts, Path("/nonexistent"),
                                           stream=io.StringIO())
    assert seen["steps"] == 7
    assert placed.probe is not None and placed.probe.steps == 7
    # the near-tie the overlap alone reads (1.02x) is sync's once the fill counts
    assert placed.runtime == "inline" and placed.start_sync


def test_where_threads_pay_every_stage_runs_inline_on_all_cores():
    p = placement.plan(_cfg(max_staleness=1), _probe(1.6), cores=2)
    assert (p.runtime, p.budget.trainer, p.budget.worker) == ("inline", 2, 2)
    assert "threads pay" in p.reason and "1.60x" in p.reason
    assert p.stages == ()  # an async run's stages overlap: the probe decides for them
    # an explicit inline run with auto threads gets them too
    p = placement.plan(_cfg(max_staleness=1, runtime="inline"), _probe(1.6), cores=4)
    assert (p.runtime, p.budget.trainer) == ("inline", 4)


def test_an_async_inline_run_on_many_threads_shares_the_compute_thread_in_sync_windows():
    p = placement.plan(_cfg(max_staleness=1), _probe(1.6), cores=2)
    assert p.modes is not None and p.compute is p.modes.compute
    assert "sync fallback's windows on one compute thread" in p.describe()
    for cfg, probe in ((_cfg(max_staleness=1), _probe(0.8)),  # process: no teams to share
                       (_cfg(max_staleness=1, runtime="inline", torch_threads=1), None),
                       (_cfg(max_staleness=1, runtime="inline", torch_threads=2,
                             **{}), None)):
        got = placement.plan(cfg, probe, cores=2)
        assert (got.modes is not None) == (got.runtime == "inline" and got.budget.trainer > 1)
    off = validate({"run": {"max_staleness": 1}, "control": {"fallback": False}}, "test")
    assert placement.plan(off, _probe(1.6), cores=2).modes is None  # no sync windows


def test_an_async_process_run_takes_every_core_per_call_in_sync_windows():
    from freshroll.pipeline.observers import FollowMode
    from freshroll.runtime.run import own_watchers

    p = placement.plan(_cfg(max_staleness=1), _probe(0.8), cores=2)
    assert p.runtime == "process" and [f.stage for f in p.follow] == ["generate", "train"]
    gen, train = p.follow
    assert (gen.shared, gen.sync.many, train.shared, train.sync.many) == (1, 2, 1, 2)
    assert p.stage("generate") is gen and p.stage("train") is train
    assert "sync fallback's windows each stage's threads (1 or 2) settled" in p.describe()
    follows = [w for w in own_watchers(_cfg(max_staleness=1), p, Path("."), io.StringIO())
               if isinstance(w, FollowMode)]
    assert len(follows) == 2
    for mode, want in (("sync", (2, False)), ("async", (1, False))):
        for f in follows:
            f.on_mode(Switch(5, cast(Mode, mode), 0, "probe", "a test's switch"))
        assert gen.take() == want and train.take() == want  # sync: the untimed warm-up call
    assert p.settled_stages().startswith("generate: not settled")
    assert set(p.as_dict()["sync_window_stages"]) == {"generate", "train"}
    # nothing to follow: a sync run, threads set, the fallback off, one core, inline, sim
    off = validate({"run": {"max_staleness": 1}, "control": {"fallback": False}}, "test")
    for cfg, cores in ((_cfg(max_staleness=0), 2), (_cfg(max_staleness=1, torch_threads=1), 2),
                       (off, 2), (_cfg(max_staleness=1, runtime="process"), 1),
                       (_cfg(max_staleness=1, runtime="inline"), 2),
                       (_cfg(max_staleness=1, engine="sim"), 2)):
        assert placement.plan(cfg, _probe(0.8), cores=cores).follow == (), cfg.run
    assert placement.plan(_cfg(max_staleness=1), _probe(0.8), cores=2,
                          injected=True).follow == ()


def test_a_private_ray_run_follows_the_mode_and_starts_sync_where_threads_pay():
    """``run.runtime: ray`` on its own instance: the actors' calls follow the fallback's mode
    as a process run's do (a core each while async, 1 or every core in the sync windows);
    the probe is wanted, and where threads pay the run stays on Ray and starts in the sync
    mode (issue 25: one thread per actor left a core idle in every sync step). A joined
    cluster's actors run on cores this process cannot count: neither."""
    ray = _cfg(max_staleness=1, runtime="ray")
    assert placement.wants_probe(ray, cores=2)
    for probe in (_probe(1.6), _probe(0.8), None):
        p = placement.plan(ray, probe, cores=2)
        assert (p.runtime, p.budget.trainer, p.budget.worker) == ("ray", 1, 1)
        assert [(f.stage, f.shared, f.sync.many) for f in p.follow] == [
            ("generate", 1, 2), ("train", 1, 2)]
        assert p.compute is None and p.modes is None  # the actors compute, not the driver
        pays = probe is not None and probe.pays
        assert bool(p.start_sync) == pays, probe
    started = placement.plan(ray, _probe(1.6), cores=2)
    assert "actors take turns on all of them" in started.start_sync
    from freshroll.runtime.run import start_choice

    choice = start_choice(started)  # the probe's reading, checked on the actors' own steps
    assert choice is not None and choice.mode == "sync" and choice.hold is False
    inline = placement.plan(_cfg(max_staleness=1), _probe(1.6), cores=2)
    held = start_choice(inline)  # ... held where the probe measured the run's own compute
    assert inline.runtime == "inline" and held is not None and held.hold is True
    # settled on all the cores by the probe, as the inline placement's sync windows are
    for f in started.follow:
        f.set_mode("sync")
        gain = 1 / (0.6 / 1.6 - 0.0091)  # the probe's (_probe): 1 / many, either stage
        assert f.take() == (2, False) and f.sync.gain() == pytest.approx(gain)
    assert all(f.sync.settled is None for f in placement.plan(ray, _probe(0.8), cores=2).follow)
    # a probe that measured nothing (a large model) starts nothing
    assert placement.plan(ray, _probe(0.5, skipped="large"), cores=2).start_sync == ""
    joined = _cfg(max_staleness=1, runtime="ray", ray_address="10.0.0.5:6379")
    off = validate({"run": {"max_staleness": 1, "runtime": "ray"},
                    "control": {"fallback": False}}, "test")
    for cfg in (joined, off, _cfg(max_staleness=0, runtime="ray"),
                _cfg(max_staleness=1, runtime="ray", torch_threads=1)):
        p = placement.plan(cfg, _probe(1.6), cores=2)
        assert p.runtime == "ray" and p.follow == () and p.start_sync == "", cfg.run
    assert not placement.wants_probe(joined, cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=1, runtime="ray"), cores=1)


def test_ray_actors_set_each_calls_threads_as_the_driver_asks(monkeypatch: pytest.MonkeyPatch):
    """The wire of :func:`test_a_private_ray_run_follows_the_mode...`: a following
    :class:`RayEngine` sends its calling thread's count with each generate, a
    :class:`RayTrainer` each step's count from its stage (timing it in the actor's seconds);
    the actors set it (only on a change). In-process stubs: no Ray. The process's Ray gate
    is a fresh, open one (an earlier test in this process may have stopped its Ray and
    closed the shared gate)."""
    import threading

    import torch

    from freshroll.placement import ray_engine, ray_session, ray_trainer
    from freshroll.stage_threads import ModeThreads, StageThreads

    monkeypatch.setattr(ray_trainer, "_gate", ray_session._Gate())

    before = torch.get_num_threads()
    try:
        sent: list[tuple[Any, ...]] = []
        eng = ray_engine.RayEngine.__new__(ray_engine.RayEngine)
        eng.follow_threads, eng.generate_timeout_s = True, 1.0
        eng._call = lambda method, *args, **kw: sent.append(args) or []  # type: ignore[method-assign]

        def call(n: int) -> None:
            torch.set_num_threads(n)  # what adapters.tuned does on the worker's thread
            eng.generate(["a"], max_new_tokens=1)

        for n in (2, 1):
            t = threading.Thread(target=call, args=(n,))
            t.start()
            t.join()
        assert [args[2] for args in sent] == [2, 1]
        eng.follow_threads = False
        eng.generate(["a"], max_new_tokens=1)
        assert sent[-1][2] is None

        class _Engine:
            def generate(self, prompts: Any, **kw: Any) -> list[int]:
                return [torch.get_num_threads()]

        actor = ray_engine._EngineActor.__new__(ray_engine._EngineActor)
        actor.engine = _Engine()  # type: ignore[assignment]
        assert actor.generate(["a"], {}, 2) == [2] and actor.generate(["a"], {}, 1) == [1]
        assert actor.generate(["a"], {}, None) == [1]  # unchanged

        class _Learner:
            model = torch.nn.Linear(2, 2)

            def step(self, samples: Any, step: int) -> dict[str, float]:
                return {"threads": float(torch.get_num_threads())}

            def published_state(self) -> dict[str, torch.Tensor]:
                return {k: v.detach() for k, v in self.model.state_dict().items()}

        tr = ray_trainer._TrainerActor(_Learner(), 1)  # type: ignore[arg-type]
        (metrics, _, inside), packed = tr.step([], 1, 2)
        assert metrics == {"threads": 2.0} and inside >= 0 and set(packed) == {"weight", "bias"}
        assert tr.step([], 2)[0][0] == {"threads": 2.0}  # None: as it is

        class _Ref:
            def __init__(self, value: Any) -> None:
                self.value = value

        class _Remote:
            def __init__(self, fn: Any) -> None:
                self.fn = fn

            def options(self, **kw: Any) -> _Remote:
                return self

            def remote(self, *args: Any) -> tuple[_Ref, _Ref]:
                (metrics, digest, _), weights = self.fn(*args)
                # the actor's seconds fixed: a stub step's microseconds on a loaded machine
                # could settle the trials early (stage_threads.DECISIVE), as it did once in CI
                return _Ref((metrics, digest, 0.01)), _Ref(weights)

        proxy = ray_trainer.RayTrainer.__new__(ray_trainer.RayTrainer)
        proxy._ready, proxy._actor = None, type("A", (), {"step": _Remote(tr.step)})()
        proxy._wait = lambda ref, *a: ref.value  # type: ignore[method-assign]
        proxy._step_no = lambda: 3  # type: ignore[method-assign]
        proxy.cfg, proxy.timings = validate({}, "test"), ray_trainer.TrainerTimings()
        proxy.counts = mode = ModeThreads(1, StageThreads("train", 2, warmup=0, trials=2))
        rows: Any = [None] * 4  # the stub learner reads none of them
        for want in (1, 1, 1):  # async: the share, untimed
            assert proxy._step(rows)[0] == {"threads": float(want)}
        mode.set_mode("sync")
        got = [proxy._step(rows)[0]["threads"] for _ in range(4)]  # trials: 1, 2, 1, 2
        assert got == [1.0, 2.0, 1.0, 2.0] and mode.sync.calls == 4
        assert all(v == [0.01 / 4] * 2 for v in mode.sync.timed.values())  # the actor's seconds
    finally:
        torch.set_num_threads(before)


def test_a_ray_run_says_what_the_placement_cost_per_step():
    """The last lines' account of Ray's round trips (issue 25: on one machine Ray has only
    costs): each generate call beyond the actor's generation, each weight load, the trainer
    actor's step in the driver against in its actor; nothing measured, nothing said."""
    from freshroll.placement import ray_engine
    from freshroll.placement.ray_trainer import TrainerTimings

    eng = ray_engine.RayEngine.__new__(ray_engine.RayEngine)
    eng.round_trips = [0.004, 0.006, 0.005]
    eng.loads = [ray_engine.LoadStats(0.007, 0.002, 0.003)]
    timings = TrainerTimings(step_wall_s=[0.110, 0.100], step_actor_s=[0.095, 0.085])
    line = ray_engine.costs_line([eng, object()], type("T", (), {"timings": timings})())
    assert line == ("ray placement, per step (medians): generate round trip 5.0 ms; weights "
                    "7.0 ms a load (fetch 2.0, copy 3.0 in the actor); trainer step 105.0 ms "
                    "in the driver, 90.0 in its actor (15.0 ms round trip)")
    assert ray_engine.costs_line([], object()) == ""


def test_where_threads_do_not_pay_the_fixed_rule_holds():
    p = placement.plan(_cfg(max_staleness=1), _probe(0.8), cores=2)
    assert (p.runtime, p.budget.trainer, p.budget.worker) == ("process", 1, 1)
    assert "does not pay" in p.reason and "off its GIL" in p.reason
    p = placement.plan(_cfg(max_staleness=0), _probe(0.8), cores=2)
    assert (p.runtime, p.budget.trainer) == ("inline", 1)


def test_the_probe_stops_after_one_pair_only_when_the_gain_is_far_from_the_bar():
    from freshroll.placement.thread_probe import DECISIVE_HIGH, DECISIVE_LOW, PAYS, _decisive

    assert DECISIVE_LOW < PAYS < 1.0 < DECISIVE_HIGH

    def pair(advantage: float) -> bool:  # one pair: 0.4 + 0.6 s on one thread, 0.6/adv on two
        many = 0.6 / advantage  # (one row: its serial work is negligible beside it)
        return _decisive({1: [0.4], 2: [0.4 * many]}, {1: [0.6], 2: [0.6 * many]}, 2, 0)

    assert pair(DECISIVE_HIGH * 1.01) and pair(DECISIVE_LOW * 0.99)
    assert not pair(PAYS) and not pair(1.0) and not pair(DECISIVE_HIGH * 0.99)


def test_a_sync_run_settles_each_stage_on_its_own_calls_not_on_a_probe():
    # its steps repeat the same work: each stage tries 1 and all the cores on its first calls
    assert not placement.wants_probe(_cfg(max_staleness=0), cores=2)
    for probe in (None, _probe(1.6), _probe(0.8)):  # a probe given anyway is not read
        p = placement.plan(_cfg(max_staleness=0), probe, cores=4)
        assert (p.runtime, p.budget.trainer) == ("inline", 2)  # the fixed rule's start
        assert [(s.stage, s.many) for s in p.stages] == [("generate", 4), ("train", 4)]
        assert p.stage("train") is p.stages[1] and p.stage("reward") is None
        assert "settled on its own first calls" in p.describe()
        assert set(p.as_dict()["stages"]) == {"generate", "train"}
    # not where the threads are set, on one core, for other engines or an injected one
    for cfg, kw in ((_cfg(max_staleness=0, torch_threads=2), {}),
                    (_cfg(max_staleness=0), {"cores": 1}),
                    (_cfg(max_staleness=0, engine="sim"), {}),
                    (_cfg(max_staleness=0), {"injected": True}),
                    (_cfg(max_staleness=0, runtime="process"), {}),
                    (_cfg(max_staleness=1), {})):
        assert placement.plan(cfg, **{"cores": 2, **kw}).stages == ()
    # one compute thread for both stages: every sync hf run inline, its threads set or not
    for cfg, kw, one in ((_cfg(max_staleness=0), {}, True),
                         (_cfg(max_staleness=0, torch_threads=2), {}, True),
                         (_cfg(max_staleness=0), {"cores": 1}, True),
                         (_cfg(max_staleness=0), {"injected": True}, False),
                         (_cfg(max_staleness=0, runtime="process"), {}, False),
                         (_cfg(max_staleness=0, engine="sim"), {}, False),
                         (_cfg(max_staleness=1, runtime="inline"), {}, False)):
        p = placement.plan(cfg, **{"cores": 2, **kw})
        assert (p.compute is not None) == one, (cfg.run, kw)
        assert ("one compute thread" in p.describe()) == one
    # no probe (explicit threads): the fixed rule, and nothing auto to explain
    p = placement.plan(_cfg(max_staleness=1, runtime="process", torch_threads=3), cores=2)
    assert (p.runtime, p.budget.trainer, p.reason) == ("process", 3, "")


def test_a_probe_is_wanted_only_where_it_decides_something():
    assert placement.wants_probe(_cfg(max_staleness=1), cores=2)
    assert placement.wants_probe(_cfg(max_staleness=1, runtime="inline"), cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=0, runtime="inline"), cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=1), cores=1)
    assert not placement.wants_probe(_cfg(max_staleness=1, torch_threads=1), cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=1, runtime="process"), cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=1, engine="sim"), cores=2)
    assert not placement.wants_probe(_cfg(max_staleness=1), injected=True, cores=2)
    # an injected engine runs in this process: auto is inline for it
    p = placement.plan(_cfg(max_staleness=1), injected=True, cores=2)
    assert p.runtime == "inline" and "injected" in p.reason


def test_the_settled_config_makes_both_settings_explicit():
    cfg = _cfg(max_staleness=1)
    p = placement.plan(cfg, _probe(1.6), cores=2)
    done = placement.settled(cfg, p)
    assert (done.run.runtime, done.run.torch_threads) == ("inline", 2)
    assert (cfg.run.runtime, cfg.run.torch_threads) == ("auto", "auto")  # not changed
    assert resolve_runtime(done) == "inline" and placement.thread_budget(done).trainer == 2


def test_the_real_probe_measures_and_leaves_the_rng_alone(tmp_path):
    import torch

    from freshroll.engines.tiny import save_tiny
    from freshroll.placement.thread_probe import probe_threads

    model = save_tiny(tmp_path / "m", seed=0)
    before = torch.get_rng_state()
    threads = torch.get_num_threads()
    try:
        p = probe_threads(model, ["123>"] * 24, max_new_tokens=2, threads=2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(before, torch.get_rng_state())
    assert 1 <= p.rows <= 24 and p.tokens >= 3 and p.threads == 2 and not p.skipped
    assert min(p.gen_1, p.train_1, p.gen_n, p.train_n) > 0 and p.probe_s > 0
    assert p.gain > 0 and isinstance(p.pays, bool)


def test_a_failing_probe_warns_and_the_fixed_rule_holds(monkeypatch: pytest.MonkeyPatch):
    import io
    from types import SimpleNamespace

    from freshroll.placement import thread_probe

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no forward with labels")

    monkeypatch.setattr(thread_probe, "probe_threads", broken)
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    err = io.StringIO()
    p = thread_probe.settle_placement(_cfg(max_staleness=1, progress=False),
                                      [SimpleNamespace(text="123>")],  # type: ignore[list-item]
                                      "m", stream=err)  # type: ignore[arg-type]
    assert (p.runtime, p.budget.trainer, p.probe) == ("process", 1, None)
    assert "thread probe failed (RuntimeError: no forward with labels)" in err.getvalue()


def test_a_run_that_may_fork_workers_is_told_apart():
    """An async hf run whose runtime may settle on processes pre-starts their forkserver;
    a sync run, a sim run, an inline or Ray one, an injected engine and one core do not."""
    assert placement.may_fork_workers(_cfg(max_staleness=1), cores=2)
    assert placement.may_fork_workers(_cfg(max_staleness=1, runtime="process"), cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=0), cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=1, runtime="inline"), cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=1, runtime="ray"), cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=1, engine="sim"), cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=1), injected=True, cores=2)
    assert not placement.may_fork_workers(_cfg(max_staleness=1), cores=1)


def test_where_threads_pay_an_async_run_starts_in_the_fallbacks_sync_mode():
    """Threads that pay on the probe would be split between two stages running at once: the
    run starts in the sync fallback's sync mode (the stages take turns on all the cores)
    until its first probe measures async against that (issue 25, item 5)."""
    p = placement.plan(_cfg(max_staleness=1), _probe(1.6), cores=2)
    assert p.runtime == "inline" and "is 1.60x an async one on a core per stage" in p.start_sync
    assert placement.plan(_cfg(max_staleness=1), _probe(0.8), cores=2).start_sync == ""
    off = _cfg(max_staleness=1)
    off = off.model_copy(update={"control": off.control.model_copy(update={"fallback": False})})
    assert placement.plan(off, _probe(1.6), cores=2).start_sync == ""  # no fallback: async
    big = placement.plan(_cfg(max_staleness=1), _probe(0.5, skipped="large"), cores=2)
    assert big.start_sync == ""  # not measured: taken to pay, not a reason to start sync

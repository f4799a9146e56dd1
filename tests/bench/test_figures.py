"""The bench table's figures as pure functions on crafted capacities, runs and events."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from freshroll.bench import figures as f
from freshroll.ledger import events as ev
from freshroll.ledger.store import open_ledger

# B = 64 samples per step; per-batch stage times: gen 2 s, reward 0.5 s, train 1 s, sync 0.5 s
CAPS = f.Capacities(batch=64, gen_per_s=32.0, reward_per_s=128.0, train_per_s=64.0,
                    transfer_s=0.5, gen_per_worker_per_s=4.0)


def test_stage_times_are_batch_over_capacity() -> None:
    assert f.stage_times(CAPS) == {"gen": 2.0, "reward": 0.5, "train": 1.0, "sync": 0.5}


def test_min_capacity_and_binding_stage() -> None:
    assert f.min_capacity(CAPS) == 32.0
    assert f.binding_stage(CAPS) == "gen"
    assert f.binding_stage(f.Capacities(64, 100.0, 128.0, 50.0, 0.1)) == "train"
    # a slow transfer binds: 64 samples / 4 s per version = 16 samples/s
    assert f.binding_stage(f.Capacities(64, 100.0, 128.0, 50.0, 4.0)) == "sync"


def test_efficiency_against_the_slowest_stage() -> None:
    assert f.efficiency(24.0, CAPS) == pytest.approx(0.75)
    assert f.efficiency(32.0, CAPS) == pytest.approx(1.0)


def test_bound_and_attainment() -> None:
    # sum 4 s / max 2 s: a perfect pipeline is 2x a perfect lock-step loop
    assert f.async_bound(CAPS) == pytest.approx(2.0)
    assert f.attainment(1.8, CAPS) == pytest.approx(0.9)
    assert f.speedup(30.0, 10.0) == pytest.approx(3.0)
    assert math.isnan(f.speedup(30.0, 0.0))


def test_no_transfer_means_sync_never_binds() -> None:
    c = f.Capacities(64, 32.0, 128.0, 64.0, 0.0)
    assert math.isinf(c.per_s()["sync"])
    assert f.async_bound(c) == pytest.approx((2.0 + 0.5 + 1.0) / 2.0)


def test_scaled_capacities_follow_the_clock() -> None:
    s = CAPS.scaled(0.01)  # every duration 100x shorter: 100x the rate
    assert s.gen_per_s == pytest.approx(3200.0) and s.transfer_s == pytest.approx(0.005)
    assert f.async_bound(s) == pytest.approx(f.async_bound(CAPS))


def test_workers_for_demand() -> None:
    assert f.workers_for_demand(CAPS) == 16  # 64 samples/s of training / 4 per worker
    assert f.workers_for_demand(f.Capacities(64, 32.0, 128.0, 63.0, 0.5, 4.0)) == 16
    assert f.workers_for_demand(f.Capacities(64, 32.0, 128.0, 65.0, 0.5, 4.0)) == 17


def test_async_pays() -> None:
    assert not f.async_pays([1.0, 1.04, math.nan])
    assert f.async_pays([1.0, 1.05])


def _w(kind: str, ts: float, worker: str = "w0", epoch: int = 0) -> ev.Event:
    if kind == "start":
        return ev.WorkerStarted(ts=ts, worker=worker, epoch=epoch)
    return ev.WorkerFenced(ts=ts, worker=worker, epoch=epoch, reason="stopped")


def _opened(ts: float, inc: int) -> ev.Event:
    return ev.Opened(ts=ts, run_id="r", incarnation=inc, max_staleness=1, batch_groups=1,
                     group_size=2)


def test_worker_seconds_from_start_to_fence_or_close() -> None:
    events = [
        _opened(0.0, 0),
        _w("start", 1.0, "w0"), _w("start", 2.0, "w1"),
        _w("fence", 5.0, "w1"),  # w1: 3 s
        _w("start", 6.0, "w1", 1),  # w1 epoch 1: to the close, 4 s
        ev.Closed(ts=10.0),  # w0: 9 s
    ]
    assert f.worker_seconds(events) == pytest.approx(16.0)


def test_worker_seconds_across_a_crash_and_a_resume() -> None:
    events = [
        _opened(0.0, 0), _w("start", 0.0, "w0"),
        ev.Requested(ts=7.0, group="g0", prompt_id="p", size=2, version="p0-x"),
        # a crash: no closed; w0 counts to the last event (7 s), not to the resume
        _opened(100.0, 1), _w("start", 100.0, "w0", 1), ev.Closed(ts=103.0),
    ]
    assert f.worker_seconds(events) == pytest.approx(10.0)


def test_worker_seconds_of_an_open_ledger_end_at_its_last_event() -> None:
    events = [_opened(0.0, 0), _w("start", 1.0), _w("start", 1.0, "w1"),
              ev.Requested(ts=4.0, group="g0", prompt_id="p", size=2, version="p0-x")]
    assert f.worker_seconds(events) == pytest.approx(6.0)


def test_a_fence_of_an_unknown_epoch_counts_nothing() -> None:
    assert f.worker_seconds([_opened(0.0, 0), _w("fence", 3.0)]) == 0.0


def _write_run(run: Path, events: list[ev.Event], summary: dict[str, object]) -> None:
    run.mkdir(parents=True)
    ledger = open_ledger(run)
    for e in events:
        ledger.append(e)
    ledger.close()
    (run / "summary.json").write_text(json.dumps(summary))


def _summary(per_s: float) -> dict[str, object]:
    return {"accepted_rollouts_per_s": per_s, "trainer_idle_ratio": 0.02, "discard_rate": 0.01,
            "lag": {"p50": 1.0, "p99": 2.0, "max": 2}, "steps": 10, "accepted_rollouts": 640,
            "wall_s": 12.5}


def test_run_figures_read_the_run_dir(tmp_path: Path) -> None:
    events = [_opened(0.0, 0), _w("start", 0.0), _w("start", 0.0, "w1"),
              ev.Requested(ts=2.0, group="g0", prompt_id="p", size=2, version="p0-x"),
              _opened(50.0, 1), _w("start", 50.0, "w0", 1), ev.Closed(ts=51.0)]
    _write_run(tmp_path / "a", events, _summary(20.0))
    r = f.run_figures(tmp_path / "a", "async")
    assert r.worker_seconds == pytest.approx(5.0)  # 2 + 2 before the crash, 1 after
    assert (r.accepted_per_s, r.lag_max, r.steps, r.wall_s) == (20.0, 2, 10, 12.5)
    assert math.isnan(r.window_bound)  # an older summary: no window_bound
    _write_run(tmp_path / "b", events, {**_summary(20.0), "window_bound": {"bound": 0.45}})
    r = f.run_figures(tmp_path / "b", "async")
    assert r.window_bound == 0.45
    assert f.table_rows([r], "async", CAPS)[0]["window_bound"] == 0.45


def test_table_rows_against_the_sync_run() -> None:
    def run(label: str, per_s: float) -> f.RunFigures:
        return f.RunFigures(label, per_s, 0.0, 0.0, 0.0, 0.0, 0, 1.0, 1, 1, 1.0)

    rows = f.table_rows([run("sync", 10.0), run("async", 18.0)], "sync", CAPS)
    assert [r["run"] for r in rows] == ["sync", "async"]
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[1]["speedup"] == pytest.approx(1.8)
    assert rows[1]["A"] == pytest.approx(0.9)
    assert rows[1]["E"] == pytest.approx(18.0 / 32.0)
    with pytest.raises(ValueError, match="sync"):
        f.table_rows([run("async", 1.0)], "sync", CAPS)


def test_bound_attainment_has_one_definition_that_the_docs_name() -> None:
    """A was defined twice (bench: speedup / bound; the async sweep: over max(1, min(bound,
    parallel limit))): now one function, which every table's definition names."""
    import math
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    defs = [p for p in [*repo.joinpath("src").rglob("*.py"), *repo.joinpath("benchmarks")
                        .glob("*.py")] if re.search(r"^def attainment\(", p.read_text(), re.M)]
    assert [p.relative_to(repo).as_posix() for p in defs] == ["src/freshroll/bench/figures.py"]
    for doc in ("docs/bench.md", "docs/benchmarks.md"):
        rows = [ln for ln in (repo / doc).read_text().splitlines() if ln.startswith("| `A` |")]
        assert rows and all("freshroll.bench.figures.attainment" in r for r in rows), doc
    assert f.attainment(1.5, 2.0, 1.8) == pytest.approx(1.5 / 1.8)  # the tighter bound
    assert f.attainment(0.6, 1.4, 0.5) == pytest.approx(0.6)  # never divided by less than 1
    assert math.isnan(f.attainment(1.2, math.nan, math.nan))


def test_a_bench_row_says_how_soon_it_reached_the_reward_sync_reached() -> None:
    from dataclasses import replace

    from freshroll.figures.reward_time import Point

    def figs(label: str, dt: float, gain: float) -> f.RunFigures:
        curve = tuple(Point(i + 1, dt * (i + 1), min(0.9, gain * i)) for i in range(20))
        return f.RunFigures(label=label, accepted_per_s=1.0, trainer_idle=0.0,
                            discard_rate=0.0, lag_p50=0.0, lag_p99=0.0, lag_max=0,
                            worker_seconds=0.0, steps=20, accepted=20, wall_s=20 * dt,
                            curve=curve)

    sync, fast = figs("sync", 2.0, 0.1), figs("adaptive", 1.0, 0.05)
    rows = {r["run"]: r for r in f.table_rows([sync, fast], "sync", CAPS)}
    assert rows["sync"]["reward_s_ratio"] == pytest.approx(1.0)
    # half the seconds a step, half the learning a step: the middle level at the same time
    assert rows["adaptive"]["reward_s_ratio"] == pytest.approx(f.reward_s_ratio(fast, sync))
    assert 0.8 < rows["adaptive"]["reward_s_ratio"] < 1.2
    no_reward = replace(fast, curve=())
    assert math.isnan(f.reward_s_ratio(no_reward, sync))

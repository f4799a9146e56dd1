"""A thread probe reused by the next run of the same work (freshroll.placement.probe_cache):
what makes a measurement reusable, what does not, and a run that reuses one says so."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from freshroll.config import validate
from freshroll.placement import probe_cache, thread_probe
from freshroll.placement.thread_probe import ThreadProbe


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "on")
    monkeypatch.setenv("FRESHROLL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / probe_cache.FILE_NAME


def _fields(gain: float = 0.8) -> dict[str, Any]:
    return asdict(ThreadProbe(2, 16, 9, 0.4, 0.6, 0.4 / gain, 0.6 / gain, 2.5))


def _key(**kw: Any) -> str:
    args: dict[str, Any] = {"model_digest": "m1", "batch": ["12>", "34>"],
                            "max_new_tokens": 4, "threads": 2, **kw}
    return probe_cache.probe_key(args.pop("model_digest"), args.pop("batch"), **args)


def test_a_measurement_is_reused_only_for_the_same_work_soon_and_at_a_like_load(cache: Path):
    key = _key()
    assert probe_cache.store(key, _fields(), busy=1.0, now=1000.0)
    assert cache.is_file()
    fields, at = probe_cache.lookup(key, now=1060.0, busy=1.3) or ({}, 0.0)
    assert fields == _fields() and at == 1000.0
    # another model, prompts, length or core count: another key
    assert _key(batch=["35>", "12>"]) == key  # other prompts of the same shape: the same work
    for other in (_key(model_digest="m2"), _key(batch=["12>", "356>"]), _key(batch=["12>"]),
                  _key(max_new_tokens=8), _key(threads=4)):
        assert other != key and probe_cache.lookup(other, now=1060.0, busy=1.0) is None
    # too old, or measured with another number of busy cores (threads that paid quiet lose
    # beside a busy core); or with the busy cores unknown (no /proc/stat)
    assert probe_cache.lookup(key, now=1000.0 + probe_cache.MAX_AGE_S + 1, busy=1.0) is None
    assert probe_cache.lookup(key, now=1060.0, busy=1.0 + probe_cache.BUSY_TOLERANCE + 0.1) is None
    assert probe_cache.lookup(key, now=900.0, busy=1.0) is None  # measured "in the future"
    assert probe_cache.lookup(key, now=1060.0, busy=None) is None
    assert not probe_cache.store(_key(model_digest="m9"), _fields(), busy=None)


def test_every_seed_of_a_task_has_the_key_of_the_first() -> None:
    """A seed sweep probes once: prompts drawn by other seeds of the same task (5-10 digits,
    their exact lengths differ) have the first seed's key; a longer prompt or another
    length range does not."""
    from freshroll.rewards.tasks import make_prompts

    def batch(seed: int, lo: int = 5, hi: int = 10) -> list[str]:
        prompts = make_prompts("reverse", 4096, seed=seed, min_len=lo, max_len=hi)
        return [p.text for p in prompts[:64] for _ in range(8)]

    keys = {_key(batch=batch(seed)) for seed in range(5)}
    assert len(keys) == 1
    assert len({sorted(map(len, batch(s))).__repr__() for s in range(5)}) > 1  # not the same
    assert _key(batch=batch(0, 5, 12)) not in keys and _key(batch=batch(0, 2, 4)) not in keys


def test_the_file_keeps_the_newest_entries_one_per_key(cache: Path):
    for i in range(probe_cache.MAX_ENTRIES + 5):
        probe_cache.store(_key(model_digest=f"m{i}"), _fields(), busy=0.0, now=1000.0 + i)
    probe_cache.store(_key(model_digest="m70"), _fields(1.6), busy=0.0, now=2000.0)  # again
    entries = json.loads(cache.read_text())["entries"]
    assert len(entries) == probe_cache.MAX_ENTRIES
    assert len({e["key"] for e in entries}) == len(entries)
    hit = probe_cache.lookup(_key(model_digest="m70"), now=2001.0, busy=0.0)
    assert hit is not None and hit[1] == 2000.0 and hit[0] == _fields(1.6)
    assert probe_cache.lookup(_key(model_digest="m0"), now=2001.0, busy=0.0) is None  # dropped


def test_a_damaged_or_unwritable_cache_is_a_miss_never_an_error(cache: Path):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert probe_cache.lookup(_key(), busy=0.0) is None
    assert probe_cache.store(_key(), _fields(), busy=0.0)  # written anew
    assert probe_cache.lookup(_key(), busy=0.0) is not None
    cache.write_text(json.dumps({"entries": [{"key": _key(), "measured_at": "x"}]}))
    assert probe_cache.lookup(_key(), busy=0.0) is None
    cache.unlink()
    cache.parent.rmdir()
    cache.parent.write_text("a file where the cache directory should be")
    err = io.StringIO()
    assert not probe_cache.store(_key(), _fields(), busy=0.0, stream=err)
    assert "was not written" in err.getvalue() and "FRESHROLL_PROBE_CACHE=off" in err.getvalue()


def test_the_busy_cores_are_the_other_processes_not_this_ones(monkeypatch: pytest.MonkeyPatch):
    import os

    real = probe_cache.others_busy(0.2)  # a sane count: jiffies round, so one core of slack
    assert real is not None and 0.0 <= real <= (os.cpu_count() or 1) + 1.0
    # the machine busy 0.45 CPU-s over 0.15 s of wall, 0.15 of them this process's own; the
    # wall pinned too (a loaded machine oversleeps the window)
    machine, own, wall = iter([10.0, 10.45]), iter([1.0, 1.15]), iter([100.0, 100.15])
    monkeypatch.setattr(probe_cache, "_busy_s", lambda: next(machine))
    monkeypatch.setattr(probe_cache, "_self_s", lambda: next(own))
    monkeypatch.setattr(probe_cache, "time", SimpleNamespace(
        perf_counter=lambda: next(wall), sleep=lambda s: None, time=lambda: 0.0))
    assert probe_cache.others_busy(0.15) == pytest.approx(2.0)
    monkeypatch.setattr(probe_cache, "_busy_s", lambda: (_ for _ in ()).throw(OSError()))
    assert probe_cache.others_busy(0.01) is None  # no /proc/stat: nothing is reused


def test_off_neither_reads_nor_writes(cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "off")
    assert not probe_cache.store(_key(), _fields(), busy=0.0)
    assert not cache.exists()
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "on")
    probe_cache.store(_key(), _fields(), busy=0.0)
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "0")
    assert probe_cache.lookup(_key(), busy=0.0) is None


def test_the_second_run_of_the_same_work_reuses_the_first_ones_probe(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []

    def probe(model_path: Any, batch: Any, *, max_new_tokens: int, threads: int,
              steps: int = 0) -> ThreadProbe:
        calls.append(len(batch))
        return ThreadProbe(**_fields(0.7))

    monkeypatch.setattr(thread_probe, "probe_threads", probe)
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    monkeypatch.setattr(probe_cache.BusyMeter, "stop", lambda self: 0.5)
    cfg = validate({"run": {"max_staleness": 1, "progress": True}}, "test")
    prompts: Any = [SimpleNamespace(text=f"{i}>") for i in range(8)]

    def settle(digest: str | None) -> tuple[Any, str]:
        err = io.StringIO()
        got = thread_probe.settle_placement(cfg, prompts, Path("m"), model_digest=digest,
                                            stream=err)
        return got, err.getvalue()

    first, said = settle("d1")
    assert len(calls) == 1 and "measuring whether intra-op threads pay" in said
    again, said = settle("d1")
    assert len(calls) == 1 and said == ""  # nothing measured, nothing to wait for
    assert again.probe is not None and first.probe is not None
    assert again.probe.reused_from > 0 and first.probe.reused_from == 0
    assert again.probe.gain == pytest.approx(first.probe.gain)
    assert (again.runtime, again.budget) == (first.runtime, first.budget)
    assert "reused, measured" in again.probe.describe()
    assert again.probe.as_dict()["reused_from"] == again.probe.reused_from  # in summary.json
    settle("d2")  # another model: measured
    settle(None)  # no digest to key on: measured, not kept
    assert len(calls) == 3


def test_a_stage_starts_settled_only_on_a_choice_that_fits_it():
    from freshroll.stage_threads import StageThreads

    st = StageThreads("train", 2)
    assert not st.reuse(4, {1: [0.2], 4: [0.1]}, 1000.0)  # another core count
    assert not st.reuse(2, {1: [], 2: [0.1]}, 1000.0)  # no timings at one thread
    assert st.settled is None
    assert st.reuse(2, {1: [0.3, 0.3], 2: [0.2, 0.2]}, 1000.0)
    assert st.take() == (2, False)  # no trials: the earlier run's choice, untimed
    assert st.gain() == pytest.approx(1.5) and "reused, measured" in st.describe()
    assert st.as_dict()["reused_from"] == 1000.0
    fresh = StageThreads("generate", 2)
    fresh.take()
    assert not fresh.reuse(1, {1: [0.1], 2: [0.2]}, 1000.0)  # its own calls already began


def test_settled_stages_are_kept_and_reused_by_the_next_run(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    monkeypatch.setattr(probe_cache.BusyMeter, "stop", lambda self: 0.0)
    cfg = validate({"run": {"max_staleness": 0}}, "test")  # a sync run: stages settle
    prompts: Any = [SimpleNamespace(text=f"{i}>") for i in range(8)]

    def settle() -> Any:
        return thread_probe.settle_placement(cfg, prompts, Path("m"), model_digest="d",
                                             stream=io.StringIO())

    first = settle()
    assert [s.stage for s in first.stages] == ["generate", "train"]
    assert thread_probe.remember_settled(first) == 0  # nothing settled yet
    for st in first.stages:  # its calls: two threads clearly faster
        while st.settled is None:
            k, timed = st.take()
            if timed:
                st.record(k, 0.4 if k == 1 else 0.2, 4)
    assert thread_probe.remember_settled(first) == 2
    again = settle()
    assert all(s.settled == 2 and s.reused_from > 0 for s in again.stages)
    assert thread_probe.remember_settled(again) == 0  # a reused choice is not stored again
    monkeypatch.setattr(probe_cache.BusyMeter, "stop", lambda self: 1.0)
    assert all(s.settled is None for s in settle().stages)  # another load: its own trials


def test_a_ray_run_keeps_its_own_fallback_choice_and_stage_counts(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    """The probe's compute timings are any placement's, the fallback's rates and the stages'
    counts a placement's own: a Ray run reuses neither an inline run's choice nor is its
    own reused by one (in one sweep the Ray run started on the inline run's rates)."""
    monkeypatch.setattr(thread_probe, "probe_threads",
                        lambda *a, **k: ThreadProbe(**_fields(0.7)))
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    monkeypatch.setattr(probe_cache.BusyMeter, "stop", lambda self: 0.0)
    prompts: Any = [SimpleNamespace(text=f"{i}>") for i in range(8)]
    inline = validate({"run": {"max_staleness": 1}}, "test")
    ray = validate({"run": {"max_staleness": 1, "runtime": "ray"}, "ray": {"trainer": "actor"}},
                   "test")

    def settle(cfg: Any) -> Any:
        return thread_probe.settle_placement(cfg, prompts, Path("m"), model_digest="d",
                                             stream=io.StringIO())

    first = settle(inline)
    assert thread_probe.remember_choice(first, "sync", 700.0, 800.0)
    assert settle(inline).earlier_mode is not None
    ray_first = settle(ray)
    assert ray_first.runtime == "ray" and ray_first.probe is not None
    assert ray_first.probe.reused_from > 0  # the compute timings: reused
    assert ray_first.earlier_mode is None  # the inline run's rates: not
    assert thread_probe.remember_choice(ray_first, "async", 650.0, 600.0)
    again = settle(ray).earlier_mode
    assert again is not None and again[:3] == ("async", 650.0, 600.0)
    assert settle(inline).earlier_mode[:3] == ("sync", 700.0, 800.0)
    # the trainer in an actor (its round trips) or in the driver: each its own choice
    driver = validate({"run": {"max_staleness": 1, "runtime": "ray"},
                       "ray": {"trainer": "driver"}}, "test")
    driver_first = settle(driver)
    assert driver_first.earlier_mode is None  # the actor-trainer Ray run's rates: not
    assert thread_probe.remember_choice(driver_first, "sync", 500.0, 520.0)
    assert settle(driver).earlier_mode[:3] == ("sync", 500.0, 520.0)
    assert settle(ray).earlier_mode[:3] == ("async", 650.0, 600.0)
    # auto is keyed by where it resolves (the driver on a private instance), not by "auto"
    auto = validate({"run": {"max_staleness": 1, "runtime": "ray"}}, "test")
    assert settle(auto).earlier_mode[:3] == ("sync", 500.0, 520.0)


def test_a_simulated_or_injected_run_neither_counts_the_load_nor_touches_the_cache(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    """Nothing of the simulated cluster's or an injected engine's is reused: no key, no
    0.15 s count of the load at their start (the chaos library runs hundreds of them)."""
    def counted(self: Any) -> float:
        raise AssertionError("the load was counted")

    monkeypatch.setattr(probe_cache.BusyMeter, "stop", counted)
    monkeypatch.setattr(thread_probe, "available_cores", lambda: 2)
    prompts: Any = [SimpleNamespace(text=f"{i}>") for i in range(8)]
    sim = validate({"run": {"max_staleness": 1}, "rollout": {"engine": "sim"}}, "test")
    hf = validate({"run": {"max_staleness": 1, "runtime": "inline"}}, "test")
    for cfg, injected in ((sim, False), (hf, True)):
        placed = thread_probe.settle_placement(cfg, prompts, Path("m"), model_digest="d",
                                               injected=injected, stream=io.StringIO())
        assert placed.reuse is None and placed.earlier_mode is None
    assert not cache.exists()


def test_pinned_reuses_whatever_the_load_but_not_other_work_or_old(
        cache: Path, monkeypatch: pytest.MonkeyPatch):
    # the baseline's private cache (runtime/baseline.py): settled seconds before on the same work
    key = _key()
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "pinned")
    assert probe_cache.enabled() and probe_cache.pinned()
    assert probe_cache.store(key, _fields(), busy=0.0, now=1000.0)
    far = probe_cache.BUSY_TOLERANCE + 1.5
    assert (probe_cache.lookup(key, now=1060.0, busy=far) or ({}, 0.0))[0] == _fields()
    assert probe_cache.lookup(_key(model_digest="m2"), now=1060.0, busy=far) is None
    assert probe_cache.lookup(key, now=1000.0 + probe_cache.MAX_AGE_S + 1, busy=0.0) is None
    monkeypatch.setenv("FRESHROLL_PROBE_CACHE", "on")
    assert not probe_cache.pinned()
    assert probe_cache.lookup(key, now=1060.0, busy=far) is None

"""The shared-memory weight channel of ``run.runtime: process`` (real segments in /dev/shm)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from freshroll.errors import WorkerTimeout
from freshroll.placement.shm_segments import (
    PREFIX,
    run_key,
    segment_name,
    segment_owner,
    shm_dir,
    sweep_segments,
)
from freshroll.placement.shm_weights import (
    Layout,
    SlotBusy,
    SlotHandle,
    SlotReader,
    StaleHandle,
    WeightChannel,
)


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 5, generator=g),
        "norm.weight": torch.randn(5, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, 3, generator=g).to(torch.float16),
        "steps": torch.randint(-(2**40), 2**40, (4,), generator=g),
        "mask": torch.rand(7, generator=g) > 0.5,
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(3.25),
    }


@pytest.fixture
def channel() -> Iterator[WeightChannel]:
    ch = WeightChannel.create(_state(0), wait_s=5.0)
    try:
        yield ch
    finally:
        ch.close()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
        for k in a)


def test_a_slot_round_trips_every_tensor_exactly(channel: WeightChannel):
    layout = Layout.from_json(channel.layout.to_json())
    assert layout == channel.layout
    assert all(e.offset % 64 == 0 for e in layout.entries)
    reader = SlotReader(str(channel.path), layout)
    try:
        for seed in (1, 2, 3):  # slots 0, 1, 0: each read back bit for bit
            state = _state(seed)
            h = channel.write(state)
            assert h == SlotHandle((seed - 1) % 2, seed - 1)
            assert _same({k: v.clone() for k, v in reader.views(h).items()}, state)
            reader.check(h)
    finally:
        reader.close()


def test_a_model_state_dict_copies_in_through_views(channel: WeightChannel):
    model = torch.nn.Linear(4, 3)
    ch = WeightChannel.create(model.state_dict(), wait_s=1.0)
    try:
        other = torch.nn.Linear(4, 3)
        h = ch.write(other.state_dict())
        reader = SlotReader(str(ch.path), ch.layout)
        model.load_state_dict(reader.views(h), strict=True)
        assert _same(model.state_dict(), other.state_dict())
        reader.close()
    finally:
        ch.close()


def test_a_state_dict_of_another_shape_is_refused(channel: WeightChannel):
    with pytest.raises(ValueError, match="names differ"):
        channel.write({"x": torch.zeros(2)})


def test_the_writer_waits_until_no_reader_holds_its_slot(channel: WeightChannel):
    h0 = channel.write(_state(1))  # slot 0
    channel.acquire(h0)  # a worker loads version 0
    channel.write(_state(2))  # slot 1: free, no wait
    released = threading.Event()

    def reader_done() -> None:
        time.sleep(0.4)
        released.set()
        channel.release(h0)

    threading.Thread(target=reader_done).start()
    t0 = time.perf_counter()
    h2 = channel.write(_state(3))  # slot 0 again: waits for the reader
    assert released.is_set() and time.perf_counter() - t0 >= 0.35
    assert h2 == SlotHandle(0, 2) and channel.readers(0) == 0


def test_a_reader_that_never_answers_gives_a_typed_error():
    ch = WeightChannel.create(_state(0), wait_s=0.2)
    try:
        h0 = ch.write(_state(1))
        ch.acquire(h0)
        ch.write(_state(2))
        with pytest.raises(SlotBusy, match=r"slot 0 after 0\.2 s") as info:
            ch.write(_state(3))
        assert isinstance(info.value, WorkerTimeout)  # retryable
        ch.release(h0)
        assert ch.write(_state(3)) == SlotHandle(0, 2)  # the failed write is not counted
    finally:
        ch.close()


def test_a_handle_two_versions_old_is_refused(channel: WeightChannel):
    h0 = channel.write(_state(1))
    channel.write(_state(2))
    channel.write(_state(3))  # overwrote slot 0
    with pytest.raises(StaleHandle, match="no longer holds"):
        channel.acquire(h0)
    reader = SlotReader(str(channel.path), channel.layout)
    with pytest.raises(StaleHandle):
        reader.views(h0)
    reader.close()
    assert channel.readers(0) == 0


def test_close_unlinks_the_segment_and_is_idempotent():
    ch = WeightChannel.create(_state(0), wait_s=1.0)
    assert ch.path.parent == shm_dir() and ch.path.name.startswith(PREFIX)
    assert ch.path.stat().st_size == ch.layout.total_bytes()
    ch.write(_state(1))
    ch.close()
    ch.close()
    assert not ch.path.exists()
    with pytest.raises(RuntimeError, match="closed"):
        ch.write(_state(2))


# -- owners: issue 23, defect 2 (a kill of the whole process group leaked the segment) -----
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)  # reaped: no process has this pid now
    return proc.pid


@pytest.fixture
def segments() -> Iterator[list[Path]]:
    """Segment files a test lays in shared memory (removed afterwards, swept or not)."""
    made: list[Path] = []
    yield made
    for path in made:
        path.unlink(missing_ok=True)


def _lay(segments: list[Path], name: str) -> Path:
    path = shm_dir() / name
    path.write_bytes(b"\0" * 64)
    segments.append(path)
    return path


def test_a_segment_names_its_run_directory_and_its_owner(tmp_path: Path):
    ch = WeightChannel.create(_state(0), wait_s=1.0, run_dir=tmp_path / "run")
    try:
        assert segment_owner(ch.path.name) == (run_key(tmp_path / "run"), os.getpid())
        assert run_key(tmp_path / "run") == run_key(tmp_path / "x" / ".." / "run")
        assert run_key(tmp_path / "run") != run_key(tmp_path / "other")
    finally:
        ch.close()


def test_sweep_removes_only_dead_owners_segments_of_its_run(tmp_path: Path, segments):
    run, other, dead = tmp_path / "run", tmp_path / "other", _dead_pid()
    leaked = _lay(segments, segment_name(run, dead, "aa11"))
    live = _lay(segments, segment_name(run, os.getpid(), "bb22"))
    others = _lay(segments, segment_name(other, dead, "cc33"))
    old_form = _lay(segments, f"{PREFIX}{dead}-dd44")  # before owners were named
    assert sweep_segments(run) == [leaked]
    assert not leaked.exists()
    assert live.exists() and others.exists() and old_form.exists()
    assert sweep_segments(run) == []


def test_a_sweep_of_the_machine_removes_every_dead_owners_segment(tmp_path: Path, segments):
    """Issue 48: a group-killed run that is never resumed kept its segment forever; the
    machine-wide sweep (every run's start) removes any run's segment of a dead owner."""
    dead = _dead_pid()
    mine = _aged(_lay(segments, segment_name(tmp_path / "run", dead, "ab12")))
    never_resumed = _aged(_lay(segments, segment_name(tmp_path / "other", dead, "cd34")))
    live = _aged(_lay(segments, segment_name(tmp_path / "other", os.getpid(), "ef56")))
    just_killed = _lay(segments, segment_name(tmp_path / "other", dead, "ab78"))
    removed = sweep_segments()
    assert {mine, never_resumed} <= set(removed)
    assert not mine.exists() and not never_resumed.exists()
    assert live.exists()  # its owner runs
    assert just_killed.exists()  # written a moment ago: left for a minute (GRACE_S)
    assert just_killed in sweep_segments(grace_s=0.0)


def _aged(path: Path) -> Path:
    """``path`` last written two minutes ago (past the sweep's grace)."""
    old = path.stat().st_mtime - 120
    os.utime(path, (old, old))
    return path


def test_a_start_and_a_resume_sweep_what_a_killed_run_left(tmp_path: Path, segments):
    """What ``kill -9 -- -PGID`` of a ``run.runtime: process`` run leaves: its segment, owned
    by a dead driver. The next start (and resume) of any run directory removes it."""
    from freshroll.config import load_config
    from freshroll.runtime import run as run_mod

    sim = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "run.steps=2",
           "task.n_prompts=16", "rollout.group_size=2", "rollout.batch_groups=2"]
    out = tmp_path / "run"
    live = _lay(segments, segment_name(out, os.getpid(), "ee55"))
    for resume in (False, True):
        leaked = _lay(segments, segment_name(out, _dead_pid(), "ff66"))
        elsewhere = _aged(_lay(segments, segment_name(tmp_path / "never-resumed", _dead_pid(),
                                                      "a7")))
        stream = io.StringIO()
        cfg = None if resume else load_config(None, sim)
        assert run_mod.run(cfg, out, resume=resume, stream=stream, report=False).ok
        assert not leaked.exists(), "the killed run's segment leaked"
        assert not elsewhere.exists(), "another killed run's segment leaked"
        said = stream.getvalue()
        assert "shared-memory weight segment(s) killed runs left:" in said
        assert leaked.name in said and elsewhere.name in said
        assert live.exists()

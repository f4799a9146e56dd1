"""``run.runtime: process``: the policy's weights in shared memory, written once per version.

One segment (a file in ``/dev/shm``, mapped by the driver and by every worker process) holds
``K = 2`` slots, each a flat copy of the model's state dict. The layout (names, shapes,
dtypes, byte offsets, 64-byte aligned) is computed once from the learner's state dict
(:class:`Layout`)::

    segment = header (K x int64: the sequence number each slot holds, -1 empty) | slot 0 | slot 1
    slot    = tensor 0 | pad | tensor 1 | pad | ...     (offsets from Layout.entries)

:meth:`WeightChannel.publish` (the ``publish`` callable of
:class:`~freshroll.placement.adapters.ThreadTrainer`, on the trainer thread) copies the
learner's parameters into the next slot (``seq % K``) and returns a :class:`SlotHandle`
(slot, seq): the weights move once per version, whatever the number of workers; a worker
process copies a slot into its model through ``torch.frombuffer`` views (:class:`SlotReader`;
no pickle, no per-worker serialisation).

Readers are counted per slot in the driver: :meth:`WeightChannel.acquire` before a load is
sent to a worker, :meth:`WeightChannel.release` on its answer (or its loss). Before
overwriting a slot, publish waits until no worker reads it (bounded by ``wait_s``;
:class:`SlotBusy` after that), so a worker never copies a half-written version. A handle
whose slot was overwritten since (the worker is two versions behind) is refused by
``acquire`` (:class:`StaleHandle`); the child also checks the slot's sequence number after
its copy.

Lifetime: the segment is created by :meth:`WeightChannel.create` and unlinked by
:meth:`WeightChannel.close` (the run's end, failure included); a worker process whose driver
died (its pipe hit EOF) unlinks it too, so a SIGKILLed driver leaves nothing in ``/dev/shm``
once its workers are gone. A kill of the whole process group leaves it, so a segment names its
owner (its run directory and its driver's pid), and every start and resume of any run on the
machine removes the segments whose owner is dead, never a live process's: the names and that
sweep are :mod:`freshroll.placement.shm_segments` (no torch: a simulated run's start sweeps
too).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from freshroll.engines.weights import Publishing, SlotHandle
from freshroll.errors import WorkerTimeout
from freshroll.placement.shm_segments import segment_name, shm_dir, unlink_quietly

K = 2  # slots: a worker may read version n while version n+1 is written
ALIGN = 64
HEADER = ALIGN  # K int64 sequence numbers, padded


class SlotBusy(WorkerTimeout):
    """A worker still read the slot publish must overwrite, past the wait allowed."""


class StaleHandle(WorkerTimeout):
    """A weight handle whose slot holds a newer version now (the worker fell 2 behind)."""


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    offset: int  # bytes from the slot's start
    nbytes: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each tensor of a state dict lies in one slot."""

    entries: tuple[Entry, ...]
    slot_bytes: int

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> Layout:
        out, off = [], 0
        for name, t in state.items():
            nbytes = t.numel() * t.element_size()
            out.append(Entry(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), off,
                             nbytes))
            off += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(out), max(off, ALIGN))

    def to_json(self) -> dict[str, Any]:
        return {"slot_bytes": self.slot_bytes,
                "entries": [[e.name, list(e.shape), e.dtype, e.offset, e.nbytes]
                            for e in self.entries]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Layout:
        return cls(tuple(Entry(str(n), tuple(int(x) for x in s), str(d), int(o), int(b))
                         for n, s, d, o, b in data["entries"]), int(data["slot_bytes"]))

    def total_bytes(self) -> int:
        return HEADER + K * self.slot_bytes


class _Mapped:
    """A mapped segment file: its header and per-slot tensor views."""

    def __init__(self, path: Path, layout: Layout, create: bool) -> None:
        self.path, self.layout = path, layout
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, layout.total_bytes())
            self.mm = mmap.mmap(fd, layout.total_bytes())
        finally:
            os.close(fd)
        self.header = torch.frombuffer(self.mm, dtype=torch.int64, count=K)
        if create:
            self.header.fill_(-1)
        self.views = [self._views(s) for s in range(K)]

    def _views(self, slot: int) -> dict[str, torch.Tensor]:
        base = HEADER + slot * self.layout.slot_bytes
        out = {}
        for e in self.layout.entries:
            dtype = getattr(torch, e.dtype)
            n = e.nbytes // torch.empty((), dtype=dtype).element_size()
            t = torch.frombuffer(self.mm, dtype=dtype, count=n, offset=base + e.offset) \
                if n else torch.empty(0, dtype=dtype)
            out[e.name] = t.view(e.shape)
        return out

    def close(self) -> None:
        self.header = torch.empty(0)
        self.views = []
        with contextlib.suppress(BufferError):  # a view still alive: freed with the process
            self.mm.close()


class WeightChannel:
    """The driver's side: create, publish into slots, count readers, unlink."""

    def __init__(self, mapped: _Mapped, wait_s: float) -> None:
        self._m, self.wait_s = mapped, wait_s
        self.path, self.layout = mapped.path, mapped.layout
        self._cond = threading.Condition()
        self._readers = [0] * K
        self._seq = -1  # the newest published sequence number
        self.closed = False
        self.publish_s = 0.0  # seconds copying into slots, in total
        self.wait_total_s = 0.0  # seconds publish waited for readers, in total

    @classmethod
    def create(cls, state: Mapping[str, torch.Tensor], wait_s: float,
               run_dir: Path | None = None) -> WeightChannel:
        """A new segment for state dicts shaped like ``state`` (nothing is copied yet),
        owned by this process for run ``run_dir`` (its name: :func:`segment_name`)."""
        layout = Layout.of(state)
        path = shm_dir() / segment_name(run_dir, os.getpid(), secrets.token_hex(6))
        return cls(_Mapped(path, layout, create=True), wait_s)

    def publish(self, learner: Publishing) -> SlotHandle:
        """Copy the learner's published state into the next slot (the process placement's
        :class:`~freshroll.engines.weights.WeightTransfer`)."""
        return self.write(learner.published_state())

    def write(self, state: Mapping[str, torch.Tensor]) -> SlotHandle:
        seq = self._seq + 1
        slot = seq % K
        t0 = time.perf_counter()
        with self._cond:
            if self.closed:
                raise RuntimeError("the weight channel is closed")
            if not self._cond.wait_for(lambda: self._readers[slot] == 0, timeout=self.wait_s):
                raise SlotBusy(f"a worker still read weight slot {slot} after {self.wait_s:g} s")
            self._m.header[slot] = -1  # being written: a reader's check fails
        t1 = time.perf_counter()
        views = self._m.views[slot]
        if state.keys() != views.keys():
            raise ValueError("the state dict's names differ from the channel's layout")
        with torch.no_grad():
            for name, t in state.items():
                views[name].copy_(t.detach())
        with self._cond:
            self._m.header[slot] = seq
            self._seq = seq
        self.wait_total_s += t1 - t0
        self.publish_s += time.perf_counter() - t1
        return SlotHandle(slot, seq)

    def acquire(self, handle: SlotHandle, timeout_s: float = 0.0) -> None:
        """Count a reader of ``handle``'s slot (before the load is sent to a worker)."""
        with self._cond:
            if self.closed:
                raise StaleHandle("the weight channel is closed")
            if int(self._m.header[handle.slot]) != handle.seq:
                raise StaleHandle(f"weight slot {handle.slot} no longer holds version seq "
                                  f"{handle.seq}")
            self._readers[handle.slot] += 1

    def release(self, handle: SlotHandle) -> None:
        with self._cond:
            self._readers[handle.slot] = max(0, self._readers[handle.slot] - 1)
            self._cond.notify_all()

    def readers(self, slot: int) -> int:
        with self._cond:
            return self._readers[slot]

    def close(self) -> None:
        """Unlink the segment (idempotent); workers' mappings stay valid until they exit."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        unlink_quietly(self.path)
        self._m.close()


class SlotReader:
    """A worker process's side: attach to the segment by path, read a slot's views."""

    def __init__(self, path: str, layout: Layout) -> None:
        self._m = _Mapped(Path(path), layout, create=False)
        self.path = path

    def views(self, handle: SlotHandle) -> dict[str, torch.Tensor]:
        if int(self._m.header[handle.slot]) != handle.seq:
            raise StaleHandle(f"weight slot {handle.slot} does not hold seq {handle.seq}")
        return self._m.views[handle.slot]

    def check(self, handle: SlotHandle) -> None:
        """After a copy: the slot still holds ``handle``'s version (not overwritten meanwhile)."""
        if int(self._m.header[handle.slot]) != handle.seq:
            raise StaleHandle(f"weight slot {handle.slot} was overwritten during the load")

    def close(self) -> None:
        self._m.close()


__all__ = ["K", "Layout", "SlotBusy", "SlotHandle", "SlotReader", "StaleHandle",
           "WeightChannel"]

"""Chrome trace-event JSON (the format Perfetto and chrome://tracing open) from spans on
named tracks: the file format alone, nothing of the ledger.

A track is a (process, thread) pair of names. Spans on one track that overlap cannot share
a thread (``X`` events of one thread must nest), so each track is split into lanes
(:func:`lanes`), one thread each: ``w0``, ``w0 (2)``, ... The file is
``{"traceEvents": [...], "displayTimeUnit": "ms"}``: ``M`` events name and order every
process and thread, then one ``X`` (complete) event per span and one ``i`` (instant,
thread-scoped) event per mark, in time order; ``ts`` and ``dur`` are whole microseconds.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Track = tuple[str, str]  # (process, thread): ("inference", "w0")


@dataclass(frozen=True, slots=True)
class Span:
    """A slice of a track from ``start`` to ``end`` (seconds on any clock); ``key`` says what
    it belongs to, for a caller that selects spans (it is not written)."""

    track: Track
    name: str
    start: float
    end: float
    args: dict[str, Any]
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment on a track (seconds on the spans' clock)."""

    track: Track
    name: str
    at: float
    args: dict[str, Any]


def lanes(track_spans: Sequence[Span]) -> list[int]:
    """The lane of each span of one track: in order of start, the lowest lane whose last
    span has ended (end <= start). Spans in one lane never overlap, and there are as many
    lanes as the most spans open at once."""
    order = sorted(range(len(track_spans)),
                   key=lambda i: (track_spans[i].start, track_spans[i].end))
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    out = [0] * len(track_spans)
    for i in order:
        span = track_spans[i]
        while busy and busy[0][0] <= span.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (span.end, lane))
        out[i] = lane
    return out


def _natural(text: str) -> list[Any]:
    """Sort key: ``w2`` before ``w10``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _us(seconds: float) -> int:
    """Whole microseconds: integers, so that a span's ``ts + dur`` is exactly its end and
    spans that touch in one lane never overlap by a rounding error."""
    return round(seconds * 1e6)


def chrome_trace(all_spans: Sequence[Span], marks: Sequence[Mark], t0: float,
                 processes: Sequence[str]) -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``all_spans`` and ``marks``: ``M`` events naming
    and ordering each process and lane thread, an ``X`` event per span and an ``i`` event per
    mark, ``ts``/``dur`` in whole microseconds since ``t0``. ``processes``: every track's
    process, in the order they are shown (pid = position + 1)."""
    by_track: dict[Track, list[Span]] = {}
    for s in all_spans:
        by_track.setdefault(s.track, []).append(s)
    placed = [(s, (s.track, lane)) for spans_ in by_track.values()
              for s, lane in zip(spans_, lanes(spans_), strict=True)]
    threads = {t for _, t in placed} | {(m.track, 0) for m in marks}
    tids = _thread_ids(threads, processes)
    out: list[dict[str, Any]] = []
    for s, thread in placed:
        pid, tid = tids[thread]
        ts = _us(s.start - t0)
        out.append({"name": s.name, "cat": s.track[0], "ph": "X", "ts": ts,
                    "dur": max(0, _us(s.end - t0) - ts), "pid": pid, "tid": tid,
                    "args": s.args})
    for m in marks:
        pid, tid = tids[(m.track, 0)]
        out.append({"name": m.name, "cat": m.track[0], "ph": "i", "s": "t",
                    "ts": _us(m.at - t0), "pid": pid, "tid": tid, "args": m.args})
    out.sort(key=lambda x: x["ts"])
    return {"traceEvents": _metadata(tids, processes) + out, "displayTimeUnit": "ms"}


def _thread_ids(threads: set[tuple[Track, int]], processes: Sequence[str],
                ) -> dict[tuple[Track, int], tuple[int, int]]:
    """(track, lane) -> (pid, tid): pids in ``processes`` order, tids from 1 in natural
    order of thread name, then lane."""
    ordered = sorted(threads, key=lambda t: (processes.index(t[0][0]), _natural(t[0][1]), t[1]))
    out: dict[tuple[Track, int], tuple[int, int]] = {}
    count: dict[int, int] = {}
    for (track, lane) in ordered:
        pid = processes.index(track[0]) + 1
        count[pid] = count.get(pid, 0) + 1
        out[(track, lane)] = (pid, count[pid])
    return out


def _metadata(tids: dict[tuple[Track, int], tuple[int, int]], processes: Sequence[str],
              ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pid in sorted({p for p, _ in tids.values()}):
        out += [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"name": processes[pid - 1]}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"sort_index": pid}}]
    for ((_, thread), lane), (pid, tid) in tids.items():
        name = thread if lane == 0 else f"{thread} ({lane + 1})"
        out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                 "args": {"name": name}},
                {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                 "args": {"sort_index": tid}}]
    return out

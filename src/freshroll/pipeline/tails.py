"""Group deadlines: which running requests to cut, and cutting them in the buffer.

The rules are :func:`freshroll.control.tail.tail_action` (pure); this module
applies them to the buffer's running groups. The orchestrator calls, every tick::

    for cut in watch.due(clock.now(), buf):
        apply_cut(buf, cut)                               # the ledger first: terminal now
        for (worker, epoch), samples in cut.by_worker().items():
            await engines[worker].cancel(samples)         # then stop the work

``due`` and ``apply_cut`` run with no ``await`` between them, so no result can
slip in between the decision and the discard; a result that arrives after the
cut is rejected by the buffer (the attempt ended), never applied.

Per running group (``started_at`` = its first attempt's start, ``p50`` = the
median start -> generated latency of the recent attempts)::

    now >= started_at + deadline_factor x p50 and done >= min_keep
        -> cut   (reason ``deadline``): its running and queued members end; the group
                 becomes ready with the ``done`` members it has
    now >= started_at + drop_factor x p50 and done < min_keep
        -> drop  (reason ``cancelled``): every member ends, the finished ones too; the
                 group frees its admission place
    otherwise wait

``done`` counts members generated or rewarded. Nothing is cut before the
latency window holds ``min_latencies`` measurements (no p50, no deadline).
The latencies are the buffer's (``SampleBuffer.recent_latencies``: from the
ledger's own timestamps, so the same in real and virtual time and after a
resume) unless the orchestrator feeds its own with :meth:`TailWatch.observe`:
then only those count.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from freshroll.config.run import TailSection
from freshroll.control.tail import GroupProgress, TailPolicy, tail_action
from freshroll.errors import ConfigError, StateError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.queries import GroupStatus
from freshroll.ledger.lineage import GroupId, RequestId, SampleId, request_of

CutReason = Literal["deadline", "cancelled"]


@dataclass(frozen=True, slots=True)
class Cut:
    """One group's requests to end now."""

    group: GroupId
    reason: CutReason  # deadline: stragglers of a kept group; cancelled: the group dropped
    detail: str  # the rule and its numbers (recorded in each discard's detail)
    samples: tuple[SampleId, ...]  # running attempts: cancel them on their engines
    workers: tuple[tuple[str, int], ...]  # (worker, epoch) running each of ``samples``
    queued: tuple[RequestId, ...]  # members not started: discarded only

    @property
    def drop(self) -> bool:
        """The whole group ends (its finished members too)."""
        return self.reason == "cancelled"

    def by_worker(self) -> dict[tuple[str, int], list[SampleId]]:
        """``samples`` grouped by the worker epoch running them."""
        out: dict[tuple[str, int], list[SampleId]] = {}
        for sid, w in zip(self.samples, self.workers, strict=True):
            out.setdefault(w, []).append(sid)
        return out


class TailWatch:
    """Decides the group deadlines of a run (config: the ``tail`` section)."""

    def __init__(
        self,
        cfg: TailSection,
        *,
        group_size: int,
        window: int = 512,
        min_latencies: int = 8,
    ) -> None:
        self.enabled = cfg.deadline
        self.policy = TailPolicy.from_section(cfg)
        if self.enabled and cfg.min_keep > group_size:
            raise ConfigError(f"tail.min_keep ({cfg.min_keep}) exceeds rollout.group_size "
                              f"({group_size}): no group could ever be kept at its deadline")
        if window < 1 or min_latencies < 1:
            raise ConfigError(f"TailWatch: window and min_latencies must be >= 1, got "
                              f"{window}, {min_latencies}")
        self.min_latencies = min_latencies
        self._own: deque[float] = deque(maxlen=window)
        self._window = window
        self._named: set[GroupId] = set()  # groups a cut was returned for (once each)
        self.cuts: dict[CutReason, int] = {"deadline": 0, "cancelled": 0}  # groups, so far

    def observe(self, latency_s: float) -> None:
        """One request's latency as the orchestrator measured it; from the first call on,
        only these count (not the buffer's)."""
        if latency_s >= 0:
            self._own.append(latency_s)

    def p50(self, buf: SampleBuffer) -> float | None:
        """Median latency of the recent window; None while it holds too few."""
        values: Sequence[float] = (
            self._own if self._own else buf.recent_latencies()[-self._window:]
        )
        if len(values) < self.min_latencies:
            return None
        return float(statistics.median(values))

    def due(self, now: float, buf: SampleBuffer) -> list[Cut]:
        """The cuts to make now, oldest group first; each group is named at most once."""
        if not self.enabled:
            return []
        p50 = self.p50(buf)
        if p50 is None:
            return []
        groups = buf.running_groups()
        self._named.intersection_update(g.group for g in groups)
        cuts = []
        for g in groups:
            if g.started_at is None or g.open == 0 or g.group in self._named:
                continue
            cut = self._decide(now, g, p50)
            if cut is not None:
                self._named.add(g.group)
                self.cuts[cut.reason] += 1
                cuts.append(cut)
        return cuts

    def _decide(self, now: float, g: GroupStatus, p50: float) -> Cut | None:
        assert g.started_at is not None
        progress = GroupProgress(started_at=g.started_at, target=g.keeps, done=g.done,
                                 open=g.open)
        action = tail_action(now, progress, p50, self.policy)
        if action.action == "cut_stragglers":
            reason: CutReason = "deadline"
            rule = f"deadline_factor {self.policy.deadline_factor:g}"
        elif action.action == "drop_group":
            reason = "cancelled"
            rule = f"drop_factor {self.policy.drop_factor:g}, min_keep {self.policy.min_keep}"
        else:
            return None
        detail = (f"tail {reason} ({rule}): {action.reason}; p50 {p50:.4g} s, group started "
                  f"{g.started_at:.4f}, now {now:.4f} ({now - g.started_at:.4g} s)")
        return Cut(
            g.group, reason, detail,
            samples=tuple(s for s, _, _ in g.running),
            workers=tuple((w, e) for _, w, e in g.running),
            queued=g.queued,
        )


def apply_cut(buf: SampleBuffer, cut: Cut) -> int:
    """Discard ``cut``'s requests in the buffer (terminal); returns how many ended.

    Members that moved on since :meth:`TailWatch.due` (finished, re-issued after a fence)
    are handled by their state now: a deadline cut ends what is still queued or running; a
    drop ends the whole group (:meth:`SampleBuffer.drop_group`). A group no longer running
    ends nothing.
    """
    if cut.drop:
        try:
            return buf.drop_group(cut.group, "cancelled", cut.detail)
        except StateError:
            return 0  # became ready (or ended) meanwhile: nothing left to drop
    ended = 0
    for rid in dict.fromkeys([*(request_of(s) for s in cut.samples), *cut.queued]):
        if buf.request_state(rid) in ("queued", "running"):  # else it finished: kept
            buf.discard(rid, "deadline", cut.detail)
            ended += 1
    return ended

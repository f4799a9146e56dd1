"""The sample buffer's read-only queries: what the runtime asks of the buffer's state.

:class:`BufferQueries` adds to :class:`~freshroll.kernel.state.BufferState` the questions the
orchestrator, the tail rules and the chaos injector ask between commands: the queue
(``next_request``, ``take_requests``, ``next_sample``), a request's or a sample's state
(``request_state``, ``sample_info``, ``group_of_sample``, ``prompt_of``), the running groups
(:class:`GroupStatus`), ready groups, open leases, what is in flight and the recent
latencies. None of them changes state, appends an event or reads the clock or the ledger;
the commands are :class:`freshroll.kernel.buffer.SampleBuffer`'s, which is a ``BufferQueries``.
"""

from __future__ import annotations

from dataclasses import dataclass

from freshroll.errors import UnknownSampleError
from freshroll.kernel.freshness import doomed
from freshroll.kernel.state import (
    _STATE_NAMES,
    GENERATED,
    QUEUED,
    REWARDED,
    RUNNING,
    BufferState,
    Lease,
)
from freshroll.ledger.lineage import GroupId, RequestId, SampleId, request_of, sample_id


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """A running group (admitted, not yet ready or ended), as :meth:`BufferQueries.running_groups`
    reports it: what a tail rule (:mod:`freshroll.control.tail`) needs."""

    group: GroupId
    size: int
    started_at: float | None  # ts of the first attempt of any member; None: none started yet
    done: int  # members generated or rewarded
    running: tuple[tuple[SampleId, str, int], ...]  # (sample, worker, epoch), running attempts
    queued: tuple[RequestId, ...]  # members waiting for a (new) attempt
    target: int = 0  # members it keeps (over-provisioned: < size); 0: size

    @property
    def keeps(self) -> int:
        """Members the group keeps at most: its target, else its size."""
        return self.target or self.size

    @property
    def open(self) -> int:
        """Members still to finish: running or queued."""
        return len(self.running) + len(self.queued)


class BufferQueries(BufferState):
    """Read-only queries of the buffer's state (see the module doc)."""

    def next_request(self) -> RequestId | None:
        """The oldest queued request (re-issued ones first), or None."""
        return self._queue[0].id if self._queue else None

    def take_requests(self, n: int) -> list[RequestId]:
        """Up to ``n`` queued requests, oldest first (they stay queued until started)."""
        return [req.id for req, _ in zip(self._queue, range(n), strict=False)]

    def next_sample(self, request: RequestId) -> SampleId:
        """The sample id :meth:`start` would give ``request``'s next attempt now."""
        req = self._requests.get(request)
        if req is None:
            raise UnknownSampleError(f"unknown request {request!r}")
        return sample_id(req.id, req.attempt + 1)

    def ready_groups(self) -> int:
        return len(self._ready)

    def unrewarded(self) -> list[SampleId]:
        """Generated samples still waiting for a reward (after recovery: re-score them)."""
        return [r.sample for r in self._requests.values() if r.state == GENERATED and r.sample]

    @property
    def groups_admitted(self) -> int:
        return len(self._groups)

    def sample_info(self, sample: str) -> tuple[float, int]:
        """``(reward, policy step it was generated with)`` of a sample's current attempt."""
        req = self._request(request_of(sample))
        if req.sample != sample:
            raise UnknownSampleError(f"{sample} is not the current attempt of {req.id}")
        return req.reward, req.step

    def running_groups(self) -> list[GroupStatus]:
        """Every running group (admitted, not yet ready or ended), oldest first.

        Costs O(running groups x group size), not O(groups ever admitted).
        """
        out = []
        for group in self._live.values():
            done, running, queued = 0, [], []
            for req in group.members:
                if req.state == GENERATED or req.state == REWARDED:
                    done += 1
                elif req.state == RUNNING:
                    running.append((req.sample, *req.worker))  # type: ignore[misc]  # running: sample and worker are set
                elif req.state == QUEUED:
                    queued.append(req.id)
            size = len(group.members)
            out.append(GroupStatus(group.id, size, group.started_at, done, tuple(running),
                                   tuple(queued), group.target if group.target < size else 0))
        return out

    def doomed_groups(self, basis: str, max_staleness: int) -> list[tuple[GroupId, int]]:
        """The running groups that can no longer be consumed fresh at the current version,
        with their lag (:func:`freshroll.kernel.freshness.doomed`: the members certain to be in
        each on ``basis``), oldest first. O(running groups x group size)."""
        if self.version is None:
            return []
        v, out = self.version.step, []
        for group in self._live.values():
            extras = group.target < len(group.members)
            steps = []
            for req in group.members:
                done = req.state == GENERATED or req.state == REWARDED
                if basis == "newest_token":
                    if done:
                        steps.append(req.newest)
                elif done or (req.state == RUNNING and not extras):
                    steps.append(req.step)
            if doomed(v, steps, max_staleness):
                out.append((group.id, v - min(steps)))
        return out

    def request_state(self, request: str) -> str:
        """``queued``, ``running``, ``generated``, ``rewarded``, ``committed`` or ``discarded``."""
        return _STATE_NAMES[self._request(request_of(request)).state]

    def attempt_state(self, sample: str) -> str:
        """:meth:`request_state` of ``sample``'s request when ``sample`` is its current
        attempt, else ``superseded`` (a retry re-issued it: ``fenced``, ``refreshed``)."""
        req = self._request(request_of(sample))
        return _STATE_NAMES[req.state] if req.sample == sample else "superseded"

    def recent_latencies(self) -> list[float]:
        """Seconds from start to generated of the latest attempts (at most
        :data:`freshroll.kernel.state.LATENCY_WINDOW`), by the events' timestamps, oldest first."""
        return list(self.latencies)

    def group_of_sample(self, sample: str) -> tuple[GroupId, str]:
        group = self._request(request_of(sample)).group
        return group.id, group.prompt_id

    def prompt_of(self, request: str) -> str:
        return self._request(request_of(request)).group.prompt_id

    def open_leases(self) -> list[Lease]:
        return list(self._leases.values())

    def in_flight(self) -> int:
        """Requests queued, running or generated (not yet rewarded or ended)."""
        return sum(1 for r in self._requests.values() if r.state in (QUEUED, RUNNING, GENERATED))


__all__ = ["BufferQueries", "GroupStatus"]

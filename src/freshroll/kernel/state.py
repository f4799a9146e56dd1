"""The sample buffer's state, and the event handlers that are the only code changing it.

:class:`BufferState` is a pure reducer over ledger events: ``apply(event)``
moves requests, groups, leases and worker epochs from one state to the next,
with no validation beyond what replay needs, no clock and no I/O. The
commands that validate input and emit events live in
:class:`freshroll.kernel.buffer.SampleBuffer`, which applies every event it appends
through the same handlers that replay a ledger after a crash.

Request states: ``queued -> running -> generated -> rewarded -> committed``,
or ``discarded`` (terminal); a ``fenced`` discard sends a running request back
to ``queued``, a ``refreshed`` one a generated or rewarded request (a finished member past the
freshness bound, re-issued: :mod:`freshroll.kernel.refresh`): its result leaves the group, and a
ready group goes back to running. Group states: ``running -> ready -> leased -> done``
(``ready -> running`` by a refresh). An over-provisioned
group (``target`` < its members) keeps its first ``target`` members generated: the buffer
discards the rest ``cancelled`` (:mod:`freshroll.kernel.stop_at_target`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from freshroll.errors import StateError, UnknownSampleError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import (
    GroupId,
    PolicyVersion,
    RequestId,
    SampleId,
    policy_step,
    request_ids,
    request_of,
)

QUEUED, RUNNING, GENERATED, REWARDED, COMMITTED, DISCARDED = range(6)
G_RUNNING, G_READY, G_LEASED, G_DONE = range(4)
_STATE_NAMES = ("queued", "running", "generated", "rewarded", "committed", "discarded")
LATENCY_WINDOW = 512  # latencies kept in BufferState.latencies

@dataclass(slots=True)
class _Request:
    id: RequestId
    group: _Group
    state: int = QUEUED
    attempt: int = 0
    sample: SampleId | None = None
    worker: tuple[str, int] | None = None
    step: int = -1  # policy step its current attempt was generated with (oldest token)
    newest: int = -1  # policy step of its newest token (generated.last_version, else step)
    reward: float = math.nan
    started_at: float = math.nan  # ts of its current attempt's start
    refreshes: int = 0  # attempts discarded ``refreshed`` (freshroll.kernel.refresh)


@dataclass(slots=True)
class _Group:
    id: GroupId
    prompt_id: str
    members: list[_Request] = field(default_factory=list)
    open: int = 0  # members not yet rewarded or terminally discarded
    state: int = G_RUNNING
    samples: list[SampleId] = field(default_factory=list)  # rewarded samples, in order
    dropping: ev.DiscardReason | None = None  # set once a whole-group discard has begun
    oldest: int = 2**62  # oldest policy step among its rewarded samples (its staleness)
    newest: int = 2**62  # least newest-token step among them (newest_token basis)
    started_at: float | None = None  # ts of the first attempt of any member
    target: int = 0  # members it keeps (over-provisioned: fewer than its members; stop at target)
    seq: int = 0  # its place in admission order (run.staleness_policy: pace leases by it)


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    version: int
    groups: tuple[GroupId, ...]
    samples: tuple[SampleId, ...]



class BufferState:
    """Everything the ledger says about live requests, groups, leases and workers."""

    def __init__(self) -> None:
        self.version: PolicyVersion | None = None
        self._version_str = ""  # str(self.version), as the ledger wrote it (canonical)
        self.incarnation = -1
        self._groups: dict[GroupId, _Group] = {}
        self._requests: dict[RequestId, _Request] = {}
        self._queue: deque[_Request] = deque()
        self._ready: deque[_Group] = deque()
        #: bumped whenever the ready groups or the version change (a lease that found
        #: nothing to do finds nothing again until it moves: SampleBuffer.lease)
        self.ready_changes = 0
        self._leases: dict[str, Lease] = {}
        self._n_leases = 0
        self._epochs: dict[str, int] = {}  # worker -> latest epoch
        self._fenced: set[tuple[str, int]] = set()
        self._inflight: dict[tuple[str, int], set[SampleId]] = {}
        self._payloads: dict[SampleId, bytes] = {}
        #: every policy version the ledger has made current -> its step
        self._published: dict[str, int] = {}
        self.retired: set[str] = set()  # workers retired or stopped: their names never return
        self.decision: ev.ControllerDecided | None = None  # the last live-settings decision
        self.closed = False  # a clean shutdown was recorded (until the next open)
        self.accepted = self.running = 0  # groups, for admission
        self._counts: Counter[str] = Counter()  # accounting (see counts), but for ...
        self._started_n = self._generated_n = self._rewarded_n = 0  # ... the per-sample three
        self._live: dict[GroupId, _Group] = {}  # groups running (admitted, not ready or ended)
        #: started -> generated seconds of the latest attempts, by event ts (tail deadlines)
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._handlers: dict[type, Callable[[Any], None]] = {
            ev.Opened: self._on_opened, ev.PolicyPublished: self._on_published,
            ev.Requested: self._on_requested, ev.WorkerStarted: self._on_worker_started,
            ev.WorkerFenced: self._on_worker_fenced, ev.Started: self._on_started,
            ev.Generated: self._on_generated, ev.Rewarded: self._on_rewarded,
            ev.Ready: self._on_ready, ev.Leased: self._on_leased,
            ev.LeaseReleased: self._on_released, ev.Committed: self._on_committed,
            ev.Discarded: self._on_discarded, ev.Rejected: self._on_rejected,
            ev.WeightsLoaded: _noop, ev.FaultInjected: _noop, ev.StepSkipped: _noop,
            ev.Closed: self._on_closed, ev.RunConfig: _noop, ev.SettingsChanged: _noop,
            ev.WorkerReady: _noop, ev.ControllerDecided: self._on_decided,
            ev.TrainerRestarted: _noop, ev.ModeDecided: _noop, ev.CheckpointSaved: _noop,
            ev.Evaluated: _noop,
        }

    @property
    def counts(self) -> Counter[str]:
        """The accounting counters (recomputed from the ledger by verify): ``requests``,
        ``started``, ``generated``, ``rewarded``, ``committed``, ``steps``,
        ``discarded_<reason>``, ``rejected_<reason>``; a key is present once it is > 0.

        The three per-sample counters are kept as plain ints (a ``Counter`` increment
        costs more than the rest of their handler) and brought up to date on each access.
        """
        counts = self._counts
        for key, n in (("started", self._started_n), ("generated", self._generated_n),
                       ("rewarded", self._rewarded_n)):
            if n:
                counts[key] = n
        return counts

    def apply(self, event: ev.Event) -> None:
        self._handlers[type(event)](event)

    def _request(self, rid: str) -> _Request:
        req = self._requests.get(RequestId(rid))
        if req is None:
            raise UnknownSampleError(f"unknown request {rid!r}")
        return req

    # == handlers: the only code that mutates state =======================================
    def _on_opened(self, e: ev.Opened) -> None:
        self.incarnation = e.incarnation
        self.closed = False

    def _on_closed(self, e: ev.Closed) -> None:
        self.closed = True

    def _on_published(self, e: ev.PolicyPublished) -> None:
        self.version = PolicyVersion.parse(e.version)
        self._version_str = e.version
        self.ready_changes += 1
        self._published[e.version] = self.version.step

    def _on_requested(self, e: ev.Requested) -> None:
        group = _Group(GroupId(e.group), e.prompt_id, open=e.size,
                       target=e.size if e.target is None else e.target, seq=len(self._groups))
        if group.id in self._groups:
            raise StateError(f"group {group.id} admitted twice")
        self._groups[group.id] = group
        self._live[group.id] = group
        members, requests = group.members, self._requests
        for rid in request_ids(group.id, e.size):
            req = _Request(rid, group)
            members.append(req)
            requests[rid] = req
        self._queue.extend(members)
        self.running += 1
        self._counts["requests"] += e.size

    def _on_worker_started(self, e: ev.WorkerStarted) -> None:
        self._epochs[e.worker] = e.epoch
        self._inflight[(e.worker, e.epoch)] = set()

    def _on_worker_fenced(self, e: ev.WorkerFenced) -> None:
        self._fenced.add((e.worker, e.epoch))
        if e.reason in ("retired", "stopped"):
            self.retired.add(e.worker)

    def _on_decided(self, e: ev.ControllerDecided) -> None:
        self.decision = e

    def worker_names(self) -> list[str]:
        """Every worker the ledger has registered, in order of first registration."""
        return list(self._epochs)

    # The per-sample handlers come in two halves: ``_on_x(event)`` finds the request (replay),
    # ``_x(req, event)`` changes state. A command that has already found the request calls
    # the second half directly: the same code runs live and on replay.
    def _on_started(self, e: ev.Started) -> None:
        self._started(self._requests[request_of(e.sample)], e)

    def _started(self, req: _Request, e: ev.Started) -> None:
        if req.state != QUEUED:
            raise StateError(f"start of {e.sample}: request not queued")
        queue = self._queue
        if queue[0] is req:
            queue.popleft()
        else:
            queue.remove(req)
        step = self._published.get(e.version)
        req.state, req.attempt, req.sample = RUNNING, req.attempt + 1, e.sample  # type: ignore[assignment]  # NewType: a str on the hot path
        req.worker = worker = (e.worker, e.epoch)
        req.step = policy_step(e.version) if step is None else step
        req.started_at = e.ts
        if req.group.started_at is None:
            req.group.started_at = e.ts
        self._inflight[worker].add(e.sample)  # type: ignore[arg-type]  # NewType: a str on the hot path
        self._started_n += 1

    def _on_generated(self, e: ev.Generated) -> None:
        self._generated(self._requests[request_of(e.sample)], e)

    def _generated(self, req: _Request, e: ev.Generated) -> None:
        req.state = GENERATED
        last = e.last_version
        if last is None:
            req.newest = req.step
        else:
            step = self._published.get(last)
            req.newest = policy_step(last) if step is None else step
        self.latencies.append(e.ts - req.started_at)
        self._inflight[req.worker].discard(req.sample)  # type: ignore[index]  # running: worker and sample are set
        self._generated_n += 1

    def _on_rewarded(self, e: ev.Rewarded) -> None:
        self._rewarded(self._requests[request_of(e.sample)], e)

    def _rewarded(self, req: _Request, e: ev.Rewarded) -> None:
        req.state, req.reward = REWARDED, e.reward
        group = req.group
        group.open -= 1
        group.samples.append(e.sample)  # type: ignore[arg-type]  # NewType: a str on the hot path
        if req.step < group.oldest:
            group.oldest = req.step
        if req.newest < group.newest:
            group.newest = req.newest
        self._rewarded_n += 1

    def _on_ready(self, e: ev.Ready) -> None:
        group = self._groups[GroupId(e.group)]
        group.state = G_READY
        self._ready.append(group)
        self.ready_changes += 1
        self._live.pop(group.id, None)
        self.running -= 1
        self.accepted += 1

    def _on_leased(self, e: ev.Leased) -> None:
        groups = [self._groups[GroupId(g)] for g in e.groups]
        for group in groups:
            self._ready.remove(group)
            group.state = G_LEASED
        self.ready_changes += 1
        samples = tuple(s for g in groups for s in g.samples)
        gids = tuple(g.id for g in groups)
        self._leases[e.lease] = Lease(e.lease, policy_step(e.version), gids, samples)
        self._n_leases += 1

    def _on_released(self, e: ev.LeaseReleased) -> None:
        lease = self._leases.pop(e.lease)
        self.ready_changes += 1
        for gid in reversed(lease.groups):
            group = self._groups[gid]
            group.state = G_READY
            self._ready.appendleft(group)

    def _on_committed(self, e: ev.Committed) -> None:
        lease = self._leases.pop(e.lease)
        for gid in lease.groups:
            self._groups[gid].state = G_DONE
        for sid in lease.samples:
            self._requests[request_of(sid)].state = COMMITTED
            self._payloads.pop(sid, None)
        self._counts["committed"] += len(lease.samples)
        self._counts["steps"] += 1
        self.version = PolicyVersion.parse(e.version)
        self._version_str = e.version
        self.ready_changes += 1
        self._published[e.version] = self.version.step

    def _on_discarded(self, e: ev.Discarded) -> None:
        req = self._requests[RequestId(e.request)]
        group, was = req.group, req.state
        if was == QUEUED:
            self._queue.remove(req)
        if req.worker is not None and was == RUNNING:
            self._inflight[req.worker].discard(req.sample)
        if req.sample is not None:
            self._payloads.pop(req.sample, None)
        self._counts[f"discarded_{e.reason}"] += 1
        if e.reason in ev.RETRY_REASONS:
            self.ready_changes += 1  # its group's oldest started step may move (pace)
            if was in (GENERATED, REWARDED):  # refreshed: its result leaves the group
                self._unfinish(req, was)
            req.state = QUEUED
            self._queue.appendleft(req)
            return
        req.state = DISCARDED
        if was == REWARDED:  # a whole ready group discarded (stale / shutdown)
            self.ready_changes += 1
            group.dropping = e.reason
            group.samples.remove(req.sample)  # type: ignore[arg-type]  # rewarded: its sample is set
            if not group.samples:
                self._ready.remove(group)
                group.state = G_DONE
                self.accepted -= 1
            return
        group.open -= 1
        if group.open == 0 and not group.samples and group.state == G_RUNNING:
            group.state = G_DONE
            self._live.pop(group.id, None)
            self.running -= 1
            self.ready_changes += 1  # a group ahead of the ready ones ended (pace may lease)

    def _unfinish(self, req: _Request, was: int) -> None:
        """A finished member is re-issued (``refreshed``): a rewarded one's sample leaves the
        group (which is open by one more, its staleness recomputed from the rewarded members
        left) and a ready group goes back to running."""
        req.refreshes += 1
        req.reward = math.nan
        if was != REWARDED:
            return
        group = req.group
        group.samples.remove(req.sample)  # type: ignore[arg-type]  # rewarded: its sample is set
        group.open += 1
        kept = [r for r in group.members if r.state == REWARDED and r is not req]
        group.oldest = min((r.step for r in kept), default=2**62)
        group.newest = min((r.newest for r in kept), default=2**62)
        if group.state == G_READY:
            self.ready_changes += 1
            self._ready.remove(group)
            group.state = G_RUNNING
            self._live[group.id] = group
            self.running += 1
            self.accepted -= 1

    def _on_rejected(self, e: ev.Rejected) -> None:
        self._counts[f"rejected_{e.reason}"] += 1


def _noop(event: ev.Event) -> None:
    """Events that are recorded for audit and timing but change no buffer state."""

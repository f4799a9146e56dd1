"""The sample state machine, event-sourced on the durable ledger.

Every command (``admit``, ``start``, ``complete``, ``reward``, ``discard``,
``lease``, ``commit``, ``skip_step``, ``release``, ``fence_worker``, ``shutdown``) validates,
appends ONE event (sometimes a few) to the :class:`~freshroll.ledger.store.Ledger`
and applies it through the same handler that replays the ledger after a crash.
So the in-memory state is always a pure function of the event history, and
recovery is replay plus a few recovery events.

A request (``g17.3``) moves through::

    queued --start--> running --complete--> generated --reward--> rewarded --(group ready)-->
        leased --commit--> committed
    any non-terminal state --discard(reason)--> discarded      (terminal)
    running --fence/discard(fenced)--> queued                   (re-issued as a new attempt)
    generated/rewarded --refresh_stale(refreshed)--> queued     (tail.refresh: past the bound)

A group (one prompt, ``group_size`` requests) becomes *ready* once each member
is rewarded or terminally discarded; groups are leased whole, oldest first,
and a group whose lag exceeds ``max_staleness`` (its stalest member's, on the
``staleness_basis`` in force: :func:`freshroll.kernel.freshness.basis_step`) is discarded
as ``stale`` instead of leased. Admission follows
:func:`freshroll.kernel.freshness.admission_capacity`.

Results from a fenced attempt, a superseded attempt, or a second completion of
the same attempt are recorded as ``rejected`` events and never applied
(:mod:`freshroll.kernel.results`: the results and the core every command shares). An
attempt can only start with a policy version the ledger has published, and
``stale`` is decided by :meth:`SampleBuffer.lease` alone. After
:meth:`SampleBuffer.shutdown` the buffer refuses every further command.

Recovery (:meth:`SampleBuffer.open` on a ledger with history): the durable
ledger is a *prefix* of the history, which may end inside any command. So:
the initial version is published if it never was, leases of the dead trainer
are released, every worker epoch still alive in the ledger is fenced and every
attempt still running (on any epoch, also one whose fencing was cut short) is
re-issued, a ready group whose whole-group discard (``stale``, ``shutdown``,
``nonfinite_step``) was cut short is discarded whole, and completed groups
whose ``ready`` event was lost are made ready again. Generated samples whose reward was lost stay
generated: :meth:`SampleBuffer.unrewarded` lists them for re-scoring.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from freshroll.clock import Clock
from freshroll.errors import LeaseError, LedgerError, StateError, UnknownSampleError
from freshroll.kernel.freshness import admission_capacity, is_stale, paced_lease
from freshroll.kernel.refresh import refresh_groups
from freshroll.kernel.results import BufferResults, KernelConfig
from freshroll.kernel.state import (
    _STATE_NAMES,
    G_READY,
    G_RUNNING,
    GENERATED,
    QUEUED,
    RUNNING,
    Lease,
    _Group,
)
from freshroll.kernel.stop_at_target import stop_at_target
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import (
    GroupId,
    PolicyVersion,
    RequestId,
    SampleId,
    group_id,
    request_of,
    sample_id,
)
from freshroll.ledger.store import Ledger


class SampleBuffer(BufferResults):
    """The lifecycle kernel. Not thread-safe: one owner (the orchestrator) calls it. Its
    read-only queries are :class:`~freshroll.kernel.queries.BufferQueries`', the results of
    attempts and the core of every command :class:`~freshroll.kernel.results.BufferResults`'."""

    # == opening and recovery ============================================================
    @classmethod
    def open(cls, ledger: Ledger, config: KernelConfig, clock: Clock, *, run_id: str,
             initial_version: PolicyVersion,
             announce: Sequence[ev.RunConfig | ev.SettingsChanged] = ()) -> SampleBuffer:
        """A fresh buffer on an empty ledger, or the recovered state of an existing one.

        ``announce``: audit events (the config in force, a settings change) written right
        after ``opened``, durable in the same transaction.
        """
        buf = cls(ledger, config, clock, run_id)
        buf.replay()
        buf._emit(ev.Opened(
            ts=clock.now(), run_id=run_id, incarnation=buf.incarnation + 1,
            max_staleness=config.max_staleness, batch_groups=config.batch_groups,
            group_size=config.group_size, max_inflight_groups=config.max_inflight_groups,
            staleness_basis=config.staleness_basis,
            admission_window=_recorded_window(config)))
        if buf.version is None:  # a fresh ledger, or a crash before its first version was durable
            buf._emit(ev.PolicyPublished(ts=clock.now(), version=str(initial_version)))
        for event in announce:
            buf._emit(event)
        buf._recover()
        ledger.flush()
        return buf

    def replay(self) -> int:
        """Apply every durable event of the ledger; returns how many."""
        n = 0
        for seq, event in self.ledger.events():
            handler = self._handlers.get(type(event))
            try:
                if handler is not None:
                    handler(event)
            except (KeyError, StateError, AttributeError) as exc:
                raise LedgerError(
                    f"{self.ledger.path} seq {seq}: inconsistent {type(event).__name__}: {exc!r}"
                ) from exc
            n += 1
        return n

    def _recover(self) -> None:
        now = self.clock.now()
        for lease in list(self._leases.values()):
            self._emit(ev.LeaseReleased(ts=now, lease=lease.id, reason="trainer_lost"))
        for worker, epoch in self._epochs.items():
            if (worker, epoch) not in self._fenced:
                self.fence_worker(worker, epoch, "restart")
        for (worker, epoch), running in self._inflight.items():  # a fence cut by the crash
            for sid in sorted(running):
                self._emit(ev.Discarded(
                    ts=now, request=request_of(sid), sample=sid, reason="fenced",
                    detail=f"worker {worker} epoch {epoch} restart",
                ))
        for group in list(self._ready):  # a whole-group discard cut by the crash
            if group.dropping is not None:
                self._discard_group(group, group.dropping, "completed on recovery")
        for group in self._groups.values():
            if group.state == G_RUNNING:
                stop_at_target(self, group)  # a stop at target cut by the crash
                self._settle(group)  # ready if it has no open member
        self.refresh_stale()

    # == admission ===================================================================
    @property
    def admission_limit(self) -> int | None:
        """Cap on groups in flight (admitted, not yet ready); None: the freshness window only.

        Starts as ``config.max_inflight_groups``; the orchestrator's live settings change it
        during a run (each change is a ledger event of its own). Lowering it never drops
        admitted groups: admission just pauses until enough of them are ready.
        """
        return self._admission_limit

    @admission_limit.setter
    def admission_limit(self, limit: int | None) -> None:
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise StateError(f"admission limit must be an integer >= 1 or None, got {limit!r}")
        self._admission_limit = limit

    @property
    def lookahead(self) -> int:
        """Policy versions admission may run ahead of the trainer: ``max_staleness`` (the
        async mode) unless the sync fallback lowered it (0: the sync mode; recorded as a
        ``mode_decided`` event). Never above ``max_staleness``, so lowering it never breaks
        the freshness bound; admitted groups are kept (admission just pauses)."""
        return self._lookahead

    @lookahead.setter
    def lookahead(self, versions: int) -> None:
        if not isinstance(versions, int) or not 0 <= versions <= self.config.max_staleness:
            raise StateError(f"lookahead must be an integer in [0, max_staleness "
                             f"{self.config.max_staleness}], got {versions!r}")
        self._lookahead = versions

    def capacity(self) -> int:
        """Groups that may be admitted now (see :mod:`freshroll.kernel.freshness`), the look-ahead
        in place of ``max_staleness``; the admission window ``W`` (``admission_window``)
        holds in the async mode only (a look-ahead lowered by the sync fallback admits
        ``(lookahead + 1) × B``)."""
        limit = self.admission_limit
        free = None if limit is None else limit - self.running
        cfg = self.config
        return admission_capacity(
            max_staleness=self._lookahead, version=self._require_version().step,
            batch_groups=cfg.batch_groups, accepted=self.accepted, running=self.running,
            free_slots=free, admission_window=(
                cfg.admission_window if self._lookahead == cfg.max_staleness else None),
        )

    def admit(self, prompt_id: str, extra: int = 0) -> GroupId:
        """Admit one prompt as a group of ``group_size`` (+ ``extra``: over-provisioned, it
        stops at target, :mod:`freshroll.kernel.stop_at_target`) queued requests."""
        if self.capacity() <= 0:
            raise StateError("admission window is full: check capacity() before admit()")
        if not isinstance(extra, int) or extra < 0:
            raise StateError(f"extra requests must be an integer >= 0, got {extra!r}")
        gid, size = group_id(len(self._groups)), self.config.group_size
        self._emit(ev.Requested(ts=self.clock.now(), group=gid, prompt_id=prompt_id,
                                size=size + extra, version=self._version_str,
                                target=size if extra else None))
        return gid

    # == workers =====================================================================
    def register_worker(self, worker: str) -> int:
        """A new epoch for ``worker``; an older live epoch of it is fenced first."""
        old = self._epochs.get(worker)
        if old is not None and (worker, old) not in self._fenced:
            self.fence_worker(worker, old, "restart")
        epoch = 0 if old is None else old + 1
        self._emit(ev.WorkerStarted(ts=self.clock.now(), worker=worker, epoch=epoch))
        return epoch

    def fence_worker(self, worker: str, epoch: int, reason: str,
                     detail: str = "") -> list[RequestId]:
        """Fence an epoch: its running attempts are discarded (fenced) and re-issued.
        ``detail``: why (a lost or timed-out worker's error), kept in the event."""
        if self._epochs.get(worker, -1) < epoch:
            raise UnknownSampleError(f"worker {worker!r} has no epoch {epoch}")
        running = sorted(self._inflight.get((worker, epoch), ()))
        self._emit(ev.WorkerFenced(ts=self.clock.now(), worker=worker, epoch=epoch, reason=reason,
                                   detail=detail))
        reissued = []
        for sid in running:
            rid = request_of(sid)
            self._emit(ev.Discarded(
                ts=self.clock.now(), request=rid, sample=sid, reason="fenced",
                detail=f"worker {worker} epoch {epoch} {reason}",
            ))
            reissued.append(RequestId(rid))
        return reissued

    def start(
        self, request: str, worker: str, epoch: int, version: PolicyVersion | str,
        call: str | None = None, seed: int | None = None,
    ) -> SampleId:
        """Start a new attempt of a queued request on a live worker epoch; ``call`` and
        ``seed`` (recorded as they are) name the episode call it starts in and its sampling
        seed."""
        req = self._requests.get(request)  # type: ignore[call-overload]  # NewType: a str on the hot path
        if req is None:
            raise UnknownSampleError(f"unknown request {request!r}")
        if req.state != QUEUED:
            raise StateError(f"request {request} is not queued (state {_STATE_NAMES[req.state]})")
        if self._epochs.get(worker) != epoch or (worker, epoch) in self._fenced:
            raise StateError(f"worker {worker} epoch {epoch} is fenced or unknown")
        v = version if type(version) is str else str(version)
        if v not in self._published:
            raise StateError(f"policy version {version} was never published in this run")
        sid = sample_id(req.id, req.attempt + 1)
        event = ev.Started(ts=self.clock.now(), sample=sid, worker=worker, epoch=epoch, version=v,
                           call=call, seed=seed)
        if self.closed:
            self._refuse(event)
        self.ledger.append(event)
        self._started(req, event)
        return sid

    # == trainer =====================================================================
    def lease(self, n_groups: int | None = None, *, wait_s: float = 0.0) -> Lease | None:
        """Lease the ``n_groups`` oldest ready groups, or None if there are fewer (under
        ``staleness_policy`` ``pace``: the oldest admitted, or None while one of them is still
        running: :func:`~freshroll.kernel.freshness.paced_lease`).

        Every ready group whose lag now exceeds ``max_staleness`` is discarded
        first (reason ``stale``), so a lease only ever holds fresh groups.

        A call that leased nothing is not repeated while neither the ready groups nor the
        version moved (:attr:`~freshroll.kernel.state.BufferState.ready_changes`): it would
        find the same nothing, so a trainer that asks at every completion costs O(1) until a
        group is ready.
        """
        n = self.config.batch_groups if n_groups is None else n_groups
        if n < 1:
            raise StateError(f"a lease holds at least one group, not {n}")
        if self._leases:
            raise LeaseError(f"lease {next(iter(self._leases))} is still open")
        if self._nothing_to_lease == (self.ready_changes, n):
            return None
        lease = self._lease(n, wait_s)
        if lease is None:
            self._nothing_to_lease = (self.ready_changes, n)
        return lease

    def _lease(self, n: int, wait_s: float) -> Lease | None:
        step, eta = self._require_version().step, self.config.max_staleness
        if self.config.max_refreshes is not None:  # stale members first, not whole groups
            refresh_groups(self, [g for g in self._ready
                                  if is_stale(step, self._oldest_step(g), eta)])
        for group in [g for g in self._ready if is_stale(step, self._oldest_step(g), eta)]:
            self._discard_group(group, "stale", f"lag {step - self._oldest_step(group)} > {eta}")
        if len(self._ready) < n:
            return None
        if self.config.staleness_policy == "pace":
            ready = list(self._ready)
            picked = paced_lease([(self._oldest_step(g), g.seq) for g in ready],
                                 [s for g in self._live.values()
                                  if (s := self._started_step(g)) is not None],
                                 n, version=step, max_staleness=eta)
            if picked is None:
                return None
            fresh = [ready[i] for i in picked]
        else:
            fresh = list(itertools.islice(self._ready, n))
        lid = f"l{self._n_leases}"
        self._emit(ev.Leased(
            ts=self.clock.now(), lease=lid, version=str(self.version),
            groups=[g.id for g in fresh], wait_s=wait_s,
        ))
        return self._leases[lid]

    def _started_step(self, group: _Group) -> int | None:
        """The oldest policy step among a running group's started members (its rewarded ones
        on the basis in force; a running or generated one's oldest token), None if none."""
        steps = [r.step for r in group.members if r.state in (RUNNING, GENERATED)]
        if group.samples:
            steps.append(self._oldest_step(group))
        return min(steps, default=None)

    def commit(
        self,
        lease_id: str,
        settings_digest: str,
        *,
        weights_digest: str | None = None,
        train_s: float = 0.0,
        metrics: Mapping[str, float] | None = None,
    ) -> PolicyVersion:
        """Commit a trainer step on ``lease_id``; durable when this returns.

        ``metrics`` (the step's trainer metrics) are recorded in the ``committed`` event, a
        non-finite value as ``None``: ``metrics.jsonl`` rows are derived from them.
        """
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id!r} is not open")
        parent = self._require_version()
        child = parent.child(lease.samples, settings_digest, weights_digest)
        self._emit(ev.Committed(
            ts=self.clock.now(), lease=lease_id, version=str(child), parent=str(parent),
            settings_digest=settings_digest, samples=list(lease.samples), train_s=train_s,
            metrics={k: float(v) if math.isfinite(v) else None
                     for k, v in (metrics or {}).items()},
        ))
        self.refresh_stale()  # the version moved: members past the bound now
        self.ledger.flush()
        return child

    def skip_step(self, lease_id: str, detail: str, reason: str = "nonfinite") -> None:
        """A trainer step on ``lease_id`` was not applied (its loss or gradients were not
        finite): record ``step_skipped``, give the lease back and discard its groups whole
        (``nonfinite_step``), so the batch is never trained on. Durable when this returns."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id!r} is not open")
        now = self.clock.now()
        self._emit(ev.StepSkipped(
            ts=now, lease=lease_id, version=str(self.version), reason=reason, detail=detail,
        ))
        self._emit(ev.LeaseReleased(ts=now, lease=lease_id, reason="step_skipped"))
        for gid in lease.groups:
            self._discard_group(self._groups[gid], "nonfinite_step", detail)
        self.ledger.flush()

    def release(self, lease_id: str, reason: str) -> None:
        """Give a lease's groups back (its trainer failed); they are leased again first."""
        if lease_id not in self._leases:
            raise LeaseError(f"lease {lease_id!r} is not open")
        self._emit(ev.LeaseReleased(ts=self.clock.now(), lease=lease_id, reason=reason))

    def shutdown(self, reason: str = "done") -> None:
        """Release leases, discard everything unfinished (``shutdown``), close durably.

        Idempotent; afterwards every command raises :class:`StateError`.
        """
        if self.closed:
            return
        for lid in list(self._leases):
            self.release(lid, "shutdown")
        for req in list(self._requests.values()):
            if req.state in (QUEUED, RUNNING, GENERATED):
                self.discard(req.id, "shutdown", reason)
        for group in list(self._ready):
            self._discard_group(group, "shutdown", reason)
        self._emit(ev.Closed(ts=self.clock.now(), reason=reason))
        self.ledger.flush()

    # == queries =====================================================================
    def payload(self, sample: str) -> bytes | None:
        data = self._payloads.get(SampleId(sample))
        return data if data is not None else self.ledger.payload(sample)

    def record(
        self, event: ev.WeightsLoaded | ev.FaultInjected | ev.WorkerReady | ev.ControllerDecided
        | ev.TrainerRestarted | ev.ModeDecided | ev.CheckpointSaved | ev.Evaluated,
    ) -> None:
        """Append an audit event (weights loaded, fault, worker ready, controller decision,
        trainer restarted, checkpoint saved, evaluation);
        only a decision is kept, as :attr:`decision` (a resume restores its settings)."""
        self._emit(event)

    def drop_group(self, group: str, reason: ev.DiscardReason, detail: str = "") -> int:
        """End a running group whole: every member not yet ended is discarded with ``reason``
        (terminal), the rewarded ones too. Returns how many requests this ended.

        Unfinished members first, one by one; if rewarded members are left, their group is
        then ready and is discarded whole, as a stale group is (a crash in between: recovery
        completes the whole-group discard)."""
        if reason in ev.RETRY_REASONS or reason == "stale":
            raise StateError(f"a group cannot be dropped as {reason!r}")
        g = self._groups.get(GroupId(group))
        if g is None:
            raise UnknownSampleError(f"unknown group {group!r}")
        if g.state != G_RUNNING:
            raise StateError(f"group {group} is not running (it is ready, leased or ended)")
        ended = 0
        for req in g.members:
            if req.state in (QUEUED, RUNNING, GENERATED):
                self.discard(req.id, reason, detail)
                ended += 1
        if g.state == G_READY:
            ended += len(g.samples)
            self._discard_group(g, reason, detail)
        return ended

    def drop_doomed(self) -> int:
        """Discard ``stale`` every running group that can no longer be consumed fresh
        (:meth:`doomed_groups` on the basis in force): its queued and running members, the
        generated ones, then its rewarded samples once it is ready, as a stale group is at
        lease. The running attempts it ended are appended to ``stopped`` (the orchestrator
        cancels them on their engines, as after a stop at target). Returns how many requests
        ended. Each discard is truthful at its time: ``verify`` rechecks the group's lag."""
        cfg, ended = self.config, 0
        for gid, lag in self.doomed_groups(cfg.staleness_basis, cfg.max_staleness):
            g = self._groups[gid]
            detail = (f"doomed before it was ready: lag {lag} > {cfg.max_staleness} "
                      f"({cfg.staleness_basis}) for a member certain to be in it")
            for req in g.members:
                if req.state not in (QUEUED, RUNNING, GENERATED):
                    continue
                if req.state == RUNNING and req.worker is not None and req.sample is not None:
                    self.stopped.append((req.sample, *req.worker))
                self._emit(ev.Discarded(ts=self.clock.now(), request=req.id,
                                        sample=req.sample if req.state else None,
                                        reason="stale", detail=detail))
                ended += 1
            self._settle(g)  # rewarded samples left: ready, then discarded whole below
            if g.state == G_READY:
                ended += len(g.samples)
                self._discard_group(g, "stale", detail)
        return ended

    def refresh_stale(self) -> int:
        """Re-issue every finished member of a running or ready group that is past the
        freshness bound now (``refreshed``, :mod:`freshroll.kernel.refresh`; nothing when
        ``config.max_refreshes`` is None). The attempts it ended are appended to
        ``refreshed`` (the orchestrator wakes its workers). Returns how many."""
        if self.config.max_refreshes is None or self.version is None:
            return 0
        return refresh_groups(self, [*self._live.values(), *self._ready])

    def stats(self) -> dict[str, Any]:
        """A snapshot of the buffer's counters (JSON-ready)."""
        states = Counter(_STATE_NAMES[r.state] for r in self._requests.values())
        return {
            "version": self.version.step if self.version else None,
            "groups_admitted": len(self._groups), "groups_running": self.running,
            "groups_accepted": self.accepted, "groups_ready": len(self._ready),
            "capacity": self.capacity() if self.version else 0,
            "requests": dict(states), "open_leases": len(self._leases),
            "counts": dict(self.counts),
        }

def replay_ledger(ledger: Ledger, config: KernelConfig, clock: Clock) -> SampleBuffer:
    """The state a ledger describes, without opening a new incarnation (read-only use)."""
    buf = SampleBuffer(ledger, config, clock, run_id="replay")
    buf.replay()
    return buf


def _recorded_window(config: KernelConfig) -> int | None:
    """``opened.admission_window``: ``W`` when wider than ``η + 1``; None (the default
    window, as ledgers before the setting recorded it) otherwise."""
    w = config.admission_window
    return None if w is None or w == config.max_staleness + 1 else w

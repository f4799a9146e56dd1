"""What the sample buffer does with a worker's result, and the core every command shares.

:class:`BufferResults` is the base of :class:`~freshroll.kernel.buffer.SampleBuffer` (whose module
docstring draws the state machine): the results of an attempt (``complete``, ``reward``,
``discard``) and the one path of every command (``_emit``: append one event to the
:class:`~freshroll.ledger.store.Ledger`, then apply it through the handler that also replays it).

A result is applied only when it is the live one: the current attempt of its request, in
the state the result expects (running for a completion, generated for a reward), from the
worker epoch the attempt was started on and not fenced since. Any other result is recorded
as a ``rejected`` event and never applied: ``fenced`` (a superseded attempt, or one of a
fenced worker epoch), ``duplicate`` (a second result of the same attempt) or
``not_running``. A test-only broken build (:mod:`freshroll.unsafe`) writes it instead, as
that build would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NoReturn

from freshroll import unsafe
from freshroll.clock import Clock
from freshroll.errors import ConfigError, StateError
from freshroll.kernel.freshness import STALENESS_BASES, STALENESS_POLICIES, basis_step
from freshroll.kernel.queries import BufferQueries
from freshroll.kernel.refresh import refresh_member
from freshroll.kernel.state import (
    _STATE_NAMES,
    COMMITTED,
    DISCARDED,
    G_DONE,
    G_LEASED,
    G_RUNNING,
    GENERATED,
    REWARDED,
    RUNNING,
    _Group,
    _Request,
)
from freshroll.kernel.stop_at_target import stop_at_target
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, SampleId, payload_digest, request_of
from freshroll.ledger.store import Ledger


class Outcome(Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class KernelConfig:
    max_staleness: int = 1
    batch_groups: int = 4
    group_size: int = 4
    max_inflight_groups: int | None = None
    staleness_basis: str = "oldest_token"  # freshness.STALENESS_BASES
    #: W, the admission window in trainer steps (freshness.window_steps); None: η + 1
    admission_window: int | None = None
    #: tail.max_refreshes where tail.refresh is on (freshroll.kernel.refresh); None: off
    max_refreshes: int | None = None
    #: run.staleness_policy: lease the oldest ready groups (discard) or the oldest admitted
    #: ones, waiting for those still running (pace)
    staleness_policy: str = "discard"

    def __post_init__(self) -> None:
        for name in ("max_staleness", "batch_groups", "group_size"):
            value = getattr(self, name)
            low = 0 if name == "max_staleness" else 1
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.max_inflight_groups is not None and self.max_inflight_groups < 1:
            raise ConfigError(f"max_inflight_groups must be >= 1, got {self.max_inflight_groups}")
        if self.staleness_basis not in STALENESS_BASES:
            raise ConfigError(f"staleness_basis must be one of {STALENESS_BASES}")
        window = self.admission_window
        if window is not None and (not isinstance(window, int)
                                   or window < self.max_staleness + 1):
            raise ConfigError(f"admission_window must be an integer >= max_staleness + 1 = "
                              f"{self.max_staleness + 1} or None, got {window!r}")
        if self.staleness_policy not in STALENESS_POLICIES:
            raise ConfigError(f"staleness_policy must be one of {STALENESS_POLICIES}, "
                              f"got {self.staleness_policy!r}")
        limit = self.max_refreshes
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 1):
            raise ConfigError(f"max_refreshes must be an integer >= 1 or None, got {limit!r}")


class BufferResults(BufferQueries):
    """The results of attempts and the commands' core (module docstring); not thread-safe:
    one owner calls it."""

    def __init__(self, ledger: Ledger, config: KernelConfig, clock: Clock, run_id: str) -> None:
        super().__init__()
        self._nothing_to_lease: tuple[int, int] | None = None  # (ready_changes, n): lease
        self.ledger, self.config, self.clock, self.run_id = ledger, config, clock, run_id
        self._admission_limit = config.max_inflight_groups
        self._lookahead = config.max_staleness
        self.stopped: list[tuple[SampleId, str, int]] = []  # see freshroll.kernel.stop_at_target
        self.refreshed: list[SampleId] = []  # see freshroll.kernel.refresh

    # == results =====================================================================
    def complete(self, sample: str, *, tokens: int, gen_s: float, payload: bytes | None = None,
                 last_version: PolicyVersion | str | None = None,
                 worker: tuple[str, int] | None = None,
                 token_versions: Sequence[tuple[str, int]] | None = None) -> Outcome:
        """A worker returned the completion of ``sample``.

        ``worker`` (name, epoch) names who produced it; when given, a result from any
        other worker epoch than the one the attempt was started on is rejected as
        ``fenced``. (A sample id can be issued again after a crash lost its ``started``
        event, so a worker that outlived the crash must not complete the new attempt.)
        ``token_versions``: with ``last_version``, its tokens' ``(version, tokens)`` ranges.
        """
        req = self._requests.get(request_of(sample))
        if (req is None or req.state != RUNNING or req.sample != sample
                or req.worker in self._fenced or (worker is not None and worker != req.worker)):
            req = self._live_result(sample, RUNNING, worker)  # rejects (or raises)
            if req is None:
                return Outcome.REJECTED
        if payload is not None:
            self.ledger.put_payload(sample, payload)
            self._payloads[req.sample] = payload  # type: ignore[index]  # running: its sample is set
        event = ev.Generated(
            ts=self.clock.now(), sample=sample, tokens=tokens, gen_s=gen_s,
            last_version=None if last_version is None else str(last_version),
            first_version=None if last_version is None or not token_versions
            else token_versions[0][0], token_versions=None if last_version is None
            or not token_versions else [(str(v), int(n)) for v, n in token_versions],
            payload_digest=None if payload is None else payload_digest(payload))
        if self.closed:
            self._refuse(event)
        self.ledger.append(event)
        self._generated(req, event)
        if self.config.max_refreshes is not None:  # a result already past the bound
            refresh_member(self, req)
        if req.group.target < len(req.group.members) and stop_at_target(self, req.group):
            self._settle(req.group)
        return Outcome.ACCEPTED

    def reward(
        self, sample: str, value: float, reward_version: str, reward_s: float = 0.0,
        components: Mapping[str, float] | None = None, logged: Mapping[str, float] | None = None,
        extras: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """Record the reward of a generated sample (NaN/inf discards it as reward_error), with
        each reward function's value, its calls' ``log_metric`` values and its ``log_extra``
        values (:func:`ev.plain_extras`) when a reward set scored it."""
        req = self._requests.get(request_of(sample))
        if req is None or req.state != GENERATED or req.sample != sample:
            req = self._live_result(sample, GENERATED)  # rejects (or raises)
            if req is None:
                return Outcome.REJECTED
        if not math.isfinite(value):
            self.discard(sample, "reward_error", f"reward is {value}")
            return Outcome.ACCEPTED
        event = ev.Rewarded(
            ts=self.clock.now(), sample=sample, reward=value, reward_version=reward_version,
            reward_s=reward_s, components=dict(components or {}), logged=dict(logged or {}),
            extras=ev.plain_extras(extras) if extras else {},
        )
        if self.closed:
            self._refuse(event)
        self.ledger.append(event)
        self._rewarded(req, event)
        self._settle(req.group)
        return Outcome.ACCEPTED

    def discard(self, target: str, reason: ev.DiscardReason, detail: str = "") -> None:
        """End a request (given by request or current sample id) without consuming it.

        ``fenced`` re-issues the request; every other reason is terminal.
        """
        if reason not in ev.DISCARD_REASONS:
            raise StateError(f"unknown discard reason {reason!r}")
        if reason == "stale":
            raise StateError("stale is decided at lease time, for whole groups: see lease()")
        sid = SampleId(target) if "#" in target else None
        req = self._request(request_of(target))
        if sid is not None and sid != req.sample:
            raise StateError(f"{sid} is not the current attempt of {req.id} ({req.sample})")
        if req.state in (COMMITTED, DISCARDED) or req.group.state in (G_LEASED, G_DONE):
            raise StateError(f"request {req.id} can no longer be discarded")
        if reason == "refreshed":
            raise StateError("refreshed is decided by the refresh rule: see refresh_stale()")
        if reason in ev.RETRY_REASONS and req.state != RUNNING:
            raise StateError(f"only a running attempt can be {reason}, {req.id} is not running")
        if req.state == REWARDED:
            raise StateError(f"request {req.id} is rewarded; its group is discarded at lease")
        self._emit(ev.Discarded(
            ts=self.clock.now(), request=req.id, sample=req.sample if req.state else None,
            reason=reason, detail=detail,
        ))
        self._settle(req.group)

    def _live_result(
        self, sample: str, expected: int, worker: tuple[str, int] | None = None
    ) -> _Request | None:
        req = self._request(request_of(sample))
        reason: ev.RejectReason | None = None
        fenced = expected == RUNNING and req.worker is not None and (
            req.worker in self._fenced or (worker is not None and worker != req.worker)
        )
        if sample != req.sample or fenced:
            reason = "fenced"
        elif req.state > expected:
            reason = "duplicate"
        elif req.state != expected:
            reason = "not_running"
        if reason is None:
            return req
        if unsafe.BROKEN and self._unsafe_apply(reason, sample, expected):
            return None
        self._emit(ev.Rejected(
            ts=self.clock.now(), sample=sample, reason=reason,
            detail=f"request {req.id} is {_STATE_NAMES[req.state]}, current attempt {req.sample}",
        ))
        return None

    def _unsafe_apply(self, reason: str, sample: str, expected: int) -> bool:
        """Test-only (:mod:`freshroll.unsafe`): a build without fencing or de-duplication
        writes the result it should have rejected, as that build would (the kernel's state
        does not change: the ledger shows it, for verify and the chaos harness to catch)."""
        if not ((reason == "fenced" and unsafe.broken("fencing"))
                or (reason == "duplicate" and unsafe.broken("dedup"))):
            return False
        now = self.clock.now()
        self.ledger.append(
            ev.Generated(ts=now, sample=sample, tokens=0, gen_s=0.0) if expected == RUNNING
            else ev.Rewarded(ts=now, sample=sample, reward=0.0, reward_version="unsafe"))
        return True

    def _settle(self, group: _Group) -> None:
        if group.state == G_RUNNING and group.open == 0 and group.samples:
            self._emit(ev.Ready(ts=self.clock.now(), group=group.id, samples=list(group.samples)))

    # == internals ===================================================================
    def _emit(self, event: ev.Event) -> None:
        """Append ``event`` and apply it through the handler that also replays it."""
        if self.closed and not isinstance(event, ev.Opened):
            self._refuse(event)
        self.ledger.append(event)
        self._handlers[type(event)](event)

    # The hot commands (start, complete, reward) append their event themselves, refuse it
    # here when the buffer is closed, and apply it at once with the second half of its
    # handler (``_started(req, event)``: the request is already found).
    def _refuse(self, event: ev.Event) -> NoReturn:
        raise StateError(f"the buffer was shut down: no {type(event).__name__} after it")

    def _require_version(self) -> PolicyVersion:
        if self.version is None:
            raise StateError("no policy version published yet")
        return self.version

    def _oldest_step(self, group: _Group) -> int:
        """The step whose lag η bounds for ``group`` on the basis in force."""
        return basis_step(group.oldest, group.newest, self.config.staleness_basis)

    def _discard_group(self, group: _Group, reason: ev.DiscardReason, detail: str) -> None:
        for sid in list(group.samples):
            self._emit(ev.Discarded(ts=self.clock.now(), request=request_of(sid), sample=sid,
                                    reason=reason, detail=detail))


__all__ = ["BufferResults", "KernelConfig", "Outcome"]

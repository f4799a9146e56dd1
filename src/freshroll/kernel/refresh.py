"""Refreshing stale finished members, as a buffer command (``tail.refresh``, issue 26).

The rule (:func:`freshroll.kernel.freshness.refresh_due`, formula in
:mod:`freshroll.kernel.freshness`): at
trainer version ``v``, every group running or ready (not leased, no whole-group discard
begun) is walked, and each member generated or rewarded, of basis step ``s`` (its oldest or
newest token's, on ``run.staleness_basis``) and refreshed ``r`` times already::

    v - s > η  and  r < R  ->  discarded ``refreshed``         R = tail.max_refreshes

``refreshed`` is a retry reason (:data:`freshroll.ledger.events.RETRY_REASONS`, as ``fenced``): the
request is queued again and its next attempt is generated with the policy then current. The
attempt's result leaves its group (a ready group goes back to running,
:mod:`freshroll.kernel.state`),
so it is never leased and never trained on; the group's other members are kept. Where the
rule does not fire (a member refreshed ``R`` times) the group is discarded ``stale`` at lease
as without the lever.

The buffer applies it (when ``KernelConfig.max_refreshes`` is set) at each commit (the version
changed: every group), to a result that arrives already past the bound (its own member),
before a lease would discard stale groups (the ready ones) and on recovery; so it holds for
every incarnation of a run, the ledger first. The attempts it ended are appended to
``buf.refreshed``: the orchestrator wakes its workers (requests are queued) and scores none of
them (a reward that still arrives is rejected), then clears it. Each ``refreshed`` event's
detail names the rule's numbers; ``verify`` rechecks the lag from the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from freshroll.clock import Clock
from freshroll.kernel.freshness import basis_step, refresh_due
from freshroll.kernel.state import G_READY, G_RUNNING, GENERATED, REWARDED, _Group, _Request
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, SampleId


class Settings(Protocol):
    """What the rule reads of :class:`~freshroll.kernel.results.KernelConfig`."""

    @property
    def max_staleness(self) -> int: ...
    @property
    def staleness_basis(self) -> str: ...
    @property
    def max_refreshes(self) -> int | None: ...


class Emitter(Protocol):
    """What the rule needs of :class:`~freshroll.kernel.buffer.SampleBuffer`."""

    clock: Clock
    @property
    def config(self) -> Settings: ...
    version: PolicyVersion | None
    refreshed: list[SampleId]

    def _emit(self, event: ev.Event) -> None: ...


def refresh_member(buf: Emitter, req: _Request) -> bool:
    """Apply the rule to one member (module docstring); True when it was refreshed."""
    cfg, version = buf.config, buf.version
    limit = cfg.max_refreshes
    if limit is None or version is None or not (req.state == GENERATED or req.state == REWARDED):
        return False
    group = req.group
    if group.state not in (G_RUNNING, G_READY) or group.dropping is not None:
        return False
    v, eta, basis = version.step, cfg.max_staleness, cfg.staleness_basis
    step = basis_step(req.step, req.newest, basis)
    if not refresh_due(v, step, eta, req.refreshes, limit):
        return False
    sample = req.sample
    assert sample is not None  # finished: its attempt is set
    buf._emit(ev.Discarded(
        ts=buf.clock.now(), request=req.id, sample=sample, reason="refreshed",
        detail=f"refresh {req.refreshes + 1} of {limit}: lag {v - step} > {eta} ({basis})"))
    buf.refreshed.append(SampleId(sample))
    return True


def refresh_groups(buf: Emitter, groups: Iterable[_Group]) -> int:
    """Apply the rule to every finished member of ``groups``; returns how many it refreshed."""
    return sum(refresh_member(buf, req) for group in list(groups) for req in group.members)


__all__ = ["Emitter", "Settings", "refresh_groups", "refresh_member"]

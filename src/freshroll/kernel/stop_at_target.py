"""Over-provisioning's stop at target, as a buffer command (``tail.overprovision``).

A group admitted with ``size = G + m`` requests and ``target = G``
(:meth:`~freshroll.kernel.buffer.SampleBuffer.admit` with ``extra = m``) keeps the first ``G``
members that reach an outcome; the others end at once, discarded ``cancelled``::

    done = members generated or rewarded (live results, not discarded)
    done >= target  ->  every queued or running member: discarded cancelled (terminal)

The buffer applies the rule after each accepted ``generated`` result and on recovery (a
crash between the result and the cancels: the ledger is a prefix, the rule completes it),
so it holds for every incarnation of a run. Cancelled requests are terminal (never
retried, never leased, never trained on) and reach the ledger like every discard:
conservation (``verify``) and the chaos checks count them; they are counted apart from
``stale`` (``discarded_cancelled``). The running attempts it ended are appended to
``buf.stopped`` as ``(sample, worker, epoch)``: the orchestrator cancels them on their
engines (their slots are freed; a result that still arrives is rejected) and clears it.

A member discarded for another reason (a reward error, ...) after the stop is not
replaced: such a group is ready with fewer than ``G`` samples, as a group with a failed
member is without over-provisioning.
"""

from __future__ import annotations

from typing import Protocol

from freshroll.clock import Clock
from freshroll.kernel.state import G_RUNNING, GENERATED, QUEUED, REWARDED, RUNNING, _Group
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import SampleId


class Emitter(Protocol):
    """What the rule needs of :class:`~freshroll.kernel.buffer.SampleBuffer`."""

    clock: Clock
    stopped: list[tuple[SampleId, str, int]]

    def _emit(self, event: ev.Event) -> None: ...


def reached(group: _Group) -> bool:
    """Is ``group`` an over-provisioned running group with ``target`` members done and
    others still open (the rule above fires)?"""
    if group.state != G_RUNNING or group.target >= len(group.members):
        return False
    done = sum(1 for r in group.members if r.state == GENERATED or r.state == REWARDED)
    return done >= group.target and done < group.open + len(group.samples)


def stop_at_target(buf: Emitter, group: _Group) -> int:
    """Apply the rule to ``group``: discard its open queued and running members
    ``cancelled``; returns how many (0 when the rule does not fire)."""
    if not reached(group):
        return 0
    detail = f"stop at target: {group.target} of {len(group.members)} members done"
    ended = 0
    for req in group.members:
        if req.state not in (QUEUED, RUNNING):
            continue
        if req.state == RUNNING and req.worker is not None and req.sample is not None:
            buf.stopped.append((SampleId(req.sample), *req.worker))
        buf._emit(ev.Discarded(ts=buf.clock.now(), request=req.id,
                               sample=req.sample if req.state else None, reason="cancelled",
                               detail=detail))
        ended += 1
    return ended


__all__ = ["Emitter", "reached", "stop_at_target"]

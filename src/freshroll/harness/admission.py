"""The admission window re-checked on the ledger alone: ``verify``'s part of the freshness
invariant that reads admissions, and the chaos ``admission_bound`` check's counts.

At every ``requested`` event, with ``v`` the trainer version then and ``W`` the admission
window in trainer steps the last ``opened`` recorded (``opened.admission_window``; null:
``max_staleness + 1``, :func:`freshroll.kernel.freshness.window_steps`)::

    accepted + running  <=  (W + v) × B

``accepted``: groups made ready and not discarded whole since (trained ones keep their
place, as in the kernel's count); ``running``: groups admitted, neither ready nor ended (every
member discarded). The counts are recomputed here from the events, sharing no code with
:mod:`freshroll.kernel.state`. The window bounds the async mode; the sync fallback only narrows
admission (``mode_decided.lookahead`` <= η), so the check holds in either.
"""

from __future__ import annotations

from freshroll.kernel.freshness import window_steps
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import group_of, policy_step, request_of


class AdmissionFold:
    """``accepted`` and ``running`` groups and the window in force, one event at a time;
    :meth:`feed` returns the violation an admission makes, if any."""

    def __init__(self) -> None:
        self.eta, self.batch, self.window = 0, 1, 1  # η, B, W (steps) of the last opened
        self.version = 0
        self.accepted = 0  # groups ready or consumed (a discarded ready group frees its place)
        self.running = 0  # groups admitted, not ready, not ended
        self.open: dict[str, int] = {}  # running group -> members not yet rewarded or ended
        self.kept: dict[str, int] = {}  # group -> rewarded members (ready: still held)
        self.state: dict[str, str] = {}  # group -> running | accepted | gone
        self.rewarded: set[str] = set()  # requests rewarded

    def feed(self, e: ev.Event) -> str | None:
        if isinstance(e, ev.Opened):
            self.eta, self.batch = e.max_staleness, e.batch_groups
            w = e.admission_window  # as recorded (the kernel never records one under η + 1)
            self.window = window_steps(e.max_staleness) if w is None else w
        elif isinstance(e, ev.PolicyPublished | ev.Committed):
            self.version = policy_step(e.version)
        elif isinstance(e, ev.Requested):
            return self._requested(e)
        elif isinstance(e, ev.Rewarded):
            req = request_of(e.sample)
            g = group_of(req)
            if req not in self.rewarded and self.state.get(g) == "running":
                self.rewarded.add(req)
                self.open[g] -= 1
                self.kept[g] += 1
        elif isinstance(e, ev.Ready):
            if self.state.get(e.group) == "running":
                self.state[e.group] = "accepted"
                self.running -= 1
                self.accepted += 1
        elif isinstance(e, ev.Discarded) and e.reason not in ev.RETRY_REASONS:
            self._discarded(e)
        elif isinstance(e, ev.Discarded) and e.request in self.rewarded:  # refreshed
            self._unrewarded(e.request)
        return None

    def _unrewarded(self, req: str) -> None:
        """A rewarded member re-issued (``refreshed``): open again, and its ready group
        running again (it holds the same place)."""
        g = group_of(req)
        self.rewarded.discard(req)
        self.open[g] = self.open.get(g, 0) + 1
        self.kept[g] -= 1
        if self.state.get(g) == "accepted":
            self.state[g] = "running"
            self.accepted -= 1
            self.running += 1

    def limit(self) -> int:
        """Groups accepted + running the window allows now: ``(W + v) × B``."""
        return (self.window + self.version) * self.batch

    def _requested(self, e: ev.Requested) -> str | None:
        self.open[e.group] = e.size
        self.kept[e.group], self.state[e.group] = 0, "running"
        self.running += 1
        limit = self.limit()
        if self.accepted + self.running <= limit:
            return None
        return (f"{e.group} admitted at version {self.version} with {self.accepted} accepted + "
                f"{self.running} running groups > window {limit} = ({self.window} + "
                f"{self.version}) x {self.batch} (admission window {self.window} steps, "
                f"max_staleness {self.eta})")

    def _discarded(self, e: ev.Discarded) -> None:
        g = group_of(e.request)
        st = self.state.get(g)
        if st == "running" and e.request not in self.rewarded:
            self.open[g] -= 1
            if self.open[g] == 0 and self.kept[g] == 0:
                self.state[g] = "gone"
                self.running -= 1
        elif st == "accepted" and e.request in self.rewarded:
            self.kept[g] -= 1
            if self.kept[g] == 0:
                self.state[g] = "gone"
                self.accepted -= 1


__all__ = ["AdmissionFold"]

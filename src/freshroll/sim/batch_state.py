"""The state of one continuous-batching server (:mod:`freshroll.sim.batching`) and every
read of it: what it observes (requests decoding, prefilling, waiting; KV tokens held; tokens
produced; stats), when its next event is, and lower bounds on the next finish. Nothing here
changes the state (the next event is cached until it does):
:class:`~freshroll.sim.batching.ContinuousBatcher` adds the commands and the event handlers
that do.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence

from freshroll.sim.profiles import ServerModel

#: a bound computed another way than the batcher's own arithmetic is scaled by this, so that
#: rounding never puts it above the time it bounds
_BELOW = 1.0 - 1e-12


class BatchState:
    """One server's batch state and its reads; :class:`~freshroll.sim.batching.ContinuousBatcher`
    is the batcher (this class alone has no command)."""

    def __init__(self, server: ServerModel) -> None:
        self._t0 = server.step_s
        self._t1 = server.step_s_per_seq
        self._prefill_s = server.prefill_s_per_token
        self._cap = server.max_concurrent
        self._kv_cap = server.kv_capacity_tokens
        self._held = 0  # slots held: prefilling + decoding
        self._boundary = 0.0  # time of the last decode-step boundary applied
        self._steps = 0  # decode steps run so far (all decoding sequences advance together)
        self._now = -math.inf  # every event at or before this time has been applied
        self._last_arrival = -math.inf
        self._decoding: list[tuple[int, int]] = []  # heap of (step count at finish, request)
        self._prefilling: list[tuple[float, int]] = []  # heap of (ready time, request)
        self._waiting: deque[int] = deque()
        self._leaving: set[int] = set()  # cancelled while decoding: out at the next boundary
        self._purge_steps = -1  # step count of that boundary (-1: none pending)
        self._cancelled = 0
        self._event: tuple[float, int] | None = None  # the next event, valid unless _dirty
        self._dirty = False
        self._arrival: list[float] = []
        self._prompt: list[int] = []
        self._tokens: list[int] = []
        self._start: list[float] = []
        self._decode_start: list[float] = []
        # KV: usage at step count s = _kv_const + n x s + _kv_prefill, n = the decoding
        # sequences that hold KV (not leaving: cancelled ones freed theirs)
        self._kv_const = 0  # sum over decoding (not leaving) of held-at-join - join step count
        self._kv_prefill = 0  # sum over prefilling of their prompt (+ tokens before preemption)
        self._kv_need = 0  # sum over live requests of prompt + completion (the most they hold)
        #: slots x the largest request ever submitted fit K: usage can never exceed K
        self._kv_roomy = True
        self._base: list[int] = []  # KV held when it gets a slot: prompt + tokens produced
        self._left: list[int] = []  # tokens still to produce when it (re)joins
        self._kvj: list[int] = []  # its base - the step count at its last join
        self._order: list[int] = []  # admission order of the last admission (newest: largest)
        self._admissions = 0
        self._preemptions = 0
        self._t = -math.inf  # the state is that of this time (the last event or advance)

    # -- observation -----------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Every event at or before this time has been applied."""
        return self._now

    @property
    def decoding(self) -> int:
        return len(self._decoding)

    @property
    def prefilling(self) -> int:
        return len(self._prefilling)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests holding a slot: prefilling or decoding (vLLM's running requests)."""
        return self._held

    @property
    def kv_tokens(self) -> int:
        """KV tokens held at :attr:`now` (the decode steps since the last event count)."""
        steps = self._steps + self._steps_done(self._t)
        n = len(self._decoding) - len(self._leaving)
        return self._kv_const + n * steps + self._kv_prefill

    @property
    def kv_capacity(self) -> int:
        return self._kv_cap

    @property
    def preemptions(self) -> int:
        """Requests preempted so far (cumulative; one request may count several times)."""
        return self._preemptions

    @property
    def busy(self) -> bool:
        """True while any submitted request has not finished."""
        return bool(self._decoding or self._prefilling or self._waiting)

    def produced(self, requests: Sequence[int]) -> list[int]:
        """Tokens each of ``requests`` has produced by :attr:`now` (decode steps ended since
        it joined, plus those before a preemption; 0 while it waits or first prefills)."""
        decoding = {r for _, r in self._decoding}.difference(self._leaving)
        steps = self._steps + self._steps_done(self._t)
        tokens, left, base, kvj = self._tokens, self._left, self._base, self._kvj
        return [tokens[r] - left[r] + (steps - (base[r] - kvj[r]) if r in decoding else 0)
                for r in requests]  # base - kvj: the step count at its join

    def stats(self) -> dict[str, float | int]:
        """A snapshot: requests submitted, finished, decoding, prefilling, waiting; steps run."""
        live = len(self._decoding) - len(self._leaving) + len(self._prefilling) + len(
            self._waiting
        )
        finished = len(self._arrival) - live - self._cancelled
        return {
            "submitted": len(self._arrival), "finished": finished, "cancelled": self._cancelled,
            "decoding": len(self._decoding), "prefilling": len(self._prefilling),
            "waiting": len(self._waiting), "slots": self._cap, "decode_steps": self._steps,
            "now": self._now,
        }

    def next_event_time(self) -> float | None:
        """When the next grant, join or finish happens given what was submitted (None: idle).

        A later submission can move it (more sequences make steps longer), so an
        engine sleeps until this time *or* the next arrival, whichever is first.
        """
        event = self._next_event()
        return None if event is None else event[0]

    def finish_bound(self, rest: Mapping[int, float] | None = None) -> float | None:
        """A lower bound on when the next request ends, given what was submitted and that
        nothing is cancelled meanwhile (None: nothing is prefilling or decoding).

        ``rest[rid]``: the least time a request still needs after it finishes here (a
        later turn of a multi-turn rollout; 0 when absent): the bound is then on the end
        of the whole rollout. Joins and new arrivals only add sequences, which only
        lengthen steps, so the decoding set's finishes at today's step times (shorter as
        members finish) are lower bounds, and exactly the times :meth:`advance` will
        report when nobody joins before them; a prefilling request finishes no earlier
        than ``ready + L x (t0 + t1)``. While a cancelled sequence is still leaving
        (steps are about to get shorter) or a free slot waits for a future arrival, the
        bound is the next event.
        """
        if (self._purge_steps >= 0 or (self._waiting and self._held < self._cap)
                or not self._kv_free()):  # a preemption may shorten steps
            return self.next_event_time()
        bound = math.inf
        t0, t1, decoding = self._t0, self._t1, self._decoding
        if decoding and rest is None:  # every request ends with this finish
            bound = self._boundary + (decoding[0][0] - self._steps) * (t0 + t1 * len(decoding))
        elif decoding and rest is not None:
            heap = decoding.copy()
            b, s, n = self._boundary, self._steps, len(heap)
            while heap:
                steps = heap[0][0]
                t = b + (steps - s) * (t0 + t1 * n)  # the batcher's own arithmetic
                if t >= bound:
                    break
                while heap and heap[0][0] == steps:
                    _, rid = heapq.heappop(heap)
                    n -= 1
                    more = rest.get(rid, 0.0)
                    end = t if more == 0.0 else (t + more) * _BELOW
                    if end < bound:
                        bound = end
                b, s = t, steps
        if self._prefilling:
            per_token = t0 + t1
            tokens = self._tokens
            for ready, rid in self._prefilling:
                more = 0.0 if rest is None else rest.get(rid, 0.0)
                end = (ready + tokens[rid] * per_token + more) * _BELOW  # rounding: stay below
                if end < bound:
                    bound = end
        return None if bound == math.inf else bound

    # -- the next event (reads only) -------------------------------------------------------

    def _next_event(self) -> tuple[float, int] | None:
        """:meth:`_compute_next_event`, cached until the state changes."""
        if self._dirty:
            self._event = self._compute_next_event()
            self._dirty = False
        return self._event

    def _compute_next_event(self) -> tuple[float, int] | None:
        """``(time, steps)``: a step boundary after ``steps`` steps (0: decoder starts), or a
        slot grant (``steps = -1``). At equal times the boundary comes first."""
        event: tuple[float, int] | None = None
        if self._decoding:
            d = self._t0 + self._t1 * len(self._decoding)
            steps = self._decoding[0][0] - self._steps
            if self._purge_steps >= 0:
                steps = min(steps, self._purge_steps - self._steps)
            if self._prefilling:
                steps = min(steps, self._steps_until(self._prefilling[0][0], d))
            if not self._kv_roomy and self._kv_need > self._kv_cap:
                n = len(self._decoding) - len(self._leaving)
                if n:  # the first step after which usage exceeds K (after now: usage <= K)
                    at_last = self._kv_const + n * self._steps + self._kv_prefill
                    steps = min(steps, (self._kv_cap - at_last) // n + 1)
            event = (self._boundary + steps * d, steps)
        elif self._prefilling:
            event = (self._prefilling[0][0], 0)
        if (self._waiting and self._held < self._cap
                and (self._kv_roomy or self._fits(self._waiting[0]))):
            arrival = self._arrival[self._waiting[0]]
            if event is None or arrival < event[0]:
                event = (arrival, -1)
        return event

    def _steps_until(self, ready: float, d: float) -> int:
        """The fewest steps ``j >= 1`` with ``last boundary + j x d >= ready``."""
        j = max(1, math.ceil((ready - self._boundary) / d))
        while j > 1 and self._boundary + (j - 1) * d >= ready:
            j -= 1
        while self._boundary + j * d < ready:
            j += 1
        return j

    def _steps_done(self, t: float) -> int:
        """Decode steps ended in ``(last boundary, t]`` (no event comes between them)."""
        if not self._decoding or t <= self._boundary:
            return 0
        b, d = self._boundary, self._t0 + self._t1 * len(self._decoding)
        j = int((t - b) / d)
        while b + (j + 1) * d <= t:
            j += 1
        while j > 0 and b + j * d > t:
            j -= 1
        return j

    def _kv_free(self) -> bool:
        """Usage cannot exceed K whatever happens to what was submitted (the usual case:
        then no admission waits for KV and nothing is preempted)."""
        return self._kv_roomy or self._kv_need <= self._kv_cap

    def _fits(self, rid: int) -> bool:
        if self._kv_roomy or self._kv_need <= self._kv_cap:
            return True
        return self.kv_tokens + self._base[rid] <= self._kv_cap

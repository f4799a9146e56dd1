"""An exact, event-skipping simulation of one continuous-batching inference server.

The server (a :class:`~freshroll.sim.profiles.ServerModel`) has ``C =
max_concurrent`` slots. A request holds a slot from its **start** until it
finishes; requests that find no free slot wait in arrival order (FIFO)::

    start        = max(arrival, the time a slot frees)          (slots free at step ends)
    ready        = start + prefill_s_per_token x prompt_tokens   (prefill: charged to the
                                                                  request alone, not the batch)
    decode_start = the first decode-step boundary at or after ready
                   (or ready itself when no sequence is decoding: a step begins then)
    step time    = t0 + t1 x n        n = sequences decoding in that step
    finish       = the end of the step that produces its L-th token

Each decode step advances every decoding sequence by one token; a sequence that
has produced its ``L`` tokens finishes at the end of that step and frees its
slot at once, and waiting requests take free slots at that instant (arrival
order). Sequences whose prefill ends mid-step join at the next step. With
``t1 = 0`` and ``C >= n`` (no queueing, no interaction), every request has
``start = arrival`` and ``finish - decode_start = L x t0`` exactly, and
``finish - start = prefill + L x t0 + w`` with ``0 <= w < t0`` the wait for
the next step boundary (``w = 0`` when it finds the decoder idle).

Speed: between two events (a finish, a join, a slot grant) the decoding set and
so the step time do not change, so the simulation jumps over all the steps in
between at once. Sequences are kept in a heap keyed by the global step count at
which they finish; an event costs O(log n). Nothing reads a clock.

KV cache (``K = kv_capacity_tokens``): a request holding a slot holds KV tokens, its
prompt while it prefills and ``prompt + tokens produced`` while it decodes, so the
decoding set's usage grows by one token per sequence per step::

    admission   the head of the queue takes a free slot only if usage + its prompt <= K
                (FIFO: a head that does not fit blocks the queue until KV frees)
    preemption  after a step boundary's finishes, while usage > K, the newest request
                holding a slot (the last one admitted) is preempted: it frees its slot
                and KV, goes back to the head of the queue, and when admitted again is
                recomputed: it prefills prompt + the tokens it had produced, then decodes
                the rest (vLLM's recompute preemption)

A request whose prompt + completion exceeds ``K`` could never run and is refused at
submit. While the tokens every submitted request will ever hold add up to at most
``K`` (the default capacity is far above any profile's), nothing is ever refused
admission or preempted and every timeline is exactly the one without a KV model.

Cancelling (a group deadline): :meth:`ContinuousBatcher.cancel` withdraws a
request; a waiting one leaves the queue, a prefilling or decoding one frees its
slot at once (waiting requests take it at that instant), and a decoding one
leaves the decode batch at the next step boundary (the step under way was
computed with it). A cancelled request is never reported finished.

Driving it from a clock (the simulated engine): :meth:`ContinuousBatcher.submit`
a request when it arrives at ``clock.now()``, sleep until
:meth:`~ContinuousBatcher.next_event_time` (or until another request arrives,
whichever is first), then :meth:`~ContinuousBatcher.advance` to ``clock.now()``
and hand out the :class:`Finished` records it returns. On a
:class:`~freshroll.clock.VirtualClock` the sleeps are jumps, so the engine's
timings are exactly the ones :func:`~freshroll.sim.timelines.simulate_batch` computes for
the same arrivals (:mod:`freshroll.sim.timelines`: the batcher driven over known arrivals).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from freshroll.sim.profiles import ServerModel

#: a bound computed another way than the batcher's own arithmetic is scaled by this, so that
#: rounding never puts it above the time it bounds
_BELOW = 1.0 - 1e-12


class Finished(NamedTuple):
    """One finished request and its timeline (seconds); a NamedTuple, cheap to make."""

    request: int  # the id :meth:`ContinuousBatcher.submit` returned
    arrival: float
    start: float  # got a slot; prefill begins
    decode_start: float  # joined the decode batch
    finish: float
    tokens: int


class ContinuousBatcher:
    """One server's batch, advanced event by event. Requests are submitted in arrival order."""

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

    # -- commands --------------------------------------------------------------------------

    def submit(self, arrival: float, prompt_tokens: int, completion_tokens: int) -> int:
        """Queue a request arriving at ``arrival`` (not before :attr:`now` or the last arrival)."""
        if not math.isfinite(arrival) or arrival < self._now or arrival < self._last_arrival:
            raise ValueError(
                f"arrival {arrival} is before the simulated time {self._now} or the previous "
                f"arrival {self._last_arrival}: submit requests in arrival order"
            )
        if prompt_tokens < 0 or completion_tokens < 1:
            raise ValueError(f"need prompt_tokens >= 0 and completion_tokens >= 1, "
                             f"got {prompt_tokens}, {completion_tokens}")
        if prompt_tokens + completion_tokens > self._kv_cap:
            raise ValueError(f"a request of {prompt_tokens} + {completion_tokens} tokens can "
                             f"never fit the KV capacity of {self._kv_cap} tokens")
        rid = len(self._arrival)
        self._arrival.append(float(arrival))
        self._prompt.append(int(prompt_tokens))
        self._tokens.append(int(completion_tokens))
        self._start.append(math.nan)
        self._decode_start.append(math.nan)
        self._base.append(int(prompt_tokens))
        self._left.append(int(completion_tokens))
        self._kvj.append(0)
        self._order.append(0)
        self._kv_need += prompt_tokens + completion_tokens
        if self._kv_roomy and self._cap * (prompt_tokens + completion_tokens) > self._kv_cap:
            self._kv_roomy = False
        self._last_arrival = arrival
        self._dirty = True
        if (arrival == self._now and not self._waiting and self._held < self._cap
                and self._fits(rid)):
            # every event up to now is applied and a slot is free: the grant is due now
            # and comes first (what advance would do, without the event round trip)
            self._take_slot(rid, arrival)
        else:
            self._waiting.append(rid)
        return rid

    def cancel(self, request: int, at: float) -> bool:
        """Withdraw ``request`` at time ``at`` (not before :attr:`now`); it is never reported.

        A waiting request leaves the queue; a prefilling one frees its slot; a decoding
        one frees its slot at once and leaves the decode batch at the next step boundary
        (the step under way was computed with it, so its time does not change). Waiting
        requests take the freed slot at ``at``. False: it had already finished or been
        cancelled (nothing changes).
        """
        if not math.isfinite(at) or at < self._now:
            raise ValueError(f"cancel at {at} is before the simulated time {self._now}")
        if not 0 <= request < len(self._arrival):
            raise ValueError(f"unknown request {request}")
        self.advance(at)
        if request in self._leaving:
            return False
        self._dirty = True
        if request in self._waiting:
            self._waiting.remove(request)
        elif any(rid == request for _, rid in self._prefilling):
            self._prefilling = [e for e in self._prefilling if e[1] != request]
            heapq.heapify(self._prefilling)
            self._held -= 1
            self._kv_prefill -= self._base[request]
        elif any(rid == request for _, rid in self._decoding):
            self._held -= 1
            self._kv_const -= self._kvj[request]
            if self._boundary >= at:  # cancelled at a step boundary: no step under way
                self._decoding = [e for e in self._decoding if e[1] != request]
                heapq.heapify(self._decoding)
            else:
                self._leaving.add(request)
                d = self._t0 + self._t1 * len(self._decoding)
                self._purge_steps = self._steps + self._steps_until(at, d)
        else:
            return False
        self._cancelled += 1
        self._kv_need -= self._prompt[request] + self._tokens[request]
        self._grant_due(at)
        return True

    def advance(self, until: float) -> list[Finished]:
        """Apply every event at or before ``until``; return the requests that finished."""
        done: list[Finished] = []
        while (event := self._next_event()) is not None and event[0] <= until:
            t, steps = event
            self._dirty = True
            self._t = t
            if steps < 0:
                self._grant(t)
            else:
                self._step_boundary(t, steps, done)
        self._now = self._t = max(self._now, until)
        return done

    def advance_one(self, until: float) -> list[Finished] | None:
        """Apply the next event if it is at or before ``until``; return who finished then
        (often nobody), or None when no event is due (then :attr:`now` is ``until``).

        A driver that must react between events (a finished turn's tool call may return
        before the next event) calls this in a loop instead of :meth:`advance`.
        """
        event = self._next_event()
        if event is None or event[0] > until:
            self._now = self._t = max(self._now, until)
            return None
        t, steps = event
        done: list[Finished] = []
        self._dirty = True
        self._t = t
        if steps < 0:
            self._grant(t)
        else:
            self._step_boundary(t, steps, done)
        self._now = self._t = max(self._now, t)
        return done

    # -- the event loop --------------------------------------------------------------------

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

    def _step_boundary(self, t: float, steps: int, done: list[Finished]) -> None:
        self._steps += steps
        self._boundary = t
        decoding, steps_now = self._decoding, self._steps
        while decoding and decoding[0][0] <= steps_now:
            _, rid = heapq.heappop(decoding)
            if rid in self._leaving:  # cancelled: its slot was freed then
                self._leaving.discard(rid)
                continue
            self._held -= 1
            self._kv_const -= self._kvj[rid]
            self._kv_need -= self._prompt[rid] + self._tokens[rid]
            done.append(Finished(
                rid, self._arrival[rid], self._start[rid], self._decode_start[rid], t,
                self._tokens[rid],
            ))
        if 0 <= self._purge_steps <= steps_now:
            if self._leaving:
                self._decoding = [e for e in decoding if e[1] not in self._leaving]
                heapq.heapify(self._decoding)
                self._leaving.clear()
            self._purge_steps = -1
        if not self._kv_roomy and self._kv_need > self._kv_cap and self.kv_tokens > self._kv_cap:
            self._preempt()
        waiting = self._waiting
        if waiting and self._held < self._cap and self._arrival[waiting[0]] <= t:
            self._grant_due(t)
        prefilling = self._prefilling
        while prefilling and prefilling[0][0] <= t:
            _, rid = heapq.heappop(prefilling)
            self._kv_prefill -= self._base[rid]
            self._join(rid, t)

    def _grant(self, t: float) -> None:
        rid = self._waiting[0]
        if self._kv_roomy or self._fits(rid):  # it fitted when the event was computed; usage
            self._take_slot(self._waiting.popleft(), t)  # may have grown since

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

    def _grant_due(self, t: float) -> None:
        """Free slots to the queue's head while it has arrived and its KV fits (FIFO)."""
        waiting = self._waiting
        while (waiting and self._held < self._cap and self._arrival[waiting[0]] <= t
               and self._fits(waiting[0])):
            self._take_slot(waiting.popleft(), t)

    def _kv_free(self) -> bool:
        """Usage cannot exceed K whatever happens to what was submitted (the usual case:
        then no admission waits for KV and nothing is preempted)."""
        return self._kv_roomy or self._kv_need <= self._kv_cap

    def _fits(self, rid: int) -> bool:
        if self._kv_roomy or self._kv_need <= self._kv_cap:
            return True
        return self.kv_tokens + self._base[rid] <= self._kv_cap

    def _take_slot(self, rid: int, t: float) -> None:
        self._held += 1
        if not self._order[rid]:  # a recomputed request keeps its first start
            self._start[rid] = t
        self._admissions += 1
        self._order[rid] = self._admissions
        held = self._base[rid]
        ready = t + self._prefill_s * held
        if self._decoding and ready <= self._boundary:  # at a boundary, no prefill: this step
            self._join(rid, self._boundary)
        else:
            self._kv_prefill += held
            heapq.heappush(self._prefilling, (ready, rid))

    def _join(self, rid: int, t: float) -> None:
        steps, left = self._steps, self._left[rid]
        if left == self._tokens[rid]:  # the first join (not after a preemption)
            self._decode_start[rid] = t
        self._kvj[rid] = kvj = self._base[rid] - steps
        self._kv_const += kvj
        heapq.heappush(self._decoding, (steps + left, rid))

    def _preempt(self) -> None:
        """While usage exceeds K, preempt the newest request holding a slot (module doc)."""
        leaving, order = self._leaving, self._order
        while self.kv_tokens > self._kv_cap:
            decoding = [(order[rid], rid) for _, rid in self._decoding if rid not in leaving]
            prefilling = [(order[rid], rid) for _, rid in self._prefilling]
            _, rid = max(decoding + prefilling)
            held = self._base[rid]
            if any(r == rid for _, r in self._prefilling):
                self._prefilling = [e for e in self._prefilling if e[1] != rid]
                heapq.heapify(self._prefilling)
                self._kv_prefill -= held
            else:
                self._decoding = [e for e in self._decoding if e[1] != rid]
                heapq.heapify(self._decoding)
                self._kv_const -= self._kvj[rid]
                produced = self._steps - (held - self._kvj[rid])  # since its last join
                self._base[rid] += produced
                self._left[rid] -= produced
            self._held -= 1
            self._preemptions += 1
            self._waiting.appendleft(rid)

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
from typing import NamedTuple

from freshroll.sim.batch_state import BatchState


class Finished(NamedTuple):
    """One finished request and its timeline (seconds); a NamedTuple, cheap to make."""

    request: int  # the id :meth:`ContinuousBatcher.submit` returned
    arrival: float
    start: float  # got a slot; prefill begins
    decode_start: float  # joined the decode batch
    finish: float
    tokens: int


class ContinuousBatcher(BatchState):
    """One server's batch, advanced event by event. Requests are submitted in arrival order.

    Its state and every read of it (observation, the next event, finish bounds) are
    :class:`~freshroll.sim.batch_state.BatchState`'s; here are the commands and the event
    handlers, every change of state."""

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

    # -- the event handlers ----------------------------------------------------------------

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

    def _grant_due(self, t: float) -> None:
        """Free slots to the queue's head while it has arrived and its KV fits (FIFO)."""
        waiting = self._waiting
        while (waiting and self._held < self._cap and self._arrival[waiting[0]] <= t
               and self._fits(waiting[0])):
            self._take_slot(waiting.popleft(), t)

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

"""The simulated inference engine: one continuous-batching server on the run's event loop.

A :class:`SimEngine` is an :class:`~freshroll.engines.seams.AsyncEngine`
(``continuous = True``) that generates no tokens: it computes when each request
would finish on one server of the profile (:class:`~freshroll.sim.batching.ContinuousBatcher`)
and emits a :class:`~freshroll.engines.base.Completion` with ``n_tokens = L`` at
that time. Model seconds become loop seconds times ``time_scale``.

How a request goes through it::

    generate(requests)   each request is submitted to the batcher at the loop's now;
                         its shape (prompt tokens, L, turns, tool latencies) comes
                         from sim.keyed (run seed + group / sample id + policy step)
    driver               one wakeup per engine, set to the next time a request may
                         end: max(the next event, a lower bound on the next end of a
                         whole rollout); a submission or a cancel re-arms it. When it
                         fires, every event up to then (finishes, joins, earlier turns,
                         tool returns) is applied in time order (exactly
                         simulate_rollouts' order) and finished requests are emitted
    multi-turn (P3)      a finished turn that is not the last releases its slot; the
                         tool call runs its latency (a hung call: tools.timeout_s),
                         then the next turn is submitted with the tool's output tokens
                         as its prefill
    emit                 Completion((), (), (), sample id, "length" at the cap else "stop",
                         gen_s = (finish - arrival) x time_scale, n_tokens = L,
                         version_spans: the tokens made under each weight load)
    load_weights         sleep transfer_s, then swap (``rollout.on_update``): unset, swap
                         under the running requests at no cost (the model before the
                         setting); continue, swap and every decoding sequence re-prefills
                         (cancelled and resubmitted with its prefill + the tokens it made as
                         prompt: a recompute, behind requests already waiting); finish, wait
                         until no request is open first; abort, cancel every open request
                         (its call raises Superseded: re-issued) and swap

The driver is a loop timer, not a task that sleeps: every engine of a loop sets
its next wakeup in one shared heap, served by one ``loop.call_at`` timer. On a
:class:`~freshroll.clock.VirtualClock` the loop jumps to it exactly as to an
``asyncio.sleep``, and an event costs a callback instead of a task switch.

Why the engine need not wake for every event: joins, earlier turns and tool
returns change nothing outside the engine, and sequences that join only lengthen
steps, so the decoding set's finishes at today's step times are lower bounds
(:meth:`~freshroll.sim.batching.ContinuousBatcher.finish_bound`, each turn plus
the least its later turns and tool calls can take). The engine wakes at the
larger of that bound and the next event, applies everything due, emits what
ended, and sets the next wakeup; a generate or cancel first applies everything
up to its own time. Emissions are therefore exactly on time (tested: a caller
that submits when a group ends sees its next group arrive at that very time),
with about one wakeup per emitted request (P3: 1.75 instead of 9).
When the tokens the open requests may hold (each its largest turn) add up to more
than the server's KV capacity (and slots x the largest such turn too), a preemption
could shorten the steps of the others, so the bound no longer holds: the engine then
wakes at every event (still exact).

:meth:`~SimEngine.stats` is the :class:`~freshroll.engines.seams.ReportsStats` view of
the server, as of the last wakeup or call (the batcher's state then)::

    running         requests holding a slot (prefilling or decoding)
    waiting         requests queued in the engine: beyond the slot cap, or held back
                    because their KV does not fit, or preempted and not yet readmitted
    kv_cache_usage  KV tokens held / server.kv_capacity_tokens
    preemptions     cumulative requests preempted (KV over capacity, recomputed)

:meth:`~SimEngine.counters` has the engine's own counts (open, in tool calls, emitted,
cancelled) and the batcher's snapshot.

Guarantees: on a virtual clock with ``time_scale = 1`` the timelines are exactly
:func:`~freshroll.sim.timelines.simulate_batch`'s (single-turn) or
:func:`~freshroll.sim.timelines.simulate_rollouts`' (multi-turn) for the same
arrivals; every request of a call is emitted once or cancelled, never both;
``generate``'s ``seed`` is not used (draws are keyed by the run seed and ids, so
they do not depend on which call carried a request); an exception raised by
``emit`` fails the call it belongs to (``generate`` raises it) and the engine
goes on; :meth:`close` fails every call still open with
:class:`~freshroll.errors.WorkerLost`. ``Completion.text`` carries the sample id,
which the simulated scorer keys its reward on.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from freshroll.engines.base import FINISH_LENGTH, FINISH_STOP, Completion
from freshroll.engines.seams import Emit, EngineStats, GenRequest, SamplingParams
from freshroll.engines.weights import Weights
from freshroll.errors import Superseded, WorkerLost
from freshroll.sim.batch_state import _BELOW
from freshroll.sim.batching import ContinuousBatcher, Finished
from freshroll.sim.keyed import KeyedDraws
from freshroll.sim.wakeups import Wakeups, wakeups


@dataclass(slots=True)
class _Call:
    """One ``generate`` call: its callback and how many of its requests are still open."""

    emit: Emit
    open: int
    done: asyncio.Future[None]


@dataclass(slots=True, eq=False)
class _Job:
    """One request in the engine (all its turns)."""

    call: _Call
    index: int  # in the call's requests
    sample: str
    arrival: float  # model seconds, first turn
    length: int
    capped: bool
    segments: tuple[int, ...]
    tool_s: tuple[float, ...]
    peak: int  # the most KV tokens one of its turns holds (prefill + completion)
    turn: int = 0
    rid: int = -1  # the batcher's id of its current turn; -1: in a tool call
    cancelled: bool = False
    start: float = math.nan  # its first turn got a slot (model seconds)
    prompt: int = 0  # its first turn's prompt tokens
    pre: int = 0  # tokens of its current turn made before a re-prefill resubmitted it
    counted: int = 0  # tokens already in spans
    spans: list[tuple[int, int]] | None = None  # (load ordinal, tokens) closed by swaps


class SimEngine:
    """One simulated inference worker (see the module docstring)."""

    continuous = True

    def __init__(
        self, name: str, draws: KeyedDraws, *, time_scale: float = 1.0, transfer_s: float = 0.0,
        on_update: str | None = None,
    ) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.name = name
        self.draws = draws
        self.loaded: Weights | None = None  # the last weights token loaded
        self.on_update = on_update
        self._ordinal = 0  # weight loads swapped in so far (Completion.version_spans)
        self._drained: list[asyncio.Future[None]] = []  # finish: loads waiting for no request
        self._scale = time_scale
        self._transfer_s = transfer_s
        self._output_tokens = draws.profile.tools.output_tokens
        self._single_turn = draws.profile.tools.turns == 1
        self._batcher = ContinuousBatcher(draws.profile.server)
        self._kv_cap = draws.profile.server.kv_capacity_tokens
        self._kv_peak = 0  # sum over open requests of their peak (<= capacity: no preemption)
        self._slots = draws.profile.server.max_concurrent
        self._kv_roomy = True  # slots x the largest peak seen fit: no preemption ever
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeups: Wakeups | None = None
        self._wake_seq = -1  # the live entry in the loop's wakeups (-1: none)
        self._timer_at = math.inf  # model time the wakeup is set for
        self._jobs: dict[str, _Job] = {}  # open requests by sample id
        self._running: dict[int, _Job] = {}  # batcher request id -> job
        self._tools: list[tuple[float, int, _Job]] = []  # heap: (tool returns at, seq, job)
        self._rest_of: dict[int, float] = {}  # batcher id of a turn but the last -> least after
        #: heap: (lower bound on the job's last finish, seq, job, turn after the tool call)
        self._tool_bounds: list[tuple[float, int, _Job, int]] = []
        self._seq = 0
        self._closed = False
        self._emitted = 0
        self._cancelled = 0
        #: per-sample timeline of the last emitted requests, for tests: sample ->
        #: (arrival, first start, finish) in model seconds (None: not recorded)
        self.timeline: dict[str, tuple[float, float, float]] | None = None

    # -- the seam --------------------------------------------------------------------------

    async def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams, seed: int, emit: Emit,
    ) -> None:
        """Submit every request now; return when each was emitted or cancelled."""
        if self._closed:
            raise WorkerLost(f"simulated engine {self.name} is closed")
        if not requests:
            return
        seen = {r.sample for r in requests}
        clash = [r.sample for r in requests if r.sample in self._jobs]
        if clash or len(seen) != len(requests):
            raise ValueError(f"{self.name}: sample(s) already in generation: {clash or requests}")
        loop = self._bind()
        draws, out = self.draws, self._output_tokens
        shapes = [draws.shape(r.group, r.sample, r.policy_step) for r in requests]
        peaks = [max([sh.prompt_tokens + sh.segments[0], *(out + n for n in sh.segments[1:])])
                 for sh in shapes]
        most = max(peaks)
        if most > self._kv_cap:
            raise ValueError(f"{self.name}: a request needs {most} KV tokens, more than "
                             f"the server's kv_capacity_tokens {self._kv_cap}")
        if self._slots * most > self._kv_cap:
            self._kv_roomy = False
        call = _Call(emit, len(requests), loop.create_future())
        now = self._advance_to_now()
        for i, (r, shape, peak) in enumerate(zip(requests, shapes, peaks, strict=True)):
            job = _Job(call, i, r.sample, now, shape.length, shape.capped, shape.segments,
                       shape.tool_s, peak, prompt=shape.prompt_tokens)
            self._jobs[r.sample] = job
            self._kv_peak += peak
            self._submit(job, now, shape.prompt_tokens)
        self._run_until(now)  # slot grants at this instant, without a timer round trip
        self._rearm()
        await call.done

    async def load_weights(self, weights: Weights) -> float:
        """Sleep ``transfer_s`` (x time_scale; generation goes on meanwhile), then swap as
        ``on_update`` says (module docstring); the seconds from the call to the swap."""
        if self._closed:
            raise WorkerLost(f"simulated engine {self.name} is closed")
        loop = self._bind()
        t0 = loop.time()
        if self.on_update == "finish" and self._jobs:
            done = loop.create_future()
            self._drained.append(done)
            await done
        await asyncio.sleep(self._transfer_s * self._scale)
        if self._closed:
            raise WorkerLost(f"simulated engine {self.name} is closed")
        self._swap()
        self.loaded = weights
        return loop.time() - t0

    def _swap(self) -> None:
        """The new weights are in: each open request's tokens so far close a span of the old
        ordinal; with continue its KV is recomputed, with abort it ends (Superseded)."""
        now = self._advance_to_now()
        old, self._ordinal = self._ordinal, self._ordinal + 1
        if self.on_update == "abort" and self._jobs:
            jobs = list(self._jobs.values())
            self._cancel_jobs([j.sample for j in jobs], now, count=False)
            for call in {id(j.call): j.call for j in jobs}.values():
                if not call.done.done():
                    call.done.set_exception(Superseded(f"{self.name}: new weights"))
            return
        jobs = list(self._jobs.values())
        running = [j.rid for j in jobs if j.rid >= 0]
        in_turn = dict(zip(running, self._batcher.produced(running), strict=True))
        for job in jobs:
            done_turns = sum(job.segments[:job.turn])
            turn_made = job.pre + in_turn[job.rid] if job.rid >= 0 else 0
            made = done_turns + turn_made
            if made > job.counted:
                job.spans = [*(job.spans or ()), (old, made - job.counted)]
                job.counted = made
            if self.on_update == "continue" and job.rid >= 0 and turn_made > 0:
                del self._running[job.rid]  # its KV was made by the old weights: recomputed
                self._rest_of.pop(job.rid, None)
                self._batcher.cancel(job.rid, now)
                job.pre = turn_made
                prompt = job.prompt if job.turn == 0 else self._output_tokens
                self._submit(job, now, prompt + turn_made)
        self._run_until(now)
        self._rearm()

    async def cancel(self, samples: Sequence[str]) -> None:
        """Withdraw these samples now (their slots free at once); they are never emitted."""
        if self._closed or not samples:
            return
        self._bind()
        self._cancel_jobs(samples, self._advance_to_now(), count=True)

    def _cancel_jobs(self, samples: Sequence[str], now: float, *, count: bool) -> None:
        for sample in samples:
            job = self._jobs.pop(sample, None)
            if job is None:
                continue
            job.cancelled = True
            self._kv_peak -= job.peak
            if job.rid >= 0:
                del self._running[job.rid]
                self._rest_of.pop(job.rid, None)
                self._batcher.cancel(job.rid, now)
            self._cancelled += 1
            if count:
                self._close_one(job.call)
        self._run_until(now)
        self._rearm()
        self._check_drained()

    def _check_drained(self) -> None:
        if not self._jobs:
            for done in self._drained:
                if not done.done():
                    done.set_result(None)
            self._drained.clear()

    async def close(self) -> None:
        """Stop the driver; every open call raises WorkerLost. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake_seq = -1
        calls = {id(j.call): j.call for j in self._jobs.values()}
        self._jobs.clear()
        self._kv_peak = 0
        self._running.clear()
        self._tools.clear()
        self._tool_bounds.clear()
        self._rest_of.clear()
        for call in calls.values():
            if not call.done.done():
                call.done.set_exception(WorkerLost(f"simulated engine {self.name} closed"))
        self._check_drained()

    # -- observation -----------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """Running, waiting, KV usage, cumulative preemptions (module docstring)."""
        b = self._batcher
        return EngineStats(running=b.running, waiting=b.waiting,
                           kv_cache_usage=b.kv_tokens / b.kv_capacity, preemptions=b.preemptions)

    def counters(self) -> dict[str, Any]:
        """Open requests, in tool calls, emitted, cancelled, and the batcher's snapshot."""
        return {
            "open": len(self._jobs), "in_tool": len(self._jobs) - len(self._running),
            "emitted": self._emitted, "cancelled": self._cancelled,
            "server": self._batcher.stats(),
        }

    # -- the driver ------------------------------------------------------------------------

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._wakeups = wakeups(loop)
        elif loop is not self._loop:
            raise RuntimeError(f"{self.name}: used from two event loops")
        return loop

    def _model_now(self) -> float:
        assert self._loop is not None
        t = self._loop.time()
        return t if self._scale == 1.0 else t / self._scale

    def _advance_to_now(self) -> float:
        """Apply every event up to the loop's now; the time to submit or cancel at."""
        now = max(self._model_now(), self._batcher.now)
        self._run_until(now)
        return self._batcher.now

    def _submit(self, job: _Job, at: float, prefill: int) -> None:
        job.rid = rid = self._batcher.submit(at, prefill, job.segments[job.turn] - job.pre)
        self._running[rid] = job
        if job.turn + 1 < len(job.segments):  # not the last turn: what it still needs after
            self._rest_of[rid] = job.tool_s[job.turn] + self._least_from(job, job.turn + 1)

    def _run_until(self, t: float) -> None:
        """Apply batcher events and tool returns at or before ``t``, in time order (a batcher
        event first at equal times, as :func:`~freshroll.sim.timelines.simulate_rollouts`)."""
        batcher, tools = self._batcher, self._tools
        if self._single_turn:  # no tool call can come between two events: all at once
            for f in batcher.advance(t):
                self._finished(f)
            return
        while True:
            ts = tools[0][0] if tools else math.inf
            done = batcher.advance_one(min(t, ts))
            if done is not None:
                for f in done:
                    self._finished(f)
                continue
            if ts > t:
                return
            _, _, job = heapq.heappop(tools)
            if not job.cancelled:
                self._submit(job, ts, self._output_tokens)

    def _rearm(self) -> None:
        """Set the wakeup to the next time a request may be emitted (no-op if already there).

        That is ``max(the next event, a lower bound on the next final finish)``: joins,
        tool returns and earlier turns change nothing outside the engine, so they are
        applied when the engine next wakes (or at the next generate / cancel), in time
        order, exactly as if it had woken for each. The bound is the batcher's
        (:meth:`~ContinuousBatcher.finish_bound`) or, for a request in a tool call, the
        tool's return plus the least its remaining turns can take.
        """
        te = self._batcher.next_event_time()
        t = math.inf if te is None else te
        tools = self._tools
        if tools and tools[0][0] < t:
            t = tools[0][0]
        if t < math.inf and (self._kv_roomy or self._kv_peak <= self._kv_cap):  # else a
            # preemption may come first
            fb = self._batcher.finish_bound(None if self._single_turn else self._rest_of)
            bound = math.inf if fb is None else fb
            pending = self._tool_bounds
            while pending and (pending[0][2].rid != -1 or pending[0][2].turn != pending[0][3]
                               or pending[0][2].cancelled):
                heapq.heappop(pending)  # submitted or cancelled since
            if pending and pending[0][0] < bound:
                bound = pending[0][0]
            t = max(t, bound)  # inf: nothing can be emitted without a new call
        if t == self._timer_at:
            return
        self._timer_at = t
        if t < math.inf:
            assert self._wakeups is not None
            self._wake_seq = self._wakeups.schedule(self, t * self._scale)
        else:
            self._wake_seq = -1

    def _on_timer(self, when: float) -> None:
        """The wakeup set for ``when`` (loop time) came (the loop may be a hair early or late:
        the engine applies what is due at the later of the two)."""
        self._wake_seq = -1
        t = max(self._timer_at, self._model_now())
        self._timer_at = math.inf
        try:
            self._run_until(t)
        except Exception as exc:  # a bug in the model: fail every open call, lose nothing
            self._fail_all(exc)
            return
        self._rearm()

    def _finished(self, f: Finished) -> None:
        job = self._running.pop(f.request)
        job.rid = -1
        self._rest_of.pop(f.request, None)
        if job.turn == 0:
            job.start = f.start
        if job.turn + 1 < len(job.segments):  # a tool call, then the next turn
            back = f.finish + job.tool_s[job.turn]
            heapq.heappush(self._tools, (back, self._seq, job))
            job.turn, job.pre = job.turn + 1, 0
            heapq.heappush(self._tool_bounds, (
                (back + self._least_from(job, job.turn)) * _BELOW, self._seq, job, job.turn,
            ))
            self._seq += 1
            return
        del self._jobs[job.sample]
        self._kv_peak -= job.peak
        if self.timeline is not None:
            self.timeline[job.sample] = (job.arrival, job.start, f.finish)
        spans = () if job.spans is None else (*job.spans, (self._ordinal, job.length - job.counted))
        completion = Completion(
            (), (), (), job.sample, FINISH_LENGTH if job.capped else FINISH_STOP,
            (f.finish - job.arrival) * self._scale, job.length, tuple(spans),
        )
        self._emitted += 1
        call = job.call
        try:
            call.emit(job.index, completion)
        except Exception as exc:
            if not call.done.done():
                call.done.set_exception(exc)
        self._close_one(call)
        self._check_drained()

    def _least_from(self, job: _Job, turn: int) -> float:
        """The least time from the submission of ``turn`` to the end of the job's last turn:
        each later turn prefills the tool output, every token takes at least ``t0 + t1``,
        and the tool calls between take their latency."""
        server = self.draws.profile.server
        per_token = server.step_s + server.step_s_per_seq
        prefill = self._output_tokens * server.prefill_s_per_token
        return (len(job.segments) - turn) * prefill + sum(job.segments[turn:]) * per_token + sum(
            job.tool_s[turn:]
        )

    @staticmethod
    def _close_one(call: _Call) -> None:
        call.open -= 1
        if call.open == 0 and not call.done.done():
            call.done.set_result(None)

    def _fail_all(self, exc: Exception) -> None:
        for job in self._jobs.values():
            if not job.call.done.done():
                job.call.done.set_exception(exc)
        self._jobs.clear()
        self._kv_peak = 0
        self._running.clear()
        self._tools.clear()
        self._tool_bounds.clear()
        self._rest_of.clear()
        self._closed = True
        self._check_drained()


__all__ = ["SimEngine"]

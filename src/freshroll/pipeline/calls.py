"""A worker and its episode calls: the records, and one call run from start to end.

:class:`Worker` is one inference worker of the pool (a name; a new epoch per (re)start) with
what the steering meter measures of it; :class:`Call` is one episode call: the attempts the
pool started together on one worker epoch, under one sampling seed
(:func:`generation_seed`, recorded on each member's ``started``).

:meth:`CallRunner.generate` runs one call: the run's episode workflow drives the engine, each
completion it emits is checked (:func:`malformed`: an ``invalid`` discard, counted against the
worker's failure budget), handed to ``buf.complete`` and, if accepted, to the reward stage. A
lock-step call is timed here (``limits.generate_timeout_s``), a call in lanes (a continuous
engine's, or a turn-batching workflow's) by its worker's watchdog
(:mod:`freshroll.pipeline.lanes`). It returns the worker's failure (WorkerLost / WorkerTimeout:
the pool replaces the worker) or None; ``Superseded`` re-issues the call's unfinished attempts;
any other engine failure ends them ``generation_error``, counted against the budget, and the
run goes on. The runner gets the run's :class:`~freshroll.pipeline.context.RunContext` and the
reward stage's inbox (accepted completions go there), never the pipeline; the pool's own
bookkeeping is reached through three ports: a slot freed mid-call, requests queued again, and a
stop at target's wake-up.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from freshroll import unsafe
from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeEmit, EpisodeFailed, EpisodeWorkflow
from freshroll.engines.seams import AsyncEngine, GenRequest, SamplingParams
from freshroll.errors import Interrupted, Superseded, WorkerLost, WorkerTimeout
from freshroll.kernel.results import Outcome
from freshroll.ledger.events import DiscardReason
from freshroll.ledger.lineage import PolicyVersion, SampleId
from freshroll.rewards.tasks import Prompt

if TYPE_CHECKING:
    from freshroll.pipeline.context import RewardInbox, RunContext


@dataclass(eq=False)
class Worker:
    """One inference worker (one name; a new epoch per (re)start)."""

    name: str
    epoch: int = -1
    engine: AsyncEngine | None = None
    task: asyncio.Task[None] | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    retiring: bool = False
    fenced: bool = False  # its current epoch is fenced (stopped): nothing more to start
    inflight: int = 0  # requests of live calls not yet emitted
    calls: int = 0  # live generate calls
    live: deque[Call] | None = None  # a continuous epoch's calls (for cancel); None: lock-step
    loaded: PolicyVersion | None = None
    #: the engine's weight loads of this epoch: [k] is the version its k-th load installed
    #: ([0]: the weights it started with), what ``Completion.version_spans`` name
    loads: list[PolicyVersion | None] = field(default_factory=lambda: [None])
    failure: BaseException | None = None  # a call's WorkerLost / WorkerTimeout
    ok_units: int = 0  # successful requests not yet recorded in the failure budget
    # measured (read by the steering meter)
    ready_at: float | None = None
    done: int = 0  # completions emitted by live calls
    blocked_since: float | None = None  # waiting with free slots while admission is full
    blocked_share: float = 1.0  # the share of its slots that were free then
    blocked_s: float = 0.0  # worker-seconds blocked (each weighted by its free share)
    mark_epoch: int = -1  # the steering meter's marks at its last window (done, blocked_s)
    mark_done: int = 0
    mark_blocked: float = 0.0


@dataclass(eq=False)
class Call:
    """One episode call of a worker: its attempts, in request order."""

    sids: list[SampleId]
    epoch: int
    version: PolicyVersion | None
    pending: int
    emitted: list[bool]
    over: bool = False
    task: asyncio.Task[None] | None = None
    prompts: list[Prompt] = field(default_factory=list)
    seed: int = 0  # its sampling seed (recorded on each member's ``started``)
    started: float = 0.0  # loop time: its deadline is started + limits.generate_timeout_s
    expired: bool = False  # cancelled by the watchdog: a WorkerTimeout


class CallRunner:
    """Runs the episode calls of a pool's workers (see the module doc)."""

    def __init__(self, ctx: RunContext, inbox: RewardInbox, on_stopped: Callable[[], None],
                 params: SamplingParams, workflow: EpisodeWorkflow,
                 slot_freed: Callable[[Worker], None],
                 requests_queued: Callable[[], None]) -> None:
        self.ctx, self.buf, self.params, self.workflow = ctx, ctx.buf, params, workflow
        self.inbox, self._on_stopped = inbox, on_stopped
        self._rule = ctx.sample_rule()
        self._slot_freed, self._requests_queued = slot_freed, requests_queued

    async def generate(self, w: Worker, engine: AsyncEngine, call: Call) -> BaseException | None:
        """One episode call (the workflow's ``run_episode``, for ``single_turn`` one generate
        call); returns a WorkerLost/WorkerTimeout (replace the worker) or None."""
        buf, lim = self.buf, self.ctx.limits
        prompts, prompt_of = self.ctx.prompts, buf.prompt_of
        step = call.version.step if call.version is not None else 0
        reqs = []
        for sid in call.sids:
            pid = prompt_of(sid)
            prompt = prompts[pid]
            call.prompts.append(prompt)
            reqs.append(GenRequest(sid, sid.partition(".")[0], pid, prompt.text, step,
                                   row=prompt.columns))
        stage, laned = f"inference worker {w.name!r}", w.live is not None
        seed, emit, episode = call.seed, self._emitter(w, call), self.workflow.run_episode
        waiting = self.ctx.waits.begin(f"{w.name} generate", lim.generate_timeout_s)
        try:
            if laned:  # in the worker's lanes: its watchdog times the call
                await episode(engine, reqs, self.params, seed, emit)
            else:
                async with asyncio.timeout(unsafe.timeout(lim.generate_timeout_s)) as cm:
                    await episode(engine, reqs, self.params, seed, emit)
        except asyncio.CancelledError:
            if not call.expired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return self._timed_out(w)
        except TimeoutError:
            if laned or not cm.expired():
                raise
            return self._timed_out(w)
        except (WorkerLost, WorkerTimeout) as exc:
            return exc
        except Interrupted:  # the operator's stop: not a failure of this worker
            raise
        except Superseded as exc:  # aborted for a new policy version: issued again
            self._reissue(w, call, f"{exc}"[:300])
            return None
        except Exception as exc:  # engine failure: these requests end, the run goes on
            error = f"{type(exc).__name__}: {exc}"[:300]
            failed = 0
            if not w.fenced and call.epoch == w.epoch:
                for sid, done in zip(call.sids, call.emitted, strict=True):
                    if not done:
                        buf.discard(sid, "generation_error", error)
                        failed += 1
                self.ctx.notify()
            self._budget_ok(w, stage)
            self.ctx.budget.record(stage, self._rule, failed, len(call.sids), error)
            return None
        finally:
            self.ctx.waits.end(waiting)
            call.over = True
            w.inflight -= call.pending
        w.ok_units += len(call.sids)
        if w.ok_units >= 1024:
            self._budget_ok(w, stage)
        return None

    def _reissue(self, w: Worker, call: Call, detail: str) -> None:
        """The engine aborted the call's unfinished requests (``Superseded``): each live
        attempt is discarded ``fenced``, so the buffer issues its request again as a new
        attempt. Not a failure of the worker: nothing counts against its budget."""
        buf = self.buf
        if w.fenced or call.epoch != w.epoch:
            return  # the epoch's fencing already re-issued them
        for i, (sid, done) in enumerate(zip(call.sids, call.emitted, strict=True)):
            if not done and buf.request_state(sid) == "running":
                buf.discard(sid, "fenced", f"aborted by the engine: {detail}")
                call.emitted[i] = True
        self.ctx.notify()
        self._requests_queued()

    def _budget_ok(self, w: Worker, stage: str) -> None:
        """Successful calls are recorded in the budget together, before the next failure (a
        success only resets the consecutive-failure counts and fills the ratio window, so
        the budget's verdicts are the same)."""
        if w.ok_units:
            self.ctx.budget.record(stage, self._rule, 0, w.ok_units)
            w.ok_units = 0

    def _timed_out(self, w: Worker) -> WorkerTimeout:
        return WorkerTimeout(f"worker {w.name} generate did not return within "
                             f"{self.ctx.limits.generate_timeout_s:g} s")

    def _emitter(self, w: Worker, call: Call) -> EpisodeEmit:
        buf, put, worker = self.buf, self.inbox.put, (w.name, call.epoch)
        encode, complete, sids, version = pl.encode, buf.complete, call.sids, call.version
        slot_freed, stopping, prompts = self._slot_freed, self._on_stopped, call.prompts
        requests_queued = self._requests_queued

        def emit(i: int, comp: Any) -> None:
            if buf.closed:
                return
            if isinstance(comp, EpisodeFailed):  # a tool or environment failed: typed discard
                failed(i, comp.reason, f"{w.name}: {comp.detail}"[:300], f"tools {w.name}")
                return
            problem = malformed(comp)
            if problem is not None:
                failed(i, "invalid", f"malformed completion from worker {w.name}: {problem}",
                       f"inference worker {w.name!r}")
                return
            ranges, last = None, None
            if comp.version_spans and w.epoch == call.epoch:  # each token's version
                ranges = token_ranges(comp.version_spans, w.loads, version)
                last = None if ranges is None else ranges[-1][0]
            elif w.loaded is not version and w.epoch == call.epoch:  # tokens that span an
                last = str(w.loaded)  # update name the newest version too
            out = complete(sids[i], tokens=comp.tokens, gen_s=comp.gen_s,
                           payload=encode(comp, ranges) if comp.token_ids else None,
                           last_version=last, worker=worker, token_versions=ranges)
            if buf.stopped:  # a stop at target ended running attempts: cancel them
                stopping()
            if buf.refreshed:  # past the bound on arrival: re-issued, not scored
                if sids[i] in buf.refreshed:
                    out = Outcome.REJECTED
                buf.refreshed.clear()
                requests_queued()
            if not call.over and not call.emitted[i]:
                call.emitted[i] = True
                call.pending -= 1
                w.inflight -= 1
                w.done += 1
                if call.pending:  # a slot freed mid-call (at the call's end its lane refills)
                    slot_freed(w)
            if out is Outcome.ACCEPTED:
                put(sids[i], comp, prompts[i])

        def failed(i: int, reason: DiscardReason, detail: str, stage: str) -> None:
            """A malformed completion or a failed episode: a live attempt is discarded by
            ``reason``, a failure of ``stage``; a late one is dropped (the buffer rejects it)."""
            if call.over or call.emitted[i] or w.epoch != call.epoch or w.fenced \
                    or buf.request_state(sids[i]) != "running":
                return
            buf.discard(sids[i], reason, detail)
            call.emitted[i] = True
            call.pending -= 1
            w.inflight -= 1
            if call.pending:
                slot_freed(w)
            self.ctx.notify()
            self._budget_ok(w, f"inference worker {w.name!r}")
            self.ctx.budget.record(stage, self._rule, 1, 1, detail)

        return emit


def token_ranges(spans: Any, loads: list[PolicyVersion | None],
                 first: PolicyVersion | None) -> list[tuple[str, int]] | None:
    """A completion's ``version_spans`` (``(load ordinal, tokens)``, oldest first) as the
    ledger's run-length ``(version, tokens)`` ranges, adjacent ranges of one version merged,
    the first always ``first`` (the started version: a request whose first token came after a
    swap gets a ``(first, 0)`` range, its prefill's); None when every token is of ``first``
    (or an ordinal names no known load: then ``first`` stands for all of them)."""
    out: list[tuple[str, int]] = []
    for k, n in spans:
        v = loads[k] if 0 <= k < len(loads) else None
        if v is None:
            return None
        if out and out[-1][0] == str(v):
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((str(v), n))
    if first is not None and out and out[0][0] != str(first):
        out.insert(0, (str(first), 0))
    return out if len(out) > 1 else None


def malformed(comp: Any) -> str | None:
    """What is wrong with an emitted completion, or None: not a Completion, a token count
    that is not a non-negative integer, text that is not a string, a ``gen_s`` that is not a
    finite non-negative number."""
    if not isinstance(comp, Completion):
        return f"not a Completion ({type(comp).__name__})"
    try:
        tokens = comp.tokens
    except Exception as exc:
        return f"no token count ({type(exc).__name__}: {exc})"
    if type(tokens) is not int or tokens < 0:
        return f"token count {tokens!r} is not a non-negative integer"
    if not isinstance(comp.text, str):
        return f"text is {type(comp.text).__name__}, not a string"
    g = comp.gen_s
    if isinstance(g, bool) or not isinstance(g, int | float) or not (math.isfinite(g) and g >= 0):
        return f"gen_s {g!r} is not a finite number >= 0"
    return None


def generation_seed(run_seed: int, first_sample: str) -> int:
    """A sampling seed fixed by the run seed and the batch's first sample id (replayable)."""
    return (run_seed * 1_000_003) ^ zlib.crc32(first_sample.encode())


__all__ = ["Call", "CallRunner", "Worker", "generation_seed", "malformed"]

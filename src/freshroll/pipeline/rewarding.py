"""The reward stage: completions in, rewards (or reward discards) out, failures budgeted.

Completions the workers emit are queued here (:meth:`RewardStage.put`, called on the loop by
an engine's ``emit``; the queue holds only admitted, generated requests, so the admission
window bounds it). They are scored in calls of up to ``scorer.max_batch`` completions, with up
to ``scorer.concurrency`` calls in flight (parallel reward workers; the thread adapter of a
RewardSet has one), through the run's :class:`~freshroll.ports.seams.AsyncScorer`, each under
``limits.reward_timeout_s``. Calls start once per turn of the event loop (a pump the first
completion queued in the turn, or a call that ends, schedules with ``call_soon``): what
arrives in one turn goes out together, and no task wakes per completion. Then:

* a batch that times out is discarded ``reward_timeout`` (a thread adapter abandons the stuck
  call; the next one runs on a fresh thread); timeouts in a row are budgeted
  (``limits.max_consecutive_timeouts``);
* a call that fails as a whole (the scorer raised, or returned the wrong number of scores)
  fails every sample of the batch as ``reward_error``; a ``KeyboardInterrupt`` in a reward
  stops the run as :class:`~freshroll.errors.Interrupted` (resumable, not a failure);
* failures are attributed per reward function: a function named in a sample's error failed
  that sample, the others did not; a failure naming no function counts for the set;
* the payload is checked after the hand-off hook (:meth:`~freshroll.pipeline.hooks.Hooks.scored`,
  where a chaos session may corrupt it) by :func:`checked_scores`: a value that is not a
  finite real number (NaN, inf, a string, a bool) fails its sample as ``reward_error``, the
  wrong count of scores fails the whole call; never a reward of 0, never a crash;
* a call whose reward worker died before it answered (the scorer raised
  :class:`~freshroll.errors.WorkerLost`) is scored again: its samples go back to the front of
  the queue, each at most :data:`MAX_LOST_RETRIES` times (then ``reward_error``); lost calls
  in a row are budgeted (stage ``<reward set> (lost workers)``, ``limits.max_consecutive_
  failed_calls``).

The time per sample recorded with a reward is its call's time on the run's clock divided by
the call's size. Generated samples recovered without a reward (a crash between the two) are scored
first.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from freshroll import unsafe
from freshroll.control.breaker import Rule
from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.errors import Interrupted, WorkerLost, WorkerTimeout
from freshroll.ledger.lineage import SampleId
from freshroll.ports.threads import CallAborted
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import Score
from freshroll.rewards.tasks import Prompt

if TYPE_CHECKING:
    from freshroll.pipeline.context import RunContext
    from freshroll.pipeline.hooks import Hooks
    from freshroll.ports.seams import AsyncScorer

MAX_BATCH = 256  # completions per reward call
MAX_LOST_RETRIES = 2  # a sample whose reward worker died is scored again at most this often


class RewardStage:
    """The reward stage of one run (the module doc); its inbox is :meth:`put`."""

    def __init__(self, ctx: RunContext, scorer: AsyncScorer, hooks: Hooks) -> None:
        self.ctx, self.buf, self.scorer, self.hooks = ctx, ctx.buf, scorer, hooks
        self._queue: deque[tuple[SampleId, Completion, Prompt]] = deque()
        self._group: asyncio.TaskGroup | None = None  # the calls' task group, while run runs
        self._due = False  # a pump is scheduled for this turn of the loop
        self.scoring = 0  # completions in the reward calls under way
        self._calls = 0  # reward calls under way (at most scorer.concurrency)
        self._lost: dict[SampleId, int] = {}  # times a sample's reward worker died
        # generated before a crash and never scored: taken now, before any worker serves
        # (an early worker's new samples reach the queue through put, never twice)
        self._recovered = ctx.buf.unrewarded()

    def put(self, sid: SampleId, comp: Completion, prompt: Prompt) -> None:
        self._queue.append((sid, comp, prompt))
        self._schedule()

    def _schedule(self) -> None:
        """Start calls at the next turn of the loop: what is queued during one turn goes out
        together (one pump a turn, however many completions arrive in it)."""
        if not self._due and self._group is not None:
            self._due = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Start reward calls while completions are queued and a reward worker is free."""
        self._due = False
        group, queue = self._group, self._queue
        if group is None:
            return
        limit, size = max(1, self.scorer.concurrency), max(1, self.scorer.max_batch)
        while queue and self._calls < limit:
            items = [queue.popleft() for _ in range(min(len(queue), size))]
            call = self._call(items)
            try:
                group.create_task(call)
            except RuntimeError:  # the task group is shutting down: the run is ending
                call.close()
                queue.extendleft(reversed(items))
                self._group = None
                return
            self._calls += 1
            self.scoring += len(items)

    @property
    def pending(self) -> int:
        """Generated completions not yet rewarded: queued, or in the call under way."""
        return len(self._queue) + self.scoring

    async def run(self) -> None:
        buf, ctx = self.buf, self.ctx
        for sid in self._recovered:  # recovered: generated before a crash, never scored
            if buf.attempt_state(sid) != "generated":
                continue  # ended meanwhile (its group was dropped) or re-issued (refreshed)
            data = buf.payload(sid)
            if data is None:
                buf.discard(sid, "invalid", "payload lost")
                continue
            p = pl.decode(data)
            comp = Completion(tuple(p.prompt_ids), tuple(p.token_ids), tuple(p.logprobs), p.text,
                              p.finish_reason, 0.0)
            self.put(sid, comp, ctx.prompts[buf.prompt_of(sid)])
        try:
            async with asyncio.TaskGroup() as calls:
                self._group = calls
                self._pump()
                await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._group = None

    async def _call(self, items: list[tuple[SampleId, Completion, Prompt]]) -> None:
        """One reward call: its samples rewarded or discarded, its outcome budgeted."""
        buf, ctx, hooks, n = self.buf, self.ctx, self.hooks, len(items)
        t0 = buf.clock.now()
        try:
            scores = await self._score_batch([p for _, _, p in items], [c for _, c, _ in items])
        finally:
            self._calls -= 1
            self.scoring -= n
            self._schedule()
        if isinstance(scores, WorkerLost):  # its reward worker died: scored again
            self._lost_call(items, scores)
            return
        if scores is None:  # timed out: discarded as reward_timeout
            for sid, _, _ in items:
                if buf.attempt_state(sid) == "generated":  # else ended meanwhile (dropped)
                    buf.discard(sid, "reward_timeout", self._timeout_error())
            ctx.notify()
            ctx.budget.record(self._label() + " (timeouts)", self._timeout_rule(),
                              1, 1, self._timeout_error())
            return
        sids = [sid for sid, _, _ in items]
        scores = checked_scores(hooks.scored(sids, scores), n, self._label())
        per_sample = (buf.clock.now() - t0) / n
        errors: list[str | None] = []
        version = self.scorer.version
        for (sid, _, _), score in zip(items, scores, strict=True):
            if score.value is not None:
                buf.reward(sid, score.value, version, per_sample, score.components,
                           score.logged, score.extras)
                errors.append(None)
            else:
                if buf.attempt_state(sid) == "generated":  # else ended meanwhile (dropped)
                    buf.discard(sid, "reward_error", score.error or "reward_error")
                errors.append(score.error or "")
        hooks.rewarded(sids)
        ctx.notify()
        self._record(errors)

    def _lost_call(self, items: list[tuple[SampleId, Completion, Prompt]],
                   exc: WorkerLost) -> None:
        """A reward call whose worker died: its samples are queued again (first), each at
        most MAX_LOST_RETRIES times, then discarded ``reward_error``; budgeted per call."""
        buf, ctx = self.buf, self.ctx
        error = f"reward_error: {self._label()}: its reward worker was lost: {exc}"
        again = []
        for item in items:
            sid = item[0]
            if buf.closed or buf.attempt_state(sid) != "generated":
                continue  # ended meanwhile (its group was dropped) or re-issued (refreshed)
            n = self._lost[sid] = self._lost.get(sid, 0) + 1
            if n > MAX_LOST_RETRIES:
                buf.discard(sid, "reward_error", f"{error} ({n} times)")
            else:
                again.append(item)
        self._queue.extendleft(reversed(again))
        self._schedule()
        ctx.notify()
        ctx.budget.record(self._label() + " (lost workers)", self._lost_rule(), 1, 1, error)

    def _lost_rule(self) -> Rule:
        lim = self.ctx.limits
        return Rule(lim.max_consecutive_failed_calls, unit="calls",
                    calls_key="limits.max_consecutive_failed_calls")

    async def _score_batch(
        self, prompts: list[Prompt], comps: list[Completion]
    ) -> list[Score] | WorkerLost | None:
        """The batch's scores; None if the call timed out; the WorkerLost of a call whose
        reward worker died. A call that fails as a whole (the scorer raised, e.g.
        KeyboardInterrupt in a reward) fails every sample."""
        buf, timeout_s = self.buf, unsafe.timeout(self.ctx.limits.reward_timeout_s)
        state = RewardState(buf.version.step if buf.version else 0, self.ctx.cfg.run.steps)
        try:
            with self.ctx.waits.waiting(self._label(), self.ctx.limits.reward_timeout_s):
                async with asyncio.timeout(timeout_s) as cm:
                    scores = await self.scorer.score(prompts, comps, state)
        except TimeoutError:
            if not cm.expired():
                raise
            return None
        except WorkerTimeout:
            return None
        except WorkerLost as exc:
            return exc
        except Interrupted:  # KeyboardInterrupt in a reward: the run stops (resumable)
            raise
        except CallAborted as exc:  # KeyboardInterrupt, SystemExit, ... from user code
            scores = [Score(None, f"reward_error: {self._label()} {exc}", {})] * len(comps)
        except Exception as exc:
            error = f"reward_error: {self._label()} raised {type(exc).__name__}: {exc}"
            scores = [Score(None, error, {})] * len(comps)
        self.ctx.budget.record(self._label() + " (timeouts)", self._timeout_rule(), 0)
        if self._lost:
            self.ctx.budget.record(self._label() + " (lost workers)", self._lost_rule(), 0)
        return scores

    def _label(self) -> str:
        names = self.scorer.names
        if len(names) == 1:
            return f"reward function {names[0]!r}"
        return f"reward set ({', '.join(names)})"

    def _timeout_rule(self) -> Rule:
        lim = self.ctx.limits
        return Rule(lim.max_consecutive_timeouts, unit="calls",
                    calls_key="limits.max_consecutive_timeouts")

    def _timeout_error(self) -> str:
        return (f"reward call did not return within {self.ctx.limits.reward_timeout_s:g} s "
                "(limits.reward_timeout_s); its thread was abandoned")

    def _record(self, errors: list[str | None]) -> None:
        """One reward call's outcome, per reward function (module docstring)."""
        names = self.scorer.names
        stages = {n: f"reward function {n!r}" for n in names}
        set_stage = self._label()
        failed: dict[str, int] = dict.fromkeys([*stages.values(), set_stage], 0)
        first: dict[str, str] = {}
        for error in errors:
            if error is None:
                continue
            parts: list[str] = []  # one per function: "f raised ...; g raised ..."
            for piece in error.removeprefix("reward_error: ").split("; "):
                if parts and not any(piece.startswith(n + " ") for n in names):
                    parts[-1] += "; " + piece  # a "; " inside one function's error
                else:
                    parts.append(piece)
            named = {stages[n]: p for p in parts for n in names if p.startswith(n + " ")}
            for stage, part in (named or {set_stage: "; ".join(parts)}).items():
                failed[stage] += 1
                first.setdefault(stage, part)
        rule = self.ctx.sample_rule()
        for stage, n in failed.items():
            self.ctx.budget.record(stage, rule, n, len(errors), first.get(stage, ""))


def checked_scores(scores: Sequence[Score], n: int, label: str) -> list[Score]:
    """``scores`` with every malformed one failed: the wrong count fails all ``n``; a value
    that is not a finite real number (NaN, inf, a string, a bool, ...) or an entry that is
    not a :class:`Score` fails its sample (``Score(None, "reward_error: ...")``)."""
    try:
        count = len(scores)
    except TypeError:
        count = -1
    if count != n:
        got = count if count >= 0 else type(scores).__name__
        error = f"reward_error: {label} returned {got} scores for {n} samples"
        return [Score(None, error, {})] * n
    out = []
    for score in scores:
        if not isinstance(score, Score):
            score = Score(None, f"reward_error: {label} returned a {type(score).__name__}, "
                                "not a Score", {})
        elif score.value is not None:
            v: object = score.value
            if isinstance(v, bool) or not isinstance(v, numbers.Real) \
                    or not math.isfinite(float(v)):
                score = Score(None, f"reward_error: {label} returned the reward {v!r} "
                                    "(not a finite number)", dict(score.components))
        out.append(score)
    return out


__all__ = ["MAX_BATCH", "MAX_LOST_RETRIES", "RewardStage", "checked_scores"]

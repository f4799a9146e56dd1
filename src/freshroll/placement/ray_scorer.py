"""``run.runtime: ray`` with ``ray.reward_actors > 0``: rewards scored in Ray actors.

:class:`RayScorer` is an :class:`~freshroll.ports.seams.AsyncScorer` with the contract of
:class:`~freshroll.placement.adapters.ThreadScorer`, over ``ray.reward_actors`` actors of
``ray.reward_cpus`` CPUs each. Every actor builds the run's
:class:`~freshroll.rewards.scoring.RewardSet` from the config's ``rewards:`` entries (file
references made absolute on the driver) and must arrive at the driver's reward version
digest: a node whose reward code differs is refused
(:class:`~freshroll.errors.RunFailed` naming both digests), before any sample is scored
with it.

``concurrency`` is the number of actors: the reward stage keeps at most that many calls in
flight, each on an idle actor of its own (user reward code need not be thread-safe: one
call at a time per actor). A call is awaited on the event loop (the actor's result as a
future: no thread waits on it).

* A call the pipeline gives up on (``limits.reward_timeout_s``, or the run's end) is
  abandoned as a thread is today: its actor, still busy with it, is killed and a fresh one
  takes its slot, so the next call does not queue behind the stuck one. The fresh actor's
  start-up is waited for by the next call on that slot (and counts against that call's
  timeout); a call cancelled while it waits does not kill an actor that is only starting.
* An actor lost mid-call (its process died, a node went away) raises
  :class:`~freshroll.errors.WorkerLost`: the reward stage scores that call's samples again
  (each at most ``MAX_LOST_RETRIES`` times, lost calls budgeted; :mod:`.rewarding`), and a
  fresh actor takes the lost one's slot (:attr:`RayScorer.restarts`).
* A reward function that raises inside the actor fails the call as it would on a thread
  (the stage's ``reward_error``, with the function's own exception).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freshroll.config import Config
from freshroll.engines.base import Completion
from freshroll.errors import RunFailed, WorkerLost
from freshroll.placement.ray_session import _gate, track, untrack
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import RewardSet, Score
from freshroll.rewards.tasks import Prompt


class _RewardActor:
    """Lives in a Ray worker process: the run's RewardSet, built from its config entries."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        from freshroll.rewards.scoring import build_reward_set

        self.rewards = build_reward_set(entries)

    def version(self) -> str:
        return str(self.rewards.version)

    def score(self, prompts: list[Prompt], texts: list[str], ids: list[list[int]],
              state: RewardState) -> list[Score]:
        return self.rewards.score_prompts(prompts, texts, ids, state)


def actor_entries(cfg: Config, cwd: Path | None = None) -> list[dict[str, Any]]:
    """The config's reward entries with file references made absolute (the actor's working
    directory is Ray's, not the driver's)."""
    base = cwd or Path.cwd()
    out = []
    for entry in cfg.rewards:
        d = entry.model_dump(exclude_none=True)
        target, sep, attr = str(d["fn"]).rpartition(":")
        if sep and (target.endswith(".py") or "/" in target or "\\" in target):
            d["fn"] = f"{(base / target).resolve()}:{attr}"
        out.append(d)
    return out


class RayScorer:
    """The run's rewards in ``ray.reward_actors`` Ray actors (module docstring)."""

    max_batch = 256

    def __init__(self, cfg: Config, rewards: RewardSet) -> None:
        import ray

        self._ray = ray
        self.version = str(rewards.version)
        self.names = tuple(s.name for s in rewards.specs)
        self.concurrency = cfg.ray.reward_actors
        self._entries = actor_entries(cfg)
        self._cls = ray.remote(num_cpus=cfg.ray.reward_cpus, max_restarts=0)(_RewardActor)
        self._start_timeout_s = cfg.limits.worker_start_timeout_s
        self.restarts = 0  # actors replaced after a loss or an abandoned call
        self._actors: list[Any] = [self._spawn() for _ in range(self.concurrency)]
        self._idle = list(range(self.concurrency))
        #: replacements not yet known to be up with the driver's reward version: the ref of
        #: their ``version()`` call (a call cancelled while waiting on it does not kill them)
        self._starting: dict[int, Any] = {}
        try:
            self._check_versions(self._actors)
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> Any:
        with _gate.entered():
            return track(self._cls.remote(self._entries))

    def _check_versions(self, actors: Sequence[Any]) -> None:
        """Wait (bounded: ``limits.worker_start_timeout_s``) for the actors to be up and check
        that each built the driver's reward version."""
        ray = self._ray
        with _gate.entered():
            refs = [a.version.remote() for a in actors]
            try:
                versions = ray.get(refs, timeout=self._start_timeout_s)
            except ray.exceptions.GetTimeoutError as exc:
                raise RunFailed(f"reward actors not ready within "
                                    f"{self._start_timeout_s:g} s (limits.worker_start_"
                                    "timeout_s; ray.reward_cpus free on the cluster?)") from exc
            except ray.exceptions.RayError as exc:
                raise RunFailed(f"a reward actor failed to build the run's rewards: "
                                f"{str(exc)[:500]}") from exc
        for v in versions:
            self._same_version(v)

    def _same_version(self, v: str) -> None:
        if v != self.version:
            raise RunFailed(f"a reward actor built reward version {v}, the driver "
                            f"{self.version}: the reward code or its config differs on that "
                            "node (install the same files and packages on every node)")

    def _replace(self, slot: int) -> None:
        """A fresh actor in ``slot`` (the old one killed: lost, or busy with an abandoned
        call); its version is checked before its first call."""
        old = self._actors[slot]
        untrack(old)
        with contextlib.suppress(Exception), _gate.entered():
            self._ray.kill(old, no_restart=True)
        self._actors[slot] = new = self._spawn()
        with _gate.entered():
            self._starting[slot] = new.version.remote()  # awaited by its first call
        self.restarts += 1

    def kill(self, slot: int = 0) -> None:
        """Kill the actor in ``slot`` as a crash would (tests, chaos): its call in flight,
        or its next one, fails with WorkerLost and the actor is replaced."""
        with _gate.entered():
            self._ray.kill(self._actors[slot], no_restart=True)

    async def _await(self, ref: Any) -> Any:
        return await asyncio.wrap_future(ref.future())

    async def score(
        self, prompts: Sequence[Prompt], completions: Sequence[Completion], state: RewardState,
    ) -> list[Score]:
        ray = self._ray
        slot = self._idle.pop() if self._idle else int(time.monotonic_ns()) % self.concurrency
        scoring = False  # cancelled while the actor is still starting: it is not stuck
        try:
            actor = self._actors[slot]
            starting = self._starting.get(slot)
            if starting is not None:  # a replacement: up, and the driver's reward version?
                self._same_version(await self._await(starting))
                self._starting.pop(slot, None)
            with _gate.entered():
                ref = actor.score.remote(list(prompts), [c.text for c in completions],
                                         [list(c.token_ids) for c in completions], state)
            scoring = True
            scores: list[Score] = await self._await(ref)
            return scores
        except ray.exceptions.RayActorError as exc:
            self._replace(slot)
            raise WorkerLost(f"reward actor died: {exc}"[:500]) from exc
        except ray.exceptions.RayTaskError as exc:  # the reward code raised: as on a thread
            cause = exc.cause
            if isinstance(cause, Exception):
                raise cause from None
            raise RuntimeError(str(exc)[:500]) from None
        except asyncio.CancelledError:  # timed out (or the run ended): abandon a stuck actor
            if scoring:
                with contextlib.suppress(WorkerLost):
                    self._replace(slot)
            raise
        finally:
            if slot not in self._idle:
                self._idle.append(slot)

    def actor_ids(self) -> list[str]:
        return [str(a._actor_id.hex()) for a in self._actors]

    def close(self) -> None:
        """Kill the reward actors (idempotent)."""
        for actor in self._actors:
            untrack(actor)
            with contextlib.suppress(Exception), _gate.entered():
                self._ray.kill(actor, no_restart=True)
        self._actors, self._idle = [], []


__all__ = ["RayScorer", "actor_entries"]

"""The inline orchestrator: one asyncio pipeline that owns every task of a run.

Tasks (all children of one ``asyncio.TaskGroup``; none is fire-and-forget)::

    feeder      admits prompts while the freshness window has capacity
    worker i    takes queued requests, loads the newest published weights,
                generates (in its own thread), reports completions
    rewarder    scores completions with the RewardSet (in a thread), records
                rewards or ``reward_error`` discards
    trainer     waits for a lease of ``batch_groups`` fresh groups (the wait is
                the trainer's idle time), runs one GRPO step (in its thread),
                checkpoints, commits durably, publishes the new weights

Blocking compute never runs on the event loop. The only queue (completions
waiting for a reward) is bounded. Every state change goes through the
:class:`~freshroll.buffer.SampleBuffer`, so the ledger sees it.

``max_staleness = 0`` gives the synchronous baseline with the same code: the
window admits one batch per policy version, so generation, scoring and
training run in lockstep. ``max_staleness >= 1`` lets workers generate the
next batches while the trainer trains.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from freshroll import events as ev
from freshroll.buffer import Outcome, SampleBuffer
from freshroll.config import Config
from freshroll.engines.base import Completion, InferenceEngine
from freshroll.errors import WorkerLost
from freshroll.lineage import PolicyVersion, SampleId
from freshroll.rewards.calling import RewardState
from freshroll.rewards.scoring import RewardSet
from freshroll.rewards.tasks import Prompt
from freshroll.runtime import payload as pl
from freshroll.trainer.grpo import GRPOLearner, TrainSample
from freshroll.trainer.replay import train_samples, weights_digest

MAX_RESTARTS = 3  # per worker, per run


class _Stop(Exception):
    """Raised by the trainer task when the run has committed its steps."""


@dataclass
class StepReport:
    step: int
    version: PolicyVersion
    metrics: dict[str, float]
    wait_s: float
    train_s: float


@dataclass
class Published:
    version: PolicyVersion
    weights: dict[str, torch.Tensor] | None  # None: the engines' initial weights


@dataclass
class Pipeline:
    buf: SampleBuffer
    engines: Sequence[InferenceEngine]
    learner: GRPOLearner
    rewards: RewardSet
    prompts: dict[str, Prompt]
    prompt_order: list[str]
    cfg: Config
    on_step: Callable[[StepReport], None]
    before_commit: Callable[[PolicyVersion, GRPOLearner], None]
    published: Published | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _restarts: dict[str, int] = field(default_factory=dict)

    # -- plumbing ----------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self) -> None:
        """Run until ``cfg.run.steps`` steps are committed in total."""
        if self.published is None:
            self.published = Published(self.buf.version, None)  # type: ignore[arg-type]
        self._reward_q: asyncio.Queue[tuple[SampleId, Completion]] = asyncio.Queue(
            maxsize=max(64, 4 * self.cfg.rollout.worker_batch)
        )
        self._trainer_pool = ThreadPoolExecutor(1, thread_name_prefix="trainer")
        self._pools = [
            ThreadPoolExecutor(1, thread_name_prefix=f"worker{i}") for i in range(len(self.engines))
        ]
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._feeder(), name="feeder")
                for i, engine in enumerate(self.engines):
                    tg.create_task(self._worker(i, engine), name=f"worker{i}")
                tg.create_task(self._rewarder(), name="rewarder")
                tg.create_task(self._trainer(), name="trainer")
        except* _Stop:
            pass
        finally:
            for pool in (*self._pools, self._trainer_pool):
                pool.shutdown(wait=True, cancel_futures=True)

    # -- feeder ------------------------------------------------------------------
    async def _feeder(self) -> None:
        buf = self.buf
        while True:
            changed = self._changed
            n = buf.capacity()
            for _ in range(n):
                buf.admit(self.prompt_order[buf.groups_admitted % len(self.prompt_order)])
            if n:
                self._notify()
            await changed.wait()

    # -- inference workers --------------------------------------------------------
    async def _worker(self, i: int, engine: InferenceEngine) -> None:
        buf, ro, loop = self.buf, self.cfg.rollout, asyncio.get_running_loop()
        name = f"w{i}"
        epoch = buf.register_worker(name)
        loaded: PolicyVersion | None = None
        while True:
            changed = self._changed
            pub = self.published
            assert pub is not None
            if loaded != pub.version:
                if pub.weights is not None:
                    try:
                        secs = await loop.run_in_executor(
                            self._pools[i], engine.load_weights, pub.weights
                        )
                    except WorkerLost as exc:
                        epoch, loaded = await self._replace(i, engine, name, epoch, exc), None
                        continue
                    buf.record(ev.WeightsLoaded(
                        ts=buf.clock.now(), worker=name, epoch=epoch, version=str(pub.version),
                        transfer_s=secs,
                    ))
                loaded = pub.version
                continue
            rids = buf.take_requests(ro.worker_batch)
            if not rids:
                await changed.wait()
                continue
            sids = [buf.start(r, name, epoch, loaded) for r in rids]
            texts = [self.prompts[buf.prompt_of(r)].text for r in rids]
            seed = generation_seed(self.cfg.run.seed, sids[0])
            try:
                comps = await loop.run_in_executor(
                    self._pools[i], self._generate, engine, texts, seed
                )
            except WorkerLost as exc:  # its running attempts are fenced and re-issued
                epoch, loaded = await self._replace(i, engine, name, epoch, exc), None
                continue
            except Exception as exc:  # engine failure: these requests end, the run goes on
                for sid in sids:
                    buf.discard(sid, "generation_error", f"{type(exc).__name__}: {exc}"[:300])
                self._notify()
                continue
            for sid, comp in zip(sids, comps, strict=True):
                out = buf.complete(
                    sid, tokens=len(comp.token_ids), gen_s=comp.gen_s, payload=pl.encode(comp),
                    worker=(name, epoch),
                )
                if out is Outcome.ACCEPTED:
                    await self._reward_q.put((sid, comp))

    async def _replace(
        self, i: int, engine: InferenceEngine, name: str, epoch: int, exc: WorkerLost
    ) -> int:
        """A worker died: fence its epoch (running attempts re-issued), restart it, new epoch.

        Gives up (re-raises, ending the run) after ``MAX_RESTARTS`` restarts of one worker,
        or at once for an engine that cannot restart.
        """
        self.buf.fence_worker(name, epoch, "lost")
        self._notify()
        restart = getattr(engine, "restart", None)
        self._restarts[name] = self._restarts.get(name, 0) + 1
        if restart is None or self._restarts[name] > MAX_RESTARTS:
            raise exc
        await asyncio.get_running_loop().run_in_executor(self._pools[i], restart)
        return self.buf.register_worker(name)

    def _generate(self, engine: InferenceEngine, texts: list[str], seed: int) -> list[Completion]:
        ro = self.cfg.rollout
        return engine.generate(
            texts, max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
            seed=seed,
        )

    # -- rewards -----------------------------------------------------------------
    async def _rewarder(self) -> None:
        buf, version = self.buf, str(self.rewards.version)
        for sid in buf.unrewarded():  # recovered: generated before a crash, never scored
            data = buf.payload(sid)
            if data is None:
                buf.discard(sid, "invalid", "payload lost")
                continue
            p = pl.decode(data)
            await self._reward_q.put((sid, Completion(
                tuple(p.prompt_ids), tuple(p.token_ids), tuple(p.logprobs), p.text,
                p.finish_reason, 0.0,
            )))
        while True:
            items = [await self._reward_q.get()]
            while not self._reward_q.empty() and len(items) < 256:
                items.append(self._reward_q.get_nowait())
            prompts = [self.prompts[buf.prompt_of(sid)] for sid, _ in items]
            t0 = time.perf_counter()
            scores = await asyncio.to_thread(
                self.rewards.score_prompts, prompts, [c.text for _, c in items],
                [c.token_ids for _, c in items],
                RewardState(buf.version.step if buf.version else 0, self.cfg.run.steps),
            )
            per_sample = (time.perf_counter() - t0) / len(items)
            for (sid, _), score in zip(items, scores, strict=True):
                if score.value is None:
                    buf.discard(sid, "reward_error", score.error or "reward_error")
                else:
                    buf.reward(sid, score.value, version, per_sample)
            self._notify()

    # -- trainer -----------------------------------------------------------------
    def _train_step(self, samples: list[TrainSample]) -> tuple[dict[str, float], str]:
        """One optimizer step and the digest of the weights it produced (trainer thread)."""
        metrics = self.learner.step(samples)
        return metrics, weights_digest(self.learner.model)

    async def _trainer(self) -> None:
        buf, loop = self.buf, asyncio.get_running_loop()
        while buf.counts["steps"] < self.cfg.run.steps:
            t0 = buf.clock.now()
            while True:
                changed = self._changed
                wait_s = buf.clock.now() - t0
                lease = buf.lease(wait_s=wait_s)
                if lease is not None:
                    break
                await changed.wait()
            self._notify()  # stale discards free admission capacity
            samples = train_samples(buf, lease.samples, lease.version)
            metrics, digest = await loop.run_in_executor(
                self._trainer_pool, self._train_step, samples
            )
            parent = buf.version
            assert parent is not None
            child = parent.child(lease.samples, self.learner.settings_digest, digest)
            await loop.run_in_executor(self._trainer_pool, self.before_commit, child, self.learner)
            version = buf.commit(
                lease.id, self.learner.settings_digest, weights_digest=digest,
                train_s=metrics["train_s"], metrics=metrics,
            )
            self.published = Published(version, self.learner.weights())
            self.on_step(StepReport(version.step, version, metrics, wait_s, metrics["train_s"]))
            self._notify()
        raise _Stop


def generation_seed(run_seed: int, first_sample: str) -> int:
    """A sampling seed fixed by the run seed and the batch's first sample id (replayable)."""
    return (run_seed * 1_000_003) ^ zlib.crc32(first_sample.encode())


def run_pipeline(pipeline: Pipeline) -> None:
    asyncio.run(pipeline.run())


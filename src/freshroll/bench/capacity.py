"""Stage capacities in isolation: each stage of a workload alone, through the pipeline's seams.

The same drivers time the real components (``rollout.engine: hf``, on the real clock,
a few batches) and the simulated ones (``rollout.engine: sim``, on a virtual clock,
as many samples as it takes for the rates to settle), because they only await the
seams of :mod:`freshroll.ports.seams`. Every duration is the event loop's time
(``loop.time()``), which is the virtual clock under :meth:`VirtualClock.run`.

- **generation** (:func:`measure_generation`): every worker's engine fed, through the run's
  episode workflow (``rollout.workflow``) as the pool feeds it, without admission limit — a
  continuous engine keeps ``concurrency`` requests in flight, a lock-step engine gets
  back-to-back calls of ``concurrency`` requests — with no trainer;
  ``c_gen = n / (time of the n-th completion)`` for the whole pool (the calls still in
  flight then are let finish, uncounted);
- **reward** (:func:`measure_reward`): the scorer on the stream of those completions, as the
  pipeline's reward stage calls it (up to ``scorer.concurrency`` calls in flight of up to
  ``scorer.max_batch`` completions, each under ``limits.reward_timeout_s``: a call that times
  out scores nothing);
  ``c_reward = samples scored / elapsed``;
- **trainer** (:func:`measure_trainer`): fed from a full buffer — each step's batch is
  made ready in a scratch ledger before the step starts, so the trainer never waits;
  ``c_train = B x steps / (time inside trainer.step)``;
- **weight transfer** (:func:`measure_transfer`): one worker loads the trainer's
  weights ``n`` times; seconds per version.

The scratch buffer lives in a temporary directory (its ledger is thrown away); the
simulated trainer reads sample lengths from it, as in a run.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from freshroll.bench.figures import Capacities
from freshroll.engines.base import Completion
from freshroll.engines.episodes import EpisodeEmit, EpisodeFailed, EpisodeWorkflow, SingleTurn
from freshroll.engines.seams import AsyncEngine, EngineFactory, GenRequest, SamplingParams
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ports.seams import AsyncScorer, AsyncTrainer
from freshroll.rewards.calling import RewardState
from freshroll.rewards.tasks import Prompt


@dataclass(frozen=True, slots=True)
class Workload:
    """What the stages are measured on (the run's shape)."""

    prompts: Sequence[Prompt]
    group_size: int
    batch_groups: int
    workers: int
    concurrency: int  # requests per worker (in flight, or per lock-step call)
    params: SamplingParams
    seed: int = 0
    policy_step: int = 0  # the policy step the engines generate at (length drift)
    max_steps: int = 0  # run.steps (what rewards see as max_steps)
    reward_timeout_s: float = 300.0  # limits.reward_timeout_s
    workflow: EpisodeWorkflow = field(default_factory=SingleTurn)  # rollout.workflow's

    @property
    def batch(self) -> int:
        return self.batch_groups * self.group_size


@dataclass
class Generated:
    """The completions of the generation measurement, by group, in finishing order."""

    per_s: float
    groups: dict[str, list[tuple[GenRequest, Completion]]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def complete_groups(self, size: int) -> list[list[tuple[GenRequest, Completion]]]:
        return [g for g in self.groups.values() if len(g) == size]


def _now() -> float:
    return asyncio.get_running_loop().time()


def _requests(w: Workload) -> Iterator[GenRequest]:
    """Groups of ``group_size`` requests over the prompts, round robin, forever."""
    for i in itertools.count():
        p = w.prompts[i % len(w.prompts)]
        for j in range(w.group_size):
            yield GenRequest(sample=f"g{i}.{j}#1", group=f"g{i}", prompt_id=p.prompt_id,
                             text=p.text, policy_step=w.policy_step)


async def measure_generation(
    factory: EngineFactory, w: Workload, n_samples: int
) -> tuple[Generated, list[AsyncEngine]]:
    """Run every worker with a full queue until ``n_samples`` completions came back."""
    engines = [await factory(f"bench-w{k}") for k in range(w.workers)]
    source = _requests(w)
    out = Generated(per_s=0.0)
    done = [0]
    t0 = _now()
    last = [t0]

    def emit_for(batch: Sequence[GenRequest]) -> EpisodeEmit:
        def emit(i: int, c: Completion | EpisodeFailed) -> None:
            if isinstance(c, EpisodeFailed):  # no completion: the slot goes on
                return
            req = batch[i]
            out.groups.setdefault(req.group, []).append((req, c))
            done[0] += 1
            if done[0] == n_samples:  # the rate counts up to the n-th completion
                last[0] = _now()
        return emit

    async def slot(engine: AsyncEngine, size: int, k: int) -> None:
        for call in itertools.count():
            if done[0] >= n_samples:
                return
            batch = [next(source) for _ in range(size)]
            await w.workflow.run_episode(engine, batch, w.params, w.seed + 7919 * k + call,
                                         emit_for(batch))

    async with asyncio.TaskGroup() as tg:
        for k, engine in enumerate(engines):
            if engine.continuous:  # `concurrency` single requests in flight
                for s in range(w.concurrency):
                    tg.create_task(slot(engine, 1, k * w.concurrency + s))
            else:  # back-to-back lock-step calls of `concurrency` requests
                tg.create_task(slot(engine, w.concurrency, k))
    out.elapsed_s = last[0] - t0
    out.per_s = n_samples / out.elapsed_s if out.elapsed_s > 0 else 0.0
    return out, engines


async def measure_reward(
    scorer: AsyncScorer, gen: Generated, w: Workload, by_id: dict[str, Prompt],
) -> tuple[float, dict[str, float]]:
    """Score the complete generated groups as the pipeline's reward stage does: calls of up to
    ``scorer.max_batch`` completions, ``scorer.concurrency`` of them in flight, each under
    ``reward_timeout_s`` (a call that times out scores nothing); samples scored per second,
    and each sample's reward (for the trainer)."""
    size, limit = max(1, scorer.max_batch), max(1, scorer.concurrency)
    pairs = [m for g in gen.complete_groups(w.group_size) for m in g]
    if len(pairs) >= size:  # whole calls only, as on a full stream
        pairs = pairs[:len(pairs) // size * size]
    chunks = iter([pairs[i:i + size] for i in range(0, len(pairs), size)])
    rewards: dict[str, float] = {}
    scored = [0]
    t0 = _now()

    async def caller() -> None:
        for chunk in chunks:
            prompts = [by_id[req.prompt_id] for req, _ in chunk]
            try:
                async with asyncio.timeout(w.reward_timeout_s):
                    scores = await scorer.score(prompts, [c for _, c in chunk],
                                                RewardState(w.policy_step, w.max_steps))
            except TimeoutError:  # the pipeline discards the call's samples (reward_timeout)
                continue
            for (req, _), sc in zip(chunk, scores, strict=True):
                scored[0] += sc.value is not None
                rewards[req.sample] = sc.value if sc.value is not None else 0.0

    async with asyncio.TaskGroup() as tg:
        for _ in range(limit):
            tg.create_task(caller())
    elapsed = _now() - t0
    return (scored[0] / elapsed if elapsed > 0 else 0.0), rewards


#: completion -> the ``payload`` the pipeline stores with its ``generated`` event
Payload = Callable[[Completion], bytes | None]


async def measure_trainer(
    trainer: AsyncTrainer, buf: SampleBuffer, gen: Generated, rewards: dict[str, float],
    w: Workload, steps: int, payload: Payload, reward_version: str = "bench", warmup: int = 0,
) -> float:
    """Train ``warmup + steps`` steps, each on a batch made ready before it starts; samples/s
    over the last ``steps``."""
    groups = gen.complete_groups(w.group_size)
    if len(groups) < w.batch_groups:
        raise ValueError(f"{len(groups)} complete groups generated, a batch needs "
                         f"{w.batch_groups}")
    epoch = buf.register_worker("bench")
    busy = 0.0
    pool = itertools.cycle(groups)
    for k in range(warmup + steps):
        batch = [next(pool) for _ in range(w.batch_groups)]
        for members in batch:
            buf.admit(members[0][0].prompt_id)
        flat = [m for members in batch for m in members]
        for rid, (req, c) in zip(buf.take_requests(w.batch), flat, strict=True):
            sid = buf.start(rid, "bench", epoch, buf.version)  # type: ignore[arg-type]  # published at open
            buf.complete(sid, tokens=c.tokens, gen_s=c.gen_s, payload=payload(c))
            buf.reward(sid, rewards.get(req.sample, 0.0), reward_version)
        lease = buf.lease()
        if lease is None:
            raise RuntimeError(f"no full batch ready in the scratch buffer ({buf.stats()})")
        t0 = _now()
        metrics, digest = await trainer.step(lease)
        if k >= warmup:
            busy += _now() - t0
        buf.commit(lease.id, trainer.settings_digest, weights_digest=digest,
                   train_s=float(metrics.get("train_s", 0.0)))
    return w.batch * steps / busy if busy > 0 else 0.0


async def measure_transfer(engine: AsyncEngine, trainer: AsyncTrainer, n: int) -> float:
    """Seconds for one worker to install the trainer's current weights (mean of ``n``)."""
    t0 = _now()
    for _ in range(n):
        await engine.load_weights(trainer.weights())
    return (_now() - t0) / n


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of each stage to measure."""

    gen_samples: int
    train_steps: int
    transfers: int = 3
    train_warmup: int = 0  # first trainer steps not timed (a real model's lazy set-up)


async def measure(
    factory: EngineFactory, scorer: AsyncScorer, trainer: AsyncTrainer, buf: SampleBuffer,
    w: Workload, plan: Plan, payload: Payload,
    close: Callable[[AsyncEngine], Awaitable[None]] | None = None,
) -> Capacities:
    """Every stage alone, in order: generation, reward, trainer, weight transfer."""
    gen, engines = await measure_generation(factory, w, plan.gen_samples)
    try:
        by_id = {p.prompt_id: p for p in w.prompts}
        reward_per_s, rewards = await measure_reward(scorer, gen, w, by_id)
        train_per_s = await measure_trainer(trainer, buf, gen, rewards, w, plan.train_steps,
                                            payload, scorer.version, plan.train_warmup)
        transfer_s = await measure_transfer(engines[0], trainer, plan.transfers)
    finally:
        for e in engines:
            await (close(e) if close is not None else e.close())
    return Capacities(
        batch=w.batch, gen_per_s=gen.per_s, reward_per_s=reward_per_s, train_per_s=train_per_s,
        transfer_s=transfer_s, gen_per_worker_per_s=gen.per_s / w.workers,
    )


__all__ = ["Generated", "Plan", "Workload", "measure", "measure_generation", "measure_reward",
           "measure_trainer", "measure_transfer"]

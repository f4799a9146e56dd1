"""The components a bench measures in isolation, built from the config as a run builds them.

``rollout.engine: sim``: :func:`freshroll.sim.components.build_sim` on a scratch buffer,
measured on a :class:`~freshroll.clock.VirtualClock` (as many samples as it takes for the
rates to settle, in no real time). ``rollout.engine: hf``: the run's own components
behind their thread adapters (model, prompts, rewards, learner), timed on the real clock
on a few batches. Either way the scratch ledger lives in a temporary directory.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from freshroll.bench.capacity import Plan, Workload, measure
from freshroll.bench.figures import Capacities
from freshroll.clock import RealClock, VirtualClock
from freshroll.config import Config
from freshroll.engines.base import Completion
from freshroll.engines.seams import SamplingParams
from freshroll.engines.specs import engine_spec
from freshroll.envs.registry import workflow_for
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import open_ledger
from freshroll.placement.placement import thread_budget
from freshroll.rewards.tasks import Prompt

#: samples of the generation measurement on the simulated engine (at most)
SIM_GEN_MAX = 200_000


def _kernel(cfg: Config) -> KernelConfig:
    # a wide window: the scratch buffer is filled a batch at a time, never by admission
    return KernelConfig(max(1, cfg.run.max_staleness), cfg.rollout.batch_groups,
                        cfg.rollout.group_size)


def _params(cfg: Config) -> SamplingParams:
    ro = cfg.rollout
    return SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k, ro.min_p,
                          ro.repetition_penalty)


def _max_concurrency(cfg: Config) -> int:
    """The most requests the pipeline may keep in flight on one worker."""
    return cfg.control.max_concurrency or 4 * cfg.rollout.call_batch


def measure_capacities(cfg: Config, *, quick: bool = False) -> Capacities:
    """The stage capacities of ``cfg``'s workload, in seconds of its model (sim: virtual
    seconds at ``sim.time_scale``; hf: wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="freshroll-bench-") as tmp:
        if engine_spec(cfg.rollout.engine).simulated:
            return _measure_sim(cfg, Path(tmp), quick)
        return _measure_hf(cfg, Path(tmp), quick)


def _measure_sim(cfg: Config, tmp: Path, quick: bool) -> Capacities:
    from freshroll.sim.components import build_sim

    clock = VirtualClock()
    buf = SampleBuffer.open(open_ledger(tmp, sync="off"), _kernel(cfg), clock, run_id="scratch",
                            initial_version=PolicyVersion.initial("bench-sim"))
    try:
        parts = build_sim(cfg, clock, buf)
        slots = parts.profile.server.max_concurrent
        workers = cfg.control.max_workers or cfg.rollout.workers
        conc = min(slots, _max_concurrency(cfg))
        batch = cfg.rollout.batch_groups * cfg.rollout.group_size
        n = min(SIM_GEN_MAX, max(8 * batch, 4 * workers * conc))
        w = Workload(
            prompts=[Prompt(f"bench-{i}", f"bench prompt {i}") for i in range(1024)],
            group_size=cfg.rollout.group_size, batch_groups=cfg.rollout.batch_groups,
            workers=workers, concurrency=conc, params=_params(cfg), seed=cfg.run.seed,
            policy_step=cfg.run.steps // 2, max_steps=cfg.run.steps,
            reward_timeout_s=cfg.limits.reward_timeout_s,
            workflow=workflow_for(cfg),
        )
        plan = Plan(gen_samples=n if not quick else max(2 * batch, workers * conc),
                    train_steps=5 if quick else 20)
        caps = clock.run(measure(parts.engine_factory, parts.scorer, parts.trainer, buf, w,
                                 plan, payload=_no_payload))
    finally:
        buf.ledger.close()
    return caps


def _no_payload(c: Completion) -> bytes | None:
    return None


def _measure_hf(cfg: Config, tmp: Path, quick: bool) -> Capacities:
    """The run's real components (as :mod:`freshroll.runtime.run` builds them) on a scratch
    run directory, behind the pipeline's thread adapters, on the real clock."""
    import torch

    from freshroll.engines import payload as pl
    from freshroll.engines.hf import HFEngine
    from freshroll.placement.adapters import ThreadEngineFactory, ThreadScorer, ThreadTrainer
    from freshroll.runtime.learner import new_learner
    from freshroll.runtime.prepare import prepare_run_dir

    torch.set_num_threads(thread_budget(cfg).trainer)
    torch.manual_seed(cfg.run.seed)
    scratch = tmp / "scratch"
    prep = prepare_run_dir(cfg, scratch, False, ())
    try:
        clock = RealClock()
        buf = SampleBuffer.open(open_ledger(scratch, sync="off"), _kernel(cfg), clock,
                                run_id="scratch",
                                initial_version=PolicyVersion.initial(prep.model_digest))
        learner, _ = new_learner(cfg, prep.model_path)
        path = prep.model_path
        factory = ThreadEngineFactory(lambda name: HFEngine.from_pretrained(path), cfg.limits)
        scorer = ThreadScorer(prep.rewards)
        trainer = ThreadTrainer(learner, buf, timeout_s=cfg.limits.train_timeout_s)
        w = Workload(
            prompts=prep.prompts, group_size=cfg.rollout.group_size,
            batch_groups=cfg.rollout.batch_groups, workers=cfg.rollout.workers,
            concurrency=cfg.rollout.call_batch, params=_params(cfg), seed=cfg.run.seed,
            max_steps=cfg.run.steps, reward_timeout_s=cfg.limits.reward_timeout_s,
            workflow=workflow_for(cfg),
        )
        plan = Plan(gen_samples=w.batch * (1 if quick else 3), train_steps=2 if quick else 4,
                    transfers=2 if quick else 3, train_warmup=1)
        try:
            return asyncio.run(measure(factory, scorer, trainer, buf, w, plan,
                                       payload=pl.encode))
        finally:
            scorer.close()
            trainer.close()
            buf.ledger.close()
    finally:
        prep.lock.release()


__all__ = ["measure_capacities"]

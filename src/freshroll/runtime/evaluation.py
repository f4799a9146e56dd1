"""Evaluation on a held-out set (``eval:``): the trainer's policy, greedy and/or sampled, scored
by the run's rewards every ``eval.every_steps`` committed steps and at the last step.

Where it runs: on the trainer's thread, inside the Checkpointer's ``before_commit`` of a due step
(after the step, before its commit), with the trainer's own copy of the model
(``model.eval()``, then its training mode restored; generation under
``torch.inference_mode``). Rollouts go on meanwhile; only the trainer waits, and never
longer than ``eval.budget_s`` (plus one decoding step): a batch is started only when the
time spent plus the slowest batch so far fits the budget, a generate call still running
when the budget is spent stops between two decoding steps (its batch dropped), and the
prompts not scored are counted as ``n_skipped``. An ``eval.max_new_tokens`` (or, unset,
``rollout.max_new_tokens``) that leaves no room for the eval prompts in the model's
positions is refused before the run writes anything.

What it writes: one line per mode to ``RUN_DIR/eval.jsonl``, and the same lines to the
ledger as one ``evaluated`` event, durable with the step's commit (so ``verify`` can bind the
file and the figures drawn from it; its completions are no training samples: no
``generated``/``rewarded`` event)::

    {"step": 10, "mode": "greedy", "reward": 0.41, "rewards": {"reverse": 0.41},
     "n_scored": 32, "n_failed": 0, "n_skipped": 0, "wall_s": 1.2, "budget_s": 30.0}

(``reward``: the mean weighted total over the completions a reward applied to, ``rewards``:
each reward function's mean, ``n_failed``: completions no reward applied to). From it, the
step's ``metrics.jsonl`` row gets ``eval/reward`` (and ``eval/reward_greedy`` /
``eval/reward_sampled`` with ``mode: both``), ``summary.json`` gets ``eval``. A step
evaluated but never committed (a kill between the two) is trained and evaluated again on
resume: :func:`trim` drops its line at the next start.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll.config import Config
from freshroll.engines.base import Completion
from freshroll.errors import ConfigError
from freshroll.figures.evals import (
    EVAL_FILE,
    eval_summary,
    evals_by_step,
    metrics_columns,
    read_eval,
    with_eval,
)
from freshroll.figures.metrics_log import read_rows, write_atomic
from freshroll.rewards.calling import RewardState, reward_columns
from freshroll.rewards.data import (
    chat_renderer,
    check_prompts,
    load_prompts,
)
from freshroll.rewards.scoring import RewardSet, Score
from freshroll.rewards.tasks import Prompt

#: prompts per generate call: the budget is checked between batches
EVAL_BATCH = 8

#: ``(prompts, mode, seed) -> one completion each``
Generate = Callable[[Sequence[Prompt], str, int], list[Completion]]
#: ``(prompts, completions) -> one score each``
ScoreFn = Callable[[Sequence[Prompt], Sequence[Completion]], list[Score]]


def modes_of(cfg: Config) -> tuple[str, ...]:
    mode = cfg.eval.mode
    return ("greedy", "sampled") if mode == "both" else (mode,)


def load_eval_prompts(cfg: Config, model: Path, tok: Any,
                      context: tuple[int | None, str] = (None, "")) -> list[Prompt]:
    """The first ``eval.n_prompts`` prompts of ``eval.file`` (task's prompt/answer/id fields),
    checked against the tokenizer and context as the task's are; [] when ``eval.file`` is
    unset. Every problem is one :class:`ConfigError` naming ``eval.file``."""
    e, t = cfg.eval, cfg.task
    if e.file is None:
        return []
    render = chat_renderer(tok, model=str(model), plain_fallback=cfg.model.path is None)
    try:
        prompts = load_prompts(e.file, t.prompt_field, t.answer_field, t.id_field,
                               split=e.split, render=render)[:e.n_prompts]
        check_prompts(prompts, tok, context[0], model=str(model), source=f"eval.file {e.file}",
                      limit_name=context[1])
    except ConfigError as exc:
        text = str(exc).replace("task.split=", "eval.split=")
        raise ConfigError(text if text.startswith("eval.file") else f"eval.file: {text}") from None
    return prompts


def check_eval_columns(rewards: RewardSet, prompts: Sequence[Prompt]) -> None:
    """The run's rewards find their columns in the eval prompts (refused before any write)."""
    if prompts:
        try:
            rewards.check_columns(reward_columns(list(prompts[:1])))
        except ConfigError as exc:
            raise ConfigError(f"eval.file: {exc}") from None


def prepare_eval(cfg: Config, model: Path, tok: Any, rewards: RewardSet,
                 context: tuple[int | None, str] = (None, "")) -> list[Prompt]:
    """The eval prompts, loaded and checked (prompts, tokenizer, context, reward columns)
    before a run writes anything; [] while ``eval.file`` is unset. ``tok``: the tokenizer
    when in memory (the embedded model before it is saved), else loaded from ``model``."""
    if cfg.eval.file is None:
        return []
    if tok is None:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        except Exception as exc:  # transformers raises many types for a folder without one
            raise ConfigError(f"eval.file: model {model}: cannot load its tokenizer "
                              f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    prompts = load_eval_prompts(cfg, model, tok, context)
    check_eval_columns(rewards, prompts)
    return prompts


@dataclass
class _Tally:
    totals: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0

    def add(self, scores: Sequence[Score]) -> None:
        for s in scores:
            if s.value is None:
                self.failed += 1
                continue
            self.totals.append(s.value)
            for name, v in s.components.items():
                self.parts.setdefault(name, []).append(v)


class OutOfBudget(Exception):
    """Raised inside a generate call (between two decoding steps) once the evaluation's
    ``eval.budget_s`` is spent: the call's batch is dropped and counted as skipped."""


def run_eval(prompts: Sequence[Prompt], modes: Sequence[str], generate: Generate,
             score: ScoreFn, *, step: int, budget_s: float, batch: int = EVAL_BATCH,
             now: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """One evaluation: the ``eval.jsonl`` line of each mode. Batches of ``batch`` prompts,
    each generated and scored in every mode (so the modes cover the same prompts); a batch
    starts only while the time spent plus the slowest batch so far is within ``budget_s``,
    and a batch whose generation raises :class:`OutOfBudget` (the budget spent inside the
    call) ends the evaluation, its prompts counted as skipped with those not reached."""
    t0 = now()
    tallies = {m: _Tally() for m in modes}
    done, slowest = 0, 0.0
    for i in range(0, len(prompts), batch):
        if now() - t0 + slowest > budget_s:
            break
        chunk = list(prompts[i:i + batch])
        c0 = now()
        try:
            scored = [(mode, score(chunk, generate(chunk, mode, i))) for mode in modes]
        except OutOfBudget:
            break
        for mode, scores in scored:
            tallies[mode].add(scores)
        slowest = max(slowest, now() - c0)
        done += len(chunk)
    wall = now() - t0
    return [{
        "step": step, "mode": mode,
        "reward": statistics.fmean(t.totals) if t.totals else None,
        "rewards": {k: statistics.fmean(v) for k, v in sorted(t.parts.items())},
        "n_scored": done, "n_failed": t.failed, "n_skipped": len(prompts) - done,
        "wall_s": round(wall, 4), "budget_s": budget_s,
    } for mode, t in tallies.items()]


def eval_seed(run_seed: int, step: int, offset: int) -> int:
    """The sampled mode's seed of the batch at ``offset`` of the eval at ``step``."""
    return (run_seed * 1_000_003 + step * 10_007 + offset) % (2**63 - 1)


#: ``checkpoint state -> the model to evaluate`` (the learner's own, or one loaded with it)
Policy = Callable[[Callable[[], tuple[dict[str, Any], dict[str, Any]]]], Any]


class Evaluator:
    """The run's evaluation: when it is due, and running it on a model (``eval.jsonl``).

    ``policy``: the model after a step from the Checkpointer's ``before_commit`` state (see
    :func:`build_evaluator`)."""

    def __init__(self, cfg: Config, prompts: Sequence[Prompt], rewards: RewardSet,
                 tokenizer: Any, run_dir: Path, policy: Policy) -> None:
        self.cfg, self.prompts, self.rewards = cfg, list(prompts), rewards
        self.tokenizer, self.policy = tokenizer, policy
        self.path = run_dir / EVAL_FILE
        self.now: Callable[[], float] = time.monotonic  # the budget's clock inside a call

    def due(self, step: int) -> bool:
        return step % self.cfg.eval.every_steps == 0 or step == self.cfg.run.steps

    def evaluate(self, step: int, model: Any) -> list[dict[str, Any]]:
        """Evaluate ``model`` (the policy after ``step``) and append its lines to eval.jsonl."""
        import torch

        from freshroll.engines.hf import HFEngine

        cfg = self.cfg
        training = bool(model.training)
        device = next(iter(model.parameters())).device
        engine = HFEngine(model, self.tokenizer, device=device)  # model.eval(), not a copy
        max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
        r = cfg.rollout

        def generate(chunk: Sequence[Prompt], mode: str, offset: int) -> list[Completion]:
            greedy = mode == "greedy"
            return engine.generate([p.text for p in chunk], max_new_tokens=max_new,
                                   temperature=0.0 if greedy else r.temperature,
                                   top_p=1.0 if greedy else r.top_p,
                                   seed=eval_seed(cfg.run.seed, step, offset),
                                   top_k=0 if greedy else r.top_k,
                                   min_p=0.0 if greedy else r.min_p,
                                   repetition_penalty=1.0 if greedy else r.repetition_penalty)

        state = RewardState(global_step=step, max_steps=cfg.run.steps)

        def score(chunk: Sequence[Prompt], comps: Sequence[Completion]) -> list[Score]:
            return self.rewards.score_prompts(list(chunk), [c.text for c in comps],
                                              [c.token_ids for c in comps], state)

        deadline = self.now() + cfg.eval.budget_s

        def within_budget(decode_step: int) -> None:  # a long generate call stops in time
            if self.now() > deadline:
                raise OutOfBudget(f"eval.budget_s {cfg.eval.budget_s} spent at step {step}")

        engine.between_steps = within_budget
        try:
            with torch.no_grad():
                rows = run_eval(self.prompts, modes_of(cfg), generate, score, step=step,
                                budget_s=cfg.eval.budget_s)
        finally:
            model.train(training)
        with self.path.open("a") as fh:
            fh.write("".join(json.dumps(row, allow_nan=False) + "\n" for row in rows))
        return rows


def build_evaluator(cfg: Config, prompts: Sequence[Prompt], model_path: Path, run_dir: Path,
                    trainer: Any) -> Evaluator | None:
    """The run's :class:`Evaluator` (None while ``eval.file`` is unset). An in-process trainer
    (:class:`~freshroll.placement.adapters.ThreadTrainer`) is evaluated on its learner's model
    itself; any other (a Ray trainer actor) on a copy of the initial model loaded with the
    state the checkpoint hook fetches. Its own :class:`RewardSet`, built from the config:
    the run's reward thread keeps its own (user code need not be thread-safe)."""
    if cfg.eval.file is None or not prompts:
        return None
    from transformers import AutoTokenizer

    from freshroll.placement.adapters import ThreadTrainer
    from freshroll.rewards.scoring import ImportBound, build_reward_set

    lim = cfg.limits
    rewards = build_reward_set([e.model_dump(exclude_none=True) for e in cfg.rewards],
                               ImportBound(lim.reward_import_timeout_s, lim.heartbeat_s))
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    policy: Policy
    if isinstance(trainer, ThreadTrainer):
        learner = trainer.learner
        policy = lambda state: learner.model  # noqa: E731
    else:
        policy = _loaded_policy(model_path)
    return Evaluator(cfg, prompts, rewards, tok, run_dir, policy)


def _loaded_policy(model_path: Path) -> Policy:
    """A model of its own, loaded with the trainer's state at each evaluation."""
    held: list[Any] = []

    def policy(state: Callable[[], tuple[dict[str, Any], dict[str, Any]]]) -> Any:
        if not held:
            from transformers import AutoModelForCausalLM

            from freshroll.engines.model_dir import loading_model

            with loading_model(model_path):
                held.append(AutoModelForCausalLM.from_pretrained(model_path,
                                                                 local_files_only=True))
        held[0].load_state_dict(state()[0])
        return held[0]

    return policy


def trim(run_dir: Path, committed_step: int) -> int:
    """Drop ``eval.jsonl``'s lines of steps after ``committed_step`` (evaluated, then killed
    before the commit: the step is trained and evaluated again); the lines dropped."""
    path = run_dir / EVAL_FILE
    if not path.is_file():
        return 0
    rows, bad = read_rows(path)
    keep = [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= committed_step]
    if len(keep) != len(rows) or bad:
        write_atomic(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in keep))
    return len(rows) - len(keep)


__all__ = [
    "EVAL_FILE",
    "Evaluator",
    "OutOfBudget",
    "build_evaluator",
    "check_eval_columns",
    "eval_summary",
    "evals_by_step",
    "load_eval_prompts",
    "metrics_columns",
    "read_eval",
    "run_eval",
    "trim",
    "with_eval",
]

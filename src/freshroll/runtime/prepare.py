"""Checks and writes before a run starts: every input first, then the run directory.

Before any write: the directory (new, or holding a run to resume), the rewards
(importable), the prompts (loadable, checked against the tokenizer), the model
(``model.path`` checked by :func:`freshroll.engines.model_dir.check_model_dir`, or the embedded
model built in memory) and, on resume, the config in force against the ledger's
(:mod:`freshroll.runtime.resume`). Only then ``config.yaml`` and ``model/`` are written, each
atomically, and the directory is locked (:mod:`freshroll.runtime.rundir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll import crashpoints
from freshroll.config import Config
from freshroll.engines.model_dir import check_model_dir, quiet_transformers
from freshroll.engines.specs import check_engine, engine_spec
from freshroll.envs.registry import workflow_for
from freshroll.errors import ConfigError, LedgerError, ResumeError
from freshroll.ledger.lineage import PolicyVersion, input_digests
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.observe.monitors import check_monitors
from freshroll.pipeline.steering import control_config
from freshroll.rewards.calling import reward_columns
from freshroll.rewards.data import (
    chat_renderer,
    check_prompts,
    load_prompts,
)
from freshroll.rewards.scoring import ImportBound, RewardSet, build_reward_set
from freshroll.rewards.tasks import Prompt, make_prompts
from freshroll.runtime.resume import (
    Change,
    History,
    check,
    check_model,
    check_steps,
    diff,
    flatten,
    history,
)
from freshroll.runtime.rundir import (
    RunDirLock,
    check_out_dir,
    lock_run_dir,
    resume_config,
    write_text_atomic,
)


@dataclass
class Prepared:
    """A run directory checked, locked and written (config.yaml, model/), ready to open."""

    cfg: Config
    lock: RunDirLock
    prompts: list[Prompt]
    rewards: RewardSet
    model_path: Path
    model_digest: str
    history: History | None = None  # what the ledger recorded (on resume)
    changes: list[Change] = field(default_factory=list)  # accepted on resume
    allow_change: tuple[str, ...] = ()
    eval_prompts: list[Prompt] = field(default_factory=list)  # eval.file's (evaluation)
    #: the sha256 of every file of the run directory's model/ and inputs/, as written and
    #: read now (``run_config.input_files``: verify binds them to the ledger)
    input_files: dict[str, str] = field(default_factory=dict)


def prepare_run_dir(
    cfg: Config | None, out: Path, resume: bool, allow_change: tuple[str, ...] = ()
) -> Prepared:
    """Check everything that can be checked, lock ``out``, then write its first files.

    Before any write: the directory (new, or holding a run to resume), the rewards
    (importable), the prompts (loadable), the model (``model.path``'s config.json and
    weights, or the embedded model built in memory) and, on resume, the config in force
    against the ledger's (:mod:`freshroll.runtime.resume`). Only then ``config.yaml`` and
    ``model/`` are written, each atomically. A resume locks the directory first (it
    reads the ledger); a new run locks it once every check passed.
    """
    if allow_change and not resume:
        raise ConfigError("--allow-change applies only with --resume")
    check_out_dir(out, resume=resume)
    lock = lock_run_dir(out) if resume else None
    try:
        if cfg is None:
            cfg = resume_config(out)
        inputs = check_inputs(cfg, out, resume)
        path, pending, prompts, rewards = (inputs.model_path, inputs.pending, inputs.prompts,
                                           inputs.rewards)
        digest = inputs.digest or _digest(inputs)
        eval_prompts = inputs.eval_prompts
        hist: History | None = None
        changes: list[Change] = []
        if resume:
            hist, changes = _check_resume(cfg, out, digest, allow_change)
            changes += reward_change(hist, str(rewards.version), cfg.run.reward_versions,
                                     str(out))
        if lock is None:
            lock = lock_run_dir(out)
            check_out_dir(out, resume=False)  # another process may have started it meanwhile
            crashpoints.reach("rundir")
        write_text_atomic(out / "config.yaml", cfg.to_yaml())
        crashpoints.reach("config")
        if pending is not None:
            from freshroll.engines.tiny import save_model_dir

            save_model_dir(*pending, path)
        files = input_digests(out)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return Prepared(cfg, lock, prompts, rewards, path, digest, hist, changes, allow_change,
                    eval_prompts, files)


def _eval_prompts(cfg: Config, path: Path, pending: tuple[Any, Any] | None,
                  rewards: RewardSet) -> list[Prompt]:
    """``eval.file``'s prompts, checked as the task's are ([] while unset)."""
    if cfg.eval.file is None:
        return []
    from freshroll.runtime.evaluation import prepare_eval

    return prepare_eval(cfg, path, pending[1] if pending is not None else None, rewards,
                        context_limit(cfg, path, pending, evaluation=True))


@dataclass
class Inputs:
    """A run's inputs, each checked as the run would use it: no weights read, nothing written."""

    prompts: list[Prompt]
    rewards: RewardSet
    model_path: Path  # a user's model.path, or where the embedded model is (to be) saved
    pending: tuple[Any, Any] | None  # the embedded model and tokenizer, still to be saved
    digest: str | None = None  # the simulated cluster's (no weights); else read by _digest
    eval_prompts: list[Prompt] = field(default_factory=list)  # eval.file's ([] while unset)


def check_on_update(cfg: Config) -> None:
    """``rollout.on_update: continue | abort`` on the hf engine swaps weights under a running
    call, which only an inline worker does: a process or Ray worker loads between calls, so
    the setting would silently mean ``finish`` there (docs/freshness.md)."""
    from freshroll.placement.placement import resolve_runtime

    mode = cfg.rollout.on_update
    spec = engine_spec(cfg.rollout.engine)
    if mode in ("continue", "abort") and not spec.own_concurrency \
            and (runtime := resolve_runtime(cfg)) not in spec.swap_placements:
        how = " (run.runtime: auto chose it)" if cfg.run.runtime == "auto" else ""
        raise ConfigError(f"rollout.on_update: {mode} on the {spec.name} engine needs run.runtime: "
                          f"inline, not {runtime}{how}: its {runtime} workers load weights "
                          "between calls; set run.runtime=inline (or another on_update)")


def check_inputs(cfg: Config, run_dir: Path | None = None, resume: bool = False) -> Inputs:
    """Every check of a run's inputs before it trains, with no write and no weights read:
    the rewards (importable, callable), the controller's bounds, the episode workflow
    (registered), the model directory
    (:func:`~freshroll.engines.model_dir.check_model_dir`: config, tokenizer files, the
    safetensors headers) and, for vLLM, its runtime and engine arguments; the prompts
    (loadable, rendered, checked against the tokenizer and the context) and the columns the
    rewards need. ``freshroll config check`` and ``run`` both call this one function.

    ``run_dir`` is where the embedded model is saved (None: ``config check``, which builds it
    in memory only); on ``resume`` a run's saved ``model/`` is read instead of a new build.
    """
    check_engine(cfg.rollout.engine)  # built in or registered with a placement
    check_monitors(cfg.monitor)
    check_on_update(cfg)
    from freshroll.placement.placement import check_world_size

    check_world_size(cfg)  # the trainer's ranks fit their placement
    lim = cfg.limits
    rewards = build_reward_set([e.model_dump(exclude_none=True) for e in cfg.rewards],
                               ImportBound(lim.reward_import_timeout_s, lim.heartbeat_s))
    control_config(cfg)  # the controller's bounds (control vs rollout), before any write
    workflow_for(cfg)  # a registered episode workflow that suits the config, before any write
    pending: tuple[Any, Any] | None = None
    digest = None
    if not engine_spec(cfg.rollout.engine).trains:  # no model: the built-in task's prompts
        path, digest = Path(), sim_model_digest(cfg)
        name, n, params = cfg.task.builtin()
        prompts = make_prompts(name, n, cfg.run.seed, **params)
    else:  # a model: transformers' progress bars off first (the simulated cluster has none)
        quiet_transformers()
        path, pending = _initial_model(cfg, run_dir, resume)
        _check_lora(cfg, path, pending)
        if cfg.rollout.engine == "vllm":
            _check_vllm(cfg, path, pending)
        prompts = load_task_prompts(cfg, path, pending[1] if pending is not None else None,
                                    context=context_limit(cfg, path, pending))
    rewards.check_columns(reward_columns(prompts[:1]))
    return Inputs(prompts, rewards, path, pending, digest,
                  _eval_prompts(cfg, path, pending, rewards))


def _check_lora(cfg: Config, path: Path, pending: tuple[Any, Any] | None) -> None:
    """``trainer.lora`` on the model's skeleton (:func:`~freshroll.trainer.lora.
    check_on_skeleton`), before any write."""
    if cfg.trainer.lora is None:
        return
    from freshroll.trainer.lora import check_on_skeleton

    if pending is not None:
        model_config = pending[0].config
    else:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(path, local_files_only=True)
    check_on_skeleton(model_config, cfg.trainer.lora)


def _digest(inputs: Inputs) -> str:
    """The initial model's digest (its weights read: the lineage root)."""
    from freshroll.engines.tiny import model_digest

    if inputs.pending is not None:
        return model_digest(inputs.pending[0])
    try:
        return model_digest(inputs.model_path)
    except ConfigError:
        raise
    except Exception as exc:  # safetensors raises its own errors for garbage weights
        raise ConfigError(f"model.path: {inputs.model_path}: weights do not load: "
                          f"{exc}"[:500]) from None


def sim_model_digest(cfg: Config) -> str:
    """The simulated cluster's stand-in for a model digest (the lineage root, needed before
    the buffer exists; it also checks ``sim.params``)."""
    from freshroll.sim.components import sim_model_digest as of_sim

    digest: str = of_sim(cfg)
    return digest


def _initial_model(
    cfg: Config, run_dir: Path | None, resume: bool
) -> tuple[Path, tuple[Any, Any] | None]:
    """The initial model's dir, and the embedded model still to save there.

    A user's ``model.path`` is checked in place; the embedded tiny model is built in memory
    (a new run always builds it; a resume reuses the run's ``model/`` when present).
    transformers is imported here, not at module level: a simulated run never loads it.
    """
    from freshroll.engines.tiny import build_tiny

    if cfg.model.path is not None:
        path = Path(cfg.model.path)
        check_model_dir(path)
        return path, None
    path = run_dir / "model" if run_dir is not None else Path("model")
    if resume and (path / "config.json").is_file():
        return path, None
    try:
        model, tokenizer = build_tiny(cfg.model.tiny_seed, **cfg.model.tiny.overrides())
    except Exception as exc:  # a bad override of the tiny config
        raise ConfigError(f"model.tiny: {exc}"[:500]) from None
    return path, (model, tokenizer)


def _check_vllm(cfg: Config, path: Path, pending: tuple[Any, Any] | None) -> None:
    """``rollout.engine: vllm``: the runtime, the device, ``vllm.engine_args`` and the model's
    head size, refused before anything is written (a vLLM start takes ~30 s)."""
    from freshroll.engines.vllm_args import check_config

    if pending is not None:
        where = Path("model.tiny (the embedded model)")
        config = pending[0].config.to_dict()
    else:
        where = path
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model {path}: cannot read config.json ({exc})") from exc
    check_config(cfg, config, where, embedded=pending is not None)


def reward_change(hist: History, now: str, policy: str, where: str) -> list[Change]:
    """A resume under another reward version than the ledger's last (``run.reward_versions``):
    refused under ``single``; else the change ``rewards.version``, printed and recorded in the
    ledger with the resume's settings changes."""
    if hist.reward_version is None or hist.reward_version == now:
        return []
    if policy == "single":
        raise ResumeError(
            f"{where}: the reward functions changed since the run's last start (reward version "
            f"{hist.reward_version} -> {now}) and run.reward_versions is single: undo the edit, "
            "start a new run (another --out), or resume with run.reward_versions=allow_change "
            "to continue under both (recorded in the ledger)")
    return [Change("rewards.version", hist.reward_version, now, "free")]


def _check_resume(
    cfg: Config, out: Path, digest: str, allow: tuple[str, ...]
) -> tuple[History, list[Change]]:
    """Compare the config in force and the model with what the ledger recorded."""
    try:
        if (out / LEDGER_FILE).is_file():
            with Ledger(out / LEDGER_FILE, readonly=True) as ledger:
                hist = history(e for _, e in ledger.events())
        else:  # a start killed before its ledger existed: nothing ran (check_out_dir)
            hist = history(())
    except LedgerError as exc:  # nothing recoverable to continue: refused, nothing written
        raise ResumeError(f"{out}: cannot resume: {exc}") from exc
    check_steps(cfg.run.steps, hist.step, str(out))
    now = flatten(cfg.model_dump(mode="json"))
    recorded = hist.recorded()
    compared = now if hist.config is not None else {k: now[k] for k in recorded}
    changes = diff(recorded, compared, flatten(Config().model_dump(mode="json")))
    accepted = check(changes, set(allow), known=set(now), step=hist.step, where=str(out))
    model = cfg.model.path or str(out / "model")
    check_model(hist.initial_version, str(PolicyVersion.initial(digest)), model, str(out))
    if engine_spec(cfg.rollout.engine).trains:  # a learner to rebuild: at the steps' world size
        from freshroll.runtime.learner import check_replay_ranks

        check_replay_ranks(cfg, out, hist)
    return hist, accepted


def context_limit(
    cfg: Config, path: Path, pending: tuple[Any, Any] | None, *, evaluation: bool = False
) -> tuple[int | None, str]:
    """The most tokens a prompt may have, and its name in an error: ``task.max_prompt_tokens``
    where it is the tighter bound, else the model's positions (:func:`_model_limit`) less the
    tokens a call generates after it (``rollout.max_new_tokens``; for an ``evaluation``,
    ``eval.max_new_tokens``, else the rollouts'), as vLLM refuses a prompt whose completion
    cannot fit ``max_model_len``. A count that leaves no position for a prompt is refused,
    naming its key: it can never finish a completion (with a rotary model it would generate
    past the positions it was trained on, silently; with learned positions it fails mid-run;
    an evaluation held the trainer for the whole ``eval.budget_s``)."""
    limit, name = _model_limit(cfg, path, pending)
    key, new = "rollout.max_new_tokens", cfg.rollout.max_new_tokens
    if evaluation and cfg.eval.max_new_tokens:
        key, new = "eval.max_new_tokens", cfg.eval.max_new_tokens
    if limit is not None:
        if new >= limit:
            what = "an evaluation's" if key.startswith("eval") else "a rollout's"
            raise ConfigError(f"{key} ({new}): the model has {limit} positions ({name}); {what} "
                              f"prompt and completion must fit them: at most {limit - 1}")
        limit, name = limit - new, f"{name} less {key} ({new})"
    most = cfg.task.max_prompt_tokens
    if most is not None and (limit is None or most < limit):
        return most, f"task.max_prompt_tokens ({most})"
    return limit, name


def _model_limit(
    cfg: Config, path: Path, pending: tuple[Any, Any] | None
) -> tuple[int | None, str]:
    """The positions a prompt and its completion share (hf: ``max_position_embeddings``;
    vllm: ``vllm.max_model_len`` where set), and their name in an error; ``(None, "")`` when
    the model's config names no limit. :func:`context_limit` leaves the completion's tokens
    out of it, so a prompt never fills the whole context (vLLM's rule too)."""
    if cfg.rollout.engine == "vllm" and cfg.vllm.max_model_len is not None:
        mml = cfg.vllm.max_model_len
        return mml, f"vllm.max_model_len {mml}"
    if pending is not None:
        config = pending[0].config.to_dict()
        where = "the embedded model (model.tiny)"
    else:
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):  # checked (and refused) with the model before this
            return None, ""
        where = str(path)
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None, ""
    return limit, f"the max_position_embeddings of {where}"


def load_task_prompts(cfg: Config, model: Path, tok: Any = None,
                      context: tuple[int | None, str] = (None, "")) -> list[Prompt]:
    """The run's prompts, chat prompts rendered and all checked against ``model``'s tokenizer
    (``tok``, when it is already in memory: the embedded model before it is saved) and its
    context (``context``: :func:`context_limit`), before the run's clock starts.

    The embedded tiny model has no chat template: its chat prompts are the messages'
    contents joined by a space (:func:`~freshroll.rewards.data.plain_chat_text`).
    """
    from transformers import AutoTokenizer

    if tok is None:
        try:
            tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        except Exception as exc:  # transformers raises many types for a folder without one
            raise ConfigError(f"model {model}: cannot load its tokenizer "
                              f"({type(exc).__name__}: {str(exc)[:300]})") from exc
    t = cfg.task
    if t.file is not None:
        render = chat_renderer(tok, model=str(model), plain_fallback=cfg.model.path is None)
        prompts = load_prompts(t.file, t.prompt_field, t.answer_field, t.id_field,
                               split=t.split, render=render)
    else:
        name, n, params = t.builtin()
        prompts = make_prompts(name, n, cfg.run.seed, **params)
    source = f"task.file {t.file}" if t.file is not None else f"task {t.name!r}"
    check_prompts(prompts, tok, context[0], model=str(model), source=source,
                  limit_name=context[1])
    return prompts

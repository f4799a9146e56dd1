"""Resume rules: which settings may change when ``freshroll run --resume`` continues a run.

A resume compares the config in force (the run's ``config.yaml``, or a CONFIG given with
``--resume``, with the ``key=value`` overrides applied on top) with the last config the
ledger recorded (its last ``run_config`` event), key by key (``section.field``; a whole
list or mapping value such as ``rewards`` or ``task.params`` is one key), and sorts every
differing key into one of three classes:

==========  ==============================================================================
free        may change on any resume (``run.steps``, ``run.progress``, checkpointing, the
            number of workers, ...): applied, and recorded in a ``settings_changed`` event
explicit    changes training from the resume on (``trainer.lr``, ``run.max_staleness``,
            the loss settings, sampling): refused unless named with ``--allow-change KEY``;
            then recorded (``settings_changed``, with old and new values) and applied in full
never       would mix incompatible samples or break lineage within one run (the model, the
            task and prompts, the rewards, ``group_size``, ``batch_groups``, the seed):
            always refused; start a new run
==========  ==============================================================================

``run.steps`` is free, but can only grow: a resume whose ``run.steps`` is below the steps
the ledger has already committed is refused (:func:`check_steps`), since nothing it admitted
could ever be trained.

A key takes the class of its longest listed prefix (``limits`` covers every
``limits.*`` key); a key no rule lists is ``explicit``, the safe side. A key missing from
an older recorded config counts as unchanged when the config in force holds its default.
The model is also checked by digest (:func:`check_model`): a model whose step-0 policy
version differs from the ledger's is refused whatever its path says.

Pure: dictionaries and ledger events in, decisions or :class:`~freshroll.errors.ResumeError`
out. Applying a decision (to the kernel, the learner, the ledger) is :mod:`.run`'s job.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from freshroll.config.data import BUILTIN_TASK
from freshroll.config.train import TRAINER_BEFORE
from freshroll.errors import ResumeError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import digest_of, policy_step

Rule = Literal["free", "explicit", "never"]

#: config key (or section prefix) -> what a resume may do with it
RULES: Final[Mapping[str, Rule]] = {
    # run
    "run.seed": "never",             # fixes the prompt order and every sampling seed
    "run.steps": "free",
    "run.max_staleness": "explicit",  # eta: which samples the trainer may consume
    "run.staleness_basis": "explicit",  # the lag eta bounds: which samples may be consumed
    "run.admission_window": "free",  # groups in flight: speed and discards, eta holds at lease
    "run.staleness_policy": "free",  # which ready groups a step takes: eta holds at lease
    "run.torch_threads": "free",
    "run.runtime": "free",           # where workers run, not what they compute
    "run.progress": "free",
    "run.reward_versions": "free",   # what a resume may do, not what a step computes
    "run.ray_address": "free",       # which cluster, not what it computes
    # the model, the task and the rewards define what the ledger's samples are
    "model": "never",
    "task": "never",
    "rewards": "never",
    # evaluation reads the policy, never trains it: no sample of the ledger depends on it
    "eval": "free",
    # rollout
    "rollout.group_size": "never",   # a group's size is fixed by its admission
    "rollout.batch_groups": "never",  # groups per step: fixed by the run's admission window
    "rollout.workers": "free",
    "rollout.worker_batch": "free",
    "rollout.max_inflight_groups": "free",
    "rollout.max_new_tokens": "explicit",
    "rollout.temperature": "explicit",
    "rollout.top_p": "explicit",
    "rollout.top_k": "explicit",          # TRL's sampling knobs: what a sample is drawn from
    "rollout.min_p": "explicit",
    "rollout.repetition_penalty": "explicit",
    "rollout.engine": "never",       # the samples of a simulated run are not a model's
    "rollout.on_update": "explicit",  # which weights a continued request's tokens come from
    "rollout.workflow": "explicit",  # what an episode is: the samples from the resume on
    "tools": "explicit",             # what a tool turn holds and when it fails
    # who sets the live settings, and how: they change speed, never what a sample is
    "control": "free",
    "tail": "explicit",              # a deadline changes which samples a group keeps
    "sim": "explicit",               # the workload itself
    "sim.clock": "free",
    "sim.time_scale": "free",
    "vllm": "explicit",              # dtype, device, on_update, engine args: the numerics
    "vllm.kv_cache_gib": "free",     # memory and batch size: speed, not what a sample is
    "vllm.gpu_memory_utilization": "free",
    "vllm.max_num_seqs": "free",
    "ray": "free",                   # actor resources: placement, not numerics
    # trainer: what a step computes is explicit; where and how often it is saved is free
    "trainer": "explicit",
    "trainer.lr_schedule": "explicit",  # as trainer.lr: the lr of every step from the resume on
    "trainer.warmup_steps": "explicit",
    "trainer.grad_accum": "explicit",   # the same gradient, in other float sums: new weights
    "trainer.bf16": "explicit",         # other arithmetic: other weights
    "trainer.gradient_checkpointing": "free",  # memory: the same gradients, recomputed
    "trainer.checkpoint_every": "free",
    "trainer.keep_checkpoints": "free",
    "trainer.lora": "never",            # the model's structure: which weights a step trains
    # failure and time limits: how the run reacts, not what it trains
    "limits": "free",
    "monitor": "free",                  # who watches the run, not what it trains
}

_ABSENT: Final = "<absent>"


def rule_of(key: str) -> Rule:
    """The class of ``key``: its own rule, else its longest listed prefix's, else explicit."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = RULES.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    return "explicit"


def flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """``{"trainer": {"lr": 1e-3}, "rewards": [..]}`` -> ``{"trainer.lr": 1e-3, "rewards": [..]}``.

    One level: a section's fields are keys; a field's value is compared whole.
    """
    out: dict[str, Any] = {}
    for section, value in config.items():
        if isinstance(value, Mapping):
            for name, inner in value.items():
                out[f"{section}.{name}"] = inner
        else:
            out[section] = value
    return out


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any
    rule: Rule

    def render(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def diff(
    old: Mapping[str, Any], new: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> list[Change]:
    """Every key whose value differs between two *flattened* configs, sorted by key.

    A key absent from ``old`` (recorded by an older freshroll) whose new value is its
    default in ``defaults`` is not a change.
    """
    defaults = defaults or {}
    changes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if before == _ABSENT and key in defaults and after == defaults[key]:
            continue
        if before != after:
            changes.append(Change(key, before, after, rule_of(key)))
    return changes


def check(
    changes: Iterable[Change], allow: Collection[str], *, known: Collection[str], step: int,
    where: str,
) -> list[Change]:
    """Accept ``changes`` or raise :class:`ResumeError` naming every key that cannot change.

    ``allow``: the keys the user named with ``--allow-change``; each must be a key of the
    config (``known``) whose class is explicit and whose value changes. Returns the
    accepted changes (free ones and explicitly allowed ones).
    """
    changes = list(changes)
    changed = {c.key: c for c in changes}
    for key in sorted(allow):
        if key not in known:
            raise ResumeError(f"{where}: --allow-change {key}: not a config key")
        if rule_of(key) == "free":
            raise ResumeError(
                f"{where}: --allow-change {key}: {key} may change on resume without it"
            )
        if rule_of(key) == "never" and key not in changed:
            raise ResumeError(
                f"{where}: --allow-change {key}: {key} can never change within a run"
            )
        if rule_of(key) == "explicit" and key not in changed:
            raise ResumeError(f"{where}: --allow-change {key}: {key} is unchanged")
    never = [c for c in changes if c.rule == "never"]
    denied = [c for c in changes if c.rule == "explicit" and c.key not in allow]
    problems = []
    if never:
        problems.append(
            f"{_keys(never)} cannot change within a run ({_details(never)}): they define "
            "what the ledger's samples and policy versions mean; undo the change, or start "
            "a new run (another --out)"
        )
    if denied:
        flags = " ".join(f"--allow-change {c.key}" for c in denied)
        problems.append(
            f"{_details(denied)} would change training from step {step} on; pass {flags} "
            "to apply it and record it in the ledger, or undo the change"
        )
    if problems:
        raise ResumeError(f"{where}: resume refused: " + "; ".join(problems))
    return changes


def check_steps(steps: int, committed: int, where: str) -> None:
    """Refuse a ``run.steps`` below the ``committed`` steps: steps can only grow."""
    if steps < committed:
        raise ResumeError(
            f"{where}: resume refused: run.steps={steps}, but the run already has {committed} "
            f"committed steps; steps can only grow (run.steps >= {committed}), or start a new "
            "run (another --out)"
        )


def check_model(recorded: str | None, current: str, model: str, where: str) -> None:
    """Refuse a model whose step-0 policy version is not the ledger's (``recorded``)."""
    if recorded is not None and recorded != current:
        raise ResumeError(
            f"{where}: resume refused: model: {model} gives step-0 policy version {current}, "
            f"but this run started from {recorded} (another model, or its files changed); "
            "resume with the run's model, or start a new run (another --out)"
        )


@dataclass
class History:
    """What a ledger recorded about the configs of its run (see :func:`history`)."""

    initial_version: str | None = None  # step 0's policy version
    step: int = 0  # the last committed step
    config: dict[str, Any] | None = None  # the last run_config's config
    reward_version: str | None = None  # the last run_config's (None: not recorded)
    opened: ev.Opened | None = None  # the last opened event
    #: committed step -> (config in force when it was trained, or None, its settings digest)
    steps: dict[int, tuple[dict[str, Any] | None, str]] = field(default_factory=dict)

    def recorded(self) -> dict[str, Any]:
        """The flattened recorded config; for a ledger without ``run_config`` (an older
        freshroll), the settings its last ``opened`` event names."""
        if self.config is not None:
            return flatten(self.config)
        if self.opened is None:
            return {}
        o = self.opened
        return {
            "run.max_staleness": o.max_staleness, "rollout.batch_groups": o.batch_groups,
            "rollout.group_size": o.group_size, "rollout.max_inflight_groups":
            o.max_inflight_groups,
        }


def history(events: Iterable[ev.Event]) -> History:
    """One pass over a ledger's events (in order)."""
    h = History()
    for e in events:
        if isinstance(e, ev.PolicyPublished) and e.parent is None and h.initial_version is None:
            h.initial_version = e.version
        elif isinstance(e, ev.Opened):
            h.opened = e
        elif isinstance(e, ev.RunConfig):
            h.config = with_recorded_defaults(json.loads(e.config))
            h.reward_version = e.reward_version
        elif isinstance(e, ev.Committed):
            h.step = policy_step(e.version)
            h.steps[h.step] = (h.config, e.settings_digest)
    return h


def with_recorded_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded config with the trainer keys an earlier freshroll did not record set to what
    it trained with (:data:`~freshroll.config.train.TRAINER_BEFORE`): resuming such a run
    under today's default is a change of training, and its replay runs the old kernel. A
    dataset's run (``task.file``) recorded by an earlier freshroll with the built-in task's
    keys holds them as null, as the config does now (they never applied)."""
    trainer = config.get("trainer")
    if isinstance(trainer, dict):
        for key, value in TRAINER_BEFORE.items():
            trainer.setdefault(key, value)
    task = config.get("task")
    if isinstance(task, dict) and task.get("file") is not None:
        task.update(dict.fromkeys(BUILTIN_TASK))
    return config


def canonical(config: Mapping[str, Any]) -> str:
    """The canonical JSON text of a config (sorted keys, no spaces)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def announce(
    config: Mapping[str, Any], changes: Iterable[Change], allow: Collection[str], *,
    step: int, model_digest: str, ts: float, reward_version: str | None = None,
    input_files: dict[str, str] | None = None,
) -> list[ev.RunConfig | ev.SettingsChanged]:
    """The events a start or resume writes with its ``opened``: the changes, then the config
    (with ``input_files``: the run directory's inputs' sha256, verify's binding of them)."""
    out: list[ev.RunConfig | ev.SettingsChanged] = []
    changes = list(changes)
    if changes:
        out.append(ev.SettingsChanged(
            ts=ts, step=step, keys=[c.key for c in changes],
            old=canonical({c.key: None if c.old == _ABSENT else c.old for c in changes}),
            new=canonical({c.key: None if c.new == _ABSENT else c.new for c in changes}),
            allowed=sorted(c.key for c in changes if c.key in allow),
        ))
    text = canonical(config)
    out.append(ev.RunConfig(
        ts=ts, step=step, config=text, config_digest=digest_of(text), model_digest=model_digest,
        reward_version=reward_version, input_files=input_files,
    ))
    return out


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value)


def _keys(changes: list[Change]) -> str:
    return ", ".join(c.key for c in changes)


def _details(changes: list[Change]) -> str:
    return ", ".join(c.render() for c in changes)


__all__ = [
    "RULES", "Change", "History", "Rule", "announce", "canonical", "check", "check_model",
    "check_steps", "diff", "flatten", "history", "rule_of",
]

"""Typed run configuration: YAML file + ``key=value`` overrides, unknown keys rejected.

Every section is a pydantic model with ``extra="forbid"``, so a typo such as
``trainer.lr_rate`` is an error that names the key. Overrides use dotted paths
(``trainer.lr=1e-3``, ``run.max_staleness=0``) and YAML scalars (``true``,
``1e-3``, ``[1, 2]``). :func:`load_config` returns the validated config; the
run directory stores its fully resolved form (``config.yaml``), which is what
``--resume`` reads back.

Refused with a :class:`~freshroll.errors.ConfigError` naming the file or key: a file that
is not UTF-8 text or not YAML, a mapping that holds one key twice (both:
:mod:`freshroll.config.yamlfile`), and a boolean given for a number (``run.steps: true``;
pydantic's lax mode would read it as 1).

The sections live beside this module by group, and are imported from here: the run and its
live steering (:mod:`freshroll.config.run`: run, control, tail), the prompts and rewards
(:mod:`freshroll.config.data`: task, eval, rewards), the policy and its training
(:mod:`freshroll.config.train`: model, trainer), generation (:mod:`freshroll.config.rollout`:
rollout, vllm, sim), the operational ones (:mod:`freshroll.config.ops`: limits, ray, monitor),
all on :mod:`freshroll.config.base`. This module joins them into :class:`Config` and reads,
overrides and validates a config.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from freshroll.config.base import _Section, key_errors
from freshroll.config.data import EvalSection, RewardEntry, TaskSection
from freshroll.config.ops import LimitsSection, MonitorSection, RaySection
from freshroll.config.rollout import RolloutSection, SimSection, ToolsSection, VLLMSection
from freshroll.config.run import ControlSection, RunSection, TailSection
from freshroll.config.train import ModelSection, TrainerSection
from freshroll.config.trl import trl_hint
from freshroll.config.yamlfile import dump_plain, parse_yaml, read_yaml_file
from freshroll.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class Config(_Section):
    run: RunSection = Field(
        default_factory=RunSection,
        description="The run as a whole: steps, freshness bound, placement, seed.",
    )
    model: ModelSection = Field(
        default_factory=ModelSection,
        description="The initial policy: your local model directory, or the embedded tiny Llama.",
    )
    task: TaskSection = Field(
        default_factory=TaskSection,
        description="The prompts: a built-in task, or your dataset (every column is handed to "
        "the rewards by its own name; see docs/rewards.md).",
    )
    eval: EvalSection = Field(
        default_factory=EvalSection,
        description="Evaluation of the trainer's policy on held-out prompts with the run's "
        "rewards, every few steps (off by default; docs/guide.md, 'Evaluation').",
    )
    rewards: list[RewardEntry] = Field(
        default_factory=lambda: [RewardEntry(fn="reverse")],
        description="Reward functions, called as TRL calls them; the total is their weighted "
        "sum (None = not applicable). A list of entries:",
    )
    rollout: RolloutSection = Field(
        default_factory=RolloutSection,
        description="Generation: group size, batch, workers, sampling.",
    )
    tools: ToolsSection = Field(
        default_factory=ToolsSection,
        description="Tool calls of a tool-using episode workflow (rollout.workflow: calc_tool): "
        "how many, their time limit, a simulated latency.",
    )
    trainer: TrainerSection = Field(
        default_factory=TrainerSection,
        description="The GRPO/PPO step, off-policy correction and checkpoints.",
    )
    limits: LimitsSection = Field(
        default_factory=LimitsSection,
        description="Timeouts on every hand-off and the failure budgets that stop a run which "
        "would otherwise fail forever (rules in freshroll/control/breaker.py).",
    )
    control: ControlSection = Field(
        default_factory=ControlSection,
        description="Who sets admission, per-worker concurrency and the worker count during a "
        "run: the initial settings (static) or the controller (adaptive; docs/control.md).",
    )
    tail: TailSection = Field(default_factory=TailSection, description="Long-tail handling: "
                              "group deadlines, over-provisioning, doomed groups discarded "
                              "early (each off by default).")
    monitor: MonitorSection = Field(
        default_factory=MonitorSection,
        description="Watching a run: a Prometheus endpoint, TensorBoard, W&B (each off by "
        "default); the sample-bias flag's threshold.",
    )
    sim: SimSection = Field(default_factory=SimSection, description="The simulated cluster "
                            "used with rollout.engine: sim (freshroll simulate).")
    vllm: VLLMSection = Field(default_factory=VLLMSection, description="The vLLM engine "
                              "used with rollout.engine: vllm (docs/vllm.md).")
    ray: RaySection = Field(default_factory=RaySection, description="Ray actors' resources, "
                            "used with run.runtime: ray (docs/ray.md).")

    @model_validator(mode="after")
    def _check(self) -> Config:
        if not self.rewards:
            raise ValueError("rewards: at least one reward is needed")
        # GRPO's advantage is a reward minus its group's mean: with one completion per prompt,
        # or greedy decoding (every completion of a group identical), it is zero for every
        # sample and the run would train on nothing.
        if self.rollout.group_size < 2:
            raise ValueError("rollout.group_size: must be >= 2 for GRPO (the advantage of a "
                             "group of one is always zero, so nothing would be learned)")
        if self.tail.deadline and self.tail.min_keep > self.rollout.group_size:
            raise ValueError(f"tail.min_keep ({self.tail.min_keep}) exceeds rollout.group_size "
                             f"({self.rollout.group_size}): no group could be kept at its "
                             "deadline")
        rows = self.rollout.batch_groups * self.rollout.group_size
        if self.trainer.grad_accum > rows:  # micro-batches of no row: a setting that is a typo
            raise ValueError(f"trainer.grad_accum ({self.trainer.grad_accum}) exceeds the rows "
                             f"of a step, rollout.batch_groups x rollout.group_size "
                             f"({self.rollout.batch_groups} x {self.rollout.group_size} = "
                             f"{rows}): a micro-batch needs at least one row")
        if self.task.file is not None and self.rollout.engine == "sim":
            raise ValueError("task.file: rollout.engine sim generates the built-in task's "
                             "prompts (task.name); unset task.file")
        if self.eval.file is not None and self.rollout.engine == "sim":
            raise ValueError("eval.file: rollout.engine sim loads no model to evaluate; "
                             "unset eval.file")
        mode, alias = self.rollout.on_update, self.vllm.on_update
        # the alias counts only away from its default: a config written out in full (a run's
        # config.yaml, a bench's variant) carries vllm.on_update: finish without meaning it
        if mode is not None and alias != "finish" and mode != alias:
            raise ValueError(f"rollout.on_update ({mode}) and its deprecated alias "
                             f"vllm.on_update ({alias}) differ: set rollout.on_update alone")
        if self.rollout.temperature == 0:
            raise ValueError("rollout.temperature: 0 (greedy) makes every completion of a group "
                             "identical, so every GRPO advantage is zero; use e.g. 1.0")
        return self

    def to_yaml(self) -> str:
        return dump_plain(self.model_dump(mode="json"))


#: the top-level keys whose value is a list of sections (an override indexes them)
_LIST_SECTIONS: Final = frozenset({"rewards"})


def set_dotted(data: dict[str, Any], key: str, value: Any, what: str) -> None:
    """Set ``data[a][b][c] = value`` for ``key`` ``a.b.c`` (sections made as needed); a
    ConfigError starting ``what`` when a segment is empty or names a value, not a section.

    A segment after a list is an index: ``rewards.0.weight=2`` sets the first reward's
    weight, ``rewards.2.fn=...`` with two rewards adds a third; a list the data does not
    hold yet starts as the default's (``rewards`` of the embedded default)."""
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{what}: empty key segment")
    if len(parts) > 1 and parts[0] not in data and parts[0] in _LIST_SECTIONS:
        data[parts[0]] = Config().model_dump(mode="json", exclude_none=True)[parts[0]]
    node: Any = data
    where = ""
    for part in parts[:-1]:
        where = f"{where}.{part}" if where else part
        if isinstance(node, list):
            node = _list_item(node, part, where, what)
            continue
        child = node.setdefault(part, {})
        if not isinstance(child, dict | list):
            raise ConfigError(f"{what}: {part!r} is not a section")
        node = child
    if isinstance(node, list):  # rewards.1={fn: ..., weight: 2}: the whole entry
        _list_item(node, parts[-1], f"{where}.{parts[-1]}", what)
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def _list_item(items: list[Any], part: str, where: str, what: str) -> dict[str, Any]:
    """The entry of ``items`` that ``part`` indexes (``len(items)`` appends a new one)."""
    name = where.rpartition(".")[0]
    if not part.isdigit():
        raise ConfigError(f"{what}: {name} is a list: {part!r} must be an index (0 to "
                          f"{len(items) - 1}, or {len(items)} to add an entry)")
    i = int(part)
    if i > len(items):
        raise ConfigError(f"{what}: {name} has {len(items)} entries: index {i} is out of "
                          f"range (0 to {len(items) - 1}, or {len(items)} to add an entry)")
    if i == len(items):
        items.append({})
    item = items[i]
    if not isinstance(item, dict):
        raise ConfigError(f"{what}: {where} is not a section")
    return item


def check_overrides(overrides: Sequence[str]) -> None:
    """A key given twice on the command line is refused (which one was meant?), as a
    duplicated key in a YAML file is. The CLI checks what the user typed; a program may
    layer overrides on a base list (the later wins, as in ``load_config``)."""
    first: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in first:
            raise ConfigError(f"{key}: given twice on the command line ({first[key]!r}, "
                              f"{item!r}); give it once")
        first[key] = item


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value`` to nested ``data`` in place."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.lr=1e-3)")
    key, _, raw = item.partition("=")
    value = parse_yaml(raw, f"override {item!r}")
    set_dotted(data, key, value, f"override {item!r}")


def parse_mapping(model: type[M], data: Any, source: str, what: str) -> M:
    """``data`` validated as ``model``; a ConfigError names ``source`` and every bad key
    (``what``: how the file's top level is described, e.g. "a plan is a mapping with
    `scenarios`")."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {what} (got {type(data).__name__})")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe_errors(model, exc)}") from None


def describe_errors(model: type[BaseModel], exc: ValidationError) -> str:
    """Every error of ``model``'s validation as ``where: what`` (``where`` like
    ``scenarios[3].faults[0].at``; one per key, :func:`~freshroll.config.base.key_errors`),
    joined by ``; ``: the message of a file's ConfigError."""
    problems = []
    for loc, kind, msg in key_errors(model, exc):
        where = ""
        for part in loc:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        what = "unknown key" if kind == "extra_forbidden" else msg
        problems.append(f"{where or '(top level)'}: {what}")
    return "; ".join(problems)


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    data = read_yaml_file(p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys a section at ``loc`` accepts (for "did you mean"), [] if unknown."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args:  # list[RewardEntry], X | None
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(getattr(model, "model_fields", {}))


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    known = _known_keys(loc[:-1])
    trl = trl_hint(str(loc[-1]))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = (f"; {trl}" if trl is not None else f"; did you mean {close[0]!r}?" if close else "")
    return f"unknown key{hint} (known: {', '.join(known)})" if known else f"unknown key{hint}"


def validate(data: dict[str, Any], source: str = "config",
             overrides: Sequence[str] = ()) -> Config:
    """``data`` as a :class:`Config`; a ConfigError names each bad key and where it was set:
    ``source`` (the file), or the override of ``overrides`` (``key=value`` items applied to
    ``data``) that set it or a section above it."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        by_source: dict[str, list[str]] = {}
        for loc, kind, msg in key_errors(Config, exc):
            where = ".".join(str(x) for x in loc)
            if kind == "extra_forbidden":
                msg = _unknown_key(loc)
            by_source.setdefault(_set_by(where, source, overrides), []).append(
                f"{where}: {msg}" if loc else msg)
        raise ConfigError("; ".join(f"{src}: " + "; ".join(problems)
                                    for src, problems in by_source.items())) from None


def _set_by(where: str, source: str, overrides: Sequence[str]) -> str:
    """Who set the key at ``where``: the last override naming it or a section above it
    (the later wins, as when applied), else ``source``; a section's check (``where`` above
    an override's key) names both."""
    keys = [(item.partition("=")[0].strip(), item) for item in overrides]
    hit = [item for key, item in keys if where == key or where.startswith(key + ".")]
    if hit:
        return f"override {hit[-1]!r}"
    below = [repr(item) for key, item in keys if not where or key.startswith(where + ".")]
    if not below:
        return source
    return f"{source} with override{'s' if len(below) > 1 else ''} {', '.join(below)}"


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read ``path`` (or the defaults), apply overrides, validate.

    Relative paths written in the file resolve from the file's folder; relative paths
    given as overrides, from the current directory. Either way the config holds them
    absolute, so the run directory's saved ``config.yaml`` resolves on ``--resume``.
    """
    data = read_yaml(path) if path is not None else {}
    if path is not None:
        resolve_paths(data, Path(path).resolve().parent)
    for item in overrides:
        apply_override(data, item)
    resolve_paths(data, Path.cwd())
    return validate(data, str(path) if path else "config", overrides)


def resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make ``task.file``, ``eval.file``, ``model.path`` and file-path reward references
    absolute."""
    for section, key in (("task", "file"), ("eval", "file"), ("model", "path")):
        node = data.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str):
            node[key] = str(_absolute(node[key], base))
    for entry in data.get("rewards") or []:
        ref = entry.get("fn") if isinstance(entry, dict) else None
        if isinstance(ref, str) and ":" in ref:
            target, _, attr = ref.rpartition(":")
            if target.endswith(".py") or "/" in target or "\\" in target:
                entry["fn"] = f"{_absolute(target, base)}:{attr}"


def _absolute(path: str, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()

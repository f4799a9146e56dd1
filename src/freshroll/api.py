"""freshroll from Python: a notebook's or a script's run, shaped like TRL's ``GRPOTrainer``.

::

    from datasets import Dataset
    from freshroll import GRPOTrainer

    def exact(completions, target, **kwargs):
        return [float(c.strip() == t) for c, t in zip(completions, target)]

    trainer = GRPOTrainer(
        model="models/my-policy",              # a save_pretrained dir, a model object, or None
        reward_funcs=[exact, "my_rewards.py:g"],
        train_dataset=Dataset.from_list(rows),  # a Dataset, a DatasetDict, rows, or a file
        args={"run.steps": 50, "trainer": {"lr": 3e-4}},  # freshroll keys, a YAML path,
                                                          # or TRL's GRPOConfig(...)
        output_dir="runs/notebook",
    )
    result = trainer.train()                    # RunResult: run_dir, summary (dict), ok
    trainer.save_model("exported/")             # the last committed policy, from_pretrained

The run is the same run ``freshroll run`` makes (:func:`freshroll.runtime.run.run`): the
same checks before anything is written, ledger, checkpoints, resume, verify and report; the
CLI is a layer over :meth:`GRPOTrainer.train`. What is given as a Python object is made
durable in the run directory first, so the run stays reproducible and resumable: a model
object is saved to ``OUT/inputs/model`` (with ``processing_class``), a dataset object to
``OUT/inputs/train`` / ``OUT/inputs/eval`` (``save_to_disk``), and ``config.yaml`` names
those. A reward function that a fresh process can import is recorded by its reference; one
defined in the notebook itself is recorded as ``python:<name>`` and lives in this process
only (:mod:`freshroll.rewards.inmemory`): resume such a run from Python with the same
``reward_funcs`` (``GRPOTrainer(..., output_dir=OUT).train(resume=True)``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from freshroll import trl_args
from freshroll.atomic import replace_dir
from freshroll.config import Config, apply_override, read_yaml, resolve_paths, validate
from freshroll.config.train import ALL_LINEAR
from freshroll.errors import ConfigError
from freshroll.rewards import inmemory, reward_model

if TYPE_CHECKING:
    from freshroll.pipeline.observers import RunObserver

INPUTS = "inputs"  # the run directory's folder of inputs given as Python objects

RewardFunc = Callable[..., Any] | str
#: TRL's ``GRPOConfig`` (typed loosely: trl is imported only when one is given)
TrlConfig = Any


class GRPOTrainer:
    """A freshroll run built from Python objects (TRL's argument names where they apply).

    ``model``: a local model directory (``save_pretrained``), a ``transformers`` model
    object (with ``processing_class``, its tokenizer), or None (``args``' ``model.path``, or
    the embedded default). ``reward_funcs``: a function, a reference string
    (``"my_rewards.py:f"``, ``"package.module:f"``, a built-in name) or a list of them, with
    ``reward_weights`` as TRL's ``GRPOConfig.reward_weights`` (None: ``args``' rewards).
    ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset`` or ``DatasetDict``, a list
    of row dicts, or a file path (None: ``args``' ``task`` / ``eval``). ``args``: a
    :class:`~freshroll.config.Config`, a mapping of freshroll keys (nested sections or dotted
    keys, as the command line's ``key=value``), a YAML file (the same file ``freshroll
    run`` takes), or TRL's ``GRPOConfig`` (its fields set away from TRL's defaults mapped,
    refused or dropped with one warning: :mod:`freshroll.trl_args`; its ``output_dir`` and
    ``reward_weights`` used where not given here). ``freshroll_args``: freshroll keys set
    over ``args``. ``output_dir``: the run directory (default ``runs/python``).
    ``peft_config``: a ``peft.LoraConfig`` (or a mapping of ``trainer.lora``'s keys): LoRA,
    as TRL's ``peft_config`` (:func:`lora_section`). ``callbacks``: transformers
    ``TrainerCallback``s, called at the run's points
    (:mod:`freshroll.observe.trl_callbacks`).
    """

    def __init__(
        self,
        model: Any = None,
        reward_funcs: RewardFunc | Sequence[RewardFunc] | None = None,
        args: Config | Mapping[str, Any] | str | Path | TrlConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_weights: Sequence[float] | None = None,
        output_dir: str | Path | None = None,
        peft_config: Any = None,
        callbacks: Sequence[Any] | None = None,
        freshroll_args: Mapping[str, Any] | None = None,
        *,
        reward_processing_classes: Any = None,
        optimizers: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
    ) -> None:
        _refuse_unsupported(reward_processing_classes=reward_processing_classes,
                            optimizers=optimizers, tools=tools, rollout_func=rollout_func)
        self.trl_args: Any = None  # the GRPOConfig given as args (the callbacks' args)
        if trl_args.is_grpo_config(args):
            self.trl_args, converted = args, trl_args.convert(args)
            data = converted.data
            output_dir = output_dir if output_dir is not None else converted.output_dir
            if reward_weights is None:
                reward_weights = converted.reward_weights
        else:
            data = _config_data(args)
        _merge(data, freshroll_args or {}, "freshroll_args")
        self.output_dir = Path(output_dir) if output_dir is not None else Path("runs/python")
        self.callbacks = [] if callbacks is None else _callbacks(callbacks)
        self._model = _model_input(model, processing_class, data)
        self._train = _dataset_input(train_dataset, "train_dataset", "task", data)
        self._eval = _dataset_input(eval_dataset, "eval_dataset", "eval", data)
        if reward_funcs is not None:
            data["rewards"] = _reward_entries(reward_funcs, reward_weights)
        elif reward_weights is not None:
            raise ConfigError("reward_weights: given without reward_funcs")
        if peft_config is not None:
            data.setdefault("trainer", {})["lora"] = lora_section(peft_config)
        inputs = self.output_dir.resolve() / INPUTS
        if self._model is not None:
            data.setdefault("model", {})["path"] = str(inputs / "model")
        if self._train is not None:
            data.setdefault("task", {})["file"] = str(inputs / "train")
        if self._eval is not None:
            data.setdefault("eval", {})["file"] = str(inputs / "eval")
        given = (model, reward_funcs, train_dataset, eval_dataset, freshroll_args)
        # a Config alone is taken as it is (the CLI's); anything else is merged and validated
        self.config: Config = (args if isinstance(args, Config) and all(x is None for x in given)
                               else validate(data, "args"))
        _check_placement(self.config)
        self.result: Any = None  # the last train()'s RunResult

    def train(self, resume_from_checkpoint: bool | str | Path | None = None, *,
              resume: bool = False, allow_change: Sequence[str] = (),
              stream: TextIO | None = None, observers: Sequence[RunObserver] = (),
              end_lines: bool = True) -> Any:
        """Run (``resume``: continue) the training run in ``output_dir``; returns its
        :class:`~freshroll.runtime.run.RunResult` (``summary``: summary.json's figures,
        ``ok``: verify passed). ``allow_change``: keys a resume may change that change
        training (README, "Resume rules"). Progress goes to ``stream`` (default stderr).
        ``observers``: more watchers of the run after its own, e.g.
        :class:`~freshroll.observe.exporters.JsonLinesExporter` (the contract:
        :mod:`freshroll.pipeline.observers`). ``resume_from_checkpoint``: TRL's name for
        ``resume`` (True, or a path: ``output_dir`` or a checkpoint in it; freshroll resumes
        from the run's last checkpoint and its ledger). ``end_lines``: print the lines
        ``freshroll run`` ends with (the verdict and notes, then run dir, figures, ``verify:``
        and ``report:``; :mod:`freshroll.runtime.end_lines`) on ``stream`` (the CLI prints its
        own)."""
        from freshroll.runtime.end_lines import end_lines as render_end
        from freshroll.runtime.run import run

        resume = resume or _resumes(resume_from_checkpoint, self.output_dir)
        from freshroll.runtime.rundir import check_out_dir

        out = self.output_dir
        check_out_dir(out, resume=resume)
        if not resume:
            self._write_inputs(out / INPUTS)
        watch = self._trainer_callbacks(out)
        if watch is not None:
            observers = (*observers, watch)
            watch.begin()
        stream = stream if stream is not None else sys.stderr
        try:
            self.result = run(self.config, out, resume=resume, allow_change=tuple(allow_change),
                              stream=stream, observers=observers)
        finally:  # on_train_end once, also when the run failed before its observers closed
            if watch is not None:
                watch.close()
        if end_lines:
            render_end(self.result).write(stream)
        return self.result

    def _trainer_callbacks(self, out: Path) -> Any:
        """The observer calling the TRL callbacks (None without any); their ``args``: the
        GRPOConfig given, else the run's own settings as TrainingArguments."""
        if not self.callbacks:
            return None
        from freshroll.observe.trl_callbacks import TrainerCallbacks, training_arguments

        args = self.trl_args if self.trl_args is not None else training_arguments(
            self.config, out)
        return TrainerCallbacks(self.callbacks, args, self.config.run.steps)

    def save_model(self, output_dir: str | Path, step: int | None = None, *,
                   adapter_only: bool = False) -> Path:
        """Write the policy at committed ``step`` (default: the last) as a ``from_pretrained``
        directory (``freshroll export-model``). A LoRA run is written merged, or with
        ``adapter_only`` as peft's adapter directory (``save_pretrained`` of the adapter:
        ``adapter_config.json``, ``adapter_model.safetensors``, for
        ``PeftModel.from_pretrained(initial_model, output_dir)``)."""
        from freshroll.runtime.export import export_model

        done = export_model(self.output_dir, Path(output_dir), step, adapter_only=adapter_only)
        return Path(done.out)

    def _write_inputs(self, inputs: Path) -> None:
        """The Python objects, saved where ``config.yaml`` names them (each replaced whole:
        a new run in a directory that holds no run). Nothing to save (the command line's
        run): nothing imported (``datasets`` alone costs ~0.6 s)."""
        if self._model is None and self._train is None and self._eval is None:
            return
        from freshroll.rewards.data import quiet_datasets

        with quiet_datasets(), _quiet_transformers():
            if self._model is not None:
                model, tokenizer = self._model


                def save_model(d: Path) -> None:
                    model.save_pretrained(str(d))
                    tokenizer.save_pretrained(str(d))

                replace_dir(inputs / "model", save_model)
            for name, dataset in (("train", self._train), ("eval", self._eval)):
                if dataset is not None:
                    replace_dir(inputs / name, functools.partial(_save_dataset, dataset))


def _config_data(args: Config | Mapping[str, Any] | str | Path | None) -> dict[str, Any]:
    """``args`` as the nested dict a config validates from (paths made absolute: a file's
    from its folder, a mapping's from the current directory)."""
    if args is None:
        return {}
    if isinstance(args, Config):
        return args.model_dump(mode="json", exclude_none=True)
    if isinstance(args, str | Path):
        from_file = read_yaml(args)
        resolve_paths(from_file, Path(args).resolve().parent)
        return from_file
    if not isinstance(args, Mapping):
        raise ConfigError(f"args: expected a Config, a mapping of freshroll keys, a YAML path "
                          f"or TRL's GRPOConfig, got {type(args).__name__}")
    data: dict[str, Any] = {}
    _merge(data, args, "args")
    return data


def _resumes(checkpoint: bool | str | Path | None, out: Path) -> bool:
    """TRL's ``resume_from_checkpoint`` as freshroll's ``resume``: a run resumes in its own
    directory, so a path must be ``out`` or lie inside it."""
    if checkpoint is None or checkpoint is False:
        return False
    if checkpoint is not True:
        where, run_dir = Path(checkpoint).resolve(), out.resolve()
        if where != run_dir and run_dir not in where.parents:
            raise ConfigError(f"resume_from_checkpoint: {checkpoint} is not in output_dir "
                              f"{out}; freshroll resumes a run in its own directory, from its "
                              "last checkpoint and its ledger")
    return True


def _refuse_unsupported(**given: Any) -> None:
    """TRL's GRPOTrainer arguments freshroll has no counterpart for: one ConfigError naming
    each one given, with the nearest feature (:data:`freshroll.config.trl.NOT_SUPPORTED`)."""
    from freshroll.config.trl import NOT_SUPPORTED

    named = [f"{k} (nearest: {NOT_SUPPORTED[k].nearest})" for k, v in given.items()
             if v is not None and (not isinstance(v, list | tuple) or v)]
    if named:
        raise ConfigError(f"{'; '.join(named)}: not supported in freshroll")


def _callbacks(callbacks: Any) -> list[Any]:
    """TRL's ``callbacks`` checked (transformers imported only when some are given)."""
    from freshroll.observe.trl_callbacks import check_callbacks

    return check_callbacks(callbacks)


def _merge(data: dict[str, Any], keys: Mapping[str, Any], what: str) -> None:
    """``keys`` (freshroll's: nested sections, dotted keys, or both) set over ``data``, paths
    made absolute from the current directory."""
    if not isinstance(keys, Mapping):
        raise ConfigError(f"{what}: expected a mapping of freshroll keys, got "
                          f"{type(keys).__name__}")
    for key, value in keys.items():
        if not isinstance(key, str):
            raise ConfigError(f"{what}: key {key!r} is not a string")
        if "." in key:
            apply_override(data, f"{key}={_yaml(value)}")
        elif isinstance(value, Mapping) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = dict(value) if isinstance(value, Mapping) else value
    resolve_paths(data, Path.cwd())


def _yaml(value: Any) -> str:
    """``value`` as the YAML an override holds (flow style, one line)."""
    import yaml

    text: str = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text.removesuffix("\n...").strip()


#: ``peft.LoraConfig`` fields -> ``trainer.lora`` keys
_PEFT_FIELDS = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout",
                "target_modules": "target_modules"}


def lora_section(peft_config: Any) -> dict[str, Any]:
    """``trainer.lora`` from TRL's ``peft_config``: a ``peft.LoraConfig`` (its ``r``,
    ``lora_alpha``, ``lora_dropout`` and ``target_modules``; any other field set away from
    peft's default is refused, naming it: freshroll would not apply it) or a mapping of
    ``trainer.lora``'s own keys."""
    if isinstance(peft_config, Mapping):
        return dict(peft_config)
    try:
        from peft import LoraConfig
    except ImportError as exc:  # pragma: no cover - peft is a dependency
        raise ConfigError(f"peft_config: peft is not installed ({exc})") from exc
    if not isinstance(peft_config, LoraConfig):
        raise ConfigError(f"peft_config: expected a peft.LoraConfig or a mapping of "
                          f"trainer.lora keys, got {type(peft_config).__name__}")
    default = LoraConfig()
    ignored = {"task_type", "inference_mode", "peft_type", "base_model_name_or_path",
               "revision", "auto_mapping", "bias"}
    unsupported = sorted(
        k for k, v in vars(peft_config).items()
        if k not in _PEFT_FIELDS and k not in ignored and not k.startswith("_")
        and v != getattr(default, k, v))
    if peft_config.bias != "none":
        unsupported.append("bias")
    if unsupported:
        raise ConfigError(f"peft_config: {', '.join(unsupported)} set, which freshroll's LoRA "
                          "does not apply (it takes r, lora_alpha, lora_dropout and "
                          "target_modules)")
    out: dict[str, Any] = {"r": peft_config.r, "alpha": peft_config.lora_alpha,
                           "dropout": peft_config.lora_dropout}
    targets = peft_config.target_modules
    if targets is not None:
        if isinstance(targets, str) and targets.lower() == ALL_LINEAR:
            out["target_modules"] = ALL_LINEAR  # peft's shorthand, as peft reads it
        elif isinstance(targets, str):
            raise ConfigError(f"peft_config.target_modules: a regular expression "
                              f"({targets!r}) is not supported; give a list of names or "
                              f"{ALL_LINEAR!r}")
        else:
            out["target_modules"] = sorted(targets)
    return out


def _model_input(model: Any, tokenizer: Any, data: dict[str, Any]) -> tuple[Any, Any] | None:
    """A model object and its tokenizer to save (None: a path, set in ``data``, or unset)."""
    if model is None:
        if tokenizer is not None:
            raise ConfigError("processing_class: given without a model object")
        return None
    if isinstance(model, str | Path):
        if tokenizer is not None:
            raise ConfigError("processing_class: the model directory's own tokenizer is used; "
                              "give processing_class only with a model object")
        data.setdefault("model", {})["path"] = str(Path(model).expanduser().resolve())
        return None
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(f"model: expected a model directory or a transformers model "
                          f"(with save_pretrained), got {type(model).__name__}")
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise ConfigError("processing_class: a model object needs its tokenizer "
                          "(processing_class=AutoTokenizer.from_pretrained(...))")
    return model, tokenizer


def _dataset_input(dataset: Any, what: str, section: str, data: dict[str, Any]) -> Any:
    """A ``datasets`` object to save (None: a path, set in ``data``, or unset)."""
    if dataset is None:
        return None
    if isinstance(dataset, str | Path):
        data.setdefault(section, {})["file"] = str(Path(dataset).expanduser().resolve())
        return None
    import datasets

    if isinstance(dataset, datasets.Dataset | datasets.DatasetDict):
        if len(dataset) == 0:
            raise ConfigError(f"{what}: the dataset is empty")
        return dataset
    if isinstance(dataset, Sequence) and dataset and all(isinstance(r, Mapping) for r in dataset):
        try:
            return datasets.Dataset.from_list([dict(r) for r in dataset])
        except Exception as exc:  # pyarrow cannot type the rows (mixed column types)
            raise ConfigError(f"{what}: the rows do not make a dataset: {exc}"[:400]) from exc
    raise ConfigError(f"{what}: expected a datasets.Dataset or DatasetDict, a non-empty list "
                      f"of row dicts or a file path, got {type(dataset).__name__}")


def _reward_entries(funcs: RewardFunc | Sequence[RewardFunc],
                    weights: Sequence[float] | None) -> list[dict[str, Any]]:
    """The config's ``rewards`` entries for ``reward_funcs`` (TRL: one or a list)."""
    items = [funcs] if callable(funcs) or isinstance(funcs, str) else list(funcs)
    if not items:
        raise ConfigError("reward_funcs: at least one reward function is required")
    if weights is not None and len(weights) != len(items):
        raise ConfigError(f"reward_weights: {len(weights)} weights for {len(items)} "
                          "reward_funcs (one each)")
    entries = []
    for i, fn in enumerate(items):
        if hasattr(fn, "parameters") and hasattr(fn, "forward"):  # a torch module
            raise ConfigError(f"reward_funcs[{i}]: a reward model object ({type(fn).__name__}) "
                              "is not taken; give its save_pretrained directory (a path), or a "
                              "function that scores with it (docs/rewards.md)")
        if isinstance(fn, str) and reward_model.is_model_dir(fn):  # TRL: a reward model's path
            entries.append({**reward_model.entry(fn), **(
                {} if weights is None else {"weight": float(weights[i])})})
            continue
        ref = fn if isinstance(fn, str) else inmemory.register(fn)
        entry: dict[str, Any] = {"fn": ref}
        if weights is not None:
            entry["weight"] = float(weights[i])
        entries.append(entry)
    return entries


def _check_placement(cfg: Config) -> None:
    """A ``python:`` reward cannot be imported by Ray's reward actors."""
    in_memory = [e.fn for e in cfg.rewards if inmemory.is_in_memory(e.fn)]
    if in_memory and cfg.run.runtime == "ray" and cfg.ray.reward_actors > 0:
        raise ConfigError(
            f"reward_funcs: {', '.join(in_memory)} exist only in this process; Ray's reward "
            "actors cannot import them: set ray.reward_actors=0 (score on the driver) or "
            "give importable references ('my_rewards.py:f')")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Writing model shards" bar while a model object is saved (the caller's setting
    restored after)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated


def _save_dataset(dataset: Any, directory: Path) -> None:
    """``datasets``' own save, into the directory :func:`~freshroll.atomic.replace_dir` fills."""
    dataset.save_to_disk(str(directory))

"""The prompts and what scores them: the task (a built-in task or a dataset), eval (held-out
prompts) and rewards entry sections. Part of :class:`freshroll.config.Config` (imported from
there as its other sections are)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from freshroll.config.base import _Section

#: the built-in task's keys and their defaults (a run without ``task.file``)
BUILTIN_TASK: Final[Mapping[str, Any]] = MappingProxyType(
    {"name": "reverse", "n_prompts": 4096, "params": {"min_len": 3, "max_len": 3}})


class TaskSection(_Section):
    """The prompts: the built-in task (``name``, ``n_prompts``, ``params``), or a dataset
    (``file``). With ``file`` set the built-in task's keys are not used, so the section holds
    them as null (a base config's ``task.name``, or an older freshroll's record of a run, says
    nothing about the prompts then); without it, each unset one takes its default
    (:data:`BUILTIN_TASK`)."""

    name: str | None = Field(
        None, description="built-in task when no task.file: reverse, sort, add, repeat "
        "(long-tailed completion lengths: configs/longtail.yaml), calc (a calculator tool "
        "task) or guess (a multi-turn game: docs/agents.md); rg:<dataset>: a reasoning-gym "
        "dataset (the reasoning-gym extra; its config keys in task.params); null (not used) "
        "with task.file"
    )
    n_prompts: int | None = Field(
        None, ge=1, le=100_000_000, description="prompts the built-in task generates; null (not "
        "used) with task.file"
    )
    params: dict[str, Any] | None = Field(
        None, description="the built-in task's parameters (e.g. digit-string lengths); "
        "null (not used) with task.file",
    )
    file: str | None = Field(
        None, description="dataset instead of a task: a JSONL/JSON/Parquet/CSV file or a "
        "datasets save_to_disk directory; relative to the config file's folder",
    )
    prompt_field: str = Field(
        "prompt", description="column of prompts: strings or chat messages [{role, content}]"
    )
    answer_field: str = Field(
        "answer", description="column the built-in rewards read as 'answer' (optional if "
        "'answer'; any other name must exist)",
    )
    id_field: str | None = Field(None, description="column of unique prompt ids (str or int)")
    max_prompt_tokens: int | None = Field(
        None, ge=1, le=1_048_576, description="task and eval prompts of more tokens are refused "
        "before the run starts, naming the longest (TRL's max_prompt_length; not truncated: a "
        "cut prompt is another prompt, perhaps without its question); unset: the model's "
        "context bounds them"
    )
    split: str | None = Field(
        None, description="split of a saved DatasetDict (default: train, or its only split)"
    )

    @model_validator(mode="before")
    @classmethod
    def _builtin_or_file(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for key, default in BUILTIN_TASK.items():
            if out.get("file") is not None:
                out[key] = None  # a dataset's run: the built-in task's keys apply to nothing
            elif out.get(key) is None:
                out[key] = copy.deepcopy(default)
        return out

    def builtin(self) -> tuple[str, int, dict[str, Any]]:
        """The built-in task's name, prompt count and parameters (a run without ``file``)."""
        if self.name is None or self.n_prompts is None or self.params is None:
            raise ValueError("task.file is set: the run's prompts are the dataset's")
        return self.name, self.n_prompts, self.params


class EvalSection(_Section):
    """Evaluation on a held-out set (off while ``file`` is unset; freshroll.runtime.evaluation)."""

    file: str | None = Field(
        None, description="held-out prompts, as task.file accepts (JSONL/JSON/Parquet/CSV or a "
        "save_to_disk directory; relative to the config file's folder), read with task's "
        "prompt_field/answer_field/id_field; unset: no evaluation",
    )
    split: str | None = Field(
        None, description="split of a saved DatasetDict (as task.split; e.g. test)"
    )
    every_steps: int = Field(
        10, ge=1, le=10_000_000, description="committed trainer steps between evaluations "
        "(and one at the last step)"
    )
    n_prompts: int = Field(
        32, ge=1, le=1_000_000, description="the first n prompts of the file are evaluated"
    )
    mode: Literal["greedy", "sampled", "both"] = Field(
        "greedy", description="greedy decoding, one sample at the run's temperature/top_p "
        "(seeded from run.seed and the step), or both"
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=131_072, description="longest eval completion; unset: "
        "rollout.max_new_tokens"
    )
    budget_s: float = Field(
        30.0, gt=0, le=86_400, description="most seconds one evaluation may hold the trainer; "
        "prompts not reached within it are skipped (and counted in eval.jsonl)"
    )


class RewardEntry(_Section):
    fn: str = Field(description="built-in name, module.path:function or path/file.py:function")
    weight: float = Field(
        1.0, ge=-1e6, le=1e6, description="weight in the reward sum; negative: a penalty"
    )
    name: str | None = Field(None, description="name in metrics and the reward version")
    args: dict[str, Any] | None = Field(
        None, description="fn is a factory: called as fn(**args) to make the reward"
    )

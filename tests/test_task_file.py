"""``task.file`` replaces the built-in task: its keys (``task.name``, ``task.n_prompts``,
``task.params``) are held and recorded as null, not as settings that applied (issue 48,
item 10: a dataset's run recorded ``task.name: reverse`` and 4096 prompts it never made)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from freshroll.config import Config, load_config, validate
from freshroll.config.data import BUILTIN_TASK, TaskSection
from freshroll.errors import ConfigError
from freshroll.runtime.resume import diff, flatten, with_recorded_defaults

REPO = Path(__file__).resolve().parents[1]
UNUSED = dict.fromkeys(BUILTIN_TASK)


def _task(cfg: Config) -> dict[str, object]:
    return {k: getattr(cfg.task, k) for k in BUILTIN_TASK}


def test_a_dataset_run_holds_and_records_the_built_in_keys_as_null(tmp_path: Path) -> None:
    # configs/smoke.yaml sets task.name and task.n_prompts: the file replaces them
    cfg = load_config(REPO / "configs" / "smoke.yaml", [f"task.file={tmp_path / 'd.jsonl'}"])
    assert _task(cfg) == UNUSED
    recorded = yaml.safe_load(cfg.to_yaml())["task"]
    assert {k: recorded[k] for k in BUILTIN_TASK} == UNUSED
    with pytest.raises(ValueError, match=r"task\.file is set"):
        cfg.task.builtin()


def test_without_a_file_the_built_in_task_takes_its_defaults() -> None:
    assert _task(load_config(None)) == dict(BUILTIN_TASK)
    assert TaskSection(n_prompts=8).builtin() == ("reverse", 8, {"min_len": 3, "max_len": 3})
    assert load_config(None, ["task.name=sort"]).task.builtin()[0] == "sort"


def test_an_earlier_record_of_a_dataset_run_reads_as_today_and_resumes_unchanged() -> None:
    """A run an earlier freshroll recorded with the built-in keys beside ``task.file``: read
    back, the keys are null, so a resume sees no change of ``task`` (a "never" key)."""
    now = load_config(None, ["task.file=/data/d.jsonl"]).model_dump(mode="json")
    old = json.loads(json.dumps(now))
    old["task"].update(name="reverse", n_prompts=4096, params={"min_len": 3, "max_len": 3})
    assert _task(validate(json.loads(json.dumps(old)), "old config.yaml")) == UNUSED
    assert diff(flatten(with_recorded_defaults(old)), flatten(now)) == []


def test_the_simulated_cluster_refuses_a_task_file() -> None:
    """``rollout.engine: sim`` made the built-in task's prompts whatever task.file said."""
    with pytest.raises(ConfigError, match=r"task\.file: rollout\.engine sim generates the "
                                          r"built-in task's prompts"):
        load_config(None, ["rollout.engine=sim", "task.file=/data/d.jsonl"])

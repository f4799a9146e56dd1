"""Run-directory safety: the lock, checks before any write, atomic files, config bounds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import typing
from pathlib import Path

import annotated_types
import pytest
import yaml

from freshroll.config import Config, validate
from freshroll.engines.model_dir import check_model_dir
from freshroll.errors import ConfigError, RunDirError
from freshroll.runtime.rundir import (
    LOCK_FILE,
    check_out_dir,
    live_holder,
    live_message,
    lock_run_dir,
    write_text_atomic,
)

SRC = Path(__file__).resolve().parents[2] / "src"
HOLD = (
    "import sys, time; from pathlib import Path; "
    "from freshroll.runtime.rundir import lock_run_dir; "
    "lock = lock_run_dir(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)"
)


@pytest.fixture
def holder(tmp_path: Path) -> typing.Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process that holds the lock on ``tmp_path / "run"``."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield run_dir, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_second_process_is_refused_at_once_naming_the_holder(holder):
    run_dir, proc = holder
    with pytest.raises(RunDirError, match=rf"a run is live in it \(pid {proc.pid} holds "):
        lock_run_dir(run_dir)


@pytest.mark.parametrize("resume", [False, True])
def test_a_live_run_is_never_pointed_at_with_resume(holder, resume: bool):
    """Issue 48, item 10: a new run on a live run's directory was told "already holds a run;
    use --resume DIR" (a resume into a run that is running), and the lock's message was not
    the documented one. Both a start and a resume now say the run is live, before any
    check, in docs/runbook.md's words."""
    run_dir, proc = holder
    (run_dir / "ledger.sqlite").write_bytes(b"")  # what the live run's files are is moot
    with pytest.raises(RunDirError) as info:
        check_out_dir(run_dir, resume=resume)
    said = str(info.value)
    assert said == live_message(run_dir, str(proc.pid))
    assert said.startswith(f"{run_dir}: a run is live in it (pid {proc.pid} holds run.lock); "
                           "do not resume it while it runs")
    runbook = (Path(__file__).resolve().parents[2] / "docs" / "runbook.md").read_text()
    assert live_message(Path("RUN_DIR"), "N") in runbook


def test_a_processs_own_lock_is_not_a_live_run(tmp_path: Path):
    with lock_run_dir(tmp_path / "r"):
        assert live_holder(tmp_path / "r") is None
        check_out_dir(tmp_path / "r", resume=False)
    assert live_holder(tmp_path / "r") is None  # released: no run is live


def test_the_lock_is_released_when_its_holder_is_killed(holder):
    run_dir, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    lock = lock_run_dir(run_dir)
    assert (run_dir / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()


def test_the_lock_is_released_by_release_and_can_be_taken_again(tmp_path: Path):
    with lock_run_dir(tmp_path / "r"), pytest.raises(RunDirError, match="a run is live"):
        lock_run_dir(tmp_path / "r")
    lock_run_dir(tmp_path / "r").release()


def test_a_read_only_or_file_run_dir_is_a_run_dir_error(tmp_path: Path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        check_out_dir(tmp_path / "f", resume=False)
    with pytest.raises(RunDirError, match="cannot use it as a run directory"):
        lock_run_dir(tmp_path / "f")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(RunDirError, match="cannot use it"):
            lock_run_dir(ro)
    finally:
        ro.chmod(0o700)


def test_check_out_dir(tmp_path: Path):
    check_out_dir(tmp_path / "new", resume=False)
    with pytest.raises(RunDirError, match="nothing to resume"):
        check_out_dir(tmp_path / "new", resume=True)
    (tmp_path / "ledger.sqlite").write_bytes(b"")  # a start killed in its ledger's creation
    check_out_dir(tmp_path, resume=False)  # holds no run: a new one may start here
    check_out_dir(tmp_path, resume=True)  # or --resume starts it from step 0
    from freshroll.ledger import events as ev
    from freshroll.ledger.store import Ledger

    (tmp_path / "ledger.sqlite").unlink()
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.append(ev.Closed(ts=0.0))
    with pytest.raises(RunDirError, match="already holds a run; use --resume"):
        check_out_dir(tmp_path, resume=False)
    check_out_dir(tmp_path, resume=True)


@pytest.mark.parametrize("content,msg", [
    (None, "has no config.json"),
    ("{not json", "config.json is not valid JSON"),
    ('{"hidden_size": 3}', "config.json has no model_type"),
    ('{"model_type": "no-such-architecture"}', "config.json does not load"),
])
def test_a_broken_model_path_is_named(tmp_path: Path, content: str | None, msg: str):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError, match=msg):
        check_model_dir(tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        check_model_dir(tmp_path / "missing")


@pytest.mark.parametrize("overrides,msg", [
    ({"model": {"path": "/nonexistent/model"}}, "model.path"),
    ({"task": {"file": "/nonexistent/prompts.jsonl"}}, "prompts.jsonl"),
    ({"rewards": [{"fn": "no_such_module:fn"}]}, "no_such_module"),
    ({"model": {"tiny": {"hidden_size": -4}}}, "model.tiny"),
])
def test_nothing_is_written_before_every_input_is_checked(tmp_path: Path, overrides, msg):
    """Before: config.yaml, model/ and ledger.sqlite were written first, and the directory
    could then neither be rerun ("already holds a run") nor resumed."""
    from freshroll.runtime.prepare import prepare_run_dir

    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=msg):
        prepare_run_dir(validate(overrides), out, resume=False)
    assert not out.exists()


@pytest.mark.parametrize("source", ["task", "file"])
def test_a_prompt_longer_than_the_context_is_refused_before_anything_is_written(
    tmp_path: Path, source: str
):
    """Issue 23, 5f. Before: caught only by the engine, during generation (the run started,
    its clock running, and every generate call of that prompt failed)."""
    from freshroll.runtime.prepare import prepare_run_dir

    if source == "file":
        prompts = tmp_path / "long.jsonl"
        rows = [{"prompt": "rev 12=", "answer": "21"}, {"prompt": "rev " + "7" * 30 + "=",
                                                        "answer": "7" * 30}]
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        task: dict[str, object] = {"file": str(prompts)}
        named = rf"task\.file {prompts}: 1 of 2 prompts .* 'long-1' \(35 tokens\)"
    else:
        task = {"params": {"min_len": 30, "max_len": 30}, "n_prompts": 8}
        named = r"task 'reverse': 8 of 8 prompts .* \(35 tokens\)"
    cfg = validate({"task": task, "model": {"tiny": {"max_position_embeddings": 16}}})
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=named) as err:
        prepare_run_dir(cfg, out, resume=False)
    assert ("more than 12 tokens, the max_position_embeddings of the embedded model "
            "(model.tiny) less rollout.max_new_tokens (4)") in str(err.value)
    assert not out.exists()


def test_task_max_prompt_tokens_refuses_a_longer_prompt_before_anything_is_written(
        tmp_path: Path):
    """TRL's max_prompt_length (issue 48): refused, not truncated, naming the key."""
    from freshroll.runtime.prepare import prepare_run_dir

    cfg = validate({"task": {"params": {"min_len": 8, "max_len": 8}, "n_prompts": 8,
                             "max_prompt_tokens": 10}})
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"8 of 8 prompts have more than 10 tokens, "
                                          r"task\.max_prompt_tokens \(10\)"):
        prepare_run_dir(cfg, out, resume=False)
    assert not out.exists()
    fits = validate({"task": {"params": {"min_len": 3, "max_len": 3}, "n_prompts": 8,
                              "max_prompt_tokens": 10}})
    prepare_run_dir(fits, tmp_path / "ok", resume=False).lock.release()


def test_prompts_that_fit_the_context_pass(tmp_path: Path):
    from freshroll.runtime.prepare import prepare_run_dir

    cfg = validate({"task": {"params": {"min_len": 3, "max_len": 3}, "n_prompts": 8},
                    "model": {"tiny": {"max_position_embeddings": 16}}})
    prep = prepare_run_dir(cfg, tmp_path / "run", resume=False)
    prep.lock.release()
    assert max(len(p.text) for p in prep.prompts) <= 16


def test_prepare_writes_config_and_model_then_holds_the_lock(tmp_path: Path):
    from freshroll.runtime.prepare import prepare_run_dir

    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)  # half-written by a kill during an older save
    (out / "model" / "config.json").write_text("{")
    prep = prepare_run_dir(validate({}), out, resume=False)
    try:
        assert validate(yaml.safe_load((out / "config.yaml").read_text())) == prep.cfg
        assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "llama"
        with pytest.raises(RunDirError, match="a run is live in it"):
            lock_run_dir(out)
    finally:
        prep.lock.release()
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model", LOCK_FILE]


def test_save_tiny_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Before: a kill (here: an error) mid-save left a half-written model directory."""
    from transformers import PreTrainedTokenizerFast

    from freshroll.engines.tiny import save_tiny

    def boom(self: object, *a: object, **k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", boom)
    with pytest.raises(OSError, match="disk full"):
        save_tiny(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    (tmp_path / "model.tmp").mkdir()  # left by a SIGKILL: removed by the next save
    save_tiny(tmp_path / "model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (tmp_path / "model" / "tokenizer.json").is_file()


def test_write_text_atomic(tmp_path: Path):
    write_text_atomic(tmp_path / "c.yaml", "a: 1\n")
    write_text_atomic(tmp_path / "c.yaml", "a: 2\n")
    assert (tmp_path / "c.yaml").read_text() == "a: 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


# -- config bounds --------------------------------------------------------------------------

def _numeric_fields() -> list[tuple[str, str, typing.Any]]:
    out = []
    for section, info in Config.model_fields.items():
        model = info.annotation
        if not isinstance(model, type) or not hasattr(model, "model_fields"):
            continue
        for name, f in model.model_fields.items():
            args = set(typing.get_args(f.annotation)) or {f.annotation}
            if args & {int, float} and bool not in args:
                out.append((section, name, f.metadata))
            for arg in args:  # int | "auto": the number's own bounds, Annotated[int, Field()]
                inner = typing.get_args(arg)
                if typing.get_origin(arg) is typing.Annotated and inner[0] in (int, float):
                    out.append((section, name, list(inner[1].metadata)))
    return out


def test_every_numeric_config_field_has_bounds_on_both_sides():
    """trainer.weight_decay, is_cap, clip_low/high had none: a run dir became unusable."""
    fields = _numeric_fields()
    assert len(fields) >= 20
    assert ("run", "torch_threads") in {(s, n) for s, n, _ in fields}
    for section, name, metadata in fields:
        kinds = {type(m) for m in metadata}
        assert kinds & {annotated_types.Ge, annotated_types.Gt}, f"{section}.{name}: no lower"
        assert kinds & {annotated_types.Le, annotated_types.Lt}, f"{section}.{name}: no upper"


@pytest.mark.parametrize("key,value", [
    ("trainer.weight_decay", -0.1), ("trainer.is_cap", 0.5), ("trainer.clip_low", 1.0),
    ("trainer.clip_high", -0.1), ("trainer.lr", float("inf")), ("trainer.lr", float("nan")),
    ("trainer.max_grad_norm", float("inf")), ("rollout.temperature", -1.0),
    ("run.seed", -1), ("run.max_staleness", 10**6), ("rollout.group_size", 0),
])
def test_out_of_bounds_values_are_refused_naming_the_field(key: str, value: float):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=rf"{key}: "):
        validate({section: {name: value}})
    with pytest.raises(ConfigError, match=r"rewards\.0\.weight"):
        validate({"rewards": [{"fn": "reverse", "weight": float("inf")}]})

"""Starting again in a run directory that holds a run (issue 48, hostile trial):

* a missing or emptied ``ledger.sqlite`` beside files only a run with a ledger writes
  (checkpoints, metrics.jsonl, summary.json, ...) is refused (exit 2) naming them, instead of
  starting a new run over them;
* a ``--resume`` of a finished run with nothing left to train exits at once and writes
  nothing: no lock, no config, no event, no row."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from freshroll.config import load_config
from freshroll.errors import EXIT_CONFIG, RunDirError, exit_status
from freshroll.runtime.rundir import check_out_dir, earlier_run

SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "task.n_prompts=64",
       "rollout.group_size=4", "rollout.batch_groups=2", "run.steps=4"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from freshroll.runtime.run import run

    out = tmp_path_factory.mktemp("restart") / "run"
    assert run(load_config(None, SIM), out, stream=io.StringIO()).ok
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _tree(run: Path) -> dict[str, str]:
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def test_checkpoints_beside_no_ledger_are_refused_naming_them(tmp_path: Path) -> None:
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("run: {steps: 4}\n")
    assert earlier_run(tmp_path) == ["checkpoints/step-000004 and 1 more"]
    for resume in (False, True):
        with pytest.raises(RunDirError, match=r"holds files of an earlier run \(checkpoints/"
                                              r"step-000004 and 1 more\) but its "
                                              r"ledger.sqlite is missing"):
            check_out_dir(tmp_path, resume=resume)
    (tmp_path / "ledger.sqlite").write_bytes(b"")
    with pytest.raises(RunDirError, match=r"ledger\.sqlite holds no event") as err:
        check_out_dir(tmp_path, resume=False)
    assert exit_status(err.value) == EXIT_CONFIG


def test_a_kill_at_the_start_still_leaves_a_startable_directory(tmp_path: Path) -> None:
    """config.yaml, model/ and an empty metrics.jsonl are what a start writes before its
    ledger holds events: no evidence of an earlier run."""
    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text("run: {steps: 4}\n")
    (tmp_path / "metrics.jsonl").write_text("")
    assert earlier_run(tmp_path) == []
    check_out_dir(tmp_path, resume=False)
    check_out_dir(tmp_path, resume=True)


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_a_finished_run_with_its_ledger_gone_is_refused(finished: Path, tmp_path: Path,
                                                        how: str) -> None:
    from freshroll.runtime.run import run

    out = _copy(finished, tmp_path / "run")
    ledger = out / "ledger.sqlite"
    if how == "emptied":
        ledger.write_bytes(b"")
    else:
        ledger.unlink()
    before = _tree(out)
    for resume in (False, True):
        with pytest.raises(RunDirError, match=r"holds files of an earlier run \(metrics.jsonl, "
                                              r"summary.json, counts.json"):
            run(None if resume else load_config(None, SIM), out, resume=resume,
                stream=io.StringIO())
    assert _tree(out) == before


def test_a_resume_of_a_finished_run_exits_at_once_writing_nothing(finished: Path,
                                                                  tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = _copy(finished, tmp_path / "run")
    before = _tree(out)
    stream = io.StringIO()
    result = run(None, out, resume=True, stream=stream)
    assert result.ok and result.summary["steps"] == 4
    assert "finished at step 4 (run.steps 4): nothing to do" in stream.getvalue()
    assert _tree(out) == before
    assert sorted(p.name for p in out.iterdir()) == sorted({p.split("/")[0] for p in before})
    # asking for more steps resumes as before
    more = run(load_config(None, [*SIM, "run.steps=5"]), out, resume=True,
               stream=io.StringIO())
    assert more.ok and more.summary["steps"] == 5


def test_a_config_error_found_while_the_parts_are_built_leaves_it_re_runnable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config error found after the ledger was opened (the model, the learner, the engines:
    e.g. a LoRA setting the skeleton check missed) leaves a new run's directory as if it
    never started: the fixed command runs there, not "already holds a run"."""
    from freshroll.errors import ConfigError
    from freshroll.runtime import run as run_mod

    real = run_mod.build_components

    def broken(*args: object, **kwargs: object) -> object:
        raise ConfigError("trainer.lora: found at the learner's build")

    out = tmp_path / "run"
    monkeypatch.setattr(run_mod, "build_components", broken)
    with pytest.raises(ConfigError, match="found at the learner's build"):
        run_mod.run(load_config(None, SIM), out, stream=io.StringIO())
    assert not (out / "ledger.sqlite").exists()
    monkeypatch.setattr(run_mod, "build_components", real)
    assert run_mod.run(load_config(None, SIM), out, stream=io.StringIO()).ok

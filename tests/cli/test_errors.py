"""The CLI's error boundary: every failure is one line on stderr and a documented status.

Issue 6, item 10. Each failure the issue lists is driven here through the real ``main``
(click's CliRunner), mostly with a component replaced by one that fails that way, and
the test asserts the one line (no traceback) and the exit status.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from freshroll import boundary
from freshroll.cli import main
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import save_tiny
from freshroll.errors import (
    ConfigError,
    LedgerError,
    RunDirError,
    RunFailed,
    WorkerLost,
)
from freshroll.harness.verify import verify_run
from freshroll.runtime import learner as learner_mod
from freshroll.runtime import placements
from freshroll.runtime import run as run_mod

SMALL = ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
         "rollout.batch_groups=2"]


def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def _one_line(result: Result, prefix: str = "error: ") -> str:
    """The single stderr line of a failed command (and no traceback anywhere)."""
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit), result.exception
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def _run_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    def fails(*a: Any, **kw: Any) -> Any:
        raise exc

    monkeypatch.setattr(run_mod, "run", fails)


# -- the boundary, one error kind at a time ------------------------------------------------


@pytest.mark.parametrize("exc,status,text", [
    (ConfigError("rollout.group_size: must be >= 2"), 2, "error: rollout.group_size"),
    (RunDirError("x: locked by pid 7"), 2, "error: x: locked by pid 7"),
    (LedgerError("ledger.sqlite: truncated"), 3, "error: ledger.sqlite: truncated"),
    (RunFailed("reward fn 'boom' failed 64 times"), 3, "error: reward fn 'boom'"),
])
def test_errors_of_the_tree_are_one_line_with_their_status(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, exc: Exception, status: int, text: str
):
    _run_raising(monkeypatch, exc)
    result = _cli("run", *SMALL, "--out", str(tmp_path / "r"))
    assert result.exit_code == status
    assert _one_line(result).startswith(text)


def test_an_exception_group_shows_its_first_meaningful_leaf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    import asyncio

    group = ExceptionGroup("unhandled errors in a TaskGroup", [
        ExceptionGroup("inner", [WorkerLost("inference actor died: w0")]),
    ])
    _run_raising(monkeypatch, BaseExceptionGroup("outer", [asyncio.CancelledError(), group]))
    result = _cli("run", *SMALL, "--out", str(tmp_path / "r"))
    assert result.exit_code == 3
    line = _one_line(result)
    assert "gave up after retries" in line and "inference actor died: w0" in line


def test_disk_full_anywhere_in_a_run_is_a_storage_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "counts.json"))
    _run_raising(monkeypatch, ExceptionGroup("tg", [full]))
    result = _cli("run", *SMALL, "--out", str(tmp_path / "r"))
    assert result.exit_code == 3
    line = _one_line(result)
    assert "No space left on device" in line and "counts.json" in line


def test_a_bug_is_one_line_and_its_traceback_goes_to_error_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    out = tmp_path / "r"
    out.mkdir()
    _run_raising(monkeypatch, ExceptionGroup("tg", [TypeError("unsupported operand")]))
    result = _cli("run", *SMALL, "--out", str(out))
    assert result.exit_code == 3
    line = _one_line(result)
    assert "internal error: TypeError: unsupported operand" in line
    assert f"traceback in {out / 'error.log'}" in line
    assert "Traceback" in (out / "error.log").read_text()


def test_freshroll_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    _run_raising(monkeypatch, TypeError("unsupported operand"))
    result = _cli("run", *SMALL, "--out", str(tmp_path / "r"),
                  env={boundary.DEBUG_ENV: "1"})
    assert result.exit_code == 3
    assert "Traceback" in result.stderr and "TypeError: unsupported operand" in result.stderr


def test_keyboard_interrupt_says_how_to_resume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "ledger.sqlite").write_bytes(b"")
    _run_raising(monkeypatch, KeyboardInterrupt())
    result = _cli("run", *SMALL, "--out", str(out))
    assert result.exit_code == 130
    line = _one_line(result, "interrupted: ")
    assert line.endswith(f"resume with: freshroll run --resume {out}")


def test_keyboard_interrupt_before_a_run_exists_says_nothing_to_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _run_raising(monkeypatch, KeyboardInterrupt())
    result = _cli("run", *SMALL, "--out", str(tmp_path / "never"))
    assert result.exit_code == 130
    assert "nothing to resume" in _one_line(result, "interrupted: ")


def test_other_commands_are_inside_the_boundary_too(tmp_path: Path):
    (tmp_path / "ledger.sqlite").write_bytes(b"garbage, not sqlite" * 100)
    result = _cli("verify", str(tmp_path))
    assert result.exit_code in (2, 3)
    assert "ledger.sqlite" in _one_line(result)


# -- the run directory ------------------------------------------------------------------


def test_out_naming_a_file_is_a_run_dir_error(tmp_path: Path):
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    result = _cli("run", *SMALL, "--out", str(file))
    assert result.exit_code == 2
    assert _one_line(result) == f"error: --out {file}: is a file, not a run directory"


def test_resume_on_a_read_only_directory_is_a_run_dir_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setattr(boundary, "writable", lambda d: False)  # root ignores chmod; see below
    result = _cli("run", "--resume", str(tmp_path))
    assert result.exit_code == 2
    assert _one_line(result) == (f"error: --resume {tmp_path}: {tmp_path} is read-only (a run "
                                 "writes its ledger, metrics and checkpoints there)")


def test_writable_probe_detects_a_directory_that_refuses_files(tmp_path: Path):
    assert not boundary.writable(Path("/proc"))
    assert boundary.writable(tmp_path)


def test_a_read_only_error_while_writing_the_run_dir_is_a_run_dir_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """The probe passed but a write failed later (EROFS): typed where it escapes."""
    import freshroll.runtime.prepare as run_module

    def read_only(path: Path, text: str) -> None:  # the first file a run writes
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(run_module, "write_text_atomic", read_only)
    result = _cli("run", *SMALL, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    line = _one_line(result)
    assert "Read-only file system" in line and "config.yaml" in line


# -- the model under model.path ---------------------------------------------------------


def test_garbage_config_json_names_the_file(tmp_path: Path):
    model = save_tiny(tmp_path / "m", seed=0)
    (model / "config.json").write_text("{ this is not json")
    result = _cli("run", *SMALL, f"model.path={model}", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert str(model / "config.json") in _one_line(result)


def test_garbage_weights_name_the_file(tmp_path: Path):
    model = save_tiny(tmp_path / "m", seed=0)
    weights = model / "model.safetensors"
    weights.write_bytes(b"\x00garbage" * 64)
    result = _cli("run", *SMALL, f"model.path={model}", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert str(weights) in _one_line(result)


def test_a_config_transformers_cannot_load_is_a_config_error(tmp_path: Path):
    model = save_tiny(tmp_path / "m", seed=0)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such-model"}))
    result = _cli("run", *SMALL, f"model.path={model}", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert f"error: model.path: {model}/config.json does not load" in _one_line(result)
    with pytest.raises(ConfigError, match=f"model: cannot load {model}"):
        HFEngine.from_pretrained(model)
    with pytest.raises(ConfigError, match=f"model: cannot load {model}"):
        learner_mod.build_learner(Any, model, Any, tmp_path)  # type: ignore[arg-type]


def test_a_tokenizer_that_changes_the_prompts_is_refused_by_config_check(tmp_path: Path):
    """Issue 48, item 1: a Qwen2 model saved with the character tokenizer reloads as
    Qwen2Tokenizer, which drops spaces; ``config check`` (and so ``run``) refuses it in one
    line naming the class and the model, where it used to say ok."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from freshroll.engines.tiny import TINY_DEFAULTS, build_tokenizer, save_model_dir

    tok = build_tokenizer()
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), **TINY_DEFAULTS))
    path = save_model_dir(model, tok, tmp_path / "qwen")
    result = _cli("config", "check", *SMALL, f"model.path={path}")
    assert result.exit_code == 2, result.output
    line = _one_line(result)
    assert "Qwen2Tokenizer" in line and str(path) in line and "becomes" in line


# -- failures inside a real run ---------------------------------------------------------


def test_disk_full_during_a_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def full(path: Path, **kw: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path) + ".tmp/model.safetensors")

    from freshroll.trainer import checkpoint as checkpoint_mod  # imported by the writer's call

    monkeypatch.setattr(checkpoint_mod, "save_checkpoint", full)
    out = tmp_path / "r"
    result = _cli("run", *SMALL, "run.steps=2", "trainer.checkpoint_every=1", "--out", str(out))
    assert result.exit_code == 3
    target = out / "checkpoints" / "step-000001"
    assert _one_line(result) == (f"error: checkpoint {target}: cannot write {target}.tmp/"
                                 "model.safetensors: No space left on device")
    assert verify_run(out).ok  # the ledger was closed: nothing half-applied


def test_disk_full_inside_safetensors_is_a_disk_full_error_naming_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Issue 23, defect 6: safetensors raises its own SafetensorError for a failed write
    (it writes a temp file of its own beside the target); it was "internal error: ... (a
    bug)". The run stops with exit 3, closed, and resumes to the end once space is back."""
    from safetensors import SafetensorError

    from freshroll.trainer import checkpoint

    def full(tensors: Any, filename: str, *a: Any, **kw: Any) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              f"(os error 28) at path \"{Path(filename).parent}/.tmpQ2xZ9a\"")

    monkeypatch.setattr(checkpoint, "save_file", full)
    out = tmp_path / "r"
    steps = ["run.steps=2", "trainer.checkpoint_every=1"]
    result = _cli("run", *SMALL, *steps, "--out", str(out))
    assert result.exit_code == 3
    target = out / "checkpoints" / "step-000001"
    assert _one_line(result) == (f"error: checkpoint {target}: cannot write {target}.tmp/"
                                 "model.safetensors: No space left on device")
    assert not (out / "error.log").exists()  # not a bug
    assert verify_run(out).ok
    monkeypatch.undo()
    resumed = _cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.stderr
    report = verify_run(out)
    assert report.ok and report.closed
    assert (out / "checkpoints" / "step-000002" / "model.safetensors").is_file()


SIM_RUN = [*SMALL, "rollout.engine=sim", "sim.clock=virtual", "run.steps=8"]


def test_disk_full_during_a_ledger_write_closes_the_ledger_and_resumes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Issue 23, defect 6: a full disk during a ledger write left the ledger open
    (``freshroll verify``: exit 1), against the README's promise for exit 3. The run's ledger
    keeps a reserve for its closing write. The disk is simulated by SQLite's page limit (the
    same SQLITE_FULL), full from the third flush on; spending the reserve frees the space."""
    from freshroll.ledger.store import LEDGER_FILE, Ledger

    flush, spend = Ledger.flush, Ledger._spend_reserve
    flushes = [0]

    def filling(self: Ledger) -> None:
        flushes[0] += 1
        if flushes[0] == 3:
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            self._db.execute(f"PRAGMA max_page_count={pages}")
        flush(self)

    def spend_and_free(self: Ledger) -> bool:
        spent = spend(self)
        if spent:
            self._db.execute("PRAGMA max_page_count=1000000")
        return spent

    monkeypatch.setattr(Ledger, "flush", filling)
    monkeypatch.setattr(Ledger, "_spend_reserve", spend_and_free)
    out = tmp_path / "r"
    result = _cli("run", *SIM_RUN, "--out", str(out))
    assert result.exit_code == 3
    assert _one_line(result) == (
        f"error: cannot write {out / LEDGER_FILE}: disk full (database or disk is full)")
    verified = _cli("verify", str(out))
    assert verified.exit_code == 0, verified.output  # closed and verifiable, as documented
    assert not (out / (LEDGER_FILE + ".reserve")).exists()
    monkeypatch.undo()
    resumed = _cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.stderr
    report = verify_run(out)
    assert report.ok and report.closed
    assert json.loads((out / "summary.json").read_text())["steps"] == 8


class _AlwaysLost:
    """An engine whose process dies on every call; it can always 'restart'."""

    def generate(self, prompts: Any, **kw: Any) -> Any:
        raise WorkerLost("inference actor died: simulated")

    def load_weights(self, state: Any) -> float:
        return 0.0

    def state_dict(self) -> Any:
        return {}

    def restart(self) -> None:
        pass


def test_worker_lost_more_than_max_restarts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(placements, "build_engine",
                        lambda cfg, path, name, *channel: _AlwaysLost())
    out = tmp_path / "r"
    result = _cli("run", *SMALL, "run.steps=2", "rollout.workers=1", "--out", str(out))
    assert result.exit_code == 3
    line = _one_line(result)
    assert "inference actor died: simulated" in line
    assert verify_run(out).ok


_ENGINE_INTERRUPTS = """
import sys
from freshroll.engines.hf import HFEngine
from freshroll.runtime import learner as learner_mod
from freshroll.runtime import placements

class Interrupts:
    def __init__(self, path):
        self.engine = HFEngine.from_pretrained(path)
    def generate(self, *a, **kw):
        raise KeyboardInterrupt
    def load_weights(self, state):
        return 0.0
    def state_dict(self):
        return {}

placements.build_engine = lambda cfg, path, name, *channel: Interrupts(path)
from freshroll.cli import main
sys.argv = ["freshroll", "run", *sys.argv[1:]]
main()
"""


def test_keyboard_interrupt_raised_in_a_worker_thread_is_one_line(tmp_path: Path):
    """The abandoned pipeline task is not logged with a traceback at exit. Inline: the
    replaced engine is this process's (``run.runtime`` auto would start the forkserver, a
    second Python importing torch, and a thread probe, for a worker that is a thread here)."""
    import subprocess
    import sys

    out = tmp_path / "r"
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-c", _ENGINE_INTERRUPTS, *SMALL, "run.steps=2", "rollout.workers=1",
         "run.runtime=inline", "--out", str(out)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(f"freshroll run --resume {out}")


def test_keyboard_interrupt_raised_by_a_reward(tmp_path: Path):
    fn = tmp_path / "rewards.py"
    fn.write_text("def stop(prompts, completions, **kw):\n    raise KeyboardInterrupt\n")
    out = tmp_path / "r"
    result = _cli("run", *SMALL, "run.steps=2", f"rewards=[{{fn: '{fn}:stop'}}]",
                  "--out", str(out))
    assert result.exit_code == 130
    line = _one_line(result, "interrupted: ")
    assert line.endswith(f"resume with: freshroll run --resume {out}")
    assert verify_run(out).ok


# -- SIGTERM is SIGINT ------------------------------------------------------------------

_SLEEPER = """
import signal, sys, time
from freshroll.boundary import sigterm_as_sigint
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job
if sys.argv[1] == "blocked":  # as inherited from a parent's thread that blocked it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
try:
    with sigterm_as_sigint():
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(1)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored", "blocked"])
def test_sigterm_stops_like_sigint_even_when_sigint_is_ignored_or_sigterm_blocked(sigint: str):
    import signal
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER, sigint], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": src})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()


def test_a_blocked_sigterm_is_blocked_again_on_leaving():
    import signal

    from freshroll.boundary import sigterm_as_sigint

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with sigterm_as_sigint():
            assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)

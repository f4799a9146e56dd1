"""``rollout.engine: sim`` through ``freshroll run``'s recipe: components from
``freshroll.sim.components.build_sim`` (here an async stand-in with the same contract), no
model loaded, the virtual clock started where the ledger ends on resume."""

from __future__ import annotations

import io
import sqlite3
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from async_fakes import Factory, Scorer, Trainer
from freshroll.config import load_config
from freshroll.harness.verify import verify_run
from freshroll.runtime import run as run_mod


@dataclass
class _Parts:
    engine_factory: Any
    scorer: Any
    trainer: Any
    model_digest: str = "sim-stand-in"


@pytest.fixture
def sim_module(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def build_sim(cfg: Any, clock: Any, buf: Any) -> _Parts:
        calls.append((cfg, clock, buf))
        return _Parts(Factory(base_s=1.0, startup_s=3.0), Scorer(), Trainer(0.5))

    module = types.ModuleType("freshroll.sim.components")
    module.build_sim = build_sim  # type: ignore[attr-defined]
    module.sim_model_digest = lambda cfg: "sim-stand-in"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "freshroll.sim.components", module)
    return calls


def _ts(out: Path) -> list[tuple[str, float]]:
    db = sqlite3.connect(out / "ledger.sqlite")
    try:
        return [(k, t) for k, t in db.execute(
            "SELECT kind, json_extract(body, '$.ts') FROM events ORDER BY seq")]
    finally:
        db.close()


@pytest.mark.slow
def test_a_sim_run_uses_the_virtual_clock_and_resumes_forward_in_time(
    tmp_path: Path, sim_module: list[Any],
):
    over = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
            "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
            "rollout.workers=3", "rollout.worker_batch=4"]
    out = tmp_path / "run"
    result = run_mod.run(load_config(None, [*over, "run.steps=30"]), out, stream=io.StringIO())
    assert result.ok, verify_run(out).render()
    [(_, clock, _)] = sim_module
    assert type(clock).__name__ == "VirtualClock"
    assert not (out / "model").exists() and not (out / "checkpoints").exists()
    first = _ts(out)
    assert first[0] == ("opened", 0.0)
    end = first[-1][1]
    assert end > 20  # virtual seconds: engines sleep ~1 s per request, the trainer 0.5 s a step

    cfg = load_config(None, [*over, "run.steps=40"])
    result = run_mod.run(cfg, out, resume=True, stream=io.StringIO())
    assert result.ok, verify_run(out).render()
    events = _ts(out)
    reopened = [t for k, t in events if k == "opened"]
    assert len(reopened) == 2 and reopened[1] >= end  # time never goes back
    stamps = [t for _, t in events]
    assert stamps == sorted(stamps)
    assert result.summary is not None


def test_a_sim_runs_input_checks_leave_transformers_alone(monkeypatch: pytest.MonkeyPatch):
    """The simulated cluster loads no model, so its input checks do not import transformers
    to quiet its progress bars (~0.7 CPU-s of every process that runs only sim runs: the
    chaos workers and zygotes); a run with a model still quiets them before it loads one."""
    from freshroll.chaos.plan import BASE_WORKLOAD
    from freshroll.config import validate
    from freshroll.runtime import prepare

    quieted: list[str] = []
    monkeypatch.setattr(prepare, "quiet_transformers", lambda: quieted.append("hf"))
    sim = prepare.check_inputs(validate(BASE_WORKLOAD, "sim"))
    assert sim.digest is not None and sim.pending is None and quieted == []
    real = prepare.check_inputs(load_config(None, ["task.n_prompts=8"]))
    assert real.pending is not None and quieted == ["hf"]


@pytest.mark.parametrize("tty", [True, False])
def test_the_start_line_fits_a_terminal_and_is_whole_in_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tty: bool,
):
    """Issue 48, item 2: the start line (about 600 characters with a model) is wrapped to
    the terminal's width, its pieces in order; in a log it stays one line."""
    import os
    import re

    from freshroll.observe import fit as fit_mod

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    monkeypatch.setattr(fit_mod.shutil, "get_terminal_size", lambda: os.terminal_size((60, 24)))
    over = ["rollout.engine=sim", "sim.clock=virtual", "run.steps=2", "task.n_prompts=64",
            "rollout.group_size=4", "rollout.batch_groups=2"]
    stream = Stream()
    out = tmp_path / "a-run-directory-with-a-long-name" / "run"
    assert run_mod.run(load_config(None, over), out, stream=stream).ok
    text = stream.getvalue()
    start = text[text.index("freshroll: "):text.index("control ")].split("\n")
    if tty:
        assert len(start) > 1 and all(len(x) <= 59 for x in start), start
        assert all(x.startswith("  ") for x in start[1:])
        drawn = re.split("[\r\n]", text[text.index("step "):].replace("\x1b[K", ""))
        assert all(len(x) <= 59 for x in drawn if x.startswith("step ")), drawn
    else:
        assert len(start) == 1 and len(start[0]) > 60


def test_a_simulated_run_imports_neither_torch_nor_transformers(tmp_path: Path):
    """``freshroll simulate`` in a fresh process: the run, its verify and report, and no torch
    (3-4 s of a short simulation's start were torch's import; chaos cases and what-if sweeps
    start many)."""
    import os
    import subprocess

    code = ("import sys, runpy\n"
            f"sys.argv = ['freshroll', 'simulate', 'configs/sim-p1.yaml', '--out', "
            f"{str(tmp_path / 'sim')!r}, 'run.steps=1', 'run.progress=false']\n"
            "try:\n    runpy.run_module('freshroll', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
    assert verify_run(tmp_path / "sim").ok

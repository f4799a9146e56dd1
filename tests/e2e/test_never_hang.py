"""The real CLI never hangs: failing rewards, stuck rewards, non-finite rewards and a resume
with a smaller max_staleness all end, with one line and a ledger that verifies.

Before: each of these ran until killed (`timeout 90 freshroll run` exited 124, silent).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, freshroll, metrics, summary

REPRO = ["run.steps=3", "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
         "run.progress=false"]


def _reward_config(tmp_path: Path, body: str, name: str) -> Path:
    reward_file = tmp_path / f"{name}.py"
    reward_file.write_text(textwrap.dedent(body))
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"rewards:\n  - fn: {reward_file}:{name}\n")
    return cfg


def _failed_run(proc: subprocess.CompletedProcess[str], out: Path) -> str:
    assert proc.returncode not in (0, 124), (proc.returncode, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    verified = freshroll("verify", str(out))
    assert verified.returncode == 0 and "closed" in verified.stdout
    return errors[0]


@pytest.mark.slow
def test_an_always_raising_reward_ends_the_run_with_one_line(tmp_path: Path):
    cfg = _reward_config(tmp_path, """
        def raises(prompts, completions, **kw):
            raise RuntimeError("boom")
    """, "raises")
    out = tmp_path / "run"
    proc = freshroll("run", str(cfg), *REPRO, "--out", str(out), check=False)
    line = _failed_run(proc, out)
    assert "reward function 'raises'" in line and '"raises raised RuntimeError: boom"' in line
    db = sqlite3.connect(out / "ledger.sqlite")
    assert db.execute("SELECT json_extract(body, '$.reason') FROM events "
                      "WHERE kind='closed'").fetchall() == [("failed",)]
    assert proc.returncode == 3
    # the verdict says plainly that nothing was trained, and quotes the first failure
    assert "run INCOMPLETE" not in proc.stderr  # one line: the error is the message
    verdict = summary(out)["verdict"]
    assert verdict["status"] == "no steps" and verdict["steps_asked"] == 3
    assert "RuntimeError: boom" in verdict["first_failure"]["reward_error"]["first"]
    html = (out / "report.html").read_text()
    assert "training verdict: no steps" in html and "RuntimeError: boom" in html


@pytest.mark.slow
def test_a_reward_beyond_float32_never_commits_a_nan_step(tmp_path: Path):
    cfg = _reward_config(tmp_path, """
        def huge(prompts, completions, **kw):
            return [1e308] * len(completions)
    """, "huge")
    out = tmp_path / "run"
    proc = freshroll("run", str(cfg), *REPRO, "--out", str(out), check=False)
    line = _failed_run(proc, out)
    assert "reward function 'huge'" in line and "not finite in float32" in line
    db = sqlite3.connect(out / "ledger.sqlite")
    assert db.execute("SELECT count(*) FROM events WHERE kind='committed'").fetchone() == (0,)


@pytest.mark.slow
def test_a_reward_that_sleeps_forever_times_out_and_the_process_exits(tmp_path: Path):
    cfg = _reward_config(tmp_path, """
        import time
        def sleeps(prompts, completions, **kw):
            time.sleep(10**6)
    """, "sleeps")
    out = tmp_path / "run"
    # inline on one thread: the abandoned reward thread is the driver's, whatever the
    # workers' placement; auto would start the forkserver (a second Python importing torch)
    # and a thread probe
    proc = freshroll("run", str(cfg), *REPRO, "limits.reward_timeout_s=1", "run.runtime=inline",
                     "run.torch_threads=1", "--out", str(out), timeout=90, check=False,
                     subprocess=True)
    line = _failed_run(proc, out)
    assert "reward function 'sleeps' (timeouts) failed 3 calls in a row" in line
    db = sqlite3.connect(out / "ledger.sqlite")
    n = db.execute("SELECT count(*) FROM events WHERE kind='discarded' "
                   "AND json_extract(body, '$.reason')='reward_timeout'").fetchone()[0]
    assert n > 0


@pytest.mark.slow
def test_resume_with_max_staleness_zero_does_not_hang(tmp_path: Path):
    """The issue's repro: kill a smoke run mid-way, set max_staleness 0, resume. The killed
    run is inline on one thread (no forkserver to start, no thread probe, and its sync resume
    no trial of two threads: placement and threads are not what is tested) and 40 steps,
    killed after 10: the resume trains the other 30 or so in sync (it was 80: 70 steps)."""
    out = tmp_path / "run"
    steps = 40
    proc = subprocess.Popen(
        [sys.executable, "-m", "freshroll", "run", "configs/smoke.yaml", f"run.steps={steps}",
         "run.progress=false", "run.runtime=inline", "run.torch_threads=1", "--out", str(out)],
        cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            rows = out / "metrics.jsonl"
            if rows.is_file() and len(rows.read_text().splitlines()) >= 10:
                break
            if proc.poll() is not None:
                pytest.fail("run finished before it could be killed")
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert len(metrics(out)) < steps
    saved = yaml.safe_load((out / "config.yaml").read_text())
    saved["run"]["max_staleness"] = 0
    (out / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))

    # the change is explicit and recorded (resume rules); the point here: no hang
    res = freshroll("run", "--resume", str(out), "--allow-change", "run.max_staleness",
                    timeout=240)
    assert "verify: ok" in res.stdout
    assert summary(out)["steps"] == steps


@pytest.mark.slow
def test_a_reward_module_that_blocks_at_import_fails_naming_the_file(tmp_path: Path):
    """Before: `freshroll run` hung forever importing it."""
    cfg = _reward_config(tmp_path, """
        import time
        time.sleep(120)
        def blocks(prompts, completions, **kw):
            return [0.0] * len(completions)
    """, "blocks")
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = freshroll("run", str(cfg), *REPRO, "limits.reward_import_timeout_s=0.6",
                     "limits.heartbeat_s=0.2", "--out", str(out), check=False)
    assert time.monotonic() - t0 < 60  # it sleeps 120 s (and the command imports torch)
    assert proc.returncode == 2, proc.stderr  # a config error: nothing was run
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"reward import {tmp_path / 'blocks.py'} did not finish within 0.6 s " \
           "(limits.reward_import_timeout_s)" in errors[0]
    assert "on reward import" in proc.stderr and not (out / "ledger.sqlite").exists()


@pytest.mark.slow
def test_a_run_that_commits_nothing_stops_naming_the_stage_and_resumes(tmp_path: Path):
    """A reward stuck for longer than limits.max_no_progress_s (its own bound is longer):
    heartbeat lines name it, the run stops (exit 3) naming it, and --resume finishes."""
    flag = tmp_path / "stuck"
    flag.touch()
    cfg = _reward_config(tmp_path, f"""
        import pathlib, time
        FLAG = pathlib.Path({str(flag)!r})
        def sticky(prompts, completions, **kw):
            while FLAG.exists():
                time.sleep(0.05)
            return [float(len(c) % 2) for c in completions]
    """, "sticky")
    out = tmp_path / "run"
    try:
        repro = [x for x in REPRO if not x.startswith("run.steps=")]  # a key given once
        proc = freshroll("run", str(cfg), *repro, "run.steps=1", "run.runtime=inline",
                         "limits.reward_timeout_s=60",
                         "limits.max_no_progress_s=1", "limits.heartbeat_s=0.3",
                         "--out", str(out), check=False)
    finally:
        flag.unlink()  # the abandoned reward thread returns
    line = _failed_run(proc, out)
    assert proc.returncode == 3
    assert "no trainer step committed for 1." in line and "max_no_progress_s=1)" in line
    assert "s on reward function 'sticky', limit 60 s" in line
    beats = [x for x in proc.stderr.splitlines() if x.startswith("waiting ")]
    assert beats and all("limit" in x for x in beats), proc.stderr
    res = freshroll("run", "--resume", str(out), "limits.max_no_progress_s=600")
    assert "verify: ok" in res.stdout
    assert summary(out)["steps"] == 1

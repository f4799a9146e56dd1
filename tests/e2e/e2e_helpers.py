"""Helpers for end-to-end tests: run the real ``freshroll`` CLI, in this process or in a child.

:func:`freshroll` runs the command line in the test's own process by default (click's test
runner on :func:`freshroll.cli.main`: the same parsing, error boundary, exit statuses and
output, without a new interpreter importing torch and transformers, about 3 s a call).
``subprocess=True`` runs ``python -m freshroll.cli`` in a child instead; the tests that
need one say so, and are the named set of docs/testing.md: signals and kills of the run
(SIGINT, SIGTERM, SIGKILL), a wall-clock bound on a run that must not hang, a second
process on one run directory, and the Ray reaper (its watchdog outlives the driver).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess as sp
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def freshroll(
    *args: str, timeout: float = 300, check: bool = True, subprocess: bool = False
) -> sp.CompletedProcess[str]:
    """``freshroll ARGS`` from the repository root: its status, stdout and stderr.

    ``timeout`` bounds a child (``subprocess=True``); in process a hang is caught by the
    run's own limits. ``check``: a non-zero status fails the test with the output."""
    if subprocess:
        proc = sp.run(
            [sys.executable, "-m", "freshroll", *args], cwd=REPO,
            env={**os.environ, **OFFLINE}, text=True, capture_output=True, timeout=timeout,
        )
    else:
        proc = _in_process(args)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"freshroll {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def _in_process(args: tuple[str, ...]) -> sp.CompletedProcess[str]:
    from click.testing import CliRunner

    from freshroll.cli import main

    with _as_a_fresh_process():
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return sp.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def _as_a_fresh_process() -> Iterator[None]:
    """What a command may change in its process, put back afterwards: the working
    directory, the environment, signal handlers and torch's thread counts."""
    import torch

    cwd, env = os.getcwd(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    os.environ.update(OFFLINE)
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]

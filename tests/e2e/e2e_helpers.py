"""Helpers for end-to-end tests: run the real ``freshroll`` CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def freshroll(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "freshroll.cli", *args], cwd=REPO, env=env, text=True,
        capture_output=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"freshroll {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]

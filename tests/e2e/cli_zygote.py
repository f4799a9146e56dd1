"""A zygote for ``freshroll`` command lines that must run as real processes (a test kills
them) but need not pay a Python start-up each (importing torch and transformers: ~4 s of a
core).

``python tests/e2e/cli_zygote.py``: imports the CLI and what a run of the embedded model
imports, before any thread exists, then reads one JSON request per line on stdin
(``{"args": [...], "env": {...}, "log": PATH, "timeout_s": S}``), forks a child that runs
``freshroll ARGS`` with ``env`` added (stdout and stderr to ``log``), waits for it and
answers one line: the exit status (``-9``: ended by SIGKILL), or ``"timeout"`` after
killing it. The same way as the chaos runner's zygote (freshroll/chaos/child.py) and the
process placement's forkserver: a fork of a process that imported torch but ran nothing.

:class:`Zygote` is the test's side.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _child(request: dict[str, Any]) -> None:
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.update(request["env"])
        from freshroll.cli import main

        try:
            main(request["args"], prog_name="freshroll")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork(request: dict[str, Any]) -> str:
    pid = os.fork()
    if pid == 0:
        _child(request)
    deadline = time.monotonic() + float(request["timeout_s"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return str(os.waitstatus_to_exitcode(status))
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return '"timeout"'
        time.sleep(0.005)


def serve() -> None:
    import torch  # noqa: F401  (what every run imports, once)
    import transformers  # noqa: F401

    import freshroll.cli
    import freshroll.engines.hf
    import freshroll.engines.tiny
    import freshroll.report.html
    import freshroll.runtime.run  # noqa: F401

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(_fork(json.loads(line)) + "\n")
            sys.stdout.flush()


class Zygote:
    """The zygote process (started here, stopped by :meth:`close`)."""

    def __init__(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def run(self, args: list[str], log: Path, env: dict[str, str] | None = None,
            timeout_s: float = 300) -> int | str:
        """``freshroll ARGS`` in a forked child: its exit status (``-9``: SIGKILL)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"args": args, "env": env or {}, "log": str(log), "timeout_s": timeout_s}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: int | str = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    serve()

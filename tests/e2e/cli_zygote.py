"""A zygote for ``freshroll`` command lines that must run as real processes (a test kills
them) but need not pay a Python start-up each (importing torch and transformers: ~4 s of a
core).

``python tests/e2e/cli_zygote.py``: imports the CLI and what a run of the embedded model
imports, before any thread exists, then reads one JSON request per line on stdin
(``{"args": [...], "env": {...}, "log": PATH, "timeout_s": S}``), forks a child that runs
``freshroll ARGS`` with ``env`` added (stdout and stderr to ``log``), waits for it and
answers one line: the exit status (``-9``: ended by SIGKILL), or ``"timeout"`` after
killing it, with the chaos runner's zygote's :func:`freshroll.chaos.child.fork_call`: a
fork of a process that imported torch but ran nothing.

:class:`Zygote` is the test's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _cli(request: dict[str, Any]) -> int:
    """The forked child: ``freshroll ARGS`` with ``env`` added; its exit status."""
    os.environ.update(request["env"])
    from freshroll.cli import main

    try:
        main(request["args"], prog_name="freshroll")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _fork(request: dict[str, Any]) -> str:
    from freshroll.chaos.child import fork_call

    status = fork_call(lambda: _cli(request), Path(request["log"]), float(request["timeout_s"]))
    return '"timeout"' if status is None else str(status)


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

    def fork(self, args: list[str], log: Path, env: dict[str, str] | None = None,
             timeout_s: float = 300) -> Forked:
        """:meth:`run` on a thread: returns at once, while the child runs (one at a time)."""
        return Forked(self, args, log, env or {}, timeout_s)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Forked:
    """A ``freshroll`` child of the zygote, waited for on a thread of the test (the zygote
    answers when the child exits): :attr:`status` is its exit status once it ended."""

    def __init__(self, zygote: Zygote, args: list[str], log: Path, env: dict[str, str],
                 timeout_s: float) -> None:
        self.status: int | str | None = None

        def wait() -> None:
            self.status = zygote.run(args, log, env=env, timeout_s=timeout_s)

        self.thread = threading.Thread(target=wait, daemon=True)
        self.thread.start()

    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout_s: float = 60) -> int | str | None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the forked run did not end"
        return self.status


if __name__ == "__main__":
    serve()

"""The child process of a chaos case whose fault kills the process (a real SIGKILL).

``python -m freshroll.chaos.child SPEC.json``: the runner (:mod:`freshroll.chaos.case`)
writes the spec (the scenario, the seed, the config or ``resume``, the fault indexes to skip,
the liveness horizon, the Injector to use, where to write the result). The child runs one
incarnation of the faulted run under the liveness guard with an Injector whose ``on_kill``
sends this process SIGKILL, after the fault's ``fault_injected`` event is durable: the
process ends with no cleanup at all, as ``kill -9`` would end it.

Unless killed, it writes ``{"status": finished | interrupted | liveness | stopped,
"detail": ...}`` to the result file and exits 0. The switches of :mod:`freshroll.unsafe`
come from the environment (``FRESHROLL_UNSAFE_BREAK``), as for any process.

``python -m freshroll.chaos.child --serve``: a zygote that imports everything once, then for
each spec path read on stdin forks a child that runs that spec (its output to ``SPEC.log``),
waits for it (killing it past the timeout given on the line) and answers one line on stdout:
``exit <status>`` (a negative status is the signal that ended it: ``exit -9`` after SIGKILL)
or ``timeout``. A plan's kill cases then cost a fork each instead of a Python start-up.

The parent's side: :class:`ChildPool` (the zygote, started on first use) and
:func:`exec_child` (one ``python -m`` child).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from freshroll import unsafe
from freshroll.chaos.plan import Scenario
from freshroll.config import validate


def sigkill(kind: str) -> None:
    """The Injector's ``on_kill``: a real SIGKILL of this process."""
    os.kill(os.getpid(), signal.SIGKILL)


def run_spec(spec_path: str) -> int:
    from freshroll.chaos.case import Guard, load_injector, outcome_of, run_in_process

    spec = json.loads(Path(spec_path).read_text())
    scenario = Scenario.model_validate(spec["scenario"])
    make = load_injector(spec["injector"])
    session = Guard(make(scenario, int(spec["seed"]), skip=frozenset(spec["skip"]),
                         on_kill=sigkill), float(spec["horizon_s"]))
    out = Path(spec["out"])
    cfg = None if spec["resume"] else validate(spec["config"], spec_path)
    status, detail = "finished", ""
    try:
        run_in_process(cfg, out, bool(spec["resume"]), session)
    except Exception as exc:  # the case records how it ended, a bug too
        status, detail = outcome_of(exc)
    Path(spec["result"]).write_text(json.dumps({"status": status, "detail": detail}))
    return 0


def fork_call(target: Callable[[], int], log_path: Path, timeout_s: float) -> int | None:
    """Run ``target`` in a forked child, its stdout and stderr to ``log_path`` and stdin
    from /dev/null; wait for it. Returns its exit status (its return value; ``-N`` when
    signal N ended it, ``-9`` after SIGKILL), or None after killing it past ``timeout_s``.
    The child never returns to the caller's code: it leaves by ``os._exit``."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    pid = os.fork()
    if pid == 0:  # the child: its own output, never the parent's answer channel
        code = 1
        try:
            os.dup2(log, 1)
            os.dup2(log, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            code = target()
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(log)
    deadline = time.monotonic() + timeout_s
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


def _fork_one(spec_path: str, timeout_s: float) -> str:
    status = fork_call(lambda: run_spec(spec_path), Path(spec_path).with_suffix(".log"),
                       timeout_s)
    return "timeout" if status is None else f"exit {status}"


def _warm() -> None:
    """Import everything a run imports lazily (transformers' logging, the sim, the end
    files, the Injector) once, by running a tiny simulated run, so no fork repeats it."""
    import io
    import tempfile

    from freshroll.chaos.case import (
        BASELINE_HORIZON_S,
        INJECTOR,
        Guard,
        load_injector,
        run_in_process,
    )
    from freshroll.chaos.plan import BASE_WORKLOAD, merge

    with contextlib.suppress(ImportError):  # a build without the Injector: specs name theirs
        load_injector(INJECTOR)
    with tempfile.TemporaryDirectory(prefix="freshroll-zygote-") as tmp:
        cfg = validate(merge(BASE_WORKLOAD, {"run": {"steps": 1}}), "warm-up")
        with contextlib.redirect_stderr(io.StringIO()):
            run_in_process(cfg, Path(tmp) / "run", False, Guard(None, BASELINE_HORIZON_S))


def serve() -> int:
    _warm()
    for line in sys.stdin:
        if not line.strip():
            continue
        timeout, _, spec_path = line.strip().partition(" ")
        answer = _fork_one(spec_path, float(timeout))
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    return 0


# == the parent's side ======================================================================
def child_env(broken: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    env[unsafe.ENV] = ",".join(broken)
    return env


def exec_child(spec_path: Path, log_path: Path, broken: Sequence[str],
                timeout_s: float) -> int | None:
    """``python -m freshroll.chaos.child SPEC``: its exit status (None: past the timeout)."""
    with log_path.open("w") as log:
        try:
            proc = subprocess.run([sys.executable, "-m", "freshroll.chaos.child", str(spec_path)],
                                  stdout=log, stderr=subprocess.STDOUT, env=child_env(broken),
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None
    return proc.returncode


class ChildPool:
    """A zygote (``python -m freshroll.chaos.child --serve``) that forks one child per kill
    incarnation: a real process, a real SIGKILL, without a Python start-up each time. Started
    on first use; :meth:`close` ends it."""

    def __init__(self, broken: Sequence[str] = ()) -> None:
        self.broken = tuple(broken)
        self.proc: subprocess.Popen[str] | None = None

    def run(self, spec_path: Path, timeout_s: float) -> int | None:
        """The child's exit status (negative: the signal that ended it; None: timed out)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "freshroll.chaos.child", "--serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env=child_env(self.broken))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{timeout_s} {spec_path}\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        if answer[:1] == ["timeout"]:
            return None
        if len(answer) != 2 or answer[0] != "exit":
            from freshroll.errors import RunFailed

            raise RunFailed(f"chaos: the child zygote ended unexpectedly (answer {answer!r})")
        return int(answer[1])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> ChildPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    if len(argv) != 1:
        sys.stderr.write("usage: python -m freshroll.chaos.child SPEC.json | --serve\n")
        return 2
    return run_spec(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

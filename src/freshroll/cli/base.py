"""What every ``freshroll`` command shares: the error boundary's command class, the exit
statuses, the directory option type and :func:`fail` (:mod:`freshroll.cli` puts the commands
together; :mod:`freshroll.cli.rundir` holds the ones that read a run directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import click

from freshroll.errors import FreshrollError

EXIT_STATUSES = """\b
Exit statuses:
  0    ok (also when the reader of the output went away: | head)
  1    verify found a violation (run: the finished run failed verify)
  2    usage or config error: nothing was run or changed (a bad value or key,
       --resume refused, an unusable run directory; any error of verify,
       export, timing, report or trace)
  3    the run failed (retries or failure budget spent, disk full, a bug);
       the ledger is closed and verifiable; --resume continues once fixed
  130  interrupted (Ctrl-C or SIGTERM); freshroll run --resume DIR continues
Every failure is one line on stderr; a bug's traceback goes to RUN_DIR/error.log
(or a temp file), and also to stderr with FRESHROLL_DEBUG=1."""


class Guarded(click.Command):
    """A command inside the error boundary (:mod:`freshroll.boundary`): one line, one status."""

    def invoke(self, ctx: click.Context) -> Any:
        from freshroll import boundary

        run_dir = _run_dir(ctx)
        with boundary.sigterm_as_sigint():
            try:
                if self.name in _RUNS:
                    _check_run_dir(ctx)
                return super().invoke(ctx)
            except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
                raise
            except BrokenPipeError:
                if self.name in _RUNS:  # a run's own pipes (its workers'): the boundary's
                    raise
                _reader_gone()
                ctx.exit(0)
            except BaseException as exc:  # the boundary: nothing else escapes as a traceback
                reads_only = self.name in _READS_ONLY  # its error.log: never in RUN_DIR
                out = boundary.outcome(exc, run_dir=None if reads_only else run_dir,
                                       resumable=self.name in _RUNS, reads_only=reads_only)
        click.echo(out.line, err=True)
        ctx.exit(out.status)


def _reader_gone() -> None:
    """The reader of the command's output went away (``freshroll export RUN -o - | head``):
    the command ends quietly with status 0, as the reader asked for no more, never as an
    "internal error" with an ``error.log`` in the run directory. What is left buffered for
    stdout goes to /dev/null, so the interpreter's flush at exit raises nothing either."""
    import os
    import sys

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's): nothing to flush
        pass
    finally:
        os.close(devnull)


#: commands that read a run directory (``report`` rewrites its summary and page): any error
#: of theirs is a usage or input error (2), and a bug's traceback goes to a temp file
_READS_ONLY = frozenset({"verify", "export", "timing", "report", "trace", "replay", "lineage",
                         "export-samples"})
#: commands that write one run directory (``simulate`` resumes with ``run --resume``)
_RUNS = frozenset({"run", "simulate"})


class Freshroll(click.Group):
    command_class = Guarded


class _DirPath(click.Path):
    """A directory option's path; an empty one is a usage error naming the option (``--out
    ''`` would otherwise be the current directory)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("must not be empty (name a directory)", param, ctx)
        return super().convert(value, param, ctx)


#: the type of every option that names a directory to write (or resume) into
OUT_DIR = _DirPath(path_type=Path)


def _run_dir(ctx: click.Context) -> Path | None:
    """The command's run directory, from its arguments (``run``: as its body resolves it)."""
    p = ctx.params
    if ctx.command.name not in _RUNS:
        value = p.get("run_dir")
        return value if isinstance(value, Path) else None
    for key in ("resume_dir", "out"):
        if isinstance(p.get(key), Path):
            return Path(p[key])
    config = p.get("config")
    if isinstance(config, Path) and not ("=" in str(config) and not config.exists()):
        return Path("runs") / config.stem
    return Path("runs") / ("default" if ctx.command.name == "run" else "simulate")


def _check_run_dir(ctx: click.Context) -> None:
    """``run``: refuse a run directory that cannot be used, before anything is loaded."""
    from freshroll.boundary import check_run_dir

    resume = ctx.params.get("resume_dir")
    path = resume if isinstance(resume, Path) else ctx.params.get("out")
    if isinstance(path, Path):
        check_run_dir(path, "--resume" if resume is not None else "--out")


def fail(exc: FreshrollError) -> NoReturn:
    """Hand a command's error to the boundary (:class:`Guarded`): one line, its status."""
    raise exc


__all__ = ["EXIT_STATUSES", "OUT_DIR", "Freshroll", "Guarded", "fail"]

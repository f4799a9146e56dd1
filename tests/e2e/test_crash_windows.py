"""Issue 23's crash-window sweep: a run SIGKILLed in every named window of its life
(:mod:`freshroll.crashpoints`: run directory, config, model save, ledger creation,
checkpoint write, first commit, end files) leaves a directory that the recovery opens and
finishes, and that ``verify`` passes: the same steps, no sample twice, no leftover.

Each kill is a real ``SIGKILL`` of a real ``freshroll run`` process (its own code runs no
further: no ``finally``, no ``atexit``), fired by ``FRESHROLL_CRASH_AT`` the first time
the run reaches the point. The recovery is ``freshroll run --resume RUN_DIR``; where the
kill came before a ledger or a config existed (nothing to resume), that resume says so in
one line naming the command that starts the run, and that command does.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_zygote import Zygote
from e2e_helpers import freshroll, metrics, summary

from freshroll import crashpoints
from freshroll.ledger.store import LEDGER_FILE

pytestmark = pytest.mark.slow

STEPS = 2
#: the leftovers a kill may leave beside what it was writing; none may survive the recovery
LEFTOVERS = ("model.tmp", "model.old", f"{LEDGER_FILE}.tmp-*", ".config.yaml.tmp",
             "checkpoints/*.tmp", "checkpoints/*.old")


def _args(out: Path, small: list[str]) -> list[str]:
    # inline: no worker children (a kill of the process group is test_resume's); a checkpoint
    # every step so that the checkpoint point is reached before the first commit
    return ["run", *small, f"run.steps={STEPS}", "trainer.checkpoint_every=1",
            "run.runtime=inline", "--out", str(out)]


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """The killed runs are real processes, forked from one that imported torch once."""
    z = Zygote()
    yield z
    z.close()


@pytest.mark.parametrize("point", crashpoints.POINTS)
def test_a_kill_in_every_window_resumes_and_verifies(
        tmp_path: Path, small: list[str], point: str, zygote: Zygote) -> None:
    out, log = tmp_path / "run", tmp_path / "killed.log"
    status = zygote.run(_args(out, small), log, env={crashpoints.ENV: point})
    assert status == -signal.SIGKILL, (status, log.read_text()[-2000:])
    assert out.is_dir()
    resumed = freshroll("run", "--resume", str(out), check=False)
    if point == "rundir":  # nothing written but the lock: nothing to resume, said so
        assert resumed.returncode == 2, resumed.stderr
        assert f"start the run with --out {out}" in resumed.stderr
        assert len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr
        resumed = freshroll(*_args(out, small), check=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "verify: ok" in resumed.stdout
    verified = freshroll("verify", str(out), check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert summary(out)["steps"] == STEPS
    assert [row["step"] for row in metrics(out)] == list(range(1, STEPS + 1))
    assert (out / "report.html").is_file()
    left = [str(p.relative_to(out)) for pattern in LEFTOVERS for p in out.glob(pattern)]
    assert left == []


def test_a_crash_point_that_does_not_exist_is_refused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped point would let the run finish and a crash test pass without a kill."""
    monkeypatch.setenv(crashpoints.ENV, "ledgr")
    res = freshroll("run", "run.steps=1", "--out", str(tmp_path / "run"), check=False)
    assert res.returncode == 2
    assert "FRESHROLL_CRASH_AT='ledgr': not a crash point; one of rundir," in res.stderr
    assert not (tmp_path / "run").exists()

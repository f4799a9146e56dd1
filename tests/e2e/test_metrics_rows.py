"""metrics.jsonl through the real CLI: rows equal the ledger's, and a resume reconciles them.

A kill between the durable commit and the row's write is simulated by cutting the file of
a finished run (the last row lost, the one before it torn); a resume that appended a
second set of rows by doubling it. ``freshroll verify`` must catch both, and a
``--resume`` must put the file back to exactly the rows the ledger implies.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from e2e_helpers import freshroll, metrics

from freshroll.figures import metrics as m
from freshroll.figures.metrics_log import encode_row
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

pytestmark = pytest.mark.slow


def _ledger_rows(run: Path) -> list[dict[str, object]]:
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        return [json.loads(encode_row(r)) for r in m.rows(e for _, e in ledger.events())]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rows") / "run"
    proc = freshroll("run", "run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
                     "rollout.batch_groups=2", "run.steps=3", "monitor.log_completions=3",
                     "--out", str(out))
    (out.parent / "stderr.txt").write_text(proc.stderr)
    return out


def test_log_completions_prints_what_the_step_trained_on(finished: Path) -> None:
    """monitor.log_completions=3: step 3's table, its rewards those the ledger recorded for
    the samples step 3's commit names (the real run's Recording wires it)."""
    with Ledger(finished / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    rewards = {e.sample: e.reward for e in events if isinstance(e, ev.Rewarded)}
    commits = [e for e in events if isinstance(e, ev.Committed)]
    err = (finished.parent / "stderr.txt").read_text().splitlines()
    heads = [i for i, line in enumerate(err) if line.startswith("completions of step")]
    assert [err[i] for i in heads] == [
        "completions of step 3 (4 of 8: reward, lag, prompt -> completion)"]
    shown = [float(line.split()[0]) for line in err[heads[0] + 1:heads[0] + 5]]
    samples = commits[2].samples
    assert shown == [round(rewards[samples[i]], 3) for i in (0, 2, 4, 6)]
    assert all("'rev " in line and " -> " in line for line in err[heads[0] + 1:heads[0] + 5])


def test_rows_are_the_ledgers_and_strict_json(finished: Path) -> None:
    rows = metrics(finished)
    assert rows == _ledger_rows(finished)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("loss" in r and "reward_mean" in r for r in rows)  # from committed.metrics
    engine = {"kv_cache_usage", "engine_waiting", "engine_running", "preemptions"}
    assert not any(engine & set(r) for r in rows)  # the HF engine reports no stats
    text = (finished / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    summary = json.loads((finished / "summary.json").read_text())
    assert rows[-1]["t"] == summary["wall_s"]
    assert rows[-1]["accepted_per_s"] == summary["accepted_rollouts_per_s"]


@pytest.mark.parametrize("damage", ["lost_row", "rows_twice"])
def test_resume_reconciles_rows_with_the_ledger(finished: Path, tmp_path: Path,
                                                damage: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if damage == "lost_row":  # killed after commit 3, mid-way through writing row 2
        path.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
        culprit = "no row for committed step 3"
    else:  # a resume that started over appended rows 1..N again
        path.write_text("".join(lines) * 2)
        culprit = "row 4 (step 1): the ledger holds no such committed step"
    bad = freshroll("verify", str(run), check=False)
    assert bad.returncode == 1 and "FAIL accounting" in bad.stdout and culprit in bad.stdout
    res = freshroll("run", "--resume", str(run))
    assert "rebuilt from the ledger" in res.stderr
    assert "verify: ok" in res.stdout
    assert metrics(run) == _ledger_rows(run)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    if damage == "rows_twice":  # nothing lost silently: the previous file is kept
        assert (run / "metrics.jsonl.prev").read_text() == "".join(lines) * 2
    assert freshroll("verify", str(run)).returncode == 0


def test_resume_on_an_empty_ledger_never_leaves_two_sets_of_rows(finished: Path,
                                                                 tmp_path: Path) -> None:
    """A zero-byte ledger (or a copy taken without its -wal) holds no steps: a resume that
    goes ahead trains from step 0 and rows 1..N must then appear once, the old ones kept
    aside in metrics.jsonl.prev; a resume that refuses must leave metrics.jsonl alone."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = (run / "metrics.jsonl").read_text()
    (run / LEDGER_FILE).write_bytes(b"")
    for side in ("-wal", "-shm"):
        (run / f"{LEDGER_FILE}{side}").unlink(missing_ok=True)
    res = freshroll("run", "--resume", str(run), check=False)
    if res.returncode != 0:  # refused (by name): nothing half-applied
        assert res.returncode == 2, res.stderr
        assert (run / "metrics.jsonl").read_text() == before
        return
    assert "verify: ok" in res.stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert metrics(run) == _ledger_rows(run)
    assert (run / "metrics.jsonl.prev").read_text() == before

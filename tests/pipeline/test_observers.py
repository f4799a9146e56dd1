"""Run observers (:mod:`freshroll.pipeline.observers`): the pipeline calls each one at its
points, a run's own (rows, progress line, checkpointer, notes) come first, and an exporter
is one more observer plus one registration: its rows on a real run are metrics.jsonl's."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.figures.metrics_log import read_rows
from freshroll.ledger.events import CheckpointSaved
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.observe.exporters import JsonLinesExporter
from freshroll.pipeline.fallback import Switch
from freshroll.pipeline.observers import (
    Heartbeats,
    Notes,
    Observer,
    Row,
    RunObserver,
    StepReport,
    default_observers,
)
from pipeline_fakes import Harness


class Watch(Observer):
    """Records every callback it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def checkpointed(self, step: int) -> CheckpointSaved | None:
        self.calls.append(("checkpointed", step))
        return None

    def on_step(self, report: StepReport) -> None:
        self.calls.append(("on_step", report.step))

    def on_row(self, row: Row, live: bool) -> None:
        self.calls.append(("on_row", (row["step"], live)))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_a_bare_pipeline_says_skips_modes_and_waits_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [type(o) for o in default_observers()] == [Notes, Heartbeats]
    for o in default_observers():
        o.on_skip(3, "loss is nan")
        o.on_mode(Switch(4, "sync", 1, "chose", "sync is faster"))
        o.on_mode(Switch(2, "sync", 1, "probe", "probing"))
        o.on_wait("waiting 60 s on w0 generate, limit 600 s")
    assert capsys.readouterr().err == (
        "warning: trainer step 3 skipped, its batch discarded (nonfinite_step): loss is nan\n"
        "sync fallback (step 4): sync is faster\n"
        "waiting 60 s on w0 generate, limit 600 s\n")


def test_the_pipeline_calls_every_observer_before_and_after_each_commit(tmp_path: Path):
    h = Harness(tmp_path, overrides=["run.steps=3"])
    first, second = Watch(), Watch()
    h.pipe.observers += [first, second]
    assert h.run() is None
    want = [(c, s) for s in (1, 2, 3) for c in ("checkpointed", "on_step")]
    assert first.calls == want and second.calls == want
    assert [r.step for r in h.steps] == [1, 2, 3]  # the harness's own observer too
    h.buf.shutdown("done")
    assert h.verify().ok


def _run(out: Path, *observers: RunObserver, steps: int = 3) -> Any:
    from freshroll.runtime.run import run

    cfg = load_config(None, ["run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", f"run.steps={steps}",
                             "run.runtime=inline", "run.torch_threads=1",
                             "trainer.checkpoint_every=2"])
    return run(cfg, out, stream=io.StringIO(), report=False, observers=list(observers))


@pytest.mark.slow
def test_a_json_lines_exporter_on_a_real_run_writes_metrics_jsonl_rows(tmp_path: Path):
    """The example exporter: one class, one registration; every row it wrote is the
    metrics.jsonl row of the same step, in the same encoding, after the run's own files."""
    out, exported = tmp_path / "run", tmp_path / "exported.jsonl"
    watch = Watch()
    result = _run(out, JsonLinesExporter(exported), watch)
    assert result.ok
    rows, torn = read_rows(out / "metrics.jsonl")
    assert torn == 0 and [r["step"] for r in rows] == [1, 2, 3]
    assert read_rows(exported) == (rows, 0)
    assert exported.read_text() == (out / "metrics.jsonl").read_text()
    # each step: the write-ahead asked, then (after the durable commit) its row, then on_step
    per_step = [[("checkpointed", s), ("on_row", (s, True)), ("on_step", s)] for s in (1, 2, 3)]
    assert watch.calls == [c for step in per_step for c in step] + [("close", None)]
    with Ledger(out / LEDGER_FILE, readonly=True) as ledger:  # the checkpointer still writes
        kinds = [type(e).__name__ for _, e in ledger.events()]
    saved = [i for i, k in enumerate(kinds) if k == "CheckpointSaved"]
    commits = [i for i, k in enumerate(kinds) if k == "Committed"]
    assert len(saved) == 2 and all(i + 1 in commits for i in saved)  # steps 2 and 3
    assert json.loads(exported.read_text().splitlines()[-1])["step"] == 3


class Broken(Observer):
    """Fails on the row of ``step``; its close fails too."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_row(self, row: Row, live: bool) -> None:
        if row["step"] == self.step:
            raise ZeroDivisionError("bug in an exporter")

    def close(self) -> None:
        raise RuntimeError("and in its close")


@pytest.mark.slow
def test_a_failing_observer_ends_the_run_closed_and_resumable(tmp_path: Path):
    """The contract's failure rule: the error ends the run (not swallowed), after the step's
    durable commit; every other observer is still closed, the ledger too; a resume goes on."""
    from freshroll.harness.verify import verify_run

    out = tmp_path / "run"
    watch = Watch()
    with pytest.raises(ZeroDivisionError, match="bug in an exporter") as err:
        _run(out, Broken(2), watch)
    assert err.value.__notes__ == [
        "an observer's close failed too: RuntimeError: and in its close"]
    assert watch.calls[-1] == ("close", None)
    assert verify_run(out).ok  # closed, and its rows are the ledger's
    rows, _ = read_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # step 2 was committed before its row's observers
    from freshroll.runtime.run import run

    assert run(None, out, resume=True, stream=io.StringIO(), report=False).ok  # from step 2
    assert [r["step"] for r in read_rows(out / "metrics.jsonl")[0]] == [1, 2, 3]

"""verify binds the files the hostile trial (issue 48) tampered with and it passed: the
evaluation (``eval.jsonl``, the ``eval/*`` columns, ``summary.json``'s ``eval``), the starting
model ``model/``, a Python-API run's ``inputs/`` and ``report.html``. Each tampering fails
``verify`` under ``files`` or ``accounting``, naming the file; a ledger without the new
records (an older run) is checked as before and says so; ``replay`` names a flipped byte of
the starting model as a tampered input, not as non-determinism.

One real inline run of the embedded default (5 steps, eval every 2 steps in both modes),
copied for each tampering."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.harness.verify import verify_run
from freshroll.rewards.tasks import make_prompts

pytestmark = pytest.mark.slow


def _eval_file(path: Path) -> Path:
    with path.open("w") as fh:
        for p in make_prompts("reverse", 6, 123, min_len=3, max_len=3):
            fh.write(json.dumps({"prompt": p.text, "answer": p.answer}) + "\n")
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from freshroll.runtime.run import run

    root = tmp_path_factory.mktemp("bound")
    cfg = load_config(None, [
        "run.progress=false", "task.n_prompts=64", "rollout.group_size=4",
        "rollout.batch_groups=2", "run.steps=5", "run.max_staleness=0", "run.runtime=inline",
        "run.torch_threads=1", f"eval.file={_eval_file(root / 'held.jsonl')}",
        "eval.every_steps=2", "eval.mode=both"])
    out = root / "run"
    assert run(cfg, out, stream=io.StringIO()).ok
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_eval(run: Path) -> str:
    rows = _lines(run / "eval.jsonl")
    rows[2]["reward"] = 0.987
    _write(run / "eval.jsonl", rows)
    return f"eval.jsonl step {rows[2]['step']} ({rows[2]['mode']}): reward 0.987"


def _cut_eval(run: Path) -> str:
    rows = _lines(run / "eval.jsonl")
    _write(run / "eval.jsonl", rows[:-1])
    return f"eval.jsonl: no line for step {rows[-1]['step']} ({rows[-1]['mode']})"


def _delete_eval(run: Path) -> str:
    (run / "eval.jsonl").unlink()
    return "eval.jsonl: missing (the ledger records the evaluations of steps 2, 4, 5)"


def _edit_eval_column(run: Path) -> str:
    rows = _lines(run / "metrics.jsonl")
    rows[3]["eval/reward"] = 0.987
    _write(run / "metrics.jsonl", rows)
    return "metrics.jsonl row 4 (step 4): eval/reward reported 0.987"


def _edit_summary_eval(run: Path) -> str:
    summary = json.loads((run / "summary.json").read_text())
    summary["eval"]["best"] = 0.987
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    return "summary.json eval.best: reported 0.987"


def _flip_model_byte(run: Path) -> str:
    path = run / "model" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return "model/model.safetensors: sha256"


def _edit_report(run: Path) -> str:
    path = run / "report.html"
    text = path.read_text()
    path.write_text(text.replace("<body>", "<body><p>reward 0.99</p>", 1))
    return "report.html: sha256"


#: tampering -> (what it does to a copy, returning what the violation names; the invariant)
TAMPERS: dict[str, tuple[Callable[[Path], str], str]] = {
    "eval-line-edited": (_edit_eval, "files"),
    "eval-file-cut": (_cut_eval, "files"),
    "eval-file-deleted": (_delete_eval, "files"),
    "eval-column-edited": (_edit_eval_column, "accounting"),
    "summary-eval-edited": (_edit_summary_eval, "accounting"),
    "model-byte-flipped": (_flip_model_byte, "files"),
    "report-edited": (_edit_report, "files"),
}


def test_an_untampered_run_is_bound_and_passes(finished: Path) -> None:
    report = verify_run(finished)
    assert report.ok, report.render()
    assert not [n for n in report.notes if "not checked" in n], report.notes
    db = sqlite3.connect(finished / "ledger.sqlite")
    try:
        steps = [json.loads(b)["step"] for (b,) in db.execute(
            "SELECT body FROM events WHERE kind='evaluated' ORDER BY seq")]
        (files,), = db.execute("SELECT json_extract(body, '$.input_files') FROM events "
                               "WHERE kind='run_config'").fetchall()
    finally:
        db.close()
    assert steps == [2, 4, 5]
    assert "model/model.safetensors" in json.loads(files)


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_each_tampering_fails_verify_naming_the_file(finished: Path, tmp_path: Path,
                                                    tamper: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    how, invariant = TAMPERS[tamper]
    named = how(run)
    report = verify_run(run)
    failing = {k for k, v in report.violations.items() if v}
    assert failing == {invariant}, report.render()
    assert any(named in msg for msg in report.violations[invariant]), report.render()


def test_a_run_without_the_new_records_is_checked_as_before_and_says_so(
        finished: Path, tmp_path: Path) -> None:
    """An older run's ledger (no ``evaluated``, no ``input_files``): its eval files and model
    are not compared, a note says so, and it still verifies."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    db = sqlite3.connect(run / "ledger.sqlite")
    try:
        rows = [(k, b) for k, b in db.execute("SELECT kind, body FROM events ORDER BY seq")
                if k != "evaluated"]
        db.execute("DELETE FROM events")
        for seq, (kind, body) in enumerate(rows, start=1):
            if kind == "run_config":
                e = json.loads(body)
                del e["input_files"]
                body = json.dumps(e).encode()
            db.execute("INSERT INTO events VALUES (?, ?, ?)", (seq, kind, body))
        db.commit()
    finally:
        db.close()
    _edit_eval(run)
    report = verify_run(run)
    assert report.ok, report.render()
    assert any("eval.jsonl, the eval/* columns" in n and "not checked" in n
               for n in report.notes), report.notes
    assert any(n.startswith("model/ not checked") for n in report.notes), report.notes


def test_replay_names_a_tampered_starting_model(finished: Path, tmp_path: Path) -> None:
    from freshroll.runtime.replay_run import replay_run

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _flip_model_byte(run)
    result = replay_run(run, to_step=1)
    assert result.divergence is not None
    assert result.divergence.cause == "inputs", result.render()
    assert "model/model.safetensors" in result.divergence.message
    assert "non-deterministic" not in result.render()
    # a flipped header byte: the model does not even load; named before it is loaded
    path = run / "model" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))
    result = replay_run(run)
    assert result.divergence is not None and result.divergence.cause == "inputs"
    assert "no step from the initial model was matched" in result.render()


def test_a_python_api_runs_saved_dataset_is_bound(tmp_path: Path) -> None:
    """``inputs/train`` (the Python API's ``train_dataset``, saved to disk) is recorded and
    re-read: a byte of its data changed fails verify naming the file."""
    from freshroll import GRPOTrainer

    rows = [{"prompt": f"rev {i:03d}=", "answer": str(i).zfill(3)[::-1]} for i in range(12)]
    out = tmp_path / "run"
    trainer = GRPOTrainer(train_dataset=rows, output_dir=out, args={
        "run": {"progress": False, "steps": 1, "runtime": "inline"},
        "rollout": {"group_size": 4, "batch_groups": 2, "max_new_tokens": 4}})
    assert trainer.train(stream=io.StringIO()).ok
    assert verify_run(out).ok
    (data,) = sorted((out / "inputs" / "train").glob("*.arrow"))
    raw = bytearray(data.read_bytes())
    at = raw.index(b"rev 005=")
    raw[at + 4:at + 7] = b"777"
    data.write_bytes(bytes(raw))
    report = verify_run(out)
    assert {k for k, v in report.violations.items() if v} == {"files"}, report.render()
    name = data.relative_to(out).as_posix()
    assert any(msg.startswith(f"{name}: sha256") for msg in report.violations["files"])

"""The provenance of a finished run directory (issue 29):

* ``verify`` covers every file (item 4): each of the tamperings that passed it before fails
  it, under the ``files`` invariant alone, naming the file and the sample or step; an
  untampered run checks every payload and checkpoint;
* ``export-samples`` (item 1): every generated sample as one Parquet table, equal to the
  ledger;
* ``lineage`` (item 2): a sample's attempts and the step that trained on it; a version's
  chain, batch and checkpoint;
* ``replay`` (item 3): every digest reproduced from the initial model or a checkpoint, and
  an altered sample or checkpoint named as the cause of the divergence.

One real run (the embedded default, hf engine, async, a checkpoint every 2 steps), copied
for each tampering."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from e2e_helpers import freshroll

from freshroll.harness.verify import verify_run
from freshroll.report.provenance import lineage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verify-files") / "run"
    # run.runtime=process: the placement under test; auto may choose inline where threads pay
    freshroll("run", "configs/smoke.yaml", "run.steps=6", "run.progress=false",
              "run.runtime=process", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=3",
              "--out", str(out))
    return out


def _db(run: Path) -> sqlite3.Connection:
    return sqlite3.connect(run / "ledger.sqlite")


def _batch(run: Path, step: int) -> list[str]:
    db = _db(run)
    try:
        for (body,) in db.execute("SELECT body FROM events WHERE kind='committed' ORDER BY seq"):
            e = json.loads(body)
            if e["version"].startswith(f"p{step}-"):
                return list(e["samples"])
    finally:
        db.close()
    raise AssertionError(f"no step {step}")


def _swap(run: Path, a: str, b: str) -> None:
    db = _db(run)
    try:
        (da,), (dbb,) = (db.execute("SELECT data FROM payloads WHERE sample=?", (s,)).fetchall()
                         for s in (a, b))
        db.execute("UPDATE payloads SET data=? WHERE sample=?", (dbb[0], a))
        db.execute("UPDATE payloads SET data=? WHERE sample=?", (da[0], b))
        db.commit()
    finally:
        db.close()


def _swap_in_batch(run: Path) -> str:
    a, b = _batch(run, 3)[:2]
    _swap(run, a, b)
    return a


def _swap_across_steps(run: Path) -> str:
    a, b = _batch(run, 2)[0], _batch(run, 5)[0]
    _swap(run, a, b)
    return b


def _delete_payload(run: Path) -> str:
    sample = _batch(run, 4)[1]
    db = _db(run)
    try:
        db.execute("DELETE FROM payloads WHERE sample=?", (sample,))
        db.commit()
    finally:
        db.close()
    return f"{sample}'s payload is missing"


def _delete_weights(run: Path) -> str:
    (run / "checkpoints" / "step-000004" / "model.safetensors").unlink()
    return "checkpoints/step-000004/model.safetensors: missing"


def _flip_two_bytes(run: Path) -> str:
    path = run / "checkpoints" / "step-000006" / "model.safetensors"
    data = bytearray(path.read_bytes())
    for at in (len(data) // 2, len(data) - 7):
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return "checkpoints/step-000006/model.safetensors: sha256"


def _forge_meta(run: Path) -> str:
    path = run / "checkpoints" / "step-000004" / "meta.json"
    meta = json.loads(path.read_text())
    head, _, _ = meta["version"].partition("+w")
    meta["version"] = f"{head}+w{'0' * 32}"
    path.write_text(json.dumps(meta))
    return "checkpoints/step-000004/meta.json: version"


def _edit_config(run: Path) -> str:
    path = run / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["trainer"]["lr"] = 0.5
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return "config.yaml: differs from the config the ledger recorded for the run (trainer.lr)"


#: tampering -> what it does to a copy, returning what the violation must name
TAMPERS: dict[str, Callable[[Path], str]] = {
    "payloads-swapped-in-one-batch": _swap_in_batch,
    "payload-deleted": _delete_payload,
    "payloads-swapped-across-steps": _swap_across_steps,
    "checkpoint-weights-deleted": _delete_weights,
    "checkpoint-two-bytes-flipped": _flip_two_bytes,
    "checkpoint-meta-forged": _forge_meta,
    "config-edited-after-the-run": _edit_config,
}


def test_an_untampered_run_binds_every_payload_and_checkpoint(finished: Path) -> None:
    report = verify_run(finished)
    assert report.ok, report.render()
    assert not [n for n in report.notes if "not checked" in n or "never committed" in n]
    db = _db(finished)
    try:
        saved = [json.loads(b) for (b,) in db.execute(
            "SELECT body FROM events WHERE kind='checkpoint_saved' ORDER BY seq")]
        digests = db.execute("SELECT count(*) FROM events WHERE kind='generated' AND "
                             "json_extract(body, '$.payload_digest') IS NOT NULL").fetchone()
        payloads = db.execute("SELECT count(*) FROM payloads").fetchone()
    finally:
        db.close()
    assert [e["step"] for e in saved] == [2, 4, 6]
    assert set(saved[-1]["files"]) == {p.name for p in (finished / "checkpoints" /
                                                        "step-000006").iterdir()}
    assert digests == payloads and payloads[0] > 0


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_each_tampering_fails_verify_naming_the_file(finished: Path, tmp_path: Path,
                                                    tamper: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    named = TAMPERS[tamper](run)
    report = verify_run(run)
    failing = {k for k, v in report.violations.items() if v}
    assert failing == {"files"}, report.render()
    assert any(named in msg for msg in report.violations["files"]), report.render()


def test_the_cli_fails_and_names_a_swapped_pair(finished: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    a, b = _batch(run, 3)[:2]
    _swap(run, a, b)
    proc = freshroll("verify", str(run), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL files: 2" in proc.stdout
    assert f"{a}'s payload has digest" in proc.stdout and f"{b}'s payload" in proc.stdout


def test_a_checkpoint_of_a_step_never_committed_is_a_note(finished: Path,
                                                          tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.copytree(run / "checkpoints" / "step-000006", run / "checkpoints" / "step-000008")
    report = verify_run(run)
    assert report.ok, report.render()
    assert any("step-000008: step 8 was never committed" in n for n in report.notes)


def test_a_replay_over_an_altered_sample_blames_the_data_not_the_kernels(
        finished: Path, tmp_path: Path) -> None:
    """export-model replays step 5 from the step-4 checkpoint: a payload of step 5 swapped
    with one of step 2 is named as altered data, before any training (the sample's advantage
    may be zero, so the weights digest alone could miss it); untampered, the replay
    reproduces the committed digest."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    freshroll("export-model", str(run), str(tmp_path / "ok"), "--step", "5")
    a, b = _batch(run, 2)[0], _batch(run, 5)[0]
    _swap(run, a, b)
    proc = freshroll("export-model", str(run), str(tmp_path / "bad"), "--step", "5",
                     check=False)
    assert proc.returncode != 0
    assert "replaying steps 5-5" in proc.stderr, proc.stderr
    assert f"stored samples were altered after they were recorded ({b}: payload digest" \
        in proc.stderr, proc.stderr
    assert "not deterministic" not in proc.stderr


def test_export_samples_is_the_ledger_as_a_table(finished: Path, tmp_path: Path) -> None:
    import pandas as pd

    from freshroll.engines import payload as pl

    out = tmp_path / "samples.parquet"
    proc = freshroll("export-samples", str(finished), "-o", str(out))
    assert "wrote" in proc.stdout
    frame = pd.read_parquet(out)
    db = _db(finished)
    try:
        generated = db.execute("SELECT count(*) FROM events WHERE kind='generated'").fetchone()
        committed = [s for (body,) in db.execute(
            "SELECT body FROM events WHERE kind='committed'") for s in json.loads(body)["samples"]]
        sid = committed[5]
        (data,), = db.execute("SELECT data FROM payloads WHERE sample=?", (sid,)).fetchall()
        (reward, version), = db.execute(
            "SELECT json_extract(body,'$.reward'), json_extract(body,'$.reward_version') FROM "
            "events WHERE kind='rewarded' AND json_extract(body,'$.sample')=?", (sid,)).fetchall()
    finally:
        db.close()
    assert len(frame) == generated[0]
    assert sorted(frame[frame.outcome == "committed"]["sample"]) == sorted(committed)
    row = frame.set_index("sample").loc[sid]
    p = pl.decode(data)
    assert list(row.completion_ids) == list(p.token_ids) and row.completion == p.text
    assert list(row.logprobs) == pytest.approx(list(p.logprobs))
    assert list(row.prompt_ids) == list(p.prompt_ids) and row.prompt.startswith("rev ")
    assert row.reward == reward and row.reward_version == version
    assert row.consumed_step >= 1 and row.lag == row.consumed_step - 1 - row.policy_step
    assert json.loads(row.rewards) == {"reverse": reward}
    # datasets reads it too, and a second export refuses to replace the first
    from datasets import Dataset

    assert Dataset.from_parquet(str(out)).num_rows == len(frame)
    again = freshroll("export-samples", str(finished), "-o", str(out), check=False)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_lineage_of_a_sample_and_of_its_step(finished: Path) -> None:
    sid = _batch(finished, 3)[2]
    info = lineage(finished, sid)
    (attempt,) = info["attempts"]
    assert attempt["sample"] == sid and attempt["ended"] == "committed"
    assert attempt["step"] == 3 and attempt["consumed_by"].startswith("p3-")
    assert attempt["policy_version"].startswith(("p1-", "p2-"))
    assert attempt["reward_version"].startswith("r:reverse:")
    text = freshroll("lineage", str(finished), sid).stdout
    assert f"attempt {sid}: committed at step 3 -> p3-" in text
    version = freshroll("lineage", str(finished), "4", "--json").stdout
    v = json.loads(version)
    assert v["step"] == 4 and len(v["chain"]) == 5 and v["chain"][-1].startswith("p0-")
    assert [b["sample"] for b in v["batch"]] == _batch(finished, 4)
    assert v["checkpoint"] == {"path": "checkpoints/step-000004", "holds": True,
                               "recorded": True}
    assert sum(v["reward_versions"].values()) == len(v["batch"])
    five = lineage(finished, "p5")
    assert five["checkpoint"]["path"] == "checkpoints/step-000004"
    assert five["checkpoint"]["replay_steps"] == 1
    bad = freshroll("lineage", str(finished), "g999.0#1", check=False)
    assert bad.returncode == 2 and "not in this run's ledger" in bad.stderr


def test_replay_reproduces_every_digest_of_a_process_placement_run(finished: Path) -> None:
    from freshroll.runtime.replay_run import replay_run

    host = json.loads((finished / "summary.json").read_text())["host"]
    assert host["placement"]["runtime"] == "process"  # workers in children
    whole = replay_run(finished)
    assert whole.ok and (whole.from_step, whole.to_step, whole.steps) == (0, 6, 6)
    assert whole.replay_s_per_step is not None and whole.train_s_per_step is not None
    tail = freshroll("replay", str(finished), "--from", "5", "--json")
    got = json.loads(tail.stdout)
    assert got["ok"] and got["from_step"] == 4 and got["steps"] == 2  # from step-000004
    text = freshroll("replay", str(finished), "--to", "3").stdout
    assert "replay: steps 1-3 from the initial model" in text and "every weights" in text


def test_replay_names_an_altered_sample_or_checkpoint_as_the_cause(finished: Path,
                                                                   tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    a, b = _batch(run, 3)[0], _batch(run, 5)[0]
    _swap(run, a, b)
    proc = freshroll("replay", str(run), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "replay: DIVERGED at step 3 (samples)" in proc.stdout and a in proc.stdout
    assert "steps 1-2 from the initial model matched (2 steps" in proc.stdout
    _swap(run, a, b)  # put back; now a checkpoint
    _flip_two_bytes_of(run / "checkpoints" / "step-000004" / "model.safetensors")
    proc = freshroll("replay", str(run), "--from", "5", check=False)
    assert proc.returncode == 1
    assert "DIVERGED at step 4 (checkpoint): checkpoints/step-000004 holds weights" \
        in proc.stdout, proc.stdout


def _flip_two_bytes_of(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for at in (len(data) // 2, len(data) - 7):
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))

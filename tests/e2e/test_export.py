"""``freshroll export-model``: the exported directory loads with from_pretrained and holds
exactly the committed weights of the step asked for (checked against the ledger's digest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from e2e_helpers import freshroll
from transformers import AutoModelForCausalLM, AutoTokenizer

from freshroll.errors import ConfigError, RunDirError
from freshroll.runtime.export import export_model
from freshroll.trainer.replay import weights_digest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    freshroll("run", "configs/smoke.yaml", "run.steps=5", "run.progress=false",
              "trainer.checkpoint_every=2", "trainer.keep_checkpoints=1", "--out", str(out))
    return out


def _committed_digests(run_dir: Path) -> dict[int, str]:
    out = freshroll("export", str(run_dir), "-o", "-").stdout
    digests = {}
    for line in out.splitlines():
        e = json.loads(line)
        if e["kind"] == "committed":
            step, _, rest = e["version"].partition("-")
            digests[int(step[1:])] = rest.rpartition("+w")[2]
    return digests


def test_export_last_step_loads_with_from_pretrained(run_dir: Path, tmp_path: Path) -> None:
    done = export_model(run_dir, tmp_path / "m")
    assert done.step == 5
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "m", local_files_only=True)
    assert weights_digest(model) == _committed_digests(run_dir)[5] == done.weights_digest
    ids = tok("123", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    meta = json.loads((tmp_path / "m" / "freshroll_export.json").read_text())
    assert meta["step"] == 5 and meta["policy_version"] == done.version
    # every file at the mode a new file gets (model.safetensors was 0600: issue 48)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "m").iterdir()}
    assert set(modes.values()) == {modes["config.json"]}, modes


def test_export_an_older_step_replays_from_the_ledger(run_dir: Path, tmp_path: Path) -> None:
    # keep_checkpoints=1 leaves only step 5's checkpoint: step 3 is rebuilt from step 0
    done = export_model(run_dir, tmp_path / "m3", step=3)
    assert done.replayed == 3
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m3", local_files_only=True)
    assert weights_digest(model) == _committed_digests(run_dir)[3]


def test_export_step_zero_is_the_initial_model(run_dir: Path, tmp_path: Path) -> None:
    export_model(run_dir, tmp_path / "m0", step=0)
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "m0", local_files_only=True)
    b = AutoModelForCausalLM.from_pretrained(run_dir / "model", local_files_only=True)
    assert weights_digest(a) == weights_digest(b)


def test_export_refuses_bad_input(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"committed steps 0\.\.5"):
        export_model(run_dir, tmp_path / "x", step=9)
    (tmp_path / "taken").mkdir()
    with pytest.raises(RunDirError, match="already exists"):
        export_model(run_dir, tmp_path / "taken")
    with pytest.raises(RunDirError, match="not a run directory"):
        export_model(tmp_path, tmp_path / "y")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_export_model_cli(run_dir: Path, tmp_path: Path) -> None:
    proc = freshroll("export-model", str(run_dir), str(tmp_path / "cli"), "--step", "2")
    assert "exported step 2" in proc.stdout
    assert (tmp_path / "cli" / "config.json").is_file()


def test_a_long_replay_says_where_it_is(run_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a replay (resume, a trainer actor's rebuild, export-model) ran silent however
    long it took. Now it says its step once per ``limits.heartbeat_s``."""
    import shutil

    import yaml

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    cfg.setdefault("limits", {})["heartbeat_s"] = 1e-6
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg))
    export_model(copy, tmp_path / "m3", step=3)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("replaying")]
    assert [ln.split(" s so far")[0].rsplit(", ", 1)[0] for ln in lines] == [
        f"replaying committed step {s} of 3 (from the checkpoint at step 0)" for s in (1, 2, 3)]

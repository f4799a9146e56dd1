"""``freshroll validate`` on the real tiny model (transformers): the embedded default's
acceptance file, cut to a few steps and one seed (slow: a real model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from e2e.e2e_helpers import freshroll

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_default_acceptance_on_the_real_model(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "acceptance" / "default.yaml").read_text())
    data["config"] = str(REPO / "configs" / "default.yaml")
    data["overrides"] = {"run.steps": 6, "task.n_prompts": 256}
    data["seeds"] = [0, 1]
    data["gates"].pop("recovery")  # the simulated chaos cases are covered by the fast tests
    data["gates"]["convergence"]["last_steps"] = 3
    path = tmp_path / "default-short.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    # in process (the CLI's own parsing, exit status and output; no second Python importing
    # torch and transformers, nor a second forkserver for the async runs' workers)
    proc = freshroll("validate", str(path), "--out", str(out), check=False)
    assert proc.returncode in (0, 1), proc.stderr  # a decision either way, never an error
    record = json.loads((out / "decision.json").read_text())
    assert record["recommendation"] == ("production-transition" if proc.returncode == 0
                                        else "stop")
    by = {c["name"]: c for c in record["validation"]}
    assert by["verify"]["passed"], by["verify"]["note"]
    assert by["lag_max"]["passed"] and by["lag_max"]["value"] <= 1  # max_staleness 1
    assert record["design"]["engine"] == "hf" and record["design"]["max_staleness"] == 1
    for k in (0, 1):
        assert json.loads((out / f"sync-seed{k}" / "summary.json").read_text())["mode"] == "sync"
    assert [c["seed"] for c in record["time_to_reward"]] == [0, 1]  # async vs sync, per seed
    assert "## Recommendation" in (out / "decision.md").read_text()

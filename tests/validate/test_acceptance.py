"""The ACCEPTANCE.yaml schema: unknown keys and bad thresholds are errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from freshroll.errors import ConfigError
from freshroll.validate.acceptance import load, parse

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "acceptance" / "sim.yaml"


def _write(tmp_path: Path, data: dict, name: str = "acc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _sim(**changes: object) -> dict:
    data = yaml.safe_load(SIM.read_text())
    data["config"] = str(REPO / "configs" / "sim-p1.yaml")
    data.update(changes)
    return data


def test_shipped_acceptance_files_load() -> None:
    for path in sorted((REPO / "acceptance").glob("*.yaml")):
        loaded = load(path)
        assert loaded.spec.seed_list(), path
        assert loaded.cfg.run.progress is False  # validate prints its own lines


def test_sim_file_resolves_config_relative_to_its_folder() -> None:
    loaded = load(SIM)
    assert loaded.cfg.rollout.engine == "sim"
    assert loaded.cfg.run.steps == 30  # the override over configs/sim-p1.yaml's 200
    assert loaded.spec.needs_sync()


def test_unknown_top_level_key_names_file_and_key(tmp_path: Path) -> None:
    path = _write(tmp_path, {**_sim(), "repeatz": 3})
    with pytest.raises(ConfigError, match=r"acc\.yaml: repeatz: unknown key"):
        load(path)


def test_unknown_gate_key_names_file_and_key(tmp_path: Path) -> None:
    data = _sim()
    data["gates"]["discard_rate"] = {"maximum": 0.2}
    with pytest.raises(ConfigError, match=r"acc\.yaml: .*gates\.discard_rate\.maximum: unknown"):
        load(_write(tmp_path, data))


def test_unknown_gate_names_it(tmp_path: Path) -> None:
    data = _sim()
    data["gates"]["latency"] = {"max": 1}
    with pytest.raises(ConfigError, match=r"gates\.latency: unknown key"):
        load(_write(tmp_path, data))


@pytest.mark.parametrize(("gate", "value", "key"), [
    ("discard_rate", {"max": 1.5}, r"gates\.discard_rate\.max"),
    ("trainer_idle_ratio", {"max": -0.1}, r"gates\.trainer_idle_ratio\.max"),
    ("lag_max", {"max": "eta"}, r"gates\.lag_max\.max"),
    ("lag_p99", {"max": -1}, r"gates\.lag_p99"),
    ("accepted_per_s", {}, r"gates\.accepted_per_s: give min"),
    ("convergence", {"last_steps": 5}, r"gates\.convergence: give tolerance"),
    ("convergence", {"last_steps": 0, "tolerance": 0.1}, r"gates\.convergence\.last_steps"),
])
def test_bad_threshold_names_file_and_key(tmp_path: Path, gate: str, value: dict,
                                          key: str) -> None:
    data = _sim()
    data["gates"][gate] = value
    with pytest.raises(ConfigError, match=rf"acc\.yaml: .*{key}"):
        load(_write(tmp_path, data))


def test_bad_seeds(tmp_path: Path) -> None:
    for seeds, msg in (([1, 1], "listed twice"), ([], "empty"), (0, "a count from 1")):
        with pytest.raises(ConfigError, match=rf"acc\.yaml: .*seeds.*{msg}"):
            load(_write(tmp_path, _sim(seeds=seeds)))


def test_tolerance_sd_needs_two_seeds(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tolerance_sd needs at least 2 seeds"):
        load(_write(tmp_path, _sim(seeds=[4])))


def test_last_steps_beyond_the_run(tmp_path: Path) -> None:
    data = _sim()
    data["gates"]["convergence"]["last_steps"] = 31
    with pytest.raises(ConfigError, match=r"gates\.convergence\.last_steps: 31 exceeds"):
        load(_write(tmp_path, data))


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"acc\.yaml: config: nope\.yaml: no such file"):
        load(_write(tmp_path, _sim(config="nope.yaml")))


def test_bad_override_names_the_config_key(tmp_path: Path) -> None:
    data = _sim()
    data["overrides"]["rollout.wrokers"] = 3
    with pytest.raises(ConfigError, match=r"acc\.yaml: .*rollout\.wrokers: unknown key"):
        load(_write(tmp_path, data))


def test_unknown_scenario_of_the_plan(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"scenarios": [
        {"name": "kill-one", "faults": [{"kind": "kill_worker", "at": {"step": 3}}]}]}))
    data = _sim()
    data["gates"]["recovery"] = {"plan": "plan.yaml", "scenarios": ["kill-one", "kill-two"],
                                 "max_s": 60}
    with pytest.raises(ConfigError, match=r"gates\.recovery\.scenarios\[1\]: 'kill-two' is "
                                          r"not a scenario"):
        load(_write(tmp_path, data))
    data["gates"]["recovery"]["scenarios"] = ["kill-one"]
    loaded = load(_write(tmp_path, data))
    assert loaded.plan_path == plan.resolve()


def test_lag_threshold_max_staleness_resolves() -> None:
    spec = parse({"gates": {"lag_max": {"max": "max_staleness"}, "lag_p99": {"max": 1.5}}},
                 "x.yaml")
    assert spec.gates.lag_max is not None and spec.gates.lag_max.resolve(3) == 3.0
    assert spec.gates.lag_p99 is not None and spec.gates.lag_p99.resolve(3) == 1.5


def test_seeds_count_or_list() -> None:
    assert parse({"seeds": 3}, "x").seed_list() == [0, 1, 2]
    assert parse({"seeds": [5, 9]}, "x").seed_list() == [5, 9]


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"acc\.yaml: an acceptance file is a mapping"):
        load(path)

"""rollout.on_update is one setting for every engine; vllm.on_update stays as its deprecated
alias (old configs load; both set and different is an error naming both keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from freshroll.config import load_config
from freshroll.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_unset_by_default_and_each_value_accepted() -> None:
    assert load_config(None, []).rollout.on_update is None
    assert load_config(None, []).run.staleness_basis == "oldest_token"
    for mode in ("finish", "abort", "continue"):
        assert load_config(None, [f"rollout.on_update={mode}"]).rollout.on_update == mode
    with pytest.raises(ConfigError, match="on_update"):
        load_config(None, ["rollout.on_update=later"])
    with pytest.raises(ConfigError, match="staleness_basis"):
        load_config(None, ["run.staleness_basis=middle"])


def test_the_vllm_alias_still_loads_and_agrees_or_is_refused() -> None:
    old = load_config(None, ["rollout.engine=vllm", "vllm.on_update=abort"])  # an old config
    assert old.vllm.on_update == "abort" and old.rollout.on_update is None
    assert load_config(REPO / "configs" / "vllm.yaml", []).rollout.on_update == "finish"
    same = load_config(None, ["vllm.on_update=continue", "rollout.on_update=continue"])
    assert same.rollout.on_update == "continue"
    with pytest.raises(ConfigError, match=r"rollout\.on_update.*vllm\.on_update"):
        load_config(None, ["vllm.on_update=abort", "rollout.on_update=continue"])
    # the alias at its default is not "set": rollout.on_update alone decides
    assert load_config(None, ["rollout.on_update=abort"]).vllm.on_update == "finish"
    # nor in a config written out in full (a run's config.yaml) and loaded with a new mode
    from freshroll.config import validate

    data = load_config(None, []).model_dump(mode="json")
    data["rollout"]["on_update"] = "continue"
    assert validate(data, "t").rollout.on_update == "continue"


def test_the_vllm_engine_gets_the_setting_in_force() -> None:
    from freshroll.engines.vllm_args import in_force

    assert in_force(load_config(None, ["vllm.on_update=abort"])).on_update == "abort"
    assert in_force(load_config(None, ["rollout.on_update=continue"])).on_update == "continue"
    assert in_force(load_config(None, [])).on_update == "finish"


def test_every_config_in_the_repo_still_loads() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path, [])


def test_hf_continue_or_abort_needs_inline_workers() -> None:
    from freshroll.runtime.prepare import check_on_update

    for runtime in ("process", "ray"):
        with pytest.raises(ConfigError, match=r"run\.runtime=inline"):
            check_on_update(load_config(None, ["rollout.on_update=continue",
                                               f"run.runtime={runtime}"]))
    check_on_update(load_config(None, ["rollout.on_update=continue", "run.runtime=inline"]))
    check_on_update(load_config(None, ["rollout.on_update=finish", "run.runtime=process"]))
    check_on_update(load_config(None, ["rollout.engine=sim", "rollout.on_update=continue"]))

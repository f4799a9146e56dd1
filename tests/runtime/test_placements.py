"""The placement registry (freshroll.runtime.placements): one builder per (engine, runtime),
its releases on one exit stack, unwound last first, also when the builder fails part-way."""

from __future__ import annotations

import io
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.runtime import placements
from freshroll.runtime.placements import PLACEMENTS, Build, build_components, register_placement
from freshroll.runtime.run import run

SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false", "task.n_prompts=64",
       "rollout.group_size=4", "rollout.batch_groups=2", "run.steps=5"]


def test_every_engine_and_runtime_pairing_is_registered():
    assert set(PLACEMENTS) == {("sim", "inline"), ("hf", "inline"), ("hf", "process"),
                               ("hf", "ray"), ("vllm", "inline")}
    with pytest.raises(ValueError, match=r"\(hf, inline\) is registered already"):
        register_placement("hf", "inline")(lambda b, stack: (None, None, None))  # type: ignore


def _prep(over: list[str]) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(cfg=load_config(None, over))


def test_a_pairing_without_a_placement_is_a_config_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(PLACEMENTS, ("sim", "inline"))
    with pytest.raises(ConfigError, match=r"rollout.engine sim with run.runtime inline: no such "
                                          r"placement \(registered: \('hf', 'inline'\)"):
        build_components(_prep(SIM), None, Path("."), lambda v, s: None, None)  # type: ignore


def test_a_builder_that_fails_releases_what_it_had_last_first(monkeypatch: pytest.MonkeyPatch):
    released: list[str] = []

    def half(b: Build, stack: ExitStack) -> Any:
        stack.callback(released.append, "channel")
        stack.callback(released.append, "scorer")
        raise RuntimeError("the trainer did not build")

    monkeypatch.setitem(PLACEMENTS, ("sim", "inline"), half)
    with pytest.raises(RuntimeError, match="the trainer did not build"):
        build_components(_prep(SIM), None, Path("."), lambda v, s: None, None)  # type: ignore
    assert released == ["scorer", "channel"]


def test_a_registered_placement_runs_a_whole_run_and_is_released_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    built: list[Build] = []
    released: list[str] = []

    def mine(b: Build, stack: ExitStack) -> Any:  # the simulated cluster, watched
        built.append(b)
        stack.callback(released.append, "mine")
        return placements._sim(b, stack)

    monkeypatch.setitem(PLACEMENTS, ("sim", "inline"), mine)
    result = run(load_config(None, SIM), tmp_path / "r", stream=io.StringIO(), report=False)
    assert result.ok and result.summary["steps"] == 5
    assert len(built) == 1 and built[0].out == tmp_path / "r" and built[0].cfg.run.steps == 5
    assert released == ["mine"]


def test_a_new_engine_is_one_placement_registration(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path):
    """``rollout.engine`` takes any engine registered with a placement (here the hf inline
    builder under a name of its own); an unknown name is refused before anything is
    written, naming the field."""
    from freshroll.engines import specs

    monkeypatch.setattr(specs, "SPECS", dict(specs.SPECS))
    over = ["rollout.engine=toy", "run.progress=false", "task.n_prompts=64", "run.steps=3",
            "rollout.group_size=4", "rollout.batch_groups=2", "run.max_staleness=0"]
    with pytest.raises(ConfigError, match=r"rollout.engine: 'toy' is not an engine .*hf, sim, "
                                          r"vllm.*'Adding an engine'"):
        run(load_config(None, over), tmp_path / "refused", stream=io.StringIO(), report=False)
    assert not (tmp_path / "refused").exists()

    monkeypatch.setattr(placements, "PLACEMENTS", dict(PLACEMENTS))
    built: list[str] = []

    @register_placement("toy", "inline")
    def toy(b: Build, stack: ExitStack) -> Any:  # an engine of its own: hf's, renamed
        built.append(b.cfg.rollout.engine)
        return placements._hf_inline(b, stack)

    toy_spec = specs.engine_spec("toy")  # the default spec: inline, its own concurrency
    assert toy_spec.placements == ("inline",) and toy_spec.trains and not toy_spec.tunes_threads
    result = run(load_config(None, over), tmp_path / "r", stream=io.StringIO(), report=False)
    assert result.ok and result.summary["steps"] == 3 and built == ["toy"]

"""Tool time as a stage of its own (issue 49, item 4): the timing decomposition splits a
multi-turn sample's time on its worker into its model turns (generation) and its tool turns
(tool), in ``freshroll timing`` and ``summary.json``; a single-turn run has no tool row."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main
from freshroll.config import load_config
from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.engines.trajectory import Turn
from freshroll.figures.timing import STAGES, TOOL_STAGES, collect_spans, decompose
from freshroll.ledger import events as ev


def _payload(turns: tuple[Turn, ...]) -> bytes:
    n = sum(t.tokens for t in turns)
    mask = tuple((1 if t.kind == "model" else 0, t.tokens) for t in turns)
    return pl.encode(Completion((1,), (5,) * n, (0.0,) * n, "x", "stop", 1.0,
                                loss_mask=mask, turns=turns))


def _events(gen_s: float) -> list[ev.Event]:
    return [ev.Requested(ts=0.0, group="g0", prompt_id="p0", size=1, version="v"),
            ev.Started(ts=1.0, sample="g0.0#1", worker="w0", epoch=0, version="v"),
            ev.Generated(ts=1.0 + gen_s, sample="g0.0#1", tokens=3, gen_s=gen_s),
            ev.Rewarded(ts=5.0, sample="g0.0#1", reward=1.0, reward_version="r"),
            ev.Leased(ts=6.0, lease="L1", version="v", groups=["g0"]),
            ev.Committed(ts=7.0, lease="L1", version="v2", parent="v", settings_digest="d",
                         samples=["g0.0#1"])]


def test_tool_seconds_come_out_of_generation_and_the_stages_still_add_up() -> None:
    data = _payload((Turn("model", 2, 0.25), Turn("env", 1, 1.5, "calc:1+1", "ok"),
                     Turn("model", 2, 0.25)))
    assert pl.env_seconds(data) == 1.5 and pl.env_seconds(None) == 0.0
    single = pl.encode(Completion((1,), (5, 6), (0.0, 0.0), "x", "stop", 1.0))
    assert pl.env_seconds(single) == 0.0
    spans = collect_spans(_events(2.0), {"g0.0#1": data}.get)
    assert spans.tool == [1.5] and spans.stages["generation"] == [0.5]
    assert sum(v[0] for v in spans.stages.values()) + spans.tool[0] == pytest.approx(
        spans.total[0])
    rows = [r.stage for r in decompose(spans)]
    assert rows == list(TOOL_STAGES) and rows.index("tool") == rows.index("generation") + 1
    # no payloads, or none with tool time: the table of before, no tool row
    assert [r.stage for r in decompose(collect_spans(_events(2.0)))] == list(STAGES)
    assert [r.stage for r in decompose(collect_spans(_events(2.0),
                                                     {"g0.0#1": single}.get))] == list(STAGES)


def test_tool_time_is_capped_by_the_time_on_the_worker() -> None:
    data = _payload((Turn("model", 2, 0.1), Turn("env", 1, 9.0, "calc:1", "ok")))
    spans = collect_spans(_events(2.0), {"g0.0#1": data}.get)
    assert spans.tool == [2.0] and spans.stages["generation"] == [0.0]


@pytest.mark.slow
def test_a_slow_tool_run_shows_its_tool_stage(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    cfg = load_config(None, [
        "run.progress=false", "task.name=calc", "task.n_prompts=64", "task.params={}",
        "rollout.group_size=4", "rollout.batch_groups=2", "rollout.max_new_tokens=6",
        "run.steps=2", "run.runtime=inline", "run.torch_threads=1", "rewards.0.fn=numeric",
        "rollout.workflow=calc_tool", "tools.latency={dist: fixed, median_s: 0.05}"])
    assert run(cfg, out, stream=io.StringIO(), report=False).ok
    stages = {r["stage"]: r for r in json.loads((out / "summary.json").read_text())["stages"]}
    assert list(stages) == list(TOOL_STAGES)
    assert stages["tool"]["p50"] >= 0.05  # every accepted episode made at least one call
    result = CliRunner().invoke(main, ["timing", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [ln.split()[0] for ln in lines[1:8]] == list(TOOL_STAGES)
    assert float(lines[3].split()[1]) >= 0.05  # the tool row's p50

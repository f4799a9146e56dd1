"""Sample bias (freshroll.figures.bias): the accepted samples against those generated, in
summary.json, the report, the end of a run and validate's sample_bias gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freshroll.errors import ConfigError
from freshroll.figures import bias as b
from freshroll.ledger import events as ev
from freshroll.report.bias import sample_bias as bias_html
from freshroll.validate.acceptance import parse
from freshroll.validate.gates import Measured, Repeat, evaluate

P0, P1, P2 = "p0-aa", "p1-bb", "p2-cc"


def _o(step: int, accepted: bool, tokens: int, reward: float | None = None,
       prompt: str = "a", version: int | None = 0) -> b.Outcome:
    return b.Outcome(step, accepted, tokens, reward, prompt, version)


def test_without_discards_every_figure_is_zero() -> None:
    out = [_o(0, True, 4 + i, float(i), f"q{i}", i % 2) for i in range(6)]
    f = b.figures(out)
    assert (f["length_bias"], f["reward_bias"], f["prompt_coverage"], f["version_tv"]) == \
        (0.0, 0.0, 1.0, 0.0)
    assert f["easy_prompt_bias"] == 0.0 and f["divergence"] == 0.0 and f["flagged"] == []


def test_discarding_long_old_low_reward_samples_shows_in_each_figure() -> None:
    kept = [_o(0, True, 4, 1.0, "a", 2), _o(0, True, 4, 1.0, "b", 2)]
    lost = [_o(0, False, 12, 0.0, "c", 0), _o(0, False, 12, 0.0, "c", 0)]
    f = b.figures(kept + lost, threshold=0.3)
    assert f["length_bias"] == pytest.approx(4 / 8 - 1)  # short ones over-represented
    assert f["reward_bias"] == pytest.approx((1.0 - 0.5) / 0.5)  # pstdev of 0,0,1,1 = 0.5
    assert f["prompt_coverage"] == pytest.approx(2 / 3)  # prompt c never trained
    assert f["version_tv"] == pytest.approx(0.5)  # accepted all v2; generated half v0
    # prompts' mean rewards a 1, b 1, c 0 (std 0.471): accepted 1.0 against generated 0.5
    assert f["easy_prompt_bias"] == pytest.approx(0.5 / 0.4714045, rel=1e-6)
    assert f["divergence"] == pytest.approx(f["easy_prompt_bias"])
    assert f["flagged"] == ["easy_prompt_bias", "length_bias", "prompt_coverage", "reward_bias",
                            "version_tv"]
    assert b.figures(kept + lost, threshold=1.5)["flagged"] == []
    line = b.render({**f, "threshold": 0.3})
    assert "length bias -0.500" in line and "prompt coverage 66.7%" in line
    assert "monitor.bias_threshold 0.3" in line


def test_no_accepted_sample_and_no_reward_spread_leave_figures_out() -> None:
    f = b.figures([_o(0, False, 5, 0.3)])
    assert f["length_bias"] is None and f["reward_bias"] is None and f["version_tv"] is None
    assert f["prompt_coverage"] == 0.0 and f["divergence"] == 1.0
    same = b.figures([_o(0, True, 5, 0.3), _o(0, False, 7, 0.3)])
    assert same["reward_bias"] is None  # std 0: no scale to measure a shift in


def test_windows_split_the_steps_evenly_and_the_tail_joins_the_last() -> None:
    out = [_o(s, s % 2 == 0, 4) for s in range(20)] + [_o(25, False, 4)]
    w = b.windows(out, steps=20, n=4)
    assert [(x["from_step"], x["to_step"]) for x in w] == [(0, 5), (5, 10), (10, 15), (15, 20)]
    assert [x["generated"] for x in w] == [5, 5, 5, 6]
    assert b.windows(out, steps=3)[-1]["to_step"] == 3 and len(b.windows(out, steps=3)) == 3
    assert b.windows([], steps=5) == []


def _events(threshold: float | None) -> list[ev.Event]:
    cfg = {"monitor": {"bias_threshold": threshold}} if threshold is not None else {}
    out: list[ev.Event] = [ev.RunConfig(ts=0, step=0, config=json.dumps(cfg), config_digest="d",
                                        model_digest="m")]
    for g, prompt in ((0, "easy"), (1, "hard")):
        out.append(ev.Requested(ts=0, group=f"g{g}", prompt_id=prompt, size=2, version=P0))
    for s, v, tokens, reward in (("g0.0#1", P1, 3, 1.0), ("g0.1#1", P1, 3, 1.0),
                                 ("g1.0#1", P0, 9, 0.0), ("g1.1#1", P0, 9, 0.0),
                                 ("g1.1#2", P0, 50, 0.0)):
        out += [ev.Started(ts=1, sample=s, worker="w", epoch=0, version=v),
                ev.Generated(ts=2, sample=s, tokens=tokens, gen_s=0.1)]
        if s != "g1.1#2":
            out.append(ev.Rewarded(ts=3, sample=s, reward=reward, reward_version="r:x:1"))
    out += [ev.Discarded(ts=4, request="g1.1", reason="fenced", sample="g1.1#2"),  # re-issued
            ev.Committed(ts=5, lease="l", version=P2, parent=P1, settings_digest="s",
                         samples=["g0.0#1", "g0.1#1"]),
            ev.Discarded(ts=6, request="g1.0", reason="stale", sample="g1.0#1"),
            ev.Discarded(ts=6, request="g1.1", reason="stale", sample="g1.1#1")]
    return out


def test_the_fold_reads_the_ledgers_events_and_the_configs_threshold() -> None:
    got = b.sample_bias(_events(0.4))
    assert got["threshold"] == 0.4 and got["generated"] == 4 and got["accepted"] == 2
    assert got["length_bias"] == pytest.approx(3 / 6 - 1)  # the fenced attempt is left out
    assert got["prompt_coverage"] == 0.5 and got["version_tv"] == pytest.approx(0.5)
    assert got["easy_prompt_bias"] == pytest.approx(1.0)  # easy 1.0, hard 0.0: std 0.5
    assert got["flagged"] == ["easy_prompt_bias", "length_bias", "prompt_coverage",
                              "reward_bias", "version_tv"]
    assert [(w["from_step"], w["to_step"], w["generated"]) for w in got["over_time"]] == \
        [(0, 1, 4)]
    assert b.sample_bias(_events(None))["threshold"] == b.DEFAULT_THRESHOLD


def test_the_report_shows_the_table_and_what_is_flagged() -> None:
    html = bias_html(b.sample_bias(_events(0.4)))
    assert "Sample bias: accepted against generated" in html
    assert "<b class='fail'>-0.500 flagged</b>" in html and "50.0% flagged" in html
    assert bias_html(None) == ""


def test_summary_json_carries_it_and_verify_recomputes_it(tmp_path: Path) -> None:
    from freshroll.harness.verify import verify_run
    from report.test_report import make_run

    run = make_run(tmp_path / "run", max_staleness=1, steps=12)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sample_bias"]["generated"] > summary["sample_bias"]["accepted"] > 0
    assert verify_run(run).ok
    summary["sample_bias"]["length_bias"] = 0.5  # a figure that is not the ledger's
    (run / "summary.json").write_text(json.dumps(summary))
    report = verify_run(run)
    assert not report.ok and "sample_bias.length_bias" in str(report.violations)


def _repeat(seed: int, bias: float | None) -> Repeat:
    return Repeat(label=f"async-seed{seed}", mode="async", seed=seed, run_dir=f"/r{seed}",
                  figures={"sample_bias": bias})


def test_validates_sample_bias_gate_reads_the_worst_repeat() -> None:
    spec = parse({"gates": {"sample_bias": {"max": 0.1}}}, "a.yaml")
    crit = {c.name: c for c in evaluate(spec.gates, 1, Measured(
        async_runs=[_repeat(0, 0.05), _repeat(1, 0.12)]))}["sample_bias"]
    assert not crit.passed and crit.value == 0.12 and crit.limit == 0.1
    ok = {c.name: c for c in evaluate(spec.gates, 1, Measured(
        async_runs=[_repeat(0, 0.05)]))}["sample_bias"]
    assert ok.passed
    with pytest.raises(ConfigError, match="sample_bias"):
        parse({"gates": {"sample_bias": {"max": 0.1, "min": 0}}}, "a.yaml")

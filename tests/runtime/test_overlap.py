"""Did asynchrony pay (:mod:`freshroll.figures.overlap`): the verdict from a ledger's own
intervals, on synthetic ledgers of both kinds, and on one real short run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from freshroll.figures.overlap import intersection, overlap_with, render, slowdown, union
from freshroll.figures.summary import fold_events
from freshroll.ledger import events as ev

B = 2  # completions per step: one group of two, one lock-step call per group


def _ledger(calls: list[tuple[float, float]], trains: list[tuple[float, float]],
            eta: int = 1) -> list[ev.Event]:
    """A complete ledger: step k trains on the group of call k; call k runs ``calls[k]``,
    step k runs ``trains[k]`` (its lease taken at its start, after waiting since the
    previous commit); calls beyond the steps are generated, then discarded at shutdown."""
    out: list[ev.Event] = [ev.Opened(ts=0.0, run_id="r", incarnation=1, max_staleness=eta,
                                     batch_groups=1, group_size=B)]
    prev_end = 0.0
    for k, ((gs, ge), (ts, te)) in enumerate(zip(calls, trains, strict=False)):
        g = f"g{k}"
        samples = [f"{g}.{j}#1" for j in range(B)]
        version = f"p{k}-aa"
        out.append(ev.Requested(ts=gs, group=g, prompt_id=f"q{k}", size=B, version=version))
        out += [ev.Started(ts=gs, sample=s, worker="w0", epoch=1, version=version)
                for s in samples]
        out += [ev.Generated(ts=ge, sample=s, tokens=4, gen_s=ge - gs) for s in samples]
        out += [ev.Rewarded(ts=ge, sample=s, reward=1.0, reward_version="r:x:00")
                for s in samples]
        out.append(ev.Ready(ts=ge, group=g, samples=samples))
        out.append(ev.Leased(ts=ts, lease=f"l{k}", version=version, groups=[g],
                             wait_s=max(0.0, ts - prev_end)))
        out.append(ev.Committed(ts=te, lease=f"l{k}", version=f"p{k + 1}-aa", parent=version,
                                settings_digest="s", samples=samples, train_s=te - ts,
                                metrics={"reward_mean": 1.0}))
        prev_end = te
    for k, (gs, ge) in enumerate(calls[len(trains):], start=len(trains)):  # never trained
        g, samples = f"g{k}", [f"g{k}.{j}#1" for j in range(B)]
        out.append(ev.Requested(ts=gs, group=g, prompt_id=f"q{k}", size=B, version="p0-aa"))
        out += [ev.Started(ts=gs, sample=s, worker="w0", epoch=1, version="p0-aa")
                for s in samples]
        out += [ev.Generated(ts=ge, sample=s, tokens=4, gen_s=ge - gs) for s in samples]
        out += [ev.Discarded(ts=ge, request=s.partition("#")[0], sample=s, reason="shutdown")
                for s in samples]
    out.append(ev.Closed(ts=max(prev_end, *(e for _, e in calls)) + 0.001))
    return sorted(out, key=lambda e: e.ts)  # stable: same-ts events keep their order


def _overlap(events: list[ev.Event]) -> dict[str, Any]:
    summary = fold_events(events).summary()
    return summary["overlap"]


def test_intervals():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert intersection([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)
    assert overlap_with((1, 3.5), [(0, 2), (3, 4)]) == pytest.approx(1.5)
    assert slowdown([(1, 0, 2), (1, 0, 2), (2, 2, 2), (2, 2, 2)]) == pytest.approx(2.0)
    assert slowdown([(1, 0, 2), (2, 2, 2), (2, 2, 2)]) is None  # one solo call: no figure


def test_real_overlap_pays():
    """Generation of step k+1 runs during training of step k, both at solo speed (1 s)."""
    n = 10
    calls = [(float(k), k + 1.0) for k in range(n)]
    trains = [(k + 1.0, k + 2.0) for k in range(n)]
    o = _overlap(_ledger(calls, trains))
    assert o["parallelism"] == pytest.approx(2 * n / (n + 1))
    assert o["overlapped"] == pytest.approx((n - 1) / n)  # the first call ran alone
    assert o["sync_estimate_per_s"] == pytest.approx(B / 2.0)  # 1 s generation + 1 s training
    assert o["accepted_rollouts_per_s"] == pytest.approx(B * n / (n + 1))
    assert o["verdict"] == "paid"
    assert render(o).startswith("asynchrony paid:")


def test_stages_taking_turns_do_not_pay():
    """An async run whose stages ran one at a time: no faster than sync, and it says so."""
    n = 10
    calls = [(2.0 * k, 2.0 * k + 1) for k in range(n)]
    trains = [(2.0 * k + 1, 2.0 * k + 2) for k in range(n)]
    o = _overlap(_ledger(calls, trains))
    assert o["overlapped"] == 0.0
    assert o["parallelism"] == pytest.approx(1.0)
    assert o["ratio"] == pytest.approx(1.0)
    assert o["verdict"] == "did not pay"
    line = render(o, {"loadavg": [1.9, 1.0, 1.0], "cores": 2})
    assert line.startswith("asynchrony did not pay in this run: stages overlapped 0% "
                           "(parallelism 1.00), load average 1.9 on 2 cores; "
                           "run.max_staleness: 0 would likely be as fast")


def test_overlapped_but_each_stage_twice_as_slow_does_not_pay():
    """Both stages busy all the time (parallelism ~2), but each ran at half its solo speed
    while the other ran (one core between them: the GIL, or another process): the
    slowdown measured on each stage (alone 1 s, overlapped 2 s) says sync is as fast."""
    m = 10
    calls = [(0.0, 1.0), (1.0, 2.0)]  # the trainer waits for its first batch: solo calls
    calls += [(2.0 + 2 * k, 4.0 + 2 * k) for k in range(m)]  # call k+2 during step k: 2 s
    trains = [(2.0 + 2 * k, 4.0 + 2 * k) for k in range(m)]
    trains += [(2.0 + 2 * m, 3.0 + 2 * m), (3.0 + 2 * m, 4.0 + 2 * m)]  # the last two alone
    o = _overlap(_ledger(calls, trains))
    assert o["parallelism"] > 1.5
    assert o["slowdown"] == {"generation": pytest.approx(2.0), "training": pytest.approx(2.0)}
    assert o["sync_estimate_per_s"] == pytest.approx(B / 2.0)
    assert o["accepted_rollouts_per_s"] == pytest.approx(B / 2.0)
    assert o["effective_parallelism"] < 1.1
    assert o["verdict"] == "did not pay"


def test_a_stage_that_never_ran_alone_is_taken_as_slow_as_the_other():
    """Training always overlapped (no solo step): generation's slowdown stands for it."""
    m = 10
    calls = [(0.0, 1.0), (1.0, 2.0)] + [(2.0 + 2 * k, 4.0 + 2 * k) for k in range(m)]
    trains = [(2.0 + 2 * k, 4.0 + 2 * k) for k in range(m + 2)]
    calls += [(2.0 + 2 * m, 4.0 + 2 * m), (4.0 + 2 * m, 6.0 + 2 * m)]  # keeps generating
    o = _overlap(_ledger(calls, trains))
    assert o["slowdown"]["training"] is None
    assert o["slowdown"]["generation"] == pytest.approx(2.0)
    assert o["sync_step_s"]["training"] == pytest.approx(1.0)  # 2 s overlapped / 2


def test_a_sync_run_has_no_async_verdict():
    n = 6
    calls = [(2.0 * k, 2.0 * k + 1) for k in range(n)]
    trains = [(2.0 * k + 1, 2.0 * k + 2) for k in range(n)]
    o = _overlap(_ledger(calls, trains, eta=0))
    assert o["verdict"] == "sync"
    assert o["ratio"] == pytest.approx(1.0)  # the estimate is the sync run itself
    assert render(o) == ""


def test_verify_notes_a_run_whose_asynchrony_did_not_pay(tmp_path: Path):
    """The synthetic turn-taking ledger as a run directory: summary.json keeps the host block
    it was written with (verify does not recompute it, nor flag it), and verify's notes say
    plainly that asynchrony did not pay, with that load."""
    from freshroll.harness.verify import verify_run
    from freshroll.ledger.store import open_ledger
    from freshroll.runtime.endfiles import write_summary

    n = 6
    calls = [(2.0 * k, 2.0 * k + 1) for k in range(n)]
    trains = [(2.0 * k + 1, 2.0 * k + 2) for k in range(n)]
    ledger = open_ledger(tmp_path)
    for e in _ledger(calls, trains):
        ledger.append(e)
    ledger.close()
    write_summary(tmp_path, host={"loadavg": [1.5, 1.0, 0.5], "cores": 2, "cpu_count": 2})
    assert json.loads((tmp_path / "summary.json").read_text())["host"]["cores"] == 2
    write_summary(tmp_path)  # rebuilt later (freshroll report): the recorded host is kept
    report = verify_run(tmp_path)
    assert not report.violations.get("accounting"), report.render()
    (note,) = [n for n in report.notes if "did not pay" in n]
    assert "load average 1.5 on 2 cores" in note


@pytest.mark.slow
def test_one_real_async_run_says_whether_asynchrony_paid(tmp_path: Path):
    """A real short run (the tiny default): summary.json has the overlap block and the
    host's load, verify passes with it, and the end prints the verdict line."""
    from freshroll.config import load_config
    from freshroll.harness.verify import verify_run
    from freshroll.runtime.run import run

    # the placement fixed: with run.runtime / run.torch_threads auto, the thread probe may
    # start a 6-step run in sync mode (the pipeline's fill weighs on so short a run, and a
    # loaded suite skews the probe: it did once), and this test is about an async run
    cfg = load_config(None, ["run.steps=6", "run.max_staleness=1", "run.progress=true",
                             "task.n_prompts=64", "run.runtime=inline", "run.torch_threads=1"])
    err = io.StringIO()
    result = run(cfg, tmp_path / "r", stream=err, report=False)
    assert result.ok
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    o, host = summary["overlap"], summary["host"]
    assert o["verdict"] in ("paid", "did not pay")
    assert o["train_busy_s"] > 0 and o["gen_busy_s_by_worker"]["w0"] > 0
    assert 0 < o["parallelism"] <= 2.5
    assert host["cores"] >= 1 and len(host["loadavg"]) == 3
    assert "asynchrony " in err.getvalue().splitlines()[-1]
    report = verify_run(tmp_path / "r")
    assert report.ok, report.render()
    assert any("did not pay" in n for n in report.notes) == (o["verdict"] == "did not pay")

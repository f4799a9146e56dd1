"""``freshroll trace``: per-sample spans as Chrome trace-event JSON (issue 27, item 2).

Unit tests build the trace of small synthetic ledgers (times in ledger seconds, from 100
so that the origin shift shows); one end-to-end test traces a simulated run made with the
CLI and checks the file's structure and that every committed sample is in it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from e2e.e2e_helpers import freshroll
from freshroll.chaos import runner
from freshroll.chaos.plan import load_plan
from freshroll.cli import main
from freshroll.errors import ConfigError, RunDirError
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger
from freshroll.report.chrome import Span, lanes
from freshroll.report.trace import build_trace, parse_steps, write_trace

P0, P1, P2 = "p0-aa", "p1-bb", "p2-cc"
R = "r:exact:dd"


def _run(*, close: bool = True) -> list[ev.Event]:
    """Group g0 (two members) trained at step 1. g0.1's first attempt ran on w1, which was
    lost: it is fenced and re-issued to w0. Worker w0 loads p1 after the step."""
    out: list[ev.Event] = [
        ev.Opened(ts=100.0, run_id="t", incarnation=0, max_staleness=1, batch_groups=1,
                  group_size=2),
        ev.WorkerStarted(ts=100.0, worker="w0", epoch=0),
        ev.WorkerStarted(ts=100.0, worker="w1", epoch=0),
        ev.WorkerReady(ts=100.5, worker="w0", epoch=0, startup_s=0.5),
        ev.WorkerReady(ts=100.5, worker="w1", epoch=0, startup_s=0.5),
        ev.Requested(ts=101.0, group="g0", prompt_id="q0", size=2, version=P0),
        ev.Started(ts=102.0, sample="g0.0#1", worker="w0", epoch=0, version=P0),
        ev.Started(ts=102.0, sample="g0.1#1", worker="w1", epoch=0, version=P0),
        ev.WorkerFenced(ts=103.0, worker="w1", epoch=0, reason="lost", detail="WorkerLost: x"),
        ev.Discarded(ts=103.0, request="g0.1", reason="fenced", sample="g0.1#1",
                     detail="worker w1 epoch 0 lost"),
        ev.Started(ts=104.0, sample="g0.1#2", worker="w0", epoch=0, version=P0),
        ev.Generated(ts=105.0, sample="g0.0#1", tokens=5, gen_s=3.0),
        ev.Rewarded(ts=105.5, sample="g0.0#1", reward=1.0, reward_version=R, reward_s=0.5),
        ev.Generated(ts=106.0, sample="g0.1#2", tokens=7, gen_s=2.0),
        ev.Rewarded(ts=106.5, sample="g0.1#2", reward=0.0, reward_version=R, reward_s=0.5),
        ev.Ready(ts=106.5, group="g0", samples=["g0.0#1", "g0.1#2"]),
        ev.Leased(ts=107.0, lease="l0", version=P0, groups=["g0"], wait_s=1.0),
        ev.Committed(ts=108.0, lease="l0", version=P1, parent=P0, settings_digest="s",
                     samples=["g0.0#1", "g0.1#2"], train_s=1.0),
        ev.WeightsLoaded(ts=108.5, worker="w0", epoch=0, version=P1, transfer_s=0.5),
    ]
    return [*out, ev.Closed(ts=109.0)] if close else out


def _x(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _of(trace: dict[str, Any], sample: str) -> dict[str, dict[str, Any]]:
    """The spans of one attempt, by name."""
    return {e["name"]: e for e in _x(trace) if e["args"].get("sample") == sample}


def _names(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> "process/thread" from the metadata events."""
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    return {(e["pid"], e["tid"]): f"{procs[e['pid']]}/{e['args']['name']}"
            for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def _track(trace: dict[str, Any], event: dict[str, Any]) -> str:
    return _names(trace)[(event["pid"], event["tid"])]


def _check_structure(trace: dict[str, Any]) -> None:
    """What Perfetto and chrome://tracing need; and no two spans of one thread overlap."""
    assert trace["displayTimeUnit"] == "ms"
    names = _names(trace)
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M", "i")
        assert {"name", "ph", "pid", "tid"} <= set(e)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0, e
            assert (e["pid"], e["tid"]) in names, e
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans


# -- spans --------------------------------------------------------------------------------------


def test_a_committed_sample_has_its_queue_generate_reward_and_buffer_spans() -> None:
    trace = build_trace(_run())
    _check_structure(trace)
    spans = _of(trace, "g0.0#1")
    assert set(spans) == {"queue", "generate", "reward", "buffer wait"}
    # microseconds since the ledger's first event (ts 100)
    assert (spans["queue"]["ts"], spans["queue"]["dur"]) == (1e6, 1e6)
    assert (spans["generate"]["ts"], spans["generate"]["dur"]) == (2e6, 3e6)
    assert (spans["reward"]["ts"], spans["reward"]["dur"]) == (5e6, 0.5e6)
    assert (spans["buffer wait"]["ts"], spans["buffer wait"]["dur"]) == (5.5e6, 1.5e6)
    for span in spans.values():
        args = span["args"]
        assert args["policy_version"] == P0 and args["reward_version"] == R
        assert args["request"] == "g0.0" and args["step"] == 1
    assert spans["generate"]["args"]["tokens"] == 5
    assert spans["reward"]["args"]["reward"] == 1.0
    assert _track(trace, spans["generate"]).startswith("inference/w0")
    assert _track(trace, spans["reward"]) == "reward/reward"


def test_the_trainer_track_has_one_span_per_step_with_its_batch() -> None:
    trace = build_trace(_run())
    [step] = [e for e in _x(trace) if e["name"] == "train step"]
    assert _track(trace, step) == "trainer/trainer"
    assert (step["ts"], step["dur"]) == (7e6, 1e6)
    assert step["args"]["step"] == 1 and step["args"]["new_version"] == P1
    assert step["args"]["policy_version"] == P0
    assert step["args"]["samples"] == ["g0.0#1", "g0.1#2"]


def test_a_fenced_attempt_is_its_own_span_and_its_retry_queues_from_the_fence() -> None:
    trace = build_trace(_run())
    fenced = _of(trace, "g0.1#1")
    assert set(fenced) == {"queue", "generate (fenced)"}
    gen = fenced["generate (fenced)"]
    assert gen["args"]["outcome"] == "fenced" and "w1 epoch 0 lost" in gen["args"]["detail"]
    assert (gen["ts"], gen["dur"]) == (2e6, 1e6)
    assert _track(trace, gen) == "inference/w1"
    retry = _of(trace, "g0.1#2")
    assert (retry["queue"]["ts"], retry["queue"]["dur"]) == (3e6, 1e6)
    assert retry["generate"]["args"]["attempt"] == 2
    [mark] = [e for e in trace["traceEvents"] if e["ph"] == "i" and "fenced" in e["name"]]
    assert _track(trace, mark) == "inference/w1" and mark["args"]["reason"] == "lost"


def test_overlapping_spans_of_one_worker_go_to_lanes_named_after_it() -> None:
    trace = build_trace(_run())
    first, second = _of(trace, "g0.0#1")["generate"], _of(trace, "g0.1#2")["generate"]
    assert {_track(trace, first), _track(trace, second)} == {"inference/w0",
                                                              "inference/w0 (2)"}
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert procs == {"queue", "inference", "reward", "buffer", "trainer"}


def test_lanes_reuse_the_lowest_free_lane() -> None:
    def span(a: float, b: float) -> Span:
        return Span(("inference", "w0"), "generate", a, b, {})

    assert lanes([span(0, 2), span(1, 3), span(2, 4), span(2.5, 5), span(4, 6)]) == [
        0, 1, 0, 2, 0]
    assert lanes([span(0, 0), span(0, 1)]) == [0, 0]


def test_worker_start_and_weight_loads_are_on_the_worker_track() -> None:
    trace = build_trace(_run())
    [load] = [e for e in _x(trace) if e["name"] == "load weights"]
    assert (load["ts"], load["dur"]) == (8e6, 0.5e6)
    assert load["args"]["policy_version"] == P1 and _track(trace, load) == "inference/w0"
    starts = [e for e in _x(trace) if e["name"] == "start engine"]
    assert len(starts) == 2 and all(e["dur"] == 0.5e6 for e in starts)


def test_discarded_samples_show_their_reason() -> None:
    events = [
        *_run(close=False),
        ev.Requested(ts=108.0, group="g1", prompt_id="q1", size=2, version=P1),
        ev.Started(ts=108.0, sample="g1.0#1", worker="w0", epoch=0, version=P1),
        ev.Generated(ts=108.2, sample="g1.0#1", tokens=1, gen_s=0.2),
        ev.Discarded(ts=108.4, request="g1.0", reason="reward_error", sample="g1.0#1",
                     detail="ZeroDivisionError"),
        ev.Discarded(ts=108.6, request="g1.1", reason="shutdown", detail="run ended"),
        ev.Closed(ts=109.0),
    ]
    trace = build_trace(events)
    _check_structure(trace)
    bad = _of(trace, "g1.0#1")
    assert set(bad) == {"queue", "generate", "reward (reward_error)"}
    assert bad["reward (reward_error)"]["args"]["detail"] == "ZeroDivisionError"
    [queued] = [e for e in _x(trace) if e["args"].get("request") == "g1.1"]
    assert queued["name"] == "queue (shutdown)" and queued["dur"] == pytest.approx(0.6e6)


def test_a_stale_sample_waits_in_the_buffer_until_its_discard() -> None:
    events = [
        *_run(close=False)[:-3],  # g0 never leased: it goes stale
        ev.Discarded(ts=107.0, request="g0.0", reason="stale", sample="g0.0#1",
                     detail="lag 2 > 1"),
    ]
    wait = _of(build_trace(events), "g0.0#1")["buffer wait (stale)"]
    assert (wait["ts"], wait["dur"]) == (5.5e6, 1.5e6)
    assert wait["args"]["outcome"] == "stale" and wait["args"]["step"] is None


def test_a_released_lease_splits_the_buffer_wait() -> None:
    events = _run()
    i = next(i for i, e in enumerate(events) if isinstance(e, ev.Leased))
    events[i:i] = [ev.Leased(ts=106.6, lease="l9", version=P0, groups=["g0"]),
                   ev.LeaseReleased(ts=106.8, lease="l9", reason="trainer_error")]
    trace = build_trace(events)
    _check_structure(trace)
    waits = sorted((e["ts"], e["dur"], e["args"].get("lease")) for e in _x(trace)
                   if e["args"].get("sample") == "g0.0#1" and e["name"] == "buffer wait")
    assert waits == [(5.5e6, pytest.approx(1.1e6), "l9"), (6.8e6, pytest.approx(0.2e6), "l0")]
    released = [e for e in _x(trace) if e["name"] == "train step (released)"]
    assert released[0]["args"]["detail"] == "trainer_error"


def test_a_skipped_step_shows_on_the_trainer_and_on_its_samples() -> None:
    events = _run()
    i = next(i for i, e in enumerate(events) if isinstance(e, ev.Committed))
    events[i:i + 1] = [
        ev.StepSkipped(ts=108.0, lease="l0", version=P0, reason="nonfinite",
                       detail="step 1: loss is nan"),
        ev.LeaseReleased(ts=108.0, lease="l0", reason="step_skipped"),
        ev.Discarded(ts=108.0, request="g0.0", reason="nonfinite_step", sample="g0.0#1"),
        ev.Discarded(ts=108.0, request="g0.1", reason="nonfinite_step", sample="g0.1#2"),
    ]
    trace = build_trace(events)
    _check_structure(trace)
    [step] = [e for e in _x(trace) if e["name"].startswith("train step")]
    assert step["name"] == "train step (skipped)" and "loss is nan" in step["args"]["detail"]
    assert step["args"]["step"] is None and step["dur"] == 1e6
    spans = _of(trace, "g0.0#1")
    assert spans["buffer wait"]["args"]["lease"] == "l0"
    assert spans["buffer wait (nonfinite_step)"]["dur"] == 0
    assert spans["buffer wait (nonfinite_step)"]["args"]["step"] is None


def test_a_crashed_run_ends_its_open_spans_at_the_last_event_as_unfinished() -> None:
    events = _run()[:12]  # cut after g0.0#1 generated; g0.1#2 still generating
    trace = build_trace(events)
    _check_structure(trace)
    gen = _of(trace, "g0.1#2")["generate (unfinished)"]
    assert gen["ts"] + gen["dur"] == 5e6  # the last event, g0.0#1's generated
    assert _of(trace, "g0.0#1")["reward (unfinished)"]["dur"] == 0


def test_virtual_time_from_zero_and_an_empty_ledger() -> None:
    events = [ev.Opened(ts=0.0, run_id="v", incarnation=0, max_staleness=1, batch_groups=1,
                        group_size=2)]
    assert _x(build_trace(events)) == []
    assert build_trace([])["traceEvents"] == []


# -- --steps ------------------------------------------------------------------------------------


def _two_steps() -> list[ev.Event]:
    """Step 1 trains g0 (as :func:`_run`); step 2 trains g1; g2.0 is discarded (stale)
    between the two commits, g3.0 after step 2."""
    events = _run(close=False)
    events += [
        ev.Requested(ts=108.0, group="g1", prompt_id="q1", size=1, version=P1),
        ev.Requested(ts=108.0, group="g2", prompt_id="q2", size=1, version=P1),
        ev.Started(ts=109.0, sample="g1.0#1", worker="w0", epoch=0, version=P1),
        ev.Generated(ts=110.0, sample="g1.0#1", tokens=3, gen_s=1.0),
        ev.Rewarded(ts=110.0, sample="g1.0#1", reward=1.0, reward_version=R),
        ev.Discarded(ts=110.5, request="g2.0", reason="stale", detail="lag 2 > 1"),
        ev.Leased(ts=111.0, lease="l1", version=P1, groups=["g1"]),
        ev.Committed(ts=112.0, lease="l1", version=P2, parent=P1, settings_digest="s",
                     samples=["g1.0#1"]),
        ev.Requested(ts=112.0, group="g3", prompt_id="q3", size=1, version=P2),
        ev.Discarded(ts=113.0, request="g3.0", reason="shutdown"),
        ev.Closed(ts=113.0),
    ]
    return events


def test_steps_keep_the_samples_of_those_steps_and_the_discards_in_their_window() -> None:
    trace = build_trace(_two_steps(), (2, 2))
    _check_structure(trace)
    requests = {e["args"].get("request") for e in _x(trace)} - {None}
    assert requests == {"g1.0", "g2.0"}
    [step] = [e for e in _x(trace) if e["name"] == "train step"]
    assert step["args"]["step"] == 2
    # the workers' spans in the window (from g1.0's queue at 108 to the commit at 112)
    assert [e["name"] for e in _x(trace) if "request" not in e["args"]
            and e["name"] != "train step"] == ["load weights"]
    assert build_trace(_two_steps(), (1, 2))["traceEvents"] != trace["traceEvents"]
    whole = {e["args"].get("request") for e in _x(build_trace(_two_steps(), (1, 2)))}
    assert {"g0.0", "g0.1", "g1.0", "g2.0"} <= whole and "g3.0" not in whole


def test_steps_keep_every_attempt_of_a_kept_request() -> None:
    trace = build_trace(_two_steps(), (1, 1))
    assert "generate (fenced)" in _of(trace, "g0.1#1")
    assert {e["args"].get("request") for e in _x(trace)} - {None} == {"g0.0", "g0.1"}


@pytest.mark.parametrize("text", ["", "3", "a:b", "0:2", "3:1", "1:2:3", "-1:2", "1-2"])
def test_malformed_steps_are_a_config_error_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--steps "):
        parse_steps(text)


def test_steps_parse_and_a_range_without_steps_says_what_the_run_has() -> None:
    assert parse_steps("3:7") == (3, 7) and parse_steps("2:2") == (2, 2)
    with pytest.raises(ConfigError, match=r"--steps 5:9: .*committed steps 1\.\.2"):
        build_trace(_two_steps(), (5, 9))


# -- the file and the command -------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        for e in _two_steps():
            ledger.append(e)
        ledger.flush()
    yield tmp_path


def test_write_trace_writes_run_dir_trace_json_or_the_output(run_dir: Path) -> None:
    out = write_trace(run_dir)
    assert out == run_dir / "trace.json"
    assert json.loads(out.read_text()) == build_trace(_two_steps())
    other = write_trace(run_dir, run_dir / "x.json", "2:2")
    assert json.loads(other.read_text()) == build_trace(_two_steps(), (2, 2))


def test_a_missing_run_dir_or_ledger_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"RUN_DIR .*: no such directory"):
        write_trace(tmp_path / "nope")
    with pytest.raises(RunDirError, match=r"not a run directory \(no ledger.sqlite\)"):
        write_trace(tmp_path)


@pytest.mark.parametrize("args,line", [
    (["{nope}"], "error: RUN_DIR {nope}: no such directory"),
    (["{empty}"], "error: RUN_DIR {empty}: not a run directory (no ledger.sqlite)"),
    (["{run}", "--steps", "2-3"], "error: --steps '2-3': expected A:B"),
    (["{run}", "-o", "{nope}/t.json"], "error: -o {nope}/t.json: no directory {nope}"),
])
def test_the_command_fails_in_one_line_with_status_2(
    run_dir: Path, tmp_path: Path, args: list[str], line: str
) -> None:
    paths = {"nope": tmp_path / "nope", "empty": tmp_path / "empty", "run": run_dir}
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["trace", *(a.format(**paths) for a in args)])
    assert result.exit_code == 2
    [got] = result.stderr.splitlines()
    assert got.startswith(line.format(**paths)), got


def test_the_command_prints_the_file_it_wrote(run_dir: Path) -> None:
    result = CliRunner().invoke(main, ["trace", str(run_dir), "--steps", "1:1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(run_dir / "trace.json")


@pytest.mark.slow
def test_a_simulated_run_traced_by_the_cli(tmp_path: Path) -> None:
    run = tmp_path / "run"
    freshroll("simulate", "configs/sim-p1.yaml", "run.steps=3", "run.progress=false",
              "rollout.batch_groups=2", "rollout.group_size=4", "rollout.workers=2",
              "rollout.worker_batch=4", "--out", str(run))
    assert freshroll("trace", str(run)).stdout.strip() == str(run / "trace.json")
    trace = json.loads((run / "trace.json").read_text())
    _check_structure(trace)
    with Ledger(run / "ledger.sqlite", readonly=True) as ledger:
        commits = [e for _, e in ledger.events() if isinstance(e, ev.Committed)]
    committed = {s for c in commits for s in c.samples}
    assert len(commits) == 3 and committed
    generated = {e["args"]["sample"] for e in _x(trace) if e["name"] == "generate"}
    assert committed <= generated
    steps = [e for e in _x(trace) if e["name"] == "train step"]
    assert sorted(e["args"]["step"] for e in steps) == [1, 2, 3]
    threads = set(_names(trace).values())
    assert {"inference/w0", "inference/w1", "trainer/trainer"} <= threads
    freshroll("trace", str(run), "--steps", "2:3", "-o", str(tmp_path / "t.json"))
    part = json.loads((tmp_path / "t.json").read_text())
    _check_structure(part)
    kept = {e["args"]["sample"] for e in _x(part) if e["name"] == "generate"}
    assert {s for c in commits[1:] for s in c.samples} <= kept
    assert not kept & set(commits[0].samples)


def test_a_run_with_a_stalled_worker_shows_its_fenced_attempts(tmp_path: Path) -> None:
    """The chaos library's worker-stall case (simulated cluster, virtual time): w1 stalls,
    its epoch is fenced on timeout and its attempts re-issued."""
    plan = load_plan(Path(__file__).parents[2] / "chaos" / "library.yaml")
    scen = next(s for s in plan.scenarios if s.name == "worker-stall")
    result = runner.run_case(plan, scen, 0, tmp_path)
    assert result.ok
    trace = json.loads(write_trace(result.run_dir).read_text())
    _check_structure(trace)
    fenced = [e for e in _x(trace) if e["name"] == "generate (fenced)"]
    assert fenced and all(_track(trace, e).startswith("inference/w1") for e in fenced)
    retried = {e["args"]["request"] for e in fenced}
    again = [e for e in _x(trace) if e["name"] == "generate" and e["args"]["request"] in retried]
    assert {e["args"]["attempt"] for e in again} == {2}
    assert any(e["name"] == "fenced (timeout)" for e in trace["traceEvents"] if e["ph"] == "i")

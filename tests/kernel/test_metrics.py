"""freshroll.figures.metrics: one function per reported figure, from ledger events; metrics.jsonl
rows."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest
from kernel_driver import SimConfig, simulate

from freshroll.clock import VirtualClock
from freshroll.figures import metrics as m
from freshroll.figures.metrics_log import encode_row, read_rows, reconcile
from freshroll.figures.summary import summarize_events
from freshroll.figures.tally import sample_std
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
P0, P1 = "p0-aa", "p1-bb"


# -- docs/metrics.md and metrics.py hold each other -------------------------------------------
def test_every_documented_figure_has_its_function_and_vice_versa() -> None:
    headings = set(re.findall(r"^### `([a-z_0-9]+)`", DOC.read_text(), flags=re.M))
    assert headings == set(m.FIGURES)
    for name, fn in m.FIGURES.items():
        assert fn.__name__ == name and getattr(m, name) is fn


def test_every_row_column_is_documented(sim_events: list[ev.Event]) -> None:
    table = DOC.read_text().split("## `metrics.jsonl`", 1)[1].split("\n## ", 1)[0]
    columns = dict(re.findall(r"^\| `([a-z_]+)` \| (.+) \|$", table, flags=re.M))
    row = m.rows(sim_events)[0]
    engine = {"kv_cache_usage", "engine_waiting", "engine_running", "preemptions"}
    assert engine <= set(columns) and not engine & set(row)  # no engine report: left out
    control = {"controller_decisions", "controller_bottleneck", "buffer_depth", "in_flight",
               "workers", "concurrency", "admission_limit", "blocked_ratio"}
    assert control <= set(columns) and not control & set(row)  # no decision yet: left out
    labelled = {k for k in row if "/" in k}  # documented as `discards/<reason>` etc.
    assert labelled and all(re.fullmatch(
        r"(discards|lag_histogram|lag_newest_histogram)/[a-z_0-9]+|lag_weighted_histogram/[0-9.]+",
        k) for k in labelled)
    assert "| `discards/<reason>` |" in table and "| `lag_histogram/<lag>` |" in table
    assert "| `lag_newest_histogram/<lag>`, `lag_weighted_histogram/<bin>` |" in table
    # the simulator records no trainer metrics
    assert set(row) - labelled == set(columns) - engine - control
    for fig in columns.values():
        name = fig.strip("`")
        if name in m.FIGURES:
            assert m.FIGURES[name].__name__ == name


# -- the figures ------------------------------------------------------------------------------
def test_the_controller_figures_are_the_last_decisions_and_rows_carry_them() -> None:
    def decided(ts: float, workers: int, bottleneck: str, **inputs: int) -> ev.ControllerDecided:
        live = ev.LiveSettings(admission_limit=4, concurrency=8, workers=workers)
        return ev.ControllerDecided(ts=ts, mode="adaptive", previous=live, settings=live,
                                    bottleneck=bottleneck, reason="r", inputs=inputs, state={})

    def committed(ts: float, lease: str) -> ev.Committed:
        return ev.Committed(ts=ts, lease=lease, version=P1, parent=P0, settings_digest="s",
                            samples=[f"{lease}.0#1"])

    events: list[ev.Event] = [
        ev.Opened(ts=0.0, run_id="t", incarnation=0, max_staleness=1, batch_groups=1,
                  group_size=1),
        ev.Started(ts=0.5, sample="l0.0#1", worker="w", epoch=0, version=P0),
        ev.Leased(ts=1.0, lease="l0", version=P1, groups=["g0"], wait_s=0.5),
        committed(2.0, "l0"),  # before any decision: no controller columns
        decided(3.0, 2, "producer", ready_samples=5, in_flight=7),
        ev.Discarded(ts=3.5, request="g9.0", reason="stale", sample="g9.0#1"),
        ev.Discarded(ts=3.6, request="g8.0", reason="fenced", sample="g8.0#1"),
        decided(4.0, 3, "trainer"),  # an older record without the inputs
        ev.WeightsLoaded(ts=4.5, worker="w", epoch=0, version=P1, transfer_s=0.25),
        ev.Started(ts=4.6, sample="l1.0#1", worker="w", epoch=0, version=P0),
        ev.Leased(ts=5.0, lease="l1", version=P1, groups=["g1"], wait_s=0.0),
        committed(6.0, "l1"),
    ]
    first, second = m.rows(events)
    assert "controller_decisions" not in first and first["lag_histogram/1"] == 1
    assert not any(k.startswith("discards/") for k in first)
    assert second["controller_decisions"] == 2 and second["controller_bottleneck"] == "trainer"
    assert second["workers"] == 3 and second["concurrency"] == 8
    assert second["admission_limit"] == 4
    assert second["buffer_depth"] is None and second["in_flight"] is None
    assert second["discards/stale"] == 1 and second["discards/fenced"] == 1
    assert second["lag_histogram/1"] == 2 and second["discards"] == 1  # fenced not counted
    assert second["weight_loads"] == 1 and second["weight_transfer_s_mean"] == 0.25
    t = m.tally(events[:5])
    assert (m.buffer_depth(t), m.in_flight_requests(t), m.active_workers(t)) == (5, 7, 2)
    assert m.controller_bottleneck(m.Tally()) is None and m.controller_decisions(m.Tally()) == 0
    assert second["blocked_ratio"] is None  # an older record without the inputs


def test_producer_backpressure_is_the_blocked_share_of_the_workers_time() -> None:
    live = ev.LiveSettings(admission_limit=4, concurrency=8, workers=2)

    def tallied(**inputs: object) -> m.Tally:
        return m.tally([ev.ControllerDecided(ts=1.0, mode="adaptive", previous=live,
                                             settings=live, bottleneck="conflict", reason="r",
                                             inputs=inputs, state={})])

    settings = {"admission_limit": 4, "concurrency": 8, "workers": 2}
    assert m.producer_blocked_ratio(tallied(blocked_s=3.0, window_s=5.0, settings=settings)) \
        == pytest.approx(0.3)  # 3 of 2 x 5 worker-seconds
    assert m.producer_blocked_ratio(tallied(blocked_s=30.0, window_s=5.0,
                                            settings=settings)) == 1.0  # capped
    assert m.producer_blocked_ratio(tallied(window_s=5.0, settings=settings)) is None
    assert m.producer_blocked_ratio(m.Tally()) is None


def _two_incarnations() -> list[ev.Event]:
    def opened(ts: float, inc: int) -> ev.Opened:
        return ev.Opened(ts=ts, run_id="t", incarnation=inc, max_staleness=1,
                         batch_groups=1, group_size=2)

    def committed(ts: float, lease: str, reward: float | None) -> ev.Committed:
        return ev.Committed(ts=ts, lease=lease, version=P1, parent=P0, settings_digest="s",
                            samples=[f"{lease}.0#1", f"{lease}.1#1"],
                            metrics={"reward_mean": reward, "loss": 0.5})

    return [
        # incarnation 0: the trainer first waits at 10 - 4 = 6; last commit at 20
        opened(0.0, 0),
        ev.Started(ts=1.0, sample="l0.0#1", worker="w", epoch=0, version=P0),
        ev.Started(ts=1.0, sample="l0.1#1", worker="w", epoch=0, version=P0),
        ev.Generated(ts=5.0, sample="a", tokens=1, gen_s=0.1),
        ev.Generated(ts=5.0, sample="b", tokens=1, gen_s=0.1),
        ev.Generated(ts=5.0, sample="c", tokens=1, gen_s=0.1),
        ev.Leased(ts=10.0, lease="l0", version=P0, groups=["g0"], wait_s=4.0),
        committed(12.0, "l0", 0.25),
        ev.Discarded(ts=13.0, request="g5.0", reason="stale", sample="g5.0#1"),
        ev.Started(ts=13.0, sample="l1.0#1", worker="w", epoch=0, version=P0),
        ev.Leased(ts=15.0, lease="l1", version=P1, groups=["g1"], wait_s=1.0),
        committed(20.0, "l1", None),  # a non-finite reward_mean is recorded as null
        # crash; 80 s of downtime are not trainer time
        opened(100.0, 1),
        ev.Discarded(ts=100.0, request="g6.0", reason="fenced", sample="g6.0#1"),
        ev.Discarded(ts=101.0, request="g7.0", reason="stale", sample="g7.0#1"),
        ev.Discarded(ts=101.0, request="g8.0", reason="reward_timeout", sample="g8.0#1"),
        ev.Generated(ts=101.0, sample="d", tokens=1, gen_s=0.1),
        ev.WeightsLoaded(ts=102.0, worker="w", epoch=1, version=P1, transfer_s=0.5),
        ev.WeightsLoaded(ts=102.0, worker="v", epoch=0, version=P1, transfer_s=1.5),
        ev.Leased(ts=105.0, lease="l2", version=P1, groups=["g2"], wait_s=3.0),
        committed(110.0, "l2", 0.75),
        ev.Discarded(ts=111.0, request="g9.0", reason="shutdown"),
        ev.Closed(ts=111.0),
    ]


def test_figures_across_two_incarnations() -> None:
    t = m.tally(_two_incarnations())
    # trainer wall: (20 - 6) + (110 - 102) = 22 s; waited 4 + 1 + 3 = 8 s
    assert m.wall_s(t) == 22.0
    assert m.trainer_wait_s(t) == 8.0
    assert m.trainer_idle_ratio(t) == pytest.approx(8.0 / 22.0)
    assert m.accepted_rollouts(t) == 6 and m.steps(t) == 3
    assert m.accepted_rollouts_per_s(t) == pytest.approx(6.0 / 22.0)
    assert m.generated_rollouts(t) == 4
    assert m.generated_rollouts_per_s(t) == pytest.approx(4.0 / 22.0)
    assert m.discards_by_reason(t) == {"fenced": 1, "reward_timeout": 1, "shutdown": 1,
                                       "stale": 2}
    # fenced (re-issued) and shutdown (the run ended) do not count; a new reason does
    assert m.counted_discards(t) == 3
    assert m.discard_rate(t) == pytest.approx(3 / (6 + 3))
    # lags: l0 consumed at step 0 what step 0 generated (0, 0); l1 at step 1 from step 0
    # (1; its second sample has no start: no lag); l2 samples have no start events
    assert m.lag_histogram(t) == {"0": 2, "1": 1}
    assert (m.lag_max(t), m.lag_mean(t), m.lag_p50(t)) == (1, pytest.approx(1 / 3), 0.0)
    assert m.lag_p99(t) == pytest.approx(0.98)
    assert m.weight_loads(t) == 2 and m.weight_transfer_s_mean(t) == 1.0
    assert m.reward_first(t) == 0.5 and m.reward_last(t) == 0.5  # mean of 0.25 and 0.75
    assert m.max_staleness(t) == 1 and m.mode(t) == "async"
    assert m.step_wait_s(t) == 3.0
    assert m.step_idle_ratio(t) == pytest.approx(3.0 / (110 - 102))


def test_figures_of_a_run_without_commits() -> None:
    t = m.tally(_two_incarnations()[:6])
    assert (m.accepted_rollouts(t), m.steps(t), m.wall_s(t), m.accepted_rollouts_per_s(t),
            m.trainer_idle_ratio(t), m.discard_rate(t)) == (0, 0, 0.0, 0.0, 0.0, 0.0)
    assert m.generated_rollouts(t) == 3
    assert (m.reward_first(t), m.reward_last(t), m.lag_p99(t)) == (None, None, 0.0)
    empty = m.tally([])
    assert m.steps(empty) == 0 and m.mode(empty) is None


def test_idle_ratio_is_capped_at_one() -> None:
    events: list[ev.Event] = [
        ev.Leased(ts=10.0, lease="l0", version=P0, groups=["g0"], wait_s=1.0),
        ev.LeaseReleased(ts=10.5, lease="l0", reason="trainer_error"),
        ev.Leased(ts=11.0, lease="l1", version=P0, groups=["g0"], wait_s=5.0),
        ev.Committed(ts=11.5, lease="l1", version=P1, parent=P0, settings_digest="s",
                     samples=["g0.0#1"]),
    ]
    t = m.tally(events)
    assert m.wall_s(t) == 2.5 and m.trainer_wait_s(t) == 6.0
    assert m.trainer_idle_ratio(t) == 1.0


def test_reward_window_is_the_first_and_last_three_steps() -> None:
    events = [ev.Committed(ts=float(i), lease=f"l{i}", version=P1, parent=P0,
                           settings_digest="s", samples=[], metrics={"reward_mean": float(i)})
              for i in range(10)]
    t = m.tally(events)
    assert m.reward_first(t) == 1.0 and m.reward_last(t) == 8.0



def test_weights_gather_is_the_mean_over_the_commits_that_gathered() -> None:
    """trainer.parallel: fsdp records each version's gather_s; none without shards."""
    def commit(i: int, metrics: dict[str, float]) -> ev.Committed:
        return ev.Committed(ts=float(i), lease=f"l{i}", version=P1, parent=P0,
                            settings_digest="s", samples=[], metrics=metrics)
    assert m.weights_gather_s_mean(m.tally([commit(0, {"reward_mean": 0.0})])) is None
    t = m.tally([commit(0, {"gather_s": 0.25}), commit(1, {"gather_s": 0.75}),
                 commit(2, {"gather_s": math.nan})])
    assert m.weights_gather_s_mean(t) == 0.5


# -- rows -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("metrics") / "run"
    simulate(run, KernelConfig(1, 2, 3), SimConfig(steps=6, seed=5, faults=True, sync="off"),
             VirtualClock()).ledger.close()
    return run


@pytest.fixture(scope="module")
def sim_events(sim_run: Path) -> list[ev.Event]:
    with Ledger(sim_run / LEDGER_FILE, readonly=True) as ledger:
        return [e for _, e in ledger.events()]


def test_row_k_depends_only_on_the_ledger_up_to_commit_k(sim_events: list[ev.Event]) -> None:
    full = m.rows(sim_events)
    assert [r["step"] for r in full] == list(range(1, 7))
    commits = [i for i, e in enumerate(sim_events) if isinstance(e, ev.Committed)]
    for k, i in enumerate(commits):
        assert m.rows(sim_events[: i + 1]) == full[: k + 1]
        assert full[k]["version"] == sim_events[i].version  # type: ignore[attr-defined]


def test_live_fold_in_chunks_equals_one_pass(sim_events: list[ev.Event]) -> None:
    t, got = m.Tally(), []
    for start in range(0, len(sim_events), 7):  # what the Recorder does after each commit
        got.extend(r for e in sim_events[start:start + 7] if (r := t.feed(e)) is not None)
    assert got == m.rows(sim_events)
    assert m.summary_figures(t) == m.summary_figures(m.tally(sim_events))


def test_last_row_and_summary_agree(sim_events: list[ev.Event]) -> None:
    """One definition per figure: the final row, summary.json and the final line match."""
    last, summary = m.rows(sim_events)[-1], summarize_events(sim_events)
    assert last["t"] == summary["wall_s"]
    assert last["accepted_total"] == summary["accepted_rollouts"]
    assert last["accepted_per_s"] == summary["accepted_rollouts_per_s"]
    assert last["trainer_idle_ratio"] == summary["trainer_idle_ratio"]
    # the simulator's run closes after its last commit: shutdown discards come later and
    # are not counted, so the rate is the same
    assert last["discard_rate"] == summary["discard_rate"]
    assert last["discards"] == summary["counted_discards"]


def test_non_finite_values_are_written_as_null() -> None:
    line = encode_row({"step": 1, "loss": math.nan, "kl": math.inf, "x": [-math.inf, 1.0],
                       "d": {"y": math.nan}})
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line) == {"step": 1, "loss": None, "kl": None, "x": [None, 1.0],
                                "d": {"y": None}}


def test_commit_records_non_finite_trainer_metrics_as_null(tmp_path: Path) -> None:
    from freshroll.kernel.buffer import SampleBuffer
    from freshroll.ledger.lineage import PolicyVersion

    buf = SampleBuffer.open(Ledger(tmp_path / "l.sqlite", sync="off"), KernelConfig(1, 1, 1),
                            VirtualClock(), run_id="r", initial_version=PolicyVersion.initial("m"))
    buf.admit("p")
    epoch = buf.register_worker("w")
    sid = buf.start(buf.take_requests(1)[0], "w", epoch, buf.version)  # type: ignore[arg-type]
    buf.complete(sid, tokens=1, gen_s=0.0)
    buf.reward(sid, 1.0, "r:x:00")
    lease = buf.lease()
    assert lease is not None
    buf.commit(lease.id, "s", metrics={"loss": math.nan, "reward_mean": 1.0, "kl": math.inf})
    commits = [e for _, e in buf.ledger.events() if isinstance(e, ev.Committed)]
    assert commits[0].metrics == {"loss": None, "reward_mean": 1.0, "kl": None}
    row = m.rows(e for _, e in buf.ledger.events())[0]
    assert row["loss"] is None and json.loads(encode_row(row))["reward_mean"] == 1.0
    buf.ledger.close()


# -- reconciliation ---------------------------------------------------------------------------
def test_reconcile_writes_missing_rows_and_trims_extra_ones(tmp_path: Path,
                                                            sim_events: list[ev.Event]) -> None:
    path = tmp_path / "metrics.jsonl"
    want = m.rows(sim_events)
    lines = [encode_row(r) for r in want]

    first = reconcile(path, want)  # no file yet
    assert first.written == 6 and not (tmp_path / "metrics.jsonl.prev").exists()
    assert read_rows(path) == ([json.loads(x) for x in lines], 0)
    assert not reconcile(path, want).changed  # already in agreement: untouched

    path.write_text("".join(lines[:4]) + lines[4][:9])  # a kill after commit 5 and 6
    lost = reconcile(path, want)
    assert (lost.written, lost.dropped, lost.bad_lines) == (2, 0, 1)
    assert path.read_text() == "".join(lines)

    path.write_text("".join(lines) * 2)  # an empty ledger resumed: rows 1..N again
    twice = reconcile(path, want)
    assert twice.dropped == 6 and "dropped" in twice.describe()
    assert path.read_text() == "".join(lines)
    assert (tmp_path / "metrics.jsonl.prev").read_text() == "".join(lines) * 2  # kept
    assert not list(tmp_path.glob("*.tmp"))


def test_recorder_writes_the_ledgers_rows_and_the_progress_line(tmp_path: Path) -> None:
    """The Recorder reconciles on start, then writes each commit's row from the ledger;
    the progress line's ``discards`` are the counted discards (not shutdown or fenced)."""
    from kernel_driver import Simulator, open_buffer

    from freshroll.config import validate
    from freshroll.runtime.recording import Recording as Recorder

    run = tmp_path / "run"
    sim = SimConfig(steps=3, seed=2, faults=True, sync="off")
    buf = open_buffer(run, KernelConfig(1, 2, 3), sim, VirtualClock())
    Simulator(buf, sim).run()  # three steps before the Recorder starts: a resume
    (run / "metrics.jsonl").write_text(encode_row({"step": 1, "stray": True}) * 2)
    cfg = validate({"run": {"steps": 6, "max_staleness": 1}})
    out = io.StringIO()
    rec = Recorder(run, cfg, buf, out)
    assert "rebuilt from the ledger" in out.getvalue()
    Simulator(buf, SimConfig(steps=6, seed=3, faults=True, sync="off")).run()
    rec.on_step(None)  # type: ignore[arg-type]  # the row comes from the ledger, not the report
    rec.close()
    events = [e for _, e in buf.ledger.events()]
    want = [json.loads(encode_row(r)) for r in m.rows(events)]
    assert read_rows(run / "metrics.jsonl") == (want, 0)
    assert len(want) == 6
    t = m.tally(events)
    last = out.getvalue().splitlines()[-1]
    assert f"discards {m.counted_discards(t)} " in last
    # the pace of the steps this process saw (4, 5, 6), and the time left: none at the end
    assert re.search(r"  [\d.]+ steps/s  ETA 0s(  |$)", last), last
    buf.ledger.close()


def test_a_heartbeat_joins_the_progress_line_on_a_terminal_else_is_a_line(tmp_path: Path):
    """``waiting 60 s on w0 generate, limit 600 s``: on a terminal, after the progress line
    drawn in place (the next step redraws it, clearing what was there); in a log, or with
    run.progress off, a line of its own."""
    from kernel_driver import Simulator, open_buffer

    from freshroll.config import validate
    from freshroll.runtime.recording import Recording as Recorder

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    run = tmp_path / "run"
    sim = SimConfig(steps=1, seed=2, faults=False, sync="off")
    buf = open_buffer(run, KernelConfig(1, 2, 3), sim, VirtualClock())
    cfg = validate({"run": {"steps": 6, "max_staleness": 1}})
    tty = Tty()
    rec = Recorder(run, cfg, buf, tty)
    Simulator(buf, sim).run()
    rec.on_step(None)  # type: ignore[arg-type]
    rec.on_wait("waiting 60 s on w0 generate, limit 600 s")
    drawn = tty.getvalue().split("\r")
    assert drawn[-1].startswith("step    1/6  ") and drawn[-2].startswith("step    1/6  ")
    assert drawn[-1].endswith("  waiting 60 s on w0 generate, limit 600 s\x1b[K")
    assert "\n" not in drawn[-1]
    rec.close()
    log = io.StringIO()
    Recorder(run, cfg.model_copy(update={"run": cfg.run.model_copy(update={"progress": False})}),
             buf, log).on_wait("waiting 31 s on trainer step 2, limit 600 s")
    assert log.getvalue().endswith("\nwaiting 31 s on trainer step 2, limit 600 s\n") or \
        log.getvalue() == "waiting 31 s on trainer step 2, limit 600 s\n"
    buf.ledger.close()


def _progress_row(step: int) -> dict[str, object]:
    """A metrics row with every field the progress line shows, three rewards included."""
    return {"step": step, "t": 12.5 * step, "reward_mean": 0.5123, "accepted_per_s": 1234.5,
            "lag_mean": 1.25, "lag_max": 3, "trainer_idle_ratio": 0.123, "discards": 1234,
            "discard_rate": 0.051, "frac_reward_zero_std": 0.25,
            "rewards/correctness/mean": 0.5, "rewards/format_reward/mean": 0.75,
            "rewards/length_penalty/mean": -0.125}


@pytest.mark.parametrize("columns", [40, 80, 110])
def test_the_progress_line_fits_the_terminal_and_is_whole_in_a_log(
    monkeypatch: pytest.MonkeyPatch, columns: int,
):
    """Issue 48, item 2: the line (about 230 characters) was redrawn in place whole, so each
    step left a wrapped half-line behind on a terminal of 110 columns. On a terminal every
    drawn line, heartbeat included, holds at most the width (its leading fields kept); in a
    log every field is written."""
    import os

    from freshroll.config import validate
    from freshroll.observe import fit as fit_mod
    from freshroll.runtime.recording import ProgressLine

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(fit_mod.shutil, "get_terminal_size",
                        lambda: os.terminal_size((columns, 24)))
    cfg = validate({"run": {"steps": 200, "max_staleness": 4}})
    tty, log = Tty(), io.StringIO()
    on_tty, in_log = ProgressLine(cfg, tty), ProgressLine(cfg, log)
    for step in (1, 2, 3):
        on_tty.on_row(_progress_row(step), live=True)
        on_tty.on_wait("waiting 60 s on w0 generate, limit 600 s")
        in_log.on_row(_progress_row(step * 5), live=True)
    drawn = [x.replace("\x1b[K", "") for x in re.split("[\r\n]", tty.getvalue())]
    assert max(len(x) for x in drawn) <= columns - 1, drawn
    assert all(x.startswith("step    ") for x in drawn if x)
    if columns >= 80:
        assert all("reward 0.512" in x and "accepted/s" in x for x in drawn
                   if x and "wait" not in x)
        assert any(x.endswith("waiting 60 s on w0 generate, limit 600 s") for x in drawn)
    [*_, last] = log.getvalue().splitlines()
    assert len(last) > 200 and "\r" not in log.getvalue()
    for field in ("reward 0.512", "idle 12.3%", "discards 1234 (5.1%)", "ETA",
                  "zero-std groups 25%", "length_penalty -0.125"):
        assert field in last


def test_final_line_prints_the_summary_figures(sim_events: list[ev.Event], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The final line of ``freshroll run`` reads summary.json's figures; a run whose steps
    recorded no reward (here: the simulator's) prints ``-`` instead of crashing."""
    from freshroll.cli import _print_result
    from freshroll.runtime.run import RunResult

    s = summarize_events(sim_events)
    assert s["reward_first"] is None
    _print_result(RunResult(tmp_path, s, True))
    out = capsys.readouterr().out
    t = m.tally(sim_events)
    assert "reward - -> -" in out
    assert f"discard rate {m.discard_rate(t):.1%}" in out
    assert f"trainer idle {m.trainer_idle_ratio(t):.1%}" in out


# -- per-reward figures (TRL's rewards/<name>/mean|std, frac_reward_zero_std) -----------------
def test_per_reward_figures_of_a_step_and_of_the_run() -> None:
    def scored(sample: str, total: float, f: float, g: float | None = None) -> ev.Rewarded:
        comps = {"f": f} if g is None else {"f": f, "g": g}
        return ev.Rewarded(ts=1.0, sample=sample, reward=total, reward_version="r",
                           components=comps, logged={"len": total * 10})

    def commit(samples: list[str]) -> ev.Committed:
        return ev.Committed(ts=2.0, lease="l", version=P1, parent=P0, settings_digest="s",
                            samples=samples)

    events: list[ev.Event] = [
        scored("a.0#1", 1.0, 1.0, 0.0), scored("a.1#1", 0.0, 0.0),  # g: one sample only
        scored("b.0#1", 0.5, 0.5), scored("b.1#1", 0.5, 0.5),  # a group of one reward: no signal
        scored("c.0#1", 9.0, 9.0),  # discarded: never counted
        ev.Discarded(ts=1.5, request="c.0", reason="stale", sample="c.0#1"),
    ]
    t = m.tally(events)
    r = t.feed(commit(["a.0#1", "a.1#1", "b.0#1", "b.1#1"]))
    assert r is not None
    assert r["rewards/f/mean"] == pytest.approx(0.5)
    assert r["rewards/f/std"] == pytest.approx(sample_std([1.0, 0.0, 0.5, 0.5]))
    assert r["rewards/g/mean"] == 0.0 and r["rewards/g/std"] == 0.0
    assert r["frac_reward_zero_std"] == 0.5  # group b: zero std; group a: not
    assert r["logged/len"] == pytest.approx(5.0)
    t.feed(ev.Committed(ts=3.0, lease="l2", version="p2-cc", parent=P1, settings_digest="s",
                        samples=[]))
    assert m.frac_reward_zero_std(t) == 0.5  # a batch with no scored sample adds no group
    assert "c.0#1" not in t._scored


def test_a_stretch_of_steps_without_learning_signal_is_counted() -> None:
    # a step is without signal when every one of its groups scored its members alike
    t, k = m.Tally(), 0

    def step(*groups: tuple[float, float]) -> dict[str, object]:
        nonlocal k
        k += 1
        names = []
        for g, (x, y) in enumerate(groups):
            for i, v in enumerate((x, y)):
                names.append(f"s{k}g{g}.{i}#1")
                t.feed(ev.Rewarded(ts=1.0, sample=names[-1], reward=v, reward_version="r",
                                   components={"f": v}, logged={}))
        r = t.feed(ev.Committed(ts=2.0 + k, lease=f"l{k}", version=f"p{k}-aa",
                                parent=f"p{k - 1}-aa", settings_digest="s", samples=names))
        assert r is not None
        return r

    assert step((0.0, 1.0), (0.0, 0.0))["no_signal_steps"] == 0  # one group taught something
    assert [step((0.0, 0.0), (1.0, 1.0))["no_signal_steps"] for _ in range(3)] == [1, 2, 3]
    assert m.no_signal_steps(t) == {"longest": 3, "from_step": 2, "now": 3}
    assert step((0.0, 1.0))["no_signal_steps"] == 0  # the signal back: the stretch ends
    step((0.0, 0.0))
    assert m.no_signal_steps(t) == {"longest": 3, "from_step": 2, "now": 1}
    r = t.feed(ev.Committed(ts=99.0, lease="lx", version="px-aa", parent="p6-aa",
                            settings_digest="s", samples=[]))
    assert r is not None and "no_signal_steps" not in r  # no scored group: no news
    assert m.no_signal_steps(t)["now"] == 1
    assert m.summary_figures(t)["no_signal_steps"] == m.no_signal_steps(t)


def test_sample_std_is_torch_std() -> None:
    torch = pytest.importorskip("torch")
    xs = [0.3, 1.7, -2.0, 0.3]
    assert sample_std(xs) == pytest.approx(torch.tensor(xs).std().item(), rel=1e-6)
    assert sample_std([4.0]) == 0.0


def test_off_policy_figures_stand_next_to_lag() -> None:
    t = m.Tally()
    for i, (kl, w, top) in enumerate(((0.02, 1.0, 1.5), (0.04, 1.2, 3.0), (None, None, 2.0))):
        metrics = {k: v for k, v in (("mismatch_kl", kl), ("is_weight_mean", w),
                                     ("is_weight_max", top)) if v is not None}
        t.feed(ev.Committed(ts=float(i), lease=f"l{i}", version=P1, parent=P0,
                            settings_digest="s", samples=[], metrics=metrics))
    assert m.mismatch_kl_mean(t) == pytest.approx(0.03)  # steps without one are left out
    assert m.is_weight_mean(t) == pytest.approx(1.1) and m.is_weight_max(t) == 3.0
    no_lags = dict.fromkeys(("0", "1", "2", "3+"))
    assert m.summary_figures(t)["off_policy"] == {
        "mismatch_kl_mean": pytest.approx(0.03), "is_weight_mean": pytest.approx(1.1),
        "is_weight_max": 3.0, "by_lag": no_lags}
    assert m.summary_figures(m.Tally())["off_policy"] == {
        **dict.fromkeys(("mismatch_kl_mean", "is_weight_mean", "is_weight_max")),
        "by_lag": no_lags}


def test_off_policy_by_lag_is_the_mean_over_each_buckets_tokens() -> None:
    t = m.Tally()
    steps = (  # per step: bucket -> (tokens, mismatch_kl, is_weight_mean, is_weight_max)
        {"0": (30.0, 0.001, 1.0, 1.1), "1": (10.0, 0.02, 1.1, 1.9)},
        {"1": (30.0, 0.06, 1.3, 2.5)},  # no lag-0 token in this step: bucket 0 absent
    )
    for i, buckets in enumerate(steps):
        metrics: dict[str, float | None] = {"mismatch_kl": 0.0}
        for b, values in buckets.items():
            for name, v in zip(("tokens", "mismatch_kl", "is_weight_mean", "is_weight_max"),
                               values, strict=True):
                metrics[f"{name}/lag_{b}"] = v
        row = t.feed(ev.Committed(ts=float(i), lease=f"l{i}", version=P1, parent=P0,
                                  settings_digest="s", samples=[], metrics=metrics))
        assert row is not None and row.get("mismatch_kl/lag_1") == buckets["1"][1]
    got = m.off_policy_by_lag(t)
    assert got["2"] is None and got["3+"] is None  # no tokens: None, not 0
    assert got["0"] == {"tokens": 30.0, "mismatch_kl_mean": pytest.approx(0.001),
                        "is_weight_mean": pytest.approx(1.0), "is_weight_max": 1.1}
    assert got["1"] == {"tokens": 40.0,  # token-weighted over both steps
                        "mismatch_kl_mean": pytest.approx((10 * 0.02 + 30 * 0.06) / 40),
                        "is_weight_mean": pytest.approx((10 * 1.1 + 30 * 1.3) / 40),
                        "is_weight_max": 2.5}
    assert m.summary_figures(t)["off_policy"]["by_lag"] == got

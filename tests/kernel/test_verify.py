"""``verify`` catches each kind of corruption, and only that kind, naming the culprit.

A healthy simulated run is copied and crafted, valid-looking but wrong events are
appended to the copy with the Ledger API (as a buggy component would write them).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from kernel_driver import REWARD, SETTINGS, SimConfig, simulate

from freshroll.cli import main
from freshroll.clock import VirtualClock
from freshroll.errors import LedgerError
from freshroll.harness.verify import INVARIANTS, Report, verify_ledger, verify_run
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import LEDGER_FILE, Ledger

ETA = 1


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("healthy") / "run"
    simulate(run, KernelConfig(ETA, 2, 3), SimConfig(steps=8, seed=36, faults=True, sync="off"),
             VirtualClock()).ledger.close()
    return run


@pytest.fixture
def run(healthy: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(healthy, dst)
    return dst


@dataclass
class State:
    """What a crafted event needs to know about the history it is appended to."""

    events: list[ev.Event]
    version: PolicyVersion
    p0: str
    last: ev.Committed
    incarnation: int
    next_group: int
    ts: float


def _state(run: Path) -> State:
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    commits = [e for e in events if isinstance(e, ev.Committed)]
    published = next(e for e in events if isinstance(e, ev.PolicyPublished))
    groups = [e for e in events if isinstance(e, ev.Requested)]
    return State(
        events, PolicyVersion.parse(commits[-1].version), published.version, commits[-1],
        max(e.incarnation for e in events if isinstance(e, ev.Opened)), len(groups),
        events[-1].ts + 1.0,
    )


def _append(run: Path, *events: ev.Event) -> None:
    with Ledger(run / LEDGER_FILE) as ledger:
        for e in events:
            ledger.append(e)


def _lifecycle(s: State, version: str, *, reward_version: str = REWARD) -> tuple[str, str,
                                                                               list[ev.Event]]:
    """A new one-member group on a new worker, generated with ``version``, made ready."""
    g = f"g{s.next_group}"
    sid = f"{g}.0#1"
    t = s.ts
    return g, sid, [
        ev.WorkerStarted(ts=t, worker="wx", epoch=0),
        ev.Requested(ts=t, group=g, prompt_id="crafted", size=1, version=str(s.version)),
        ev.Started(ts=t, sample=sid, worker="wx", epoch=0, version=version),
        ev.Generated(ts=t, sample=sid, tokens=3, gen_s=0.0),
        ev.Rewarded(ts=t, sample=sid, reward=0.5, reward_version=reward_version),
        ev.Ready(ts=t, group=g, samples=[sid]),
    ]


def _commit(s: State, lease: str, samples: list[str], *, version: str | None = None,
            settings: str = SETTINGS) -> ev.Committed:
    child = s.version.child(samples, settings)
    return ev.Committed(ts=s.ts, lease=lease, version=version or str(child),
                        parent=str(s.version), settings_digest=settings, samples=samples)


def _failing(report: Report) -> set[str]:
    return {name for name, bad in report.violations.items() if bad}


def _check(run: Path) -> Report:
    """Verify the ledger alone (counts.json would flag every crafted event as well)."""
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        return verify_ledger(ledger)


# -- healthy ------------------------------------------------------------------------------
def test_healthy_run_passes(healthy: Path) -> None:
    report = verify_run(healthy)
    assert report.ok, report.render()
    assert report.closed
    assert report.stats["steps"] == 8
    assert report.stats["open_requests"] == 0
    text = report.render()
    for name in INVARIANTS:
        assert f"ok   {name}" in text
    assert "closed" in text and "NOT closed" not in text
    assert report.to_json()["ok"] is True


def test_healthy_run_exercises_faults(healthy: Path) -> None:
    events = _state(healthy).events
    assert {ev.WorkerFenced, ev.Rejected, ev.LeaseReleased, ev.Discarded} <= set(map(type, events))
    reasons = {e.reason for e in events if isinstance(e, ev.Discarded)}
    assert {"stale", "fenced", "reward_error"} <= reasons


# -- one corruption at a time -------------------------------------------------------------
def corrupt_double_commit(run: Path, s: State) -> tuple[str, str]:
    """The last lease committed again: every sample of it a second time."""
    sample = s.last.samples[0]
    _append(run, _commit(s, s.last.lease, [sample]))
    return "duplicates", sample


def corrupt_generated_after_fence(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life[:3],
            ev.WorkerFenced(ts=s.ts, worker="wx", epoch=0, reason="lost"),
            ev.Generated(ts=s.ts, sample=sid, tokens=3, gen_s=0.0),  # applied: wrong
            ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid, reason="invalid"))
    return "fencing", sid


def corrupt_started_on_fenced_epoch(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, life[0], ev.WorkerFenced(ts=s.ts, worker="wx", epoch=0, reason="lost"),
            *life[1:3], ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid, reason="invalid"))
    return "fencing", sid


def corrupt_stale_commit(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, s.p0)  # generated by step 0, consumed at step 8
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=[g]),
            _commit(s, "lx", [sid]))
    return "freshness", sid


def corrupt_stale_discard_that_was_fresh(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))  # lag 0
    _append(run, *life, ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid, reason="stale"))
    return "freshness", sid


def corrupt_digest(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    bad = str(s.version.child([sid], "other-settings"))  # claims SETTINGS, trained on other
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=[g]),
            _commit(s, "lx", [sid], version=bad))
    return "lineage", bad


def corrupt_bad_reward_version(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version), reward_version="len-v2")
    _append(run, *life, ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid, reason="shutdown"))
    return "lineage", "len-v2"


def corrupt_closed_in_flight(run: Path, s: State) -> tuple[str, str]:
    g = f"g{s.next_group}"
    _append(run,
            ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1, max_staleness=ETA,
                      batch_groups=2, group_size=3),
            ev.Requested(ts=s.ts, group=g, prompt_id="late", size=2, version=str(s.version)),
            ev.Closed(ts=s.ts))
    return "conservation", f"{g}.1"


def corrupt_never_started(run: Path, s: State) -> tuple[str, str]:
    ghost = "g9999.0#1"
    _append(run, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=["g9999"]),
            _commit(s, "lx", [ghost]))
    return "unexpected", ghost


def corrupt_discard_after_commit(run: Path, s: State) -> tuple[str, str]:
    sample = s.last.samples[-1]
    request = sample.partition("#")[0]
    _append(run, ev.Discarded(ts=s.ts, request=request, sample=sample, reason="invalid"))
    return "conservation", request


def corrupt_retry_after_commit(run: Path, s: State) -> tuple[str, str]:
    sample = s.last.samples[0]
    request = sample.partition("#")[0]
    _append(run, ev.Discarded(ts=s.ts, request=request, sample=sample, reason="fenced"))
    return "conservation", request


def corrupt_commit_of_released_lease(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=[g]),
            ev.LeaseReleased(ts=s.ts, lease="lx", reason="trainer_error"),
            _commit(s, "lx", [sid]))
    return "unexpected", sid


def corrupt_release_of_unknown_lease(run: Path, s: State) -> tuple[str, str]:
    _append(run, ev.LeaseReleased(ts=s.ts, lease="l-nope", reason="trainer_error"))
    return "unexpected", "l-nope"


def corrupt_parent_not_current(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    old = PolicyVersion.parse(s.last.parent)  # branches off the previous version
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=[g]),
            ev.Committed(ts=s.ts, lease="lx", version=str(old.child([sid], SETTINGS)),
                         parent=str(old), settings_digest=SETTINGS, samples=[sid]))
    return "lineage", str(old)


def corrupt_never_closed(run: Path, s: State) -> tuple[str, str]:
    """A resume that crashed and was never resumed again: the ledger ends open."""
    _append(run, ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1,
                           max_staleness=ETA, batch_groups=2, group_size=3))
    return "conservation", f"incarnation {s.incarnation + 1}"


def corrupt_lease_at_old_version(run: Path, s: State) -> tuple[str, str]:
    """A lease that claims an older trainer version (lag measured against it looks fine)."""
    g, sid, life = _lifecycle(s, s.p0)
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=s.p0, groups=[g]),
            _commit(s, "lx", [sid]))
    return "freshness", "lx"


def corrupt_negative_lag(run: Path, s: State) -> tuple[str, str]:
    """Generated by the current version, consumed (says the lease) by step 0."""
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=s.p0, groups=[g]),
            _commit(s, "lx", [sid]))
    return "freshness", f"{sid} lag -"


def corrupt_second_reward(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life[:5], ev.Rewarded(ts=s.ts, sample=sid, reward=1.0, reward_version=REWARD),
            life[5], ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid, reason="shutdown"))
    return "duplicates", sid


def corrupt_request_never_admitted(run: Path, s: State) -> tuple[str, str]:
    ghost = "g9999.0#1"
    _append(run, ev.WorkerStarted(ts=s.ts, worker="wx", epoch=0),
            ev.Started(ts=s.ts, sample=ghost, worker="wx", epoch=0, version=str(s.version)),
            ev.Discarded(ts=s.ts, request="g9999.0", sample=ghost, reason="invalid"))
    return "unexpected", ghost


def corrupt_member_beyond_group_size(run: Path, s: State) -> tuple[str, str]:
    """A request id past its (admitted) group's size: g0 has 3 members, not 4."""
    _append(run, ev.Discarded(ts=s.ts, request="g0.3", reason="invalid"))
    return "unexpected", "g0.3"


def corrupt_started_on_unregistered_epoch(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life[1:3], ev.Discarded(ts=s.ts, request=f"{g}.0", sample=sid,
                                          reason="invalid"))
    return "fencing", sid


def corrupt_epoch_registered_before_fence(run: Path, s: State) -> tuple[str, str]:
    _append(run, ev.WorkerStarted(ts=s.ts, worker="wx", epoch=0),
            ev.WorkerStarted(ts=s.ts, worker="wx", epoch=1))
    return "fencing", "wx epoch 1 registered while epoch 0"


def corrupt_epoch_reused(run: Path, s: State) -> tuple[str, str]:
    _append(run, ev.WorkerStarted(ts=s.ts, worker="wx", epoch=3),
            ev.WorkerFenced(ts=s.ts, worker="wx", epoch=3, reason="lost"),
            ev.WorkerStarted(ts=s.ts, worker="wx", epoch=2))
    return "fencing", "wx epoch 2"


def corrupt_trainer_restart_of_a_lease_not_open(run: Path, s: State) -> tuple[str, str]:
    _append(run, ev.TrainerRestarted(ts=s.ts, lease="l-none", version=str(s.version),
                                     restart=1, reason="lost", rebuild_s=1.0))
    return "unexpected", "lease l-none"


def corrupt_trainer_rebuilt_at_an_old_version(run: Path, s: State) -> tuple[str, str]:
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, *life, ev.Leased(ts=s.ts, lease="lx", version=str(s.version), groups=[g]),
            ev.TrainerRestarted(ts=s.ts, lease="lx", version=s.last.parent, restart=1,
                                reason="timeout", rebuild_s=1.0),
            _commit(s, "lx", [sid]))
    return "lineage", "trainer rebuilt at"


CORRUPTIONS: list[Callable[[Path, State], tuple[str, str]]] = [
    corrupt_double_commit, corrupt_generated_after_fence, corrupt_started_on_fenced_epoch,
    corrupt_stale_commit, corrupt_stale_discard_that_was_fresh, corrupt_digest,
    corrupt_bad_reward_version, corrupt_closed_in_flight, corrupt_never_started,
    corrupt_discard_after_commit, corrupt_retry_after_commit, corrupt_commit_of_released_lease,
    corrupt_release_of_unknown_lease, corrupt_parent_not_current,
    corrupt_never_closed, corrupt_lease_at_old_version, corrupt_negative_lag,
    corrupt_second_reward, corrupt_request_never_admitted, corrupt_member_beyond_group_size,
    corrupt_started_on_unregistered_epoch, corrupt_epoch_registered_before_fence,
    corrupt_epoch_reused, corrupt_trainer_restart_of_a_lease_not_open,
    corrupt_trainer_rebuilt_at_an_old_version,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__[8:])
def test_each_corruption_fails_exactly_its_invariant(
    run: Path, corrupt: Callable[[Path, State], tuple[str, str]]
) -> None:
    assert _check(run).ok
    invariant, culprit = corrupt(run, _state(run))
    report = _check(run)
    assert _failing(report) == {invariant}, report.render()
    assert any(culprit in msg for msg in report.violations[invariant]), report.render()
    text = report.render()
    assert f"FAIL {invariant}: " in text and culprit in text


def test_generated_but_never_ended_is_lost(run: Path) -> None:
    s = _state(run)
    g, sid, life = _lifecycle(s, str(s.version))
    _append(run, ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1,
                           max_staleness=ETA, batch_groups=2, group_size=3),
            *life[:4], ev.Closed(ts=s.ts))
    report = _check(run)
    assert _failing(report) == {"conservation", "loss"}, report.render()
    assert any(sid in m for m in report.violations["loss"])
    assert any(f"{g}.0" in m for m in report.violations["conservation"])


def test_in_flight_work_is_fine_while_the_run_is_open_if_allowed(run: Path) -> None:
    """Without a final ``closed``, open requests are in progress, not lost: with
    ``allow_open`` that is fine; without, the open ledger itself is the failure."""
    s = _state(run)
    _, _, life = _lifecycle(s, str(s.version))
    _append(run, ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1,
                           max_staleness=ETA, batch_groups=2, group_size=3), *life[:4])
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        report = verify_ledger(ledger, allow_open=True)
    assert report.ok, report.render()
    assert not report.closed
    assert "NOT closed" in report.render()
    strict = _check(run)
    assert _failing(strict) == {"conservation"}
    assert "never closed" in strict.violations["conservation"][0]
    assert "--allow-open" in strict.violations["conservation"][0]


def test_counts_json_that_disagrees_fails_accounting(run: Path) -> None:
    counts = json.loads((run / "counts.json").read_text())
    assert verify_run(run).ok
    counts["committed"] += 1
    counts["discarded_stale"] = counts.get("discarded_stale", 0) + 2
    (run / "counts.json").write_text(json.dumps(counts))
    report = verify_run(run)
    assert _failing(report) == {"accounting"}
    text = " ".join(report.violations["accounting"])
    assert "committed: reported" in text and "discarded_stale: reported" in text
    assert len(report.violations["accounting"]) == 2


def test_counts_json_missing_is_not_checked(run: Path) -> None:
    os.remove(run / "counts.json")
    assert verify_run(run).ok


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"committed": "many"}', ""])
def test_garbage_counts_json_is_a_ledger_error(run: Path, content: str) -> None:
    (run / "counts.json").write_text(content)
    with pytest.raises(LedgerError) as info:
        verify_run(run)
    assert str(run / "counts.json") in str(info.value)


def test_report_render_limits_long_lists(run: Path) -> None:
    s = _state(run)
    _append(run, _commit(s, s.last.lease, list(s.last.samples)))
    report = _check(run)
    n = len(report.violations["duplicates"])
    assert n == len(s.last.samples) >= 3
    text = report.render(limit=2)
    assert f"... and {n - 2} more" in text
    as_json = report.to_json()
    assert as_json["ok"] is False
    assert set(as_json["violations"]) == {"duplicates"}  # type: ignore[arg-type]


# -- the CLI ------------------------------------------------------------------------------
def test_cli_verify_exit_codes(run: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    ok = cli.invoke(main, ["verify", str(run)])
    assert ok.exit_code == 0, ok.output
    assert "ok   duplicates" in ok.output

    as_json = cli.invoke(main, ["verify", "--json", str(run)])
    assert as_json.exit_code == 0
    assert json.loads(as_json.output)["ok"] is True

    corrupt_double_commit(run, _state(run))
    bad = cli.invoke(main, ["verify", str(run)])
    assert bad.exit_code == 1, bad.output
    assert "FAIL duplicates" in bad.output
    bad_json = cli.invoke(main, ["verify", "--json", str(run)])
    assert bad_json.exit_code == 1
    assert "duplicates" in json.loads(bad_json.output)["violations"]


@pytest.mark.parametrize("case", ["missing_dir", "empty_dir", "garbage", "garbage_counts"])
def test_cli_verify_exit_2_on_unreadable_input(case: str, run: Path, tmp_path: Path) -> None:
    target = tmp_path / "bad"
    if case == "missing_dir":
        culprit = target / LEDGER_FILE
    elif case == "empty_dir":
        target.mkdir()
        culprit = target / LEDGER_FILE
    elif case == "garbage":
        target.mkdir()
        culprit = target / LEDGER_FILE
        culprit.write_bytes(os.urandom(3000))
    else:
        target = run
        culprit = run / "counts.json"
        culprit.write_text("{oops")
    result = CliRunner().invoke(main, ["verify", str(target)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "error:" in result.stderr
    assert str(culprit) in result.stderr
    assert "Traceback" not in result.output


def test_cli_verify_reads_an_empty_ledger_file_as_a_run_that_never_closed(tmp_path: Path):
    """An empty file is what a kill inside an older freshroll's ledger creation left (issue
    23, defect 1): a ledger with no events, never closed; not an unreadable file."""
    (tmp_path / LEDGER_FILE).write_bytes(b"")
    result = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "0 events" in result.output and "never closed" in result.output
    allowed = CliRunner().invoke(main, ["verify", "--allow-open", str(tmp_path)])
    assert allowed.exit_code == 0, allowed.output


def test_result_applied_after_its_attempt_was_discarded_is_unexpected(tmp_path):
    """A `generated` for an attempt already discarded (not fenced) must be flagged."""
    from freshroll.harness.verify import verify_ledger
    from freshroll.ledger import events as ev
    from freshroll.ledger.lineage import PolicyVersion
    from freshroll.ledger.store import Ledger

    v = str(PolicyVersion.initial("m"))
    with Ledger(tmp_path / "l.sqlite", sync="off") as led:
        for e in (
            ev.Opened(ts=0, run_id="r", incarnation=0, max_staleness=1, batch_groups=1,
                      group_size=1),
            ev.PolicyPublished(ts=0, version=v),
            ev.Requested(ts=0, group="g0", prompt_id="p", size=1, version=v),
            ev.WorkerStarted(ts=0, worker="w0", epoch=0),
            ev.Started(ts=0, sample="g0.0#1", worker="w0", epoch=0, version=v),
            ev.Discarded(ts=0, request="g0.0", sample="g0.0#1", reason="invalid"),
            ev.Generated(ts=0, sample="g0.0#1", tokens=1, gen_s=0.0),
        ):
            led.append(e)
        led.flush()
        report = verify_ledger(led)
    assert report.violations["unexpected"]
    assert "g0.0#1" in report.violations["unexpected"][0]


# -- the run directory's reported figures against the ledger ---------------------------------
@pytest.fixture
def reported(run: Path) -> Path:
    """The healthy run with summary.json and metrics.jsonl written as a real run writes them."""
    from freshroll.figures.metrics import rows
    from freshroll.figures.metrics_log import reconcile
    from freshroll.runtime.endfiles import write_summary

    write_summary(run)
    reconcile(run / "metrics.jsonl", rows(_state(run).events))
    return run


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _edit_summary(run: Path, key: str, value: object) -> None:
    data = json.loads((run / "summary.json").read_text())
    node = data
    *path, last = key.split(".")
    for k in path:
        node = node[k]
    node[last] = value
    (run / "summary.json").write_text(json.dumps(data))


def _edit_row(run: Path, index: int, key: str, value: object) -> None:
    lines = _lines(run / "metrics.jsonl")
    row = json.loads(lines[index])
    row[key] = value
    lines[index] = json.dumps(row) + "\n"
    (run / "metrics.jsonl").write_text("".join(lines))


FILE_TAMPERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "summary_rate": (lambda r: _edit_summary(r, "accepted_rollouts_per_s", 1e9),
                     "summary.json accepted_rollouts_per_s"),
    "summary_lag": (lambda r: _edit_summary(r, "lag.p99", 0.25), "summary.json lag.p99"),
    "summary_discards": (lambda r: _edit_summary(r, "discards.stale", 0),
                         "summary.json discards.stale"),
    "summary_invented_reason": (lambda r: _edit_summary(r, "discards.invalid", 3),
                                "summary.json discards.invalid"),
    "summary_missing_figure": (lambda r: _edit_summary(r, "discard_rate", None),
                               "summary.json discard_rate"),
    "row_value": (lambda r: _edit_row(r, 2, "trainer_idle_ratio", 0.5),
                  "row 3 (step 3): trainer_idle_ratio"),
    "row_lost": (lambda r: (r / "metrics.jsonl").write_text("".join(
        _lines(r / "metrics.jsonl")[:-1])), "no row for committed step 8"),
    "rows_twice": (lambda r: (r / "metrics.jsonl").write_text(
        "".join(_lines(r / "metrics.jsonl")) * 2), "row 9 (step 1): the ledger holds no"),
    "row_torn": (lambda r: (r / "metrics.jsonl").write_text(
        "".join(_lines(r / "metrics.jsonl")) + '{"step": 9, "t"'), "1 unparsable line"),
    "row_nan": (lambda r: (r / "metrics.jsonl").write_text(
        "".join(_lines(r / "metrics.jsonl")).replace('"discard_rate": ', '"discard_rate": NaN, '
                                                     '"x": ', 1)), "unparsable"),
}


def test_reported_files_that_match_the_ledger_pass(reported: Path) -> None:
    report = verify_run(reported)
    assert report.ok, report.render()
    assert len(_lines(reported / "metrics.jsonl")) == 8


@pytest.mark.parametrize("tamper", sorted(FILE_TAMPERS))
def test_reported_figures_that_disagree_fail_accounting(reported: Path, tamper: str) -> None:
    change, culprit = FILE_TAMPERS[tamper]
    change(reported)
    report = verify_run(reported)
    assert _failing(report) == {"accounting"}, report.render()
    assert any(culprit in m for m in report.violations["accounting"]), report.render()


def test_open_ledger_skips_end_of_run_files_and_tolerates_one_missing_row(
    reported: Path,
) -> None:
    """A killed run: counts.json/summary.json are from an earlier close; the last commit's
    row may not have been written. Anything else wrong in metrics.jsonl still fails."""
    s = _state(reported)
    _append(reported, ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1,
                                max_staleness=ETA, batch_groups=2, group_size=3))
    _edit_summary(reported, "steps", 99)
    lines = _lines(reported / "metrics.jsonl")
    (reported / "metrics.jsonl").write_text("".join(lines[:-1]))
    report = verify_run(reported, allow_open=True)
    assert report.ok, report.render()
    assert any("summary.json not checked" in n or "summary.json" in n for n in report.notes)
    (reported / "metrics.jsonl").write_text("".join(lines[:-2]))
    report = verify_run(reported, allow_open=True)
    assert _failing(report) == {"accounting"}
    assert any("step 7" in m for m in report.violations["accounting"])


def test_cli_verify_allow_open(run: Path) -> None:
    s = _state(run)
    _append(run, ev.Opened(ts=s.ts, run_id="run", incarnation=s.incarnation + 1,
                           max_staleness=ETA, batch_groups=2, group_size=3))
    cli = CliRunner()
    strict = cli.invoke(main, ["verify", str(run)])
    assert strict.exit_code == 1, strict.output
    assert "never closed" in strict.output and "--allow-open" in strict.output
    allowed = cli.invoke(main, ["verify", "--allow-open", str(run)])
    assert allowed.exit_code == 0, allowed.output
    assert "NOT closed" in allowed.output and "counts.json not checked" in allowed.output


def test_a_call_member_that_disagrees_with_its_call_fails_lineage(run: Path) -> None:
    """``started.call``: members share the first's worker epoch, version and seed (replay)."""
    s = _state(run)
    g, v = f"g{s.next_group}", str(s.version)
    first, second, third = f"{g}.0#1", f"{g}.1#1", f"{g}.2#1"

    def started(sid: str, call: str, seed: int) -> ev.Started:
        return ev.Started(ts=s.ts, sample=sid, worker="wx", epoch=0, version=v, call=call,
                          seed=seed)

    _append(run, ev.WorkerStarted(ts=s.ts, worker="wx", epoch=0),
            ev.Requested(ts=s.ts, group=g, prompt_id="crafted", size=3, version=v),
            started(first, first, 5), started(second, first, 5), started(third, first, 6),
            *[ev.Discarded(ts=s.ts, request=sid[:-2], sample=sid, reason="invalid")
              for sid in (first, second, third)])
    report = _check(run)
    assert _failing(report) == {"lineage"}, report.render()
    assert len(report.violations["lineage"]) == 1 and third in report.violations["lineage"][0]

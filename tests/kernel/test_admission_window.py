"""run.admission_window: an admission window wider than (η + 1) × B at the same η (issue 26).

The formula (pure), the kernel's capacity under it (and under the sync fallback's look-ahead),
the config's checks, the window recorded in the ledger and re-checked by ``verify``, the
window bound of the figures, and a simulated run with a wider window that passes ``verify``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freshroll.chaos import checks
from freshroll.clock import VirtualClock
from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.figures.window import WindowFold
from freshroll.harness.verify import verify_events, verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.freshness import admission_capacity, window_note, window_steps
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import Ledger
from freshroll.runtime import run as run_mod

V0 = PolicyVersion.initial("unit-model")


# -- the formula ---------------------------------------------------------------------------
def test_window_steps_defaults_to_the_freshness_window_and_refuses_a_narrower_one() -> None:
    assert window_steps(0) == 1 and window_steps(2) == 3
    assert window_steps(2, None) == 3 and window_steps(2, 3) == 3 and window_steps(2, 7) == 7
    with pytest.raises(ValueError, match="under max_staleness"):
        window_steps(2, 2)


@pytest.mark.parametrize(
    ("eta", "w", "v", "b", "accepted", "running", "expected"),
    [
        (1, None, 0, 4, 0, 0, 8),    # (η + 1) × B: today's window
        (1, 2, 0, 4, 0, 0, 8),       # W = η + 1 written out: the same
        (1, 4, 0, 4, 0, 0, 16),      # W × B
        (1, 4, 3, 4, 12, 5, 11),     # (4 + 3) × 4 - (12 + 5)
        (0, 3, 0, 2, 2, 4, 0),       # full
    ],
)
def test_formula_hand_computed(eta, w, v, b, accepted, running, expected) -> None:
    assert admission_capacity(max_staleness=eta, version=v, batch_groups=b, accepted=accepted,
                              running=running, admission_window=w) == expected


@given(
    eta=st.integers(0, 8), wider=st.integers(0, 8), v=st.integers(0, 1000),
    b=st.integers(1, 64), accepted=st.integers(0, 10**5), running=st.integers(0, 10**4),
    free=st.none() | st.integers(-10, 10**4),
)
def test_formula_properties(eta, wider, v, b, accepted, running, free) -> None:
    w = eta + 1 + wider

    def cap(**kw: int | None) -> int:
        args = dict(max_staleness=eta, version=v, batch_groups=b, accepted=accepted,
                    running=running, free_slots=free, admission_window=w) | kw
        return admission_capacity(**args)  # type: ignore[arg-type]  # the keywords above

    got = cap()
    window = (w + v) * b - (accepted + running)
    assert got == max(0, window if free is None else min(window, free))
    # admitting everything it allows never overfills the window in force
    assert accepted + running + got <= max((w + v) * b, accepted + running)
    # the default window is today's (η + 1) and a wider one never admits less
    assert cap(admission_window=None) == cap(admission_window=eta + 1)
    assert got >= cap(admission_window=None)
    assert cap(admission_window=w + 1) >= got
    # more in flight never admits more; a newer version never less
    assert cap(accepted=accepted + 1) <= got and cap(running=running + 1) <= got
    assert cap(version=v + 1) >= got


@pytest.mark.parametrize(
    ("eta", "w", "basis", "continues", "says"),
    [
        (2, None, "oldest_token", False, False),  # the default window: nothing to say
        (2, 3, "oldest_token", False, False),     # written out, still the default
        (2, 5, "oldest_token", True, True),       # oldest token: lag fixed at the start
        (2, 5, "newest_token", False, True),      # no in-flight update: tokens of the start
        (2, 5, "newest_token", True, False),      # the case it is for
    ],
)
def test_window_note(eta, w, basis, continues, says) -> None:
    note = window_note(max_staleness=eta, admission_window=w, basis=basis, continues=continues)
    assert bool(note) is says
    if says:
        assert "stale" in note and f"wider than max_staleness + 1 = {eta + 1}" in note


# -- the config ----------------------------------------------------------------------------
def test_config_takes_auto_or_a_window_of_at_least_eta_plus_one() -> None:
    assert load_config(None, []).run.admission_window == "auto"
    assert load_config(None, []).run.window_steps is None
    cfg = load_config(None, ["run.max_staleness=2", "run.admission_window=5"])
    assert cfg.run.window_steps == 5


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["run.admission_window=0"], "run.admission_window"),
        (["run.admission_window=wide"], "run.admission_window"),
        (["run.admission_window=1.5"], "run.admission_window"),
        (["run.max_staleness=2", "run.admission_window=2"], "admission_window 2 is under "
         "max_staleness + 1 = 3"),
        (["run.admission_windows=3"], "run.admission_windows: unknown key"),
    ],
)
def test_config_refuses_bad_values_by_name(overrides: list[str], names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace("+", r"\+")):
        load_config(None, overrides)


def test_kernel_config_refuses_a_window_under_eta_plus_one() -> None:
    with pytest.raises(ConfigError, match="admission_window"):
        KernelConfig(max_staleness=2, batch_groups=1, group_size=2, admission_window=2)
    KernelConfig(max_staleness=2, batch_groups=1, group_size=2, admission_window=3)


# -- the kernel ----------------------------------------------------------------------------
def new_buffer(path: Path, window: int | None, eta: int = 1) -> SampleBuffer:
    cfg = KernelConfig(max_staleness=eta, batch_groups=2, group_size=2, admission_window=window)
    return SampleBuffer.open(Ledger(path, sync="off"), cfg, VirtualClock(), run_id="unit",
                             initial_version=V0)


@pytest.mark.parametrize(("window", "recorded", "capacity"),
                         [(None, None, 4), (2, None, 4), (3, 3, 6), (5, 5, 10)])
def test_the_kernel_admits_the_window_and_records_it(tmp_path: Path, window: int | None,
                                                     recorded: int | None,
                                                     capacity: int) -> None:
    buf = new_buffer(tmp_path / "l.sqlite", window)
    assert buf.capacity() == capacity
    for k in range(capacity):
        buf.admit(f"p{k}")
    assert buf.capacity() == 0
    buf.ledger.flush()
    opened = [e for _, e in buf.ledger.events() if isinstance(e, ev.Opened)]
    assert [e.admission_window for e in opened] == [recorded]
    buf.shutdown()


def test_the_sync_fallback_admits_one_batch_under_a_wide_window(tmp_path: Path) -> None:
    buf = new_buffer(tmp_path / "l.sqlite", 5)
    buf.lookahead = 0
    assert buf.capacity() == 2  # (0 + 0 + 1) × B
    buf.lookahead = 1
    assert buf.capacity() == 10
    buf.shutdown()


# -- verify and the figures on a hand-built ledger ------------------------------------------
def opened(window: int | None, eta: int = 1) -> ev.Opened:
    return ev.Opened(ts=0.0, run_id="r", incarnation=0, max_staleness=eta, batch_groups=1,
                     group_size=2, admission_window=window)


def req(k: int) -> ev.Requested:
    return ev.Requested(ts=float(k), group=f"g{k}", prompt_id="p", size=2, version=str(V0))


def admissions(window: int | None, n: int) -> list[ev.Event]:
    return [opened(window), ev.PolicyPublished(ts=0.0, version=str(V0)),
            *(req(k) for k in range(n))]


def freshness(events: list[ev.Event]) -> list[str]:
    report, _ = verify_events(enumerate(events, 1), allow_open=True)
    return list(report.violations.get("freshness", []))


def test_verify_fails_an_admission_past_the_recorded_window() -> None:
    assert freshness(admissions(None, 2)) == []  # (1 + 1) × 1
    (bad,) = freshness(admissions(None, 3))
    assert "g2 admitted at version 0" in bad and "window 2 = (2 + 0) x 1" in bad
    assert freshness(admissions(4, 4)) == []  # the wider window recorded: 4 groups
    (bad,) = freshness(admissions(4, 5))
    assert "window 4 = (4 + 0) x 1" in bad and "admission window 4 steps" in bad
    # chaos's admission_bound reads the same window
    assert checks.admission_bound(admissions(4, 4)) == []
    assert len(checks.admission_bound(admissions(4, 5))) == 1


def test_the_window_bound_uses_the_window_in_force() -> None:
    for window, groups in ((None, 2), (4, 4)):
        fold = WindowFold()
        for e in admissions(window, 1):
            fold.feed(e)
        result = fold.result()
        assert result is not None and result["window_groups"] == groups


# -- a simulated run -----------------------------------------------------------------------
SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
       "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
       "rollout.workers=2", "rollout.worker_batch=8", "run.max_staleness=1",
       "run.admission_window=4", "run.steps=6"]


@pytest.mark.parametrize(("extra", "noted"), [
    (["rollout.on_update=continue", "run.staleness_basis=newest_token"], False),
    ([], True),
])
def test_a_simulated_run_with_a_wider_window_passes_verify(tmp_path: Path, extra: list[str],
                                                           noted: bool) -> None:
    out, stream = tmp_path / "run", io.StringIO()
    run_mod.run(load_config(None, [*SIM, *extra]), out, stream=stream)
    report = verify_run(out)
    assert report.ok, report.violations
    assert ("admission window 4 steps is wider" in stream.getvalue()) is noted
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    assert [e.admission_window for e in events if isinstance(e, ev.Opened)] == [4]
    # the window was used: more than (η + 1) × B = 4 groups admitted before the first commit
    first_commit = next(i for i, e in enumerate(events) if isinstance(e, ev.Committed))
    assert sum(isinstance(e, ev.Requested) for e in events[:first_commit]) > 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["window_bound"]["window_groups"] == 8  # 4 steps × B 2


def test_a_resume_may_widen_and_narrow_the_window_and_verify_checks_each(tmp_path: Path
                                                                        ) -> None:
    out, base = tmp_path / "run", [o for o in SIM if not o.startswith(("run.admission_window",
                                                                         "run.steps"))]
    for window, steps in (("auto", 3), ("4", 6), ("2", 9)):
        run_mod.run(load_config(None, [*base, f"run.admission_window={window}",
                                       f"run.steps={steps}"]),
                    out, resume=steps > 3, stream=io.StringIO())
        report = verify_run(out)
        assert report.ok, report.violations
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        opened = [e for _, e in ledger.events() if isinstance(e, ev.Opened)]
    assert [e.admission_window for e in opened] == [None, 4, None]  # 2 = η + 1: the default

"""monitor.log_completions (freshroll.observe.completions): a due step prints the completions
it trained on, with the rewards and lags the ledger recorded for them; other steps, rows a
stopped run catches up on and a step whose commit is not the last read print nothing."""

from __future__ import annotations

import io
from pathlib import Path

from freshroll.engines import payload as pl
from freshroll.engines.base import Completion
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger
from freshroll.observe.completions import CompletionsLog

SAMPLES = ["g1-r0-a0", "g1-r1-a0", "g2-r0-a0", "g2-r1-a0"]


def _step(led: Ledger, step: int, started_at: int, base: float) -> None:
    """One committed step of four samples; the i-th completion is ``out{i}`` with reward
    ``base + i / 4``, started on policy step ``started_at``."""
    sids = [f"s{step}-{sid}" for sid in SAMPLES]
    for i, sid in enumerate(sids):
        led.append(ev.Started(ts=0.0, sample=sid, worker="w0", epoch=0,
                              version=f"p{started_at}-aa"))
        led.put_payload(sid, pl.encode(Completion((5, 6), (7,), (-0.1,), f"out{i}", "stop",
                                                  0.01)))
        led.append(ev.Rewarded(ts=0.0, sample=sid, reward=base + i / 4, reward_version="r1"))
    led.append(ev.Committed(ts=0.0, lease=f"l{step}", version=f"p{step}-bb",
                            parent=f"p{step - 1}-bb", settings_digest="s", samples=sids))
    led.flush()


def test_a_due_step_prints_what_it_trained_on(tmp_path: Path) -> None:
    out = io.StringIO()
    with Ledger(tmp_path / "l.sqlite") as led:
        log = CompletionsLog(led, every=2, count=2, stream=out,
                             decode=lambda: lambda ids: "".join(map(str, ids)))
        _step(led, 1, 0, 0.0)
        log.on_row({"step": 1}, live=True)  # not due
        assert out.getvalue() == ""
        _step(led, 2, 0, 0.5)  # generated two versions back: lag 1
        log.on_row({"step": 2}, live=False)  # a stopped run's catch-up: quiet
        assert out.getvalue() == ""
        log.on_row({"step": 2}, live=True)
    lines = out.getvalue().splitlines()
    assert lines == [
        "completions of step 2 (2 of 4: reward, lag, prompt -> completion)",
        "   0.500  lag 1  '56' -> 'out0'",
        "   1.000  lag 1  '56' -> 'out2'",
    ]


def test_a_row_whose_commit_is_not_the_last_read_prints_nothing(tmp_path: Path) -> None:
    """Rows caught up after several commits: the table is only ever of the commit read."""
    out = io.StringIO()
    with Ledger(tmp_path / "l.sqlite") as led:
        log = CompletionsLog(led, every=1, count=4, stream=out, decode=lambda: None)
        _step(led, 1, 0, 0.0)
        _step(led, 2, 1, 0.0)
        log.on_row({"step": 1}, live=True)  # the last commit read is step 2's
        assert out.getvalue() == ""
        log.on_row({"step": 2}, live=True)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("completions of step 2 (4 of 4")
    assert lines[1] == "   0.000  lag 0  [5, 6] -> 'out0'"  # no tokenizer: the prompt's ids

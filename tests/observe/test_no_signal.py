"""The no-learning-signal warning: once per stretch, live rows only, and the signal's return."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from freshroll.observe.no_signal import NoSignal


def _row(step: int, streak: int | None, reward: float = 0.0) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step, "reward_mean": reward}
    if streak is not None:
        row["no_signal_steps"] = streak
    return row


def test_one_warning_per_stretch_and_a_line_when_the_signal_is_back():
    out = io.StringIO()
    w = NoSignal(3, out)
    streaks = [0, 1, 2, 3, 4, 5, None, 6, 0, 1, 2, 3]
    for step, streak in enumerate(streaks, start=1):
        w.on_row(_row(step, streak), live=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("warning: no learning signal for 3 steps (steps 2-4)")
    assert "(reward 0.000)" in lines[0] and "monitor.no_signal_steps" in lines[0]
    assert lines[1] == "learning signal back at step 9"
    assert lines[2].startswith("warning: no learning signal for 3 steps (steps 10-12)")


def test_rows_caught_up_on_resume_are_counted_not_said():
    out = io.StringIO()
    w = NoSignal(2, out)
    for step, streak in enumerate([1, 2, 3], start=1):  # a resumed run's catch-up
        w.on_row(_row(step, streak), live=False)
    w.on_row(_row(4, 4), live=True)  # the same stretch goes on: said before the stop
    assert out.getvalue() == ""
    w.on_row(_row(5, 0), live=True)
    assert out.getvalue() == "learning signal back at step 5\n"


def test_a_run_says_it_on_stderr(tmp_path: Path):
    """The real path: a run whose reward never differs within a group (a constant reward)
    warns once its stretch reaches monitor.no_signal_steps, and its summary counts it."""
    from freshroll.config import load_config
    from freshroll.runtime.run import run

    (tmp_path / "flat.py").write_text(
        "def flat(completions, **kw):\n    return [0.0 for _ in completions]\n")
    cfg = load_config(None, [
        "run.progress=false", "task.n_prompts=32", "rollout.group_size=4",
        "rollout.batch_groups=2", "run.steps=4", "run.max_staleness=0", "run.runtime=inline",
        "run.torch_threads=1", f"rewards.0.fn={tmp_path}/flat.py:flat",
        "monitor.no_signal_steps=3"])
    err = io.StringIO()
    result = run(cfg, tmp_path / "run", stream=err, report=False)
    assert result.ok
    said = [ln for ln in err.getvalue().splitlines() if ln.startswith("warning: no learning")]
    assert len(said) == 1 and "for 3 steps (steps 1-3)" in said[0], err.getvalue()
    assert result.summary["no_signal_steps"] == {"longest": 4, "from_step": 1, "now": 4}

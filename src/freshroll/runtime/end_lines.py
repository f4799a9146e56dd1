"""The lines a finished run ends with, the same from the command line and from Python.

:func:`end_lines` renders them from a :class:`~freshroll.runtime.run.RunResult` (its
``summary``, i.e. summary.json's figures, and whether verify passed): the notes (the verdict,
a recovery, a resumed run's segments, reward versions, sample bias, the freshness window's
bound, learning, the evaluation, fixed costs), each present only when it has something to say,
then the closing lines (run directory; steps, rates, reward, lag, idle, discards; ``verify:``
and ``report:``). ``freshroll run`` prints the notes on stderr and the closing lines on stdout;
``GRPOTrainer.train()`` prints both on its ``stream``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from freshroll.runtime.run import RunResult


@dataclass(frozen=True)
class EndLines:
    notes: list[str]  # each a line or a few, none empty
    closing: str  # run dir, the figures line, verify and report

    def write(self, notes: TextIO, closing: TextIO | None = None) -> None:
        """The notes on ``notes``, the closing lines on ``closing`` (default: ``notes``)."""
        for note in self.notes:
            print(note, file=notes, flush=True)
        print(self.closing, file=closing if closing is not None else notes, flush=True)


def end_lines(result: RunResult) -> EndLines:
    from freshroll.figures.bias import render as render_bias
    from freshroll.figures.evals import render_eval
    from freshroll.figures.learning import render_learning
    from freshroll.figures.segments import render_segments
    from freshroll.figures.summary import render_reward_versions
    from freshroll.figures.verdict import recovery_line, render
    from freshroll.figures.window import render_window
    from freshroll.runtime.endfiles import render_fixed_costs

    s = result.summary
    notes = [
        render(s["verdict"]) if "verdict" in s else "",
        recovery_line(s),
        render_segments(s.get("segments") or []),  # a resumed run, segment by segment
        render_reward_versions(s.get("reward_versions")),
        render_bias(s.get("sample_bias")),
        # the freshness window limits the trainer (an async run's line only)
        render_window(s.get("window_bound"), s.get("max_staleness")),
        render_learning(s.get("learning")),  # a collapse, or asynchrony's cost
        render_eval(s.get("eval")),  # the held-out reward, and what it scored
        render_fixed_costs(s),
    ]
    closing = (
        f"run dir {result.run_dir}\n"
        f"steps {s['steps']}  accepted rollouts/s {s['accepted_rollouts_per_s']:.1f}  "
        f"reward {_num(s['reward_first'], '.3f')} -> {_num(s['reward_last'], '.3f')}  "
        f"lag p50/p99/max {s['lag']['p50']:.0f}/{s['lag']['p99']:.0f}/{s['lag']['max']}  "
        f"trainer idle {s['trainer_idle_ratio']:.1%}  discard rate {s['discard_rate']:.1%}\n"
        f"verify: {'ok' if result.ok else 'FAILED'}  report: {result.run_dir / 'report.html'}"
    )
    return EndLines([n for n in notes if n], closing)


def _num(value: object, spec: str) -> str:
    """A summary figure for the closing line; ``null`` (none recorded) as ``-``."""
    return format(value, spec) if isinstance(value, int | float) else "-"

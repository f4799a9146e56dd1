"""Time to reward: did the faster run also learn as fast, in wall-clock seconds?

Throughput is never convergence. A run with a baseline (``freshroll run --baseline``,
``freshroll report --baseline``, ``freshroll validate``'s async and sync seeds) compares the
two runs' rewards against the seconds and the steps each needed::

    curve(rows)         (step, t, reward) of each metrics.jsonl row with a reward_mean:
                        t is the row's measured wall (docs/metrics.md wall_s: the trainer's
                        wall, model loading and end files excluded)
    smoothed            the trailing mean of the last w rewards, w = min(10, max(1, n // 10))
                        (n: the shorter run's steps; the same w for both runs)
    levels              lo + f * (hi - lo) for f in FRACTIONS (25/50/75 %), where hi is the
                        best smoothed reward either run reached and lo the lower of the two
                        runs' first smoothed rewards; none when hi <= lo (no progress)
    reach(run, level)   the first row whose smoothed reward >= level: its t and step
                        (None: never reached)
    s_ratio             run's seconds / baseline's seconds to the level (< 1: the run got
                        there sooner); steps_ratio the same in steps (> 1: it needed more
                        steps, i.e. learned less per step)
    equal_steps         the mean reward of each run's last w steps up to the shorter run's
                        step count: reward at equal steps

A level one run never reaches has no ratio; the table says "not reached" rather than
inventing a time. :func:`compare` is pure; :func:`compare_dirs` reads two run directories'
``metrics.jsonl`` (rows that ``freshroll verify`` checks against each ledger).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

from freshroll.figures.metrics_log import read_rows

#: the reward levels compared, as fractions of the way from the start to the best reward
FRACTIONS: Final = (0.25, 0.5, 0.75)
#: ``summary.json``'s block (written beside a run's own figures by ``run --baseline``)
BLOCK: Final = "time_to_reward"


class Point(NamedTuple):
    step: int
    t: float
    reward: float


def curve(rows: Iterable[Mapping[str, Any]]) -> list[Point]:
    """The (step, t, reward) of each row that has a finite ``reward_mean``, in step order."""
    out = []
    for r in rows:
        reward, t, step = r.get("reward_mean"), r.get("t"), r.get("step")
        if (isinstance(reward, int | float) and isinstance(t, int | float)
                and isinstance(step, int) and reward == reward):  # NaN != NaN
            out.append(Point(step, float(t), float(reward)))
    return sorted(out, key=lambda p: p.step)


def window(n: int) -> int:
    """The trailing mean's width for runs of ``n`` steps: ``min(10, max(1, n // 10))``."""
    return min(10, max(1, n // 10))


def smoothed(points: Sequence[Point], w: int) -> list[float]:
    """The trailing mean of the last ``w`` rewards at each point (fewer at the start)."""
    out, rewards = [], [p.reward for p in points]
    for i in range(len(rewards)):
        out.append(statistics.fmean(rewards[max(0, i - w + 1):i + 1]))
    return out


def reach(points: Sequence[Point], smooth: Sequence[float], level: float) -> Point | None:
    """The first point whose smoothed reward is at least ``level`` (None: never)."""
    for p, s in zip(points, smooth, strict=True):
        if s >= level:
            return p
    return None


def _ratio(a: float, b: float) -> float | None:
    if b <= 0:
        return None if a > 0 else 1.0
    return a / b


def compare(run: Sequence[Point], base: Sequence[Point],
            fractions: Sequence[float] = FRACTIONS) -> dict[str, Any]:
    """The time-to-reward comparison of ``run`` with ``base`` (the module's formulas).

    ``{"window", "levels": [{"frac", "reward", "run": {"s", "step"} | None, "baseline": ...,
    "s_ratio", "steps_ratio"}], "equal_steps": {"steps", "run", "baseline"}, "note"}``;
    ``note`` says why there are no levels (a run without rewards, no progress)."""
    out: dict[str, Any] = {"window": None, "levels": [], "equal_steps": None, "note": ""}
    if not run or not base:
        which = "the run" if not run else "the baseline"
        out["note"] = f"{which} has no step with a reward"
        return out
    n = min(len(run), len(base))
    w = window(n)
    out["window"] = w
    s_run, s_base = smoothed(run, w), smoothed(base, w)
    out["equal_steps"] = {"steps": n, "run": statistics.fmean(p.reward for p in run[n - w:n]),
                          "baseline": statistics.fmean(p.reward for p in base[n - w:n])}
    hi, lo = max(max(s_run), max(s_base)), min(s_run[0], s_base[0])
    if hi <= lo:
        out["note"] = f"no progress: neither run's smoothed reward rose above {lo:.4g}"
        return out
    for f in fractions:
        level = lo + f * (hi - lo)
        a, b = reach(run, s_run, level), reach(base, s_base, level)
        out["levels"].append({
            "frac": f, "reward": level,
            "run": None if a is None else {"s": a.t, "step": a.step},
            "baseline": None if b is None else {"s": b.t, "step": b.step},
            "s_ratio": None if a is None or b is None else _ratio(a.t, b.t),
            "steps_ratio": None if a is None or b is None else _ratio(a.step, b.step),
        })
    return out


def compare_dirs(run_dir: Path, baseline: Path) -> dict[str, Any]:
    """:func:`compare` of two run directories' ``metrics.jsonl``, with the baseline's path
    relative to ``run_dir`` where it lies inside it."""
    out = compare(curve(read_rows(run_dir / "metrics.jsonl")[0]),
                  curve(read_rows(baseline / "metrics.jsonl")[0]))
    try:
        name = str(baseline.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        name = str(baseline)
    return {"baseline": name, **out}


def _at(x: Mapping[str, Any] | None) -> str:
    return "not reached" if x is None else f"{x['s']:.1f} s (step {x['step']})"


def render(cmp: Mapping[str, Any], run: str = "run", base: str = "baseline") -> str:
    """The comparison as lines for the terminal (empty: nothing to compare)."""
    if not cmp:
        return ""
    if cmp.get("note"):
        return f"time to reward: not compared: {cmp['note']}"
    lines = [f"time to reward ({run} vs {base}; smoothed over {cmp['window']} steps, "
             "measured wall):"]
    for lv in cmp["levels"]:
        s, k = lv["s_ratio"], lv["steps_ratio"]
        ratios = "" if s is None or k is None else \
            f": {s:.2f}x the seconds, {k:.2f}x the steps"
        lines.append(f"  {int(lv['frac'] * 100):>2}% (reward {lv['reward']:.3f}): "
                     f"{run} {_at(lv['run'])}, {base} {_at(lv['baseline'])}{ratios}")
    eq = cmp["equal_steps"]
    lines.append(f"  reward at equal steps ({eq['steps']}, last {cmp['window']}): "
                 f"{run} {eq['run']:.3f}, {base} {eq['baseline']:.3f}")
    return "\n".join(lines)


__all__ = ["BLOCK", "FRACTIONS", "Point", "compare", "compare_dirs", "curve", "reach",
           "render", "smoothed", "window"]

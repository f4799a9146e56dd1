"""What a run's own signals say about its learning: a collapse, and whether asynchrony is
costing learning (``summary.json`` ``learning``; the end line and the report say it).

Throughput is never read as convergence: the overlap verdict (:mod:`freshroll.figures.overlap`)
says whether asynchrony paid in rollouts/s; this fold says what the run's learning signals
show, from the ``metrics.jsonl`` rows alone (so ``verify`` and a saved run rebuild it).

**Collapse** (:class:`CollapseWatch`, the rule :mod:`freshroll.observe.collapse` acts on live):
a step is *dead* when it taught nothing (``frac_reward_zero_std`` 1) or its entropy is under
the floor; with ``R_t`` the mean reward of the last :data:`SMOOTH` steps, ``R_0`` its first
value and ``R*`` its best so far, the run collapsed at ``t`` when the last ``k`` steps were
dead, ``R* > R_0`` and ``R_t < R* - drop x (R* - R_0)``.

**The verdict** (``learning.verdict``)::

    "sync"          max_staleness 0: no step trained on a stale sample
    "collapsed"     the rule above held (the first step where it did)
    "at risk"       the stale steps' mean mismatch KL (behaviour vs proximal, k3) is above
                    KL_RISK: the policy moved far from the one that sampled the batch
    "no cost seen"  none of the above; a run alone cannot measure reward at equal steps
                    against sync (benchmarks/learning.py does: docs/benchmarks.md)

``KL_RISK`` (0.04) is provisional: in the learning benchmark's first tables (docs/benchmarks.md,
"Learning under asynchrony") the asynchronous runs that kept reward parity with sync measured
0.006-0.039, and the one that collapsed 0.042. A high mismatch KL is a warning sign, not proof
of a cost; a verdict of "at risk" names the figure and what to change.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: the collapse rule's defaults (``monitor.collapse_steps``, ``entropy_floor``, ``collapse_drop``)
COLLAPSE_STEPS, ENTROPY_FLOOR, COLLAPSE_DROP = 20, 0.05, 0.5
#: the stale steps' mean mismatch KL above which asynchrony is said to put learning at risk
KL_RISK = 0.04

#: steps of the trailing reward mean the rule compares
SMOOTH = 10


@dataclass
class Collapse:
    """A collapse found by :class:`CollapseWatch`: where, and the rewards around it."""

    step: int  # the step at which the rule held
    first_dead: int  # the first step of the dead stretch
    best: float  # R*
    start: float  # R_0
    now: float  # R_t
    entropy: float | None  # the last step's entropy
    no_signal: bool  # the last step had no learning signal (else: entropy under the floor)

    def message(self, stopping: bool) -> str:
        why = ("no learning signal (every group scored its completions alike)"
               if self.no_signal else f"entropy {self.entropy:.4f} under the floor")
        act = ("stopped: going on would only spend the budget; " if stopping else "")
        return (f"the policy collapsed at step {self.step}: steps {self.first_dead}-"
                f"{self.step} were dead ({why}) while the reward fell from its best "
                f"{self.best:.3f} to {self.now:.3f} (it started at {self.start:.3f}); {act}"
                "resume from the last checkpoint with a lower trainer.lr (--allow-change "
                "trainer.lr; README, 'Resume rules') or run.max_staleness=0; "
                "monitor.on_collapse=warn only warns")


@dataclass
class CollapseWatch:
    """The module docstring's rule, one row at a time (:meth:`feed`)."""

    steps: int
    entropy_floor: float
    drop: float
    _recent: deque[float] = field(default_factory=lambda: deque(maxlen=SMOOTH))
    _start: float | None = None
    _best: float = -math.inf
    _dead: int = 0

    def feed(self, row: Mapping[str, Any]) -> Collapse | None:
        """Fold one row; the collapse when the rule holds at it, else None."""
        reward = row.get("reward_mean")
        if isinstance(reward, int | float) and math.isfinite(reward):
            self._recent.append(float(reward))
        if len(self._recent) < SMOOTH:
            return None
        now = sum(self._recent) / len(self._recent)
        if self._start is None:
            self._start = now
        self._best = max(self._best, now)
        zero = row.get("frac_reward_zero_std")
        entropy = row.get("entropy")
        no_signal = isinstance(zero, int | float) and zero >= 1.0
        flat = isinstance(entropy, int | float) and entropy < self.entropy_floor
        self._dead = self._dead + 1 if (no_signal or flat) else 0
        gained = self._best - self._start
        if (self._dead >= self.steps and gained > 0
                and now < self._best - self.drop * gained):
            step = int(row["step"])
            return Collapse(step, step - self._dead + 1, self._best, self._start, now,
                            float(entropy) if isinstance(entropy, int | float) else None,
                            no_signal)
        return None


class LearningFold:
    """The ``learning`` figures of the ``metrics.jsonl`` rows fed (:meth:`row`), in order."""

    def __init__(self, steps: int = COLLAPSE_STEPS, entropy_floor: float = ENTROPY_FLOOR,
                 drop: float = COLLAPSE_DROP) -> None:
        self.watch = CollapseWatch(steps, entropy_floor, drop)
        self.collapse: Collapse | None = None
        self.max_staleness: int | None = None
        self._stale_kl: list[float] = []
        self._stale_clip: list[float] = []
        self._entropy: list[float] = []

    def configure(self, monitor: Mapping[str, Any]) -> None:
        """The rule's settings of a ``run_config`` event's ``monitor`` section (absent keys:
        the defaults); the stretch and rewards folded so far are kept."""
        w = self.watch
        w.steps = int(monitor.get("collapse_steps", COLLAPSE_STEPS))
        w.entropy_floor = float(monitor.get("entropy_floor", ENTROPY_FLOOR))
        w.drop = float(monitor.get("collapse_drop", COLLAPSE_DROP))

    def row(self, row: Mapping[str, Any], max_staleness: int | None) -> None:
        self.max_staleness = max_staleness
        found = self.watch.feed(row)
        if found is not None and self.collapse is None:
            self.collapse = found
        entropy = _number(row.get("entropy"))
        if entropy is not None:
            self._entropy.append(entropy)
        lag = _number(row.get("lag_mean"))
        if lag is not None and lag > 0:
            kl, clip = _number(row.get("mismatch_kl")), _number(row.get("clip_frac"))
            if kl is not None:
                self._stale_kl.append(kl)
            if clip is not None:
                self._stale_clip.append(clip)

    def result(self) -> dict[str, Any] | None:
        if not self._entropy and self.max_staleness is None:
            return None
        kl = _mean(self._stale_kl)
        k = max(1, len(self._entropy) // 10)
        out: dict[str, Any] = {
            "stale_steps": len(self._stale_kl),
            "mismatch_kl_stale": kl,
            "clip_frac_stale": _mean(self._stale_clip),
            "entropy_first": _mean(self._entropy[:k]),
            "entropy_last": _mean(self._entropy[-k:]),
            "collapse": asdict(self.collapse) if self.collapse is not None else None,
            "kl_risk": KL_RISK,
        }
        if self.collapse is not None:
            out["verdict"] = "collapsed"
        elif self.max_staleness == 0:
            out["verdict"] = "sync"
        elif math.isfinite(kl) and kl > KL_RISK:
            out["verdict"] = "at risk"
        else:
            out["verdict"] = "no cost seen"
        return out


def render_learning(learning: Any) -> str:
    """The end line of a run whose learning the verdict calls into question; empty for
    "sync" and "no cost seen" (the overlap line already speaks for those)."""
    if not isinstance(learning, Mapping):
        return ""
    verdict = learning.get("verdict")
    if verdict == "collapsed" and isinstance(learning.get("collapse"), Mapping):
        c = learning["collapse"]
        return (f"learning: the policy collapsed at step {c['step']} (dead from step "
                f"{c['first_dead']}; reward best {c['best']:.3f}, then {c['now']:.3f}); "
                "lower trainer.lr or run.max_staleness (docs/metrics.md, 'Learning')")
    if verdict == "at risk":
        return (f"learning: asynchrony may be costing it: the stale steps' mismatch KL "
                f"{learning['mismatch_kl_stale']:.4f} is above {learning['kl_risk']} (the "
                "policy moved far from the one that sampled its batches); lower "
                "run.max_staleness or trainer.lr (docs/metrics.md, 'Learning')")
    return ""


def _number(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None."""
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


__all__ = ["COLLAPSE_DROP", "COLLAPSE_STEPS", "ENTROPY_FLOOR", "KL_RISK", "SMOOTH", "Collapse",
           "CollapseWatch", "LearningFold", "render_learning"]

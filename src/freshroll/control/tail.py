"""Long tails: a deadline per group, and over-provisioning with stop-at-target.

A group is ready only when every member is done, and until then it holds its
admission place: with long-tailed response lengths one slow request holds a
whole group, and a few such groups hold the admission window. Two rules, after
slime's APRIL (active partial rollouts), pure like :mod:`freshroll.control.controller`.

**Over-provisioning.** A request finishes within its group's deadline with
probability π (measured: :func:`on_time_share` of recent request latencies).
Admit ``m`` extra requests for a group of ``G`` so that ``G`` of them are done
in time with probability at least ``q``::

    m = min { m >= 0 : P[Binomial(G + m, π) >= G] >= q }      capped at max_extra

(``max_extra`` when even that does not reach ``q``: best effort, never unbounded.)

**Deadline and stop-at-target** (:func:`tail_action`)::

    deadline = started_at + deadline_factor × p50      p50: measured median request latency
    done >= target                          -> cancel the rest (stop at target)
    now >= deadline and done >= min_keep    -> cancel the stragglers; the group goes on
                                               with the ``done`` members it has
    now >= started_at + drop_factor × p50
           and done < min_keep              -> drop the group: cancel all, free its place
    otherwise                               -> wait

``min_keep`` >= 2 for GRPO: a group of one has no baseline to compare with.
Cancelled requests are neither failures nor retried; the kernel records them
with a discard reason of their own. Wired: deadlines in :mod:`freshroll.pipeline.tails`
(``tail.deadline``), over-provisioning in :mod:`freshroll.kernel.stop_at_target` (the buffer's
stop) and :mod:`freshroll.pipeline.overprovision` (``tail.overprovision``: the amount).

Bias to watch: stop-at-target keeps the samples that finished first, which are
the shorter ones; the kept and cancelled lengths belong in the discard-bias check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from freshroll.errors import ConfigError


class TailKeys(Protocol):
    """What :meth:`TailPolicy.from_section` reads of a run's ``tail`` section
    (``config_run.TailSection``; a protocol, so the kernel's config imports the rule, not
    the other way round)."""

    @property
    def deadline_factor(self) -> float: ...
    @property
    def drop_factor(self) -> float: ...
    @property
    def min_keep(self) -> int: ...
    @property
    def max_extra(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TailPolicy:
    deadline_factor: float = 3.0
    drop_factor: float = 6.0
    min_keep: int = 2
    target_prob: float = 0.95
    max_extra: int = 4

    def __post_init__(self) -> None:
        if not 0.0 < self.deadline_factor <= self.drop_factor:
            raise ConfigError(
                "tail: need 0 < deadline_factor <= drop_factor, "
                f"got {self.deadline_factor}, {self.drop_factor}")
        if self.min_keep < 1:
            raise ConfigError(f"tail: min_keep must be >= 1, got {self.min_keep}")
        if not 0.0 < self.target_prob < 1.0:
            raise ConfigError(f"tail: target_prob must be in (0, 1), got {self.target_prob}")
        if self.max_extra < 0:
            raise ConfigError(f"tail: max_extra must be >= 0, got {self.max_extra}")

    @classmethod
    def from_section(cls, tail: TailKeys) -> TailPolicy:
        """The policy of a run's ``tail`` section: the one mapping, for the deadline watch and
        over-provisioning alike (``target_prob`` is the rule's own: no key sets it)."""
        return cls(deadline_factor=tail.deadline_factor, drop_factor=tail.drop_factor,
                   min_keep=tail.min_keep, max_extra=tail.max_extra)


def on_time_share(latencies: Sequence[float], limit_s: float) -> float:
    """Share of requests that finished within ``limit_s`` (1.0 when nothing was measured)."""
    if not latencies:
        return 1.0
    return sum(1 for t in latencies if t <= limit_s) / len(latencies)


def at_least(n: int, k: int, p: float) -> float:
    """P[Binomial(n, p) >= k]."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def extra_requests(group_size: int, on_time: float, policy: TailPolicy) -> int:
    """How many requests beyond ``group_size`` to admit for one group (formula above)."""
    p = min(1.0, max(0.0, on_time))
    for m in range(policy.max_extra + 1):
        if at_least(group_size + m, group_size, p) >= policy.target_prob:
            return m
    return policy.max_extra


def group_deadline(started_at: float, p50_s: float, policy: TailPolicy) -> float:
    return started_at + policy.deadline_factor * p50_s


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One group's requests: how many were admitted (extras included), done, still open."""

    started_at: float
    target: int
    done: int
    open: int


@dataclass(frozen=True, slots=True)
class TailAction:
    action: Literal["wait", "stop_at_target", "cut_stragglers", "drop_group"]
    cancel: int
    reason: str


def tail_action(now: float, g: GroupProgress, p50_s: float, policy: TailPolicy) -> TailAction:
    """What to do with a group's open requests now (rules above)."""
    if g.open <= 0:
        return TailAction("wait", 0, "nothing open")
    if g.done >= g.target:
        return TailAction("stop_at_target", g.open, f"{g.done}/{g.target} done: cancel {g.open}")
    deadline = group_deadline(g.started_at, p50_s, policy)
    if now >= deadline and g.done >= policy.min_keep:
        return TailAction("cut_stragglers", g.open,
                          f"past deadline {deadline:.2f} with {g.done}/{g.target}: cancel {g.open}")
    if now >= g.started_at + policy.drop_factor * p50_s and g.done < policy.min_keep:
        return TailAction("drop_group", g.open,
                          f"past drop time with {g.done} < min_keep {policy.min_keep}: drop")
    return TailAction("wait", 0, f"{g.done}/{g.target} done, deadline {deadline:.2f}")

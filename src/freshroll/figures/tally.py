"""The fold behind every figure: a run's ledger folded into counts, one event at a time.

:class:`TallyState` keeps what the figures of :mod:`freshroll.figures.metrics` are computed from
(the rules they share, trainer wall time and counted discards, are stated in that module's
docstring); :class:`freshroll.figures.metrics.Tally` is this state with its output, the
``metrics.jsonl`` row of each commit. Folding is incremental and reads events alone, so a
live run and any later reader of the same ledger hold the same state, bit for bit.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from freshroll.figures.off_policy import OffPolicy
from freshroll.figures.token_lag import TokenLags
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import policy_step

#: discard reasons left out of the discard rate and the counted discards (see the module doc)
UNCOUNTED_DISCARD_REASONS: Final = frozenset(ev.RETRY_REASONS | {"shutdown"})
#: the reasons a worker epoch is fenced that are a loss of the worker (it died or hung and
#: was replaced), not its planned end (retired, stopped) or a resume's restart
WORKER_LOSS_REASONS: Final = ("lost", "timeout")
#: a group's reward std at most this is zero (``torch.isclose(std, 0)``, as TRL counts
#: ``frac_reward_zero_std``): its advantages vanish, the group teaches nothing
ZERO_STD: Final = 1e-8
#: how many steps the reward at the start / end of a run is averaged over (at most)
REWARD_WINDOW: Final = 3

@dataclass
class TallyState:
    """What every figure is computed from: the ledger folded one event at a time
    (:meth:`fold`). :class:`freshroll.figures.metrics.Tally` is this state with its output: the
    ``metrics.jsonl`` row of each commit."""

    steps: int = 0
    accepted: int = 0
    generated: int = 0
    attempts: int = 0  # started events
    generated_tokens: int = 0  # tokens of every generated event
    refreshed_tokens: int = 0  # ... of the attempts discarded refreshed
    discards: Counter[str] = field(default_factory=Counter)
    wait_s: float = 0.0  # sum of every leased.wait_s
    lags: Counter[int] = field(default_factory=Counter)  # lag -> committed samples
    transfers: list[float] = field(default_factory=list)
    #: each commit's ``weights_bytes`` (what its version published to the workers)
    published_bytes: list[float] = field(default_factory=list)
    #: each commit's ``gather_s`` (trainer.parallel: fsdp: the full state gathered to rank 0)
    gathers: list[float] = field(default_factory=list)
    rewards_first: list[float] = field(default_factory=list)
    #: the learner's mismatch KL and importance weights, per step and per token-lag bucket
    off_policy: OffPolicy = field(default_factory=OffPolicy)
    rewards_last: deque[float] = field(default_factory=lambda: deque(maxlen=REWARD_WINDOW))
    max_staleness: int | None = None
    step_wait_s: float = 0.0  # wait of the lease the last commit consumed
    step_interval_s: float = 0.0  # trainer wall time between the last two commits
    step_lags: tuple[float, int] | None = None  # (mean, max) lag of the last commit's batch
    #: the last decision's engine report (kv_cache_usage, waiting, running); None: none yet
    engine: tuple[float, int, int] | None = None
    preempted: int = 0  # preemptions summed over every decision's window
    decisions: int = 0  # controller_decided events
    decided: ev.ControllerDecided | None = None  # the last one
    trainer_restarts: int = 0  # trainer_restarted events
    worker_losses: Counter[str] = field(default_factory=Counter)  # fenced lost/timeout, by reason
    worker_loss_first: str | None = None  # "w1 epoch 0 lost: <the error>"
    #: the last commit's batch: each reward function's (mean, std), the mean of each
    #: ``log_metric`` name, and the share of its groups whose total reward has zero std
    step_rewards: dict[str, tuple[float, float]] = field(default_factory=dict)
    step_logged: dict[str, float] = field(default_factory=dict)
    step_zero_std: float | None = None
    groups: int = 0  # committed groups (a group split over two steps counts in each)
    groups_zero_std: int = 0  # ... of which the committed members' rewards had zero std
    #: consecutive commits, up to the last, whose every group had zero std (no learning
    #: signal), and the longest such stretch of the run: (its length, its first step)
    no_signal_streak: int = 0
    no_signal_longest: tuple[int, int] = (0, 0)
    tokens: TokenLags = field(default_factory=TokenLags)  # oldest/newest/weighted token lags
    step_tokens: dict[str, float] | None = None  # ... the last commit's batch means
    #: attempt -> (total reward, components, logged), until committed or discarded
    _scored: dict[str, tuple[float, dict[str, float], dict[str, float]]] = field(
        default_factory=dict)
    _wall_done: float = 0.0  # trainer wall time of the incarnations before the current one
    _start: float | None = None  # the current incarnation's trainer start
    _last: float | None = None  # the current incarnation's last commit
    _started: dict[str, int] = field(default_factory=dict)  # attempt -> policy step
    _tokens: dict[str, int] = field(default_factory=dict)  # generated attempt -> its tokens
    _leases: dict[str, tuple[int, float]] = field(default_factory=dict)  # -> step, wait

    def current_span(self) -> tuple[float, float] | None:
        """The measured wall of the current incarnation (the last ``opened`` on): from the
        trainer's first wait for a lease to its last commit, as ledger timestamps; None
        before its first commit."""
        if self._start is None or self._last is None:
            return None
        return self._start, self._last

    def trainer_wall_s(self) -> float:
        """The trainer wall time so far (the rule: :mod:`freshroll.figures.metrics`' docstring): the
        incarnations before the current one, and the current one's span."""
        if self._start is None or self._last is None:
            return self._wall_done
        return self._wall_done + (self._last - self._start)

    def fold(self, e: ev.Event) -> ev.Committed | None:
        """Fold one event; ``e`` back when it is a commit (its row is then due)."""
        if isinstance(e, ev.Opened):
            self._wall_done = self.trainer_wall_s()
            self._start = self._last = None
            self.max_staleness = e.max_staleness
            self.tokens.basis = e.staleness_basis
        elif isinstance(e, ev.Started):
            self._started[e.sample] = policy_step(e.version)
            self.attempts += 1
        elif isinstance(e, ev.Generated):
            self.generated += 1
            self.generated_tokens += e.tokens
            self._tokens[e.sample] = e.tokens
            self.tokens.generated(e, self._started.get(e.sample))
        elif isinstance(e, ev.Rewarded):
            self._scored[e.sample] = (e.reward, e.components, e.logged)
        elif isinstance(e, ev.Leased):
            self.wait_s += e.wait_s
            if self._start is None:
                self._start = e.ts - e.wait_s
            self._leases[e.lease] = (policy_step(e.version), e.wait_s)
        elif isinstance(e, ev.LeaseReleased):
            self._leases.pop(e.lease, None)
        elif isinstance(e, ev.Committed):
            self._committed(e)
            return e
        elif isinstance(e, ev.Discarded):
            self.discards[e.reason] += 1
            if e.sample is not None:
                tokens = self._tokens.pop(e.sample, 0)
                if e.reason == "refreshed":
                    self.refreshed_tokens += tokens
                self._started.pop(e.sample, None)
                self._scored.pop(e.sample, None)
                self.tokens.dropped(e.sample)
        elif isinstance(e, ev.WeightsLoaded):
            self.transfers.append(e.transfer_s)
        elif isinstance(e, ev.ControllerDecided):
            self.decisions += 1
            self.decided = e
            self._decided(e.inputs)
        elif isinstance(e, ev.TrainerRestarted):
            self.trainer_restarts += 1
        elif isinstance(e, ev.WorkerFenced) and e.reason in WORKER_LOSS_REASONS:
            self.worker_losses[e.reason] += 1
            if self.worker_loss_first is None:
                why = f": {e.detail}" if e.detail else ""
                self.worker_loss_first = f"{e.worker} epoch {e.epoch} {e.reason}{why}"
        return None

    def _decided(self, inputs: dict[str, Any]) -> None:
        kv = inputs.get("kv_cache_usage")
        if not isinstance(kv, int | float):  # no engine reported in that window
            return
        self.engine = (float(kv), int(inputs.get("engine_waiting", 0)),
                       int(inputs.get("engine_running", 0)))
        self.preempted += int(inputs.get("preemptions", 0))

    def _committed(self, e: ev.Committed) -> None:
        lease = self._leases.pop(e.lease, None)
        self.step_wait_s = lease[1] if lease is not None else 0.0
        step_lags: list[int] = []
        for s in e.samples:
            self._tokens.pop(s, None)
            gen = self._started.pop(s, None)
            if lease is not None and gen is not None:  # else a damaged ledger: verify says so
                self.lags[lease[0] - gen] += 1
                step_lags.append(lease[0] - gen)
                self.tokens.sample_committed(s, lease[0], lease[0] - gen)
        self.step_tokens = self.tokens.step(step_lags)
        self.step_lags = (sum(step_lags) / len(step_lags), max(step_lags)) if step_lags else None
        previous = self._last if self._last is not None else self._start
        self.step_interval_s = e.ts - previous if previous is not None else 0.0
        self._last = e.ts
        if self._start is None:  # a commit without a lease: a damaged ledger, still counted
            self._start = e.ts
        self._rewards_of(e.samples)
        self.steps += 1
        if self.step_zero_std is not None:
            self.no_signal_streak = self.no_signal_streak + 1 if self.step_zero_std >= 1 else 0
            if self.no_signal_streak > self.no_signal_longest[0]:
                self.no_signal_longest = (self.no_signal_streak,
                                          self.steps - self.no_signal_streak + 1)
        self.accepted += len(e.samples)
        sent = e.metrics.get("weights_bytes")
        if sent is not None and math.isfinite(sent):
            self.published_bytes.append(sent)
        if (gather := e.metrics.get("gather_s")) is not None and math.isfinite(gather):
            self.gathers.append(gather)
        self.off_policy.committed(e.metrics)
        reward = e.metrics.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            if len(self.rewards_first) < REWARD_WINDOW:
                self.rewards_first.append(reward)
            self.rewards_last.append(reward)

    def _rewards_of(self, samples: Sequence[str]) -> None:
        """The committed batch's per-reward figures (TRL's ``rewards/<name>/mean|std`` and
        ``frac_reward_zero_std``): each function over the samples it applied to; a group's
        std over its committed members (a lone member has no learning signal: zero)."""
        per_fn: dict[str, list[float]] = {}
        logged: dict[str, list[float]] = {}
        by_group: dict[str, list[float]] = {}
        for s in samples:
            scored = self._scored.pop(s, None)
            if scored is None:  # a damaged ledger (verify says so)
                continue
            total, components, logs = scored
            by_group.setdefault(s.partition(".")[0], []).append(total)
            for name, value in components.items():
                per_fn.setdefault(name, []).append(value)
            for name, value in logs.items():
                logged.setdefault(name, []).append(value)
        self.step_rewards = {n: (sum(v) / len(v), sample_std(v)) for n, v in per_fn.items()}
        self.step_logged = {n: sum(v) / len(v) for n, v in logged.items()}
        zero = sum(1 for v in by_group.values() if sample_std(v) <= ZERO_STD)
        self.step_zero_std = zero / len(by_group) if by_group else None
        self.groups += len(by_group)
        self.groups_zero_std += zero

def sample_std(xs: Sequence[float]) -> float:
    """The unbiased sample standard deviation (``torch.std``, TRL's); 0 for fewer than 2."""
    n = len(xs)
    if n < 2:
        return 0.0
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


__all__ = ["REWARD_WINDOW", "UNCOUNTED_DISCARD_REASONS", "WORKER_LOSS_REASONS", "ZERO_STD",
           "TallyState", "sample_std"]

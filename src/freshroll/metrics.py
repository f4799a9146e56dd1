"""One function per reported figure, computed from ledger events alone.

Every number freshroll reports about a run — a ``metrics.jsonl`` row, ``summary.json``,
the progress line and the final line on the terminal, ``report.html`` and ``freshroll
timing`` — is one of the figures below, computed by its function here and nowhere else.
docs/metrics.md defines each figure once; a test holds it and :data:`FIGURES` together.

The ledger is folded once by a :class:`Tally` (``feed(event)``, one event at a time), and
each figure is a function of a tally. Folding is incremental, so a live run (which feeds
the events it reads back from its ledger after each commit) and any later reader of the
same ledger compute the same numbers, bit for bit.

Two rules used by several figures, stated once:

- **trainer wall time**: each incarnation (``opened``) contributes the span from its
  trainer's first wait for data (its first ``leased.ts - leased.wait_s``) to its last
  ``committed``; incarnations add up. Model loading before the trainer starts and the
  downtime between a crash and ``--resume`` are not counted.
- **counted discards**: terminal discards whose reason is not in
  :data:`UNCOUNTED_DISCARD_REASONS` (``fenced``: the request is re-issued, so it is not an
  outcome; ``shutdown``: the run ended first, which says nothing about the samples). Every
  other reason counts, including ones added later.

- **controller figures**: the steering task records a ``controller_decided`` event every
  ``control.interval_s`` (static control too); the buffer depth, the requests in flight and
  the live settings (workers, per-worker concurrency, admission limit) are those of the
  last such event, ``None`` before the first (a row leaves their columns out).
- **engine figures**: an engine that reports its load (vLLM, the simulated server) has it
  measured by the steering meter and recorded in every ``controller_decided`` event's
  inputs; the figures are those of the last decision that carried them (``preemptions``:
  the sum of every decision's window). With no such decision (the HF engine) they are
  ``None`` and a row leaves their columns out.

A ``metrics.jsonl`` row (:func:`row`) is built when the fold reaches a ``committed``
event: the step's trainer metrics as the event records them, plus the run figures of
the ledger up to and including that event. So row ``k`` is a pure function of the ledger
up to commit ``k``, and the file can be rebuilt from the ledger at any time.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from freshroll import events as ev
from freshroll.lineage import policy_step
from freshroll.off_policy import OffPolicy
from freshroll.token_lag import TokenLags, lag_percentile

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
class Tally:
    """What every figure is computed from: the ledger folded one event at a time."""

    steps: int = 0
    accepted: int = 0
    generated: int = 0
    discards: Counter[str] = field(default_factory=Counter)
    wait_s: float = 0.0  # sum of every leased.wait_s
    lags: Counter[int] = field(default_factory=Counter)  # lag -> committed samples
    transfers: list[float] = field(default_factory=list)
    #: each commit's ``weights_bytes`` (what its version published to the workers)
    published_bytes: list[float] = field(default_factory=list)
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
    tokens: TokenLags = field(default_factory=TokenLags)  # oldest/newest/weighted token lags
    step_tokens: dict[str, float] | None = None  # ... the last commit's batch means
    #: attempt -> (total reward, components, logged), until committed or discarded
    _scored: dict[str, tuple[float, dict[str, float], dict[str, float]]] = field(
        default_factory=dict)
    _wall_done: float = 0.0  # trainer wall time of the incarnations before the current one
    _start: float | None = None  # the current incarnation's trainer start
    _last: float | None = None  # the current incarnation's last commit
    _started: dict[str, int] = field(default_factory=dict)  # attempt -> policy step
    _leases: dict[str, tuple[int, float]] = field(default_factory=dict)  # -> step, wait

    def current_span(self) -> tuple[float, float] | None:
        """The measured wall of the current incarnation (the last ``opened`` on): from the
        trainer's first wait for a lease to its last commit, as ledger timestamps; None
        before its first commit."""
        if self._start is None or self._last is None:
            return None
        return self._start, self._last

    def feed(self, e: ev.Event) -> dict[str, Any] | None:
        """Fold one event; for a ``committed`` event, return its ``metrics.jsonl`` row."""
        if isinstance(e, ev.Opened):
            self._wall_done = wall_s(self)
            self._start = self._last = None
            self.max_staleness = e.max_staleness
            self.tokens.basis = e.staleness_basis
        elif isinstance(e, ev.Started):
            self._started[e.sample] = policy_step(e.version)
        elif isinstance(e, ev.Generated):
            self.generated += 1
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
            return self._committed(e)
        elif isinstance(e, ev.Discarded):
            self.discards[e.reason] += 1
            if e.sample is not None:
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

    def _committed(self, e: ev.Committed) -> dict[str, Any]:
        lease = self._leases.pop(e.lease, None)
        self.step_wait_s = lease[1] if lease is not None else 0.0
        step_lags: list[int] = []
        for s in e.samples:
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
        self.accepted += len(e.samples)
        sent = e.metrics.get("weights_bytes")
        if sent is not None and math.isfinite(sent):
            self.published_bytes.append(sent)
        self.off_policy.committed(e.metrics)
        reward = e.metrics.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            if len(self.rewards_first) < REWARD_WINDOW:
                self.rewards_first.append(reward)
            self.rewards_last.append(reward)
        return row(self, e)

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


def tally(events: Iterable[ev.Event]) -> Tally:
    """The fold of a whole event history."""
    t = Tally()
    for e in events:
        t.feed(e)
    return t


def rows(events: Iterable[ev.Event]) -> list[dict[str, Any]]:
    """Every ``metrics.jsonl`` row the history implies: one per ``committed``, in order."""
    t = Tally()
    return [r for e in events if (r := t.feed(e)) is not None]


# == the figures ======================================================================
Figure = Callable[[Tally], Any]
F = TypeVar("F", bound=Figure)
#: every reported figure by name (the names docs/metrics.md documents)
FIGURES: dict[str, Figure] = {}


def figure(fn: F) -> F:
    FIGURES[fn.__name__] = fn
    return fn


@figure
def steps(t: Tally) -> int:
    return t.steps


@figure
def wall_s(t: Tally) -> float:
    current = t._last - t._start if t._start is not None and t._last is not None else 0.0
    return t._wall_done + current


@figure
def accepted_rollouts(t: Tally) -> int:
    return t.accepted


@figure
def accepted_rollouts_per_s(t: Tally) -> float:
    wall = wall_s(t)
    return t.accepted / wall if wall > 0 else 0.0


@figure
def generated_rollouts(t: Tally) -> int:
    return t.generated


@figure
def generated_rollouts_per_s(t: Tally) -> float:
    wall = wall_s(t)
    return t.generated / wall if wall > 0 else 0.0


@figure
def trainer_wait_s(t: Tally) -> float:
    return t.wait_s


@figure
def trainer_idle_ratio(t: Tally) -> float:
    wall = wall_s(t)
    return min(1.0, t.wait_s / wall) if wall > 0 else 0.0


@figure
def step_wait_s(t: Tally) -> float:
    return t.step_wait_s


@figure
def step_idle_ratio(t: Tally) -> float:
    return min(1.0, t.step_wait_s / t.step_interval_s) if t.step_interval_s > 0 else 0.0


@figure
def discards_by_reason(t: Tally) -> dict[str, int]:
    return dict(sorted(t.discards.items()))


@figure
def counted_discards(t: Tally) -> int:
    return sum(n for r, n in t.discards.items() if r not in UNCOUNTED_DISCARD_REASONS)


@figure
def discard_rate(t: Tally) -> float:
    counted = counted_discards(t)
    return counted / (t.accepted + counted) if t.accepted + counted else 0.0


@figure
def lag_p50(t: Tally) -> float:
    return lag_percentile(t.lags, 50)


@figure
def lag_p99(t: Tally) -> float:
    return lag_percentile(t.lags, 99)


@figure
def lag_max(t: Tally) -> int:
    return max(t.lags, default=0)


@figure
def lag_mean(t: Tally) -> float:
    n = sum(t.lags.values())
    return sum(lag * k for lag, k in t.lags.items()) / n if n else 0.0


@figure
def lag_histogram(t: Tally) -> dict[str, int]:
    return {str(lag): n for lag, n in sorted(t.lags.items())}


@figure
def token_lag(t: Tally) -> dict[str, Any]:
    return t.tokens.summary(t.lags)


@figure
def step_token_lag(t: Tally) -> dict[str, float] | None:
    return t.step_tokens


@figure
def weight_loads(t: Tally) -> int:
    return len(t.transfers)


@figure
def trainer_restarts(t: Tally) -> int:
    return t.trainer_restarts


@figure
def worker_losses(t: Tally) -> int:
    return sum(t.worker_losses.values())


@figure
def worker_losses_by_reason(t: Tally) -> dict[str, int]:
    return dict(sorted(t.worker_losses.items()))


@figure
def worker_loss_first(t: Tally) -> str | None:
    return t.worker_loss_first


@figure
def reissued_attempts(t: Tally) -> int:
    return t.discards.get("fenced", 0)


@figure
def step_reward_fns(t: Tally) -> dict[str, dict[str, float]]:
    return {n: {"mean": m, "std": sd} for n, (m, sd) in sorted(t.step_rewards.items())}


@figure
def step_logged(t: Tally) -> dict[str, float]:
    return dict(sorted(t.step_logged.items()))


@figure
def step_frac_reward_zero_std(t: Tally) -> float | None:
    return t.step_zero_std


@figure
def frac_reward_zero_std(t: Tally) -> float | None:
    return t.groups_zero_std / t.groups if t.groups else None


@figure
def weight_transfer_s_mean(t: Tally) -> float:
    return sum(t.transfers) / len(t.transfers) if t.transfers else 0.0


@figure
def weights_bytes_mean(t: Tally) -> float | None:
    return sum(t.published_bytes) / len(t.published_bytes) if t.published_bytes else None


@figure
def mismatch_kl_mean(t: Tally) -> float | None:
    kls = t.off_policy.mismatch_kls
    return sum(kls) / len(kls) if kls else None


@figure
def is_weight_mean(t: Tally) -> float | None:
    ws = t.off_policy.is_weight_means
    return sum(ws) / len(ws) if ws else None


@figure
def is_weight_max(t: Tally) -> float | None:
    return t.off_policy.is_weight_top


@figure
def off_policy_by_lag(t: Tally) -> dict[str, dict[str, float] | None]:
    return t.off_policy.by_lag()


@figure
def reward_first(t: Tally) -> float | None:
    return sum(t.rewards_first) / len(t.rewards_first) if t.rewards_first else None


@figure
def reward_last(t: Tally) -> float | None:
    return sum(t.rewards_last) / len(t.rewards_last) if t.rewards_last else None


@figure
def max_staleness(t: Tally) -> int | None:
    return t.max_staleness


@figure
def mode(t: Tally) -> str | None:
    return None if t.max_staleness is None else "sync" if t.max_staleness == 0 else "async"


# == the outputs built from figures ===================================================
@figure
def step_lag_mean(t: Tally) -> float | None:
    """Mean lag of the last commit's batch (None: no commit yet)."""
    return None if t.step_lags is None else t.step_lags[0]


@figure
def step_lag_max(t: Tally) -> float | None:
    return None if t.step_lags is None else float(t.step_lags[1])


@figure
def kv_cache_usage(t: Tally) -> float | None:
    return None if t.engine is None else t.engine[0]


@figure
def engine_waiting(t: Tally) -> int | None:
    return None if t.engine is None else t.engine[1]


@figure
def engine_running(t: Tally) -> int | None:
    return None if t.engine is None else t.engine[2]


@figure
def preemptions(t: Tally) -> int | None:
    return None if t.engine is None else t.preempted


@figure
def controller_decisions(t: Tally) -> int:
    return t.decisions


@figure
def controller_bottleneck(t: Tally) -> str | None:
    return None if t.decided is None else t.decided.bottleneck


@figure
def buffer_depth(t: Tally) -> int | None:
    return _decided_input(t, "ready_samples")


@figure
def in_flight_requests(t: Tally) -> int | None:
    return _decided_input(t, "in_flight")


@figure
def active_workers(t: Tally) -> int | None:
    return None if t.decided is None else t.decided.settings.workers


@figure
def worker_concurrency(t: Tally) -> int | None:
    return None if t.decided is None else t.decided.settings.concurrency


@figure
def admission_limit(t: Tally) -> int | None:
    return None if t.decided is None else t.decided.settings.admission_limit


@figure
def producer_blocked_ratio(t: Tally) -> float | None:
    """Producer backpressure: the share of the active workers' time in the last decision's
    window that admission kept them blocked."""
    if t.decided is None:
        return None
    i = t.decided.inputs
    blocked, window = i.get("blocked_s"), i.get("window_s")
    settings = i.get("settings")
    workers = settings.get("workers") if isinstance(settings, dict) else None
    if not (isinstance(blocked, int | float) and isinstance(window, int | float)
            and isinstance(workers, int) and window > 0 and workers > 0):
        return None
    return min(1.0, float(blocked) / (float(window) * workers))


def _decided_input(t: Tally, name: str) -> int | None:
    """An integer input of the last ``controller_decided`` (None: no decision, or one
    recorded without it)."""
    value = None if t.decided is None else t.decided.inputs.get(name)
    return int(value) if isinstance(value, int | float) else None


def row(t: Tally, e: ev.Committed) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of the commit ``e`` that ``t`` has just folded (the engine
    columns only once an engine reported, the controller's once it decided)."""
    engine = {} if t.engine is None else {
        "kv_cache_usage": kv_cache_usage(t), "engine_waiting": engine_waiting(t),
        "engine_running": engine_running(t), "preemptions": preemptions(t),
    }
    control = {} if t.decided is None else {
        "controller_decisions": controller_decisions(t),
        "controller_bottleneck": controller_bottleneck(t), "buffer_depth": buffer_depth(t),
        "in_flight": in_flight_requests(t), "workers": active_workers(t),
        "concurrency": worker_concurrency(t), "admission_limit": admission_limit(t),
        "blocked_ratio": producer_blocked_ratio(t),
    }
    return {
        "step": steps(t), "t": wall_s(t), "version": e.version, **e.metrics,
        "lag_mean": step_lag_mean(t), "lag_max": step_lag_max(t),
        **{f"lag_{k}_mean": x for k, x in (step_token_lag(t) or {}).items() if k != "oldest"},
        "trainer_wait_s": step_wait_s(t), "step_idle_ratio": step_idle_ratio(t),
        "accepted_total": accepted_rollouts(t), "accepted_per_s": accepted_rollouts_per_s(t),
        "trainer_idle_ratio": trainer_idle_ratio(t), "discards": counted_discards(t),
        "discard_rate": discard_rate(t), **engine,
        **reward_columns(t),
        "weight_loads": weight_loads(t), "weight_transfer_s_mean": weight_transfer_s_mean(t),
        **control, **histogram_columns(t),
    }


def histogram_columns(t: Tally) -> dict[str, int]:
    """A row's counted-by-label columns: ``discards/<reason>`` (:func:`discards_by_reason`,
    every reason seen so far) and ``lag_histogram/<lag>`` (:func:`lag_histogram`, the
    committed samples of each lag so far)."""
    tokens = token_lag(t)
    return {**{f"discards/{r}": n for r, n in discards_by_reason(t).items()},
            **{f"lag_histogram/{k}": n for k, n in lag_histogram(t).items()},
            **{f"lag_{kind}_histogram/{k}": n for kind in ("newest", "weighted")
               for k, n in tokens[kind]["histogram"].items()}}


def reward_columns(t: Tally) -> dict[str, Any]:
    """A row's per-reward columns, named as TRL logs them: ``rewards/<name>/mean``,
    ``rewards/<name>/std``, ``frac_reward_zero_std``, and ``logged/<name>`` for each
    ``log_metric`` name (none for a batch no reward set scored, e.g. the simulator's)."""
    out: dict[str, Any] = {}
    for name, fig in step_reward_fns(t).items():
        out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = fig["mean"], fig["std"]
    if t.step_zero_std is not None:
        out["frac_reward_zero_std"] = step_frac_reward_zero_std(t)
    out.update({f"logged/{name}": v for name, v in step_logged(t).items()})
    return out


def summary_figures(t: Tally) -> dict[str, Any]:
    """The figures of ``summary.json``, in its layout."""
    return {
        "mode": mode(t), "max_staleness": max_staleness(t), "steps": steps(t),
        "wall_s": wall_s(t), "accepted_rollouts": accepted_rollouts(t),
        "accepted_rollouts_per_s": accepted_rollouts_per_s(t),
        "generated_rollouts": generated_rollouts(t),
        "generated_rollouts_per_s": generated_rollouts_per_s(t),
        "discard_rate": discard_rate(t), "counted_discards": counted_discards(t),
        "discards": discards_by_reason(t),
        "lag": {"p50": lag_p50(t), "p99": lag_p99(t), "max": lag_max(t), "mean": lag_mean(t),
                "histogram": lag_histogram(t)}, "token_lag": token_lag(t),
        "off_policy": {"mismatch_kl_mean": mismatch_kl_mean(t),
                       "is_weight_mean": is_weight_mean(t), "is_weight_max": is_weight_max(t),
                       "by_lag": off_policy_by_lag(t)},
        "trainer_idle_ratio": trainer_idle_ratio(t), "trainer_wait_s": trainer_wait_s(t),
        "weight_loads": weight_loads(t), "weight_transfer_s_mean": weight_transfer_s_mean(t),
        "weights_bytes_mean": weights_bytes_mean(t),
        "trainer_restarts": trainer_restarts(t),
        "worker_losses": worker_losses(t), "worker_losses_by_reason": worker_losses_by_reason(t),
        "worker_loss_first": worker_loss_first(t), "reissued_attempts": reissued_attempts(t),
        "frac_reward_zero_std": frac_reward_zero_std(t),
        "reward_first": reward_first(t), "reward_last": reward_last(t),
    }


def jsonable(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (JSON has no NaN/inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value

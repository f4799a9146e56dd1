"""One function per reported figure, computed from ledger events alone.

Every number freshroll reports about a run — a ``metrics.jsonl`` row, ``summary.json``,
the progress line and the final line on the terminal, ``report.html`` and ``freshroll
timing`` — is one of the figures below, computed by its function here and nowhere else.
docs/metrics.md defines each figure once; a test holds it and :data:`FIGURES` together.

The ledger is folded once by a :class:`Tally` (``feed(event)``, one event at a time; the
state it keeps and how each event changes it: :mod:`freshroll.figures.tally`), and each
figure is a function of a tally. Folding is incremental, so a live run (which feeds the
events it reads back after each commit) and any later reader compute the same numbers.

Rules used by several figures, stated once:

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

A ``metrics.jsonl`` row (:func:`row`) is built when the fold reaches a ``committed`` event:
the step's trainer metrics as recorded plus the run figures of the ledger up to that event,
so row ``k`` is a pure function of the ledger up to commit ``k`` (rebuilt at any time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from freshroll.figures.tally import UNCOUNTED_DISCARD_REASONS, TallyState
from freshroll.figures.token_lag import lag_percentile
from freshroll.ledger import events as ev


@dataclass
class Tally(TallyState):
    """What every figure is computed from: the ledger folded one event at a time
    (:class:`~freshroll.figures.tally.TallyState`), with the ``metrics.jsonl`` row of each
    commit."""

    def feed(self, e: ev.Event) -> dict[str, Any] | None:
        """Fold one event; for a ``committed`` event, return its ``metrics.jsonl`` row."""
        committed = self.fold(e)
        return None if committed is None else row(self, committed)


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
    return t.trainer_wall_s()


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
def refreshed_attempts(t: Tally) -> int:
    return t.discards.get("refreshed", 0)


@figure
def refreshed_share(t: Tally) -> float:
    return t.discards.get("refreshed", 0) / t.attempts if t.attempts else 0.0


@figure
def refreshed_token_share(t: Tally) -> float:
    return t.refreshed_tokens / t.generated_tokens if t.generated_tokens else 0.0


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
def no_signal_steps(t: Tally) -> dict[str, int]:
    (longest, first), now = t.no_signal_longest, t.no_signal_streak
    return {"longest": longest, "from_step": first, "now": now}


@figure
def weight_transfer_s_mean(t: Tally) -> float:
    return sum(t.transfers) / len(t.transfers) if t.transfers else 0.0


@figure
def weights_bytes_mean(t: Tally) -> float | None:
    return sum(t.published_bytes) / len(t.published_bytes) if t.published_bytes else None


@figure
def weights_gather_s_mean(t: Tally) -> float | None:
    return sum(t.gathers) / len(t.gathers) if t.gathers else None


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
    """A row's per-reward columns, named as TRL logs them: ``rewards/<name>/mean|std``,
    ``frac_reward_zero_std`` (with ours, ``no_signal_steps``: its stretch ``now``), and
    ``logged/<name>`` per ``log_metric`` name (none where no reward set scored: the sim)."""
    out: dict[str, Any] = {}
    for name, fig in step_reward_fns(t).items():
        out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = fig["mean"], fig["std"]
    if t.step_zero_std is not None:
        out["frac_reward_zero_std"] = step_frac_reward_zero_std(t)
        out["no_signal_steps"] = no_signal_steps(t)["now"]
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
        "weights_gather_s_mean": weights_gather_s_mean(t), "trainer_restarts": trainer_restarts(t),
        "worker_losses": worker_losses(t), "worker_losses_by_reason": worker_losses_by_reason(t),
        "worker_loss_first": worker_loss_first(t), "reissued_attempts": reissued_attempts(t),
        "refreshed": {"attempts": refreshed_attempts(t), "share": refreshed_share(t),
                      "token_share": refreshed_token_share(t)},
        "frac_reward_zero_std": frac_reward_zero_std(t), "no_signal_steps": no_signal_steps(t),
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

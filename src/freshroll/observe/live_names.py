"""The names a run's live figures go out under: one table for Prometheus, TensorBoard and W&B.

Every exported value is a field of a ``metrics.jsonl`` row (:mod:`freshroll.figures.metrics`
computed it; nothing here computes a figure, :data:`RATIOS` only divides two of a row's).
:data:`NAMES` gives each known field its
Prometheus gauge and its TensorBoard / W&B tag, the tags grouped the way peers group theirs
(TRL's and verl's ``perf/*``, verl's ``trainer/idle_ratio``, ``async/staleness_*`` for the
policy lag); docs/metrics.md ("Live metrics") lists the peers' names for the same figures.

:func:`scalars` is what TensorBoard and W&B log for a row: every finite number in it, a
field of :data:`NAMES` under its tag and any other (the trainer's own metrics such as
``loss``, ``rewards/<name>/mean``, ``logged/<name>``, ``eval/reward``) under its row name.
Their tags are grouped as TRL groups its own where TRL has the figure (``reward``,
``rewards/<f>/mean``, ``loss``, ``entropy``, ``clip_ratio/region_mean``,
``completions/mean_length``, ``learning_rate``), and otherwise under one namespace per concern
(``async/`` for every figure of the policy lag and the importance weights, per-lag buckets
included; ``rollout/``, ``trainer/``, ``perf/``, ``weights/``, ``engine/``, ``control/``).
``step`` is the x axis, not a scalar; text (``version``) and ``null`` are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from freshroll.pipeline.observers import Row


@dataclass(frozen=True)
class LiveName:
    """One row field and the names it goes out under (None: not exported there)."""

    field: str
    tag: str | None  # TensorBoard / W&B
    gauge: str | None  # Prometheus
    help: str


NAMES: Final[tuple[LiveName, ...]] = (
    LiveName("step", None, "freshroll_step", "last committed trainer step"),
    LiveName("t", "perf/wall_s", None, "trainer wall time of the run so far"),
    LiveName("accepted_total", "rollout/accepted_total", "freshroll_accepted_rollouts_total",
             "rollouts consumed by committed steps"),
    LiveName("accepted_per_s", "perf/accepted_rollouts_per_s",
             "freshroll_accepted_rollouts_per_second",
             "accepted rollouts per second of the run's wall"),
    LiveName("trainer_idle_ratio", "trainer/idle_ratio", "freshroll_trainer_idle_ratio",
             "share of the run's wall the trainer waited for data"),
    LiveName("step_idle_ratio", "trainer/step_idle_ratio", None,
             "share of the last step's interval the trainer waited for data"),
    LiveName("trainer_wait_s", "trainer/wait_s", "freshroll_trainer_wait_seconds",
             "the last step's wait for its batch"),
    LiveName("train_s", "perf/train_s", "freshroll_train_seconds",
             "the last step's optimizer step"),
    LiveName("discards", "rollout/discards", "freshroll_discards_total",
             "samples discarded so far (every reason)"),
    LiveName("discard_rate", "rollout/discard_rate", "freshroll_discard_rate",
             "discarded over generated samples"),
    LiveName("lag_mean", "async/staleness_mean", "freshroll_policy_lag_mean",
             "the last batch's mean policy lag (versions)"),
    LiveName("lag_max", "async/staleness_max", "freshroll_policy_lag_max",
             "the last batch's largest policy lag"),
    LiveName("reward_mean", "reward", "freshroll_reward_mean", "the last batch's mean reward"),
    LiveName("reward_std", "reward_std", "freshroll_reward_std",
             "the last batch's reward standard deviation"),
    LiveName("is_weight_mean", "async/is_weight_mean", "freshroll_importance_weight_mean",
             "mean importance weight"),
    LiveName("is_weight_max", "async/is_weight_max", "freshroll_importance_weight_max",
             "largest importance weight"),
    LiveName("mismatch_kl", "async/mismatch_kl", "freshroll_mismatch_kl",
             "KL of behaviour to proximal policy (k3)"),
    LiveName("entropy", "entropy", "freshroll_entropy", "mean token entropy of the last batch"),
    LiveName("loss", "loss", "freshroll_loss", "the last step's loss"),
    LiveName("clip_frac", "clip_ratio/region_mean", "freshroll_clip_fraction",
             "share of the last batch's tokens whose ratio the clip held"),
    LiveName("frac_reward_zero_std", "frac_reward_zero_std", "freshroll_zero_std_group_share",
             "share of the last batch's groups whose rewards were all equal (no signal)"),
    LiveName("eval/reward", "eval/reward", "freshroll_eval_reward",
             "the last evaluation's mean reward on the held-out prompts (eval.file)"),
    LiveName("grad_norm", "grad_norm", "freshroll_grad_norm", "gradient norm before clipping"),
    LiveName("lr", "learning_rate", "freshroll_learning_rate", "the last step's learning rate"),
    LiveName("kv_cache_usage", "engine/kv_cache_usage", "freshroll_kv_cache_usage",
             "KV cache usage of the engines (0..1, the fullest) at the last decision"),
    LiveName("engine_waiting", "engine/waiting", "freshroll_engine_waiting",
             "sequences queued inside the engines at the last decision"),
    LiveName("engine_running", "engine/running", "freshroll_engine_running",
             "sequences the engines generated at the last decision"),
    LiveName("preemptions", "engine/preemptions", "freshroll_engine_preemptions_total",
             "sequences the engines evicted from their KV cache so far"),
    LiveName("weight_loads", "weights/loads", "freshroll_weight_loads_total",
             "policy versions the workers loaded so far"),
    LiveName("weight_transfer_s_mean", "weights/transfer_s_mean",
             "freshroll_weight_transfer_seconds_mean", "mean seconds of a worker's weight load"),
    LiveName("controller_decisions", "control/decisions", "freshroll_controller_decisions_total",
             "decisions of the steering task so far"),
    LiveName("buffer_depth", "rollout/buffer_depth", "freshroll_buffer_depth",
             "samples ready for the trainer at the last decision"),
    LiveName("in_flight", "rollout/in_flight", "freshroll_in_flight_requests",
             "requests queued, running or unscored at the last decision"),
    LiveName("blocked_ratio", "rollout/blocked_ratio", "freshroll_producer_blocked_ratio",
             "share of the workers' time admission kept them blocked (last window)"),
    LiveName("workers", "control/workers", "freshroll_workers",
             "active inference workers the last decision set"),
    LiveName("concurrency", "control/concurrency", "freshroll_worker_concurrency",
             "requests in flight per worker the last decision set"),
    LiveName("admission_limit", "control/admission_limit", "freshroll_admission_limit",
             "groups in flight at most the last decision set (0: the freshness window only)"),
    LiveName("is_weight_min", "async/is_weight_min", None, "smallest importance weight"),
    LiveName("is_truncated_frac", "async/is_truncated_frac", None,
             "share of the last batch's tokens whose importance weight the cap truncated"),
    LiveName("ratio_mean", "async/ratio_mean", None, "mean PPO ratio of the last batch"),
    LiveName("lag_newest_mean", "async/staleness_newest_mean", None,
             "the last batch's mean lag counted from its newest token's version"),
    LiveName("lag_weighted_mean", "async/staleness_weighted_mean", None,
             "the last batch's mean lag weighted by tokens per version"),
    LiveName("adv_abs_mean", "train/advantage_abs_mean", None,
             "mean absolute advantage of the last batch"),
    LiveName("samples", "rollout/samples", None, "rows the last step trained on"),
    LiveName("tokens", "rollout/tokens", None, "completion tokens the last step trained on"),
    LiveName("no_signal_steps", "rollout/no_signal_steps", None,
             "steps in a row whose every group had equal rewards"),
    LiveName("weights_bytes", "weights/bytes", None, "bytes of the last published weights"),
)

#: row-field prefixes and the tag prefix each goes out under (TensorBoard / W&B): every
#: figure of the asynchrony under ``async/``, counts by reason under ``rollout/``; a field
#: ``<figure>/lag_<k>`` (the per-lag buckets of :mod:`freshroll.figures.off_policy`) goes to
#: ``async/<figure>/lag_<k>``
PREFIXES: Final[dict[str, str]] = {
    "discards/": "rollout/discards/",
    "lag_histogram/": "async/staleness_histogram/",
    "lag_newest_histogram/": "async/staleness_newest_histogram/",
    "lag_weighted_histogram/": "async/staleness_weighted_histogram/",
}
#: TRL's tags that are a ratio of two row fields: tag -> (numerator, denominator)
RATIOS: Final[dict[str, tuple[str, str]]] = {
    "completions/mean_length": ("tokens", "samples"),
}

#: row fields counted by a label (``discards/<reason>``): the field's prefix -> the labelled
#: Prometheus gauge, its label and help; TensorBoard and W&B log each under its row name
LABELLED: Final[dict[str, tuple[str, str, str]]] = {
    "discards/": ("freshroll_discards_by_reason", "reason",
                  "samples discarded so far, by reason (counted or not)"),
    "lag_histogram/": ("freshroll_policy_lag_samples", "lag",
                       "committed samples so far, by policy lag (versions)"),
}
#: text fields: the field -> a Prometheus gauge labelled by the field's value (1 for the
#: row's value, 0 for the others seen), its label and help; not a TensorBoard / W&B scalar
STATES: Final[dict[str, tuple[str, str, str]]] = {
    "controller_bottleneck": ("freshroll_controller_bottleneck", "bottleneck",
                              "the last decision's bottleneck (1; 0 for earlier ones)"),
}


_TAGS: Final = {n.field: n.tag for n in NAMES}


def tag_of(field: str) -> str | None:
    """The TensorBoard / W&B tag of a row field: its :data:`NAMES` tag, its :data:`PREFIXES`
    one, ``async/<figure>/lag_<k>`` for a per-lag bucket, else the field's own name (the
    trainer's ``loss``, TRL's ``rewards/<name>/mean``, ``logged/<name>``, ``eval/reward``)."""
    if field in _TAGS:
        return _TAGS[field]
    for prefix, tag in PREFIXES.items():
        if field.startswith(prefix):
            return tag + field[len(prefix):]
    head, _, tail = field.partition("/")
    if tail.startswith("lag_") and head in _TAGS:
        return f"async/{head}/{tail}"
    return field


def _number(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return float(value) if math.isfinite(value) else None


def scalars(row: Row) -> dict[str, float]:
    """The row's finite numbers by tag (:func:`tag_of`), and the :data:`RATIOS` of two of
    them; never a recomputed figure."""
    out: dict[str, float] = {}
    for field, value in row.items():
        tag, number = tag_of(field), _number(value)
        if tag is not None and number is not None:
            out[tag] = number
    for tag, (num, den) in RATIOS.items():
        top, bottom = _number(row.get(num)), _number(row.get(den))
        if top is not None and bottom:
            out[tag] = top / bottom
    return out


__all__ = ["LABELLED", "NAMES", "PREFIXES", "RATIOS", "STATES", "LiveName", "scalars", "tag_of"]

"""``summary.json``: the run's headline figures, recomputed from the run directory.

Reads only ``ledger.sqlite``, ``metrics.jsonl`` and ``config.yaml`` (the run
directory is the report contract), so a summary can be rebuilt on a saved run.

Figures: accepted rollouts/s (committed samples / wall from first ``opened`` to
last ``committed``), generated rollouts/s (for contrast: generation is not
acceptance), discard rate overall and by reason (``shutdown`` discards at the
end of a run are reported but left out of ``discard_rate``), lag p50/p99/max and
its histogram, trainer idle ratio, weight loads and their mean transfer time,
reward at the first and last steps (mean of the first/last ``min(3, steps)``
steps), the discard-bias check (committed vs discarded completions' reward and
length, by reason) and the per-stage time decomposition.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from freshroll.events import Committed, Discarded, Generated, Rewarded, WeightsLoaded
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.runtime.verdict import verdict
from freshroll.timing import collect_spans, decompose, percentile, run_rates


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a ``metrics.jsonl`` and the number of unparsable lines skipped.

    A kill can tear the last line in half; such lines are skipped, never fatal.
    """
    if not path.is_file():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def _stats(rewards: list[float], tokens: list[int]) -> dict[str, Any]:
    n = len(tokens)
    return {
        "n": n,
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "tokens_mean": sum(tokens) / n if n else None,
    }


def discard_bias(events: list[Any]) -> dict[str, Any]:
    """Do discards skew what the trainer sees? Committed vs discarded completions, by reason.

    Compares the mean reward (where one was computed) and mean completion length of the
    committed samples with those of each discard reason's generated samples. A stale discard
    that prefers long or low-reward completions biases training even at a small rate.
    """
    reward: dict[str, float] = {}
    tokens: dict[str, int] = {}
    groups: dict[str, list[str]] = {"committed": []}
    for e in events:
        if isinstance(e, Generated):
            tokens[e.sample] = e.tokens
        elif isinstance(e, Rewarded):
            reward[e.sample] = e.reward
        elif isinstance(e, Committed):
            groups["committed"].extend(e.samples)
        elif isinstance(e, Discarded) and e.sample in tokens and e.reason != "fenced":
            groups.setdefault(e.reason, []).append(e.sample)
    return {
        name: _stats([reward[s] for s in ss if s in reward], [tokens[s] for s in ss])
        for name, ss in groups.items()
    }


def summarize(run_dir: Path) -> dict[str, Any]:
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    rates, spans = run_rates(events), collect_spans(events)
    transfers = [e.transfer_s for e in events if isinstance(e, WeightsLoaded)]
    metrics, _ = read_metrics(run_dir / "metrics.jsonl")
    cfg_file = run_dir / "config.yaml"
    config = yaml.safe_load(cfg_file.read_text()) if cfg_file.is_file() else {}
    k = min(3, len(metrics))
    rewards = [m["reward_mean"] for m in metrics if "reward_mean" in m]
    non_shutdown = sum(n for r, n in rates.discards.items() if r not in ("shutdown", "fenced"))
    finished = rates.accepted + non_shutdown
    eta = config.get("run", {}).get("max_staleness")
    return {
        "mode": "sync" if eta == 0 else "async",
        "max_staleness": eta,
        "steps": rates.steps,
        "wall_s": rates.wall_s,
        "accepted_rollouts": rates.accepted,
        "accepted_rollouts_per_s": rates.accepted_per_s,
        "generated_rollouts": rates.generated,
        "generated_rollouts_per_s": rates.generated / rates.wall_s if rates.wall_s else 0.0,
        "discard_rate": non_shutdown / finished if finished else 0.0,
        "discards": rates.discards,
        "lag": {
            "p50": percentile([float(x) for x in spans.lags], 50),
            "p99": percentile([float(x) for x in spans.lags], 99),
            "max": max(spans.lags, default=0),
            "mean": sum(spans.lags) / len(spans.lags) if spans.lags else 0.0,
            "histogram": {str(k): v for k, v in sorted(Counter(spans.lags).items())},
        },
        "trainer_idle_ratio": rates.trainer_idle_ratio,
        "weight_loads": len(transfers),
        "weight_transfer_s_mean": sum(transfers) / len(transfers) if transfers else 0.0,
        "trainer_wait_s": rates.trainer_wait_s,
        "reward_first": sum(rewards[:k]) / k if k else None,
        "reward_last": sum(rewards[-k:]) / k if k else None,
        "discard_bias": discard_bias(events),
        "stages": [row.__dict__ for row in decompose(spans)],
        "verdict": verdict(events, config.get("run", {}).get("steps")),
    }


def write_summary(run_dir: Path) -> dict[str, Any]:
    summary = summarize(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
